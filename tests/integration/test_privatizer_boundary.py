"""The privatizer's boundary against an adversarial codec: each test is an attack through the public scheme API
(a codec that wants an un-noised update applied) and fails when the rule that stops it is removed.

Rules (fedrun/simulation.py, fedrun/schemes/base.py): client and server sides get separate ``Env``s that hold
nothing new; the codec's seed is derived one way from the run's seed; ``feedback`` gets copies; ``encode`` returns a
plain dense float32 tensor with one row per client, and under client-level DP sees one client at a time; local DP
noises the update before the codec encodes it and is opt-in (``dp_modes``).
"""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fedrun.config import ConfigError
from fedrun.rng import torch_generator
from fedrun.run import build
from fedrun.schemes.base import Scheme
from fedrun.schemes.fedavg import FedAvg
from fedrun.simulation import SchemeContractError

DP = ["dataset=mnist", "model=lenet5", "dp=true", "noise_multiplier=1.0", "delta=1e-5", "num_clients=40",
      "sample_rate=0.25", "clipping_norm=0.05"]
NOISE_STD = 1.0 * 0.05 / (0.25 * 40)  # σS/(qN) per coordinate of the applied update


def _sim(fast_cfg, target: str, *extra: str):
    c = OmegaConf.to_container(fast_cfg(*DP, *extra), resolve=True)
    c["scheme"] = {"_target_": f"{__name__}.{target}"}
    return build(c).sim


def _applied(sim, rnd: int, clients) -> torch.Tensor:
    w0 = sim.params.clone()
    sim.run_round(rnd, clients)
    return (sim.params - w0).double()


def _clipped_mean(sim, clients, rnd: int = 1) -> torch.Tensor:
    """The round's clipped sum ÷ qN without noise: what an attack wants applied."""
    from fedrun.privacy.mechanisms import clip_rows

    raw = torch.cat([m for _, m, _ in sim.train(clients, rnd)]) - sim.params
    return (clip_rows(raw, 0.05)[0].sum(0) / (0.25 * 40)).double()


def _is_pure_noise_around(applied: torch.Tensor, signal: torch.Tensor) -> bool:
    """``applied`` − ``signal`` has the DP noise's std (within 5/√(2n) relative): the noise was not removed."""
    r = applied - signal
    return abs(r.std().item() / NOISE_STD - 1) < 5 / math.sqrt(2 * r.numel())


# ------------------------------------------------------------------------------------- 1. a shared Env
class EnvLeak(FedAvg):
    """Stores itself on the Env it is given; the server side looks for the client side there and applies the raw
    updates its client side kept."""

    def setup(self, env):
        super().setup(env)
        self.env = env
        try:
            env.__dict__.setdefault("sides", []).append(self)
        except AttributeError:  # no __dict__ (slots)
            pass

    def encode(self, rnd, updates, state):
        self.raw = updates.clone()
        return torch.zeros_like(updates)

    def decode(self, rnd, aggregate, exact=None):
        sides = getattr(self.env, "__dict__", {}).get("sides", [])
        raws = [s.raw for s in sides if s is not self and hasattr(s, "raw")]
        return torch.cat(raws).mean(0) if raws else aggregate


def test_a_codec_cannot_pass_the_raw_updates_through_the_env(fast_cfg):
    sim = _sim(fast_cfg, "EnvLeak")
    clients = sim.select(1)
    applied = _applied(sim, 1, clients)
    assert len(clients) and _is_pure_noise_around(applied, torch.zeros_like(applied))


# ------------------------------------------------------------------------------------- 2. feedback's tensors
class FeedbackWriter(FedAvg):
    """The server keeps its decoded update; the client side writes the raw mean into it in ``feedback``; the
    server applies what it kept one round later."""

    def encode(self, rnd, updates, state):
        return torch.zeros_like(updates)

    def decode(self, rnd, aggregate, exact=None):
        if rnd == 1:
            self.kept = aggregate.clone()
            return self.kept
        return self.kept

    def feedback(self, rnd, state, sent, values, received):
        received.update.fill_(1.0)  # 200 × the noise's std


def test_feedback_cannot_write_into_the_servers_tensors(fast_cfg):
    sim = _sim(fast_cfg, "FeedbackWriter")
    clients = sim.select(1)
    target = torch.full((sim.n,), 1.0)  # what the client side writes: 200 × the noise's std
    first = _applied(sim, 1, clients)
    second = _applied(sim, 2, sim.select(2))  # the server re-applies what it kept: round 1's noised aggregate
    assert torch.allclose(second, first, rtol=1e-4, atol=1e-6)
    assert (second - target.double()).abs().min().item() > 0.5


# ------------------------------------------------------------------------------------- 3. many rows per client
class ManyRows(FedAvg):
    """64 rows per client, each clipped to S on its own: 64 × the signal against the same noise."""

    def encode(self, rnd, updates, state):
        return updates.repeat_interleave(64, dim=0)

    def decode(self, rnd, aggregate, exact=None):
        return aggregate / 64


