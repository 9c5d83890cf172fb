"""The claim test (fedrun.reports.stats): Welch's t against scipy.stats.ttest_ind(equal_var=False), TOST, Holm, and
by simulation with no true effect: a decisive verdict at most at the stated α (the old 2·SE rule: about 12 %)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from fedrun.reports import common as c
from fedrun.reports import stats

RNG = np.random.default_rng(20240601)


@pytest.mark.parametrize("n1,n2", [(2, 2), (3, 3), (3, 5), (6, 4)])
def test_welch_is_scipys_unequal_variance_statistic_with_hsus_degrees_of_freedom(n1, n2):
    for _ in range(20):
        a, b = RNG.normal(0.8, RNG.uniform(0.001, 0.05), n1), RNG.normal(0.79, RNG.uniform(0.001, 0.05), n2)
        w = stats.welch([a, b], [1.0, -1.0])
        ref = st.ttest_ind(a, b, equal_var=False)
        assert w.d / w.se == pytest.approx(ref.statistic, rel=1e-10) and w.df == min(n1, n2) - 1
        assert w.p_above(0) == pytest.approx(st.t.sf(ref.statistic, min(n1, n2) - 1), rel=1e-10)
        assert w.p_below(0) == pytest.approx(st.t.cdf(ref.statistic, min(n1, n2) - 1), rel=1e-10)
        assert stats.decide(*stats.p_values(w, ">", 0.0))[0] == pytest.approx(
            2 * st.t.sf(abs(ref.statistic), min(n1, n2) - 1))   # both sides at α/2
        assert w.df <= ref.df   # never more degrees of freedom than Satterthwaite's: wider intervals


@pytest.mark.parametrize("n,ratio", [(3, 4.0), (5, 10.0)])
def test_with_no_true_difference_a_verdict_comes_at_most_five_percent_of_the_time(n, ratio):
    """40,000 pairs of cells with equal means and spreads ratio:1, each decided by the claim test (both directions at
    α/2): the decisive rate is at most α plus three Monte Carlo standard errors (with Satterthwaite's df it is 5.8 %
    at n = 3, ratio 4, seven standard errors above: the reason for Hsu's)."""
    reps, rng = 40_000, np.random.default_rng(7)
    a, b = rng.normal(0, ratio, (reps, n)), rng.normal(0, 1.0, (reps, n))
    decided = sum(stats.decide(*stats.p_values(stats.welch([x, y], [1.0, -1.0]), ">", 0.0))[0] <= stats.ALPHA
                  for x, y in zip(a, b))
    assert decided / reps <= stats.ALPHA + 3 * math.sqrt(stats.ALPHA * (1 - stats.ALPHA) / reps)


@pytest.mark.parametrize("looks,most", [(1, 0.1), (3, stats.ALPHA)])
def test_a_look_before_adding_seeds_is_paid_for(looks, most):
    """No true difference: looks at 3 and 6 seeds per cell, seeds added when inconclusive, the verdict read again at
    10 (FTL-c's history in results/fbftl). Unpaid (p as it is) the design is decisive more than α of the time; with
    p × 3 (Bonferroni over the three looks, the registries' ``looks``) at most α plus three Monte Carlo standard
    errors."""
    reps, rng, decisive = 10_000, np.random.default_rng(11), 0
    for a, b in zip(rng.normal(0, 1, (reps, 10)), rng.normal(0, 2, (reps, 10))):
        for n in (3, 6, 10):
            p = stats.decide(*stats.p_values(stats.welch([a[:n], b[:n]], [1.0, -1.0]), ">", 0.0))[0]
            if min(1.0, p * looks) <= stats.ALPHA:
                decisive += 1
                break
    rate, se = decisive / reps, math.sqrt(stats.ALPHA * (1 - stats.ALPHA) / reps)
    assert rate <= most + 3 * se
    if looks == 1:
        assert rate > stats.ALPHA + 3 * se   # the reason for paying


def test_a_contrast_of_four_cells_and_a_cell_against_a_number():
    cells = [RNG.normal(m, s, n) for m, s, n in ((0.8, 0.01, 3), (0.7, 0.02, 3), (0.6, 0.03, 4), (0.55, 0.01, 3))]
    w = stats.welch(cells, [1, -1, -1, 1])
    v = [np.var(x, ddof=1) / len(x) for x in cells]
    assert w.d == pytest.approx(np.mean(cells[0]) - np.mean(cells[1]) - np.mean(cells[2]) + np.mean(cells[3]))
    assert w.se == pytest.approx(math.sqrt(sum(v)))
    assert w.df == 2   # min(nᵢ) − 1 over the cells of the contrast
    one = stats.welch([cells[2]], [1.0])   # one cell against a number: the one-sample t test
    ref = st.ttest_1samp(cells[2], 0.65, alternative="less")
    assert one.df == len(cells[2]) - 1 and stats.p_values(one, "<", 0.65)[0] == pytest.approx(ref.pvalue)
    assert stats.welch([[0.5], cells[0]], [1, -1]) is None   # one seed: no spread, no test


def test_tost_is_two_shifted_one_sided_tests():
    a, b = RNG.normal(0.80, 0.004, 3), RNG.normal(0.795, 0.004, 3)
    w = stats.welch([a, b], [1.0, -1.0])
    met, _ = stats.p_values(w, "≈", 0.02)
    hsu = lambda x, y: st.t.sf(st.ttest_ind(x, y, equal_var=False).statistic, 2)  # noqa: E731 (df min(3, 3) − 1)
    lower, upper = hsu(a, b - 0.02), hsu(b + 0.02, a)   # H₀: d ≤ −0.02, H₀: d ≥ +0.02
    assert met == pytest.approx(max(lower, upper))
    centered, _ = stats.p_values(stats.welch([a, b - 0.3], [1.0, -1.0]), "≈", 0.02, center=0.3)
    assert centered == pytest.approx(met)


def test_holm_and_the_combinations():
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.combine([(0.01, 0.9), (0.2, 0.3)]) == (0.2, 0.6)                  # all: largest met, Bonferroni not
    assert stats.combine([(0.01, 0.9), (0.2, 0.3)], any_=True) == (0.02, 0.9)      # any: Bonferroni met, largest not
    assert stats.decide(0.01, 0.9) == (0.02, True) and stats.decide(0.7, 0.001) == (0.002, False)


def _verdict(ps: tuple[float, float]) -> str | None:
    """met / not met at α for one claim's (p met, p not met), None when inconclusive."""
    p, met = stats.decide(*ps)
    return ("met" if met else "not met") if p <= stats.ALPHA else None


def _ps(a, b, kind=">", bound=0.0) -> tuple[float, float]:
    return stats.p_values(stats.welch([a, b], [1.0, -1.0]), kind, bound)


def test_with_no_true_effect_a_decisive_verdict_comes_at_most_at_alpha():
    """3 seeds per arm, no true difference: the Welch rule is decisive in ≈ 5 % of the cases (Monte Carlo, 8,000
    draws: 3 standard errors of slack), the old rule (|d| > 2·SE) in about 12 %; an any-of claim of 5 comparisons
    against one reference says met in at most α/2 (each side is tested at α/2); TOST at its margin says met in at
    most α/2."""
    n = 8000
    draws = RNG.normal(0.0, 1.0, (n, 7, 3))
    rate = np.mean([_verdict(_ps(x[0], x[1])) is not None for x in draws])
    old = np.mean([abs(x[0].mean() - x[1].mean()) > 2 * math.sqrt(x[0].var(ddof=1) / 3 + x[1].var(ddof=1) / 3)
                   for x in draws])
    slack = 3 * math.sqrt(0.05 * 0.95 / n)
    print(f"simulated decisive rate with no true effect: Welch rule {rate:.4f}, old 2·SE rule {old:.4f}")
    assert rate <= stats.ALPHA + slack and 0.09 < old < 0.15
    slack = 3 * math.sqrt(0.025 * 0.975 / 3000)
    any_met = np.mean([_verdict(stats.combine([_ps(x[k], x[0]) for k in range(1, 6)], any_=True)) == "met"
                       for x in draws[:3000]])
    tost = np.mean([_verdict(_ps(x[0] + 0.5, x[1], "≈", 0.5)) == "met" for x in draws[:3000]])
    print(f"any of 5 against one reference: false met {any_met:.4f}; TOST at its margin: met {tost:.4f}")
    assert any_met <= stats.ALPHA / 2 + slack and tost <= stats.ALPHA / 2 + slack


@pytest.mark.parametrize("seeds", [4, 5, 10])
def test_a_second_look_costs_less_than_twice_alpha(seeds):
    """Seeds added after the 3-seed verdicts, read again (Table III's seed 3: results/kerkouche21/table3.template.md;
    FedSKETCH's seeds 3 and 4: results/fedsketch/figures.template.md; FbFTL's seeds 3–9: results/fbftl/
    table.template.md): read at 3 or at the new count, whichever is decisive, a comparison with no true difference
    is decisive in ≈ 5.7 % at 3-or-4, ≈ 6.3 % at 3-or-5 and ≈ 7.4 % at 3-or-10 (8,000 draws, before Holm), against
    ≈ 4 % at 4, 5 or 10 seeds alone: above α at worst, below 2α."""
    n = 8000
    x = np.random.default_rng(1).normal(0.0, 1.0, (n, 2, seeds))
    d3 = np.array([_verdict(_ps(v[0, :3], v[1, :3])) is not None for v in x])
    dk = np.array([_verdict(_ps(v[0], v[1])) is not None for v in x])
    print(f"no true effect: decisive at {seeds} seeds {dk.mean():.4f}, at 3 or {seeds} {(d3 | dk).mean():.4f}")
    slack = 3 * math.sqrt(0.1 * 0.9 / n)
    assert dk.mean() <= stats.ALPHA + slack and dk.mean() < (d3 | dk).mean() <= 2 * stats.ALPHA + slack


def test_seeds_needed_grows_as_the_difference_shrinks():
    a, b = RNG.normal(0.80, 0.02, 3), RNG.normal(0.79, 0.02, 3)
    w = stats.welch([a, b], [1.0, -1.0])
    big, small = stats.seeds_needed(w, 0.05), stats.seeds_needed(w, 0.01)
    assert big and small and 2 <= big < small and stats.seeds_needed(w, 0.0) is None
    assert stats.seeds_needed(w, 0.05, stats.ALPHA / 40) > big      # a family's stricter level asks for more seeds


# ------------------------------------------------------------------------------------ claims in a report
def _report(cells: dict[str, list[float]]) -> c.Report:
    rows = [{"run_id": f"{k}{i}", "status": "FINISHED", "start_time": i, "end_time": None, "tags.scheme": k,
             "params.seed": str(i), "metrics.acc": v} for k, vs in cells.items() for i, v in enumerate(vs)]
    df = pd.DataFrame(rows, dtype=object)
    df["scheme"], df["seed"] = c.column(df, "tags.scheme"), c.column(df, "params.seed", kind=int)
    df["acc"] = df["metrics.acc"].astype(float)
    return c.Report("t", Path("."), "results/x/t.md", [], df, c.dims(scheme={}, seed={}))


def test_claims_are_decided_after_holm_over_the_report():
    rep = _report({"a": [0.80, 0.81, 0.82], "b": [0.70, 0.71, 0.72], "d": [0.805, 0.84, 0.78], "e": [0.5]})
    a, b, d, e, f = ({"scheme": k} for k in "abdef")
    claims = [c.Claim("a beats b", "acc", (c.gt(a, b),)), c.Claim("b beats a", "acc", (c.gt(b, a),)),
              c.Claim("a beats d", "acc", (c.gt(a, d),)), c.Claim("a beats e", "acc", (c.gt(a, e),)),
              c.Claim("b or d beats a", "acc", (c.gt(b, a), c.gt(d, a)), any=True),
              c.Claim("by construction", "acc", (), fixed=("by construction", "same bytes")),
              c.Claim("a beats f", "acc", (c.gt(a, f),))]
    got = rep.verdicts(claims)
    assert [v for v, _ in got] == ["met", "not met", "inconclusive", "inconclusive", "inconclusive",
                                   "by construction", "not attempted"]
    assert "one seed in a cell, no spread" in got[3][1] and got[6][1] == "no runs of scheme = f"
    assert "difference +0.100 (95 % CI" in got[0][1] and "Holm-adjusted p" in got[0][1]
    assert "(the secondary family of 4)" in got[0][1]
    assert "seeds per cell for 80 % power" in got[2][1] and got[4][1].startswith("any of: ")
    text = rep.claims(claims, got)
    assert "Welch's t with the conservative degrees of freedom min(nᵢ) − 1" in text and "- a beats b: **met** — " in text
    assert "secondary family: 4 here)" in text


def test_a_claims_p_is_paid_for_its_looks_and_the_families_are_apart():
    """looks = 2 doubles the claim's p (Bonferroni over the looks); a primary claim is corrected with the primary
    claims only, and is judged on its seeds, the others shown as exploratory."""
    rep = _report({"a": [0.80, 0.81, 0.82], "b": [0.70, 0.71, 0.72]})
    a, b = {"scheme": "a"}, {"scheme": "b"}
    once, twice = (rep.test(c.Claim("a beats b", "acc", (c.gt(a, b),), looks=k)) for k in (1, 2))
    assert twice["p"] == pytest.approx(2 * once["p"]) and "× 2 looks" in twice["text"]
    claims = [c.Claim("P", "acc", (c.gt(a, b),), family="primary", seeds=(0, 1)),
              c.Claim("S", "acc", (c.gt(b, a),)), c.Claim("S2", "acc", (c.gt(b, a),))]
    got = rep.verdicts(claims)
    assert "(the primary family of 1)" in got[0][1] and "(the secondary family of 2)" in got[1][1]
    assert "n=2" in got[0][1] and "Exploratory seeds 2 (run before the registry, not judged)" in got[0][1]


def test_the_family_is_the_papers_claims_in_all_its_reports():
    """The other reports' raw p-values (FAMILY) join the Holm step-down: a claim met alone is inconclusive in a
    family of 40 (39 p-values of 0.5); with FAMILY None a report only hands its raw p-values over."""
    rep = _report({"a": [0.80, 0.83, 0.86], "b": [0.70, 0.74, 0.69]})
    claims = [c.Claim("a beats b", "acc", (c.gt({"scheme": "a"}, {"scheme": "b"}),))]
    alone = rep.verdicts(claims)
    c.FAMILY = {"other": [{"family": "secondary", "p": 0.5, "met": True}] * 39}
    try:
        joined = rep.verdicts(claims)
        assert "39 in other" in rep.claims(claims, joined)
        c.FAMILY = None
        with pytest.raises(c.Collected) as raw:
            rep.verdicts(claims)
    finally:
        c.FAMILY = {}
    assert alone[0][0] == "met" and joined[0][0] == "inconclusive" and "(the secondary family of 40)" in joined[0][1]
    assert [t["p"] for t in raw.value.args[0]] == pytest.approx([stats.welch([[0.80, 0.83, 0.86], [0.70, 0.74, 0.69]],
                                                                              [1, -1]).p_above(0) * 2])


def test_logrank_p_is_small_for_the_cell_that_reaches_the_target_sooner():
    """Five runs at 1…5 s against five at 10…14 s: the claim "the first is sooner" has the small one-sided p (the
    log-rank statistic with no ties here: p ≈ 0.0009), the opposite claim the large one; a run that never reached
    the target (censored at its whole time) counts against its cell."""
    import numpy as np

    from fedrun.reports.stats import km_median, logrank_p

    fast, slow = (np.arange(1.0, 6.0), np.ones(5, bool)), (np.arange(10.0, 15.0), np.ones(5, bool))
    p_met, p_not = logrank_p(fast, slow)
    assert p_met < 0.001 < 0.999 < p_not
    assert logrank_p(slow, fast) == (p_not, p_met)
    assert km_median(*fast) == 3.0
    never = (np.array([1.0, 2.0, 30.0, 30.0, 30.0]), np.array([True, True, False, False, False]))
    assert np.isnan(km_median(*never))  # fewer than half reached it
