"""Checkpoint / resume / interruption / divergence through the `fedrun` command: a real process where one is killed,
else the command's code path in this process (tests/conftest.py: fedrun_in_process)."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

FEDRUN = [sys.executable, "-m", "fedrun.cli"]
# evaluation (10,000 test images) is most of a round's cost: every 4th round (and the last) is enough to compare
ARGS = ["~experiment", "scheme=fl_std", "dp=false", "r=1.0", "eval_every=4", "lr=0.05", "batch_size=10", "dataset=mnist", "model=lenet5", "rounds=8", "num_clients=10", "sample_rate=0.5", "local_steps=2",
        "progress=log", "checkpoint_every=1"]


def _env(shared_data):
    # the command's torch threads as in this process (the reference run below runs here)
    return {**os.environ, "FEDRUN_DATA": str(shared_data), "MLFLOW_TRACKING_URI": "", "PYTHONWARNINGS": "ignore",
            "OMP_NUM_THREADS": str(torch.get_num_threads())}


def _rows(run_dir: Path):
    with open(run_dir / "metrics.csv") as f:
        return [{k: v for k, v in r.items() if k != "round_seconds"} for r in csv.DictReader(f)]


def _run_dirs(cwd: Path):
    return sorted(p.parent for p in (cwd / "outputs").rglob("metrics.csv"))


def _start(cwd, shared_data, extra=()):
    return subprocess.Popen(FEDRUN + ARGS + list(extra), cwd=cwd, env=_env(shared_data),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_rounds(cwd: Path, n: int, proc, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        dirs = _run_dirs(cwd)
        if dirs and len(_rows(dirs[0])) >= n and (dirs[0] / "checkpoint.json").exists():
            return dirs[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise TimeoutError


def _history(cwd: Path, metric: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cwd / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("fedrun").experiment_id])
    assert len(runs) == 1
    return runs[0], sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, metric))


def _in_process(fedrun_in_process, monkeypatch, shared_data, args, uri: str = "") -> subprocess.CompletedProcess:
    """The command's code path in this process (with _env's variables; ``uri``: MLflow's, else ./mlflow.db): no
    new interpreter and data load."""
    for k, v in _env(shared_data).items():
        if k in ("FEDRUN_DATA", "MLFLOW_TRACKING_URI"):
            monkeypatch.setenv(k, v)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return subprocess.CompletedProcess(["fedrun"], *fedrun_in_process(args))


#: client-level DP with correlated noise (square root of A) under a cyclic schema: 5 groups of 2, k = 2, b = 5
CORRELATED = ["dp=true", "sampler=cyclic", "clients_per_round=2", "noise=sqrt_toeplitz", "epsilon=8",
              "clipping_norm=0.5"]


@pytest.mark.slow  # a real process killed mid-run (~20 s): .ci/run runs it (-m process)
@pytest.mark.process
@pytest.mark.parametrize("extra", [[], CORRELATED], ids=["plain", "correlated_noise"])
def test_sigkill_then_resume_equals_uninterrupted(tmp_path, shared_data, fedrun_in_process, monkeypatch,
                                                  full_test_split, mlflow_store_template, extra):
    # the uninterrupted reference: the same command in this process (in tmp_path; the runs below are in work/)
    p = _in_process(fedrun_in_process, monkeypatch, shared_data, ARGS + extra + ["tracking=none"])
    assert p.returncode == 0, p.stderr
    expected = _rows(_run_dirs(tmp_path)[0])

    work = tmp_path / "work"
    work.mkdir()
    if mlflow_store_template:  # the command finds its ./mlflow.db made (MLflow's migrations take seconds)
        mlflow_store_template(work / "mlflow.db")
    proc = _start(work, shared_data, extra)
    run_dir = _wait_rounds(work, 2, proc)
    proc.kill()  # SIGKILL: no chance to clean up
    proc.wait()
    assert len(_rows(run_dir)) < 8
    # resumed in this process, from what the killed command left in work/: its checkpoint and its ./mlflow.db
    monkeypatch.chdir(work)
    p = _in_process(fedrun_in_process, monkeypatch, shared_data, ARGS + extra + ["resume=true"],
                    uri=f"sqlite:///{work / 'mlflow.db'}")
    assert p.returncode == 0, p.stderr
    assert "resuming" in p.stdout + p.stderr
    assert _rows(run_dir) == expected  # same folder, every round once, same values
    assert not extra or {"epsilon", "test_accuracy"} <= set(expected[-1])
    # under DP the byte counts are not covered by ε: MLflow shows them under nonprivate/ (fedrun/metric_names.py)
    run, steps = _history(work, "nonprivate/uplink_bytes_total" if extra else "uplink_bytes_total")
    assert steps == list(range(1, 9))  # no duplicated or missing step in the same MLflow run
    _, evaluated = _history(work, "test_accuracy")
    assert evaluated == [4, 8]
    assert run.info.status == "FINISHED"


# slow: three more interpreters and runs (~1 min of CPU); resuming is covered by the SIGKILL test above
@pytest.mark.slow
@pytest.mark.process
def test_sigterm_saves_marks_killed_and_says_how_to_resume(tmp_path, shared_data):
    proc = _start(tmp_path, shared_data)
    _wait_rounds(tmp_path, 2, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "resume=true" in err and "Traceback" not in err
    run, steps = _history(tmp_path, "uplink_bytes_total")
    assert run.info.status == "KILLED"
    done = steps[-1]
    assert steps == list(range(1, done + 1))
    p = subprocess.run(FEDRUN + ARGS + ["resume=true"], cwd=tmp_path, env=_env(shared_data), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    run, steps = _history(tmp_path, "uplink_bytes_total")
    assert run.info.status == "FINISHED" and steps == list(range(1, 9))
    again = subprocess.run(FEDRUN + ARGS + ["resume=true"], cwd=tmp_path, env=_env(shared_data),
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 2 and "already finished" in again.stderr


def test_divergence_stops_keeps_metrics_and_marks_failed(tmp_path, shared_data, fedrun_in_process, monkeypatch):
    p = _in_process(fedrun_in_process, monkeypatch, shared_data,
                    ["~experiment", "scheme=fl_std", "dp=false", "dataset=lending_club", "local_mode=gd", "lr=5", "rounds=20", "sampler=all",
                     "progress=log"])
    assert p.returncode == 1 and "diverged" in p.stderr and "Traceback" not in p.stderr
    run, steps = _history(tmp_path, "uplink_bytes_total")
    assert run.info.status == "FAILED" and "diverged" in run.data.tags["fedrun.failure_reason"]
    assert steps and steps == list(range(1, len(steps) + 1)) and len(steps) < 20


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, shared_data, fedrun_in_process, monkeypatch):
    p = _in_process(fedrun_in_process, monkeypatch, shared_data, ARGS + ["resume=true", "tracking=none"])
    assert p.returncode == 2 and "no unfinished checkpoint of this configuration" in p.stderr


def test_runs_started_in_the_same_second_get_their_own_run_folders():
    """The run folder holds the checkpoint that resume reads: two runs started in one second from two shells once
    shared Hydra's outputs/<date>/<H-M-S>/, and one crashed renaming the other's checkpoint.pt.tmp. Resolved back to
    back (microseconds apart), two jobs' run and sweep folders now differ."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "conf"), version_base="1.3"):
        a, b = (compose(config_name="config", return_hydra_config=True) for _ in range(2))
    runs, sweeps = [c.hydra.run.dir for c in (a, b)], [c.hydra.sweep.dir for c in (a, b)]   # each job's "now"
    assert runs[0] != runs[1] and sweeps[0] != sweeps[1]
    assert runs[0].startswith("outputs/") and sweeps[0].startswith("multirun/")


