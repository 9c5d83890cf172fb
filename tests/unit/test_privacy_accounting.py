"""Privacy accounting (fedrun.privacy.accounting) against independent references.

References written here, not taken from dp_accounting:
* the exact (analytic) Gaussian mechanism of Balle & Wang 2018, Thm 8: for sensitivity 1 and noise std σ,
  δ(ε) = Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ);
* the Laplace mechanism's exact privacy profile δ(ε) = 1 − e^{(ε−ε₀)/2} for 0 ≤ ε ≤ ε₀ (hockey-stick
  divergence of Lap(0, b) vs Lap(1, b), ε₀ = 1/b, worked out by integrating the privacy-loss density);
* the moments accountant with integer orders (Abadi et al. 2016; Mironov, Talwar, Zhang 2019:
  A_α = Σ_k C(α,k)(1−q)^{α−k} q^k exp((k²−k)/(2σ²))), with the classic RDP→DP conversion
  ε = min_α RDP(α) + log(1/δ)/(α−1) (Mironov 2017, Prop. 3) and the improved one
  ε = min_α RDP(α) + log(1 − 1/α) − log(δα)/(α−1) (Balle et al. 2020, Prop. 12), checked against published
  numbers.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.special import gammaln, logsumexp
from scipy.stats import norm

from fedrun.privacy.accounting import (
    PrivacyAccountant,
    calibrate_noise_multiplier,
    compute_epsilon,
    gaussian_composition_epsilon,
    laplace_basic_composition,
)
from fedrun.privacy.mechanisms import (
    FixedSizeGaussianEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonGaussianEvent,
    TruncatedPoissonGaussianEvent,
)


# ------------------------------------------------------------------------------------------- references
def analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Exact ε of the Gaussian mechanism (sensitivity 1, std σ) — Balle & Wang 2018, Thm 8."""

    def delta_of(eps: float) -> float:
        return norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma)

    if delta_of(0.0) <= delta:
        return 0.0
    return brentq(lambda e: delta_of(e) - delta, 0.0, 200.0, xtol=1e-13)


def _log_a_integer(q: float, sigma: float, alpha: int) -> float:
    k = np.arange(alpha + 1)
    log_binom = gammaln(alpha + 1) - gammaln(k + 1) - gammaln(alpha - k + 1)
    return float(logsumexp(log_binom + (alpha - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * sigma**2)))


def moments_accountant_epsilon(q: float, sigma: float, steps: int, delta: float, conversion: str) -> float:
    """Integer-order RDP of the Poisson-subsampled Gaussian, composed ``steps`` times, converted to ε."""
    best = math.inf
    for alpha in range(2, 257):
        rdp = steps * _log_a_integer(q, sigma, alpha) / (alpha - 1)
        if conversion == "classic":
            eps = rdp + math.log(1 / delta) / (alpha - 1)
        else:
            eps = rdp + math.log1p(-1 / alpha) - math.log(delta * alpha) / (alpha - 1)
        best = min(best, eps)
    return best


# ---------------------------------------------------------------------------- Gaussian mechanism, q = 1, T = 1
@pytest.mark.parametrize("sigma,delta", [(0.8, 1e-5), (1.0, 1e-5), (2.0, 1e-5), (5.0, 1e-5), (2.0, 1e-3)])
def test_single_gaussian_matches_analytic_gaussian(sigma, delta):
    exact = analytic_gaussian_epsilon(sigma, delta)
    pld = compute_epsilon(sigma, 1.0, 1, delta, accountant="pld")
    rdp = compute_epsilon(sigma, 1.0, 1, delta, accountant="rdp")
    assert pld == pytest.approx(exact, rel=1e-2)
    assert pld >= exact * (1 - 1e-6)  # pessimistic discretization: still an upper bound
    assert exact <= rdp <= 1.25 * exact  # RDP is an upper bound, ~10 % loose here


