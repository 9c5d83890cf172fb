"""Paper 000's schemes end to end through run(cfg) (configs composed as the CLI does), and its table script.

``fedrun scheme=fl_cs r=0.05 dp=true`` on Fashion-MNIST / fashion_cnn, tiny: 10 clients, 2 rounds. The
CI-sized sweep of the whole table is tests/repro/test_kerkouche21_repro.py (slow).
"""

from __future__ import annotations

import csv
import math

import pytest

from fedrun.config import ConfigError
from fedrun.run import build, run

N = 114_314  # fashion_cnn


def test_fl_cs_r005_dp_logs_accuracy_bytes_cost_and_epsilon(fast_cfg, tmp_path):
    """What reaches the tracker each round (metrics.csv holds the same rows; MLflow: the slow repro test)."""
    cfg = fast_cfg("scheme=fl_cs", "r=0.05", "dp=true", "epsilon=1", "clipping_norm=0.05", "eval_every=2",
                   "scheme.max_iter=5")
    summary = run(cfg, out_dir=tmp_path)
    m = math.ceil(0.05 * N)
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for i, row in enumerate(rows, start=1):
        assert float(row["uplink_bytes"]) == 4 * m * float(row["clients"])  # 4·m per selected client, no seed
        assert float(row["cost_bits"]) == pytest.approx(m / N * N * 32 * i * 0.5)  # r·n·32·Round·C
        assert 0 < float(row["epsilon"]) <= 1.0
        assert float(row["dp_mean_norm"]) > 0 and float(row["cs_iterations"]) >= 0
    assert 0 <= float(rows[-1]["test_accuracy"]) <= 1
    assert 0.99 <= summary["epsilon_final"] <= 1.0 and summary["best_round"] == 2


@pytest.mark.parametrize("overrides,message", [
    (["scheme=fl_cs", "r=1.5"], r"r=1.5 is outside \(0, 1\]"),
    (["scheme=fl_cs", "r=0.05", "scheme.chunks=0"], r"scheme.chunks=0; allowed: an integer P >= 1"),
    (["scheme=fl_cs", "r=0.00001", "scheme.chunks=4"], r"scheme.chunks=4 with r=1e-05 and n=114314: .*m=2"),
    (["scheme=fl_cs", "r=0.05", "scheme.solver=admm"], r"scheme.solver='admm' is unknown; allowed: fista, owlqn"),
])
def test_bad_values_are_one_line_config_errors(fast_cfg, overrides, message):
    from omegaconf import OmegaConf

    with pytest.raises(ConfigError, match=message):
        build(OmegaConf.to_container(fast_cfg(*overrides), resolve=True))


def test_table3_experiment_resolves_every_run_of_the_sweep(load_script):
    """Every (scheme, r, dp) of the sweep composes with its S and validates (no data needed)."""
    from conftest import compose
    from omegaconf import OmegaConf

    from fedrun.run import prepare

    script = load_script("kerkouche21_table3")
    clip = script.clipping_norms("kerkouche21_table3")
    assert len(script.runs()) == 20
    for scheme, r, dp in script.runs():
        ov = script.overrides("kerkouche21_table3", scheme, r, dp, clip, [])
        c = OmegaConf.to_container(compose([o for o in ov if not o.startswith("hydra.")]), resolve=True)
        prepare(c)
        assert c["scheme"]["name"] == scheme and c["rounds"] == 200 and c["dataset"]["name"] == "fashion_mnist"
        assert c["clipping_norm"] == clip[(scheme, r)] and c["epsilon"] <= 1.0
        if scheme != "fl_std":
            assert c["scheme"]["r"] == r


def test_table_and_claims_from_records(load_script):
    script = load_script("kerkouche21_table3")

    def rec(scheme, r, dp, acc, rnd=100.0, start=0):
        m = math.ceil(r * N)
        return {"status": "FINISHED", "start_time": start, "run_id": f"{scheme}{r}{dp}{start}",
                "tags.scheme": scheme, "tags.dp": "client" if dp else "off", "params.r": str(r),
                "params.num_clients": "6000", "params.clipping_norm": "0.1", "tags.fedrun.num_parameters": str(N),
                "metrics.best_test_accuracy": acc, "metrics.best_round": rnd,
                "metrics.cost_bits_at_best": r * N * 32 * rnd * 0.01, "metrics.uplink_bytes_at_best": 60 * 4 * m * rnd,
                "metrics.uplink_bytes_final": 60 * 4 * m * 200, "metrics.rounds_completed": 200.0,
                "metrics.epsilon_at_best": 0.9 if dp else None, "metrics.epsilon_final": 1.0 if dp else None,
                "metrics.dp_noise_multiplier": 1.1 if dp else None}

    records = [rec("fl_std", 1.0, False, 0.85), rec("fl_std", 1.0, True, 0.55),
               rec("fl_std", 1.0, True, 0.50, start=-1)]  # an older FL-STD-DP run: ignored
    for i, r in enumerate((0.05, 0.1, 0.2)):
        records += [rec("fl_cs", r, False, 0.80 + i / 100), rec("fl_rnd", r, False, 0.70), rec("fl_freq", r, False, 0.75),
                    rec("fl_cs", r, True, 0.70 - i / 100), rec("fl_rnd", r, True, 0.6), rec("fl_freq", r, True, 0.6)]
    rows = script.table_rows(records)
    assert len(rows) == 20 and rows[0]["scheme"] == "FL-STD" and rows[-1]["scheme"] == "FL-CS-DP"
    text = script.render(rows, "CMD")
    assert "| FL-STD-DP | 1 | 0.55 (0.61) | 100 (25) |" in text
    assert "| FL-CS-DP | 0.05 | 0.70 (0.78) |" in text
    assert "FL-CS ≥ FL-RND ≥ FL-FREQ without DP at r = 0.05: **not met** (0.800 / 0.700 / 0.750" in text
    assert "with DP, FL-CS at r = 0.05 beats FL-STD-DP: **met**" in text
    assert "FL-CS-DP is best at the smallest r" in text and "**met** (0.700 / 0.690 / 0.680)" in text
    assert "bandwidth saving ~95 % at r = 0.05: **met** — measured uplink per round 95.0 % below" in text
    assert "within a few points (≤ 3) of FL-STD at r = 0.1: **not met**" in text
