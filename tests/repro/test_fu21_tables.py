"""scripts/fu21_tables.py, pure part: records (as fedrun.report.mlflow_records returns them) → rows and tables."""

from __future__ import annotations

import math
import runpy

import pytest

from conftest import REPO

T = runpy.run_path(str(REPO / "scripts" / "fu21_tables.py"), run_name="fu21_tables")


def rec(eps, e, seed, mse, total="100", rounds=None, start=0, **metrics):
    rounds = rounds if rounds is not None else (int(total) // e if total != "None" else 10)
    r = {"status": "FINISHED", "start_time": start, "params.dp": "local_laplace", "params.epsilon": str(eps),
         "params.local_steps": str(e), "params.seed": str(seed), "params.total_iterations": total,
         "params.rounds": str(rounds), "params.lr": "0.2", "params.clients_per_round": "10",
         "metrics.test_mse": mse}
    r.update({f"metrics.{k}": v for k, v in metrics.items()})
    return r


def test_aggregate_mean_std_best_and_infinity():
    records = [rec("inf", 1, 0, 14.0, ldp_epsilon_max=1.7976931348623157e308), rec("inf", 1, 1, 16.0),
               rec("inf", 5, 0, 14.5), rec("inf", 5, 1, 14.5),
               rec(3, 1, 0, 40.0, ldp_epsilon_max=3.0), rec(3, 5, 0, 20.0), rec(3, 100, 0, 400.0)]
    rows = T["aggregate"](records, "test_mse")
    by = {(r["epsilon"], r["E"]): r for r in rows}
    assert by[(math.inf, 1)]["mean"] == 15.0 and by[(math.inf, 1)]["std"] == pytest.approx(math.sqrt(2))
    assert by[(math.inf, 1)]["ldp_epsilon_max"] == math.inf  # MLflow's stored inf is read back as inf
    assert math.isnan(by[(3.0, 5)]["std"]) and by[(3.0, 5)]["rounds"] == 20
    best = T["best_per_epsilon"](rows, "test_mse")
    assert best[(("T", 100), math.inf)] == 5 and best[(("T", 100), 3.0)] == 5
    text = T["sweep_tables"](rows, "test_mse")
    assert "| ∞ | 15.00 ± 1.41 | **14.50 ± 0.00** |" in text
    assert "interior" in T["findings"](rows, "test_mse")
    acc = T["best_per_epsilon"](rows, "test_accuracy")
    assert acc[(("T", 100), 3.0)] == 100  # accuracy: the highest mean wins


def test_dedupe_keeps_newest_and_fixed_T_runs_fill_fixed_Tg_cells():
    old, new = rec(3, 10, 0, 99.0, start=1), rec(3, 10, 0, 20.0, start=2)
    assert T["dedupe"]([new, old]) == [new]
    records = [rec(3, 10, 0, 20.0), rec(3, 1, 0, 14.0, total="None", rounds=10),
               rec(3, 2, 0, 15.0, total="None", rounds=10), rec(5, 10, 0, 18.0)]
    rows = T["aggregate"](records, "test_mse")
    tg = {(r["epsilon"], r["E"]) for r in rows if r["setting"] == ("T_g", 10)}
    assert tg == {(3.0, 1), (3.0, 2), (3.0, 10)}  # ε = 5 has no fixed-T_g sweep: not added