def test_gaussian_composition_is_one_gaussian_with_combined_noise():
    """T Gaussian releases with σ_i compose exactly to one with σ_eff = (Σ σ_i⁻²)^(-1/2) (no subsampling)."""
    sigmas = [3.0, 3.0, 4.0, 6.0, 6.0, 6.0]
    sigma_eff = sum(s**-2 for s in sigmas) ** -0.5
    exact = analytic_gaussian_epsilon(sigma_eff, 1e-5)
    assert gaussian_composition_epsilon(sigmas, 1e-5, accountant="pld") == pytest.approx(exact, rel=1e-2)
    assert gaussian_composition_epsilon(sigmas, 1e-5, accountant="rdp") >= exact
    # Constant σ over T rounds is compute_epsilon with q = 1.
    assert gaussian_composition_epsilon([2.0] * 7, 1e-5) == pytest.approx(compute_epsilon(2.0, 1.0, 7, 1e-5))
    assert gaussian_composition_epsilon([], 1e-5) == 0.0
    assert gaussian_composition_epsilon([1.0, 0.0], 1e-5) == math.inf  # one release without noise
    with pytest.raises(ValueError, match=r"noise_multipliers\[1\]=-1"):
        gaussian_composition_epsilon([1.0, -1.0], 1e-5)


# ------------------------------------------------------------------------------------------- Laplace / pure DP
def test_laplace_basic_composition_closed_form():
    assert laplace_basic_composition([0.1, 0.25, 0.4]) == pytest.approx(0.75)
    assert laplace_basic_composition([0.5] * 20) == pytest.approx(10.0)
    assert laplace_basic_composition([]) == 0.0
    assert laplace_basic_composition([0.5, math.inf]) == math.inf
    with pytest.raises(ValueError, match=r"epsilons\[1\]=0"):
        laplace_basic_composition([0.5, 0.0])


def test_single_laplace_event_matches_exact_profile():
    eps0, delta = 0.5, 1e-5
    exact = eps0 + 2 * math.log1p(-delta)  # solves 1 − e^{(ε−ε₀)/2} = δ
    acc = PrivacyAccountant(delta)
    acc.record(LaplaceEvent(eps0))
    assert acc.epsilon("pld") == pytest.approx(exact, abs=2e-4)
    assert acc.epsilon("pld") >= exact - 1e-9
    assert acc.epsilon("rdp") >= exact - 1e-9


def test_laplace_composition_bounded_by_basic_composition():
    """k Laplace releases: ε ≤ kε₀ (basic composition), and ≥ kε₀ + ln(1 − 2^k δ), because with
    probability 2^-k every output falls where the privacy loss is ε₀, so δ(ε) ≥ 2^-k (1 − e^{ε−kε₀})."""
    eps0, k, delta = 0.3, 3, 1e-5
    basic = laplace_basic_composition([eps0] * k)
    acc = PrivacyAccountant(delta)
    for _ in range(k):
        acc.record(LaplaceEvent(eps0))
    assert basic + math.log1p(-(2**k) * delta) <= acc.epsilon("pld") <= basic + 2e-4


# ------------------------------------------------------------------------------------------ published numbers
# tensorflow/privacy, tutorials/README.md ("Select Parameters" table): MNIST, N = 60000, batch 256, δ = 1e-5,
# steps = ceil(epochs·N/batch): (σ = 1.3, 15 epochs) → ε = 1.19; (1.1, 60) → 3.01; (0.7, 45) → 7.10.
# Abadi et al. 2016, Sec. 3.1: q = 0.01, σ = 4, δ = 1e-5, T = 10000 → ε ≈ 1.26 (moments accountant).
PUBLISHED = [
    (256 / 60000, 1.3, math.ceil(15 * 60000 / 256), 1.19),
    (256 / 60000, 1.1, math.ceil(60 * 60000 / 256), 3.01),
    (256 / 60000, 0.7, math.ceil(45 * 60000 / 256), 7.10),
    (0.01, 4.0, 10000, 1.26),
]


@pytest.mark.parametrize("q,sigma,steps,published", PUBLISHED)
def test_reference_moments_accountant_reproduces_published(q, sigma, steps, published):
    # The published numbers used the classic conversion (and fractional orders too, hence ≤ ours).
    ours = moments_accountant_epsilon(q, sigma, steps, 1e-5, "classic")
    assert ours == pytest.approx(published, rel=5e-3)


