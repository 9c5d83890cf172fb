"""Messages and the byte ledger.

Every message that crosses the network is described by a :class:`Message` built from what is actually
sent: each tensor contributes ``numel × element_size`` bytes, plus explicit extras (a seed, a client
count, …). The :class:`Ledger` records, per round, the uplink (client → server) and downlink
(server → client) bytes, and keeps cumulative totals.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

SEED_BYTES = 8  # a shared-seed message field is sent as one int64


@dataclass(frozen=True)
class Message:
    """Size of one message from its parts.

    ``tensors`` are the payload tensors as sent (their dtype sets the element size); ``extra_bytes``
    counts non-tensor fields (a seed, an integer count); ``kind`` names the message for the ledger.
    """

    nbytes: int
    kind: str = "update"

    @classmethod
    def of(cls, *tensors: torch.Tensor, extra_bytes: int = 0, kind: str = "update") -> "Message":
        total = extra_bytes + sum(t.numel() * t.element_size() for t in tensors)
        return cls(int(total), kind)

    @classmethod
    def of_shape(cls, numel: int, dtype: torch.dtype = torch.float32, extra_bytes: int = 0,
                 kind: str = "update") -> "Message":
        """Size of a tensor message without materialising it (e.g. one row of a batched payload)."""
        return cls(int(numel * dtype.itemsize + extra_bytes), kind)


@dataclass
class Ledger:
    """Per-round and cumulative byte counts, uplink and downlink, split by message kind."""

    uplink_total: int = 0
    downlink_total: int = 0
    uplink_round: int = 0
    downlink_round: int = 0
    by_kind: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    uplink_messages_round: int = 0  # client → server messages this round
    uplink_messages_total: int = 0
    #: each broadcast counted once however many clients receive it (paper 003's (10)); a message sent with
    #: ``once=True`` (the same content to every client that ever needs it) counts once over the run
    broadcast_total: int = 0
    broadcast_once: set[str] = field(default_factory=set)
    #: secure aggregation's own bytes (keys, shares, unmasking; :mod:`fedrun.secagg`), apart from the uploads above;
    #: None until a round records them (``secagg=none``: no such metrics)
    secagg_uplink_total: int | None = None
    secagg_downlink_total: int | None = None

    def start_round(self) -> None:
        self.uplink_round = 0
        self.downlink_round = 0
        self.uplink_messages_round = 0

    def uplink(self, message: Message, count: int = 1) -> None:
        """Record ``count`` clients each sending ``message`` to the server."""
        b = message.nbytes * int(count)
        self.uplink_round += b
        self.uplink_total += b
        self.by_kind["up:" + message.kind] += b
        self.uplink_messages_round += int(count)
        self.uplink_messages_total += int(count)

    def downlink(self, message: Message, count: int = 1, once: bool = False) -> None:
        """Record the server sending ``message`` to ``count`` clients (a broadcast counts once per client)."""
        if count > 0 and not (once and message.kind in self.broadcast_once):
            self.broadcast_total += message.nbytes
            if once:
                self.broadcast_once.add(message.kind)
        b = message.nbytes * int(count)
        self.downlink_round += b
        self.downlink_total += b
        self.by_kind["down:" + message.kind] += b

    def secagg(self, uplink: float, downlink: float) -> None:
        """Record one round's secure-aggregation bytes, all clients together (client → server, server → client)."""
        self.secagg_uplink_total = (self.secagg_uplink_total or 0) + int(uplink)
        self.secagg_downlink_total = (self.secagg_downlink_total or 0) + int(downlink)

    def metrics(self) -> dict[str, float]:
        out = {
            "uplink_bytes": float(self.uplink_round),
            "uplink_bytes_total": float(self.uplink_total),
            "downlink_bytes": float(self.downlink_round),
            "downlink_bytes_total": float(self.downlink_total),
        }
        if self.secagg_uplink_total is not None:
            out["secagg_uplink_bytes_total"] = float(self.secagg_uplink_total)
            out["secagg_downlink_bytes_total"] = float(self.secagg_downlink_total)
        return out

    def state_dict(self) -> dict:
        return {"uplink_total": self.uplink_total, "downlink_total": self.downlink_total,
                "by_kind": dict(self.by_kind), "uplink_messages_total": self.uplink_messages_total,
                "broadcast_total": self.broadcast_total, "broadcast_once": sorted(self.broadcast_once),
                "secagg": [self.secagg_uplink_total, self.secagg_downlink_total]}

    def load_state_dict(self, state: dict) -> None:
        self.uplink_total = int(state["uplink_total"])
        self.downlink_total = int(state["downlink_total"])
        self.by_kind = defaultdict(int, state.get("by_kind", {}))
        self.uplink_messages_total = int(state.get("uplink_messages_total", 0))
        self.broadcast_total = int(state.get("broadcast_total", 0))
        self.broadcast_once = set(state.get("broadcast_once", ()))
        self.secagg_uplink_total, self.secagg_downlink_total = state.get("secagg", (None, None))


def paper_cost_bits(r: float, n: int, rounds: int, sampling_fraction: float) -> float:
    """Paper 000's bandwidth cost: r · n · 32 · Round · C bits (Table III)."""
    return float(r) * int(n) * 32.0 * int(rounds) * float(sampling_fraction)
