"""What a deployment pays beyond bytes: the simulated clock and secure aggregation, as stages of the one round.

:class:`Deployment` is built from ``network=`` (:mod:`fedrun.network`: per-client bandwidth, latency, compute speed
and availability, a deadline, over-selection) and ``secagg=`` (:mod:`fedrun.secagg`: SecAgg / SecAgg+ bytes,
round trips, dropout threshold, the field Z_{2^bits}). :meth:`Simulation.run_round` asks it, after sampling,
which selected clients' uploads reach the server (:meth:`admit`), quantises the uploads into the field
(:meth:`quantizer`), and closes the round's clock (:meth:`close`). With ``network=none secagg=none`` there is no
Deployment and the round is unchanged.

The clock of round t, from the ledger's real message sizes (client i selected):

    download_i = latency_i + 8·(model bytes [+ frozen extractor, the first time] + SecAgg downlink)/down_bps_i
    compute_i  = F·samples_i / flops_per_s_i        (F: the model's measured training FLOPs per sample)
    upload_i   = latency_i + 8·(upload bytes + SecAgg uplink)/up_bps_i  (+ 2·latency_i per SecAgg round trip)
    round      = max over the clients that complete (available, and within ``deadline_s`` if set)
                 (the deadline itself when a client misses it) + server decode (measured) + second exchange

DP and dropouts: a client that drops after being sampled only lowers its inclusion probability, so the accountant's
q stays an upper bound, and the DP sum's denominator is a public constant, so its sensitivity S/denominator holds.
Over-selection (sampling f·q to absorb dropouts) raises every client's inclusion probability: the sampler draws at
f·q and the accountant uses f·q; the denominator stays the target cohort (q·N), which the survivors match in
expectation when f × completion rate = 1 (fewer survivors shrink the step, more enlarge it; ε is unaffected).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fedrun.network import Devices, Profile, round_timing
from fedrun.secagg import FieldQuantizer, round_fails, secagg_cost


@dataclass(frozen=True)
class SecAggSettings:
    """``secagg=secagg|secagg_plus``: the protocol, the field's bits per coordinate, the quantisation range, the
    dropout rate an instance tolerates and the colluding fraction it is secure against (conf/secagg/)."""

    protocol: str
    bits: int
    clip: float
    dropout: float = 0.33
    corrupt: float = 0.05


def train_flops_per_sample(model: torch.nn.Module, sample: torch.Tensor, target: torch.Tensor, loss: str) -> float:
    """FLOPs of one forward and backward pass on one sample, counted by torch (``FlopCounterMode``)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:  # counted on the model itself; its gradients cleared after
        fn = torch.nn.functional.cross_entropy if loss == "cross_entropy" else torch.nn.functional.mse_loss
        fn(model(sample), target).backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


