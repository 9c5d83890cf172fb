"""What ε covers (fedrun.metric_names): every metric a DP run logs is classified as covered by ε or not, and under
DP (client-level or local) each one ε does not cover is logged to MLflow as ``nonprivate/<its name>`` and listed in
the run tag ``dp.not_covered_by_epsilon``; metrics.csv keeps its columns (``metrics_privacy.csv`` marks them) and
the export keeps both marks while :func:`fedrun.export.load` gives the names the reports read. Without DP nothing is
marked.

The DP runs are real and tiny (MNIST / Lending Club, 2 rounds, as tests/integration/test_client_dp.py), logged to a
real MLflow store with ``tracking.diagnostics=true``, with every optional stage that adds metrics: the clock with
over-selection and its targets, SecAgg, the privacy audit, early stopping's validation split.
"""

from __future__ import annotations

import csv

import pytest

from fedrun import tracking as t
from fedrun.metric_names import (COVERED_BY_EPSILON, KEY_METRICS, NOT_COVERED, NOT_COVERED_BY_EPSILON,
                                 NOT_COVERED_TAG, RENAMED, SUMMARY_METRICS, covered_by_epsilon, internal_name,
                                 is_diagnostic, metric_name)

MNIST = ["dataset=mnist", "model=lenet5", "num_clients=40", "sample_rate=0.25", "rounds=2", "eval_every=1",
         "patience=5", "validation_fraction=0.05"]
CLIENT_DP = ["dp=true", "noise_multiplier=1.0", "clipping_norm=0.05"]
DEPLOYMENT = ["network=datacenter", "network.over_selection=1.3", "network.target_accuracy=0.05",
              "network.target_epsilon=100", "secagg=secagg_plus"]
LENDING = ["dataset=lending_club", "scheme=ldp_fedavg", "sampler=round_robin", "clients_per_round=5", "num_clients=10",
           "local_mode=gd", "local_steps=2", "rounds=2", "eval_every=1", "lr=0.1", "local_clip=150", "local_clip_ord=1",
           "epsilon=10"]
#: DP runs that between them log every metric a DP run can log (FbFTL and SketchedSGD take no DP)
DP_RUNS = {
    "fl_std+clock+secagg+audit": [*MNIST, *CLIENT_DP, *DEPLOYMENT, "audit.canaries=20", "sample_rate=0.5"],  # the abort
    # bit is small enough to be charged at q = 0.5 (refused at 0.25: fedrun.privacy.abort)
    "fl_cs": [*MNIST, *CLIENT_DP, "scheme=fl_cs", "r=0.05", "scheme.max_iter=5"],
    "fedsketchgate": [*MNIST, *CLIENT_DP, "scheme=fedsketchgate", "sampler=poisson", "sample_rate=1.0",
                      "num_clients=10", "scheme.rows=1", "scheme.cols=50", "clipping_norm=0.5"],
    "local_gaussian": [*LENDING, "dp=local_gaussian"],
    "local_laplace": [*LENDING, "dp=local_laplace"],
}


def _run(fast_cfg, tmp_path, overrides, diagnostics=True):
    """A real run logged to a real MLflow store: (MLflow metric names, tags, metrics.csv header, out dir, summary)."""
    from mlflow.tracking import MlflowClient

    from fedrun.run import run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = t.MlflowTracker(uri, "privacy", diagnostics=diagnostics)
    out = tmp_path / "out"
    summary = run(fast_cfg(*overrides), tracker=tracker, out_dir=out)
    r = MlflowClient(tracking_uri=uri).get_run(tracker.run_id)
    with open(out / "metrics.csv") as f:
        header = next(csv.reader(f))
    return set(r.data.metrics), r.data.tags, header, out, summary


# ------------------------------------------------------------------------------------------ the classification
def test_the_classification_is_a_partition_with_reasons():
    covered = [n for names in COVERED_BY_EPSILON.values() for n in names]
    not_covered = [n for names in NOT_COVERED_BY_EPSILON.values() for n in names]
    assert len(set(covered)) == len(covered) and len(set(not_covered)) == len(not_covered)
    assert not set(covered) & set(not_covered)
    for name in (*KEY_METRICS, *SUMMARY_METRICS, *RENAMED):  # every name fedrun places by hand is classified
        assert covered_by_epsilon(name) is not None, name
    assert covered_by_epsilon("brand_new_metric") is None
    # the ones the task is about
    for name in ("dp_mean_norm", "dp_clipped_fraction", "dp_clients", "clients", "train_loss", "ldp_noise_item_var",
                 "secagg_survivors", "clock_compute_s", "uplink_bytes", "downlink_bytes_total", "sim_time_s"):
        assert covered_by_epsilon(name) is False, name
    for name in ("epsilon", "test_accuracy", "val_accuracy", "cost_bits", "dp_noise_std", "cs_residual_ratio"):
        assert covered_by_epsilon(name) is True, name
    # what the classification decides under DP (and nothing without)
    assert [metric_name(n, dp=True) for n in ("train_loss", "dp_clients", "epsilon", "dp_noise_std")] == \
        ["nonprivate/train_loss", "nonprivate/dp/clients", "epsilon", "dp/noise_std"]
    assert [metric_name(n) for n in ("train_loss", "dp_clients")] == ["train_loss", "dp/clients"]