@pytest.mark.parametrize("q,sigma,steps,published", PUBLISHED)
def test_rdp_and_pld_against_published_settings(q, sigma, steps, published):
    reference = moments_accountant_epsilon(q, sigma, steps, 1e-5, "improved")
    rdp = compute_epsilon(sigma, q, steps, 1e-5, accountant="rdp")
    # Same RDP curve and conversion; the library also tries fractional orders, so it can only be lower.
    assert reference * 0.99 <= rdp <= reference * (1 + 1e-9)
    assert rdp < published  # tighter conversion than the published (classic) numbers
    pld = compute_epsilon(sigma, q, steps, 1e-5, accountant="pld")
    assert 0.8 * rdp <= pld <= rdp


# ----------------------------------------------------------------------------------------------- monotonicity
@settings(max_examples=6, deadline=None)
@given(
    sigma=st.floats(0.8, 8.0),
    q=st.floats(1e-3, 1.0),
    rounds=st.integers(1, 300),
    factor=st.floats(1.05, 3.0),
)
def test_rdp_epsilon_monotone(sigma, q, rounds, factor):
    eps = compute_epsilon(sigma, q, rounds, 1e-5)
    assert compute_epsilon(sigma, q, rounds + int(factor * 10), 1e-5) >= eps * (1 - 1e-12)
    assert compute_epsilon(sigma, min(1.0, q * factor), rounds, 1e-5) >= eps * (1 - 1e-12)
    assert compute_epsilon(sigma * factor, q, rounds, 1e-5) <= eps * (1 + 1e-12)


@pytest.mark.parametrize("base", [(3.0, 0.1, 20), (4.0, 1.0, 3)])
def test_pld_epsilon_monotone(base):
    sigma, q, rounds = base
    eps = compute_epsilon(sigma, q, rounds, 1e-5, "pld")
    assert compute_epsilon(sigma, q, 2 * rounds, 1e-5, "pld") >= eps
    assert compute_epsilon(sigma, min(1.0, 1.5 * q), rounds, 1e-5, "pld") >= eps
    assert compute_epsilon(1.5 * sigma, q, rounds, 1e-5, "pld") <= eps
    assert compute_epsilon(sigma, q, rounds, 1e-3, "pld") <= eps  # larger δ, smaller ε


# ------------------------------------------------------------------------------------------------ calibration
@pytest.mark.parametrize("accountant", ["rdp", "pld"])
@pytest.mark.parametrize("target,q,rounds", [(1.0, 0.1, 200), (0.5, 1.0, 1), (2.0, 0.2, 30)])
def test_calibration_round_trip(accountant, target, q, rounds):
    sigma = calibrate_noise_multiplier(target, q, rounds, 1e-5, accountant)
    eps = compute_epsilon(sigma, q, rounds, 1e-5, accountant)
    assert 0.99 * target <= eps <= target
    # smallest: 1 % less noise already breaks the target
    assert compute_epsilon(sigma * 0.99, q, rounds, 1e-5, accountant) > target * 0.99


def test_calibration_single_gaussian_matches_analytic():
    """q = 1, T = 1: calibrated σ (PLD) ≈ σ solving the exact analytic Gaussian for ε = 1."""
    sigma = calibrate_noise_multiplier(1.0, 1.0, 1, 1e-5, "pld")
    exact_sigma = brentq(lambda s: analytic_gaussian_epsilon(s, 1e-5) - 1.0, 0.5, 50)
    assert sigma == pytest.approx(exact_sigma, rel=0.015)
    assert sigma >= exact_sigma * (1 - 1e-6)  # never less noise than the exact answer


def test_calibration_unreachable_target():
    # Gaussian: ε(σ) ≈ √(2 ln(1.25/δ))/σ, so ε = 1e-9 at δ = 1e-10 needs σ ≈ 7e9 > the 1e6 search limit.
    with pytest.raises(ValueError, match="cannot be met"):
        calibrate_noise_multiplier(1e-9, 1.0, 1, 1e-10)


