"""SecAgg's abort bit: what a round that fails to unmask reveals about one client, and its charge.

A SecAgg round releases nothing when its cohort cannot be unmasked (:meth:`fedrun.deployment.Deployment.admit`: fewer
than 2 clients, no valid protocol instance for the cohort, or fewer than n − ⌊δn⌋ of its n clients surviving). The
model not moving shows it, whatever the noise: one bit per round, which depends on who was sampled.

Model (exact binomial sums, :func:`abort_cost`). The other clients survive independently with the network
profile's ``availability`` a; the differing client's survival is its own (the adversary's) choice, always or never
(P(abort) is linear in its survival probability, so these two are the worst case). Without a network profile no one
drops out, the differing client included. The cohort laws and relations are the accountant's:

* ``poisson`` (q, N), add/remove-one: D′ is D plus a client, sampled with q;
* ``capped_poisson`` (q, N, cap), add/remove-one: as Poisson, then a uniform ``cap`` of the drawn (the added client
  kept with probability cap/(m + 1) among m + 1 drawn);
* ``fixed_size`` (k of N), replace-one: the replaced client, in the cohort with probability k/N, survives on each
  side as its data chooses;
* ``schema`` (``sampler=cyclic``'s fixed groups), zero-out: the client keeps its slot, only its survival can differ,
  so the bit costs nothing without a network profile; with one, it is charged in the rounds a client can take part
  in for the first, second, … time (rounds 1, b + 1, 2b + 1, …: k of the T rounds).

ε_abort = max over the two outcomes and both directions of |log P_D(o) / P_D′(o)|: the bit is ε_abort-DP (pure).
Either way the bit and the noised sum are accounted as two releases composed; their shared cohort draw is not
analysed jointly.

Bounded into δ where that is negligible: the bit is (0, tv)-DP, tv = max |P_D(abort) − P_D′(abort)|, so T such bits
cost T·tv of δ (taken from the noise's δ when at most ``ABORT_SHARE`` of it: e.g. 4e-11 a round for N = 6000,
q = 0.013 on the mobile profile, where ε_abort = 0.029: a rare abort is a large ratio of small probabilities).

Else charged: an ε-DP release is dominated (Blackwell) by randomized response RR_ε, whose trade-off curve lies
above the Gaussian G_μ with μ = 2Φ⁻¹(e^ε / (1 + e^ε)): both are symmetric and convex, RR_ε's is linear on
[0, 1/(1 + e^ε)], and G_μ meets the diagonal at Φ(−μ/2) = 1/(1 + e^ε), RR_ε's kink (Dong, Roth & Su, JRSS-B 2022,
Sec. 2). So each charged round records a ``GaussianEvent(1/μ)``, which both accountants compose exactly (μ ≈ 1.25 ε for small ε).

Refused (one line): a setting where neither fits and the charge raises the run's ε by more than ``ABORT_SHARE``
(10 %), and a network deadline (late clients are not independent dropouts, so P(abort) is not the model's).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter

import numpy as np
from scipy.special import logsumexp
from scipy.stats import binom, norm

from fedrun.privacy.mechanisms import GaussianEvent
from fedrun.secagg import secagg_cost

ABORT_SHARE = 0.10  # the most the abort bit may add to the run's ε, relative to ε without it
_log = logging.getLogger(__name__)


def _thresholds(protocol: str, dropout: float, corrupt: float, largest: int) -> np.ndarray:
    """thr[n], n = 0..``largest``: the fewest survivors that unmask an n-client cohort (n + 1: no instance)."""
    thr = np.arange(1, largest + 2)
    for n in range(2, largest + 1):
        for proto in dict.fromkeys(("secagg", protocol)):  # the full graph's checks pass: SecAgg+ is valid too
            try:
                thr[n] = max(2, secagg_cost(proto, n, 1, 32, dropout, corrupt).min_survivors)
                break
            except ValueError:
                continue
    return thr


def _cohort(sampling: str, n: int, q: float | None, cohort: int | None, present: bool, survives: int):
    """The law of a round as components (log weight, others in the cohort j, differing client in it, it survives)."""
    if sampling == "schema":  # its group of ``cohort``: present on both sides (zero-out)
        return [(np.zeros(1), np.array([cohort - 1]), 1, survives)]
    if sampling == "fixed_size":  # replace-one: the client is in the cohort with probability k/N on both sides
        return [(np.log1p(-cohort / n) * np.ones(1), np.array([cohort]), 0, 0),
                (np.log(cohort / n) * np.ones(1), np.array([cohort - 1]), 1, survives)]
    m = np.arange(n + 1)
    drawn = binom.logpmf(m, n, q)
    cap = n + 1 if sampling == "poisson" else cohort
    parts = [(drawn + (np.log1p(-q) if present else 0.0), np.minimum(m, cap), 0, 0)]
    if present:  # the added client drawn too: kept with probability min(1, cap / (m + 1))
        keep = np.minimum(1.0, cap / (m + 1))
        with np.errstate(divide="ignore"):
            parts += [(drawn + np.log(q) + np.log(keep), np.minimum(m, cap - 1), 1, survives),
                      (drawn + np.log(q) + np.log1p(-keep), np.minimum(m, cap), 0, 0)]
    return parts


def _log_abort(parts, thr: np.ndarray, availability: float) -> tuple[float, float]:
    """(log P(abort), log P(no abort)) of a law: the survivors, Binomial(j, a) + the differing client's."""
    lo, ok = [], []
    for logw, j, n_in, s_in in parts:
        need = thr[j + n_in] - s_in - 1  # abort iff Binomial(j, a) ≤ need
        lo.append(logw + binom.logcdf(need, j, availability))
        ok.append(logw + binom.logsf(need, j, availability))
    return float(logsumexp(np.concatenate(lo))), float(logsumexp(np.concatenate(ok)))


