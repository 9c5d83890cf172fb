"""The scheme contract (docs/extending.md, "Adding a scheme"), checked for every scheme config in conf/scheme/ (discovered).

For each scheme: its class declares ``dp_modes`` ⊆ {off, client, local} with "off" in it. Two rounds built by
``fedrun.run.build`` and driven by the runner's own loop (``run_rounds``) record uplink bytes equal to the sum of the messages the scheme handed the ledger, at least one
message per selected client, and the bytes its ``compression_ratio`` promises (r·n 32-bit words per client and
round, plus a few bytes of seeds); the first aggregator receives one row per selected client, as wide as the
scheme's ``payload_dim`` and with no more non-zero values than were sent; the global model changes every round.
For each DP mode the scheme declares, the same two rounds run with that mode (and the same checks) and record one
accountant event per round (client) or one noised upload per uploaded row (local); each mode it does not declare
is refused by ``prepare()`` and ``build()``, before any data is loaded, in one line naming the scheme and the
modes it takes. docs/extending.md's top-k example is the tested file.

Everything runs on the first 40 MNIST training images (LeNet-5, 4 clients, one local step)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path

import pytest
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

import fedrun.run as run_module
from fedrun.config import ConfigError
from fedrun.run import LoopState, build, prepare, run_rounds
from fedrun.schemes.transfer import FbFTL
from fedrun.tracking import NullTracker

from conftest import CONF_DIR, REPO, compose

SCHEMES = sorted(p.stem for p in Path(CONF_DIR, "scheme").glob("*.yaml"))
MODES = ("off", "client", "local")
N_TRAIN, N_TEST = 40, 100
#: 4 clients of 10 images, all taking part (Poisson with C = 1: no empty round, and the client-level accountant
#: needs no subsampled composition); local DP engages 2 per round (round robin)
SMALL = ["dataset=mnist", "model=lenet5", "r=0.1", "num_clients=4", "sample_rate=1.0", "clients_per_round=2",
         "local_steps=1", "batch_size=5", "lr=0.05", "rounds=2", "eval_every=2", "checkpoint_every=0", "seed=0",
         "tracking=none", "progress=off", "workers=1"]
#: what a scheme's uploads may carry besides r·n 32-bit words (FL-RND's 8-byte round seed)
EXTRA_BYTES = 64
MODE_WORDS = {"off": "dp=false", "client": "dp=true", "local": "dp=local_laplace|local_gaussian"}


@functools.lru_cache(maxsize=None)
def _scheme_class(scheme: str) -> type:
    return get_class(OmegaConf.load(Path(CONF_DIR, "scheme", f"{scheme}.yaml"))["scheme"]["_target_"])


def _config(data_root: Path, scheme: str, mode: str, *extra: str) -> dict:
    """The small run of ``scheme`` with DP ``mode``, with what the mode needs from the sampler and local training
    (the scheme's own sampler where it fits); a fresh copy of a config composed once (Hydra: ~0.3 s a compose)."""
    return copy.deepcopy(_composed(data_root, scheme, mode, *extra))


@functools.lru_cache(maxsize=None)
def _composed(data_root: Path, scheme: str, mode: str, *extra: str) -> dict:
    cls = _scheme_class(scheme)
    over = [f"data_root={data_root}", *SMALL, f"scheme={scheme}", "dp=false"]
    if cls.needs_image_source:  # a tiny source model (cached by its settings), MNIST itself as the source
        over += ["scheme.source_dataset=mnist", "scheme.source_epochs=1", "scheme.source_max_samples=256"]
    sampler = _scheme_sampler(scheme)
    if mode == "client":
        over += ["dp=true", "epsilon=1", "clipping_norm=1.0", "sampler=poisson"]  # C = 1: full participation stays
    elif mode == "local":
        over += ["dp=local_gaussian", "epsilon=1", "local_clip=1.0", "local_mode=gd"]
        if sampler not in ("round_robin", "all"):
            over += ["sampler=round_robin"]
    return OmegaConf.to_container(compose(over + list(extra)), resolve=True)


def _scheme_sampler(scheme: str) -> str | None:
    """The sampler a scheme's config picks (``defaults: - override /sampler: all``), None if it keeps the default."""
    for entry in OmegaConf.load(Path(CONF_DIR, "scheme", f"{scheme}.yaml")).get("defaults", []):
        if isinstance(entry, dict) or OmegaConf.is_dict(entry):
            for key, value in dict(entry).items():
                if key.endswith("/sampler"):
                    return str(value)
    return None


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread (after conftest's two): these rounds are tiny, and on a loaded 2-core machine a second
    thread mostly spins (about 3× the CPU time of the file)."""
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def small_mnist(_datasets_loaded_once):
    """run.build loads the first N_TRAIN / N_TEST MNIST samples (one Dataset for the module; views, no copy); the
    runner draws no accuracy plot and logs the RDP ε only (neither is part of the contract)."""
    original = run_module.load_dataset

    @functools.lru_cache(maxsize=None)
    def cut(name, *args, **kwargs):
        d = original(name, *args, **kwargs)
        return dataclasses.replace(d, x_train=d.x_train[:N_TRAIN], y_train=d.y_train[:N_TRAIN],
                                   x_test=d.x_test[:N_TEST], y_test=d.y_test[:N_TEST],
                                   groups_train=None if d.groups_train is None else d.groups_train[:N_TRAIN],
                                   groups_test=None if d.groups_test is None else d.groups_test[:N_TEST])

    from fedrun.privacy.privatizer import Privatizer

    saved = run_module.load_dataset, run_module.plot_curve, Privatizer.epsilons
    epsilons = Privatizer.epsilons
    run_module.load_dataset = cut
    run_module.plot_curve = lambda *args, **kwargs: None  # the accuracy PNG: ~0.5 s of matplotlib per run
    Privatizer.epsilons = lambda self, *args, **kwargs: epsilons(self, last=False)  # no PLD ε (1–2 s a call)
    yield
    run_module.load_dataset, run_module.plot_curve, Privatizer.epsilons = saved


class Observer:
    """Records, round by round, what the round did through the simulation's stages: the clients selected, every
    message given to ``ledger.uplink``, every aggregator the privatizer opened and the rows (and their width)
    added to it, the rows the privatizer noised (local DP), and whether the global model changed."""

    def __init__(self, built) -> None:
        sim = built.sim
        self.rounds: list[dict] = []
        self._cur: dict = {}
        run_round, uplink, open_, upload = built.runner.run_round, sim.ledger.uplink, sim.privatizer.open, \
            sim.privatizer.upload

        def run_round_spy(rnd):
            self._cur = {"before": sim.params.clone(), "messages": [], "aggregators": [], "noised": 0}
            metrics = run_round(rnd)
            cur = self._cur
            cur.update(round=rnd, clients=int(metrics["clients"]), changed=not torch.equal(cur.pop("before"),
                                                                                           sim.params),
                       uplink_bytes=sim.ledger.uplink_round, uplink_messages=sim.ledger.uplink_messages_round,
                       events=len(sim.accountant.events) if sim.accountant is not None else None)
            self.rounds.append(cur)
            return metrics

        def uplink_spy(message, count=1):
            self._cur["messages"].append((message.nbytes, int(count)))
            uplink(message, count)

        def open_spy(rnd, clients, weights, dim, field=None):
            agg = open_(rnd, clients, weights, dim, field)
            rec = {"dim": int(dim), "widths": set(), "rows": 0, "nonzeros": 0}
            add = agg.add

            def add_spy(rows):
                rec["widths"].add(int(rows.shape[1]))
                rec["rows"] += int(rows.shape[0])
                if rows.numel():
                    rec["nonzeros"] = max(rec["nonzeros"], int((rows != 0).sum(1).max()))
                add(rows)

            agg.add = add_spy
            self._cur["aggregators"].append(rec)
            return agg

        def upload_spy(rnd, clients, payload):
            self._cur["noised"] += len(clients) if sim.local_dp is not None else 0
            return upload(rnd, clients, payload)

        built.runner.run_round, sim.ledger.uplink = run_round_spy, uplink_spy
        sim.privatizer.open, sim.privatizer.upload = open_spy, upload_spy


def _two_rounds(c: dict, tmp_path: Path):
    built = build(c)
    obs = Observer(built)
    loop = LoopState()
    return built, obs, loop, (lambda: run_rounds(built, NullTracker(), tmp_path, loop))


# ------------------------------------------------------------------------------------------ declarations
@pytest.mark.parametrize("scheme", SCHEMES)
def test_scheme_declares_its_dp_modes(scheme):
    modes = _scheme_class(scheme).dp_modes
    assert isinstance(modes, tuple) and set(modes) <= set(MODES) and "off" in modes, (scheme, modes)


# ------------------------------------------------------------------------------------------ two rounds, no DP
@pytest.mark.parametrize("scheme", SCHEMES)
def test_two_rounds_keep_the_contract(scheme, small_mnist, shared_data, tmp_path):
    built, obs, loop, go = _two_rounds(_config(shared_data, scheme, "off"), tmp_path)
    go()  # run_rounds, the runner's loop
    _check_rounds(scheme, built, obs, loop)


def _check_rounds(scheme: str, built, obs: Observer, loop: LoopState) -> None:
    """What every scheme owes the simulation, round by round (module docstring)."""
    sim = built.sim
    assert [r["round"] for r in obs.rounds] == [1, 2]
    for rec, row in zip(obs.rounds, loop.rows):
        sent = sum(nbytes * count for nbytes, count in rec["messages"])
        assert rec["uplink_bytes"] == sent == row["uplink_bytes"], (scheme, rec["round"])
        assert rec["changed"], f"scheme={scheme}: round {rec['round']} left the global model unchanged"
        if isinstance(sim.scheme, FbFTL):  # paper 003: every client uploads (z, y) once, in round 1; then the
            continue                       # server trains alone (checked in _check_one_shot_upload below)
        assert rec["clients"] > 0, f"scheme={scheme}: no client selected in round {rec['round']}"
        assert rec["uplink_messages"] >= rec["clients"], (scheme, rec)
        words = sim.scheme.compression_ratio * sim.n  # r·n 32-bit words per client and round
        per_client = rec["uplink_bytes"] / rec["clients"]
        assert 4 * words - 1e-6 * words <= per_client <= 4 * words + EXTRA_BYTES, \
            f"scheme={scheme}: {per_client:g} uplink bytes per client; compression_ratio says 4·r·n = {4 * words:g}"
        assert rec["aggregators"], f"scheme={scheme}: no aggregator from the privatizer"
        payload = rec["aggregators"][0]
        assert payload["dim"] == sim.scheme.payload_dim, (scheme, payload)
        assert payload["rows"] == rec["clients"], (scheme, payload)
        assert payload["nonzeros"] <= per_client / 4, f"scheme={scheme}: a payload row has {payload['nonzeros']} " \
            f"non-zero values but a client sends {per_client:g} bytes: the server aggregates more than was sent"
        for agg in rec["aggregators"]:
            assert agg["widths"] <= {agg["dim"]}, f"scheme={scheme}: rows of width {agg['widths']} added to an " \
                                                  f"aggregator of dimension {agg['dim']}"
    if isinstance(sim.scheme, FbFTL):
        _check_one_shot_upload(built, obs)


def _check_one_shot_upload(built, obs: Observer) -> None:
    sim = built.sim
    first, second = obs.rounds
    holders = int((sim.data.sizes > 0).sum())
    assert first["uplink_messages"] == holders  # one message per client with data, selected or not
    assert first["uplink_bytes"] == int(sim.data.sizes.sum()) * (4 * built.runner.facts["features"] + 1)  # float32 z, uint8 y
    assert second["uplink_messages"] == 0 and not second["aggregators"]


# ------------------------------------------------------------------------------------------ DP modes
DECLARED = [(s, m) for s in SCHEMES for m in _scheme_class(s).dp_modes if m != "off"]
UNDECLARED = [(s, m) for s in SCHEMES for m in MODES if m not in _scheme_class(s).dp_modes]


@pytest.mark.parametrize("scheme,mode", DECLARED)
def test_declared_dp_mode_runs_through_the_dp_path(scheme, mode, small_mnist, shared_data, tmp_path):
    built, obs, loop, go = _two_rounds(_config(shared_data, scheme, mode), tmp_path)
    sim = built.sim
    if mode == "local":  # local DP's noise is calibrated to the n-dimensional update (LocalDP.privatize)
        assert sim.scheme.payload_dim == sim.n, f"scheme={scheme} declares local DP but transmits " \
            f"{sim.scheme.payload_dim} of n={sim.n} values; declare dp_modes without \"local\""
    go()
    _check_rounds(scheme, built, obs, loop)
    for rec in obs.rounds:
        if mode == "client":
            assert rec["events"] == rec["round"], f"scheme={scheme}: {rec['events']} accountant events after round " \
                                                  f"{rec['round']}"
            assert sum(a["rows"] for a in rec["aggregators"]) == rec["uplink_messages"], (scheme, rec)
        else:
            assert rec["noised"] == rec["uplink_messages"], (scheme, rec)
    assert all(row["epsilon"] > 0 for row in loop.rows)  # what the runner logged (LocalDP.epsilon is once a round)
    if mode == "local":
        assert int(sim.local_dp.counts.sum()) == sum(r["uplink_messages"] for r in obs.rounds)


@pytest.mark.parametrize("scheme,mode", UNDECLARED)
def test_undeclared_dp_mode_is_refused_before_data_loads(scheme, mode, shared_data, monkeypatch):
    cls = _scheme_class(scheme)
    value = {"client": "true", "local": "local_laplace"}[mode]
    c = _config(shared_data, scheme, "off")
    c["dp"] = value  # as dp=<value> on the command line (the refusal comes before any sampler or clip setting)
    with pytest.raises(ConfigError) as err:
        prepare(copy.deepcopy(c))
    assert str(err.value) == _refusal_from_build(c, monkeypatch)
    message = str(err.value)
    assert "\n" not in message and f"dp={value} is not available with scheme={scheme}" in message, message
    assert all(MODE_WORDS[m] in message for m in cls.dp_modes), message


def _refusal_from_build(c: dict, monkeypatch) -> str:
    """What ``build`` (the run's entry point) says, with a data loader that fails the test if it is called."""
    def no_data(*args, **kwargs):
        raise AssertionError("data was loaded before the DP mode was refused")

    monkeypatch.setattr(run_module, "load_dataset", no_data)
    with pytest.raises(ConfigError) as err:
        build(c)
    return str(err.value)


def test_readme_example_is_the_tested_scheme():
    """docs/extending.md's "Adding a scheme" shows fedrun/schemes/topk.py's class as it is (the file this module tests)."""
    readme = Path(REPO, "docs", "extending.md").read_text()
    shown = "class TopK(Scheme):" + readme.split("```python\nclass TopK(Scheme):", 1)[1].split("```", 1)[0]
    source = Path(REPO, "fedrun", "schemes", "topk.py").read_text()
    assert shown.strip() == source[source.index("class TopK(Scheme):"):].strip()


def test_the_error_feedback_example_is_the_shipped_scheme():
    """docs/extending.md's error-feedback codec and its YAML are fedrun/schemes/topk_ef.py and conf/scheme/topk_ef.yaml
    as they are (the scheme the contract and neighbour tests run)."""
    doc = Path(REPO, "docs", "extending.md").read_text()
    for path, fence in (("fedrun/schemes/topk_ef.py", "```python\n"), ("conf/scheme/topk_ef.yaml", "```yaml\n")):
        shown = doc.split(f"`{path}`", 1)[1].split(fence, 1)[1].split("```", 1)[0]
        assert shown == Path(REPO, path).read_text(), path
