"""Accounting that cannot blow up (fedrun.privacy.accounting).

For σ → 0, q → 1, up to 10⁶ rounds and any δ, every accountant call must return promptly a valid upper bound
on ε (possibly ∞) or raise a one-line ValueError — never allocate without bound (before the guard, PLD ε of
a q = 0.25 Gaussian with σ = 1e-6 asked numpy for 35.5 PiB).

* Validity is checked against an exact lower bound written here: the exact ε of ONE round of the
  Poisson-subsampled Gaussian (add/remove, both directions; its privacy loss is monotone, so
  δ(ε) = P(L > ε) − e^ε Q(L > ε) in closed form) — composition never lowers ε — and for q = 1 the exact ε
  of T rounds (one Gaussian with σ/√T, Balle & Wang 2018, Thm 8).
* Memory is checked deterministically: spies wrap dp_accounting's grid builder, self-convolution and
  composition and fail *before* any grid above the budget is allocated (so this file fails, rather than
  exhausting the machine, if the guard is removed). The property tests run with a small budget (2¹⁴ points);
  the plan at the real budget (2²⁰) is checked without building anything; the 35 PiB case runs for real,
  unspied, under an address-space limit (RLIMIT_AS = current + 2 GiB, restored afterwards).

Mutation check (done when this file was written): with ``_plan_pld`` bypassed (always discretization 1e-4,
the old behaviour) 8 tests here fail — the spies' assertions, and the regression test with numpy's
"Unable to allocate 35.5 PiB" — and none exhausts the machine; without the σ < 1e-30 guard
``test_extreme_noise_multipliers_give_valid_bounds`` fails (dp_accounting's RDP gives ε = 0 at σ = 1e-154),
and without the one-point-grid guard it fails on time (~14 s).
"""

from __future__ import annotations

import contextlib
import math
import resource
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from scipy.special import log_ndtr

import fedrun.privacy.accounting as accounting
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_pmf, privacy_loss_distribution
from fedrun.privacy.accounting import (
    PrivacyAccountant,
    calibrate_noise_multiplier,
    compute_epsilon,
    gaussian_composition_epsilon,
)
from fedrun.privacy.mechanisms import GaussianEvent, PoissonGaussianEvent

TIME_BOUND_S = 10.0  # per call: "bounded", not fast
SMALL_BUDGET = 1 << 14
# Calls are slow-ish (PLD: up to ~1 s): no shrinking (a failure prints its unshrunk example), no health check.
FAST = dict(
    deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=[Phase.explicit, Phase.reuse, Phase.generate]
)


# ------------------------------------------------------------------------------------------- exact reference
def _log_e_minus_one_plus(eps: float, q: float) -> float:
    """log(e^ε − 1 + q) for ε ≥ 0, without overflow."""
    return eps + math.log1p((q - 1) * math.exp(-eps)) if q < 1 else eps


def _delta_one_round(eps: float, sigma: float, q: float) -> float:
    """Exact δ(ε) of one Poisson-subsampled Gaussian round (sensitivity 1, add/remove): max of both directions.

    With P = (1−q)N(0, σ²) + qN(1, σ²) (record in) and Q = N(0, σ²) (record out), L = log P/Q increases in x:
    remove: δ = P(x > x*) − e^ε Q(x > x*), x* = ½ + σ² log((e^ε − 1 + q)/q);
    add:    δ = Q(x < x') − e^ε P(x < x'), x' = ½ + σ² log((e^−ε − 1 + q)/q), 0 once e^−ε ≤ 1 − q.
    """
    log_num = _log_e_minus_one_plus(eps, q)
    x = 0.5 + sigma**2 * (log_num - math.log(q))
    a = math.log(q) + log_ndtr(-(x - 1) / sigma)  # q·P(N(1,σ²) > x*)
    b = log_num + log_ndtr(-x / sigma)  # (e^ε − 1 + q)·Q(x > x*)
    remove = math.exp(a) * -math.expm1(b - a) if a > b else 0.0
    add = 0.0
    log_arg = -eps if q == 1 else q + math.expm1(-eps)  # log(e^−ε − 1 + q) for q = 1, else its argument
    if q == 1 or log_arg > 0:
        xp = 0.5 + sigma**2 * ((log_arg if q == 1 else math.log(log_arg)) - math.log(q))
        c = (math.log1p(-(1 - q) * math.exp(eps)) if q < 1 else 0.0) + log_ndtr(xp / sigma)
        d = math.log(q) + eps + log_ndtr((xp - 1) / sigma)
        add = math.exp(c) * -math.expm1(d - c) if c > d else 0.0
    return max(remove, add)


