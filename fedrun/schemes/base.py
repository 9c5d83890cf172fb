"""The scheme interface: what the server broadcasts, what each client transmits, how the server decodes.

A scheme is one FL algorithm (FedAvg, FL-CS, FedSKETCH, …). The default :meth:`Scheme.round` is the
template every linear-aggregation scheme shares::

    broadcast (downlink bytes) → local training (vectorized, chunk by chunk)
      → encode each client's update (uplink bytes) → [local DP noise]
      → aggregate in the transmitted domain (weighted sum, or client-level DP: clip + sum + noise)
      → decode → apply to the global model

so a scheme usually overrides a few hooks (``encode``, ``decode``, ``payload_dim``, ``weights``, …).
Schemes whose protocol has more exchanges (HEAPRIX, SketchedSGD) or none of this loop (FbFTL) override
:meth:`round` itself and record their extra messages in ``sim.ledger``. Client-level and local DP are
not part of any scheme: the simulation plugs them into the aggregate and encode steps.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedrun.comm import Message

if TYPE_CHECKING:  # pragma: no cover
    from fedrun.simulation import Simulation


class Scheme:
    """FedAvg-shaped protocol with overridable hooks (see the module docstring)."""

    #: how to weight client vectors without DP: "size" = |D_k| / Σ_j |D_j| over the selected clients,
    #: "uniform" = 1 / K
    weighting: str = "size"

    #: the DP modes this scheme takes (checked before any data is loaded): "off", "client" (client-level
    #: clip + noise on the aggregate, paper 000), "local" (noise on each upload, paper 001). The default round
    #: sends every upload through the simulation's DP hooks, so FedAvg-shaped schemes take all three.
    dp_modes: tuple[str, ...] = ("off", "client", "local")
    #: True for schemes that compress the update (r, sketches): refused on a model too small to compress
    compresses: bool = False
    #: True for schemes that transfer from a model pre-trained on an image source dataset (paper 003)
    needs_image_source: bool = False

    def __init__(self, server_lr: float = 1.0, server_momentum: float = 0.0) -> None:
        if not server_lr > 0:
            raise ValueError(f"server_lr={server_lr} must be > 0")
        if isinstance(server_momentum, bool) or not isinstance(server_momentum, (int, float)) \
                or not 0.0 <= server_momentum < 1.0:
            raise ValueError(f"scheme.server_momentum={server_momentum!r}; allowed: 0 <= server_momentum < 1")
        self.server_lr = float(server_lr)
        #: ρ of server momentum on the decoded update (FedAvgM, Hsu et al. 2019): v_t = ρ·v_{t−1} + Δ_t,
        #: w_t = w_{t−1} + η_g·v_t; 0 = none. Applied by :meth:`apply`, so every FedAvg-shaped scheme has it.
        self.server_momentum = float(server_momentum)
        self.velocity: torch.Tensor | None = None

    # -- set-up and state -------------------------------------------------------------------------
    def prepare_model(self, model: torch.nn.Module, context: dict) -> set[str] | None:
        """Before the simulation is built: initialise ``model`` in place (e.g. from a pre-trained source
        model) and return the names of the parameters that train and travel (None = all of them).

        ``context`` has ``dataset`` (the loaded Dataset), ``config`` (the resolved config dict),
        ``device`` and ``seed``.
        """
        return None

    def setup(self, sim: "Simulation") -> None:
        """Called once the simulation is built (model size known): allocate server state here."""

    def compression_ratio(self, sim: "Simulation") -> float:
        """r of paper 000's cost formula r·n·32·Round·C (m / n for compressing schemes)."""
        return 1.0

    def tags(self, sim: "Simulation") -> dict[str, str]:
        """Extra run tags describing the scheme's set-up (e.g. which guarantee applies, or why none does)."""
        return {}

    def state_dict(self) -> dict:
        """Server-side state (momentum, error, …) for checkpoints; subclasses add theirs to this dict."""
        return {"server_velocity": self.velocity.cpu()} if self.velocity is not None else {}

    def load_state_dict(self, state: dict) -> None:
        v = state.get("server_velocity")
        self.velocity = v.clone() if v is not None else None

    # -- hooks of the default round ---------------------------------------------------------------
    def downlink_message(self, sim: "Simulation", rnd: int) -> Message:
        """What each selected client receives: the global model as float32."""
        return Message.of_shape(sim.n, kind="model")

    def payload_dim(self, sim: "Simulation") -> int:
        """Length of the vector each client transmits (the aggregation domain)."""
        return sim.n

    def weights(self, sim: "Simulation", clients: np.ndarray) -> np.ndarray:
        if len(clients) == 0:
            return np.zeros(0)
        if self.weighting == "uniform":
            return np.full(len(clients), 1.0 / len(clients))
        sizes = sim.data.sizes[clients].astype(np.float64)
        return sizes / sizes.sum()

    def correction(self, sim: "Simulation", clients: np.ndarray) -> torch.Tensor | None:
        """Per-client vector subtracted from each local gradient ([K, n]), or None."""
        return None

    def encode(self, sim: "Simulation", rnd: int, clients: np.ndarray,
               deltas: torch.Tensor) -> tuple[torch.Tensor, Message]:
        """Client side: updates [k, n] → transmitted vectors [k, payload_dim] and one client's message."""
        return deltas, Message.of_shape(deltas.shape[1])

    def decode(self, sim: "Simulation", rnd: int, aggregate: torch.Tensor) -> torch.Tensor:
        """Server side: aggregated vector → model update [n]."""
        return aggregate

    def apply(self, sim: "Simulation", rnd: int, update: torch.Tensor) -> None:
        if self.server_momentum > 0:
            if self.velocity is None:
                self.velocity = torch.zeros_like(update)
            elif self.velocity.device != update.device:
                self.velocity = self.velocity.to(update.device)
            update = self.velocity.mul_(self.server_momentum).add_(update)
        sim.params.add_(update, alpha=self.server_lr)

    def after_round(self, sim: "Simulation", rnd: int, clients: np.ndarray, update: torch.Tensor) -> None:
        """Hook for per-client state updates once the round's update is known."""

    # -- the round --------------------------------------------------------------------------------
    def round(self, sim: "Simulation", rnd: int, clients: np.ndarray) -> dict[str, float]:
        sim.ledger.downlink(self.downlink_message(sim, rnd), len(clients))
        agg = sim.new_aggregator(rnd, self.weights(sim, clients), self.payload_dim(sim))
        losses = []
        for chunk, local, loss in sim.train(clients, rnd, self.correction(sim, clients)):
            payload, message = self.encode(sim, rnd, chunk, local - sim.params)
            payload = sim.privatize_upload(rnd, chunk, payload)
            sim.ledger.uplink(message, len(chunk))
            agg.add(payload)
            losses.append(loss)
        update = self.decode(sim, rnd, sim.finish_aggregate(rnd, agg))
        self.apply(sim, rnd, update)
        self.after_round(sim, rnd, clients, update)
        return {"train_loss": float(torch.cat(losses).mean()) if losses else math.nan}
