"""Server-side options set alike for every compared scheme: server momentum on the decoded update
(FedAvgM) for FedAvg-shaped schemes, FL-CS's momentum + error feedback in R^m, and ``server_opts`` mapping them."""

import numpy as np
import pytest
import torch
from torch import nn

from fedrun.checkpoint import load_into, save_checkpoint
from fedrun.config import ConfigError
from fedrun.resolve import resolve_server_opts
from fedrun.run import Built, LoopState
from fedrun.sampling import UniformSampler
from fedrun.schemes.dct import CompressiveSensingScheme, FreqScheme
from fedrun.schemes.fedavg import FedAvg
from fedrun.schemes.random import RandomCoordinatesScheme
from fedrun.schemes.sketch import FedSketch
from fedrun.simulation import Simulation
from fedrun.training import ClientData, LocalSpec


class _Sim:
    """What :meth:`Simulation.server_step` acts on (the global model, in float64 here, the scheme, the velocity),
    stepped by the simulation's own server step."""

    server_step = Simulation.server_step

    def __init__(self, scheme, n: int) -> None:
        self.scheme = scheme
        self.params = torch.zeros(n, dtype=torch.float64)
        self.velocity = None


def test_server_momentum_is_fedavgm_on_the_decoded_update() -> None:
    rho, lr = 0.5, 2.0
    sim = _Sim(FedAvg(server_lr=lr, server_momentum=rho), 3)
    u1, u2, u3 = (torch.tensor(v, dtype=torch.float64) for v in ([1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]))
    for u in (u1, u2, u3):
        sim.server_step(u.clone())
    v1 = u1
    v2 = rho * v1 + u2
    v3 = rho * v2 + u3
    assert torch.allclose(sim.params, lr * (v1 + v2 + v3), rtol=0, atol=1e-15)
    sim2 = _Sim(FedAvg(server_lr=lr), 3)
    for u in (u1, u2, u3):
        sim2.server_step(u.clone())
    assert torch.allclose(sim2.params, lr * (u1 + u2 + u3), rtol=0, atol=1e-15)
    assert sim2.velocity is None  # no momentum: no state


def _real_sim(scheme) -> Simulation:
    """A tiny simulation (nn.Linear(2, 2): n = 6) whose global model starts at zero."""
    x, y = torch.zeros(8, 2), torch.zeros(8, dtype=torch.int64)
    sim = Simulation(model=nn.Linear(2, 2), data=ClientData(x, y, [np.arange(4), np.arange(4, 8)]), x_test=x,
                     y_test=y, sampler=UniformSampler(2, 1), scheme=scheme, spec=LocalSpec("sgd", steps=1,
                     batch_size=4, lr=0.1), seed=0)
    sim.params.zero_()
    return sim


def test_server_velocity_is_checkpointed(tmp_path) -> None:
    """The server momentum lives in the simulation (``sim.velocity``); a checkpoint keeps it."""
    a = _real_sim(FedAvg(server_momentum=0.9))
    n = a.n
    a.server_step(torch.ones(n))
    from types import SimpleNamespace

    save_checkpoint(tmp_path, Built(a, {}, {}, cfg=SimpleNamespace(record={})), LoopState(round=1), None)
    b = _real_sim(FedAvg(server_momentum=0.9))
    load_into(tmp_path / "checkpoint.pt", Built(b, {}, {}, cfg=SimpleNamespace(record={})), LoopState())
    before = a.params.clone()
    assert torch.equal(b.params, before)
    a.server_step(torch.ones(n))
    b.server_step(torch.ones(n))
    # the step after the restore is 0.9·v + 1 = 1.9 on both (a fresh velocity would step 1)
    assert torch.equal(a.params, b.params) and torch.allclose(a.params - before, torch.full((n,), 1.9))


