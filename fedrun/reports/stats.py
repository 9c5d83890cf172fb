"""The claim test, for a few seeds per cell: Welch's t on a contrast of cell means d = Σ cᵢ·mean(cellᵢ),
Var(d) = Σ cᵢ²·sᵢ²/nᵢ, with the conservative degrees of freedom min(nᵢ) − 1 (Hsu's; Satterthwaite's are
anti-conservative at 3–5 seeds per cell with unequal spreads: 5.8 % decisive at a nominal 5 %, spreads 4:1, n = 3),
tested in both directions, each one-sided at α/2; two one-sided tests (TOST) for "within x"; Holm's step-down for
several comparisons and for a family. Pure numbers."""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np
from scipy import stats

ALPHA = 0.05
POWER = 0.8


class Welch(NamedTuple):
    d: float            # the contrast's estimate
    se: float           # its standard error
    df: float           # min(nᵢ) − 1 over the contrast's cells (inf when every variance is 0)
    parts: tuple        # cᵢ²·sᵢ²/nᵢ per cell, with nᵢ (to size a study)

    def ci(self) -> tuple[float, float]:
        """The two-sided 1 − α confidence interval of d."""
        h = self.se * (stats.t.ppf(1 - ALPHA / 2, self.df) if self.se > 0 else 0.0)
        return self.d - h, self.d + h

    def p_above(self, bound: float) -> float:
        """One-sided p of H₀: d ≤ bound against d > bound."""
        if self.se == 0:
            return 0.0 if self.d > bound else 1.0
        return float(stats.t.sf((self.d - bound) / self.se, self.df))

    def p_below(self, bound: float) -> float:
        """One-sided p of H₀: d ≥ bound against d < bound."""
        if self.se == 0:
            return 0.0 if self.d < bound else 1.0
        return float(stats.t.cdf((self.d - bound) / self.se, self.df))


def welch(samples: Sequence[Sequence[float]], coefs: Sequence[float]) -> Welch | None:
    """The contrast Σ cᵢ·mean(samplesᵢ); None when a sample has fewer than 2 values (no spread)."""
    if any(len(s) < 2 for s in samples):
        return None
    parts = tuple((c * c * float(np.var(s, ddof=1)) / len(s), len(s)) for s, c in zip(samples, coefs))
    var = sum(v for v, _ in parts)
    df = float(min(n for (_, n), c in zip(parts, coefs) if c) - 1) if var > 0 else math.inf
    return Welch(sum(c * float(np.mean(s)) for s, c in zip(samples, coefs)), math.sqrt(var), df, parts)


def p_values(w: Welch, kind: str, bound: float, center: float = 0.0) -> tuple[float, float]:
    """(p of *met*, p of *not met*): ``>`` the claim d > bound, ``<`` the other way; ``≈`` |d − center| < bound by
    TOST (not met: d shown outside center ± bound, either side, Bonferroni over the two)."""
    if kind == ">":
        return w.p_above(bound), w.p_below(bound)
    if kind == "<":
        return w.p_below(bound), w.p_above(bound)
    lo, hi = center - bound, center + bound
    return max(w.p_above(lo), w.p_below(hi)), min(1.0, 2 * min(w.p_below(lo), w.p_above(hi)))


def distance(w: Welch, kind: str, bound: float, center: float = 0.0) -> float:
    """How far the estimate is from the boundary that would decide the comparison (for :func:`seeds_needed`)."""
    return abs(w.d - bound) if kind != "≈" else abs(bound - abs(w.d - center))


def combine(ps: Sequence[tuple[float, float]], any_: bool = False) -> tuple[float, float]:
    """A claim of several comparisons: all must hold (met by the largest p, not met by Bonferroni on the smallest),
    or with ``any_`` one must (the other way round)."""
    met, nots, m = [p for p, _ in ps], [q for _, q in ps], len(ps)
    return (min(1.0, m * min(met)), max(nots)) if any_ else (max(met), min(1.0, m * min(nots)))


def decide(p_met: float, p_not: float) -> tuple[float, bool]:
    """(the claim's p, its direction: True for met): both directions at α/2, i.e. p = 2·min(p_met, p_not)."""
    return min(1.0, 2 * min(p_met, p_not)), p_met <= p_not


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (a verdict at α after adjustment holds the family's error at α)."""
    out, running = [1.0] * len(ps), 0.0
    for rank, i in enumerate(sorted(range(len(ps)), key=lambda i: ps[i])):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def seeds_needed(w: Welch, margin: float, alpha: float = ALPHA, cap: int = 1000) -> int | None:
    """Seeds per cell giving a test at α/2 one-sided 80 % power, were the true distance from the claim's boundary
    ``margin`` and each cell's spread the observed one; None above ``cap`` or for 0."""
    if margin <= 0 or w.se == 0:
        return None
    n = np.arange(2, cap + 1)
    unit = sum(v * k for v, k in w.parts)   # Σ cᵢ²·sᵢ² : the variance of d with one seed per cell
    df = n - 1.0
    ok = margin * np.sqrt(n / unit) >= stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(POWER, df)
    return int(n[ok][0]) if ok.any() else None


def logrank_p(fast: tuple, slow: tuple) -> tuple[float, float]:
    """(p of *met*, p of *not met*) for "``fast`` reaches the target sooner than ``slow``": each a (times, reached)
    pair, right-censored where not reached; scipy's log-rank test, one-sided each way (``greater``: the first group's
    event rate, reaching the target, is the higher one)."""
    x, y = (stats.CensoredData(uncensored=t[r], right=t[~r]) for t, r in (fast, slow))
    return float(stats.logrank(x, y, alternative="greater").pvalue), float(stats.logrank(x, y, alternative="less").pvalue)


def km_median(times, reached) -> float:
    """The Kaplan–Meier median time (NaN when fewer than half the runs reached the target)."""
    sf = stats.ecdf(stats.CensoredData(uncensored=times[reached], right=times[~reached])).sf
    below = sf.quantiles[sf.probabilities <= 0.5]
    return float(below[0]) if len(below) else math.nan