def test_a_payload_with_more_rows_than_clients_is_refused(fast_cfg):
    sim = _sim(fast_cfg, "ManyRows")
    with pytest.raises(SchemeContractError, match=r"scheme=ManyRows: encode must return a plain dense float32 tensor "
                                                  r"of shape \(1, 61706\) \(one row per client\)"):
        sim.run_round(1, sim.select(1))


# ------------------------------------------------------------------------------------- 4. the run's seed
class NoiseSubtractor(FedAvg):
    """Rebuilds the privatizer's noise from the seed it is given and subtracts it."""

    def setup(self, env):
        super().setup(env)
        self.env = env

    def decode(self, rnd, aggregate, exact=None):
        g = torch_generator(self.env.seed, rnd, "client_dp_noise", device=aggregate.device)
        return aggregate - torch.randn(aggregate.shape, generator=g) * self.env.dp_noise_std


def test_the_codecs_seed_does_not_give_the_privatizers_noise(fast_cfg):
    sim = _sim(fast_cfg, "NoiseSubtractor")
    clients = sim.select(1)
    signal = _clipped_mean(sim, clients)
    applied = _applied(sim, 1, clients)
    # with the run's seed the subtraction leaves the clipped mean (residual ~ float32 round-off); with the codec's
    # seed it subtracts independent noise: residual std √2 × NOISE_STD
    assert (applied - signal).std().item() > 0.5 * NOISE_STD


# ------------------------------------------------------------------------------------- 5. a tensor subclass
class ZeroNorm(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if func is torch.linalg.vector_norm:
            return torch.zeros_like(out)
        return out


class SubclassPayload(FedAvg):
    def encode(self, rnd, updates, state):
        return updates.as_subclass(ZeroNorm)


def test_a_tensor_subclass_payload_is_refused(fast_cfg):
    sim = _sim(fast_cfg, "SubclassPayload")
    with pytest.raises(SchemeContractError, match="scheme=SubclassPayload: encode must return a plain dense"):
        sim.run_round(1, sim.select(1))


# ------------------------------------------------------------------------------------- 6. mixing clients' rows
class RowMixer(FedAvg):
    """Each row carries the sum of the chunk's updates: one client's data in every row (K × S of sensitivity)."""

    shapes: list = []

    def encode(self, rnd, updates, state):
        RowMixer.shapes.append(tuple(updates.shape))
        return updates.sum(0, keepdim=True).expand_as(updates).contiguous()


def test_under_client_dp_each_client_is_encoded_alone(fast_cfg):
    RowMixer.shapes = []
    sim = _sim(fast_cfg, "RowMixer")
    clients = sim.select(1)
    sim.run_round(1, clients)
    assert len(clients) > 1 and RowMixer.shapes and all(s[0] == 1 for s in RowMixer.shapes)


# ------------------------------------------------------------------------------------- 7. local DP
LDP = ["~experiment", "dataset=lending_club", "sampler=round_robin", "clients_per_round=5", "num_clients=10",
       "local_mode=gd", "local_steps=2", "rounds=2", "lr=0.1", "local_clip=150", "local_clip_ord=1",
       "tracking=none", "progress=off", "dp=local_laplace", "epsilon=1"]


class Scaler(FedAvg):
    """Declares local DP, scales its payload by 10⁴ and divides it back: 10⁴ × less noise if the noise were added
    to the payload."""

    dp_modes = ("off", "local")

    def encode(self, rnd, updates, state):
        return updates * 1e4

    def decode(self, rnd, aggregate, exact=None):
        return aggregate / 1e4


def _ldp(shared_data, target: str):
    from conftest import compose

    c = OmegaConf.to_container(compose(LDP + [f"data_root={shared_data}"]), resolve=True)
    c["scheme"] = {"_target_": target}
    return c


def test_local_dp_noises_the_update_so_a_scaling_codec_gains_nothing(shared_data):
    applied = {}
    for target in ("fedrun.schemes.fedavg.FedAvg", f"{__name__}.Scaler"):
        sim = build(_ldp(shared_data, target)).sim
        applied[target] = _applied(sim, 1, sim.select(1))
    honest, scaled = applied.values()
    # the same noise on the same updates: equal up to float32 round-off of ×10⁴ and ÷10⁴ at the update's scale
    assert torch.allclose(scaled, honest, rtol=1e-5, atol=1e-6 * honest.abs().max().item())


class BaseOnly(Scheme):
    """A codec that forgets to declare ``dp_modes``."""


def test_local_dp_is_opt_in_a_codec_without_dp_modes_is_refused(shared_data):
    with pytest.raises(ConfigError, match=r"dp=local_laplace is not available with scheme=BaseOnly"):
        build(_ldp(shared_data, f"{__name__}.BaseOnly"))