def abort_cost(sampling: str, num_clients: int, *, protocol: str, dropout: float, corrupt: float,
               availability: float | None, sampling_probability: float | None = None, cohort_size: int | None = None,
               groups: int | None = None) -> tuple[float, float]:
    """(ε, tv) of one round's abort bit (module docstring): its pure ε, max |log P_D(o) / P_D′(o)| (∞ where one
    side's outcome is impossible on the other), and max |P_D(abort) − P_D′(abort)| (it is (0, tv)-DP).
    ``sampling``: poisson (``sampling_probability``), capped_poisson (and ``cohort_size``, the cap), fixed_size
    (``cohort_size`` k of ``num_clients``) or schema (``num_clients`` split into ``groups``); ``availability``
    None: no network profile (no one drops out)."""
    if sampling not in ("poisson", "capped_poisson", "fixed_size", "schema"):
        raise ValueError(f"sampling={sampling!r}: allowed poisson, capped_poisson, fixed_size, schema")
    a, choices = (1.0, (1,)) if availability is None else (float(availability), (0, 1))
    thr = _thresholds(protocol, dropout, corrupt, num_clients + 1)
    sides = []
    for cohort in {num_clients // groups, -(-num_clients // groups)} if sampling == "schema" else (cohort_size,):
        law = lambda present, s: _log_abort(_cohort(sampling, num_clients, sampling_probability, cohort,  # noqa
                                                    present, s), thr, a)
        base = [law(False, 0)] if sampling in ("poisson", "capped_poisson") else [law(True, s) for s in choices]
        sides += [(d, d2) for d in base for d2 in (law(True, s) for s in choices)]
    eps = tv = 0.0
    for d, d2 in sides:
        tv = max(tv, abs(math.exp(d[0]) - math.exp(d2[0])))
        for x, y in zip(d, d2):
            if x != y:  # equal (−∞ included): the outcome tells nothing
                eps = max(eps, abs(x - y))
    return eps, tv


def dominating_noise_multiplier(epsilon: float) -> float:
    """σ = 1/μ of the Gaussian that dominates an ``epsilon``-DP release: μ = 2Φ⁻¹(e^ε / (1 + e^ε)) (module
    docstring); 0 (no noise: ε = ∞ charged) for ε = ∞."""
    return 0.0 if math.isinf(epsilon) else 1.0 / (2.0 * norm.ppf(1.0 / (1.0 + math.exp(-epsilon))))


def abort_event(dp, rnd: int) -> GaussianEvent | None:
    """Round ``rnd``'s charge for the abort bit, None where nothing is charged (no SecAgg, ε_abort = 0, or a schema
    round in which no client can take part for a new time)."""
    sigma = getattr(dp, "abort_noise_multiplier", None)
    if sigma is None or (dp.schema is not None and (rnd - 1) % dp.schema[1]):
        return None
    return GaussianEvent(sigma)


def record_abort(accountant, dp, rnd: int) -> None:
    """Record round ``rnd``'s abort charge in ``accountant`` (called whether the round aborted or released)."""
    if dp is not None and (event := abort_event(dp, rnd)) is not None:
        accountant.record(event)


def _run_epsilon(dp, rounds: int, delta: float | None = None, abort: bool = True) -> float:
    """ε after ``rounds`` rounds (with the abort charges unless not ``abort``) at ``delta`` (default: the run's)."""
    from fedrun.privacy.accounting import _epsilon_of_counts

    counts = Counter(e for rnd in range(1, rounds + 1)
                     for e in (abort_event(dp, rnd) if abort else None, dp.event(rnd)) if e is not None)
    return _epsilon_of_counts(counts, dp.delta if delta is None else delta, dp.accountant)[0]


def charge_abort(dp, cfg):
    """``dp`` (a ClientDP) with SecAgg's abort bit accounted, σ recalibrated when it was calibrated to
    ``cfg.epsilon``; logs the figure. Where T·tv ≤ ``ABORT_SHARE``·δ (T the charged rounds) the bit is bounded into
    δ: the Gaussian's accountant runs at δ − T·tv. Else it is charged (``abort_noise_multiplier``), refused (one-line
    ValueError) where that raises ε by more than ``ABORT_SHARE``."""
    from fedrun.network import Profile

    sec = cfg.secagg
    if sec.name == "none":
        return dp
    profile = Profile.from_config(dict(cfg.network))
    if profile is not None and profile.deadline_s is not None:
        raise ValueError(f"secagg={sec.name} under dp=true with network.deadline_s={profile.deadline_s}: the abort "
                         f"bit is accounted for independent dropouts only; allowed: network.deadline_s=null")
    availability = profile.availability if profile is not None else None
    eps0, tv = abort_cost(dp.sampling, dp.num_clients, protocol=sec.name, dropout=float(sec.dropout),
                          corrupt=float(sec.corrupt), availability=availability,
                          sampling_probability=dp.sampling_probability, cohort_size=dp.cohort_size,
                          groups=dp.schema[1] if dp.schema is not None else None)
    if eps0 == 0:
        _log.info("secagg abort bit: independent of any one client (ε_abort = 0), nothing charged")
        return dp
    rounds, target, delta = int(cfg.rounds), cfg.epsilon, dp.delta
    charged = -(-rounds // dp.schema[1]) if dp.schema is not None else rounds
    if charged * tv <= ABORT_SHARE * delta:
        dp = dataclasses.replace(dp, delta=delta - charged * tv)
        how = (f"bounded into δ: P(abort) moves by at most {tv:.3g} per round, {charged * tv:.3g} over {charged} "
               f"rounds, taken from δ = {delta:g} (the noise's ε is at δ = {dp.delta:.6g})")
    else:
        dp = dataclasses.replace(dp, abort_noise_multiplier=dominating_noise_multiplier(eps0))
        how = f"charged as a Gaussian with σ = {dp.abort_noise_multiplier:.4g}"
    if target is not None and cfg.noise_multiplier is None and _run_epsilon(dp, rounds) > float(target):
        # σ was calibrated to ε without the abort bit: again, with it
        from fedrun.privacy.accounting import _smallest_feasible

        sigma = _smallest_feasible(lambda s: _run_epsilon(dataclasses.replace(dp, noise_multiplier=s), rounds),
                                   float(target), dp.noise_multiplier, f"{rounds} rounds with secagg's abort bit "
                                   f"(ε_abort = {eps0:.4g} per round)")
        dp = dataclasses.replace(dp, noise_multiplier=sigma)
    eps, without = _run_epsilon(dp, rounds), _run_epsilon(dp, rounds, delta, abort=False)
    if target is not None and eps > float(target) * (1 + 1e-9):
        raise ValueError(f"noise_multiplier={dp.noise_multiplier} and epsilon={target} disagree once secagg's abort "
                         f"bit is accounted (ε_abort = {eps0:.4g} per round): ε = {eps:.4g}; give only one")
    if not eps <= (1 + ABORT_SHARE) * without:
        raise ValueError(f"secagg={sec.name}: its abort bit (ε_abort = {eps0:.4g} per round; sampling="
                         f"{dp.sampling}, num_clients={dp.num_clients}, availability={availability}, dropout="
                         f"{sec.dropout}) raises ε after {rounds} rounds from {without:.4g} to {eps:.4g}; allowed: "
                         f"at most {ABORT_SHARE:.0%} more (larger cohorts, fewer rounds or more available clients)")
    _log.info(f"secagg abort bit: ε_abort = {eps0:.4g} per round, {how}: ε = {eps:.4g} after {rounds} rounds "
              f"({without:.4g} without it, σ = {dp.noise_multiplier:.4g})")
    return dp
