r"""Empirical privacy audit from canary clients: canaries, their scores, and a lower bound on ε from the scores.

Pure math (torch / numpy / scipy): no I/O; randomness comes in as a ``torch.Generator``.

Setting. The run inserts canary clients whose transmitted vector is a random direction of L2 norm S, the
clipping bound of the client-level DP sum, in the domain that sum clips (the transmitted vector of dimension d;
``make_canaries``). Each canary is included at random with probability 1/2. After the one training run every
canary is scored by its cosine with the observed vector (``canary_scores``): e.g. a round's aggregated noisy
update in the same domain, or the final model delta. The scores must be oriented so that inserted canaries
score *higher*: if the observed vector is a descent-convention model delta θ_T − θ_0 (θ ← θ − η·update), pass
its negative.

The scores and the inclusion mask give ε at the run's δ (``audit_epsilon``, method ``"steinke"``): Steinke,
Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023 (arXiv:2305.08846). Each of m
canaries is included independently with probability 1/2; the auditor guesses "in" for the k₊ highest scores,
"out" for the k₋ lowest, and abstains otherwise (their Alg. 1); with r guesses and v of them correct, their main
theorem for (ε, δ)-DP bounds
    P[W ≥ v] ≤ f(v) + 2mδ · max_{i=1..m} (f(v − i) − f(v))/i,   f(v) = P[Binomial(r, e^ε/(1 + e^ε)) ≥ v],
so the largest ε whose p-value is below β = 1 − confidence is rejected: a lower bound at confidence 1 − β.
``steinke_p_value`` / ``steinke_epsilon`` follow the code of their Appendix D (``p_value_DP_audit``,
``get_eps_audit``; max over i ≤ v suffices since f(v − i) = 1 for i ≥ v), solved with Brent's method instead of
30 bisections. Like their experiments we sweep the number of guesses and keep the best bound; unlike a bare
maximum, each of the G settings is tested at level β/G (Bonferroni), so the reported bound holds at confidence
1 − β; the uncorrected maximum is kept as ``epsilon_unadjusted`` for comparison. The bound is valid whatever the
mechanism but loose: with m canaries it cannot exceed logit(β^{1/r}) (all r ≤ m guesses right), ≈ 5.2 for
r = 900, β = 0.05/7.
"""

from __future__ import annotations

import math
import numbers
import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from scipy import optimize, special
from torch import Tensor

__all__ = [
    "AUDIT_METHODS",
    "AuditResult",
    "SteinkeFit",
    "make_canaries",
    "canary_scores",
    "steinke_p_value",
    "steinke_epsilon",
    "steinke_guesses",
    "default_guess_grid",
    "steinke_bound",
    "audit_epsilon",
]

AUDIT_METHODS = ("steinke",)
ScoresLike = Tensor | np.ndarray | Sequence[float]
_XTOL = 1e-10


# -------------------------------------------------------------------------------------------------- checks
def _check_int_at_least(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name}={value!r} is outside [{low}, inf); it must be an integer")
    return int(value)


def _check_positive_finite(name: str, value: float) -> float:
    if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} is outside (0, inf); it must be a finite positive number")
    return float(value)


def _check_nonnegative(name: str, value: float) -> float:
    if not (isinstance(value, numbers.Real) and not math.isnan(value) and value >= 0):
        raise ValueError(f"{name}={value!r} is outside [0, inf]")
    return float(value)


def _check_open_unit(name: str, value: float) -> float:
    if not (isinstance(value, numbers.Real) and 0 < value < 1):
        raise ValueError(f"{name}={value!r} is outside (0, 1)")
    return float(value)


def _scores(name: str, scores: ScoresLike, min_size: int) -> np.ndarray:
    arr = scores.detach().cpu().double().numpy() if isinstance(scores, Tensor) else np.asarray(scores, np.float64)
    if arr.ndim != 1 or arr.size < min_size:
        raise ValueError(f"{name} has shape {arr.shape}; expected a 1-D array of at least {min_size} scores")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has {int(np.sum(~np.isfinite(arr)))} non-finite scores; all must be finite")
    return arr


