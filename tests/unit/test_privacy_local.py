"""Local-DP noise scales of paper 001 (fedrun.privacy.local)."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import norm

from fedrun.privacy.accounting import gaussian_composition_epsilon
from fedrun.privacy.local import (
    aggregated_noise_variance,
    gaussian_std,
    laplace_scale,
    round_robin_participations,
    sensitivity,
)
from fedrun.privacy.mechanisms import gaussian_noise, laplace_noise

# A FEMNIST-like setting of paper 001: ζ = 3, δ = 1e-4, with the paper's (non-expansive) sensitivity — the
# formulas this file checks; the default is the proven one (test_default_sensitivity_is_the_proven_one).
BASE = dict(clip_norm=3.0, lr=0.05, local_iters=4, participations=6, n_l=200, nonexpansive=True)


def analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Exact ε of the Gaussian mechanism with sensitivity 1 and std σ (Balle & Wang 2018, Thm 8)."""

    def delta_of(eps: float) -> float:
        return norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma)

    if delta_of(0.0) <= delta:
        return 0.0
    return brentq(lambda e: delta_of(e) - delta, 0.0, 500.0, xtol=1e-13)


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


# ------------------------------------------------------------------------------------------------ closed forms
def test_sensitivity_closed_forms():
    z, eta, e, n = 150.0, 0.01, 3, 40
    assert sensitivity(z, eta, e, n, nonexpansive=True) == pytest.approx(2 * z * eta * e / n)
    assert sensitivity(z, eta, e, n, "per_sample", nonexpansive=False) == pytest.approx(
        2 * z * eta / n + 2 * z * eta * (e - 1)
    )
    assert sensitivity(z, eta, e, n, "batch", nonexpansive=True) == pytest.approx(2 * z * eta * e)
    assert sensitivity(z, eta, e, n, "batch", nonexpansive=False) == pytest.approx(2 * z * eta * e)
    # One local step: no trajectory divergence, both per-sample bounds agree.
    assert sensitivity(z, eta, 1, n, nonexpansive=False) == pytest.approx(sensitivity(z, eta, 1, n, nonexpansive=True))


def test_default_sensitivity_is_the_proven_one():
    """Without nonexpansive=True every function uses 2ζη/n_l + 2ζη(E−1) (no assumption): n_l(E−1)/E + 1/E
    times the paper's at E > 1, the same at E = 1."""
    z, eta, e, t_l, n, eps, delta = 150.0, 0.01, 3, 10, 40, 1.0, 1e-4
    proven = 2 * z * eta / n + 2 * z * eta * (e - 1)
    assert sensitivity(z, eta, e, n) == pytest.approx(proven)
    assert laplace_scale(z, eta, e, t_l, n, eps) == pytest.approx(proven * t_l / eps)
    assert gaussian_std(z, eta, e, t_l, n, eps, delta) == pytest.approx(
        proven * math.sqrt(2 * t_l * math.log(1.25 / delta)) / eps)
    assert sensitivity(z, eta, e, n) / sensitivity(z, eta, e, n, nonexpansive=True) == pytest.approx(
        (1 + n * (e - 1)) / e)


def test_paper_formulas():
    """Paper 001's formulas as inferred (its noise law): b = 2ζηE·T_l/(n_l·ε); σ = (2ζηE/n_l)·√(2·T_l·ln(1.25/δ))/ε."""
    z, eta, e, t_l, n, eps, delta = 150.0, 0.01, 2, 10, 100, 1.0, 1e-4
    assert laplace_scale(z, eta, e, t_l, n, eps, nonexpansive=True) == pytest.approx(2 * z * eta * e * t_l / (n * eps))
    assert gaussian_std(z, eta, e, t_l, n, eps, delta, nonexpansive=True) == pytest.approx(
        (2 * z * eta * e / n) * math.sqrt(2 * t_l * math.log(1.25 / delta)) / eps
    )


