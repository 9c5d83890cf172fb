"""Top-k sparsification: README's "Adding a scheme" example, kept honest by tests/integration/test_scheme_contract.py.

Each selected client keeps the k largest-magnitude coordinates of its update and sends them as k float32 values
and their k int32 indices (8·k bytes). The payload it hands the aggregator is the dense n-vector with zeros
elsewhere, so client-level DP clips exactly the values that were sent (the zeros add nothing to the L2 norm) and
the server's decode is the identity. No error feedback, no momentum: the smallest scheme that compresses.

Local DP is not declared: its noise is calibrated to the whole n-dimensional update and added to every coordinate
of the payload, which would turn the k sent values into n noised ones (the message would no longer be what is
counted), and noising only the k sent values would leave their positions (data-dependent indices) un-noised.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedrun.comm import Message
from fedrun.config import ConfigError
from fedrun.schemes.base import Scheme

if TYPE_CHECKING:  # pragma: no cover
    from fedrun.simulation import Simulation


class TopK(Scheme):
    """Each client sends its k largest-magnitude update coordinates (values + indices); the server averages."""

    compresses = True
    dp_modes = ("off", "client")

    def __init__(self, k: int | None = None, fraction: float = 0.01, server_lr: float = 1.0,
                 server_momentum: float = 0.0) -> None:
        super().__init__(server_lr=server_lr, server_momentum=server_momentum)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"scheme.k={k!r}; allowed: an integer >= 1, or null (k = ceil(fraction·n))")
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ValueError(f"scheme.fraction={fraction!r} is outside (0, 1]")
        self.k_given, self.fraction, self.k = k, float(fraction), 0

    def setup(self, sim: "Simulation") -> None:
        self.k = self.k_given if self.k_given is not None else math.ceil(self.fraction * sim.n)
        if self.k > sim.n:
            raise ConfigError(f"scheme.k={self.k} > {sim.n} model parameters; allowed: 1 <= k <= {sim.n}")

    def compression_ratio(self, sim: "Simulation") -> float:
        return 2 * self.k / sim.n  # k float32 values + k int32 indices, in 32-bit words per n

    def tags(self, sim: "Simulation") -> dict[str, str]:
        return {"compression.k": str(self.k)}

    def encode(self, sim: "Simulation", rnd: int, clients: np.ndarray,
               deltas: torch.Tensor) -> tuple[torch.Tensor, Message]:
        """deltas [c, n] of the chunk's c clients → payload [c, n] (zeros off the top k) and one client's message."""
        idx = deltas.abs().topk(self.k, dim=1).indices                  # [c, k]
        values = deltas.gather(1, idx)                                   # [c, k]: what each client sends
        payload = torch.zeros_like(deltas).scatter_(1, idx, values)     # [c, n]: what DP clips, the server sums
        return payload, Message.of(values[0], idx[0].to(torch.int32), kind="topk")  # 4·k + 4·k bytes