@pytest.mark.parametrize("bad", [-0.1, 1.0, True, "0.9"])
def test_bad_server_momentum_is_refused(bad) -> None:
    with pytest.raises(ValueError, match="server_momentum"):
        FedAvg(server_momentum=bad)


def _cfg(name: str, mode: str) -> dict:
    return {"server_opts": mode, "server_momentum": 0.9, "scheme": {"name": name}}


@pytest.mark.parametrize("cls", [FedAvg, RandomCoordinatesScheme, FreqScheme])
def test_server_opts_maps_to_server_momentum(cls) -> None:
    on, off, paper = _cfg("x", "on"), _cfg("x", "off"), _cfg("x", "paper")
    resolve_server_opts(on, cls)
    resolve_server_opts(off, cls)
    resolve_server_opts(paper, cls)
    assert on["scheme"]["server_momentum"] == 0.9 and off["scheme"]["server_momentum"] == 0.0
    assert "server_momentum" not in paper["scheme"]
    again = dict(on, scheme=dict(on["scheme"]))
    resolve_server_opts(again, cls)
    assert again == on  # idempotent
    cls(**{k: v for k, v in on["scheme"].items() if k != "name"})  # the scheme takes what was set


def test_server_opts_maps_fl_cs_to_its_momentum_and_error_feedback() -> None:
    on, mom, off = _cfg("fl_cs", "on"), _cfg("fl_cs", "momentum"), _cfg("fl_cs", "off")
    for c in (on, mom, off):
        resolve_server_opts(c, CompressiveSensingScheme)
    assert on["scheme"] == {"name": "fl_cs", "momentum": 0.9, "error_feedback": True}
    assert mom["scheme"] == {"name": "fl_cs", "momentum": 0.9, "error_feedback": False}
    assert off["scheme"] == {"name": "fl_cs", "momentum": 0.0, "error_feedback": False}


@pytest.mark.parametrize("cls", [FedAvg, RandomCoordinatesScheme, FreqScheme])
def test_server_opts_momentum_is_on_for_schemes_without_error_feedback(cls) -> None:
    on, mom = _cfg("x", "on"), _cfg("x", "momentum")
    resolve_server_opts(on, cls)
    resolve_server_opts(mom, cls)
    assert mom["scheme"] == on["scheme"] == {"name": "x", "server_momentum": 0.9}


def test_error_feedback_would_be_zero_for_fl_rnd_and_fl_freq() -> None:
    """FL-CS's error term e = p − C(D(p)) (Alg. 3, line 12) is what its BPDN decoder D does not deliver. FL-RND's and
    FL-FREQ's decoders are exact in the compressed domain (C(D(p)) = p), so error feedback there is zero: their
    server_opts=on and momentum runs are one. Checked within float32 round-off of the orthonormal DCT (‖p‖·ε·log n)."""
    from fedrun.compress.cs import DCTCompressor
    from fedrun.compress.masks import RandomCoordinates

    n, g = 5003, torch.Generator().manual_seed(0)
    for r in (0.05, 0.2):
        freq = DCTCompressor(n, r, chunks=1, shuffle=False, pad_to_fast_len=False)
        p = torch.randn(freq.m, generator=g)
        err = (p - freq.compress(freq.zero_fill(p))).norm()
        assert err <= p.norm() * torch.finfo(torch.float32).eps * 4 * np.log2(n), (r, float(err))
        rnd = RandomCoordinates(n, r, seed=3)
        q = torch.randn(rnd.m, generator=g)
        assert torch.equal(rnd.compress(rnd.decompress(q, 7), 7), q)
    # FL-CS's decoder is not exact: the same check on a BPDN reconstruction leaves an error (what e feeds back)
    cs = DCTCompressor(n, 0.05, chunks=4)
    p = torch.randn(cs.m, generator=g)
    s = cs.reconstruct_with_info(p, 0.05, "fista", 20, 1e-4).s
    assert (p - cs.compress(s)).norm() > 0.1 * p.norm()


