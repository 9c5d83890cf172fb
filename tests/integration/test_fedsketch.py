"""Paper 002's schemes end to end on MNIST / LeNet-5 through run(cfg), configs composed as the CLI does."""

from __future__ import annotations

import csv

import pytest

from fedrun.config import ConfigError
from fedrun.run import run
from fedrun.tracking import MlflowTracker

N = 61_706  # LeNet-5 parameters
# MNIST / LeNet-5, no DP (pinned: the primary config's defaults may change)
BASE = ["dataset=mnist", "model=lenet5", "dp=false", "epsilon=null", "noise_multiplier=null"]
K_OF_N = ["sampler=uniform", "num_clients=10", "clients_per_round=5", "eval_every=2"]  # evaluate once


def _cfg(fast_cfg, *overrides: str):
    """fast_cfg with BASE, where ``overrides`` replace BASE entries of the same key."""
    keys = {o.split("=", 1)[0] for o in overrides}
    return fast_cfg(*[b for b in BASE if b.split("=", 1)[0] not in keys], *overrides)


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("overrides,up,down", [
    # per round: K = 5 participants of N = 10; t = 2, k = 50, m = 50 (= k)
    (["scheme=fedsketch", "scheme.unsketch=privix"], 5 * 4 * 100, 10 * 4 * 100),
    (["scheme=fedsketch", "scheme.unsketch=heaprix"], 5 * 4 * 150, 10 * 4 * 150),
    (["scheme=fedsketchgate", "scheme.unsketch=heaprix", "sampler=all"], 10 * 4 * 150, 10 * 4 * 150),
    (["scheme=sketchedsgd", "local_steps=1"], 5 * 4 * 150, 5 * 4 * 50 + 10 * 8 * 50),
    (["scheme=fedsgd", "local_steps=1"], 5 * 4 * N, 5 * 4 * N),
])
def test_every_scheme_runs_on_mnist_and_logs_exact_bytes(fast_cfg, tmp_path, overrides, up, down):
    size = [] if overrides[0] == "scheme=fedsgd" else ["scheme.rows=2", "scheme.cols=50"]
    summary = run(_cfg(fast_cfg, *K_OF_N, *size, *overrides), out_dir=tmp_path)
    assert summary["rounds_completed"] == 2 and 0 <= summary["best_test_accuracy"] <= 1
    rows = _rows(tmp_path / "metrics.csv")
    assert [float(r["uplink_bytes"]) for r in rows] == [up, up]
    assert [float(r["downlink_bytes"]) for r in rows] == [down, down]
    assert summary["uplink_bytes_final"] == 2 * up


def test_mlflow_has_bytes_accuracy_and_the_theorem_1_epsilon(fast_cfg, tmp_path):
    """A 1×2 sketch satisfies Theorem 1's condition at l = 61,706 (default C/σ = 4.93): ε is logged with its
    assumption; the invalid case (tag only, no metric) is covered in tests/unit/test_sketch_schemes.py."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri, "fedsketch-test")
    run(_cfg(fast_cfg, *K_OF_N, "scheme=fedsketch", "scheme.rows=1", "scheme.cols=2"), tracker=tracker,
        out_dir=tmp_path / "a")
    client = MlflowClient(tracking_uri=uri)
    a = client.get_run(tracker.run_id)
    assert a.data.tags["scheme"] == "fedsketch" and a.data.tags["sketch_epsilon_status"] == "valid"
    assert "Assumption 1" in a.data.tags["sketch_epsilon_assumption"]
    assert a.data.metrics["sketch/epsilon"] > 0
    for name in ("uplink_bytes", "downlink_bytes", "uplink_bytes_total", "train_loss", "sketch/epsilon"):
        assert len(client.get_metric_history(tracker.run_id, name)) == 2, name
    assert len(client.get_metric_history(tracker.run_id, "test_accuracy")) == 1  # eval_every=2


def test_client_level_dp_on_the_sketch(fast_cfg, tmp_path):
    summary = run(_cfg(fast_cfg, "sampler=poisson", "eval_every=2", "scheme=fedsketch", "scheme.unsketch=heaprix",
                           "scheme.heavy_values=sketch", "scheme.num_heavy=20", "dp=true", "noise_multiplier=1.0",
                           "clipping_norm=0.5"), out_dir=tmp_path)
    assert summary["epsilon_final"] > 0 and summary["dp_noise_multiplier"] == 1.0
    assert "dp_clipped_fraction" in _rows(tmp_path / "metrics.csv")[0]


@pytest.mark.parametrize("overrides,message", [
    (["scheme=fedsketch", "scheme.unsketch=median"], "scheme.unsketch='median' is unknown; allowed: privix, heaprix"),
    (["scheme=fedsketch", "scheme.rows=0"], "scheme.rows=0; allowed: an integer >= 1"),
    (["scheme=fedsketch", "scheme.cols=0"], "scheme.cols=0; allowed: an integer >= 1"),
    (["scheme=fedsketch", "scheme.rows=100", "scheme.cols=1000"], "sketch would be bigger than the model"),
    (["scheme=fedsketchgate", "sampler=poisson"], "needs full participation"),
    (["scheme=sketchedsgd", "local_steps=2"], "allowed: local_steps=1"),
    (["scheme=fedsketch", "scheme.unsketch=heaprix", "dp=true", "noise_multiplier=1"], "second exchange"),
])
def test_bad_values_are_config_errors(fast_cfg, tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=None) as err:
        run(_cfg(fast_cfg, *overrides), out_dir=tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)
