"""Paper 003 end to end: FL, FTL-full, FTL-c and FbFTL through fedrun's own build/run path, with a tiny
source model trained in the test into a temporary cache, and a CI-sized version of the comparison (the bytes
every run logs; slow: through MLflow, the export and the paper's report).

To stay fast on the 2-core CI machine the datasets are cut to their first few thousand samples (the
loader is wrapped; partitioning, models, schemes and bytes are fedrun's own), and torch uses one thread.
Expected byte counts are computed here from the parameter counts by hand (LeNet-5 cut at body index 9:
f¹ 50,692 parameters, f² 11,014, N⁻ = 120 features).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fedrun.config import ConfigError
from fedrun.data.dataset import Dataset
from fedrun.run import build, run
from fedrun.tracking import NullTracker
from fedrun.transfer import server as srv
from fedrun.transfer.source import weights_hash

from conftest import compose
from tolerance import assert_f32_close

REPO = Path(__file__).resolve().parents[2]

F1, F2, N_FEAT, TOTAL = 50_692, 11_014, 120, 61_706
N_TRAIN, N_TEST = 3000, 500
CLIENTS, PER_ROUND, ROUNDS = 300, 10, 2  # 10 samples per client, like the results' 6000 × 10


def _cut(d: Dataset, n_train: int, n_test: int) -> Dataset:
    g = d.groups_train[:n_train] if d.groups_train is not None else None
    return Dataset(name=d.name, x_train=d.x_train[:n_train], y_train=d.y_train[:n_train], x_test=d.x_test[:n_test],
                   y_test=d.y_test[:n_test], task=d.task, num_classes=d.num_classes, source=d.source,
                   groups_train=g, group_names=d.group_names, info=d.info)


@pytest.fixture(scope="module")
def env(shared_data, tmp_path_factory):
    """Small datasets (memoised), a temporary fedrun cache for the source model, one torch thread."""
    import fedrun.data.sources as sources
    import fedrun.run as run_mod

    cache = tmp_path_factory.mktemp("fedrun_cache")
    real = sources.load_dataset
    memo: dict[str, Dataset] = {}

    def small(name, data_root=None, *args, **kwargs):
        if name not in memo:
            memo[name] = _cut(real(name, data_root, *args, **kwargs), N_TRAIN, N_TEST)
        return memo[name]

    for name in ("mnist", "femnist"):  # loaded (and .gz unpacked) with the user's usual cache
        small(name, shared_data)
    saved = (os.environ.get("FEDRUN_CACHE"), sources.load_dataset, run_mod.load_dataset, torch.get_num_threads())
    os.environ["FEDRUN_CACHE"] = str(cache)  # the source model goes to a temporary cache
    sources.load_dataset = run_mod.load_dataset = small
    torch.set_num_threads(1)
    yield {"data": shared_data, "cache": cache}
    if saved[0] is None:
        os.environ.pop("FEDRUN_CACHE", None)
    else:
        os.environ["FEDRUN_CACHE"] = saved[0]
    sources.load_dataset, run_mod.load_dataset = saved[1], saved[2]
    torch.set_num_threads(saved[3])


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # after conftest's 2: small ops run far faster on one thread of a busy machine
    yield


def cfg(env, scheme: str, *extra: str) -> dict:
    c = compose(["~experiment", f"scheme={scheme}", "dataset=mnist", "model=lenet5", "partition=iid", f"num_clients={CLIENTS}",
                 "sampler=uniform", f"clients_per_round={PER_ROUND}", f"rounds={ROUNDS}", "local_mode=gd",
                 "local_steps=2", "lr=0.1", "tracking=none", "progress=off", f"data_root={env['data']}",
                 "scheme.source_dataset=femnist", "scheme.cut_layer=9", "scheme.source_epochs=1",
                 "scheme.source_max_samples=1000", *extra])
    return OmegaConf.to_container(c, resolve=True)


def rounds(built, n: int) -> list[dict[str, float]]:
    """What run_rounds does per round (selection, ledger, scheme round), keeping the metrics."""
    sim, out = built.sim, []
    for rnd in range(1, n + 1):
        m = built.run_round(rnd)
        m.update(sim.ledger.metrics())
        out.append(m)
    return out


def source_state(env) -> dict[str, torch.Tensor]:
    files = list((env["cache"] / "source_models").glob("femnist-lenet5-*.pt"))
    assert len(files) == 1, files
    return torch.load(files[0], weights_only=True)["state_dict"]


def named(built) -> dict[str, torch.Tensor]:
    sim = built.sim
    return {**{n: p.detach().clone() for n, p in sim.model.named_parameters()},
            **{n: t.clone() for n, t in sim.layout.unflatten(sim.params).items()}}


def f1_names(params) -> list[str]:
    return [n for n in params if int(n.split(".")[1]) < 9]


# ---------------------------------------------------------------------------------------- FedAvg schemes
def test_fl_trains_everything_from_scratch_and_bytes_match_the_formula(env):
    built = build(cfg(env, "fl"))
    assert built.sim.n == TOTAL and built.names["scheme"] == "fl"
    m = rounds(built, ROUNDS)
    assert m[-1]["uplink_bytes_total"] == ROUNDS * PER_ROUND * 4 * TOTAL
    assert m[-1]["downlink_bytes_total"] == ROUNDS * PER_ROUND * 4 * TOTAL
    assert m[-1]["paper_uplink_bits"] == 8 * m[-1]["uplink_bytes_total"]  # uniform sampler: U·C exact
    assert m[-1]["paper_downlink_bits"] == 32 * ROUNDS * TOTAL == 8 * m[-1]["downlink_broadcast_bytes_total"]
    assert m[-1]["upload_batches_total"] == ROUNDS * PER_ROUND and m[-1]["params_per_batch"] == TOTAL
    assert "source_test_accuracy" not in m[0]


def test_ftl_full_starts_from_the_source_extractor_and_trains_all(env):
    built = build(cfg(env, "ftl_full"))
    src, start = source_state(env), named(built)
    scratch = named(build(cfg(env, "fl")))
    for n in f1_names(start):
        assert torch.equal(start[n], src[n]), n
    for n in start:  # f² is the target's own random initialisation (same seed as fl), not the source's
        if n not in f1_names(start):
            assert torch.equal(start[n], scratch[n]), n
    m = rounds(built, ROUNDS)
    end = named(built)
    assert all(not torch.equal(start[n], end[n]) for n in start)  # every parameter trains
    assert m[-1]["uplink_bytes_total"] == ROUNDS * PER_ROUND * 4 * TOTAL
    assert 0 < m[0]["source_test_accuracy"] <= 1 and m[0]["source_cached"] in (0.0, 1.0)
    assert built.sim.scheme.tags["transfer.source_sha256"] == weights_hash(src)  # the run names its source model


@pytest.mark.parametrize("hold", [False, True])
def test_ftl_c_freezes_the_extractor_and_sends_only_the_head(env, hold):
    built = build(cfg(env, "ftl_c", f"scheme.clients_hold_source={str(hold).lower()}"))
    sim = built.sim
    assert sim.n == F2 and set(sim.layout.names) == {"body.9.weight", "body.9.bias", "body.11.weight", "body.11.bias"}
    start = named(built)
    m = rounds(built, ROUNDS)
    end = named(built)
    src = source_state(env)
    for n in f1_names(start):
        assert torch.equal(end[n], src[n]), n  # frozen f¹ = the source's, untouched by training
    assert not torch.equal(start["body.9.weight"], end["body.9.weight"])
    distinct = len({int(c) for r in range(1, ROUNDS + 1) for c in sim.select(r)})
    assert m[-1]["uplink_bytes_total"] == ROUNDS * PER_ROUND * 4 * F2
    assert m[-1]["downlink_bytes_total"] == ROUNDS * PER_ROUND * 4 * F2 + (0 if hold else distinct * 4 * F1)
    assert m[-1]["downlink_broadcast_bytes_total"] == ROUNDS * 4 * F2 + (0 if hold else 4 * F1)
    assert m[-1]["paper_downlink_bits"] == 32 * (F1 + ROUNDS * F2)  # the paper's formula counts f¹ once
    assert m[-1]["paper_uplink_bits"] == 8 * m[-1]["uplink_bytes_total"]


def test_ftl_c_with_one_full_batch_step_is_centralised_sgd_on_features(env):
    """Paper 003's claim through fedrun: FedAvg-FTL-c with one local full-batch step per round (the
    paper's FedAvg: clients send summed gradients) = the FbFTL server's SGD on uploaded features whose
    batches are the union of the round's clients' samples."""
    built = build(cfg(env, "ftl_c", "local_steps=1", "rounds=3"))
    sim = built.sim
    p0 = sim.params.clone()
    chosen = []
    for rnd in range(1, 4):
        clients = sim.select(rnd)
        chosen.append(clients)
        sim.run_round(rnd, clients)
    model = sim.model
    sim.layout.load_into(model, p0)
    with torch.no_grad():
        z = model.features(sim.data.x, 9)
    head = model.body[9:]
    params = list(head.parameters())
    batches = [torch.as_tensor(np.concatenate([sim.data.parts[c] for c in cl])) for cl in chosen]
    srv.sgd_epoch(head, params, z, sim.data.y, batches, srv.make_optimizer(params, 0.1))
    got = sim.layout.flatten(model)
    assert (sim.params - p0).abs().max() > 1e-3
    # two float32 training paths (vmap-ed functional vs nn.Module autograd) of 3 full-batch steps on the union of
    # 10 clients' 10 samples: a step sums 100 samples through the head (120 → 84 → 10) and back, for both
    # paths; probabilistic round-off at the scale of the start and the update
    assert_f32_close(got, sim.params, p0, (sim.params - p0).abs(), terms=2 * 3 * (100 + 120 + 84 + 10),
                     probabilistic=True)


# ------------------------------------------------------------------------------------------------- FbFTL
@pytest.mark.parametrize("hold", [False, True])
def test_fbftl_uploads_once_shuffled_and_trains_at_the_server(env, hold):
    built = build(cfg(env, "fbftl", f"scheme.clients_hold_source={str(hold).lower()}", "rounds=3"))
    sim, runner = built.sim, built.runner
    m = rounds(built, 3)
    label_bytes = 1  # uint8 for 10 classes
    assert m[0]["uplink_bytes"] == N_TRAIN * (4 * N_FEAT + label_bytes)
    assert m[1]["uplink_bytes"] == m[2]["uplink_bytes"] == 0 == m[1]["downlink_bytes"]
    assert m[0]["downlink_bytes"] == (0 if hold else CLIENTS * 4 * F1)
    assert m[-1]["downlink_broadcast_bytes_total"] == (0 if hold else 4 * F1)
    assert m[-1]["paper_uplink_bits"] == 32 * N_FEAT * N_TRAIN and m[-1]["paper_downlink_bits"] == 32 * F1
    assert m[0]["upload_batches_total"] == N_TRAIN and m[0]["params_per_batch"] == N_FEAT
    assert m[0]["uplink_bytes_per_batch"] == 4 * N_FEAT + label_bytes
    assert m[0]["uploading_clients"] == CLIENTS and [x["server_epochs"] for x in m] == [1, 2, 3]
    # the server's pool: every sample's (f¹(x), y) exactly once, not in client order
    with torch.no_grad():
        z_ref = sim.model.features(sim.data.x, 9)
    client_order = torch.cat([torch.as_tensor(p) for p in sim.data.parts])
    assert not torch.equal(runner.y, sim.data.y[client_order])
    assert torch.equal(torch.sort(runner.y).values, torch.sort(sim.data.y).values)
    key = lambda z: torch.sort(z @ torch.linspace(1, 2, N_FEAT, dtype=z.dtype)).values  # noqa: E731 - row fingerprint
    # float32 features by client vs in one batch: both within the worst-case round-off of f¹'s sums (25 + 1, 150 + 1,
    # 400 + 1 terms) and the fingerprint's 120, at the scale of their terms: f¹ with |weights| on |x| bounds every
    # partial sum (ReLU and max-pool do not increase it)
    absf1 = copy.deepcopy(sim.model).double()
    with torch.no_grad():
        for p in absf1.parameters():
            p.abs_()
        scale = key(absf1.features(sim.data.x.double().abs(), 9)).max()
    assert_f32_close(key(runner.z), key(z_ref), scale, terms=2 * (26 + 151 + 401 + N_FEAT))
    # leakage of this upload: 300 clients with K = 10 labels each, 10 classes
    assert 0 < m[0]["label_leakage_expected_bits"] < m[0]["label_prior_bits"]
    # f¹ stays the source's; f² trained
    src = source_state(env)
    end = named(built)
    assert all(torch.equal(end[n], src[n]) for n in f1_names(end))
    assert m[-1]["train_loss"] < m[0]["train_loss"]


def test_fbftl_server_learning_rate_can_be_tuned_without_communication(env):
    built = build(cfg(env, "fbftl", "scheme.tune_lrs=[0.000001,0.1]", "scheme.tune_epochs=1"))
    m = rounds(built, 1)
    assert m[0]["server_lr"] == 0.1 and 0 <= m[0]["tune_best_val_accuracy"] <= 1
    assert m[0]["uplink_bytes"] == N_TRAIN * (4 * N_FEAT + 1)  # tuning sent nothing


def test_source_model_is_reused_from_the_cache(env):
    a = rounds(build(cfg(env, "ftl_c")), 1)[0]
    b = rounds(build(cfg(env, "fbftl")), 1)[0]
    assert b["source_cached"] == 1.0 and b["source_test_accuracy"] == a["source_test_accuracy"]
    assert len(list((env["cache"] / "source_models").glob("*.pt"))) == 1


# ------------------------------------------------------------------------------------ checkpoint / resume
@pytest.mark.parametrize("scheme,extra", [("ftl_c", []), ("fbftl", ["scheme.server_momentum=0.5"])])
def test_scheme_state_resumes_exactly(env, scheme, extra, tmp_path):
    """Rounds 1-2, the state a checkpoint holds (through torch.save), a fresh build, round 3 = an
    uninterrupted 3-round run: same parameters and byte counts; FbFTL sends nothing again."""
    from fedrun.checkpoint import load_into, save_checkpoint
    from fedrun.run import LoopState

    whole = build(cfg(env, scheme, "rounds=3", *extra))
    ref = rounds(whole, 3)
    c = cfg(env, scheme, "rounds=3", *extra)
    first = build(c)
    rounds(first, 2)
    path = save_checkpoint(tmp_path, first, LoopState(round=2), None)
    again = build(cfg(env, scheme, "rounds=3", *extra))
    load_into(path, again, LoopState())
    sim = again.sim
    m = again.run_round(3)
    m.update(sim.ledger.metrics())
    assert torch.equal(sim.params, whole.sim.params)
    for k in ("uplink_bytes", "uplink_bytes_total", "downlink_bytes_total", "downlink_broadcast_bytes_total",
              "upload_batches_total", "paper_uplink_bits", "paper_downlink_bits"):
        assert m[k] == ref[2][k], k
    if scheme == "fbftl":
        assert m["uplink_bytes"] == 0 and m["server_epochs"] == 3


# --------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("extra,message", [
    (["scheme.source_dataset=svhn"], "source_dataset='svhn' is unknown; allowed: femnist, mnist, fashion_mnist, imagenet"),
    (["scheme.cut_layer=3"], "cut_layer=3 is not a fully connected layer of model=lenet5 that can be cut; allowed: 7, 9, 11"),
    (["scheme.source_dataset=imagenet"], "source_dataset=imagenet needs torchvision's ImageNet VGG-16 weights"),
    (["scheme.source_dataset=lending_club"], "source_dataset='lending_club' is unknown"),
])
def test_bad_transfer_settings_are_config_errors(env, extra, message, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(ConfigError) as e:
        build(cfg(env, "ftl_c", *extra))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_cli_reports_a_bad_cut_layer_in_one_line(shared_data, tmp_path):
    p = subprocess.run([sys.executable, "-m", "fedrun.cli", "~experiment", "scheme=fbftl", "dataset=femnist", "model=femnist_cnn",
                        "scheme.cut_layer=5", "tracking=none", f"data_root={shared_data}"], cwd=tmp_path,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"}, capture_output=True, text=True, timeout=600)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("fedrun: error:")]
    assert lines == ["fedrun: error: cut_layer=5 is not a fully connected layer of model=femnist_cnn that can be cut; "
                     "allowed: 7 (body indices; default 7)"], p.stderr


# ------------------------------------------------------------------------------------ CI-sized results table
class RecordsTracker(NullTracker):
    """In-memory tracker giving the flat records fedrun.export.mlflow_records gives (params.*, tags.*,
    metrics.* = the value at the last step) and the metric histories."""

    where = "in memory"

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.histories: dict[str, dict[str, list[tuple[int, float]]]] = {}

    def start(self, params, tags, run_name=None, run_id=None) -> None:
        self.run_id = f"run{len(self.records)}"
        self.current = {"run_id": self.run_id, "status": "RUNNING", "start_time": len(self.records),
                        **{f"params.{k}": v for k, v in params.items()}, **{f"tags.{k}": v for k, v in tags.items()}}
        self.records.append(self.current)
        self.histories[self.run_id] = {}

    def log_metrics(self, metrics, step) -> None:
        for k, v in metrics.items():
            self.histories[self.run_id].setdefault(k, []).append((int(step), float(v)))
            self.current[f"metrics.{k}"] = float(v)

    def set_tags(self, tags) -> None:
        self.current.update({f"tags.{k}": str(v) for k, v in tags.items()})

    def end(self, status="FINISHED") -> None:
        self.current["status"] = status


def _check_bytes(records: list[dict]) -> None:
    """What a CI-sized comparison of the four schemes must count, computed by hand from the parameter counts:
    per upload batch, in total (measured and by the paper's formula) and on the downlink."""
    by = {r["tags.scheme"]: r for r in records if r["status"] == "FINISHED"}
    assert set(by) == {"fl", "ftl_full", "ftl_c", "fbftl"}
    m = lambda s, k: by[s][f"metrics.{k}"]  # noqa: E731
    # uploads: FedAvg 2 rounds × 10 clients; FbFTL one batch per training sample (features + a uint8 label)
    assert m("fl", "upload_batches_total") == m("ftl_c", "upload_batches_total") == 2 * PER_ROUND
    assert m("fbftl", "upload_batches_total") == N_TRAIN
    assert (m("fl", "params_per_batch"), m("ftl_c", "params_per_batch"), m("fbftl", "params_per_batch")) \
        == (TOTAL, F2, N_FEAT)
    assert m("fbftl", "uplink_bytes_per_batch") == 4 * N_FEAT + 1 and m("fl", "uplink_bytes_per_batch") == 4 * TOTAL
    # totals: FbFTL uploads N_TRAIN·(481 B); FTL-c 20 uploads of 11,014 floats; FL and FTL-full 20 of 61,706
    assert m("fbftl", "uplink_bytes_total") == N_TRAIN * 481
    assert m("ftl_c", "uplink_bytes_total") == 20 * 4 * F2
    assert m("fl", "uplink_bytes_total") == m("ftl_full", "uplink_bytes_total") == 20 * 4 * TOTAL
    assert m("fl", "paper_uplink_bits") == 8 * 20 * 4 * TOTAL    # uniform sampling: exactly the expected clients
    # downlink: FbFTL sends f¹ to each of the 300 clients, broadcast once (the paper's formula counts it once)
    assert m("fbftl", "downlink_bytes_total") == CLIENTS * 4 * F1
    assert m("fbftl", "downlink_broadcast_bytes_total") * 8 == m("fbftl", "paper_downlink_bits") == 8 * 4 * F1
    for r in by.values():
        assert 0 <= r["metrics.test_accuracy"] <= 1 and r["metrics.rounds_completed"] == 2


def test_ci_sized_comparison_counts_every_byte(env, tmp_path):
    """The four schemes at CI size through run(cfg): what each run logs for the comparison table."""
    tracker = RecordsTracker()
    for scheme in ("fl", "ftl_full", "ftl_c", "fbftl"):
        run(cfg(env, scheme, "eval_every=2"), tracker=tracker, out_dir=tmp_path / scheme)
    _check_bytes(tracker.records)


@pytest.mark.slow
def test_ci_sized_comparison_table_from_mlflow(env, tmp_path):
    """The results pipeline at CI size: four runs tracked in MLflow, exported (MLflow → export, as ``python -m
    fedrun.report fbftl --export`` does) and the real report (fedrun.reports.fbftl.table) pointed at that export
    and 2 rounds (one pair)."""
    import shutil

    from fedrun.export import export
    from fedrun.export import mlflow_records
    from fedrun.reports import fbftl
    from fedrun.reports.common import README, Export, markers
    from fedrun.tracking import MlflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for scheme in ("fl", "ftl_full", "ftl_c", "fbftl"):
        run(cfg(env, scheme, "eval_every=2"), tracker=MlflowTracker(uri, "fbftl-ci"), out_dir=tmp_path / scheme)
    _check_bytes(mlflow_records(uri, "fbftl-ci"))
    root = tmp_path / "repo"   # the report's text and a README with its claims block
    (root / "results" / "fbftl").mkdir(parents=True)
    shutil.copy(REPO / "results" / "fbftl" / "table.template.md", root / "results" / "fbftl" / "table.template.md")
    start, end = markers("fbftl")
    (root / README).parent.mkdir(parents=True, exist_ok=True)   # the claims file (docs/results.md, with its folder)
    (root / README).write_text(f"# A README\n{start}\n{end}\n")
    # the runs come from this checkout, which may have uncommitted changes
    _, _, n = export(uri, ["fbftl-ci"], root / "results" / "fbftl" / "runs", allow_dirty=True)
    assert n == 4
    exports = (Export("results/fbftl/runs/fbftl-ci", "fbftl-ci"),)
    files = fbftl.table(root, exports, rounds=ROUNDS)
    assert fbftl.table(root, exports, rounds=ROUNDS) == files   # the same export gives the same files
    text = files[Path("results/fbftl/table.md")].decode()
    assert "Runs: 4 in the export `results/fbftl/runs/fbftl-ci.runs.csv.gz`; 4 in the tables" in text
    assert "<!-- claims: fbftl" in files[Path(README)].decode()
    rows = {ln.split("|")[2].strip(): [x.strip() for x in ln.split("|")[1:-1]]
            for ln in text.split("## Test accuracy")[0].splitlines() if ln.startswith("| FEMNIST |")}
    assert list(rows) == ["FL", "FTL-full", "FTL-c", "FbFTL"]
    assert rows["FbFTL"][2] == f"{N_TRAIN:,} (1)" and rows["FTL-c"][4] == f"{F2:,}"
    assert rows["FL"][7] == f"{8 * 20 * 4 * TOTAL / 1e9:.4g} (1)"
