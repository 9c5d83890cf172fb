"""Paper 001 (Fu et al.): the results/fu21 commands at CI size, and reduced reproductions of the thesis (slow).

Fast: each experiment config (``experiment=fu21_<dataset>``) run in-process at CI size (tiny T, no tracking).
Slow (subprocess + a fresh MLflow store cost ~30–50 s on the 2-core CI machine): the same
``fedrun -m experiment=fu21_<dataset> ...`` command as in results/fu21/, with a tiny T, two E values and one seed,
read back from MLflow as the report reads it; and a reduced rerun of the Lending Club thesis.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys

import pytest

from conftest import REPO, compose

def _fedrun(tmp_path, shared_data, *overrides: str) -> None:
    env = {**os.environ, "FEDRUN_DATA": str(shared_data)}
    out = subprocess.run([sys.executable, "-m", "fedrun.cli", *overrides, "progress=off"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]


def _records(tmp_path, experiment: str) -> list[dict]:
    """The finished runs of the sweep, as ``python -m fedrun.report`` reads them (summary metrics by fedrun's names)."""
    from fedrun.export import mlflow_records

    return [r for r in mlflow_records(f"sqlite:///{tmp_path}/mlflow.db", experiment) if r["status"] == "FINISHED"]


@pytest.mark.parametrize("experiment,overrides,mechanism", [
    ("fu21_lending_club", ["local_steps=5", "total_iterations=10", "epsilon=3"], "laplace"),
    ("fu21_femnist", ["local_steps=1", "total_iterations=1", "clients_per_round=1", "epsilon=3"], "gaussian"),
])
def test_experiment_config_runs_ci_size(tmp_path, shared_data, experiment, overrides, mechanism):
    from fedrun.run import build, run

    cfg = compose([f"experiment={experiment}", *overrides, f"data_root={shared_data}", "tracking=none",
                   "progress=off"])
    assert cfg.scheme.name == "ldp_fedavg" and cfg.local_clip_mode == "per_sample" and cfg.num_clients is None
    assert cfg.dp == f"local_{mechanism}" and cfg.rounds is None
    summary = run(cfg, out_dir=tmp_path)
    key = "best_test_mse" if mechanism == "laplace" else "best_test_accuracy"
    assert math.isfinite(summary[key]) and summary["rounds_completed"] == (2 if mechanism == "laplace" else 1)
    if mechanism == "laplace":  # ζ = 150 in L1, 50 states
        assert summary["ldp_clip_norm"] == 150 and summary["ldp_epsilon_max"] == pytest.approx(3.0)
    else:  # ζ = 3 in L2, δ = 1e-4, one writer engaged once; the classic formula is conservative at ε = 3
        assert summary["ldp_clip_norm"] == 3 and summary["ldp_delta"] == 1e-4
        assert summary["ldp_epsilon_pld_max"] <= 3.0 and summary["ldp_clients_noised"] == 1


@pytest.mark.slow
def test_lending_club_command_ci_size(tmp_path, shared_data):
    _fedrun(tmp_path, shared_data, "-m", "experiment=fu21_lending_club", "local_steps=1,5", "epsilon=3", "seed=0",
            "total_iterations=10")
    records = _records(tmp_path, "fu21-lending-club")
    assert len(records) == 2
    assert {(float(r["params.epsilon"]), int(r["params.local_steps"]), int(r["params.rounds"])) for r in records} \
        == {(3.0, 1, 10), (3.0, 5, 2)}
    for r in records:
        assert math.isfinite(r["metrics.test_mse"]) and r["metrics.test_mse"] > 0
        # Laplace, basic composition of what was added: every engaged client spent exactly its budget
        assert r["metrics.ldp_epsilon_max"] == pytest.approx(3.0)
    # per-round ε logged from the accountant: non-decreasing, ending at the budget
    from mlflow.tracking import MlflowClient

    noisy = next(r for r in records if r["params.local_steps"] == "1")
    hist = [m.value for m in MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_metric_history(noisy["run_id"],
                                                                                                  "epsilon")]
    assert len(hist) == 10 and hist == sorted(hist) and hist[-1] == pytest.approx(3.0)


@pytest.mark.slow
def test_femnist_command_ci_size(tmp_path, shared_data):
    _fedrun(tmp_path, shared_data, "-m", "experiment=fu21_femnist", "local_steps=1,2", "epsilon=inf,10", "seed=0",
            "total_iterations=2", "clients_per_round=2")
    records = _records(tmp_path, "fu21-femnist")
    assert len(records) == 4
    for r in records:
        assert 0 <= r["metrics.test_accuracy"] <= 1
        if math.isfinite(float(r["params.epsilon"])):
            assert r["metrics.ldp_epsilon_pld_max"] <= r["metrics.ldp_epsilon_rdp_max"]
            assert r["metrics.ldp_noise_item_var"] == pytest.approx(r["metrics.ldp_noise_item_var_formula"], rel=0.05)


@pytest.mark.slow
def test_lending_club_thesis_reduced(tmp_path, shared_data):
    """Reduced rerun of results/fu21/lending_club_paper_unchecked.md (the paper's sensitivity, its ε conditional on
    the unchecked non-expansiveness): with Laplace noise (ε = 3) the best E is interior, and more local
    iterations at fixed T beat E = 1; the largest E (one round) is worst."""
    _fedrun(tmp_path, shared_data, "-m", "experiment=fu21_lending_club", "local_steps=1,5,100", "epsilon=3",
            "seed=0,1,2", "local_dp_sensitivity=paper_unchecked")
    records = _records(tmp_path, "fu21-lending-club")
    rows = {e: statistics.mean(r["metrics.test_mse"] for r in records if int(r["params.local_steps"]) == e)
            for e in (1, 5, 100)}
    assert rows[5] < rows[1] and rows[5] < rows[100]
