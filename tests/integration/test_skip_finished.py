"""Runs record exactly what ran: the config hash that lets a re-run sweep skip finished jobs, and the
git state (commit, dirty flag, the uncommitted diff as an artifact)."""

import subprocess
from pathlib import Path

from fedrun.checkpoint import config_hash
from fedrun.run import run
from fedrun.tracking import MlflowTracker, git_state


def test_config_hash_ignores_how_a_run_is_driven_not_what_it_runs():
    c = {"seed": 0, "r": 0.05, "tracking": {"experiment": "a"}, "workers": 2, "resume": False}
    assert config_hash(c) == config_hash({**c, "tracking": {"experiment": "b"}, "workers": 1, "progress": "off"})
    assert config_hash(c) != config_hash({**c, "seed": 1})
    assert config_hash(c) != config_hash({**c, "r": 0.1})


def test_a_finished_configuration_is_skipped_and_a_new_one_runs(fast_cfg, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = ("dataset=mnist", "model=lenet5", "rounds=1", "skip_finished=true")
    first = run(fast_cfg(*cfg), tracker=MlflowTracker(uri, "sweep"), out_dir=tmp_path / "a")
    again = run(fast_cfg(*cfg), tracker=MlflowTracker(uri, "sweep"), out_dir=tmp_path / "b")
    other = run(fast_cfg(*cfg, "seed=7"), tracker=MlflowTracker(uri, "sweep"), out_dir=tmp_path / "c")
    assert "skipped" not in first and again == {"skipped": 1.0} and "skipped" not in other
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])
    assert len(runs) == 2 and len({r.data.tags["fedrun.config_hash"] for r in runs}) == 2
    assert all(r.data.tags["git_dirty"] in ("true", "false") for r in runs)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_git_state_sees_tracked_changes_and_untracked_files(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    (repo / ".gitignore").write_text("ignored.txt\n")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    sha, dirty, diff = git_state(repo)
    assert len(sha) == 40 and not dirty and diff == ""
    (repo / "ignored.txt").write_text("not part of the code\n")
    assert git_state(repo)[1] is False
    (repo / "a.py").write_text("x = 2\n")
    (repo / "new.py").write_text("y = 3\n")
    sha2, dirty, diff = git_state(repo)
    assert sha2 == sha and dirty
    assert "-x = 1" in diff and "+x = 2" in diff and "+y = 3" in diff and "not part of the code" not in diff


def test_git_state_sees_untracked_files_outside_the_package_folder(tmp_path):
    """fedrun reads the state from its package folder (repo/fedrun); a new untracked experiment config elsewhere in the
    checkout (repo/conf/…) changes what a run does, so it makes the tree dirty and its text goes into the diff."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    (repo / "pkg" / "a.py").write_text("x = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    assert git_state(repo / "pkg")[1] is False
    (repo / "conf").mkdir()
    (repo / "conf" / "new.yaml").write_text("lr: 0.3\n")
    sha, dirty, diff = git_state(repo / "pkg")
    assert dirty and "+lr: 0.3" in diff and "conf/new.yaml" in diff