class Deployment:
    """The network profile's devices, the SecAgg protocol, and the clock (cumulative ``elapsed`` seconds)."""

    def __init__(self, profile: Profile | None, secagg: SecAggSettings | None, *, num_clients: int, seed: int,
                 flops_per_sample: float, samples: np.ndarray, report_goal: int | None = None) -> None:
        self.profile, self.secagg, self.seed = profile, secagg, int(seed)
        #: with over-selection, the round closes once this many clients (the target cohort) have reported, and
        #: later reports are discarded (Bonawitz et al., SysML 2019, Sec. 2.2: the "reporting" phase's goal count)
        self.report_goal = report_goal
        self.devices = Devices(profile, num_clients, seed) if profile is not None else None
        self.flops_per_sample = float(flops_per_sample)
        self.samples = np.asarray(samples, dtype=np.float64)  # per client: samples processed in one round
        self.elapsed = 0.0
        self.failed = False
        self.metrics: dict[str, float] = {}
        self._timing = None

    def upload_bytes(self, message_bytes: int, dim: int) -> int:
        """One client's upload: the masked vector at ``bits`` per coordinate under SecAgg, else the message."""
        return math.ceil(dim * self.secagg.bits / 8) if self.secagg else int(message_bytes)

    def admit(self, rnd: int, clients: np.ndarray, down_bytes: np.ndarray, up_bytes: int, dim: int
              ) -> tuple[np.ndarray, bool]:
        """The selected ``clients`` whose upload reaches the server, and whether the round fails (SecAgg: fewer
        survivors than its threshold). Sets this round's clock and SecAgg bytes (:attr:`metrics`)."""
        self.metrics = {"clock_discarded": 0.0} if self.report_goal is not None and self.devices is not None else {}
        cost = None
        if self.secagg is not None and len(clients):
            sec = self.secagg
            cost = secagg_cost(sec.protocol, len(clients), dim, sec.bits, sec.dropout, sec.corrupt)
        active = clients
        if self.devices is not None:
            extra_up = cost.client_uplink_bytes if cost else 0.0
            extra_down = cost.client_downlink_bytes if cost else 0.0
            timing = self._timing = round_timing(
                self.devices, self.profile, clients, rnd, self.seed, down_bytes=np.asarray(down_bytes, float),
                up_bytes=float(up_bytes), flops=self.flops_per_sample * self.samples[clients],
                exchanges=2 + 2 * (cost.round_trips if cost else 0), extra_up_bytes=extra_up,
                extra_down_bytes=extra_down)
            done = timing.completed.copy()
            self.duration = timing.duration_s
            if self.report_goal is not None and done.sum() > self.report_goal:  # the first goal reports close it
                first = np.argsort(np.where(done, timing.total_s, np.inf), kind="stable")[:self.report_goal]
                self.metrics["clock_discarded"] = float(done.sum() - self.report_goal)
                done[:] = False
                done[first] = True
                self.duration = float(timing.total_s[first].max())
            self.done = done
            active = clients[done]
        failed = cost is not None and round_fails(cost, len(active))
        if self.secagg is not None:  # every selected client advertised keys and shared them before any dropped
            self.metrics.update({"secagg_uplink_bytes": float(cost.client_uplink_bytes * len(clients) if cost else 0),
                                 "secagg_downlink_bytes": float(cost.client_downlink_bytes * len(clients) if cost else 0),
                                 "secagg_survivors": float(len(active)),
                                 "secagg_min_survivors": float(cost.min_survivors if cost else 0)})
        self.failed = failed
        return active, failed

    def quantizer(self, rows: int) -> FieldQuantizer | None:
        """The field of this round's SecAgg instance, its scale set for ``rows`` summands (None without SecAgg)."""
        return FieldQuantizer(self.secagg.bits, self.secagg.clip, max(1, rows)) if self.secagg else None

    def close(self, server_seconds: float, second_exchange: tuple[np.ndarray, float, float] | None = None
              ) -> dict[str, float]:
        """The round's end: the clock advanced by the slowest completing client (or the deadline), the server's
        measured decode time and a second exchange (clients, up bytes, down bytes each); the round's metrics."""
        m = dict(self.metrics)
        if self.devices is not None:
            t, done = self._timing, self.done
            for part in ("download", "compute", "upload"):  # the slowest completing client's, each
                m[f"clock_{part}_s"] = float(getattr(t, f"{part}_s")[done].max()) if done.any() else 0.0
            m["clock_dropped"] = float((~t.completed).sum())
            extra = 0.0
            if second_exchange is not None and len(second_exchange[0]):
                ids, up, down = second_exchange
                d = self.devices
                extra = float(np.max(2 * d.latency_s[ids] + 8 * down / d.down_bps[ids] + 8 * up / d.up_bps[ids]))
            m["clock_server_s"] = float(server_seconds)
            m["clock_round_s"] = self.duration + float(server_seconds) + extra
            self.elapsed += m["clock_round_s"]
            m["sim_time_s"] = self.elapsed
        if self.secagg is not None:
            m["secagg_failed"] = float(self.failed)
        return m

    def state_dict(self) -> dict:
        return {"elapsed": self.elapsed}

    def load_state_dict(self, state: dict) -> None:
        self.elapsed = float(state["elapsed"])
