"""Top-k sparsification: README's "Adding a scheme" example, kept honest by tests/integration/test_scheme_contract.py.

Each selected client keeps the k largest-magnitude coordinates of its update and sends them as k float32 values
and their k int32 indices (8·k bytes). The payload it hands the aggregator is the dense n-vector with zeros
elsewhere, so client-level DP clips exactly the values that were sent and the server's decode is the identity.
Not linear (which coordinates are kept depends on the update), and no local DP (its noise would fill all n).
"""

from __future__ import annotations

import math

import torch

from fedrun.comm import Message
from fedrun.schemes.base import ClientView, Env, Scheme


class TopK(Scheme):
    """Each client sends its k largest-magnitude update coordinates (values + indices); the server averages."""

    compresses = True
    linear = False
    dp_modes = ("off", "client")

    def __init__(self, k: int | None = None, fraction: float = 0.01, server_lr: float = 1.0,
                 server_momentum: float = 0.0) -> None:
        super().__init__(server_lr=server_lr, server_momentum=server_momentum)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"scheme.k={k!r}; allowed: an integer >= 1, or null (k = ceil(fraction·n))")
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ValueError(f"scheme.fraction={fraction!r} is outside (0, 1]")
        self.k_given, self.fraction = k, float(fraction)

    def setup(self, env: Env) -> None:
        super().setup(env)  # payload: the dense n-vector
        self.k = self.k_given if self.k_given is not None else math.ceil(self.fraction * env.n)
        if self.k > env.n:
            raise ValueError(f"scheme.k={self.k} > {env.n} model parameters; allowed: 1 <= k <= {env.n}")
        self.message = Message.of_shape(2 * self.k, kind="topk")  # k float32 values + k int32 indices
        self.compression_ratio = 2 * self.k / env.n
        self.tags = {"compression.k": str(self.k)}

    def encode(self, rnd: int, updates: torch.Tensor, state: ClientView) -> torch.Tensor:
        """updates [c, n] → payload [c, n]: each row's top-k values in place, zeros elsewhere."""
        idx = updates.abs().topk(self.k, dim=1).indices
        return torch.zeros_like(updates).scatter_(1, idx, updates.gather(1, idx))
