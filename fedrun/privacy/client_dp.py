"""Client-level DP (paper 000; DP-FedAvg): its settings (:class:`ClientDP`) from the config and the sampler's
participation law (:func:`make_client_dp`), σ calibrated or checked, and the one-line ε report.

The accountant reads the law only (:mod:`fedrun.privacy.cohort`), never the sampler's class: Poisson (add/remove-one,
RDP or PLD), fixed-size k of N (replace-one, RDP), capped Poisson (add/remove-one, PLD of the truncated Poisson
sample), or a participation schema (k, b) with correlated noise (:mod:`fedrun.privacy.factorization`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedrun.config import ConfigError, RunConfig
from fedrun.privacy.cohort import CappedPoisson, FixedSize, Law, Poisson, Schema
from fedrun.privacy.mechanisms import (Event, FixedSizeGaussianEvent, GaussianEvent, PoissonGaussianEvent,
                                       TruncatedPoissonGaussianEvent)

log = logging.getLogger("fedrun")


@dataclass(frozen=True)
class ClientDP:
    """Client-level DP settings (paper 000; DP-FedAvg): clip S, noise multiplier σ (noise std σS), sampling rate q,
    the fixed denominator of the DP sum (``expected_clients``), and the accountant (``rdp`` | ``pld``) whose ε the
    run reports as ``epsilon``.

    ``sampling`` says how the cohort is drawn, and so which event each round records (:meth:`event`):
    ``poisson`` (q, denominator qN), ``fixed_size`` (``cohort_size`` k of ``num_clients`` N without replacement,
    q = k/N, denominator k; replace-one neighbours, sensitivity 2S) or ``capped_poisson`` (Poisson with q, at most
    ``cohort_size``; denominator E[min(Binomial(N, q), cap)]).

    ``add_remove_sensitivity`` (units of S): how far adding or removing one client can move the clipped sum. 1,
    or 2 where a round closes at a report goal (over-selection): an added fast client is kept and pushes out the
    report next in line, so the sum moves by g(x) − g(y). The event then charges σ / 2 (:attr:`charged_noise_multiplier`).
    Under replace-one (``fixed_size``) the report goal changes the kept set by at most one swap, within the 2S the
    event already charges."""

    clipping_norm: float
    noise_multiplier: float
    sampling_probability: float
    expected_clients: float
    delta: float
    accountant: str = "rdp"
    sampling: str = "poisson"
    num_clients: int | None = None
    cohort_size: int | None = None
    add_remove_sensitivity: float = 1.0
    noise: str = "independent"
    schema: tuple[int, int] | None = None
    sensitivities: tuple[float, ...] | None = None
    noise_weights: np.ndarray | None = field(default=None, compare=False, repr=False)
    #: the sampler's participation law these settings were made for (the privatizer's ledger holds rounds to it)
    law: Law | None = None
    abort_noise_multiplier: float | None = None  # SecAgg's abort bit, charged each round (fedrun.privacy.abort)

    @property
    def charged_noise_multiplier(self) -> float:
        """The noise multiplier the accountant is charged: σ over the sensitivity in units of S (fixed-size cohorts:
        σ, their event charges 2S itself; a participation schema: the whole run's sensitivity s_T)."""
        if self.sampling == "schema":
            return self.noise_multiplier / self.sensitivities[-1]
        return self.noise_multiplier / (1.0 if self.sampling == "fixed_size" else self.add_remove_sensitivity)

    def round_noise(self, rnd: int) -> list[tuple[int, float]]:
        """Round ``rnd``'s noise as (Z row, weight) pairs: Σ weight · Z_row with Z's rows i.i.d. N(0, σ²S²) (row r
        drawn from the generator of round r + 1, so independent noise is the same draw under every sampler). Under a
        participation schema, row ``rnd`` of M = A⁻¹B (:func:`fedrun.privacy.factorization.round_noise_matrix`)."""
        if self.noise_weights is None:
            return [(rnd - 1, 1.0)]
        if rnd > self.noise_weights.shape[0]:
            raise ValueError(f"round {rnd} is past the {self.noise_weights.shape[0]} rounds the noise was planned for")
        row = self.noise_weights[rnd - 1]
        return [(int(r), float(row[r])) for r in np.flatnonzero(row)]

    def event(self, rnd: int = 1) -> Event | None:
        """The accountant event of round ``rnd``'s noised client-level sum under this sampling (None: under a
        schema, a round that cannot raise the release's sensitivity)."""
        if self.sampling == "schema":
            s = self.sensitivities
            grown = s[rnd - 1] ** 2 - (s[rnd - 2] ** 2 if rnd > 1 else 0.0)
            return GaussianEvent(self.noise_multiplier / math.sqrt(grown)) if grown > 0 else None
        sigma = self.charged_noise_multiplier
        if self.sampling == "fixed_size":
            return FixedSizeGaussianEvent(sigma, self.num_clients, self.cohort_size)
        if self.sampling == "capped_poisson":
            return TruncatedPoissonGaussianEvent(sigma, self.sampling_probability, self.num_clients, self.cohort_size)
        if self.sampling != "poisson":
            raise ValueError(f"sampling={self.sampling!r} is not one of poisson, fixed_size, capped_poisson, schema")
        return PoissonGaussianEvent(sigma, self.sampling_probability)



def make_client_dp(cfg: RunConfig, sampler, over_selection: float = 1.0, report_goal: int | None = None) -> ClientDP:
    """Client-level DP for the sampler's cohorts: Poisson (add/remove-one, RDP or PLD), fixed-size k of N without
    replacement (``sampler=uniform``: replace-one, RDP; the sum divided by k) or Poisson capped at a cohort size
    (``sampler=poisson_capped``: add/remove-one, PLD). σ calibrated to ``epsilon`` or given; logs the ε report.
    ``sampler`` is the one that draws the cohorts (over-selected, if it is): its q is what the accountant uses, while
    the sum's denominator stays the target cohort (÷ ``over_selection``; :mod:`fedrun.deployment`). With a
    ``report_goal`` (the round closes once that many have reported) an added client can push out a kept one, so
    add/remove-one moves the sum by up to 2S: σ is calibrated and accounted for that sensitivity
    (``ClientDP.add_remove_sensitivity``)."""
    from fedrun.privacy.accounting import calibrate_noise_multiplier, check_sampling_accountant, compute_epsilon

    law, n = sampler.participation(cfg.rounds), sampler.num_clients
    if law is None:
        raise ConfigError(f"dp=true needs a sampler that declares a participation law (the cohorts an accountant "
                          f"knows); sampler={sampler.name} declares none")
    if isinstance(law, Schema):
        return charged(schema_client_dp(cfg, sampler, law, 2.0 if report_goal is not None else 1.0), cfg)
    sampling = law.kind
    if isinstance(law, Poisson):
        q, cohort, denominator = law.q, {}, law.q * n
    elif isinstance(law, FixedSize):
        q, denominator = law.k / n, float(law.k)
        cohort = {"sampling": sampling, "num_clients": n, "cohort_size": law.k}
    else:  # capped Poisson: the sum ÷ E[min(Binomial(N, q), cap)] is unbiased
        q, denominator = law.q, law.expected_clients
        cohort = {"sampling": sampling, "num_clients": n, "cohort_size": law.cap}
    denominator /= float(over_selection)
    # a report goal lets an added client displace a kept one: 2S under add/remove (replace-one already charges 2S)
    sens = 2.0 if report_goal is not None and sampling != "fixed_size" else 1.0
    delta, acct, rounds = float(cfg.delta), cfg.accountant, cfg.rounds
    try:
        check_sampling_accountant(sampling, acct)
        sigma = resolve_sigma(cfg, sens, lambda s: compute_epsilon(s, q, rounds, delta, acct, **cohort),
                              lambda e: calibrate_noise_multiplier(e, q, rounds, delta, acct, **cohort), f"q={q}")
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    dp = ClientDP(clipping_norm=float(cfg.clipping_norm), noise_multiplier=float(sigma),
                  sampling_probability=float(q), expected_clients=denominator, delta=delta,
                  accountant=str(acct), sampling=sampling, num_clients=n,
                  cohort_size=cohort.get("cohort_size"), add_remove_sensitivity=sens, law=law)
    dp = charged(dp, cfg)
    if float(sigma) > 0 and log.isEnabledFor(logging.INFO):  # the report costs an accountant call or two
        log.info(epsilon_report(dp, rounds))
    return dp


def charged(dp: ClientDP, cfg: RunConfig) -> ClientDP:
    """``dp`` with SecAgg's abort bit charged (:func:`fedrun.privacy.abort.charge_abort`); ConfigError if refused."""
    from fedrun.privacy.abort import charge_abort

    try:
        return charge_abort(dp, cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def resolve_sigma(cfg: RunConfig, sens: float, epsilon_at, calibrate, how: str) -> float:
    """σ for ``sens`` (the sensitivity in units of S): ``noise_multiplier`` as given (checked against ``epsilon`` when
    both are), else sens × the σ ``calibrate`` finds for ``epsilon`` at unit sensitivity; ``epsilon_at(σ / sens)`` is
    the ε the accountant would report, ``how`` the cohorts in the error line."""
    eps, sigma = cfg.epsilon, cfg.noise_multiplier
    if eps is not None and math.isinf(float(eps)):
        raise ConfigError("dp=true with epsilon=inf adds no noise; use dp=false for the non-private run")
    if sigma is None:
        return sens * calibrate(float(eps))
    if eps is not None:
        reached = epsilon_at(float(sigma) / sens)
        if reached > float(eps) * (1 + 1e-9):
            raise ConfigError(f"noise_multiplier={sigma} and epsilon={eps} disagree: σ={sigma} gives ε={reached:.4g} "
                              f"after {cfg.rounds} rounds ({how}, δ={float(cfg.delta)}); give only one")
    return float(sigma)


def schema_client_dp(cfg: RunConfig, sampler, law: Schema, unit: float = 1.0) -> ClientDP:
    """Client-level DP under the participation schema (k, b) the sampler enforces (``sampler=cyclic``), with the noise
    of ``noise=`` (:func:`fedrun.privacy.factorization.strategy`): the run's release C·G + Z is one Gaussian mechanism
    with sensitivity s_T·S, s_T the largest ‖C·u‖ over the schema's participation patterns (× ``unit``, 2 where an
    added client could push out a kept one); σ is calibrated for ε after the run's rounds, and round t is charged the
    growth of the prefix sensitivity s_t (:meth:`ClientDP.event`). No amplification by sampling is assumed."""
    from fedrun.privacy.accounting import calibrate_noise_multiplier, compute_epsilon
    from fedrun.privacy.factorization import prefix_sensitivities, round_noise_matrix, strategy

    noise, rounds, delta, acct = dict(cfg.noise), cfg.rounds, float(cfg.delta), cfg.accountant
    k, b = law.k, law.b
    try:
        B, C, banded = strategy(noise["name"], rounds, k, b, bands=noise.get("bands"), buffers=noise.get("buffers"))
        sens = unit * prefix_sensitivities(C, k, b, banded=banded)
        sigma = resolve_sigma(cfg, float(sens[-1]), lambda s: compute_epsilon(s, 1.0, 1, delta, acct),
                              lambda e: calibrate_noise_multiplier(e, 1.0, 1, delta, acct),
                              f"noise={noise['name']}, k={k}, b={b}")
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    dp = ClientDP(clipping_norm=float(cfg.clipping_norm), noise_multiplier=float(sigma), sampling_probability=1.0,
                  expected_clients=sampler.expected_clients, delta=delta, accountant=str(acct), sampling="schema",
                  num_clients=sampler.num_clients, add_remove_sensitivity=unit, noise=noise["name"], schema=(k, b),
                  sensitivities=tuple(float(x) for x in sens), noise_weights=round_noise_matrix(B), law=law)
    if float(sigma) > 0 and log.isEnabledFor(logging.INFO):
        log.info(epsilon_report(dp, rounds))
    return dp


def epsilon_report(dp: ClientDP, rounds: int, compare: bool = False) -> str:
    """One line: the ε the run will have spent after ``rounds`` rounds under its cohort sampling, and — for a
    fixed-size or capped cohort — what Poisson sampling at the same σ and q would give (the price of the sampling).
    Both from the accountants the run uses (``compute_epsilon``); one PLD composition at most per number."""
    from fedrun.privacy.accounting import NEIGHBOURING_RELATIONS, compute_epsilon

    sigma, q, n, delta, acct = dp.charged_noise_multiplier, dp.sampling_probability, dp.num_clients, dp.delta, \
        dp.accountant
    if dp.sampling == "schema":
        (k, b), s = dp.schema, dp.sensitivities[-1]
        eps = compute_epsilon(sigma, 1.0, 1, delta, acct)
        return (f"dp: noise={dp.noise}, participation schema k = {k} (each client at most {k} of {rounds} rounds), "
                f"b = {b} (at least {b} rounds apart), no amplification by sampling, {acct.upper()} (Gaussian "
                f"mechanism on the run's release, zero-out neighbours, sensitivity {s:.4g} S): ε = {eps:.4g} after "
                f"{rounds} rounds (σ = {dp.noise_multiplier:.4g}, δ = {delta:g})")
    cohort = {} if dp.sampling == "poisson" else {"sampling": dp.sampling, "num_clients": n,
                                                  "cohort_size": dp.cohort_size}
    eps = compute_epsilon(sigma, q, rounds, delta, acct, **cohort)
    how = {"poisson": f"Poisson q = {q:.4g} per round",
           "fixed_size": f"fixed-size {dp.cohort_size} of {n} per round",
           "capped_poisson": f"Poisson q = {q:.4g} capped at {dp.cohort_size} of {n} per round"}[dp.sampling]
    goal = dp.add_remove_sensitivity != 1 and dp.sampling != "fixed_size"
    relation = NEIGHBOURING_RELATIONS[dp.sampling] + (
        ", sensitivity 2S" if dp.sampling == "fixed_size" or goal else "") + (
        ": a report goal lets an added client push out a kept one" if goal else "")
    line = (f"dp: {how}, {acct.upper()} ({relation}): ε = {eps:.4g} after {rounds} rounds "
            f"(σ = {dp.noise_multiplier:.4g}, δ = {delta:g})")
    if dp.sampling == "poisson":
        if not compare:
            return line
        k = max(1, round(q * n))  # the same expected cohort, drawn as k of N without replacement
        fixed = compute_epsilon(dp.noise_multiplier, k / n, rounds, delta, "rdp", sampling="fixed_size", num_clients=n,
                                cohort_size=k)
        return (f"{line}; a fixed-size cohort of {k} of {n} (sampler=uniform) would give ε = {fixed:.4g} "
                f"(RDP, replace-one, sensitivity 2S)")
    poisson = " / ".join(f"{compute_epsilon(sigma, q, rounds, delta, a):.4g} ({a.upper()})"
                         for a in (("rdp", "pld") if dp.sampling == "fixed_size" else ("pld",)))
    return f"{line}; Poisson at q = {q:.4g} would give ε = {poisson} (add/remove-one)"


