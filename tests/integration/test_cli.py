"""The `fedrun` command as a user types it: help, config printing, errors, sweeps."""

import os
import subprocess
from csv import DictReader
import sys
from pathlib import Path

import pytest

from fedrun.metric_names import NOT_COVERED_TAG, is_diagnostic

FEDRUN = [sys.executable, "-m", "fedrun.cli"]
FAST = ["scheme=fl_std", "dp=false", "r=1.0", "eval_every=1", "lr=0.05", "rounds=2", "num_clients=10", "sample_rate=0.5", "local_steps=2",
        "progress=log"]


def fedrun(args, cwd, env_extra=None, timeout=600):
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env_extra or {})}
    return subprocess.run(FEDRUN + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_help_and_cfg_job(tmp_path):
    h = fedrun(["--help"], tmp_path)
    assert h.returncode == 0
    for group in ("dataset:", "scheme:", "partition:", "sampler:", "tracking:", "fl_std", "fashion_mnist"):
        assert group in h.stdout
    c = fedrun(["--cfg", "job", "dataset=mnist", "scheme=fedsketch", "rounds=50"], tmp_path)
    assert c.returncode == 0
    assert "rounds: 50" in c.stdout and "name: mnist" in c.stdout and "name: fedsketch" in c.stdout
    # the dataset's own settings and model, not the Fashion-MNIST headline's 6000 clients and tuned S
    assert "num_clients: 100" in c.stdout and "name: lenet5" in c.stdout and "clipping_norm: null" in c.stdout


def test_unknown_scheme_is_hydras_error_listing_the_schemes(tmp_path):
    p = fedrun(["scheme=no_such_scheme", "r=0.05", "dp=true"], tmp_path)
    assert p.returncode != 0
    assert "Could not find 'scheme/no_such_scheme'" in p.stderr and "fl_std" in p.stderr


BAD_VALUES = [
    (["r=1.5"], "r=1.5 is not allowed; use a number in (0, 1]"),
    (["r=0"], "r=0 is not allowed; use a number in (0, 1]"),
    (["lr=0"], "lr=0 is not allowed; use a number > 0"),
    (["lr=-0.1"], "lr=-0.1 is not allowed; use a number > 0"),
    (["sampler=uniform", "num_clients=10", "clients_per_round=20"], "clients_per_round=20 must be in [1, num_clients=10]"),
    (["dataset=mnist", "partition=writers"], "partition=writers is not available for dataset=mnist"),
    (["dp=maybe"], "dp='maybe' is not allowed"),
    (["dp=true", "epsilon=1", "delta=2"], "delta=2 is not allowed; use a number in (0, 1)"),
    (["sample_rate=1.5"], "sample_rate=1.5 is not allowed; use a number in (0, 1]"),
    (["dataset=lending_club", "model=lenet5"], "model=lenet5 does not fit dataset=lending_club"),
    # the allowed list is derived from the model registry (fedrun.models.nets.IMAGE_MODELS), every image model in it
    (["dataset=mnist", "model=lr"], "model=lr does not fit dataset=mnist (28×28 images); allowed: lenet5, "
                                    "femnist_cnn, fashion_cnn, fashion_cnn_1m, vgg16"),
    (["device=tpu"], "device='tpu' is not allowed"),
    (["tracking.diagnostics=maybe"], "tracking.diagnostics='maybe' is not allowed; use true or false"),
    (["dataset=lending_club", "scheme=fl_cs"], "scheme=fl_cs does not apply to dataset=lending_club"),
    (["scheme=fbftl", "dp=true"], "dp=true is not available with scheme=fbftl"),
    (["dataset=lending_club", "partition=state", "partition.copies=2", "dp=local_laplace", "epsilon=1"],
     "partition.copies=2 with dp=local_laplace"),
    (["data_root=/nonexistent"], "data_root=/nonexistent: the data folder does not exist"),
]


def test_bad_value_one_clear_line_from_the_command(tmp_path, shared_data):
    p = fedrun(["r=1.5", "tracking=none", f"data_root={shared_data}"], tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("fedrun: error:")]
    assert "r=1.5 is not allowed; use a number in (0, 1]" in line


@pytest.mark.parametrize("args,message", BAD_VALUES)
def test_bad_values_give_one_clear_line(fedrun_in_process, shared_data, args, message):
    code, out, err = fedrun_in_process(["scheme=fl_std", "dp=false", "r=1.0", "tracking=none",
                                        f"data_root={shared_data}"] + args)
    assert code == 2, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("fedrun: error:")]
    assert len(lines) == 1 and message in lines[0], err


