"""fedrun.tracking and fedrun.metric_names: metric names in MLflow, the UI's URLs, the saved runs-table view, sweep run names.

The naming test drives fedrun.run.run on tiny synthetic federations (no data loading, no MLflow store): every
metric a run logs, per round and in its summary, for client-level DP, FL-CS, the sketch schemes and local DP,
is a key metric or lies in a group (``dp/…``), never in ``other/`` (a metric nobody placed).
"""

from __future__ import annotations

import json
import numpy as np
import pytest
import torch
from torch import nn

from fedrun import tracking as t
from fedrun.metric_names import KEY_METRICS, OTHER, RENAMED, SUMMARY_METRICS, internal_name, metric_name
from fedrun.tracking import run_url, runs_table_url, sweep_suffix, swept_keys, ui_base, view_columns, view_tag_value


# ------------------------------------------------------------------------------------------ names
def test_key_metrics_keep_their_names_diagnostics_get_a_group():
    for name in KEY_METRICS:
        assert metric_name(name) == name
    assert metric_name("dp_clipped_fraction") == "dp/clipped_fraction"
    assert metric_name("ldp_noise_item_var") == "local_dp/noise_item_var"
    assert metric_name("cs_residual_ratio") == "decoder/residual_ratio"
    assert metric_name("partition_samples_min") == "partition/samples_min"
    assert metric_name("sketch_epsilon") == "sketch/epsilon"
    assert metric_name("best_test_accuracy") == "summary/best_test_accuracy"
    assert metric_name("clients") == "sampling/clients"
    assert metric_name("already/grouped") == "already/grouped"
    assert metric_name("brand_new_metric") == OTHER + "brand_new_metric"


KNOWN = (list(KEY_METRICS) + list(SUMMARY_METRICS) + list(RENAMED)
         + ["partition_clients", "ldp_epsilon_rdp_max", "ldp_delta", "dp_noise_multiplier", "dp_delta",
            "cs_iterations", "server_lr", "source_test_accuracy", "label_leakage_bits", "paper_uplink_bits",
            "brand_new_metric"])


@pytest.mark.parametrize("name", KNOWN)
def test_internal_name_inverts_metric_name(name):
    assert internal_name(metric_name(name)) == name


def test_no_two_names_share_an_mlflow_name():
    mapped = [metric_name(n) for n in KNOWN]
    assert len(set(mapped)) == len(mapped)


def test_names_logged_before_the_groups_read_back_unchanged():
    for name in ("best_test_accuracy", "dp_clipped_fraction", "test_accuracy", "epsilon_final"):
        assert internal_name(name) == name


# ------------------------------------------------------------------------------------------ URLs
def test_runs_table_url_opens_model_training_and_fedruns_view():
    url = runs_table_url("http://127.0.0.1:5000", "7")
    assert url == ("http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"
                   "&viewStateShareKey=fedrun")
    assert runs_table_url("http://h:1/", "7", view=False) == \
        "http://h:1/#/experiments/7/runs?workflowType=machine_learning"


def test_run_url():
    assert run_url("http://h:1", "3", "abc") == "http://h:1/#/experiments/3/runs/abc?workflowType=machine_learning"
    assert run_url("http://h:1", "3", "abc", "model-metrics").endswith(
        "/runs/abc/model-metrics?workflowType=machine_learning")


def test_ui_base(monkeypatch):
    monkeypatch.delenv("PORT", raising=False)
    assert ui_base("sqlite:///mlflow.db") == "http://127.0.0.1:5000"
    assert ui_base("sqlite:///mlflow.db", port=5077) == "http://127.0.0.1:5077"
    monkeypatch.setenv("PORT", "8080")
    assert ui_base("sqlite:///x.db") == "http://127.0.0.1:8080"
    assert ui_base("https://mlflow.example.org/") == "https://mlflow.example.org"  # a server serves its own UI


def test_store_urls_of_a_missing_sqlite_store_creates_nothing(tmp_path):
    db = tmp_path / "none.db"
    assert t.store_urls(f"sqlite:///{db}") == []
    assert not db.exists()


