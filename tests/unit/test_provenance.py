"""fedrun.provenance: the commit, the diff of a dirty tree and the hash naming both; logged on a run as a tag and an
artifact; the export refuses runs from a dirty tree unless asked (fedrun.export.check_source)."""

from __future__ import annotations

import subprocess

import pytest

from fedrun import export as ex
from fedrun import provenance as pv


def _git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "commit", "-q", "-m", "one")
    return repo


def test_source_names_the_commit_and_the_diff(repo):
    clean = pv.source(repo)
    commit = _git(repo, "rev-parse", "HEAD").strip()
    assert clean == (commit, False, "", pv.source_hash(commit, ""))
    (repo / "a.py").write_text("x = 2\n")
    (repo / "new.py").write_text("y = 3\n")                  # untracked, not ignored: part of the code
    dirty = pv.source(repo)
    assert dirty.dirty and "+x = 2" in dirty.diff and "+y = 3" in dirty.diff and dirty.commit == commit
    assert dirty.hash == pv.source_hash(commit, dirty.diff) != clean.hash
    # the diff applied to the commit gives the same code back, so the same hash
    (repo.parent / "source.diff").write_text(dirty.diff)
    _git(repo, "stash", "-u", "-q")
    assert not pv.source(repo).dirty
    _git(repo, "apply", str(repo.parent / "source.diff"))
    assert pv.source(repo).hash == dirty.hash


class _Tracker:
    def __init__(self):
        self.tags, self.artifacts = {}, []

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_artifact(self, path):
        self.artifacts.append((path.name, path.read_text()))


def test_log_source_tags_the_run_and_logs_the_diff(tmp_path):
    t = _Tracker()
    src = pv.log_source(t, tmp_path, ("abc", True, "diff --git a/x b/x\n"))
    assert t.tags == {"fedrun.source_hash": src.hash, "git_commit": "abc+dirty", "git_dirty": "true"}
    assert t.artifacts == [("source.diff", "diff --git a/x b/x\n")]
    clean = _Tracker()
    pv.log_source(clean, tmp_path / "c", ("abc", False, ""))
    assert clean.tags["fedrun.source_hash"] == pv.source_hash("abc", "") and not clean.artifacts


def test_the_export_refuses_runs_from_a_dirty_tree_unless_allowed():
    runs = [{"run_id": "r1", "tags.git_commit": "abc", "tags.git_dirty": "false"},
            {"run_id": "r2", "tags.git_commit": "abc+dirty", "tags.git_dirty": "true"}]
    with pytest.raises(ex.ExportError, match="1 of 2 runs were made from a working tree with uncommitted changes"):
        ex.check_source([dict(r) for r in runs])
    got = ex.check_source([dict(r) for r in runs], allow_dirty=True)
    assert got[0]["tags.fedrun.source_hash"] == pv.source_hash("abc", "")   # a clean run: its commit names its code
    assert "tags.fedrun.source_hash" not in got[1]                        # a dirty one: only its own tag would
    tagged = ex.check_source([{"run_id": "r3", "tags.git_commit": "abc", "tags.git_dirty": "false",
                               "tags.fedrun.source_hash": "h"}])
    assert tagged[0]["tags.fedrun.source_hash"] == "h"