def exact_lower_bound(sigma: float, q: float, rounds: int, delta: float) -> float:
    """A lower bound on the true ε: exact for q = 1 (any T) and for T = 1; ε of one round otherwise."""
    if q == 1:
        sigma, rounds = sigma / math.sqrt(rounds), 1
    if _delta_one_round(0.0, sigma, q) <= delta:
        return 0.0
    hi = 1.0
    while _delta_one_round(hi, sigma, q) > delta:
        hi *= 2
        if hi > 1e300:
            return 0.0  # no usable reference
    lo = 0.0
    for _ in range(300):
        mid = 0.5 * (lo + hi)
        if _delta_one_round(mid, sigma, q) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return lo  # δ(lo) > δ: the true ε is above lo


def test_reference_matches_balle_wang_and_dp_accounting():
    """The reference itself: q = 1 is the analytic Gaussian; q < 1 agrees with dp_accounting's exact profile."""
    from dp_accounting.pld import privacy_loss_mechanism as plm
    from scipy.stats import norm

    s = 1.0
    for e in (0.0, 0.5, 2.0, 4.0):
        bw = norm.cdf(0.5 / s - e * s) - math.exp(e) * norm.cdf(-0.5 / s - e * s)
        assert _delta_one_round(e, s, 1.0) == pytest.approx(bw, rel=1e-9, abs=1e-300)
    for s, q in [(0.8, 0.1), (2.0, 0.5), (0.5, 0.999)]:
        for e in (0.1, 0.7, 2.0):
            ref = max(
                plm.GaussianPrivacyLoss(s, sampling_prob=q, adjacency_type=a).get_delta_for_epsilon(e)
                for a in (plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD)
            )
            assert _delta_one_round(e, s, q) == pytest.approx(ref, rel=1e-7, abs=1e-15)


# --------------------------------------------------------------------------------------------- memory spies
class GridSpy:
    """Fails before dp_accounting allocates any grid, self-convolution or composition above ``budget``."""

    def __init__(self, budget: int):
        self.budget = budget
        self.grids: list[int] = []
        self.convolutions: list[int] = []

    def large_grid_total(self) -> int:  # probe grids (≤ 4096 points + 2) are harmless and not counted
        return sum(n for n in self.grids if n > accounting._PLD_PROBE_POINTS + 2)

    @contextlib.contextmanager
    def active(self, monkeypatch: pytest.MonkeyPatch):
        build = privacy_loss_distribution._create_pld_pmf_from_monotone_privacy_loss
        convolve = pld_common.self_convolve
        dense_compose = pld_pmf.DensePLDPmf.compose

        def spy_build(loss, *args, **kwargs):
            d = kwargs["value_discretization_interval"]
            b = loss.connect_dots_bounds()
            assert (b.epsilon_upper - b.epsilon_lower) / d < 10 * self.budget, "grid far above the budget"
            n = math.ceil(b.epsilon_upper / d) - math.floor(b.epsilon_lower / d) + 1
            assert n <= self.budget, f"grid of {n} points > budget {self.budget}"
            self.grids.append(n)
            return build(loss, *args, **kwargs)

        def spy_convolve(input_list, num_times, tail_mass_truncation=0):
            lo, hi = pld_common.compute_self_convolve_bounds(input_list, num_times, tail_mass_truncation)
            m = max(hi - lo + 1, len(input_list))
            assert m <= self.budget, f"self-convolution of {m} points > budget {self.budget}"
            self.convolutions.append(m)
            return convolve(input_list, num_times, tail_mass_truncation)

        def spy_compose(this, other, tail_mass_truncation=0):
            m = this.size + other.size - 1
            assert m <= self.budget, f"composition of {m} points > budget {self.budget}"
            return dense_compose(this, other, tail_mass_truncation)

        monkeypatch.setattr(privacy_loss_distribution, "_create_pld_pmf_from_monotone_privacy_loss", spy_build)
        monkeypatch.setattr(pld_common, "self_convolve", spy_convolve)
        monkeypatch.setattr(pld_pmf.DensePLDPmf, "compose", spy_compose)
        yield self

    def check_totals(self) -> None:
        assert self.large_grid_total() <= self.budget
        assert sum(self.convolutions) <= self.budget

    def call(self, fn, *args):
        """One accountant call: within the time bound, and its grids together within the budget."""
        self.grids.clear()
        self.convolutions.clear()
        out = timed(fn, *args)
        self.check_totals()
        return out