def test_ui_url_command_lists_the_experiments_with_runs(tmp_path, capsys):
    """A real store: one experiment with runs and fedrun's view, one deleted, one empty, MLflow's Default."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = t.prepare_store(uri, "fedrun")
    client = MlflowClient(tracking_uri=uri)
    client.create_run(exp), client.create_run(exp)
    client.delete_run(client.create_run(exp).info.run_id)
    gone = client.create_experiment("gone")
    client.create_run(gone)
    client.delete_experiment(gone)
    client.create_experiment("empty")
    assert t.main(["ui-url", "--uri", uri, "--port", "5001"]) == 0
    out = capsys.readouterr().out
    assert (f"runs table of experiment 'fedrun' (2 runs): http://127.0.0.1:5001/#/experiments/{exp}/runs?"
            "workflowType=machine_learning&viewStateShareKey=fedrun") in out
    assert "Default" not in out and "gone" not in out and "empty" not in out


# ------------------------------------------------------------------------------------------ the saved view
def test_view_columns_swept_params_then_key_metrics_then_tags():
    cols = view_columns(["scheme", "r", "+scheme.rows"], groups=["scheme"])
    assert cols[:3] == ["tags.`scheme`", "params.`r`", "params.`scheme.rows`"]
    assert "metrics.`test_accuracy`" in cols and "metrics.`summary/best_test_accuracy`" in cols
    assert cols.index("metrics.`epsilon`") < cols.index("tags.`dataset`")
    assert view_columns(["experiment"], groups=["experiment"]) == view_columns()  # a group without a tag


def test_view_tag_is_mlflows_saved_view_envelope():
    env = json.loads(view_tag_value(["params.`r`", "metrics.`epsilon`"], now_ms=2000, created_ms=1000))
    assert env["name"] == t.VIEW_NAME and env["createdAt"] == 1000 and env["updatedAt"] == 2000
    state = json.loads(env["state"])
    assert state["selectedColumns"] == state["columnOrder"] == ["params.`r`", "metrics.`epsilon`"]
    # not sorted by creation time: MLflow folds a sweep's runs under the parent run only then
    assert state["orderByKey"] == "tags.`mlflow.runName`"
    assert state["searchFilter"] == "tags.`fedrun.kind` = 'run'"
    assert len(json.dumps(env)) < 20000  # MLflow's limit on an experiment tag


class FakeClient:
    def __init__(self):
        self.tags: dict[str, str] = {}

    def set_experiment_tag(self, exp_id, key, value):
        self.tags[key] = value


def test_setup_experiment_merges_swept_columns():
    c = FakeClient()
    t.setup_experiment(c, "1", {}, swept=["r"])
    t.setup_experiment(c, "1", {t.VIEW_TAG: c.tags[t.VIEW_TAG]}, swept=["lr", "scheme"], groups=["scheme"])
    cols = json.loads(json.loads(c.tags[t.VIEW_TAG])["state"])["selectedColumns"]
    assert cols[:2] == ["params.`r`", "params.`lr`"] and cols[2:] == view_columns()
    before = dict(c.tags)
    c.tags.clear()
    t.setup_experiment(c, "1", before, swept=["r"])  # nothing new: no write
    assert c.tags == {}


# ------------------------------------------------------------------------------------------ sweeps
def test_swept_keys_are_the_overrides_with_several_values():
    assert swept_keys(["scheme=fl_cs,fl_rnd", "r=0.05,0.1", "rounds=3", "lr=range(1,3)", "~experiment"]) == \
        ["scheme", "r", "lr"]


def test_sweep_suffix_names_the_swept_values_of_a_job():
    job = ["scheme=fl_cs", "r=0.05", "rounds=3", "+scheme.rows=4"]
    assert sweep_suffix(job, ["scheme", "r"]) == "r=0.05"  # the scheme is already in the run name
    assert sweep_suffix(job, ["r", "scheme.rows"]) == "r=0.05 scheme.rows=4"
    assert sweep_suffix(job, []) == ""


# ------------------------------------------------------------------------------------------ what a run logs
N_CLIENTS, FEATURES, CLASSES = 6, 12, 4


class Recorder(t.NullTracker):
    def __init__(self):
        self.names: set[str] = set()

    def log_metrics(self, metrics, step):
        self.names |= set(metrics)


def _built(kind: str):
    from fedrun.data.partition import partition_stats
    from fedrun.privacy.local_dp import LocalDP
    from fedrun.run import Built
    from fedrun.sampling import AllSampler, PoissonSampler
    from fedrun.schemes.dct import CompressiveSensingScheme
    from fedrun.schemes.fedavg import FedAvg
    from fedrun.schemes.local_dp import LocalDPFedAvg
    from fedrun.schemes.sketch import FedSketch, FedSketchGate
    from fedrun.simulation import ClientDP, Simulation
    from fedrun.training import ClientData, LocalSpec

    g = torch.Generator().manual_seed(1)
    x = torch.randn(N_CLIENTS * 20, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (N_CLIENTS * 20,), generator=g)
    parts = [np.arange(i * 20, (i + 1) * 20) for i in range(N_CLIENTS)]
    torch.manual_seed(0)
    client_dp = local_dp = None
    spec = LocalSpec("sgd", steps=1, batch_size=5, lr=0.1)
    sampler = AllSampler(N_CLIENTS)
    if kind in ("fedavg_dp", "fl_cs_dp"):
        sampler = PoissonSampler(N_CLIENTS, 0.9)
        client_dp = ClientDP(clipping_norm=1.0, noise_multiplier=3.0, sampling_probability=0.9,
                             expected_clients=0.9 * N_CLIENTS, delta=1e-5)
    scheme = {"fedavg_dp": FedAvg, "fl_cs_dp": lambda: CompressiveSensingScheme(r=0.5, chunks=1),
              "fedsketch": lambda: FedSketch(rows=1, cols=2), "fedsketchgate": lambda: FedSketchGate(rows=2, cols=4),
              "local_dp": LocalDPFedAvg}[kind]()
    if kind == "local_dp":
        spec = LocalSpec("gd", steps=1, batch_size=5, lr=0.1, clip_norm=1.0)
        local_dp = LocalDP("gaussian", 5.0, 1.0, 0.1, 1, np.full(N_CLIENTS, 2), np.full(N_CLIENTS, 20), delta=1e-5)
    sim = Simulation(model=nn.Linear(FEATURES, CLASSES), data=ClientData(x, y, parts), x_test=x[:30], y_test=y[:30],
                     sampler=sampler, scheme=scheme, spec=spec, seed=0, client_dp=client_dp, local_dp=local_dp)
    names = {"dataset": "synthetic", "model": "linear", "partition": "iid", "scheme": kind,
             "dp": "client" if client_dp else ("local_gaussian" if local_dp else "none"), "device": "cpu"}
    return Built(sim, names, partition_stats(parts, y.numpy()), {"task": "classification"})


RUN_CONFIG = {"rounds": 2, "eval_every": 1, "patience": 1, "validation_fraction": 0.1, "checkpoint_every": 0,
              "progress": "off", "resume": False, "seed": 0, "tracking": {"run_name": None}}


@pytest.mark.parametrize("kind,groups", [("fedavg_dp", {"dp/", "summary/", "partition/", "sampling/"}),
                                         ("fl_cs_dp", {"decoder/", "dp/"}),
                                         ("fedsketch", set()),
                                         ("fedsketchgate", {"client/"}),
                                         ("local_dp", {"local_dp/"})])
def test_every_metric_a_run_logs_is_a_key_metric_or_in_a_group(kind, groups, monkeypatch, tmp_path):
    import fedrun.run as fr

    built = _built(kind)
    built.sim.x_val, built.sim.y_val = built.sim.x_test, built.sim.y_test  # patience=1 evaluates it
    from types import SimpleNamespace

    built.cfg = SimpleNamespace(rounds=2, eval_every=1, patience=1, checkpoint_every=0, progress="off", record={},
                                skip_finished=False, resume=False, run_name=None, tracking_uri=None)
    monkeypatch.setattr(fr, "prepare", lambda c: [])
    monkeypatch.setattr(fr, "typed", lambda c: built.cfg)
    monkeypatch.setattr(fr, "build", lambda c: built)
    rec = Recorder()
    fr.run(dict(RUN_CONFIG), tracker=rec, out_dir=tmp_path)
    mlflow_names = {metric_name(n) for n in rec.names}
    assert {"test_accuracy", "train_loss", "uplink_bytes_total", "summary/best_test_accuracy"} <= mlflow_names
    assert not [n for n in mlflow_names if n.startswith(OTHER)], "metrics nobody placed: add them to fedrun.metric_names"
    assert all(n in KEY_METRICS or "/" in n for n in mlflow_names)
    for g in groups:
        assert any(n.startswith(g) for n in mlflow_names), (g, sorted(mlflow_names))
    if kind in ("fedavg_dp", "local_dp"):
        assert "epsilon" in mlflow_names


class FakeMlflowClient:
    def __init__(self):
        self.created, self.metrics, self.asked, self.tags, self.status = None, [], [], {}, None

    def create_run(self, exp_id, tags, run_name):
        from types import SimpleNamespace

        self.created = (exp_id, tags, run_name)
        return SimpleNamespace(info=SimpleNamespace(run_id="r1"))

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.metrics += list(metrics)

    def get_metric_history(self, run_id, key):
        self.asked.append(key)
        return [m for m in self.metrics if m.key == key]

    def set_tag(self, run_id, key, value):
        self.tags[key] = value

    def set_terminated(self, run_id, status):
        self.status = status


def test_mlflow_tracker_logs_grouped_names_and_names_a_sweeps_run(monkeypatch):
    """On the way in (the real store: tests/integration/test_run.py::test_mlflow_run_contents)."""
    import mlflow.tracking

    fake = FakeMlflowClient()
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", lambda tracking_uri: fake)  # no store is opened
    monkeypatch.setattr(t, "prepare_store", lambda uri, experiment: "4")
    tr = t.MlflowTracker("sqlite:///unused.db", "fedrun-test", parent_run_id="p", name_suffix="r=0.05")
    tr.start({"r": "0.05"}, {"scheme": "fl_cs"}, run_name="fl_cs-mnist")
    exp_id, tags, name = fake.created
    assert exp_id == "4" and name == "fl_cs-mnist r=0.05"
    assert tags["fedrun.kind"] == "run" and tags["mlflow.parentRunId"] == "p" and tags["scheme"] == "fl_cs"
    tr.log_metrics({"test_accuracy": 0.5, "dp_clipped_fraction": 0.25, "best_test_accuracy": 0.5}, step=3)
    assert {m.key for m in fake.metrics} == {"test_accuracy", "dp/clipped_fraction", "summary/best_test_accuracy"}
    assert tr.last_step("dp_clipped_fraction") == 3 and fake.asked == ["dp/clipped_fraction"]
    base = t.ui_base(tr.uri)
    assert tr.urls() == {"run": run_url(base, "4", "r1"), "runs": runs_table_url(base, "4")}
    tr.end()  # the run's description: its key numbers
    assert fake.status == "FINISHED" and "| 0.5 |" in fake.tags["mlflow.note.content"]


def test_mlflow_tracker_logs_diagnostics_only_when_asked(monkeypatch):
    """MLflow's run page lists every group of charts before the key metrics: diagnostics only when asked."""
    import mlflow.tracking

    row = {"test_accuracy": 0.5, "dp_clipped_fraction": 0.25, "clients": 3.0, "best_test_accuracy": 0.5}
    logged = {}
    for diagnostics in (False, True):
        fake = FakeMlflowClient()
        monkeypatch.setattr(mlflow.tracking, "MlflowClient", lambda tracking_uri: fake)
        monkeypatch.setattr(t, "prepare_store", lambda uri, experiment: "4")
        tr = t.MlflowTracker("sqlite:///unused.db", "fedrun-test", diagnostics=diagnostics)
        tr.start({}, {})
        tr.log_metrics(row, step=1)
        logged[diagnostics] = {m.key for m in fake.metrics}
        assert tr.latest == row  # the run's description still sees every number
    assert logged[False] == {"test_accuracy", "summary/best_test_accuracy"}
    assert logged[True] == logged[False] | {"dp/clipped_fraction", "sampling/clients"}


def test_run_note_lists_the_key_numbers_of_a_finished_run():
    note = t.run_note({"best_test_mse": 0.0213, "best_round": 7, "rounds_completed": 9, "uplink_bytes_final": 2.5e6})
    assert note.splitlines()[0].startswith("| best test MSE | at round | final ε | uplink MB")
    assert note.splitlines()[2] == "| 0.0213 | 7 | – | 2.50 | – | 9 |"
    assert t.run_note({"test_accuracy": 0.5}) == ""  # no summary yet (a failed or interrupted run)
