"""Top-k with error feedback: each client sends the k largest-magnitude coordinates of its update plus what it
did not send before (its residual, kept in its own client-state slot); the server averages the sparse uploads."""

from __future__ import annotations

import math

import torch

from fedrun.comm import Message
from fedrun.schemes.base import ClientView, Env, Scheme

RESIDUAL = "topk_ef_residual"   # the client-state name: one row of n floats per client that has taken part


class TopKEF(Scheme):
    """Each client sends its k largest-magnitude coordinates of (update + residual); the rest becomes its residual."""

    compresses = True           # refused on a model too small to compress
    linear = False              # which coordinates are sent depends on the update
    dp_modes = ("off", "client")

    def __init__(self, fraction: float = 0.01, server_lr: float = 1.0, server_momentum: float = 0.0) -> None:
        super().__init__(server_lr=server_lr, server_momentum=server_momentum)
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ValueError(f"scheme.fraction={fraction!r} is outside (0, 1]")   # a one-line config error
        self.fraction = float(fraction)

    def setup(self, env: Env) -> None:
        super().setup(env)                                          # payload: the dense n-vector
        self.n, self.k = env.n, math.ceil(self.fraction * env.n)
        self.message = Message.of_shape(2 * self.k, kind="topk_ef")   # k float32 values + k int32 indices
        self.compression_ratio = 2 * self.k / env.n
        self.tags = {"compression.k": str(self.k)}

    def encode(self, rnd: int, updates: torch.Tensor, state: ClientView) -> torch.Tensor:
        """updates [c, n] → payload [c, n]: top-k of update + residual in place, zeros elsewhere."""
        corrected = updates + state.get(RESIDUAL, self.n)          # these clients' rows (zeros the first time)
        idx = corrected.abs().topk(self.k, dim=1).indices
        payload = torch.zeros_like(corrected).scatter_(1, idx, corrected.gather(1, idx))
        state.set(RESIDUAL, corrected - payload)                    # kept for the client's next round
        return payload

    def decode(self, rnd: int, aggregate: torch.Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
        return aggregate                                            # the average of the zero-filled payloads