# ------------------------------------------------------------------------------------------ resuming another config
SHORT = [a for a in ARGS if not a.startswith("rounds=")] + ["rounds=2"]


def _first_run(fedrun_in_process, monkeypatch, shared_data, args, tmp_path, uri=""):
    """A finished short run: its folder (and, with ``uri``, its MLflow run id)."""
    p = _in_process(fedrun_in_process, monkeypatch, shared_data, args, uri=uri)
    assert p.returncode == 0, p.stderr
    return _run_dirs(tmp_path)[0]


def test_resume_by_folder_file_or_run_id_refuses_another_config(tmp_path, shared_data, fedrun_in_process, monkeypatch,
                                                                mlflow_store_template):
    """resume=<folder | checkpoint | run id> once continued any config inside the run (params still saying the
    old lr); now each form compares the checkpoint's config with this one and names what differs."""
    if mlflow_store_template:
        mlflow_store_template(tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = _first_run(fedrun_in_process, monkeypatch, shared_data, SHORT, tmp_path, uri=uri)
    run, _ = _history(tmp_path, "uplink_bytes_total")
    for target in (run_dir, run_dir / "checkpoint.pt", run.info.run_id):
        p = _in_process(fedrun_in_process, monkeypatch, shared_data,
                        SHORT + ["lr=0.1", "local_steps=3", "checkpoint_every=2", f"resume={target}"], uri=uri)
        assert p.returncode == 2, (target, p.stderr)
        assert ("resume: this config differs from the run's in local_steps (2 → 3), lr (0.05 → 0.1); resume with "
                "the run's config, or start a new run") in p.stderr  # checkpoint_every: not a result's key
    assert _history(tmp_path, "uplink_bytes_total")[1] == [1, 2]  # the run was left as it was


LDP = ["~experiment", "dataset=lending_club", "scheme=ldp_fedavg", "dp=local_gaussian", "sampler=round_robin",
       "clients_per_round=5", "num_clients=10", "local_mode=gd", "local_steps=2", "rounds=2", "lr=0.1",
       "local_clip=150", "progress=off", "checkpoint_every=1"]


@pytest.mark.parametrize("args, why", [
    (SHORT + CORRELATED, "the participation schema (sampler=cyclic) and its noise were planned for them"),
    (SHORT + ["dp=true", "epsilon=8", "clipping_norm=0.5"], "σ was calibrated to spend epsilon=8 in them"),
    (LDP, "local DP calibrated each client's noise to its participations in them"),
], ids=["correlated_noise", "epsilon_target", "local_dp"])
def test_more_rounds_are_refused_where_the_privacy_was_planned_for_the_run(tmp_path, shared_data, fedrun_in_process,
                                                                          monkeypatch, args, why):
    """Extending a cyclic / correlated-noise run from 10 to 20 rounds once logged ε = 2.613 where the mechanism run
    gives 2.811: its schema, strategy matrix and sensitivities were planned for 10."""
    run_dir = _first_run(fedrun_in_process, monkeypatch, shared_data, args + ["tracking=none"], tmp_path)
    p = _in_process(fedrun_in_process, monkeypatch, shared_data,
                    args + ["tracking=none", "rounds=4", f"resume={run_dir}"])
    assert p.returncode == 2, p.stderr
    assert f"resume: rounds=4 extends the run's 2 rounds, but {why}; resume with rounds=2, or start a new run" \
        in p.stderr
    assert len(_rows(run_dir)) == 2


def test_more_rounds_under_independent_dp_equal_the_longer_run(tmp_path, shared_data, fedrun_in_process, monkeypatch,
                                                               mlflow_store_template):
    """Each round is its own accountant event at the given σ: a run extended from 2 to 4 rounds ends where the
    4-round run does (ε, model, metrics); its MLflow run says the rounds it was extended to, and a sweep with
    skip_finished=true finds it as the 4-round run."""
    dp = ["dp=true", "noise_multiplier=1.0", "clipping_norm=0.5"]
    if mlflow_store_template:
        mlflow_store_template(tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = _first_run(fedrun_in_process, monkeypatch, shared_data, SHORT + dp, tmp_path, uri=uri)
    p = _in_process(fedrun_in_process, monkeypatch, shared_data, SHORT + dp + ["rounds=4", f"resume={run_dir}"],
                    uri=uri)
    assert p.returncode == 0, p.stderr
    assert "rounds extended from 2 to 4" in p.stdout + p.stderr
    extended = _rows(run_dir)
    run, steps = _history(tmp_path, "nonprivate/uplink_bytes_total")
    assert steps == [1, 2, 3, 4] and run.data.params["rounds"] == "2"  # params are write-once
    assert run.data.tags["fedrun.rounds_extended"] == "4" and run.data.metrics["summary/rounds_completed"] == 4
    assert f"ε = {float(extended[-1]['epsilon']):.4g} after 4 rounds" in p.stdout + p.stderr  # the start's ε line
    p = _in_process(fedrun_in_process, monkeypatch, shared_data, SHORT + dp + ["rounds=4", "skip_finished=true"],
                    uri=uri)  # the run's fedrun.config_hash is the 4-round config's
    assert p.returncode == 0 and "already finished this configuration" in p.stdout + p.stderr, p.stderr

    longer = tmp_path / "longer"
    longer.mkdir()
    monkeypatch.chdir(longer)
    p = _in_process(fedrun_in_process, monkeypatch, shared_data, SHORT + dp + ["rounds=4", "tracking=none"])
    assert p.returncode == 0, p.stderr
    assert extended[-1] == _rows(_run_dirs(longer)[0])[-1]
