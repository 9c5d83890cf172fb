"""FL-RND (paper 000's random-coordinates baseline [inferred]): m = ceil(r·n) shared-seed random coordinates.

Round t: the server and every client derive the same m coordinates I_t from the run's shared seed and t
(:class:`fedrun.compress.masks.RandomCoordinates`); each selected client uploads its update on I_t,
``Δw_k[I_t]`` (4·m bytes of float32 values plus the 8-byte round seed); the server aggregates the m-vectors
(weighted mean, or client-level DP: clip to S in the m-dim domain + Gaussian noise) and updates only I_t::

    w_t[I_t] = w_{t−1}[I_t] + η_g · Σ_k (|D_k| / Σ_j |D_j|) Δw_k[I_t]      (other coordinates unchanged)

No momentum, no error feedback (the paper's baseline). With r = 1 it is FL-STD.
"""

from __future__ import annotations

import torch

from fedrun.comm import SEED_BYTES, Message
from fedrun.compress.masks import RandomCoordinates
from fedrun.schemes.base import ClientView, Env, Scheme


def check_ratio(r: object) -> float:
    """``r`` as a float in (0, 1], else ValueError naming it (r is the compression ratio m/n)."""
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 < float(r) <= 1.0:
        raise ValueError(f"r={r!r} is outside (0, 1]: r is the compression ratio m/n")
    return float(r)


class RandomCoordinatesScheme(Scheme):
    """FL-RND: clients send the round's m shared-seed random coordinates; the server updates those.

    Args:
        r: compression ratio m/n in (0, 1] (the top-level ``r`` knob).
        server_lr: η_g (1 in paper 000).
    """

    compresses = True
    #: no local DP: paper 001's noise is calibrated to the model update (length n), not to m coordinates
    dp_modes = ("off", "client")

    def __init__(self, r: float = 1.0, server_lr: float = 1.0, server_momentum: float = 0.0) -> None:
        super().__init__(server_lr=server_lr, server_momentum=server_momentum)
        self.r = check_ratio(r)

    def setup(self, env: Env) -> None:
        self.coords = RandomCoordinates(env.n, self.r, seed=env.shared_seed(0, "fl_rnd"), device=env.device)
        m = self.coords.m
        self.payload_dim, self.compression_ratio = m, m / env.n
        #: one client's upload: m float32 values and the round's shared seed (4·m + 8 bytes)
        self.message = Message.of_shape(m, extra_bytes=SEED_BYTES, kind="random_coordinates")
        self.tags = {"compression.m": str(m), "compression.r": f"{self.r:g}"}

    def encode(self, rnd: int, updates: torch.Tensor, state: ClientView) -> torch.Tensor:
        return self.coords.compress(updates, rnd)

    def decode(self, rnd: int, aggregate: torch.Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
        return self.coords.decompress(aggregate, rnd)
