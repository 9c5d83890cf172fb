"""The one DP stage every upload passes through: the payload boundary, the client-level DP sum, the participation
ledger and the accountant.

What crosses from a client's codec is copied by :meth:`Privatizer.accept` into a buffer the privatizer owns: a plain
dense float32 tensor of one row per client, detached and finite, or a one-line :class:`SchemeContractError` naming
the scheme. Everything the privatizer does runs under ``torch.no_grad()``, so no autograd graph leads from what it
releases back to a client's row. Each round's cohort (canaries included) is held to the sampler's declared
participation law (:class:`fedrun.privacy.cohort.ParticipationLedger`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from fedrun.aggregation import FieldSum, WeightedSum
from fedrun.privacy.abort import record_abort
from fedrun.privacy.client_dp import ClientDP
from fedrun.privacy.cohort import CappedPoisson, FixedSize, ParticipationLedger, Poisson, Schema
from fedrun.privacy.mechanisms import clip_rows, gaussian_noise
from fedrun.rng import torch_generator


class SchemeContractError(ValueError):
    """A codec handed the round something the privatizer does not accept (reported in one line)."""


@dataclass(frozen=True)
class AuditSettings:
    """An empirical privacy audit (client-level DP only): ``canaries`` canary clients, the lower bound's
    ``confidence``."""

    canaries: int
    confidence: float = 0.95


class Privatizer:
    """The one DP stage every upload passes through; it owns the accountant.

    * client-level (``client_dp``): :meth:`open` makes the DP sum (each row clipped to S in the scheme's payload
      domain; the audit's canary clients join it), :meth:`close` adds N(0, σ²S²), divides by the fixed
      denominator (qN; k for a fixed-size cohort) and records one accountant event of the cohort's sampling;
    * local (``local_dp``): :meth:`upload` noises each client's update before encode (one release each, counted by its
      accountant), summed with the scheme's weights;
    * off: the weighted sum.

    Every payload enters through :meth:`add` (the boundary: :meth:`accept`); under client-level DP every realised
    cohort through :meth:`cohort` (the ledger).
    """

    def __init__(self, client_dp: ClientDP | None, local_dp, audit: AuditSettings | None, seed: int,
                 device: torch.device, scheme: str = "?", sampler: str = "?", num_clients: int | None = None) -> None:
        if client_dp is not None and local_dp is not None:
            raise ValueError("client-level and local DP are exclusive: give client_dp or local_dp, not both")
        if audit is not None and client_dp is None:
            raise ValueError("an audit needs client-level DP (its canaries are clients of the DP sum)")
        self.client_dp, self.local_dp, self.audit = client_dp, local_dp, audit
        self.seed, self.device = seed, device
        self.mode = "client" if client_dp is not None else "local" if local_dp is not None else "off"
        self.accountant = None
        if client_dp is not None:
            from fedrun.privacy.accounting import PrivacyAccountant  # dp_accounting costs ~2 s of import

            self.accountant = PrivacyAccountant(client_dp.delta)
        self.canaries = None  # made at the first DP aggregation, when the payload's length is known
        self.diagnostics: dict[str, float] = {}
        self.scheme = scheme
        self.ledger = None if client_dp is None else ParticipationLedger(
            _law(client_dp, num_clients), num_clients or client_dp.num_clients, sampler,
            audit.canaries if audit is not None else 0)

    def cohort(self, rnd: int, clients: np.ndarray) -> None:
        """The sampler's cohort of round ``rnd``, held to its declared law (client-level DP)."""
        if self.ledger is not None:
            self.ledger.record(rnd, clients)

    def accept(self, payload, rows: int, dim: int) -> torch.Tensor:
        """``payload`` copied into a buffer the privatizer owns: a plain dense float32 [rows, dim] tensor on the run's
        device, detached and finite; anything else is a one-line :class:`SchemeContractError` naming the scheme."""
        shape = (rows, dim)
        if (type(payload) is not torch.Tensor or payload.layout != torch.strided or payload.dtype != torch.float32
                or tuple(payload.shape) != shape or payload.device != self.device):
            got = (f"{type(payload).__name__} {tuple(payload.shape)} {payload.dtype} {payload.layout} on "
                   f"{payload.device}" if isinstance(payload, torch.Tensor) else type(payload).__name__)
            raise SchemeContractError(f"scheme={self.scheme}: encode must return a plain dense float32 tensor of "
                                      f"shape {shape} (one row per client) on {self.device}; got {got}")
        with torch.no_grad():
            owned = torch.empty(shape, dtype=torch.float32, device=self.device).copy_(payload)
        if not bool(torch.isfinite(owned).all()):
            row, col = (int(i) for i in (~torch.isfinite(owned)).nonzero()[0])
            raise SchemeContractError(f"scheme={self.scheme}: encode returned a non-finite value "
                                      f"({float(owned[row, col])}) in row {row}, coordinate {col}, from a finite "
                                      f"update; a payload must be finite")
        return owned

    @torch.no_grad()
    def add(self, agg, parts: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
        """A chunk's payloads, given as (codec output, number of clients) parts, each through :meth:`accept`, into the
        round's sum; returns the privatizer's copy (one row per client)."""
        dim = agg.total.shape[0]
        owned = [self.accept(payload, rows, dim) for payload, rows in parts]
        owned = owned[0] if len(owned) == 1 else torch.cat(owned) if owned else torch.zeros(0, dim, device=self.device)
        agg.add(owned)
        return owned

    def generator(self, rnd: int, *purpose: object) -> torch.Generator:
        return torch_generator(self.seed, rnd, *purpose, device=self.device)

    @property
    def noise_multiplier(self) -> float:
        return self.client_dp.noise_multiplier

    def noise_std(self) -> float | None:
        """Std of the client-level noise in each coordinate of the aggregate, σS over the fixed denominator (qN, k,
        …; correlated noise: its root mean square over the rounds); None without it."""
        dp = self.client_dp
        if dp is None:
            return None
        gain = 1.0 if dp.noise_weights is None else math.sqrt(float((dp.noise_weights ** 2).sum(1).mean()))
        return gain * dp.noise_multiplier * dp.clipping_norm / dp.expected_clients

    @torch.no_grad()
    def open(self, rnd: int, clients: np.ndarray, weights: np.ndarray, dim: int, field=None):
        """The round's sum (``field``: summed in secure aggregation's Z_{2^bits}, :mod:`fedrun.secagg`)."""
        if self.client_dp is None:
            if self.local_dp is not None:
                self.local_dp.start_round(clients, weights)
            return WeightedSum(weights, dim, self.device, field)
        dp = self.client_dp
        agg = ClientLevelDPSum(dim, dp.clipping_norm, self.noise_multiplier, dp.expected_clients,
                               [(w, self.generator(r + 1, "client_dp_noise")) for r, w in dp.round_noise(rnd)],
                               self.device, field=field)
        if self.audit is not None:  # the audit's canary clients upload through the same DP sum, under the same law
            canaries = self.make_canaries(dim)
            agg.add(canaries.rows(self.generator(rnd, "audit_participation"), rnd))
            self.ledger.record(rnd, None, canaries.taken)
        return agg

    def upload(self, rnd: int, clients: np.ndarray, payload: torch.Tensor) -> torch.Tensor:
        """Local DP (paper 001): each client noises its update [k, n] (before the codec sees it); identity
        otherwise."""
        if self.local_dp is None:
            return payload
        out = self.local_dp.privatize(rnd, clients, payload, lambda l: self.generator(rnd, "local_dp", l))
        self.diagnostics = self.local_dp.diagnostics
        return out

    @torch.no_grad()
    def close(self, rnd: int, agg) -> torch.Tensor:
        out = agg.finish()
        if self.client_dp is not None:
            record_abort(self.accountant, self.client_dp, rnd)
            if (event := self.client_dp.event(rnd)) is not None:
                self.accountant.record(event)
            self.diagnostics = agg.diagnostics()
            if self.canaries is not None:
                self.canaries.observe(out)
        return out

    def skip(self, rnd: int) -> None:
        """A round that released nothing (SecAgg aborted it). Under a participation schema its event is recorded all
        the same: the rounds' events charge the growth of the prefix sensitivity, which adds up to the run's s_T only
        if every round is charged (a later release can still carry this round's clients' later participations)."""
        record_abort(self.accountant, self.client_dp, rnd)
        if self.client_dp is not None and self.client_dp.sampling == "schema":
            if (event := self.client_dp.event(rnd)) is not None:
                self.accountant.record(event)

    # -- the ε report -----------------------------------------------------------------------------------------
    def epsilon(self, accountant: str | None = None) -> float | None:
        """ε spent so far, None without DP. Client-level: from ``accountant`` (default: the configured one); local: the
        worst client's (its own accountant)."""
        if self.accountant is not None:
            return self.accountant.epsilon(accountant or self.client_dp.accountant)
        return self.local_dp.epsilon() if self.local_dp is not None else None

    def pld_accounts(self) -> bool:
        """Whether the PLD accountant has an event for the cohorts' sampling (not for a fixed-size cohort: there its
        "PLD" ε would be its RDP stand-in, so no ``epsilon_pld`` is reported)."""
        from fedrun.privacy.accounting import SAMPLING_ACCOUNTANTS

        return "pld" in SAMPLING_ACCOUNTANTS[self.client_dp.sampling]

    def epsilons(self, last: bool = False) -> dict[str, float]:
        """``epsilon`` from the configured accountant; with client-level DP also ``epsilon_rdp`` (a running RDP curve:
        ~0.1 ms a round) and ``epsilon_pld`` (a PLD composition, 1–3 s on 2 cores: every round when PLD is the
        configured accountant, else at the ``last`` round only)."""
        eps = self.epsilon()
        if eps is None:
            return {}
        out = {"epsilon": eps}
        if self.client_dp is not None:
            configured = self.client_dp.accountant
            out["epsilon_rdp"] = eps if configured == "rdp" else self.epsilon("rdp")
            if configured == "pld":
                out["epsilon_pld"] = eps
            elif last and self.pld_accounts():
                out["epsilon_pld"] = self.epsilon("pld")
        return out

    def tags(self) -> dict[str, object]:
        """The run's DP tags: the mechanism and the accountant's inputs; local DP's sensitivity; the audit's size."""
        tags: dict[str, object] = {}
        if (dp := self.client_dp) is not None:
            tags.update({"dp.mechanism": f"{dp.sampling}_subsampled_gaussian" if dp.schema is None else
                         f"{dp.noise}_matrix_factorization_gaussian", "dp.noise_multiplier": f"{dp.noise_multiplier:.6g}",
                         "dp.sampling_probability": dp.sampling_probability, "dp.clipping_norm": dp.clipping_norm,
                         "dp.delta": dp.delta, "dp.accountant": dp.accountant})
            if dp.schema is not None:
                tags.update({"dp.schema": f"k={dp.schema[0]} b={dp.schema[1]}",
                             "dp.sensitivity": f"{dp.sensitivities[-1]:.6g}"})
        if self.local_dp is not None:
            tags.update(self.local_dp.tags())  # which sensitivity, and whether its ε is conditional
        if self.audit is not None:
            tags["audit.canaries"] = self.audit.canaries
        return tags

    def summary(self) -> dict[str, float]:
        """The run summary's privacy numbers: the accountants' ε and inputs, local DP's, the audit's bound."""
        out: dict[str, float] = {}
        if self.accountant is not None:
            acct, dp = self.accountant.summary(), self.client_dp
            out.update({"epsilon_rdp": acct["epsilon_rdp"],
                        **({"epsilon_pld": acct["epsilon_pld"]} if self.pld_accounts() else {}),
                        "dp_delta": dp.delta, "dp_noise_multiplier": dp.noise_multiplier,
                        "dp_sampling_probability": dp.sampling_probability, "dp_clipping_norm": dp.clipping_norm,
                        "dp_rounds": acct["rounds"]})
        if self.local_dp is not None:
            out.update(self.local_dp.summary())
        if self.canaries is not None:
            out.update(self.canaries.result(self.client_dp.delta, self.audit.confidence))
        return out

    def make_canaries(self, dim: int):
        """The audit's canaries for a ``dim``-long payload (drawn once, from the run's seed)."""
        if self.canaries is None:
            from fedrun.privacy.canaries import Canaries
            from fedrun.rng import numpy_rng

            dp = self.client_dp
            self.canaries = Canaries(self.audit.canaries, dim, dp.clipping_norm, dp.sampling_probability,
                                     self.generator(0, "audit_canaries"), numpy_rng(self.seed, "audit_included"),
                                     schema=dp.law if isinstance(dp.law, Schema) else None)
        if dim != self.canaries.dim:
            raise ValueError(f"the audit's canaries have length {self.canaries.dim}; this aggregation {dim}")
        return self.canaries



def _law(dp: ClientDP, num_clients: int | None):
    """The participation law ``dp`` was made for (settings built by hand, without one: read off their sampling)."""
    if dp.law is not None:
        return dp.law
    n = dp.num_clients or num_clients
    return {"poisson": lambda: Poisson(dp.sampling_probability, n), "fixed_size": lambda: FixedSize(dp.cohort_size, n),
            "capped_poisson": lambda: CappedPoisson(dp.sampling_probability, dp.cohort_size, n),
            "schema": lambda: Schema(*dp.schema)}[dp.sampling]()


class ClientLevelDPSum(FieldSum):
    """Client-level DP (DP-FedAvg: McMahan, Ramage, Talwar, Zhang, ICLR 2018, Alg. 1 with the fixed-denominator
    estimator f̃_f), fedrun's only implementation of the client-level DP sum, in whatever domain the scheme transmits:
    clip each row to ``clipping_norm``, sum, add N(0, σ²S²), divide by ``expected_clients``. In a ``field`` each row
    is clipped to S − √dim·0.5/scale instead, so that after rounding to the field's grid its norm is still ≤ S."""

    def __init__(self, dim: int, clipping_norm: float, noise_multiplier: float, expected_clients: float,
                 generator: torch.Generator | Sequence[tuple[float, torch.Generator]], device: torch.device | str,
                 dtype: torch.dtype = torch.float32, field=None) -> None:
        if not clipping_norm > 0:
            raise ValueError(f"clipping_norm={clipping_norm} must be > 0")
        if noise_multiplier < 0:
            raise ValueError(f"noise_multiplier={noise_multiplier} must be >= 0")
        if not expected_clients > 0:
            raise ValueError(f"expected_clients={expected_clients} must be > 0")
        self.clipping_norm = float(clipping_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.expected_clients = float(expected_clients)
        # the noise: Σ wᵢ·Zᵢ over (weight, generator) pairs, Zᵢ i.i.d. N(0, σ²S²) (one generator: weight 1)
        self.noise_rows = [(1.0, generator)] if isinstance(generator, torch.Generator) else list(generator)
        super().__init__(dim, device, field, dtype)
        # in a field each coordinate is rounded to the grid (≤ 0.5/scale): clip so the rounded row's norm is ≤ S too
        self.row_clip = self.clipping_norm - (0.5 * math.sqrt(dim) / field.scale if field is not None else 0.0)
        if not self.row_clip > 0:
            raise ValueError(f"secagg's field rounds each of {dim} coordinates by up to {0.5 / field.scale:.3g}, "
                             f"more than clipping_norm={clipping_norm} in norm: give secagg.bits more bits")
        self.dtype = dtype
        self.clipped = 0
        self.seen = 0
        self.norm_sum = 0.0

    def add(self, rows: torch.Tensor) -> None:
        clipped, norms = clip_rows(rows, self.row_clip)
        self.add_rows(clipped)
        self.seen += rows.shape[0]
        self.clipped += int((norms > self.row_clip).sum())
        self.norm_sum += float(norms.sum())

    def finish(self) -> torch.Tensor:
        std = self.noise_multiplier * self.clipping_norm
        out = self.sum()
        for weight, generator in self.noise_rows:
            out = out + weight * gaussian_noise(self.total.shape, std, generator, device=self.total.device,
                                                dtype=self.dtype)
        return out / self.expected_clients

    def diagnostics(self) -> dict[str, float]:
        return {
            "dp_clipped_fraction": self.clipped / self.seen if self.seen else 0.0,
            "dp_mean_norm": self.norm_sum / self.seen if self.seen else 0.0,
            "dp_clients": float(self.seen),
            "dp_noise_std": self.noise_multiplier * self.clipping_norm / self.expected_clients
            * math.sqrt(sum(w * w for w, _ in self.noise_rows)),
        }