# ------------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(noise_multiplier=0.0), "noise_multiplier=0.0"),
        (dict(noise_multiplier=-1.0), "noise_multiplier=-1.0"),
        (dict(sampling_probability=0.0), r"sampling_probability=0.0 is outside \(0, 1\]"),
        (dict(sampling_probability=1.5), "sampling_probability=1.5"),
        (dict(rounds=0), "rounds=0"),
        (dict(rounds=2.5), "rounds=2.5"),
        (dict(delta=1.5), r"delta=1.5 is outside \(0, 1\)"),
        (dict(delta=0.0), "delta=0.0"),
        (dict(accountant="moments"), "accountant='moments'"),
    ],
)
def test_compute_epsilon_validation(kwargs, match):
    args = dict(noise_multiplier=1.0, sampling_probability=0.1, rounds=10, delta=1e-5, accountant="rdp")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        compute_epsilon(**args)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(target_epsilon=0.0), "target_epsilon=0.0"),
        (dict(target_epsilon=-2.0), "target_epsilon=-2.0"),
        (dict(delta=1.0), "delta=1.0"),
        (dict(sampling_probability=2.0), "sampling_probability=2.0"),
        (dict(rounds=-3), "rounds=-3"),
        (dict(accountant="gdp"), "accountant='gdp'"),
    ],
)
def test_calibration_validation(kwargs, match):
    args = dict(target_epsilon=1.0, sampling_probability=0.1, rounds=10, delta=1e-5, accountant="rdp")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        calibrate_noise_multiplier(**args)


# ------------------------------------------------------------------------------------------ PrivacyAccountant
def test_accountant_equals_compute_epsilon_for_constant_events():
    acc = PrivacyAccountant(1e-5)
    assert acc.epsilon() == 0.0 and acc.epsilon("pld") == 0.0
    for _ in range(50):
        acc.record(PoissonGaussianEvent(3.0, 0.1))
    assert acc.epsilon("rdp") == pytest.approx(compute_epsilon(3.0, 0.1, 50, 1e-5, "rdp"), rel=1e-12)
    assert acc.epsilon("pld") == pytest.approx(compute_epsilon(3.0, 0.1, 50, 1e-5, "pld"), rel=1e-9)
    summary = acc.summary()
    assert summary["epsilon_rdp"] == acc.epsilon("rdp") and summary["epsilon_pld"] == acc.epsilon("pld")
    assert summary["rounds"] == 50 and summary["delta"] == 1e-5
    assert summary["epsilon_pld"] < summary["epsilon_rdp"]


def test_accountant_running_epsilon_tracks_rounds():
    acc = PrivacyAccountant(1e-5)
    history = []
    for _ in range(30):
        acc.record(PoissonGaussianEvent(2.0, 0.2))
        history.append(acc.epsilon())
    assert all(b >= a for a, b in zip(history, history[1:]))
    assert history[9] == pytest.approx(compute_epsilon(2.0, 0.2, 10, 1e-5), rel=1e-12)


def test_accountant_mixed_events():
    """Order does not matter; mixing σ = 3 and σ = 5 rounds lies between all-σ=3 and all-σ=5."""
    a, b = PrivacyAccountant(1e-5), PrivacyAccountant(1e-5)
    events = [PoissonGaussianEvent(3.0, 0.1)] * 10 + [PoissonGaussianEvent(5.0, 0.1)] * 10
    for e in events:
        a.record(e)
    for e in reversed(events):
        b.record(e)
    for name in ("rdp", "pld"):
        assert a.epsilon(name) == pytest.approx(b.epsilon(name), rel=1e-9)
        all_5, all_3 = compute_epsilon(5.0, 0.1, 20, 1e-5, name), compute_epsilon(3.0, 0.1, 20, 1e-5, name)
        assert all_5 < a.epsilon(name) < all_3
    # A round with q = 1 and no subsampling is the same whichever event type describes it.
    c, d = PrivacyAccountant(1e-5), PrivacyAccountant(1e-5)
    c.record(GaussianEvent(3.0))
    d.record(PoissonGaussianEvent(3.0, 1.0))
    assert c.epsilon() == d.epsilon()
    # A round without noise makes ε infinite.
    c.record(GaussianEvent(0.0))
    assert c.epsilon() == math.inf and c.epsilon("pld") == math.inf