def test_server_opts_on_is_refused_for_a_scheme_without_the_option() -> None:
    with pytest.raises(ConfigError, match="server_opts=on is not available with scheme=fedsketch"):
        resolve_server_opts(_cfg("fedsketch", "on"), FedSketch)
    off = _cfg("fedsketch", "off")
    resolve_server_opts(off, FedSketch)  # nothing to turn off


def _typed_edge(**values) -> None:
    """The config edge's type and range checks (fedrun.config.validate_types) on the default config with ``values``."""
    from omegaconf import OmegaConf

    from conftest import compose
    from fedrun.config import validate_types

    validate_types({**OmegaConf.to_container(compose([]), resolve=True), **values})


def test_an_unknown_server_opts_mode_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^server_opts='sometimes' is not allowed; use paper\|on\|momentum\|off$"):
        _typed_edge(server_opts="sometimes")


# -- server_lr: η_g per server_opts mode and scheme (the tuned values of a comparison) --------------------------
TUNED = {"on": {"fl_std": 0.1, "fl_cs": 0.3}, "off": {"fl_std": 2.0}}


@pytest.mark.parametrize("mode, name, cls, expected", [
    ("on", "fl_std", FedAvg, 0.1), ("off", "fl_std", FedAvg, 2.0), ("paper", "fl_std", FedAvg, None),
    ("on", "fl_cs", CompressiveSensingScheme, 0.3), ("off", "fl_cs", CompressiveSensingScheme, None),
    ("on", "fl_rnd", RandomCoordinatesScheme, None)])
def test_server_lr_table_sets_the_scheme_lr_per_mode(mode, name, cls, expected) -> None:
    c = dict(_cfg(name, mode), server_lr=TUNED)
    resolve_server_opts(c, cls)
    assert c["scheme"].get("server_lr") == expected  # None: the scheme keeps its own (no key set)
    built = cls(**{k: v for k, v in c["scheme"].items() if k != "name"})
    assert built.server_lr == (1.0 if expected is None else expected)


def test_server_lr_number_applies_to_every_scheme_and_mode() -> None:
    for mode in ("paper", "on", "off"):
        c = dict(_cfg("fl_freq", mode), server_lr=0.3)
        resolve_server_opts(c, FreqScheme)
        assert c["scheme"]["server_lr"] == 0.3


@pytest.mark.parametrize("bad, message", [
    (0, "server_lr=0 is not allowed; use a number > 0 or a table"), (True, "server_lr=true is not allowed"),
    ({"sometimes": {"fl_std": 1}}, r"server_lr has key 'sometimes'; allowed: paper\|on\|momentum\|off$"),
    ({"on": 0.1}, r"server_lr.on=0.1 is not allowed; use a table \{a string: a number > 0\}$"),
    ({"on": {"fl_std": -1.0}}, r"server_lr.on.fl_std=-1.0 is not allowed; use a number > 0$")])
def test_bad_server_lr_is_refused_in_one_line(bad, message) -> None:
    with pytest.raises(ConfigError, match=message):
        _typed_edge(server_lr=bad)


def test_server_lr_is_hashed_as_the_value_the_scheme_runs_with() -> None:
    """A run at η_g = 1 has one hash whether η_g came from the scheme's default or from a table naming 1; a table
    that changes η_g changes the hash (so skip_finished re-runs it)."""
    from fedrun.checkpoint import config_hash

    def resolved(table):
        c = dict(_cfg("fl_std", "on"), server_lr=table, seed=0)
        resolve_server_opts(c, FedAvg)
        if "server_lr" not in c["scheme"]:
            c["scheme"]["server_lr"] = 1.0  # what the scheme's config file holds
        return config_hash(c)

    assert resolved(None) == resolved({"on": {"fl_std": 1.0}}) == resolved({"off": {"fl_std": 0.1}})
    assert resolved({"on": {"fl_std": 0.1}}) != resolved(None)
