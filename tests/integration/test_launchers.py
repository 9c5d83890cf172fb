"""Sweeps on other engines and a team tracking server over HTTP."""

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

FEDRUN = [sys.executable, "-m", "fedrun.cli"]
TINY = ["~experiment", "scheme=fl_std", "dp=false", "r=1.0", "eval_every=1", "dataset=lending_club", "local_mode=gd", "lr=0.3", "rounds=2",
        "num_clients=10", "sample_rate=0.5", "progress=off"]


def _env(shared_data, **extra):
    return {**os.environ, "FEDRUN_DATA": str(shared_data), "PYTHONWARNINGS": "ignore", **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runs(uri):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("fedrun").experiment_id])
    return client, [r for r in runs if r.data.tags.get("fedrun.kind") != "sweep"], \
        [r for r in runs if r.data.tags.get("fedrun.kind") == "sweep"]


@pytest.fixture
def mlflow_server(tmp_path):
    port = _free_port()
    store = tmp_path / "server"
    store.mkdir()
    mlflow = os.path.join(os.path.dirname(sys.executable), "mlflow")
    proc = subprocess.Popen([mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
                             "--artifacts-destination", str(store / "artifacts")],
                            cwd=store, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    uri = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            with urllib.request.urlopen(uri + "/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("mlflow server did not start")
    yield uri
    proc.terminate()
    proc.wait(timeout=30)


# slow: an MLflow server process plus a sweep of fresh interpreters (~1 min of CPU); the sweep and its
# grouping are in the fast suite through the joblib launcher (tests/integration/test_cli.py)
@pytest.mark.slow
@pytest.mark.process
def test_sweep_against_a_tracking_server_over_http(tmp_path, shared_data, mlflow_server):
    p = subprocess.run(FEDRUN + ["-m", "seed=0,1"] + TINY, cwd=tmp_path,
                       env=_env(shared_data, MLFLOW_TRACKING_URI=mlflow_server), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not (tmp_path / "mlflow.db").exists()  # nothing went to a local store
    client, children, parents = _runs(mlflow_server)
    assert len(children) == 2 and len(parents) == 1
    for r in children:
        assert r.info.status == "FINISHED"
        assert sorted(m.step for m in client.get_metric_history(r.info.run_id, "test_mse")) == [1, 2]
        assert "metrics.csv" in {a.path for a in client.list_artifacts(r.info.run_id)}


def test_unreachable_tracking_server_fails_fast(shared_data, fedrun_in_process, monkeypatch):
    port = _free_port()  # nothing listens there
    monkeypatch.setenv("FEDRUN_DATA", str(shared_data))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    t0 = time.time()
    p = subprocess.CompletedProcess(["fedrun"], *fedrun_in_process(TINY))  # the command's code path, in this process
    assert p.returncode == 2 and "is not reachable" in p.stderr and "Traceback" not in p.stderr
    assert "round" not in p.stdout  # no training happened
    assert time.time() - t0 < 120


def test_unreachable_tracking_server_fails_a_sweep(shared_data, fedrun_in_process, monkeypatch, recwarn):
    """Each job fails on it before any work, in one line; Hydra then ends the sweep with status 1 (fedrun's sweep
    callback raises nothing: Hydra turns a callback's exception into a warning and goes on)."""
    monkeypatch.setenv("FEDRUN_DATA", str(shared_data))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_free_port()}")
    code, out, err = fedrun_in_process(["-m", "seed=0,1"] + TINY)  # Hydra's basic launcher, in this process
    assert code == 1 and "Traceback" not in err and "fedrun: done" not in out
    assert not [w for w in recwarn if "SweepCallback" in str(w.message)]
    errors = [ln for ln in err.splitlines() if ln.startswith("fedrun: error:")]  # each job's, then Hydra's
    assert len(errors) == 3 and "is not reachable" in errors[-1]


# slow: submitit starts a fresh interpreter per job (~1 min of CPU); Hydra's launcher plugin, not fedrun's code
@pytest.mark.slow
@pytest.mark.process
def test_submitit_local_launcher(tmp_path, shared_data):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    p = subprocess.run(FEDRUN + ["-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
                                 "seed=0,1"] + TINY, cwd=tmp_path, env=_env(shared_data, MLFLOW_TRACKING_URI=""),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    client, children, parents = _runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert len(children) == 2 and len(parents) == 1
    assert all(r.info.status == "FINISHED" for r in children)
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
