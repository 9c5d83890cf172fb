"""Paper 000's schemes end to end through run(cfg) (configs composed as the CLI does), and its Table III sweep.

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
    (["scheme=fl_cs", "r=1.5"], r"r=1.5 is not allowed; use a number in \(0, 1\]"),
    (["scheme=fl_cs", "r=0.05", "scheme.chunks=0"], r"scheme.chunks=0; allowed: an integer P >= 1"),
    (["scheme=fl_cs", "r=0.00001", "scheme.chunks=4"], r"scheme.chunks=4 with r=1e-05 and n=114314: .*m=2"),
    (["scheme=fl_cs", "r=0.05", "scheme.solver=admm"], r"scheme.solver='admm' is unknown; allowed: fista, owlqn"),
])
def test_bad_values_are_one_line_config_errors(fast_cfg, overrides, message):
    from omegaconf import OmegaConf

    with pytest.raises(ConfigError, match=message):
        build(OmegaConf.to_container(fast_cfg(*overrides), resolve=True))


def _sweep_jobs(experiment: str, **fixed: str) -> list[list[str]]:
    """The jobs of an experiment's Hydra sweep (``hydra.sweeper.params``, the basic sweeper's cartesian product),
    with some keys pinned to one value."""
    import itertools
    from pathlib import Path

    from omegaconf import OmegaConf

    conf = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "experiment" / f"{experiment}.yaml")
    params = {k: str(v).split(",") for k, v in OmegaConf.select(conf, "hydra.sweeper.params").items()}
    params.update({k: [v] for k, v in fixed.items()})
    return [[f"experiment={experiment}", *(f"{k}={v}" for k, v in zip(params, combo))]
            for combo in itertools.product(*params.values())]


def test_table3_sweep_covers_every_cell_with_its_clipping_norm():
    """Every job of `fedrun -m experiment=kerkouche21_table3` composes and validates (no data needed): 4 schemes ×
    3 r × DP on/off × server options on/off; FL-STD runs once (r = 1 for every r of the sweep), S from the model's
    table, and each cell has a distinct config hash (seed 0 here; the seeds only multiply it by 4)."""
    from conftest import compose
    from omegaconf import OmegaConf

    from fedrun.checkpoint import config_hash
    from fedrun.resolve import tuned_clipping_norm
    from fedrun.run import prepare

    jobs = _sweep_jobs("kerkouche21_table3", seed="0")
    assert len(jobs) == 3 * 2 * 2 * 4
    from pathlib import Path

    model = Path(__file__).resolve().parents[2] / "conf" / "model" / "fashion_cnn.yaml"
    table = OmegaConf.to_container(OmegaConf.load(model))["clipping_norm"]
    hashes = {}
    for ov in jobs:
        c = OmegaConf.to_container(compose(ov), resolve=True)
        prepare(c)
        scheme, r = c["scheme"]["name"], c["r"]
        assert c["rounds"] == 200 and c["dataset"]["name"] == "fashion_mnist" and c["skip_finished"] is True
        assert c["server_opts"] in ("on", "off")
        if scheme == "fl_std":
            assert r == 1.0
        if c["dp"] is True:
            assert c["clipping_norm"] == tuned_clipping_norm(table, scheme, r) and c["epsilon"] <= 1.0
        hashes.setdefault(config_hash(c), []).append(ov)
    assert len(hashes) == (1 + 3 * 3) * 2 * 2  # 40 distinct runs per seed: FL-STD's 3 r values are one run