@contextlib.contextmanager
def small_budget(budget: int = SMALL_BUDGET):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(accounting, "_PLD_MAX_POINTS", budget)
        spy = GridSpy(budget)
        with spy.active(mp):
            yield spy


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    dt = time.perf_counter() - t
    assert dt < TIME_BOUND_S, f"{fn.__name__}{args} took {dt:.1f} s"
    return out


def assert_valid(eps: float, lower: float) -> None:
    assert isinstance(eps, float)
    assert eps == math.inf or (math.isfinite(eps) and eps >= 0)
    assert eps >= lower * (1 - 1e-6) - 1e-6, f"epsilon={eps} below the exact lower bound {lower}"


# ----------------------------------------------------------------------------------------------- strategies
log_uniform = lambda lo, hi: st.floats(math.log10(lo), math.log10(hi)).map(lambda e: 10.0**e)  # noqa: E731
sigmas = log_uniform(1e-9, 1e3)
probabilities = st.one_of(st.just(1.0), log_uniform(1e-6, 1.0), st.floats(-12, -1).map(lambda e: 1 - 10.0**e))
rounds_ = st.one_of(st.integers(1, 20), st.floats(0, 6).map(lambda e: int(10.0**e)))
deltas = log_uniform(1e-12, 0.5)


@settings(max_examples=30, **FAST)
@given(sigma=sigmas, q=probabilities, rounds=rounds_, delta=deltas)
def test_compute_epsilon_is_bounded_and_valid(sigma, q, rounds, delta):
    lower = exact_lower_bound(sigma, q, rounds, delta)
    with small_budget() as spy:
        eps_rdp = spy.call(compute_epsilon, sigma, q, rounds, delta, "rdp")
        assert_valid(eps_rdp, lower)
        eps = spy.call(compute_epsilon, sigma, q, rounds, delta, "pld")
        assert_valid(eps, lower)
        # ε is non-increasing in σ across fast path, coarsened grid and RDP stand-in alike
        assert spy.call(compute_epsilon, 4 * sigma, q, rounds, delta, "pld") <= eps * (1 + 1e-9) + 1e-9


@settings(max_examples=10, **FAST)
@given(sigma_list=st.lists(sigmas, min_size=1, max_size=5), repeat=st.integers(1, 10**5), delta=deltas)
def test_gaussian_composition_is_bounded_and_valid(sigma_list, repeat, delta):
    """k·repeat Gaussian releases: exactly one Gaussian with σ_eff = (Σ σᵢ⁻²)^(-1/2), the exact reference."""
    releases = sigma_list * repeat if len(sigma_list) * repeat <= 1000 else sigma_list
    sigma_eff = math.fsum(s**-2 for s in releases) ** -0.5
    lower = exact_lower_bound(sigma_eff, 1.0, 1, delta)
    with small_budget() as spy:
        for acc in ("rdp", "pld"):
            assert_valid(spy.call(gaussian_composition_epsilon, releases, delta, acc), lower)


@settings(max_examples=6, **FAST)
@given(
    events=st.lists(st.tuples(sigmas, probabilities, st.integers(1, 50)), min_size=1, max_size=3),
    delta=deltas,
)
def test_privacy_accountant_is_bounded_and_valid(events, delta):
    acc = PrivacyAccountant(delta)
    for sigma, q, n in events:
        for _ in range(n):
            acc.record(PoissonGaussianEvent(sigma, q))
    lower = max(exact_lower_bound(s, q, n, delta) for s, q, n in events)
    with small_budget() as spy:
        summary = spy.call(acc.summary)
    assert_valid(summary["epsilon_rdp"], lower)
    assert_valid(summary["epsilon_pld"], lower)
    info = acc.pld_info
    assert info is None or info["method"] in ("pld", "pld-coarse", "rdp")
    if info is not None and info["method"] != "pld":  # the RDP bound caps every non-standard answer
        assert summary["epsilon_pld"] <= summary["epsilon_rdp"]
    if info is not None and info["method"] == "rdp":
        assert math.isnan(summary["pld_discretization"])


@pytest.mark.parametrize("target,q,rounds,delta", [(1.0, 1.0, 10**6, 1e-5), (1e3, 0.999999, 10**6, 1e-12)])
def test_calibration_is_bounded(target, q, rounds, delta):
    with small_budget():
        t = time.perf_counter()
        for acc in ("rdp", "pld"):
            try:
                sigma = calibrate_noise_multiplier(target, q, rounds, delta, acc)
            except ValueError as exc:
                assert "\n" not in str(exc) and "target_epsilon=" in str(exc)
            else:
                assert compute_epsilon(sigma, q, rounds, delta, acc) <= target
        assert time.perf_counter() - t < 6 * TIME_BOUND_S