def test_accountant_state_dict_round_trip():
    acc = PrivacyAccountant(1e-5)
    for t in range(40):
        acc.record(PoissonGaussianEvent(2.0 if t < 25 else 3.0, 0.05))
    acc.record(LaplaceEvent(0.2))
    state = json.loads(json.dumps(acc.state_dict()))  # plain JSON
    resumed = PrivacyAccountant(1e-5)
    resumed.load_state_dict(state)
    assert resumed.events == acc.events
    assert resumed.epsilon("rdp") == acc.epsilon("rdp")
    assert resumed.epsilon("pld") == acc.epsilon("pld")
    resumed.record(PoissonGaussianEvent(3.0, 0.05))
    assert resumed.epsilon() > acc.epsilon()
    with pytest.raises(ValueError, match="delta"):
        PrivacyAccountant(1e-6).load_state_dict(state)
    with pytest.raises(ValueError, match="event type 'Bogus'"):
        PrivacyAccountant(1e-5).load_state_dict({"delta": 1e-5, "events": [{"type": "Bogus"}]})


def test_accountant_validation():
    with pytest.raises(ValueError, match="delta=0"):
        PrivacyAccountant(0)
    acc = PrivacyAccountant(1e-5)
    with pytest.raises(ValueError, match="event="):
        acc.record("gaussian")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="accountant='prv'"):
        acc.epsilon("prv")


# ------------------------------------------------------------------------------- how the cohort was sampled
# The fixed-size reference is dp_accounting's own RDP accountant, called here directly: replace-one neighbours, the
# event SampledWithoutReplacementDpEvent(N, k, Gaussian(σ/2)) — σ = noise std / S, and replacing one client's
# clipped vector (norm ≤ S) by another moves the sum by up to 2S, so the Gaussian has σ/2 per unit of sensitivity.
def dp_accounting_fixed_size_epsilon(sigma: float, n: int, k: int, rounds: int, delta: float) -> float:
    import dp_accounting
    from dp_accounting import rdp

    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, k, dp_accounting.GaussianDpEvent(sigma / 2)), rounds)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("sigma,n,k,rounds,delta", [
    (1.0, 3400, 100, 1500, 1e-4),  # the issue's setting
    (2.0, 3400, 100, 1500, 1e-4),
    (1.3, 40, 4, 3, 1e-5),
    (0.8, 100, 100, 10, 1e-5),  # k = N: no sampling
    (5.0, 6000, 60, 200, 1e-6),
])
def test_fixed_size_epsilon_is_dp_accountings_rdp_of_the_same_event(sigma, n, k, rounds, delta):
    """compute_epsilon and the per-round PrivacyAccountant equal dp_accounting's own RDP result to 1e-9.
    Fails if the fixed-size event is accounted as Poisson, under add/remove, or with sensitivity S instead of 2S."""
    reference = dp_accounting_fixed_size_epsilon(sigma, n, k, rounds, delta)
    eps = compute_epsilon(sigma, k / n, rounds, delta, "rdp", sampling="fixed_size", num_clients=n, cohort_size=k)
    assert eps == pytest.approx(reference, rel=1e-9, abs=1e-12)
    acc = PrivacyAccountant(delta)
    for _ in range(rounds):
        acc.record(FixedSizeGaussianEvent(sigma, n, k))
    assert acc.epsilon("rdp") == pytest.approx(reference, rel=1e-9, abs=1e-12)
    # PLD has no such event: the "pld" answer is the RDP bound, and says so
    assert acc.epsilon("pld") == acc.epsilon("rdp") and acc.pld_info["method"] == "rdp"
    assert "sampling without replacement" in acc.pld_info["reason"]


