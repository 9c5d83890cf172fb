"""End-to-end runs through run(cfg) with configs composed as the CLI does (small, fast settings)."""

import csv

import numpy as np
import pytest
import torch

from fedrun.run import build, run
from fedrun.tracking import MlflowTracker, metric_name
from tolerance import assert_f32_close, f32_tol

PAIRS = [("fashion_mnist", "fashion_cnn"), ("fashion_mnist", "lenet5"), ("mnist", "lenet5"),
         ("femnist", "femnist_cnn"), ("lending_club", "lr")]


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("dataset,model", PAIRS)
def test_two_rounds_of_every_dataset_model_pair(fast_cfg, tmp_path, dataset, model):
    extra = ["num_clients=null", "sample_rate=0.1"] if dataset in ("femnist", "lending_club") else []
    if dataset == "lending_club":
        extra += ["local_mode=gd", "lr=0.1"]
    summary = run(fast_cfg(f"dataset={dataset}", f"model={model}", *extra), out_dir=tmp_path)
    key = "best_test_mse" if dataset == "lending_club" else "best_test_accuracy"
    assert summary["rounds_completed"] == 2
    assert np.isfinite(summary[key])
    rows = _rows(tmp_path / "metrics.csv")
    assert [int(r["round"]) for r in rows] == [1, 2]
    for name in ("test_loss", "train_loss", "uplink_bytes", "uplink_bytes_total", "downlink_bytes",
                 "downlink_bytes_total", "cost_bits", "round_seconds"):
        assert name in rows[0]
    assert (tmp_path / "config.yaml").exists()


def test_fedavg_round_is_the_size_weighted_average_and_bytes_are_exact(fast_cfg):
    built = build(dict(_plain(fast_cfg("dataset=mnist", "model=lenet5", "sample_rate=0.5"))))
    sim = built.sim
    w0 = sim.params.clone()
    clients = sim.select(1)
    local = torch.cat([m for _, m, _ in sim.train(clients, 1)])  # the models the round aggregates
    sizes = sim.data.sizes[clients].astype(np.float64)
    weights = torch.as_tensor(sizes / sizes.sum())[:, None]
    terms = weights * (local.double() - w0.double())
    expected = w0.double() + terms.sum(0)  # float64 reference from the same float32 inputs
    sim.run_round(1, clients)
    # float32 round-off: Δ = local − w0, the weights' cast, a sum of K products, + w0
    assert_f32_close(sim.params, expected, (w0, 1), terms.abs().sum(0), terms=len(clients) + 3)
    k, n = len(clients), 61_706
    assert sim.ledger.uplink_round == k * n * 4
    assert sim.ledger.downlink_round == k * n * 4


def _plain(cfg):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def test_same_seed_same_metrics_other_seed_differs(fast_cfg, tmp_path):
    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        out = tmp_path / name
        run(fast_cfg("dataset=mnist", "model=lenet5", f"seed={seed}"), out_dir=out)
        runs[name] = [{k: v for k, v in r.items() if k != "round_seconds"} for r in _rows(out / "metrics.csv")]
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]


def test_sequential_path_gives_the_same_run(fast_cfg, tmp_path, full_test_split):  # bound below: of 10,000 images
    a = run(fast_cfg("dataset=mnist", "model=lenet5"), out_dir=tmp_path / "v")
    b = run(fast_cfg("dataset=mnist", "model=lenet5", "vectorized=false"), out_dir=tmp_path / "s")
    # two float32 training paths: at most 2 of the 10,000 test predictions may flip (a near-tie of two logits)
    assert a["best_test_accuracy"] == pytest.approx(b["best_test_accuracy"], abs=2e-4)
    ra, rb = _rows(tmp_path / "v" / "metrics.csv"), _rows(tmp_path / "s" / "metrics.csv")
    # the loss of both paths: probabilistic float32 round-off of 2 local steps whose gradient elements sum
    # batch 10 × 28² positions of LeNet-5's first convolution
    rel = f32_tol(1.0, terms=2 * 2 * 10 * 28 * 28, probabilistic=True)
    for x, y in zip(ra, rb):
        assert float(x["train_loss"]) == pytest.approx(float(y["train_loss"]), rel=rel)
        assert x["uplink_bytes_total"] == y["uplink_bytes_total"]