def test_a_marked_name_maps_back_and_only_what_epsilon_does_not_cover_is_marked():
    marked = set()
    for name in ("train_loss", "dp_clipped_fraction", "clients", "best_test_accuracy", "uplink_bytes_final",
                 "epsilon", "ldp_noise_item_var", "brand_new_metric"):  # an unclassified one is marked under DP
        assert internal_name(metric_name(name, dp=True)) == name
        if metric_name(name, dp=True) != metric_name(name):
            assert metric_name(name, dp=True) == NOT_COVERED + metric_name(name)
            marked.add(name)
    assert marked == {"train_loss", "dp_clipped_fraction", "clients", "uplink_bytes_final", "ldp_noise_item_var",
                      "brand_new_metric"}


# ------------------------------------------------------------------------------------------ real DP runs
@pytest.mark.parametrize("kind", list(DP_RUNS))
def test_every_metric_a_dp_run_logs_is_classified_and_marked_when_not_covered(kind, fast_cfg, tmp_path):
    names, tags, header, out, summary = _run(fast_cfg, tmp_path, DP_RUNS[kind])
    fedrun_names = {internal_name(m): m for m in names}
    unclassified = sorted(n for n in fedrun_names if covered_by_epsilon(n) is None)
    assert not unclassified, f"classify them in fedrun.metric_names (COVERED_BY_EPSILON / NOT_COVERED_...): " \
                             f"{unclassified}"
    for name, logged in fedrun_names.items():
        assert logged == metric_name(name, dp=True), name
        assert logged.startswith(NOT_COVERED) == (not covered_by_epsilon(name)), (name, logged)
    not_covered = {n for n in fedrun_names if not covered_by_epsilon(n)}
    assert {"train_loss", "clients", "uplink_bytes_total"} <= not_covered
    assert "nonprivate/train_loss" in names and "nonprivate/sampling/clients" in names
    assert "epsilon" in names and {"test_accuracy", "test_mse"} & names and "train_loss" not in names
    # the tag lists every metric ε does not cover, also those only in metrics.csv
    listed = set(tags[NOT_COVERED_TAG].split(","))
    assert listed == not_covered | {c for c in header if c != "round" and not covered_by_epsilon(c)}
    # metrics.csv keeps fedrun's names; metrics_privacy.csv marks its columns
    assert "train_loss" in header and "clients" in header
    with open(out / "metrics_privacy.csv") as f:
        marks = {r["metric"]: r for r in csv.DictReader(f)}
    assert set(marks) == set(header) - {"round"}
    for name, row in marks.items():
        assert row["covered_by_epsilon"] == str(bool(covered_by_epsilon(name))).lower(), name
        assert row["mlflow_name"] == metric_name(name, dp=True) and row["reason"]
    if kind.startswith("fl_std"):
        for name in ("dp_clipped_fraction", "dp_mean_norm", "dp_clients", "secagg_survivors", "clock_compute_s",
                     "sim_time_s", "uplink_bytes", "downlink_bytes", "round_seconds"):
            assert metric_name(name, dp=True) in names and NOT_COVERED + metric_name(name) in names, name
        for name in ("dp_noise_std", "audit_epsilon_lower", "val_accuracy", "cost_bits"):
            assert metric_name(name) in names, name
    if kind == "fl_cs":  # the decoder works on the noised aggregate: covered
        assert {"decoder/residual_ratio", "decoder/iterations", "dp/noise_std"} <= names
    if kind == "fedsketchgate":  # the clients' corrections c_j come from their own sketches
        assert {"nonprivate/client/sketch/gate_c_mean_norm", "nonprivate/client/sketch/gate_c_rms_norm"} <= names
    if kind.startswith("local"):
        assert {"nonprivate/local_dp/noise_item_var", "nonprivate/local_dp/clients_noised",
                "local_dp/epsilon_target", "nonprivate/sampling/clients"} <= names


