"""SecAgg's abort bit (fedrun/privacy/abort.py): the closed form against the issue's figures and an enumeration of
every cohort and dropout pattern, the dominating Gaussian against randomized response, the rounds charged."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
from scipy.stats import norm

from fedrun.privacy.abort import abort_cost, abort_event, dominating_noise_multiplier
from fedrun.secagg import round_fails, secagg_cost

SECAGG = dict(protocol="secagg", dropout=0.33, corrupt=0.05)


@pytest.mark.parametrize("clients, q, shown", [(24, 0.25, 0.42), (200, 0.05, 0.11), (1000, 0.01, 0.023)])
def test_the_issue_figures(clients, q, shown):
    """Issue 50's ε of one round's abort bit: conf/secagg's dropout 0.33 and corrupt 0.05, conf/network/mobile's
    availability 0.92, the added client sampled and never surviving (the worst of its two choices)."""
    eps, _ = abort_cost("poisson", clients, **SECAGG, availability=0.92, sampling_probability=q)
    digits = -math.floor(math.log10(shown)) + 1  # the figure as printed: two significant digits
    assert abs(eps - shown) <= 0.5 * 10 ** -digits


@functools.lru_cache(maxsize=None)
def _fails(n: int, s: int, protocol: str, dropout: float, corrupt: float) -> bool:
    """Deployment.admit's rule: no instance for fewer than 2 clients or invalid parameters, else too few survivors."""
    if n < 2:
        return True
    try:
        cost = secagg_cost(protocol, n, 1, 32, dropout, corrupt)
    except ValueError:
        return True
    return s < 2 or round_fails(cost, s)


def _cohorts(sampling: str, ids: list[int], q: float, size: int | None):
    """Every cohort (a tuple of ids) with its probability, by enumeration of the draws."""
    n = len(ids)
    if sampling == "fixed_size":
        for c in itertools.combinations(ids, size):
            yield c, 1 / math.comb(n, size)
        return
    for drawn in itertools.product((0, 1), repeat=n):
        chosen = tuple(i for i, d in zip(ids, drawn) if d)
        p = q ** len(chosen) * (1 - q) ** (n - len(chosen))
        if sampling == "poisson" or len(chosen) <= size:
            yield chosen, p
        else:
            for c in itertools.combinations(chosen, size):
                yield c, p / math.comb(len(chosen), size)


def _p_abort(cohorts, a: float, special: int, survives: int, sec: dict) -> float:
    total = 0.0
    for cohort, p in cohorts:
        others = [c for c in cohort if c != special]
        for alive in itertools.product((0, 1), repeat=len(others)):
            w = math.prod(a if x else 1 - a for x in alive)
            s = sum(alive) + (survives if special in cohort else 0)
            total += p * w * _fails(len(cohort), s, **sec)
    return total