def test_mlflow_run_contents(fast_cfg, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri, "fedrun-test")
    summary = run(fast_cfg("dataset=mnist", "model=lenet5", "rounds=3"), tracker=tracker, out_dir=tmp_path / "out")
    client = MlflowClient(tracking_uri=uri)
    r = client.get_run(tracker.run_id)
    assert r.info.status == "FINISHED"
    assert r.data.tags["scheme"] == "fl_std" and r.data.tags["dataset"] == "mnist"
    assert r.data.tags["model"] == "lenet5" and r.data.tags["git_commit"]
    assert r.data.params["rounds"] == "3" and r.data.params["dataset.name"] == "mnist"
    assert r.data.params["scheme._target_"] == "fedrun.schemes.fedavg.FedAvg"
    for name in ("test_accuracy", "test_loss", "train_loss", "uplink_bytes", "uplink_bytes_total",
                 "downlink_bytes", "downlink_bytes_total", "cost_bits", "round_seconds"):
        hist = client.get_metric_history(tracker.run_id, name)
        assert [m.step for m in sorted(hist, key=lambda m: m.step)] == [1, 2, 3], name
    up = {m.step: m.value for m in client.get_metric_history(tracker.run_id, "uplink_bytes_total")}
    per = {m.step: m.value for m in client.get_metric_history(tracker.run_id, "uplink_bytes")}
    assert up[3] == per[1] + per[2] + per[3]
    for name in ("best_test_accuracy", "best_round", "cost_bits_at_best"):
        assert r.data.metrics[metric_name(name)] == pytest.approx(summary[name])
    assert "partition/clients" in r.data.metrics and "summary/best_test_accuracy" in r.data.metrics  # grouped
    exp = client.get_experiment(r.info.experiment_id)  # fedrun's saved view of the runs table
    assert "mlflow.sharedViewState.fedrun" in exp.tags
    from fedrun.export import mlflow_records

    (rec,) = mlflow_records(uri, "fedrun-test")  # fedrun's own names again
    assert rec["metrics.best_test_accuracy"] == pytest.approx(summary["best_test_accuracy"])
    arts = {a.path for a in client.list_artifacts(tracker.run_id)}
    assert {"config.yaml", "metrics.csv", "test_accuracy.png"} <= arts


def test_early_stopping_holds_out_data_and_stops(fast_cfg, tmp_path):
    summary = run(fast_cfg("dataset=lending_club", "num_clients=null", "local_mode=gd", "lr=0.3",
                           "rounds=30", "patience=2", "sampler=all"), out_dir=tmp_path)
    # the held-out MSE converges within a few rounds, then stops improving: it stops long before 30
    assert summary["rounds_completed"] < 30
    assert summary["stopped_round"] == summary["rounds_completed"]
    assert "val_mse" in _rows(tmp_path / "metrics.csv")[0]


def test_a_nan_training_loss_stops_the_run(fast_cfg, tmp_path, monkeypatch):
    """Clients that report a NaN training loss from round 2 on (the model itself stays finite)."""
    from fedrun.run import RunDiverged
    from fedrun.simulation import Simulation

    train = Simulation.train

    def nan_from_round_2(self, clients, rnd, correction=None):
        for ids, local, loss in train(self, clients, rnd, correction):
            yield ids, local, loss * float("nan") if rnd >= 2 else loss

    monkeypatch.setattr(Simulation, "train", nan_from_round_2)
    cfg = _plain(fast_cfg("dataset=mnist", "model=lenet5", "rounds=4", "sampler=all", "num_clients=10"))
    with pytest.raises(RunDiverged, match="diverged at round 2"):
        run(cfg, out_dir=tmp_path)
    with open(tmp_path / "metrics.csv") as f:
        assert [int(r["round"]) for r in csv.DictReader(f)] == [1]  # round 1 kept, nothing after
