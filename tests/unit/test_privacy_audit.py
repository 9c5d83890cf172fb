"""Empirical privacy audit: canaries, scores, Steinke et al.'s bound (fedrun.privacy.audit).

dp_accounting is used only here, as the independent reference for the ε of the Gaussian mechanism.
Runtime (2 shared cores): ~5 s in the tests themselves (plus conftest's session setup and imports).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from dp_accounting.pld import privacy_loss_mechanism as plm
from scipy import optimize, stats

from fedrun.privacy.audit import (
    audit_epsilon,
    canary_scores,
    default_guess_grid,
    make_canaries,
    steinke_epsilon,
    steinke_guesses,
    steinke_p_value,
)

DELTA = 1e-5


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@functools.cache
def _true_epsilon(sigma: float, delta: float = DELTA) -> float:
    """ε of the Gaussian mechanism (sensitivity 1, noise std σ): root of dp_accounting's exact δ(ε)."""
    loss = plm.GaussianPrivacyLoss(standard_deviation=sigma, sensitivity=1.0)
    return optimize.brentq(lambda e: loss.get_delta_for_epsilon(e) - delta, 0.0, 100.0, xtol=1e-13, rtol=1e-14)


# ----------------------------------------------------------------------------------------- canaries, scores
def test_canaries_have_norm_s_and_are_near_orthogonal():
    num, dim, s = 200, 20_000, 0.7
    c = make_canaries(num, dim, s, _gen(0))
    assert c.shape == (num, dim) and c.dtype == torch.float32
    np.testing.assert_allclose(torch.linalg.vector_norm(c.double(), dim=1).numpy(), s, rtol=1e-5)
    # Pairwise cosines of independent uniform directions: mean 0, std 1/√d.
    u = c.double() / s
    cos = (u @ u.T)[~torch.eye(num, dtype=torch.bool)].numpy()
    assert abs(cos.mean()) < 3 / math.sqrt(dim * cos.size / 2)  # ≈ 19900 independent pairs
    assert cos.std() * math.sqrt(dim) == pytest.approx(1.0, abs=0.03)
    assert np.abs(cos).max() < 6 / math.sqrt(dim)
    # Directions are isotropic: no preferred coordinate (the mean direction is ~N(0, 1/(num·d)) per coordinate).
    assert torch.linalg.vector_norm(u.mean(0)).item() == pytest.approx(1 / math.sqrt(num), rel=0.1)
    assert torch.equal(c, make_canaries(num, dim, s, _gen(0)))  # reproducible from the generator
    assert not torch.equal(c, make_canaries(num, dim, s, _gen(1)))


@pytest.mark.parametrize("args", [(0, 5, 1.0), (3, 0, 1.0), (3, 5, 0.0), (3, 5, math.inf), (2.5, 5, 1.0)])
def test_make_canaries_rejects_bad_arguments(args):
    with pytest.raises(ValueError, match="outside"):
        make_canaries(*args, _gen(0))


def test_canary_scores_are_cosines_and_scale_free():
    c = make_canaries(50, 300, 2.0, _gen(1))
    obs = torch.randn(300, generator=_gen(2)) * 0.1 + c[:10].sum(0)
    got = canary_scores(c, obs).numpy()
    cn, on = c.double().numpy(), obs.double().numpy()
    expected = cn @ on / (np.linalg.norm(cn, axis=1) * np.linalg.norm(on))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(canary_scores(c * 3, obs * 7).numpy(), got, rtol=1e-5)  # float32 inputs
    assert got[:10].mean() > got[10:].mean() + 0.1  # inserted canaries point along the observed vector
    with pytest.raises(ValueError, match="norm"):
        canary_scores(c, torch.zeros(300))
    with pytest.raises(ValueError, match="must be"):
        canary_scores(c, obs[:-1])


def test_steinke_on_real_canaries_through_a_gaussian_sum():
    """End to end: canaries of norm S, half summed with N(0, σ²S² I) noise, cosines with the sum. √d·cos of an
    inserted canary is ≈ N(1/√(σ² + n_in/d), 1), of a held-out one N(0, 1): the scores separate the two groups,
    and the bound is positive and below the Gaussian mechanism's ε."""
    dim, num, s, sigma = 20_000, 1000, 0.5, 1.0
    g = _gen(3)
    c = make_canaries(num, dim, s, g)
    included = torch.rand(num, generator=g) < 0.5
    observed = c[included].sum(0) + sigma * s * torch.randn(dim, generator=g)
    scores = canary_scores(c, observed)
    root_d = math.sqrt(dim) * scores.numpy()
    n_in = int(included.sum())
    mu_eff = 1 / math.sqrt(sigma**2 + n_in / dim)
    se = math.sqrt(1 / n_in + 1 / (num - n_in))
    assert root_d[included.numpy()].mean() - root_d[~included.numpy()].mean() == pytest.approx(mu_eff, abs=4 * se)
    assert root_d[~included.numpy()].std() == pytest.approx(1.0, abs=0.1)
    bound = audit_epsilon(scores, included=included, delta=DELTA, method="steinke")
    assert 0 < bound.epsilon <= _true_epsilon(sigma)