def test_without_dp_nothing_is_marked_and_diagnostics_stay_hidden(fast_cfg, tmp_path):
    """The same run with and without client-level DP: without, no metric is marked, no tag, no metrics_privacy.csv;
    with (and tracking.diagnostics=false, the default), the key metrics ε does not cover are marked and shown, the
    diagnostics hidden as before."""
    plain, plain_tags, _, plain_out, _ = _run(fast_cfg, tmp_path / "plain", MNIST, diagnostics=False)
    dp, dp_tags, _, _, _ = _run(fast_cfg, tmp_path / "dp", [*MNIST, *CLIENT_DP], diagnostics=False)
    assert not [m for m in plain if m.startswith(NOT_COVERED)]
    assert NOT_COVERED_TAG not in plain_tags and not (plain_out / "metrics_privacy.csv").exists()
    assert {"train_loss", "uplink_bytes_total", "test_accuracy", "summary/uplink_bytes_final"} <= plain
    assert not [m for m in plain | dp if is_diagnostic(m)]
    marked = {m for m in dp if m.startswith(NOT_COVERED)}
    assert {"nonprivate/train_loss", "nonprivate/uplink_bytes_total", "nonprivate/summary/uplink_bytes_final"} <= marked
    assert {m.removeprefix(NOT_COVERED) for m in dp} - {"epsilon", "summary/epsilon_final", "summary/epsilon_at_best"} \
        == plain
    assert "train_loss" in dp_tags[NOT_COVERED_TAG].split(",")


# ------------------------------------------------------------------------------------------ the tracker
class FakeClient:
    def __init__(self):
        self.metrics, self.tags, self.asked = [], {}, []

    def create_run(self, exp_id, tags, run_name):
        from types import SimpleNamespace

        return SimpleNamespace(info=SimpleNamespace(run_id="r1"))

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.metrics += list(metrics)
        self.tags.update({x.key: x.value for x in tags})

    def get_metric_history(self, run_id, key):
        self.asked.append(key)
        return [m for m in self.metrics if m.key == key]


ROW = {"test_accuracy": 0.5, "train_loss": 1.2, "uplink_bytes_total": 10.0, "epsilon": 0.3,
       "dp_clipped_fraction": 0.25, "dp_noise_std": 0.1, "clients": 3.0}


@pytest.mark.parametrize("diagnostics", [False, True])
def test_the_tracker_marks_what_epsilon_does_not_cover_only_under_dp(monkeypatch, diagnostics):
    import mlflow.tracking

    logged, tags = {}, {}
    for dp in (False, True):
        fake = FakeClient()
        monkeypatch.setattr(mlflow.tracking, "MlflowClient", lambda tracking_uri: fake)
        monkeypatch.setattr(t, "prepare_store", lambda uri, experiment: "4")
        tr = t.MlflowTracker("sqlite:///unused.db", "x", diagnostics=diagnostics)
        tr.set_dp(dp)
        tr.start({}, {})
        tr.log_metrics(ROW, step=1)
        logged[dp], tags[dp] = {m.key for m in fake.metrics}, dict(fake.tags)
        assert tr.latest == ROW
        assert tr.last_step("train_loss") == 1 and fake.asked[-1] == metric_name("train_loss", dp)
    assert logged[False] == {"test_accuracy", "train_loss", "uplink_bytes_total", "epsilon"} | (
        {"dp/clipped_fraction", "dp/noise_std", "sampling/clients"} if diagnostics else set())
    assert logged[True] == {"test_accuracy", "nonprivate/train_loss", "nonprivate/uplink_bytes_total", "epsilon"} | (
        {"nonprivate/dp/clipped_fraction", "dp/noise_std", "nonprivate/sampling/clients"} if diagnostics else set())
    assert NOT_COVERED_TAG not in tags[False]
    assert tags[True][NOT_COVERED_TAG] == "clients,dp_clipped_fraction,train_loss,uplink_bytes_total"
    # the saved runs-table view shows the bytes of runs with and without DP
    cols = t.view_columns()
    assert cols.index("metrics.`uplink_bytes_total`") + 1 == cols.index("metrics.`nonprivate/uplink_bytes_total`")


# ------------------------------------------------------------------------------------------ the export
def test_the_export_keeps_the_marks_and_load_gives_the_reports_names(fast_cfg, tmp_path):
    from fedrun.export import export, keep_metric, load, read_export

    _, _, _, _, summary = _run(fast_cfg, tmp_path, [*MNIST, *CLIENT_DP])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    export(uri, ["privacy"], tmp_path / "runs", allow_dirty=True, metrics=("train_loss", "test_accuracy", "dp/*"))
    (raw,), points = read_export(tmp_path / "runs" / "privacy")
    assert "metrics.nonprivate/train_loss" in raw and "metrics.train_loss" not in raw
    assert "metrics.nonprivate/summary/uplink_bytes_final" in raw and "metrics.summary/epsilon_final" in raw
    assert "train_loss" in raw[f"tags.{NOT_COVERED_TAG}"].split(",")
    assert {k for _, k, _, _ in points} >= {"nonprivate/train_loss", "test_accuracy", "nonprivate/dp/clipped_fraction"}
    assert keep_metric("nonprivate/dp/mean_norm", ["dp/*"]) and not keep_metric("nonprivate/train_loss", ["dp/*"])
    (rec,) = load(tmp_path / "runs" / "privacy")
    assert rec["metrics.uplink_bytes_final"] == summary["uplink_bytes_final"]
    assert "train_loss" in rec["series"] and "dp_clipped_fraction" in rec["series"]
    assert "train_loss" in rec[f"tags.{NOT_COVERED_TAG}"].split(",")