def test_a_full_fixed_size_cohort_is_the_gaussian_with_sensitivity_2s():
    """k = N: no sampling left, and replace-one moves the sum by up to 2S: the RDP of N(0, σ²S²) at shift 2S,
    α·(2S)²/(2σ²S²) = α/(2(σ/2)²) — the same as one Gaussian release with noise multiplier σ/2 (independent route:
    the add/remove accountant at q = 1, which is the plain Gaussian)."""
    for sigma in (0.7, 1.0, 3.0):
        full = compute_epsilon(sigma, 1.0, 5, 1e-5, sampling="fixed_size", num_clients=50, cohort_size=50)
        assert full == pytest.approx(compute_epsilon(sigma / 2, 1.0, 5, 1e-5), rel=1e-9)


def test_the_issues_price_table_fast_part():
    """N = 3400, k = 100 (q = 100/3400), 1500 rounds, δ = 1e-4. The issue's 14.86 is dp_accounting's fixed-size
    figure at noise multiplier 1 per unit of replace-one sensitivity, i.e. fedrun's σ = 2 (std 2S); at fedrun's
    σ = 1 (std S, sensitivity 2S) the fixed-size bound is 143.2, against 7.19 (RDP) for Poisson."""
    n, k, t, d = 3400, 100, 1500, 1e-4
    fixed = dict(sampling="fixed_size", num_clients=n, cohort_size=k)
    assert compute_epsilon(2.0, k / n, t, d, **fixed) == pytest.approx(14.858, abs=5e-4)
    assert compute_epsilon(1.0, k / n, t, d, **fixed) == pytest.approx(143.216, abs=5e-4)
    assert compute_epsilon(1.0, k / n, t, d, "rdp") == pytest.approx(7.190, abs=5e-4)


@pytest.mark.slow
def test_the_issues_price_table_pld_part():
    """The PLD figures of the issue (dp-accounting 0.6.0; ~1 s each on the 2-core machine): Poisson 6.47;
    Poisson capped at the expected cohort of 100, 30.9; capped at 150, 6.47 (the cap almost never binds)."""
    n, k, t, d = 3400, 100, 1500, 1e-4
    assert compute_epsilon(1.0, k / n, t, d, "pld") == pytest.approx(6.471, abs=1e-3)
    capped = dict(sampling="capped_poisson", num_clients=n)
    assert compute_epsilon(1.0, k / n, t, d, "pld", cohort_size=100, **capped) == pytest.approx(30.93, abs=1e-2)
    assert compute_epsilon(1.0, k / n, t, d, "pld", cohort_size=150, **capped) == pytest.approx(6.472, abs=1e-3)


def test_capped_poisson_is_dp_accountings_truncated_poisson_pld():
    """The capped Poisson ε is dp_accounting's PLD of TruncatedSubsampledGaussianDpEvent (add/remove-one), called
    here directly at the discretization the grid budget chose (a little coarser than 1e-4 here: a pessimistic PLD
    is an upper bound at any discretization); a cap that cannot bind (≥ N) gives the Poisson ε; RDP has no bound
    for it (∞)."""
    import dp_accounting
    from dp_accounting import pld

    n, q, cap, sigma, rounds, delta = 200, 0.1, 15, 2.0, 20, 1e-5
    acc = PrivacyAccountant(delta)
    for _ in range(rounds):
        acc.record(TruncatedPoissonGaussianEvent(sigma, q, n, cap))
    eps = acc.epsilon("pld")
    reference = pld.PLDAccountant(value_discretization_interval=acc.pld_info["discretization"])
    reference.compose(dp_accounting.TruncatedSubsampledGaussianDpEvent(n, q, cap, sigma), rounds)
    assert eps == pytest.approx(reference.get_epsilon(delta), rel=1e-9)
    assert acc.epsilon("rdp") == math.inf
    capped = dict(sampling="capped_poisson", num_clients=n)
    assert compute_epsilon(sigma, q, rounds, delta, "pld", cohort_size=cap, **capped) == eps
    poisson = compute_epsilon(sigma, q, rounds, delta, "pld")
    assert eps > poisson
    assert compute_epsilon(sigma, q, rounds, delta, "pld", cohort_size=n, **capped) == pytest.approx(poisson, rel=1e-9)