# --------------------------------------------------------------------------------------------- real budget
EXTREMES = [
    (1e-6, 0.25, 1, 1e-5),  # the 35.5 PiB case
    (1e-9, 1.0, 10**6, 1e-12),
    (1e-9, 1 - 1e-12, 1, 0.5),
    (1e-3, 0.5, 10**6, 1e-5),
    (0.05, 1.0, 1, 1e-5),  # 8e6 points at 1e-4: coarsened
    (1.0, 1.0, 10**4, 1e-5),  # σ/√T = 0.01: beyond 1e4 → RDP
    (0.3, 0.5, 30, 1e-5),
    (1.0, 0.5, 10**4, 1e-5),
    (3.0, 0.999999, 10**6, 1e-12),
    (1e3, 1e-6, 10**6, 0.5),
]


@pytest.mark.parametrize("sigma,q,rounds,delta", EXTREMES)
def test_plan_at_real_budget_fits(sigma, q, rounds, delta):
    """At the shipped budget the plan (nothing built but ≤ 4096-point probes) stays within 2²⁰ points."""
    kinds, _ = accounting._event_kinds({PoissonGaussianEvent(sigma, q): rounds})
    plan = timed(accounting._plan_pld, kinds, lambda: accounting._rdp_epsilon(kinds, delta))
    assert plan.method in ("pld", "pld-coarse", "rdp")
    if plan.method == "rdp":
        assert math.isnan(plan.discretization) and plan.reason
    else:
        assert plan.grid_points <= accounting._PLD_MAX_POINTS
        assert accounting._PLD_DISCRETIZATION <= plan.discretization <= accounting._PLD_MAX_DISCRETIZATION
        assert (plan.method == "pld") == (plan.discretization == accounting._PLD_DISCRETIZATION)