@pytest.mark.parametrize("name", ["local_iters", "lr", "participations", "n_l", "epsilon", "clip_norm"])
def test_noise_scaling_ratios(name):
    """Doubling one knob: Laplace scale ∝ ζηE·T_l/(n_l ε); Gaussian std ∝ ζηE·√T_l/(n_l ε)."""
    lap_ratio = {"local_iters": 2, "lr": 2, "participations": 2, "n_l": 0.5, "epsilon": 0.5, "clip_norm": 2}[name]
    gau_ratio = math.sqrt(2) if name == "participations" else lap_ratio
    args = dict(BASE, epsilon=0.5)
    doubled = dict(args, **{name: args[name] * 2})
    assert laplace_scale(**doubled) / laplace_scale(**args) == pytest.approx(lap_ratio)
    assert gaussian_std(**doubled, delta=1e-4) / gaussian_std(**args, delta=1e-4) == pytest.approx(gau_ratio)


def test_asymptotic_variance_exponents():
    """Paper 001: variance ∝ η²E²T_l^z with z = 2 (Laplace) and z = 1 (Gaussian)."""
    args = dict(BASE, epsilon=1.0)

    def lap(**kw):
        return aggregated_noise_variance(laplace_scale(**dict(args, **kw)), [1.0], "laplace")

    def gau(**kw):
        return aggregated_noise_variance(gaussian_std(**dict(args, **kw), delta=1e-4), [1.0], "gaussian")

    for t_l in (1, 3, 10):
        assert lap(participations=2 * t_l) / lap(participations=t_l) == pytest.approx(4.0)
        assert gau(participations=2 * t_l) / gau(participations=t_l) == pytest.approx(2.0)
        assert lap(local_iters=3, lr=0.1) / lap(local_iters=1, lr=0.05) == pytest.approx((3 * 2) ** 2)


def test_clip_modes_differ_by_n_l():
    per_sample = laplace_scale(**BASE, epsilon=1.0, clip_mode="per_sample")
    batch = laplace_scale(**BASE, epsilon=1.0, clip_mode="batch")
    assert batch / per_sample == pytest.approx(BASE["n_l"])


def test_infinite_epsilon_means_no_noise():
    assert laplace_scale(**BASE, epsilon=math.inf) == 0.0
    assert gaussian_std(**BASE, epsilon=math.inf, delta=1e-4) == 0.0
    assert gaussian_std(**BASE, epsilon=math.inf, delta=1e-4, calibration="analytic") == 0.0


def test_round_robin_participations():
    assert round_robin_participations(3500, 350, 30) == 3  # b·T_g/N = 3
    assert round_robin_participations(1000, 300, 5) == 2  # 1.5 → the busiest clients take part twice
    with pytest.raises(ValueError, match="clients_per_round=11"):
        round_robin_participations(10, 11, 5)


# --------------------------------------------------------------------------------- the privacy it delivers
@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0])
def test_classic_gaussian_std_delivers_epsilon(epsilon):
    """T_l uploads with the classic σ are (ε, δ)-DP: their exact composition (one Gaussian with std
    σ/(√T_l·Δ₂)) has true ε ≤ the target, for ε ≤ 1 where the classic theorem applies."""
    delta = 1e-4
    sigma = gaussian_std(**BASE, epsilon=epsilon, delta=delta)
    delta_2 = sensitivity(BASE["clip_norm"], BASE["lr"], BASE["local_iters"], BASE["n_l"], nonexpansive=True)
    effective = sigma / (delta_2 * math.sqrt(BASE["participations"]))
    assert analytic_gaussian_epsilon(effective, delta) <= epsilon
    # The accountant, fed with what was added, agrees (PLD is ~exact here).
    eps_pld = gaussian_composition_epsilon([sigma / delta_2] * BASE["participations"], delta, "pld")
    assert eps_pld == pytest.approx(analytic_gaussian_epsilon(effective, delta), rel=1e-2)


def test_analytic_calibration_is_exact_and_classic_breaks_for_large_epsilon():
    delta, t_l = 1e-4, BASE["participations"]
    delta_2 = sensitivity(BASE["clip_norm"], BASE["lr"], BASE["local_iters"], BASE["n_l"], nonexpansive=True)
    for epsilon in (0.5, 2.0, 10.0):
        sigma = gaussian_std(**BASE, epsilon=epsilon, delta=delta, calibration="analytic")
        assert analytic_gaussian_epsilon(sigma / (delta_2 * math.sqrt(t_l)), delta) == pytest.approx(epsilon, rel=1e-6)
    # Where the classic formula is valid it is conservative: more noise than the exact calibration.
    for epsilon in (0.5, 1.0):
        classic = gaussian_std(**BASE, epsilon=epsilon, delta=delta)
        assert classic > gaussian_std(**BASE, epsilon=epsilon, delta=delta, calibration="analytic")
    # Classic formula outside its ε < 1 hypothesis: not enough noise at ε = 10.
    classic = gaussian_std(**BASE, epsilon=10.0, delta=delta)
    assert analytic_gaussian_epsilon(classic / (delta_2 * math.sqrt(t_l)), delta) > 10.0