# ------------------------------------------------------------------------------------------------ Steinke
def _p_value_appendix_d(m, r, v, eps, delta):
    """Steinke et al., Appendix D, transcribed loop for loop (the reference for the vectorized version)."""
    q = 1 / (1 + math.exp(-eps))
    beta = stats.binom.sf(v - 1, r, q)
    alpha, total = 0.0, 0.0
    for i in range(1, v + 1):
        total += stats.binom.pmf(v - i, r, q)
        if total > i * alpha:
            alpha = total / i
    return min(beta + alpha * delta * 2 * m, 1.0)


def test_steinke_p_value_matches_appendix_d():
    rng = np.random.default_rng(0)
    for _ in range(80):
        m = int(rng.integers(1, 600))
        r = int(rng.integers(0, m + 1))
        v = int(rng.integers(0, r + 1))
        eps, delta = float(rng.uniform(0, 6)), float(10 ** rng.uniform(-8, -1))
        assert steinke_p_value(m, r, v, eps, delta) == pytest.approx(
            _p_value_appendix_d(m, r, v, eps, delta), rel=1e-9, abs=1e-300)
    # The bound is where the p-value crosses β: just below it is rejected, just above it is not.
    e = steinke_epsilon(1000, 600, 600, 1e-5, 0.05)
    assert _p_value_appendix_d(1000, 600, 600, e - 1e-6, 1e-5) < 0.05 <= _p_value_appendix_d(1000, 600, 600, e + 1e-6, 1e-5)


def _violation_probability(m, r, eps0, delta, beta, q):
    """P[bound > ε₀] when the correct-guess count is Binomial(r, q): exact, from the smallest rejected v."""
    lo, hi = 0, r + 1  # p-value at ε₀ decreases in v: bisect for the first v with p < β
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if steinke_p_value(m, r, mid, eps0, delta) >= beta else (lo, mid)
    return float(stats.binom.sf(lo - 1, r, q)), lo


@pytest.mark.parametrize("m,r,eps0,beta", [(1000, 1000, 1.0, 0.05), (1000, 200, 2.0, 0.05), (5000, 5000, 0.5, 0.1)])
def test_steinke_coverage_is_exact_for_randomized_response(m, r, eps0, beta):
    """ε₀-DP randomized response makes every guess right with probability e^ε₀/(1 + e^ε₀), independently:
    the worst case of their theorem. The probability that the bound exceeds ε₀ is then at most β — and not
    far below it (the test is tight, so a mis-stated tail shows up on either side)."""
    q = 1 / (1 + math.exp(-eps0))
    violation, _ = _violation_probability(m, r, eps0, 1e-6, beta, q)
    assert 0.5 * beta <= violation <= beta


def test_steinke_delta_term_covers_a_catastrophic_failure():
    """(ε₀, δ₀)-DP mechanism: with probability δ₀ it reveals every inclusion bit (all r guesses right), else it
    is ε₀ randomized response. Without the 2mδ·α term the violation probability would be δ₀ + (1 − δ₀)·≈β
    (0.065 > β); with it the bound never exceeds ε₀ here (2mδ₀ = 40 makes the test very conservative)."""
    m = r = 1000
    eps0, delta0, beta = 1.0, 0.02, 0.05
    q = 1 / (1 + math.exp(-eps0))
    rr_violation, _ = _violation_probability(m, r, eps0, delta0, beta, q)
    revealed_rejected = steinke_p_value(m, r, r, eps0, delta0) < beta
    assert delta0 * revealed_rejected + (1 - delta0) * rr_violation <= beta
    pure_violation, _ = _violation_probability(m, r, eps0, 0.0, beta, q)  # the same test with δ ignored
    assert delta0 + (1 - delta0) * pure_violation > beta


