"""What a deployment pays beyond bytes: the simulated clock and secure aggregation, as stages of the one round.

:class:`Deployment` is built from ``network=`` (:mod:`fedrun.network`: per-client bandwidth, latency, compute speed
and availability, a deadline, over-selection) and ``secagg=`` (:mod:`fedrun.secagg`: SecAgg / SecAgg+ bytes,
round trips, dropout threshold, the field Z_{2^bits}). :meth:`Simulation.run_round` asks it, after sampling,
which selected clients' uploads reach the server (:meth:`admit`), quantises the uploads into the field
(:meth:`quantizer`), and closes the round's clock (:meth:`close`). With ``network=none secagg=none`` there is no
Deployment and the round is unchanged.

The clock of round t, from the ledger's real message sizes (client i selected):

    download_i = (c + e)·L_i + 8·(model bytes [+ frozen extractor, the first time] + SecAgg downlink)/down_bps_i
    compute_i  = (F·samples_i + SecAgg client crypto) / flops_per_s_i   (F: the model's training FLOPs per sample,
                                                                         counted by torch)
    upload_i   = e·L_i + 8·(upload bytes + SecAgg uplink)/up_bps_i  (+ r·L_i per SecAgg round, 3 rounds)
    server     = (scheme.server_flops(n) + SecAgg Unmasking) / server_flops_per_s
    round      = max over the clients that complete (available, and within ``deadline_s`` if set)
                 (the deadline itself when a client misses it) + server + second exchange (2e·L_i + its bytes)

with the profile's conventions e = ``rtt_per_exchange``, c = ``connect_rtt``, r = ``secagg_rtt_per_round`` and the
crypto prices of :meth:`Deployment.secagg_flops`. Every term is a function of the config and the seed: the server's
work is the scheme's declared count (:meth:`fedrun.schemes.base.Scheme.server_flops`; FL-CS's solver at its iteration
budget), never a time measured on the host, so the same command gives the same clock on any machine. The measured
host time is logged apart (``clock_host_server_s``) and never enters ``clock_round_s`` or ``sim_time_s``.

DP and dropouts: a client that drops after being sampled, or misses the deadline, is left out whoever else took part,
so adding a client moves the DP sum by at most S, and the denominator is a public constant. Over-selection (sampling
f·q to absorb dropouts) raises every client's inclusion probability (the sampler draws at f·q, the accountant charges
f·q), and the report goal lets an added fast client push out the report next in line: the sum moves by up to 2S,
which :func:`fedrun.run.make_client_dp` charges (``ClientDP.add_remove_sensitivity``). The denominator stays the
target cohort (q·N). tests/integration/test_neighbour_harness.py measures both on neighbouring federations.
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
                 flops_per_sample: float, samples: np.ndarray, report_goal: int | None = None,
                 max_clients: int | None = None) -> None:
        self.profile, self.secagg, self.seed = profile, secagg, int(seed)
        #: the field's public bound on the summands of one round (the largest cohort the sampler can draw, or the
        #: report goal, plus the audit's canaries), fixed for the run: the quantisation scale never depends on how
        #: many clients a round happens to have (None: the number of clients)
        self.max_clients = int(num_clients if max_clients is None else max_clients)
        if secagg is not None:  # the bits must leave room for max_clients summands (ValueError otherwise)
            FieldQuantizer(secagg.bits, secagg.clip, self.max_clients)
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
        """The selected ``clients`` whose upload reaches the server and is kept, and whether the round fails (SecAgg:
        fewer survivors than its threshold, or fewer than 2 clients). Sets this round's clock, SecAgg bytes
        (:attr:`metrics`) and :attr:`discarded` (completed uploads past the report goal)."""
        self.metrics = {"clock_discarded": 0.0} if self.report_goal is not None and self.devices is not None else {}
        sec, cost = self.secagg, None
        if sec is not None and len(clients) >= 2:  # fewer than 2 clients: no protocol instance (its threshold is ≥ 2)
            try:
                cost = secagg_cost(sec.protocol, len(clients), dim, sec.bits, sec.dropout, sec.corrupt)
            except ValueError:  # (dropout, corrupt) leave no valid threshold for so small a cohort: none either
                cost = None
        active = clients
        #: completed uploads the report goal discarded: sent (the ledger charges them), not summed
        self.discarded = 0
        if self.devices is not None:
            timing = self._timing = round_timing(
                self.devices, self.profile, clients, rnd, self.seed, down_bytes=np.asarray(down_bytes, float),
                up_bytes=float(up_bytes), flops=self.flops_per_sample * self.samples[clients]
                + self.secagg_flops(cost, dim)[0], extra_rtt=self.profile.secagg_rtt_per_round
                * (cost.round_trips if cost else 0), extra_up_bytes=cost.client_uplink_bytes if cost else 0.0,
                extra_down_bytes=cost.client_downlink_bytes if cost else 0.0)
            done = timing.completed.copy()
            self.duration = timing.duration_s
            if self.report_goal is not None and done.sum() > self.report_goal:  # the first goal reports close it
                first = np.argsort(np.where(done, timing.total_s, np.inf), kind="stable")[:self.report_goal]
                self.discarded = int(done.sum() - self.report_goal)
                self.metrics["clock_discarded"] = float(self.discarded)
                done[:] = False
                done[first] = True
                self.duration = float(timing.total_s[first].max())
            self.done = done
            active = clients[done]
        # survivors: every client whose masked upload completed, the discarded ones included (they are alive and
        # answer the Unmasking round; only the kept ones are in the released sum)
        survivors = len(active) + self.discarded
        failed = sec is not None and (cost is None or survivors < 2 or round_fails(cost, survivors))
        if sec is not None and cost is None:  # no protocol instance: nothing is masked, nothing uploaded
            active, self.discarded = active[:0], 0
        if sec is not None:  # every selected client advertised keys and shared them before any dropped; the masked
            # vectors' survivors send Unmasking shares, unless the round already failed at the threshold
            unmasking = 0 if failed else survivors
            up = ((cost.client_uplink_bytes - cost.unmasking_bytes) * len(clients) + cost.unmasking_bytes * unmasking
                  if cost else 0)
            self.metrics.update({"secagg_uplink_bytes": float(up),
                                 "secagg_downlink_bytes": float(cost.client_downlink_bytes * len(clients) if cost else 0),
                                 "secagg_survivors": float(survivors),
                                 "secagg_min_survivors": float(cost.min_survivors if cost else 2)})
        self.failed = failed
        self._unmasking = (cost, dim, 0 if failed else survivors)  # the server's SecAgg work, charged by close()
        return active, failed

    def secagg_flops(self, cost, dim: int, survivors: int = 0) -> tuple[float, float]:
        """(each client's, the server's) SecAgg cryptography in FLOP-equivalents, with A = ``secagg_agreement_flops``,
        G = ``secagg_prg_flops``, d neighbours, n selected, s survivors, D = n − s dropped, m = ``dim`` coordinates:

            client = 2d·A + (d + 1)·m·G      (a mask-seed and an encryption-key agreement per neighbour; d pairwise
                                              masks and its own mask expanded; Bonawitz et al. 2017, Fig. 4)
            server = D·d·s/(n − 1)·(A + m·G) + s·m·G   (Unmasking: each dropped client's pairwise masks with its
                                              surviving neighbours, d·s/(n − 1) of them in expectation, exactly s
                                              on the complete graph, and each survivor's own mask)

        Shamir sharing, reconstruction and AES-GCM are not counted. (0, 0) without SecAgg, a clock or an instance."""
        if cost is None or self.profile is None:
            return 0.0, 0.0
        A, G, d, n, s = self.profile.secagg_agreement_flops, self.profile.secagg_prg_flops, cost.neighbours, \
            cost.clients, survivors
        client = 2 * d * A + (d + 1) * dim * G
        server = (n - s) * d * s / (n - 1) * (A + dim * G) + s * dim * G if s else 0.0
        return float(client), float(server)

    def quantizer(self, rows: int) -> FieldQuantizer | None:
        """The field of this round's SecAgg instance for ``rows`` summands (None without SecAgg). Its scale is set by
        the run's public bound :attr:`max_clients`, never by ``rows``: one more client changes no one's rounding."""
        if self.secagg is None:
            return None
        if rows > self.max_clients:
            raise ValueError(f"{rows} summands exceed the field's bound max_clients={self.max_clients}: the sum "
                             f"could wrap")
        return FieldQuantizer(self.secagg.bits, self.secagg.clip, self.max_clients)

    def close(self, server_flops: float, second_exchange: tuple[np.ndarray, float, float] | None = None,
              host_seconds: float | None = None) -> dict[str, float]:
        """The round's end: the clock advanced by the slowest completing client (or the deadline), the server's
        modelled time (``server_flops`` — the scheme's :meth:`~fedrun.schemes.base.Scheme.server_flops` — plus SecAgg's
        Unmasking, at the profile's ``server_flops_per_s``) and a second exchange (clients, up bytes, down bytes each);
        the round's metrics. ``host_seconds``, the server's time measured on this machine, is logged beside
        (``clock_host_server_s``) and never enters the clock."""
        m = dict(self.metrics)
        if host_seconds is not None:
            m["clock_host_server_s"] = float(host_seconds)
        if self.devices is not None:
            t, done = self._timing, self.done
            for part in ("download", "compute", "upload"):  # the slowest completing client's, each
                m[f"clock_{part}_s"] = float(getattr(t, f"{part}_s")[done].max()) if done.any() else 0.0
            m["clock_dropped"] = float((~t.completed).sum())
            extra = 0.0
            if second_exchange is not None and len(second_exchange[0]):
                ids, up, down = second_exchange
                d = self.devices
                extra = float(np.max(2 * self.profile.rtt_per_exchange * d.latency_s[ids] + 8 * down / d.down_bps[ids]
                                     + 8 * up / d.up_bps[ids]))
            unmasking = self.secagg_flops(*self._unmasking)[1] if getattr(self, "_unmasking", None) else 0.0
            m["clock_server_flops"] = float(server_flops) + unmasking
            m["clock_server_s"] = m["clock_server_flops"] / self.profile.server_flops_per_s
            m["clock_round_s"] = self.duration + m["clock_server_s"] + extra
            self.elapsed += m["clock_round_s"]
            m["sim_time_s"] = self.elapsed
        if self.secagg is not None:
            m["secagg_failed"] = float(self.failed)
        return m

    def state_dict(self) -> dict:
        return {"elapsed": self.elapsed}

    def load_state_dict(self, state: dict) -> None:
        self.elapsed = float(state["elapsed"])