def _brute(sampling, clients, a, q=None, size=None, groups=None, sec=SECAGG):
    """(ε, tv) of the abort bit by enumeration: client ``clients`` is the one added (Poisson types), replaced
    (fixed size, on both sides) or zeroed (schema: a group of ``size`` holding it)."""
    choices = (1,) if a is None else (0, 1)
    a = 1.0 if a is None else a
    ids = list(range(clients))
    if sampling == "schema":
        pairs = []
        for n in {clients // groups, -(-clients // groups)}:
            side = [_p_abort([(tuple(range(n)), 1.0)], a, 0, s, sec) for s in choices]
            pairs += [(x, y) for x in side for y in side]
    elif sampling == "fixed_size":
        side = [_p_abort(list(_cohorts(sampling, ids, q, size)), a, 0, s, sec) for s in choices]
        pairs = [(x, y) for x in side for y in side]
    else:
        d = _p_abort(list(_cohorts(sampling, ids, q, size)), a, -1, 0, sec)
        pairs = [(d, _p_abort(list(_cohorts(sampling, ids + [clients], q, size)), a, clients, s, sec))
                 for s in choices]
    gap = lambda x, y: 0.0 if x == y else math.inf if min(x, y) == 0 else abs(math.log(x / y))  # noqa: E731
    eps = max(max(gap(x, y), gap(1 - x, 1 - y)) for x, y in pairs)
    return eps, max(abs(x - y) for x, y in pairs)


@pytest.mark.parametrize("availability", [None, 0.8])
@pytest.mark.parametrize("sampling, kw", [("poisson", dict(sampling_probability=0.3)),
                                          ("capped_poisson", dict(sampling_probability=0.4, cohort_size=3)),
                                          ("fixed_size", dict(cohort_size=4)),
                                          ("schema", dict(groups=2))])
@pytest.mark.parametrize("sec", [SECAGG, dict(protocol="secagg_plus", dropout=0.5, corrupt=0.3)])
def test_closed_form_matches_enumeration(sampling, kw, availability, sec):
    """The binomial sums equal a sum over every cohort and dropout pattern of 7 clients (8 with the added one),
    each judged by secagg_cost/round_fails as Deployment.admit judges it."""
    clients = 7
    eps, tv = abort_cost(sampling, clients, **sec, availability=availability, **kw)
    want_eps, want_tv = _brute(sampling, clients, availability, kw.get("sampling_probability"),
                               kw.get("cohort_size"), kw.get("groups"), sec)
    # round-off: each probability sums ≤ 3^8 · C(8, 3) terms of ≤ 9 factors, relative error ≤ that · 10 · 2⁻⁵³;
    # ε is a difference of two logs, tv of two probabilities ≤ 1
    rel = 3 ** 8 * math.comb(8, 3) * 10 * 2.0 ** -53
    assert want_eps > 0 or sampling in ("fixed_size", "schema")  # the bit leaks wherever someone can drop out
    assert eps == pytest.approx(want_eps, abs=4 * rel)
    assert tv == pytest.approx(want_tv, abs=4 * rel)


def test_schema_without_dropouts_costs_nothing_and_an_undroppable_group_is_infinite():
    """Zero-out keeps the client's slot: with no network profile no one drops, so the bit is the same on both
    sides; with one, a group of 3 needs all 3 (⌊0.33·3⌋ = 0 may drop), so the client's dropping decides it."""
    assert abort_cost("schema", 24, **SECAGG, availability=None, groups=4) == (0.0, 0.0)
    assert abort_cost("schema", 9, **SECAGG, availability=1.0, groups=3)[0] == math.inf


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.42, 2.0])
def test_the_gaussian_dominates_randomized_response(eps):
    """G_μ(α) ≤ f_ε(α) = max(0, 1 − e^ε α, e^−ε (1 − α)) on a fine grid, with equality at RR's kink α* = 1/(1 + e^ε):
    the Gaussian charged is the least one that dominates (ε-DP ⇔ f_ε-DP; Dong, Roth & Su 2022)."""
    mu = 1.0 / dominating_noise_multiplier(eps)
    alpha = np.linspace(0.0, 1.0, 100_001)
    gauss = norm.cdf(norm.ppf(1 - alpha) - mu)
    rr = np.maximum(0.0, np.maximum(1 - math.exp(eps) * alpha, math.exp(-eps) * (1 - alpha)))
    assert (gauss <= rr + 1e-12).all()  # 1e-12: Φ and Φ⁻¹'s round-off near the ends
    kink = 1 / (1 + math.exp(eps))
    assert norm.cdf(norm.ppf(1 - kink) - mu) == pytest.approx(kink, rel=1e-9)


def test_rounds_charged():
    """Every round under Poisson-type sampling; under a schema (k, b) rounds 1, b + 1, 2b + 1, … (a client's first,
    second, … participation at the earliest); nothing without a charge."""
    from fedrun.simulation import ClientDP

    dp = ClientDP(1.0, 1.0, 0.1, 10.0, 1e-5, abort_noise_multiplier=3.0)
    assert all(abort_event(dp, r).noise_multiplier == 3.0 for r in range(1, 6))
    schema = ClientDP(1.0, 1.0, 1.0, 6.0, 1e-5, sampling="schema", schema=(3, 4), abort_noise_multiplier=3.0)
    assert [r for r in range(1, 13) if abort_event(schema, r) is not None] == [1, 5, 9]
    assert abort_event(ClientDP(1.0, 1.0, 0.1, 10.0, 1e-5), 1) is None


def test_an_aborted_round_is_charged_its_bit():
    """Privatizer.skip (a round SecAgg aborted: nothing but the bit released) records the bit's charge."""
    import torch

    from fedrun.privacy.mechanisms import GaussianEvent
    from fedrun.simulation import ClientDP, Privatizer

    dp = ClientDP(1.0, 1.0, 0.1, 10.0, 1e-5, abort_noise_multiplier=3.0)
    privatizer = Privatizer(dp, None, None, 0, torch.device("cpu"), num_clients=100)
    privatizer.skip(1)
    assert privatizer.accountant.events == (GaussianEvent(3.0),)