def test_steinke_bound_is_below_true_epsilon_for_the_gaussian_mechanism():
    """Scores N(1/σ, 1) if in, N(0, 1) if out, inclusion ~ Bernoulli(1/2), m = 2000, 10 seeds per σ.
    A violation (bound > true ε) may happen with probability ≤ β = 0.05 per run; over 30 runs we allow
    ≤ 30·β + 3·√(30·β·(1 − β)) ≈ 5.1, i.e. 5. Observed: none — the one-run bound is far from tight here
    (means ≈ 4.8, 1.8, 0.7 for true ε ≈ 19.1, 4.38, 1.99). σ = 0.3 is there for the strong-signal end, where
    the top guesses are all right and anything but a confidence bound (e.g. logit of the accuracy) overshoots."""
    violations, runs = 0, 0
    for sigma in (0.3, 1.0, 2.0):
        true = _true_epsilon(sigma)
        bounds = []
        for seed in range(10):
            rng = np.random.default_rng(seed)
            included = rng.random(2000) < 0.5
            scores = rng.normal(0, 1, 2000) + included / sigma
            res = audit_epsilon(scores, included=included, delta=DELTA, confidence=0.95, method="steinke")
            assert res.epsilon <= res.epsilon_unadjusted and res.num_tests == len(default_guess_grid(2000))
            bounds.append(res.epsilon)
            violations += res.epsilon > true
            runs += 1
        assert np.mean(bounds) > 0.2 * true  # and it has power
    assert violations <= 5


def test_steinke_guesses_abstain_on_ties_and_ignore_listing_order():
    scores = np.array([0.0, 1.0, 1.0, 1.0, 2.0, 3.0])
    included = np.array([0, 1, 0, 1, 1, 1], bool)
    assert steinke_guesses(scores, included, 2, 1) == (3, 3)  # top {3, 2}, bottom {0}
    assert steinke_guesses(scores, included, 3, 2) == (3, 3)  # the cuts fall inside the tie at 1: abstain on it
    # Constant scores listed "held-out first": no information, whatever the order says.
    res = audit_epsilon(np.zeros(1000), included=np.r_[np.zeros(500), np.ones(500)], delta=DELTA, method="steinke")
    assert res.epsilon == 0.0 and res.guesses == 0


# ---------------------------------------------------------------------------------------------- both ends
def test_separated_scores_give_large_epsilon():
    """No noise: every inserted canary scores above every held-out one (m = 1000). Steinke's bound cannot
    exceed logit((β/G)^{1/r}); with 900 right guesses and G = 7 settings that is ≈ 5.2."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        included = rng.random(1000) < 0.5
        scores = included + 0.01 * rng.normal(size=1000)
        res = audit_epsilon(scores, included=included, delta=DELTA, method="steinke")
        assert res.epsilon > 5 and res.correct == res.guesses


def test_pure_noise_gives_about_zero():
    """No signal: inserted and held-out scores have the same law (around a common offset)."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        included = rng.random(1000) < 0.5
        scores = rng.normal(3, 1, 1000)
        assert audit_epsilon(scores, included=included, delta=DELTA, method="steinke").epsilon < 0.2


# ------------------------------------------------------------------------------------------------- entry
def test_audit_epsilon_inputs_and_fields():
    rng = np.random.default_rng(5)
    included = rng.random(400) < 0.5
    scores = rng.normal(0, 1, 400) + 2 * included
    a = audit_epsilon(scores, included=included, delta=DELTA)
    b = audit_epsilon(scores[included], scores_out=scores[~included], delta=DELTA)
    assert a == b and a.method == "steinke" and a.confidence == 0.95 and a.num_in == included.sum()
    s = audit_epsilon(torch.from_numpy(scores), included=torch.from_numpy(included), delta=DELTA,
                      confidence=0.9, method="steinke")
    assert s.confidence == 0.9 and s.correct <= s.guesses <= s.k_plus + s.k_minus
    assert s.epsilon == pytest.approx(steinke_epsilon(400, s.guesses, s.correct, DELTA, 0.1 / s.num_tests), rel=1e-9)


@pytest.mark.parametrize("kwargs,match", [
    (dict(method="lira"), "method="),
    (dict(delta=0.0), r"delta=0.0 is outside \(0, 1\)"),
    (dict(confidence=1.0), r"confidence=1.0 is outside \(0, 1\)"),
    (dict(included=np.ones(3, bool)), r"included has shape \(3,\)"),
    (dict(scores_out=[0.0, 1.0]), "exactly one"),
    (dict(included=None), "needs scores_out or included"),
])
def test_audit_epsilon_rejects_bad_arguments(kwargs, match):
    args = dict(included=np.array([1, 0, 1, 0], bool), delta=DELTA, method="steinke") | kwargs
    with pytest.raises(ValueError, match=match):
        audit_epsilon(np.array([0.1, 0.2, 0.3, 0.4]), **args)


def test_steinke_functions_reject_bad_arguments():
    with pytest.raises(ValueError, match=r"\(m, r, v\)"):
        steinke_p_value(10, 5, 6, 1.0, 1e-5)
    with pytest.raises(ValueError, match=r"beta=1.5 is outside \(0, 1\)"):
        steinke_epsilon(10, 5, 5, 1e-5, 1.5)
    with pytest.raises(ValueError, match=r"k_plus \+ k_minus=7 is outside \[0, 6\]"):
        steinke_guesses(np.zeros(6), np.zeros(6, bool), 4, 3)
