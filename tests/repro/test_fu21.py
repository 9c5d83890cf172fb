"""Paper 001 (Fu et al.): the results/fu21 commands at CI size, and reduced reproductions of the thesis (slow).

Fast: each experiment config (``experiment=fu21_<dataset>``) run in-process at CI size (tiny T, no tracking).
Slow (subprocess + a fresh MLflow store cost ~30–50 s on the 2-core CI machine): the same
``fedrun -m experiment=fu21_<dataset> ...`` command and ``scripts/fu21_tables.py`` call as in results/fu21/,
with a tiny T, two E values and one seed; and a reduced rerun of the Lending Club thesis.
"""

from __future__ import annotations

import math
import os
import runpy
import subprocess
import sys

import pytest

from conftest import REPO, compose

TABLES = runpy.run_path(str(REPO / "scripts" / "fu21_tables.py"), run_name="fu21_tables")


def _fedrun(tmp_path, shared_data, *overrides: str) -> None:
    env = {**os.environ, "FEDRUN_DATA": str(shared_data)}
    out = subprocess.run([sys.executable, "-m", "fedrun.cli", *overrides, "progress=off"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]


def _tables(tmp_path, experiment: str) -> tuple[str, list[dict]]:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "results" / "table.md"
    assert TABLES["main"](["--tracking-uri", uri, "--experiment", experiment, "--out", str(out),
                           "--command", "fedrun -m ..."]) == 0
    from fedrun.report import mlflow_records

    records = TABLES["dedupe"](mlflow_records(uri, experiment))
    TABLES["add_noise_history"](records, uri)
    return out.read_text(), records


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
    text, records = _tables(tmp_path, "fu21-lending-club")
    assert len(records) == 2 and all(r["status"] == "FINISHED" for r in records)
    rows = TABLES["aggregate"](records, "test_mse")
    assert {(r["epsilon"], r["E"], r["rounds"]) for r in rows} == {(3.0, 1, 10), (3.0, 5, 2)}
    for r in rows:
        assert math.isfinite(r["mean"]) and r["mean"] > 0
        # Laplace, basic composition of what was added: every engaged client spent exactly its budget
        assert r["ldp_epsilon_max"] == pytest.approx(3.0)
    # per-round ε logged from the accountant: non-decreasing, ending at the budget
    from mlflow.tracking import MlflowClient

    noisy = next(r for r in records if r["params.local_steps"] == "1")
    hist = [m.value for m in MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_metric_history(noisy["run_id"],
                                                                                                  "epsilon")]
    assert len(hist) == 10 and hist == sorted(hist) and hist[-1] == pytest.approx(3.0)
    assert "fixed T = E·T_g = 10" in text and "| 3 |" in text and "best E" in text
    assert (tmp_path / "results" / "table_T10.png").stat().st_size > 1000


@pytest.mark.slow
def test_femnist_command_ci_size(tmp_path, shared_data):
    _fedrun(tmp_path, shared_data, "-m", "experiment=fu21_femnist", "local_steps=1,2", "epsilon=inf,10", "seed=0",
            "total_iterations=2", "clients_per_round=2")
    text, records = _tables(tmp_path, "fu21-femnist")
    rows = TABLES["aggregate"](records, "test_accuracy")
    assert len(rows) == 4
    for r in rows:
        assert 0 <= r["mean"] <= 1
        if math.isfinite(r["epsilon"]):
            assert r["ldp_epsilon_pld_max"] <= r["ldp_epsilon_rdp_max"]
            assert r["ldp_noise_item_var_mean"] == pytest.approx(r["ldp_noise_item_var_formula_mean"], rel=0.05)
    assert "final test accuracy" in text


@pytest.mark.slow
def test_lending_club_thesis_reduced(tmp_path, shared_data):
    """Reduced rerun of results/fu21/lending_club_paper_unchecked.md (the paper's sensitivity, its ε conditional on
    the unchecked non-expansiveness): with Laplace noise (ε = 3) the best E is interior, and more local
    iterations at fixed T beat E = 1; the largest E (one round) is worst."""
    _fedrun(tmp_path, shared_data, "-m", "experiment=fu21_lending_club", "local_steps=1,5,100", "epsilon=3",
            "seed=0,1,2", "local_dp_sensitivity=paper_unchecked")
    _, records = _tables(tmp_path, "fu21-lending-club")
    rows = {r["E"]: r["mean"] for r in TABLES["aggregate"](records, "test_mse")}
    assert rows[5] < rows[1] and rows[5] < rows[100]
