"""Strategy matrices of correlated-noise mechanisms (matrix factorization of the prefix sums), and their sensitivity
under a participation schema (pure numpy; issue 43's first piece, not yet wired into the round).

A mechanism for the prefix sums A·G of T rounds' (clipped) contributions factors A = B·C and releases
B·(C·G + Z): the noise B·Z is correlated across rounds. With each client's contribution in a round clipped to S and
Z's entries N(0, σ²S²), it is the Gaussian mechanism on C·G with noise multiplier σ / sens(C), where sens(C) is the
largest ‖C·u‖₂ over the participation patterns u ∈ {0, 1}^T a client may have (Choquette-Choo et al., "Multi-Epoch
Matrix Factorization Mechanisms for Private Machine Learning", ICML 2023, Thm 2.1, for C with CᵀC ≥ 0 entrywise,
where sign patterns of the contributions reduce to 0/1 ones).

* :func:`prefix_sum_matrix` — A, lower-triangular ones (T×T).
* :func:`tree_factorization` — binary-tree aggregation (Honaker 2015; Kairouz et al., "Practical and Private (Deep)
  Learning without Sampling or Shuffling", ICML 2021): C has a row per node of the dyadic tree over 2^⌈log₂T⌉ leaves,
  B sums the ≤ ⌈log₂T⌉ + 1 nodes that cover [1, t]; each round is in ⌈log₂T⌉ + 1 nodes.
* :func:`sqrt_toeplitz` — the square root of A (Fichtenberger, Henzinger, Upadhyay, "Constant Matters: Fine-grained
  Error Bound on Differentially Private Continual Observation", ICML 2023): lower-triangular Toeplitz with the
  coefficients of (1 − x)^(−1/2), c_j = binom(2j, j)/4^j; B = C.
* :func:`sensitivity` — sens(C) for at most k participations at least b rounds apart (b-min-separation), exact by
  enumerating the patterns (bounded), or the closed form √k × the largest column norm for a C whose columns at least
  b apart have disjoint supports (a banded C with bands ≤ b).
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np

__all__ = ["prefix_sum_matrix", "tree_factorization", "sqrt_toeplitz", "sensitivity", "MAX_PATTERNS"]

#: the most participation patterns :func:`sensitivity` enumerates (a larger schema raises instead of running long)
MAX_PATTERNS = 2_000_000


def _rounds(T: int) -> int:
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < 1:
        raise ValueError(f"rounds={T!r} must be an integer >= 1")
    return int(T)


def prefix_sum_matrix(T: int) -> np.ndarray:
    """A (T×T): row t sums rounds 1..t."""
    return np.tril(np.ones((_rounds(T), T)))


def tree_factorization(T: int) -> tuple[np.ndarray, np.ndarray]:
    """(B, C) with B·C = A for T rounds: C's rows are the nodes of the binary tree over 2^h leaves, h = ⌈log₂T⌉ (each
    node sums the rounds of its dyadic interval; columns for rounds past T are dropped), B's row t takes the nodes of
    the binary decomposition of [1, t]."""
    T = _rounds(T)
    h = max(0, math.ceil(math.log2(T)))
    nodes = [(level, start) for level in range(h + 1) for start in range(0, 2 ** h, 2 ** level)]  # [start, start+2^l)
    index = {node: i for i, node in enumerate(nodes)}
    C = np.zeros((len(nodes), T))
    for i, (level, start) in enumerate(nodes):
        C[i, start:min(start + 2 ** level, T)] = 1.0
    B = np.zeros((T, len(nodes)))
    for t in range(1, T + 1):  # [0, t) as dyadic blocks, largest first (the set bits of t)
        start = 0
        for level in range(h, -1, -1):
            if t - start >= 2 ** level:
                B[t - 1, index[(level, start)]] = 1.0
                start += 2 ** level
    return B, C


def sqrt_toeplitz(T: int) -> np.ndarray:
    """C (T×T) with C·C = A: lower-triangular Toeplitz, C[i, j] = c_{i−j}, c_0 = 1, c_j = c_{j−1}·(2j − 1)/(2j)."""
    T = _rounds(T)
    c = np.ones(T)
    for j in range(1, T):
        c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
    i, j = np.indices((T, T))
    return np.where(i >= j, c[np.clip(i - j, 0, T - 1)], 0.0)


def sensitivity(C: np.ndarray, participations: int, separation: int, *, banded: int | None = None) -> float:
    """max ‖C·u‖₂ over u ∈ {0, 1}^T with at most ``participations`` ones, any two at least ``separation`` apart.

    Needs CᵀC ≥ 0 entrywise (then more participations never lower ‖C·u‖, and 0/1 patterns are the worst sign
    patterns). ``banded`` = β declares that C has β bands (C[i, j] = 0 unless 0 ≤ i − j < β); with β ≤ separation,
    the columns of a pattern have disjoint supports, and the answer is the closed form √(sum of the k largest squared
    norms among columns b apart), which for the usual case is √k × the largest column norm. Otherwise the patterns
    are enumerated (at most :data:`MAX_PATTERNS`; more raise a ValueError naming the schema)."""
    C = np.asarray(C, dtype=np.float64)
    if C.ndim != 2:
        raise ValueError(f"C has shape {C.shape}; expected a matrix")
    T = C.shape[1]
    k, b = int(participations), int(separation)
    if k < 1 or b < 1:
        raise ValueError(f"participations={participations!r} and separation={separation!r} must be >= 1")
    gram = C.T @ C
    if (gram < -1e-12 * max(1.0, float(np.abs(gram).max()))).any():
        raise ValueError("CᵀC has negative entries: 0/1 participation patterns need not be the worst case")
    k = min(k, (T - 1) // b + 1)  # at most this many fit
    norms2 = np.diag(gram)
    if banded is not None:
        beta = int(banded)
        lower = np.tril(np.ones_like(C, dtype=bool), 0) & ~np.tril(np.ones_like(C, dtype=bool), -beta)
        if (C[~lower] != 0).any():
            raise ValueError(f"C is not banded with {beta} bands")
        if beta <= b:  # disjoint supports: ‖C·u‖² = Σ column norms², maximised by a DP over b-separated picks
            return math.sqrt(_best_separated_sum(norms2, k, b))
    count = _pattern_count(T, k, b)
    if count > MAX_PATTERNS:
        raise ValueError(f"sensitivity: {count:.3g} participation patterns (T={T}, k={k}, b={b}) exceed "
                         f"{MAX_PATTERNS}; give banded= for a banded C with bands <= separation")
    best = 0.0
    for m in range(1, k + 1):
        for pattern in combinations(range(T), m):
            if all(q - p >= b for p, q in zip(pattern, pattern[1:])):
                idx = np.asarray(pattern)
                best = max(best, float(gram[np.ix_(idx, idx)].sum()))
    return math.sqrt(best)


def _best_separated_sum(values: np.ndarray, k: int, b: int) -> float:
    """max Σ values[i] over at most k indices, any two at least b apart (values ≥ 0): dynamic programming."""
    T = len(values)
    best = np.zeros((k + 1, T + 1))  # best[m, t]: m picks among indices < t
    for m in range(1, k + 1):
        for t in range(1, T + 1):
            take = values[t - 1] + best[m - 1, max(0, t - b)]
            best[m, t] = max(best[m, t - 1], take)
    return float(best[k, T])


def _pattern_count(T: int, k: int, b: int) -> int:
    """Non-empty patterns of at most k of T rounds, any two at least b apart: Σ_m C(T − (m − 1)(b − 1), m)."""
    return sum(math.comb(T - (m - 1) * (b - 1), m) for m in range(1, k + 1) if T - (m - 1) * (b - 1) >= m)