def test_plan_predicts_the_grid_dp_accounting_builds(monkeypatch):
    """The predicted single-grid sizes are exactly dp_accounting's, the self-convolution lengths are bounded
    by the prediction, and the planned discretization is the one PLDAccountant gets."""
    passed = []

    class SpyAccountant(accounting.pld.PLDAccountant):
        def __init__(self, *args, **kwargs):
            passed.append(kwargs["value_discretization_interval"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(accounting.pld, "PLDAccountant", SpyAccountant)
    monkeypatch.setattr(accounting, "_PLD_MAX_POINTS", SMALL_BUDGET)
    spy = GridSpy(SMALL_BUDGET)
    with spy.active(monkeypatch):
        for sigma, q, rounds in [(0.5, 1.0, 1), (1.0, 0.1, 20), (0.3, 0.5, 5)]:
            kinds, _ = accounting._event_kinds({PoissonGaussianEvent(sigma, q): rounds})
            plan = accounting._plan_pld(kinds, lambda: accounting._rdp_epsilon(kinds, 1e-5))
            shapes = [g for e, c in kinds
                      for g in accounting._grid_shapes(e, c, accounting._loss_ranges(e, c), plan.discretization)]
            spy.grids.clear()
            spy.convolutions.clear()
            compute_epsilon(sigma, q, rounds, 1e-5, "pld")
            assert plan.method != "rdp" and passed[-1] == plan.discretization
            final = spy.grids[-len(shapes):]  # probes (planning) come first; the final grids last
            assert final == [g.built_points(plan.discretization) for g in shapes]
            if rounds > 1 and q < 1:
                assert len(spy.convolutions) == len(shapes)
                for g, m in zip(shapes, spy.convolutions):
                    assert m <= g.points(plan.discretization)
            assert sum(g.points(plan.discretization) for g in shapes) == plan.grid_points <= SMALL_BUDGET


@contextlib.contextmanager
def address_space_limit(extra: int = 2 << 30):
    """RLIMIT_AS = what this process already maps + ``extra``: a runaway allocation raises MemoryError here
    instead of exhausting the machine. The soft limit is restored afterwards (the hard one never changes)."""
    with open("/proc/self/status") as f:
        vm = int(f.read().split("VmSize:")[1].split()[0]) * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = vm + extra if hard == resource.RLIM_INFINITY else min(vm + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_regression_35_pib_case_returns_promptly():
    """PLD ε of a q = 0.25 Gaussian with σ = 1e-6, 1 round, δ = 1e-5 asked numpy for 35.5 PiB (a smaller
    allocation would have exhausted the machine). Run for real, without spies, under +2 GiB of address space."""

    def accountant_summary(sigma, q, delta):
        acc = PrivacyAccountant(delta)
        acc.record(PoissonGaussianEvent(sigma, q))
        return acc.summary()["epsilon_pld"]

    lower = exact_lower_bound(1e-6, 0.25, 1, 1e-5)
    assert lower > 4e11  # σ → 0: ε ≈ 1/(2σ²) = 5e11 as long as δ < q
    with address_space_limit():
        assert_valid(timed(compute_epsilon, 1e-6, 0.25, 1, 1e-5, "pld"), lower)
        assert_valid(timed(compute_epsilon, 1e-6, 0.25, 1, 1e-5, "rdp"), lower)
        assert_valid(timed(accountant_summary, 1e-6, 0.25, 1e-5), lower)
        assert_valid(timed(gaussian_composition_epsilon, [1e-6], 1e-5, "pld"), exact_lower_bound(1e-6, 1, 1, 1e-5))
        assert_valid(timed(compute_epsilon, 1e-6, 1.0, 10**6, 1e-5, "pld"), exact_lower_bound(1e-6, 1, 10**6, 1e-5))


# ------------------------------------------------------------------------------------------- edge handling
def test_extreme_noise_multipliers_give_valid_bounds():
    # below 1e-30: no noise (dp_accounting's RDP returned ε = 0 at σ = 1e-154 with q = 0.5)
    for acc in ("rdp", "pld"):
        assert compute_epsilon(1e-154, 0.5, 1, 1e-5, acc) == math.inf
        assert compute_epsilon(1e-300, 1.0, 1, 1e-5, acc) == math.inf
        assert compute_epsilon(1e-29, 0.5, 1, 1e-5, acc) > 1e50
        # above 1e100: counted as 1e100 (dp_accounting's PLD overflowed at σ ≈ 1e154); its loss is 0 in
        # floating point, and dp_accounting would self-compose that one-point grid 10⁶ times one by one
        assert 0 <= timed(compute_epsilon, 1e300, 0.5, 10**6, 1e-5, acc) < 1e-6
        assert 0 <= gaussian_composition_epsilon([1e300, 1e299], 1e-5, acc) < 1e-6
        assert gaussian_composition_epsilon([2.0, 1e-31], 1e-5, acc) == math.inf
    kinds, _ = accounting._event_kinds({PoissonGaussianEvent(1e300, 0.5): 10**6})
    assert accounting._plan_pld(kinds, lambda: 0.0).reason == "one-point grid composed 1000000 times"


def test_many_distinct_gaussians_compose_as_one():
    sigmas_ = [20.0 + i / 10 for i in range(300)]  # σ_eff ≈ 1.4
    sigma_eff = math.fsum(s**-2 for s in sigmas_) ** -0.5
    for acc in ("rdp", "pld"):
        got = timed(gaussian_composition_epsilon, sigmas_, 1e-5, acc)
        assert got == pytest.approx(compute_epsilon(sigma_eff, 1.0, 1, 1e-5, acc), rel=1e-6)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(rounds=10**19), r"rounds=10000000000000000000 is outside \[1, 1e\+18\]"),
        (dict(noise_multiplier=math.nan), "noise_multiplier=nan is outside"),
        (dict(noise_multiplier=math.inf), "noise_multiplier=inf is outside"),
        (dict(delta=math.nan), "delta=nan is outside"),
        (dict(sampling_probability=math.nan), "sampling_probability=nan is outside"),
    ],
)
def test_bad_values_raise_one_line_value_error(kwargs, match):
    args = dict(noise_multiplier=1.0, sampling_probability=0.1, rounds=10, delta=1e-5, accountant="pld")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match) as info:
        compute_epsilon(**args)
    assert "\n" not in str(info.value)


def test_pld_info_reports_the_fallback():
    acc = PrivacyAccountant(1e-5)
    acc.record(GaussianEvent(1e-6))
    s = acc.summary()
    assert acc.pld_info["method"] == "rdp" and math.isnan(s["pld_discretization"])
    assert s["epsilon_pld"] == s["epsilon_rdp"] > 1e11
    normal = PrivacyAccountant(1e-5)
    for _ in range(3):
        normal.record(PoissonGaussianEvent(2.0, 0.1))
    assert normal.summary()["pld_discretization"] == 1e-4 and normal.pld_info["method"] == "pld"