@pytest.mark.parametrize("scheme,dp", [("fbftl", "true"), ("sketchedsgd", "true"), ("fedsketch", "local_laplace"),
                                       ("fl_cs", "local_gaussian")])
def test_a_dp_mode_the_scheme_does_not_take_is_refused_before_any_data_is_read(fedrun_in_process, tmp_path,
                                                                                  monkeypatch, scheme, dp):
    empty = tmp_path / "no_data_here"
    empty.mkdir()
    monkeypatch.setenv("FEDRUN_DATA", str(empty))  # reading any dataset would fail with "not found"
    monkeypatch.setenv("FEDRUN_CACHE", str(tmp_path / "cache"))
    code, out, err = fedrun_in_process([f"scheme={scheme}", f"dp={dp}", "tracking=none"])
    assert code == 2 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("fedrun: error:")]
    assert f"dp={dp} is not available with scheme={scheme}" in line and "it takes dp=" in line


def test_named_data_folder_must_exist_even_with_data_in_the_cache(fedrun_in_process, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDRUN_DATA", "/nonexistent")
    code, _, err = fedrun_in_process(["dataset=mnist", "tracking=none"])
    assert code == 2
    (line,) = [ln for ln in err.splitlines() if ln.startswith("fedrun: error:")]
    assert "FEDRUN_DATA=/nonexistent: the data folder does not exist" in line


def test_missing_data_names_every_place_searched(fedrun_in_process, tmp_path, monkeypatch):
    for d in ("mydata", "nowhere"):
        (tmp_path / d).mkdir()
    monkeypatch.setenv("FEDRUN_DATA", str(tmp_path / "nowhere"))
    monkeypatch.setenv("FEDRUN_CACHE", str(tmp_path / "cache"))
    code, _, err = fedrun_in_process(["scheme=fl_std", "dataset=mnist", "tracking=none",
                                      f"data_root={tmp_path / 'mydata'}"])
    assert code == 2 and "Traceback" not in err
    assert "not found" in err
    for place in ("mydata", "nowhere", "cache"):
        assert place in err
    assert "FEDRUN_DATA" in err


def test_default_command_is_fl_cs_with_client_level_dp_logged_to_sqlite_in_cwd(tmp_path, shared_data,
                                                                               fedrun_in_process, monkeypatch):
    """`fedrun` with no arguments: paper 000's headline, FL-CS r = 0.05 + client-level DP on Fashion-MNIST
    (here cut to 2 rounds of a 600-client federation), logged to ./mlflow.db: accuracy, bytes, cost and ε.
    In this process (the command's code path; the tests above start the real command)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    p = subprocess.CompletedProcess(["fedrun"], *fedrun_in_process(
        ["rounds=2", "num_clients=600", "eval_every=1", "progress=log", f"data_root={shared_data}"]))
    assert p.returncode == 0, p.stderr
    assert "make ui" in p.stdout and "MLflow run" in p.stdout and "best_test_accuracy" in p.stdout
    assert "round 2/2" in p.stdout + p.stderr  # plain log lines when not a terminal
    assert "dp: client-level (ε=1, δ=1e-05, S=0.11)" in p.stdout + p.stderr
    assert (tmp_path / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("fedrun").experiment_id])
    assert run.data.tags["scheme"] == "fl_cs" and run.data.tags["dataset"] == "fashion_mnist"
    assert run.data.params["r"] == "0.05" and run.data.params["dp"] == "True"
    assert run.data.params["clipping_norm"] == "0.11" and run.data.params["epsilon"] == "1.0"
    # under DP the bytes (they follow the realized cohort) are marked as not covered by ε
    for key in ("test_accuracy", "nonprivate/uplink_bytes", "cost_bits", "epsilon"):
        assert len(client.get_metric_history(run.info.run_id, key)) == 2, key
    assert "uplink_bytes" in run.data.tags[NOT_COVERED_TAG].split(",")
    m = int(run.data.tags["compression.m"])
    assert m == 5716  # ceil(0.05 · 114,314) DCT coefficients (P = 4 chunks of 1429)
    ups = client.get_metric_history(run.info.run_id, "nonprivate/uplink_bytes")
    (csv,) = tmp_path.glob("outputs/*/*/metrics.csv")  # every number of the run, diagnostics included
    clients = [float(row["clients"]) for row in DictReader(csv.open())]
    assert [u.value for u in ups] == [4 * m * c for c in clients]
    assert 0 < run.data.metrics["epsilon"] <= 1.0
    # MLflow's run page lists every group of charts before the key metrics: no diagnostics unless asked
    assert not [k for k in run.data.metrics if is_diagnostic(k)]
    assert "summary/best_test_accuracy" in run.data.metrics


# slow with the joblib launcher: three fresh interpreters and MLflow stores (~45 s of CPU)
@pytest.mark.parametrize("parallel", [False, pytest.param(True, marks=[pytest.mark.slow, pytest.mark.process])],
                         ids=["basic_launcher_in_process", "joblib_2_jobs"])
def test_sweep_loses_no_run(tmp_path, shared_data, parallel, fedrun_in_process, monkeypatch):
    """A sweep's two jobs on a fresh SQLite store both appear, grouped under a parent run: one after the other
    in this process (Hydra's basic launcher), and as two parallel joblib processes writing to the store."""
    from mlflow.tracking import MlflowClient

    args = ["-m", "seed=0,1", "dataset=lending_club", "local_mode=gd", "lr=0.3", "progress=off",
            f"data_root={shared_data}"] + FAST
    if parallel:
        p = fedrun(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *args[1:]], tmp_path,
                   {"MLFLOW_TRACKING_URI": "", "OMP_NUM_THREADS": "1"}, timeout=900)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
        p = subprocess.CompletedProcess(["fedrun"], *fedrun_in_process(args))
    assert p.returncode == 0, p.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fedrun")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("fedrun.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("fedrun.kind") != "sweep"]
    assert len(parents) == 1 and len(children) == 2
    assert {r.data.params["seed"] for r in children} == {"0", "1"}
    for r in children:
        assert r.info.status == "FINISHED"
        assert r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert r.data.tags["fedrun.sweep"] == parents[0].data.tags["fedrun.sweep"]
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "test_mse")]
        assert sorted(steps) == [1, 2]
        assert "summary/best_test_mse" in r.data.metrics


def test_a_failed_job_fails_the_sweep_after_its_other_jobs(tmp_path, shared_data, fedrun_in_process, monkeypatch):
    """A job that fails (here a bad value) does not stop the sweep's other jobs; then Hydra ends the sweep with
    status 1 and the job's one-line error, and the sweep's parent run is marked FAILED."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    code, out, err = fedrun_in_process(["-m", "r=1.5,1.0", "dataset=lending_club", "local_mode=gd", "lr=0.3",
                                        f"data_root={shared_data}"] + [a for a in FAST if not a.startswith("r=")])
    assert code == 1, err[-3000:]
    assert "Traceback" not in err and "Error executing job with overrides: ['r=1.5'" in err
    errors = [ln for ln in err.splitlines() if ln.startswith("fedrun: error:")]  # the job's, then Hydra's at the end
    assert len(errors) == 2 and errors[0] == errors[1] and "r=1.5 is not allowed; use a number in (0, 1]" in errors[0]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("fedrun").experiment_id])
    assert {(r.data.tags.get("fedrun.kind"), r.info.status) for r in runs} == {("sweep", "FAILED"), ("run", "FINISHED")}
