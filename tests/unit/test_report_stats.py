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
def test_welch_is_scipys_unequal_variance_t_test(n1, n2):
    for _ in range(20):
        a, b = RNG.normal(0.8, RNG.uniform(0.001, 0.05), n1), RNG.normal(0.79, RNG.uniform(0.001, 0.05), n2)
        w = stats.welch([a, b], [1.0, -1.0])
        ref = st.ttest_ind(a, b, equal_var=False)
        assert w.d / w.se == pytest.approx(ref.statistic, rel=1e-10) and w.df == pytest.approx(ref.df, rel=1e-10)
        assert w.p_above(0) == pytest.approx(st.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue)
        assert w.p_below(0) == pytest.approx(st.ttest_ind(a, b, equal_var=False, alternative="less").pvalue)
        assert w.ci() == pytest.approx(tuple(ref.confidence_interval(0.95)), rel=1e-9)
        assert stats.decide(*stats.p_values(w, ">", 0.0))[0] == pytest.approx(ref.pvalue)   # both sides at α/2


def test_a_contrast_of_four_cells_and_a_cell_against_a_number():
    cells = [RNG.normal(m, s, n) for m, s, n in ((0.8, 0.01, 3), (0.7, 0.02, 3), (0.6, 0.03, 4), (0.55, 0.01, 3))]
    w = stats.welch(cells, [1, -1, -1, 1])
    v = [np.var(x, ddof=1) / len(x) for x in cells]
    assert w.d == pytest.approx(np.mean(cells[0]) - np.mean(cells[1]) - np.mean(cells[2]) + np.mean(cells[3]))
    assert w.se == pytest.approx(math.sqrt(sum(v)))
    assert w.df == pytest.approx(sum(v) ** 2 / sum(x * x / (len(c_) - 1) for x, c_ in zip(v, cells)))
    one = stats.welch([cells[2]], [1.0])   # one cell against a number: the one-sample t test
    ref = st.ttest_1samp(cells[2], 0.65, alternative="less")
    assert one.df == len(cells[2]) - 1 and stats.p_values(one, "<", 0.65)[0] == pytest.approx(ref.pvalue)
    assert stats.welch([[0.5], cells[0]], [1, -1]) is None   # one seed: no spread, no test


def test_tost_is_two_shifted_one_sided_tests():
    a, b = RNG.normal(0.80, 0.004, 3), RNG.normal(0.795, 0.004, 3)
    w = stats.welch([a, b], [1.0, -1.0])
    met, _ = stats.p_values(w, "≈", 0.02)
    lower = st.ttest_ind(a, b - 0.02, equal_var=False, alternative="greater").pvalue   # H₀: d ≤ −0.02
    upper = st.ttest_ind(a, b + 0.02, equal_var=False, alternative="less").pvalue      # H₀: d ≥ +0.02
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
    assert "difference +0.100 (95 % CI" in got[0][1] and "Holm-adjusted p" in got[0][1] and "(family of 4)" in got[0][1]
    assert "seeds per cell for 80 % power" in got[2][1] and got[4][1].startswith("any of: ")
    text = rep.claims(claims, got)
    assert "Welch's t with Satterthwaite's degrees of freedom" in text and "- a beats b: **met** — " in text
    assert "family of tested claims: 4 here." in text


def test_the_family_is_the_papers_claims_in_all_its_reports():
    """The other reports' raw p-values (FAMILY) join the Holm step-down: a claim met alone is inconclusive in a
    family of 40 (39 p-values of 0.5); with FAMILY None a report only hands its raw p-values over."""
    rep = _report({"a": [0.80, 0.83, 0.86], "b": [0.70, 0.74, 0.69]})
    claims = [c.Claim("a beats b", "acc", (c.gt({"scheme": "a"}, {"scheme": "b"}),))]
    alone = rep.verdicts(claims)
    c.FAMILY = {"other": [0.5] * 39}
    try:
        joined = rep.verdicts(claims)
        assert "39 in other" in rep.claims(claims, joined)
        c.FAMILY = None
        with pytest.raises(c.Collected) as raw:
            rep.verdicts(claims)
    finally:
        c.FAMILY = {}
    assert alone[0][0] == "met" and joined[0][0] == "inconclusive" and "(family of 40)" in joined[0][1]
    assert raw.value.args[0] == pytest.approx([stats.welch([[0.80, 0.83, 0.86], [0.70, 0.74, 0.69]],
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