def _mask(included: ScoresLike, size: int) -> np.ndarray:
    arr = included.detach().cpu().numpy() if isinstance(included, Tensor) else np.asarray(included)
    if arr.shape != (size,) or not np.all((arr == 0) | (arr == 1)):
        raise ValueError(f"included has shape {arr.shape}; expected ({size},) booleans (1 = inserted)")
    return arr.astype(bool)


# ------------------------------------------------------------------------------------------ canaries, scores
def make_canaries(
    num: int,
    dim: int,
    norm: float,
    generator: torch.Generator,
    *,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """[num, dim] i.i.d. directions uniform on the sphere S^{dim−1}, each scaled to L2 norm ``norm``.

    A standard Gaussian row divided by its norm is uniform on the sphere (rotation invariance). Drawn on the
    generator's device. For a large model draw the canaries in chunks (one generator state per chunk).
    """
    num = _check_int_at_least("num", num, 1)
    dim = _check_int_at_least("dim", dim, 1)
    norm = _check_positive_finite("norm", norm)
    g = torch.randn((num, dim), generator=generator, device=generator.device, dtype=dtype)
    lengths = torch.linalg.vector_norm(g, dim=1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
    return g * (norm / lengths)


def canary_scores(canaries: Tensor, observed: Tensor) -> Tensor:
    """Cosine of each canary (row of [num, dim]) with the observed vector [dim]: a float64 tensor [num].

    ``observed``: the total aggregated update the server saw over the run, in the DP sum's domain (or the final
    model delta, oriented so that an inserted canary pushes it towards the canary).
    """
    if canaries.dim() != 2 or observed.dim() != 1 or canaries.shape[1] != observed.shape[0]:
        raise ValueError(
            f"canaries {tuple(canaries.shape)} and observed {tuple(observed.shape)} must be [num, dim] and [dim]"
        )
    c = canaries.to(torch.float64)
    o = observed.to(device=c.device, dtype=torch.float64)
    o_norm = float(torch.linalg.vector_norm(o))
    if not o_norm > 0 or not math.isfinite(o_norm):
        raise ValueError(f"observed has norm {o_norm!r}; it must be in (0, inf) for a cosine to exist")
    c_norms = torch.linalg.vector_norm(c, dim=1)
    if not bool(torch.all(c_norms > 0)):
        raise ValueError("canaries has a zero row; every canary must have norm in (0, inf)")
    return (c @ o) / (c_norms * o_norm)


# ------------------------------------------------------------------------------------------------ Steinke
def steinke_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P-value of v correct guesses out of r (m canaries) under (ε, δ)-DP — Steinke et al., main theorem / App. D.

    f(v) + 2mδ·max_{1≤i≤v} (f(v − i) − f(v))/i with f(v) = P[Binomial(r, e^ε/(1 + e^ε)) ≥ v].
    """
    m = _check_int_at_least("m", m, 1)
    r = _check_int_at_least("r", r, 0)
    v = _check_int_at_least("v", v, 0)
    if not v <= r <= m:
        raise ValueError(f"(m, r, v)=({m}, {r}, {v}) must satisfy 0 ≤ v ≤ r ≤ m")
    epsilon = _check_nonnegative("epsilon", epsilon)
    if not (isinstance(delta, numbers.Real) and 0 <= delta <= 1):
        raise ValueError(f"delta={delta!r} is outside [0, 1]")
    return _steinke_p_value(m, r, v, epsilon, float(delta))


def _steinke_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    # scipy.special instead of scipy.stats.binom: the same values, ~20× less overhead per call (root finding).
    q = float(special.expit(epsilon))  # accuracy of ε-DP randomized response
    tail = 1.0 if v == 0 else float(special.bdtrc(v - 1, r, q))  # f(v) = P[W ≥ v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    j = np.arange(v - 1, -1, -1, dtype=np.float64)  # v − i for i = 1..v
    log_pmf = (
        special.gammaln(r + 1) - special.gammaln(j + 1) - special.gammaln(r - j + 1)
        + special.xlogy(j, q) + special.xlog1py(r - j, -q)
    )
    between = np.cumsum(np.exp(log_pmf))  # P[v − i ≤ W < v] = f(v − i) − f(v)
    alpha = float(np.max(between / np.arange(1, v + 1)))
    return min(tail + 2 * m * delta * alpha, 1.0)


def steinke_epsilon(m: int, r: int, v: int, delta: float, beta: float) -> float:
    """Largest ε whose ``steinke_p_value`` is below β (App. D ``get_eps_audit``): ε lower bound at 1 − β."""
    beta = _check_open_unit("beta", beta)
    if steinke_p_value(m, r, v, 0.0, delta) >= beta:  # also validates (m, r, v, δ)
        return 0.0
    lo, hi = 0.0, 1.0
    while _steinke_p_value(m, r, v, hi, delta) < beta:  # p → 1 as ε → ∞ (q → 1), so this ends
        lo, hi = hi, 2 * hi
    return float(optimize.brentq(lambda e: _steinke_p_value(m, r, v, e, delta) - beta, lo, hi, xtol=_XTOL))


def steinke_guesses(scores: ScoresLike, included: ScoresLike, k_plus: int, k_minus: int) -> tuple[int, int]:
    """(r, v): guesses made and correct when guessing "in" for the k₊ highest and "out" for the k₋ lowest scores.

    A tie group that straddles a cut is abstained on as a whole, so the guesses depend on the score values
    only — never on the order the canaries are listed in (which may encode inclusion). r ≤ k₊ + k₋.
    """
    scores = _scores("scores", scores, 1)
    included = _mask(included, scores.size)
    n = scores.size
    k_plus = _check_int_at_least("k_plus", k_plus, 0)
    k_minus = _check_int_at_least("k_minus", k_minus, 0)
    if k_plus + k_minus > n:
        raise ValueError(f"k_plus + k_minus={k_plus + k_minus} is outside [0, {n}] (the number of canaries)")
    ordered = np.sort(scores)
    top_cut = ordered[n - k_plus - 1] if k_plus < n else -math.inf  # the (k₊+1)-th largest
    bottom_cut = ordered[k_minus] if k_minus < n else math.inf  # the (k₋+1)-th smallest
    top = scores > top_cut if k_plus > 0 else np.zeros(n, bool)
    bottom = scores < bottom_cut if k_minus > 0 else np.zeros(n, bool)
    correct = int(np.sum(included[top])) + int(np.sum(~included[bottom]))
    return int(top.sum() + bottom.sum()), correct


_GUESS_FRACTIONS = (1.0, 0.9, 0.75, 0.5, 0.25, 0.1, 0.05)


def default_guess_grid(m: int) -> list[tuple[int, int]]:
    """Sweep of (k₊, k₋): k₊ = k₋ = k = f·m/2 for f in 1, 0.9, 0.75, 0.5, 0.25, 0.1, 0.05 (distinct, ≥ 1).

    f = 0.9 matters when the scores separate well: about m/2 ± √m/2 canaries are in, so guessing on all of
    them (f = 1) makes ~√m/2 forced mistakes, while 0.9·m/2 top guesses are all right with near certainty.
    """
    m = _check_int_at_least("m", m, 2)
    ks = sorted({max(1, round(f * m / 2)) for f in _GUESS_FRACTIONS}, reverse=True)
    return [(k, k) for k in ks]


@dataclass(frozen=True)
class SteinkeFit:
    """Steinke et al.'s bound and the setting that gave it (r = ``guesses``, v = ``correct``, G = ``num_tests``)."""

    epsilon: float
    epsilon_unadjusted: float
    k_plus: int
    k_minus: int
    guesses: int
    correct: int
    num_tests: int


def steinke_bound(
    scores: ScoresLike,
    included: ScoresLike,
    *,
    delta: float,
    confidence: float,
    guess_grid: Sequence[tuple[int, int]] | None = None,
) -> SteinkeFit:
    """Best one-run bound over ``guess_grid`` (default ``default_guess_grid``), each setting at level β/G."""
    s = _scores("scores", scores, 2)
    inc = _mask(included, s.size)
    delta = _check_open_unit("delta", delta)
    beta = 1.0 - _check_open_unit("confidence", confidence)
    grid = list(default_guess_grid(s.size) if guess_grid is None else guess_grid)
    if not grid:
        raise ValueError("guess_grid is empty; it must hold at least one (k_plus, k_minus) pair")
    best = SteinkeFit(0.0, 0.0, *grid[0], 0, 0, len(grid))
    best_raw = 0.0
    for k_plus, k_minus in grid:
        r, v = steinke_guesses(s, inc, k_plus, k_minus)
        if r == 0:  # every guess abstained (ties): no evidence
            continue
        eps = steinke_epsilon(s.size, r, v, delta, beta / len(grid))
        best_raw = max(best_raw, steinke_epsilon(s.size, r, v, delta, beta))
        if eps > best.epsilon or best.guesses == 0:
            best = SteinkeFit(eps, 0.0, k_plus, k_minus, r, v, len(grid))
    return dataclasses.replace(best, epsilon_unadjusted=best_raw)


# ------------------------------------------------------------------------------------------------- entry
@dataclass(frozen=True)
class AuditResult:
    """What ``audit_epsilon`` found: ``epsilon``, the lower bound at ``confidence``, and the guessing game that gave
    it (``steinke_bound``)."""

    method: str
    epsilon: float
    delta: float
    confidence: float
    num_in: int
    num_out: int
    k_plus: int
    k_minus: int
    guesses: int
    correct: int
    num_tests: int
    epsilon_unadjusted: float


def audit_epsilon(
    scores: ScoresLike,
    *,
    scores_out: ScoresLike | None = None,
    included: ScoresLike | None = None,
    delta: float,
    confidence: float = 0.95,
    method: str = "steinke",
    guess_grid: Sequence[tuple[int, int]] | None = None,
) -> AuditResult:
    """Lower bound on ε of the run from canary scores, at the run's δ: ``steinke_bound`` at ``confidence``.

    Give either ``scores`` = inserted canaries' scores and ``scores_out`` = held-out canaries' scores, or
    ``scores`` = all canaries' scores and ``included`` = their inclusion mask (1 = inserted). Inclusion must have
    been drawn independently with probability 1/2 per canary (with ``scores_out``, the two lists are those of
    such a draw). ``method`` must be one of ``AUDIT_METHODS``.
    """
    if method not in AUDIT_METHODS:
        raise ValueError(f"method={method!r} is not one of {AUDIT_METHODS}")
    if scores_out is not None and included is not None:
        raise ValueError("scores_out and included were both given; give exactly one of them")
    delta = _check_open_unit("delta", delta)
    confidence = _check_open_unit("confidence", confidence)
    s = _scores("scores", scores, 1)
    if included is not None:
        inc = _mask(included, s.size)
        s_in, s_out = s[inc], s[~inc]
    elif scores_out is not None:
        s_in, s_out = s, _scores("scores_out", scores_out, 1)
    else:
        raise ValueError(f"method={method!r} needs scores_out or included")
    all_scores = np.concatenate([s_in, s_out])
    mask = np.concatenate([np.ones(s_in.size, bool), np.zeros(s_out.size, bool)])
    fit = steinke_bound(all_scores, mask, delta=delta, confidence=confidence, guess_grid=guess_grid)
    return AuditResult(
        "steinke", fit.epsilon, delta, confidence, s_in.size, s_out.size,
        k_plus=fit.k_plus, k_minus=fit.k_minus, guesses=fit.guesses, correct=fit.correct,
        num_tests=fit.num_tests, epsilon_unadjusted=fit.epsilon_unadjusted,
    )