# ------------------------------------------------------------------------------------------ sampled noise
def test_sampled_noise_variance_matches_formula():
    b = laplace_scale(**BASE, epsilon=0.7)
    s = gaussian_std(**BASE, epsilon=0.7, delta=1e-4)
    lap = laplace_noise((200_000,), b, _gen(0), dtype=torch.float64)
    gau = gaussian_noise((200_000,), s, _gen(1), dtype=torch.float64)
    assert lap.var().item() == pytest.approx(aggregated_noise_variance(b, [1.0], "laplace"), rel=0.03)
    assert gau.var().item() == pytest.approx(aggregated_noise_variance(s, [1.0], "gaussian"), rel=0.03)


def test_aggregated_noise_variance_empirical_and_closed_form():
    """Noise item w^b = (N/b)·Σ_l (n_l/n)·w^l for b = 4 engaged clients of N = 10 with unequal data."""
    num_clients, b = 10, 4
    sizes = [50, 120, 80, 250]
    n = 1000  # total samples over all N clients
    weights = [num_clients / b * s / n for s in sizes]
    scales = [0.5, 0.2, 0.8, 0.3]
    for mechanism, sampler in (("laplace", laplace_noise), ("gaussian", gaussian_noise)):
        draws = sum(w * sampler((200_000,), sc, _gen(i), dtype=torch.float64)
                    for i, (w, sc) in enumerate(zip(weights, scales)))
        expected = aggregated_noise_variance(scales, weights, mechanism)
        assert draws.var().item() == pytest.approx(expected, rel=0.03)
    # Equal data sizes (n_l = n/N): weights 1/b, variance = per-client variance / b.
    assert aggregated_noise_variance(0.4, [1 / b] * b, "gaussian") == pytest.approx(0.16 / b)
    assert aggregated_noise_variance(0.4, [1 / b] * b, "laplace") == pytest.approx(2 * 0.16 / b)


# ------------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(clip_norm=0.0), "clip_norm=0.0"),
        (dict(lr=-0.1), "lr=-0.1"),
        (dict(local_iters=0), "local_iters=0"),
        (dict(local_iters=1.5), "local_iters=1.5"),
        (dict(participations=0), "participations=0"),
        (dict(n_l=0), "n_l=0"),
        (dict(epsilon=0.0), r"epsilon=0.0 is outside \(0, inf\]"),
        (dict(epsilon=-1.0), "epsilon=-1.0"),
        (dict(clip_mode="microbatch"), "clip_mode='microbatch'"),
    ],
)
def test_validation(kwargs, match):
    args = dict(BASE, epsilon=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        laplace_scale(**args)
    with pytest.raises(ValueError, match=match):
        gaussian_std(**args, delta=1e-4)


def test_validation_gaussian_and_aggregation():
    with pytest.raises(ValueError, match=r"delta=1.5 is outside \(0, 1\)"):
        gaussian_std(**BASE, epsilon=1.0, delta=1.5)
    with pytest.raises(ValueError, match="calibration='exact'"):
        gaussian_std(**BASE, epsilon=1.0, delta=1e-4, calibration="exact")
    with pytest.raises(ValueError, match="mechanism='uniform'"):
        aggregated_noise_variance(1.0, [1.0], "uniform")
    with pytest.raises(ValueError, match="3 values but weights has 2"):
        aggregated_noise_variance([1.0, 1.0, 1.0], [0.5, 0.5], "gaussian")
    with pytest.raises(ValueError, match=r"per_client_std_or_scale\[1\]=-1"):
        aggregated_noise_variance([1.0, -1.0], [0.5, 0.5], "gaussian")