@pytest.mark.parametrize("sampling,accountant,target,q,rounds,n,k", [
    ("fixed_size", "rdp", 1.0, 0.1, 50, 200, 20),
    ("fixed_size", "rdp", 4.0, 100 / 3400, 1500, 3400, 100),
    ("capped_poisson", "pld", 1.0, 0.1, 20, 200, 15),
])
def test_calibration_round_trip_for_each_sampling(sampling, accountant, target, q, rounds, n, k):
    cohort = dict(sampling=sampling, num_clients=n, cohort_size=k)
    sigma = calibrate_noise_multiplier(target, q, rounds, 1e-5, accountant, **cohort)
    assert 0.99 * target <= compute_epsilon(sigma, q, rounds, 1e-5, accountant, **cohort) <= target
    assert compute_epsilon(sigma * 0.99, q, rounds, 1e-5, accountant, **cohort) > target * 0.99
    # the same target needs more noise than with Poisson sampling at the same q
    assert sigma > calibrate_noise_multiplier(target, q, rounds, 1e-5, accountant)


@pytest.mark.parametrize("kwargs,match", [
    (dict(sampling="fixed_size", accountant="pld"),
     "^accountant=pld cannot account sampling=fixed_size: dp_accounting's PLD accountant has no event for sampling "
     "without replacement; allowed: accountant=rdp$"),
    (dict(sampling="capped_poisson", accountant="rdp"),
     "^accountant=rdp cannot account sampling=capped_poisson: .* allowed: accountant=pld$"),
    (dict(sampling="shuffled"), "sampling='shuffled' is not one of"),
    (dict(sampling="fixed_size", cohort_size=None), "cohort_size=None must be an integer"),
    (dict(sampling="fixed_size", cohort_size=30), r"cohort_size=30 is outside \[1, num_clients=20\]"),
    (dict(sampling="fixed_size", sampling_probability=0.5), "is not cohort_size/num_clients = 4/20"),
    (dict(sampling="capped_poisson", accountant="pld", num_clients=0), "num_clients=0 must be an integer"),
])
def test_unsupported_samplings_are_one_line_refusals(kwargs, match):
    args = dict(noise_multiplier=1.0, sampling_probability=0.2, rounds=10, delta=1e-5, accountant="rdp",
                num_clients=20, cohort_size=4)
    args.update(kwargs)
    for call in (compute_epsilon, calibrate_noise_multiplier):
        a = dict(args)
        if call is calibrate_noise_multiplier:
            a["target_epsilon"] = a.pop("noise_multiplier")
        with pytest.raises(ValueError, match=match) as err:
            call(**a)
        assert "\n" not in str(err.value)


def test_accountant_refuses_mixed_neighbouring_relations_and_keeps_new_events_in_its_state():
    acc = PrivacyAccountant(1e-5)
    acc.record(FixedSizeGaussianEvent(1.0, 40, 4))
    with pytest.raises(ValueError, match="cannot be composed with Poisson-sampled ones"):
        acc.record(PoissonGaussianEvent(1.0, 0.1))
    with pytest.raises(ValueError, match="cannot be composed"):
        acc.record(TruncatedPoissonGaussianEvent(1.0, 0.1, 40, 4))
    acc.record(FixedSizeGaussianEvent(2.0, 40, 4))
    state = json.loads(json.dumps(acc.state_dict()))
    assert state["events"][0] == {"type": "FixedSizeGaussianEvent", "noise_multiplier": 1.0, "dataset_size": 40,
                                  "sample_size": 4}
    resumed = PrivacyAccountant(1e-5)
    resumed.load_state_dict(state)
    assert resumed.events == acc.events and resumed.epsilon() == acc.epsilon()
    capped = PrivacyAccountant(1e-5)
    capped.record(TruncatedPoissonGaussianEvent(1.0, 0.1, 40, 4))
    again = PrivacyAccountant(1e-5)
    again.load_state_dict(json.loads(json.dumps(capped.state_dict())))
    assert again.events == capped.events
