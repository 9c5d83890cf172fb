"""Strategy matrices of correlated noise against their closed forms, brute force, and second implementations
(scipy's sqrtm; jax_privacy 2.0.0's optimised banded Toeplitz and BLT strategies, as figures; an independent
dense-matrix Nelder-Mead re-derivation of the optimised strategies).

Tolerances: these are float64 computations on entries ≤ 1. A product of T×T such matrices is off by at most
T·2⁻⁵² per entry; scipy's sqrtm (a Schur method) by about cond(A)·T·2⁻⁵², with cond₂(A) ≈ 4T/π (A⁻¹ is the
bidiagonal difference matrix, ‖A⁻¹‖₂ ≤ 2, and ‖A‖₂ ≈ 2T/π). A product B·C, B from a triangular solve, is off by
at most about 2T·2⁻⁵²·(|B|·|C|) entrywise (both steps backward stable); an inverse by about T·2⁻⁵²·cond_∞(C). The
loss sens² · ‖A·C⁻¹‖_F² sums T² such entries: relative round-off ~ T·2⁻⁵². The optimised losses are minima, flat to
first order, so two optimisers that stop at ~1e-8 relative gradient agree to ~1e-12 in the loss; comparisons
between different optimisers use rel 1e-9 (and one-sided bounds where one may find a better local optimum).
"""

import hashlib
import math
import subprocess
import sys
from itertools import product

import numpy as np
import pytest
from scipy.linalg import sqrtm
from scipy.optimize import minimize

from fedrun.privacy.factorization import (BLT_DEFAULT_BUFFERS, MAX_PATTERNS, STRATEGIES, banded_toeplitz, blt,
                                          prefix_sensitivities, prefix_sum_matrix, round_noise_matrix, sensitivity,
                                          sqrt_toeplitz, strategy, tree_factorization)

EPS = 2.0 ** -52


@pytest.mark.parametrize("T", [1, 2, 7, 16, 64, 200])
def test_the_square_root_of_the_prefix_sum_matrix_squares_to_it(T):
    C, A = sqrt_toeplitz(T), prefix_sum_matrix(T)
    assert np.abs(C @ C - A).max() <= 2 * T * EPS
    assert np.allclose(np.tril(C), C) and np.all(np.diag(C) == 1.0)
    # a second implementation: the principal square root of the unipotent A, by scipy (Schur method)
    assert np.abs(np.real(sqrtm(A)) - C).max() <= max(1.0, 4 * T / math.pi) * T * EPS


def test_the_square_root_coefficients_are_the_binomial_closed_form():
    C = sqrt_toeplitz(12)
    assert [C[j, 0] for j in range(12)] == pytest.approx([math.comb(2 * j, j) / 4 ** j for j in range(12)], rel=1e-15)


@pytest.mark.parametrize("T", [1, 2, 3, 8, 13, 32, 100])
def test_tree_aggregation_factors_the_prefix_sums_and_each_round_is_in_log_t_plus_one_nodes(T):
    B, C = tree_factorization(T)
    assert np.array_equal(B @ C, prefix_sum_matrix(T))  # integer arithmetic: exact
    h = math.ceil(math.log2(T)) if T > 1 else 0
    assert np.array_equal((C ** 2).sum(0), np.full(T, h + 1.0))  # integers: exact
    assert sensitivity(C, 1, 1) == pytest.approx(math.sqrt(h + 1), rel=1e-15)  # the closed form, one participation
    assert (B.sum(1) <= h + 1).all()  # at most ⌈log₂T⌉ + 1 nodes per prefix


def test_one_participation_is_the_largest_column_norm():
    C = sqrt_toeplitz(20)
    assert sensitivity(C, 1, 1) == pytest.approx(np.linalg.norm(C, axis=0).max(), rel=1e-15)


def _banded_toeplitz(T: int, bands: int, rng) -> np.ndarray:
    coef = np.concatenate([[1.0], rng.random(bands - 1)])
    i, j = np.indices((T, T))
    d = i - j
    return np.where((d >= 0) & (d < bands), coef[np.clip(d, 0, bands - 1)], 0.0)


@pytest.mark.parametrize("k,b,bands", [(2, 4, 4), (3, 5, 3), (4, 6, 6)])
def test_banded_sensitivity_is_root_k_times_the_column_norm_when_bands_fit_the_separation(k, b, bands):
    """Columns at least b ≥ bands apart have disjoint supports: ‖C·u‖² is a sum of column norms². With room for k
    full columns the answer is √k × the largest column norm; the closed form and the enumeration agree."""
    rng = np.random.default_rng(k)
    T = (k - 1) * b + bands + 2
    C = _banded_toeplitz(T, bands, rng)
    closed = sensitivity(C, k, b, banded=bands)
    assert closed == pytest.approx(math.sqrt(k) * np.linalg.norm(C, axis=0).max(), rel=1e-12)
    assert sensitivity(C, k, b) == pytest.approx(closed, rel=1e-12)  # brute force over every pattern


def test_more_participations_closer_together_cost_more_for_the_square_root():
    C = sqrt_toeplitz(24)
    one, spread, close = sensitivity(C, 1, 1), sensitivity(C, 3, 8), sensitivity(C, 3, 2)
    assert one < spread < close
    # brute force by hand for two participations at separation 12: every pair (i, j), j − i ≥ 12
    pairs = max(np.linalg.norm(C[:, i] + C[:, j]) for i in range(24) for j in range(i + 12, 24))
    assert sensitivity(C, 2, 12) == pytest.approx(max(pairs, one), rel=1e-12)


def test_bad_schemas_are_refused_in_one_line():
    C = sqrt_toeplitz(200)
    with pytest.raises(ValueError, match=r"participation patterns \(T=200, k=20, b=2\) exceed"):
        sensitivity(C, 20, 2)
    assert MAX_PATTERNS > 1e5
    with pytest.raises(ValueError, match="negative entries"):
        sensitivity(np.array([[1.0, -1.0], [0.0, 1.0]]), 2, 1)
    with pytest.raises(ValueError, match="not banded with 2 bands"):
        sensitivity(C[:10, :10], 2, 3, banded=2)
    with pytest.raises(ValueError, match="rounds=0 must be an integer >= 1"):
        sqrt_toeplitz(0)


def test_banded_closed_form_matches_enumeration_when_column_norms_differ():
    """A banded C whose columns have different norms (the largest next to each other): the b-separated dynamic
    programme must pick columns b apart, as the enumeration of every pattern does."""
    rng = np.random.default_rng(3)
    T, bands, b, k = 14, 3, 3, 3
    C = _banded_toeplitz(T, bands, rng) * np.repeat([1.0, 3.0, 1.0], [5, 4, 5])[None, :]  # big columns 5-8
    assert sensitivity(C, k, b, banded=bands) == pytest.approx(sensitivity(C, k, b), rel=1e-12)


# --- optimised strategies, the strategy table, the rounds' noise and the prefix sensitivities -----------------------

EPS_T = 2.0 ** -52


def _toep(coef, T: int) -> np.ndarray:
    """The test's own lower-triangular Toeplitz matrix (scipy.linalg.toeplitz, not the module's helper)."""
    from scipy.linalg import toeplitz

    c = np.zeros(T)
    c[:min(T, len(coef))] = np.asarray(coef)[:T]
    return toeplitz(c, np.zeros(T))


def _error(C: np.ndarray) -> float:
    """‖A·C⁻¹‖_F² by a dense solve (Cᵀ·Xᵀ = Aᵀ): the total squared error of the prefix sums at unit noise."""
    A = prefix_sum_matrix(C.shape[0])
    return float((np.linalg.solve(C.T, A.T) ** 2).sum())


def _loss(C: np.ndarray, k: int, b: int, banded=None) -> float:
    return sensitivity(C, k, b, banded=banded) ** 2 * _error(C)


def _spread_sens(C: np.ndarray, k: int, b: int) -> float:
    """‖C·u‖ for u = rounds 1, 1 + b, 1 + 2b, … (as many as fit, at most k): the worst pattern for a Toeplitz C with
    nonnegative nonincreasing coefficients (verified against the enumeration in the BLT test)."""
    T = C.shape[1]
    u = np.zeros(T)
    u[np.arange(0, T, b)[:k]] = 1.0
    return float(np.linalg.norm(C @ u))


def _patterns(T: int, k: int, b: int):
    """Every u ∈ {0, 1}^T with at most k ones, any two at least b apart (by filtering all 2^T vectors)."""
    for u in product((0.0, 1.0), repeat=T):
        ones = np.flatnonzero(u)
        if len(ones) <= k and (np.diff(ones) >= b).all():
            yield np.asarray(u)


def _brute_sens(C: np.ndarray, k: int, b: int) -> float:
    return max((float(np.linalg.norm(C @ u)) for u in _patterns(C.shape[1], k, b)), default=0.0)


def _bands_for(name: str, T: int, k: int, b: int):
    return (min(T, b, 3) if k > 1 else min(T, 3)) if name == "banded" else None


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("T", [1, 2, 7, 16, 33])
def test_every_strategy_factors_the_prefix_sums(name, T):
    """B·C = A to round-off (2T·2⁻⁵²·(|B|·|C|) entrywise: B = A·C⁻¹ by a triangular solve, then the product), and
    the declared band count is one sensitivity() accepts."""
    k, b = 2, 4
    B, C, banded = strategy(name, T, k, b, bands=_bands_for(name, T, k, b))
    A = prefix_sum_matrix(T)
    assert B.shape == (T, C.shape[0]) and C.shape[1] == T
    assert (np.abs(B @ C - A) <= 2 * T * EPS_T * (np.abs(B) @ np.abs(C)) + 0.0).all()
    assert banded == {"independent": 1, "banded": _bands_for(name, T, k, b)}.get(name)
    if banded is not None:
        assert sensitivity(C, k, b, banded=banded) == pytest.approx(sensitivity(C, k, b), rel=1e-12)


def test_the_strategy_table_refuses_unknown_names_and_misplaced_parameters():
    assert STRATEGIES == ("independent", "tree", "sqrt_toeplitz", "banded", "blt")
    with pytest.raises(ValueError, match=r"unknown strategy 'gaussian'; allowed: independent, tree, sqrt_toeplitz, "
                                         r"banded, blt"):
        strategy("gaussian", 10, 1, 1)
    with pytest.raises(ValueError, match="needs bands"):
        strategy("banded", 10, 1, 1)
    with pytest.raises(ValueError, match="bands=3 is only for the banded strategy"):
        strategy("tree", 10, 1, 1, bands=3)
    with pytest.raises(ValueError, match="buffers=2 is only for the blt strategy"):
        strategy("banded", 10, 1, 1, bands=3, buffers=2)
    with pytest.raises(ValueError, match="participations=0 must be an integer >= 1"):
        strategy("independent", 10, 0, 1)
    assert np.array_equal(strategy("blt", 12, 1, 1)[1], blt(12, BLT_DEFAULT_BUFFERS, 1, 1))  # buffers=None: 3


@pytest.mark.parametrize("T", [2, 9, 40])
def test_the_round_noise_is_c_inverse_for_square_strategies_and_sparse_for_the_tree(T):
    """M = A⁻¹·B: for a square C with B = A·C⁻¹ it is C⁻¹ (to T·2⁻⁵²·cond_∞(C)); in general M·C = A⁻¹·A = I, exact
    for the tree's integers, whose rows then touch at most the ≤ ⌈log₂T⌉ + 1 nodes of B[t] and of B[t − 1]."""
    for name in ("independent", "sqrt_toeplitz", "banded", "blt"):
        B, C, _ = strategy(name, T, 1, 1, bands=min(T, 5) if name == "banded" else None)
        M = round_noise_matrix(B)
        tol = 4 * T * EPS_T * np.linalg.cond(C, np.inf)
        assert np.abs(M - np.linalg.inv(C)).max() <= tol, name
    B, C = tree_factorization(T)
    M = round_noise_matrix(B)
    assert np.array_equal(M @ C, np.eye(T))
    h = math.ceil(math.log2(T))
    assert ((M != 0).sum(1) <= 2 * (h + 1)).all()
    assert np.array_equal(M[0], B[0]) and np.array_equal(M[1:], B[1:] - B[:-1])


def _brute_prefix(C: np.ndarray, k: int, b: int) -> np.ndarray:
    """The definition, by brute force: after round t, the rows of C with no nonzero in columns ≥ t are released;
    their sensitivity over the patterns of rounds 1..t."""
    T = C.shape[1]
    out = []
    for t in range(1, T + 1):
        rows = [r for r in range(C.shape[0]) if not C[r, t:].any()]
        out.append(_brute_sens(C[rows][:, :t], k, b) if rows else 0.0)
    return np.asarray(out)


@pytest.mark.parametrize("k,b", [(1, 1), (2, 2), (3, 1), (2, 3)])
@pytest.mark.parametrize("name", STRATEGIES)
def test_prefix_sensitivities_are_the_brute_force_of_their_definition(name, k, b):
    T = 7
    _, C, banded = strategy(name, T, k, b, bands=_bands_for(name, T, k, b))
    got = prefix_sensitivities(C, k, b, banded=banded)
    assert got == pytest.approx(_brute_prefix(C, k, b), rel=1e-12, abs=1e-15)
    assert (np.diff(got) >= 0).all()
    assert got[-1] == pytest.approx(sensitivity(C, k, b, banded=banded), rel=1e-14)


def test_prefix_sensitivities_of_rows_that_finish_early_and_of_zero_rows():
    """A non-square C: row 0 needs round 3, row 1 only round 1, row 2 is zero (released at round 1), row 3 rounds
    2 and 4. Signed entries with one participation (no sign condition needed)."""
    C = np.array([[1.0, 0.0, 2.0, 0.0], [-3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, -1.0]])
    assert prefix_sensitivities(C, 1, 1) == pytest.approx([math.sqrt(9), math.sqrt(9), math.sqrt(10), math.sqrt(10)],
                                                          rel=1e-15)
    C[1, 0] = 3.0
    C[3, 3] = 1.0
    assert prefix_sensitivities(C, 2, 2) == pytest.approx(_brute_prefix(C, 2, 2), rel=1e-14)


@pytest.mark.parametrize("name", ["sqrt_toeplitz", "blt"])
def test_prefix_sensitivities_of_a_monotone_toeplitz_take_the_closed_form_and_agree_with_the_enumeration(name):
    """The square root and BLT (nonnegative nonincreasing Toeplitz coefficients) take the pattern 1, 1 + b, …;
    sensitivity() enumerates every pattern of each leading t×t block (4060 triples at t = 30): rel 1e-12."""
    T, k, b = 30, 3, 4
    _, C, banded = strategy(name, T, k, b)
    expected = [sensitivity(C[:t, :t], k, b) for t in range(1, T + 1)]
    assert prefix_sensitivities(C, k, b, banded=banded) == pytest.approx(expected, rel=1e-12)


def test_prefix_sensitivities_of_matrices_outside_the_closed_form():
    """Signed, or not falling, Toeplitz coefficients (no closed form for the whole pattern): each prefix goes to
    sensitivity(), with banded=3 the released rows in place. In the last, a non-Toeplitz banded C, row 5 (only
    C[5, 3]) is released at round 4, before row 4: the unreleased row 4 must be zeroed, not kept."""
    C = _toep([1.0, -0.8, 0.5], 9)
    got = prefix_sensitivities(C, 2, 3, banded=3)
    assert got == pytest.approx(_brute_prefix(C, 2, 3), rel=1e-12)
    assert got[-1] == pytest.approx(sensitivity(C, 2, 3, banded=3), rel=1e-15)
    rising = _toep([0.1, 0.0, 1.0], 8)  # rounds 2 apart overlap more than adjacent ones: {1, 3} beats {1, 2}
    assert prefix_sensitivities(rising, 2, 1) == pytest.approx(_brute_prefix(rising, 2, 1), rel=1e-12)
    early = _toep([1.0, 0.5, 0.25], 7)
    early[5] = 0.0
    early[5, 3] = 2.0
    assert prefix_sensitivities(early, 2, 3, banded=3) == pytest.approx(_brute_prefix(early, 2, 3), rel=1e-12)


def test_sensitivity_closed_forms_need_no_sign_condition():
    """A banded C with negative entries: with bands ≤ b its columns in a pattern have disjoint supports, so any
    signed contributions u ∈ [−1, 1]^T give Σ column norms²; with one participation it is the largest column norm.
    The enumeration still refuses a CᵀC with negative entries."""
    T, bands, b, k = 9, 3, 3, 2
    C = _toep([1.0, -0.8, 0.5], T)
    assert (C.T @ C < 0).any()
    signed = max(float(np.linalg.norm(C @ u)) for u in product((-1.0, 0.0, 1.0), repeat=T)
                 if (lambda ones: len(ones) <= k and (np.diff(ones) >= b).all())(np.flatnonzero(u)))
    assert sensitivity(C, k, b, banded=bands) == pytest.approx(signed, rel=1e-12)
    assert sensitivity(C, 1, 1) == pytest.approx(np.linalg.norm(C, axis=0).max(), rel=1e-15)
    with pytest.raises(ValueError, match="negative entries"):
        sensitivity(C, k, 1)


@pytest.mark.parametrize("T,k,b,bands", [(50, 1, 1, 6), (50, 1, 1, 50), (40, 3, 10, 10), (30, 2, 7, 5),
                                         (24, 4, 6, 6), (20, 2, 15, 15)])
def test_the_optimised_banded_loss_beats_the_truncated_square_root_and_independent_noise(T, k, b, bands):
    """Loss = sens² · ‖A·C⁻¹‖_F², sens by sensitivity(banded=bands). Independent noise (C = I) has ‖A‖_F² =
    T(T + 1)/2 times sens² = the participations that fit; the start (the square root's first coefficients) is a
    member of the family, so the optimum is at most its loss. (20, 2, 15, 15): the second participation only fits
    12 of the 15 coefficients, so sens² is not 2‖c‖² there."""
    C = banded_toeplitz(T, bands, k, b)
    assert C.shape == (T, T) and C[0, 0] == 1.0 and np.array_equal(C, _toep(C[:bands, 0], T))
    k_eff = min(k, (T - 1) // b + 1)
    loss = _loss(C, k, b, banded=bands)
    independent = _loss(np.eye(T), k, b, banded=1)
    assert independent == pytest.approx(k_eff * T * (T + 1) / 2, rel=4 * EPS_T)  # √k_eff squared
    start = _toep(sqrt_toeplitz(bands)[:, 0], T)
    assert loss <= _loss(start, k, b, banded=bands) * (1 + 1e-12)
    assert loss < independent


def test_one_band_is_the_identity():
    for k, b in [(1, 1), (3, 4)]:
        C = banded_toeplitz(13, 1, k, b)
        assert np.array_equal(C, np.eye(13))
        assert _loss(C, k, b, banded=1) == _loss(np.eye(13), k, b, banded=1)


@pytest.mark.parametrize("T,k,b", [(30, 1, 1), (40, 3, 10)])
def test_more_bands_never_cost_more(T, k, b):
    """The family with β bands contains the one with β − 1 (a zero last coefficient): the optimum's loss is
    nonincreasing in β (rel 1e-9: two independent optimiser runs)."""
    top = T if k == 1 else b
    losses = [_loss(banded_toeplitz(T, n, k, b), k, b, banded=n) for n in range(1, top + 1)]
    assert all(later <= earlier * (1 + 1e-9) for earlier, later in zip(losses, losses[1:]))
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("T,k,b,bands", [(40, 1, 1, 40), (40, 1, 1, 8), (36, 3, 9, 9), (20, 2, 15, 15)])
def test_the_optimised_banded_coefficients_are_a_local_minimum(T, k, b, bands):
    """Moving any free coefficient c_1..c_{β−1} by ±1e-4 does not lower the loss. At a minimum the change is
    ½·H·h² > 0 (H ~ the loss, so ~1e-8 relative) plus the leftover gradient times h (≤ 1e-8·h relative); round-off
    of the loss is ~T·2⁻⁵²: tol = 64·T·2⁻⁵² relative."""
    C = banded_toeplitz(T, bands, k, b)
    c = C[:bands, 0]
    base = _loss(C, k, b, banded=bands)
    for i in range(1, bands):
        for h in (1e-4, -1e-4):
            moved = c.copy()
            moved[i] += h
            assert _loss(_toep(moved, T), k, b, banded=bands) >= base * (1 - 64 * T * EPS_T), (i, h)


def test_banded_refusals_are_one_line_and_name_the_value():
    with pytest.raises(ValueError, match=r"^bands=5 exceeds separation=4 with participations=2: bands must be <= 4$"):
        banded_toeplitz(20, 5, 2, 4)
    for bands in (0, 21, 2.5):
        with pytest.raises(ValueError, match=rf"^bands={bands!r} must be an integer in \[1, T=20\]$"):
            banded_toeplitz(20, bands, 1, 1)
    assert banded_toeplitz(20, 20, 1, 4).shape == (20, 20)  # one participation: any band count
    with pytest.raises(ValueError, match=r"^buffers=9 must be an integer in \[1, 8\]$"):
        blt(20, 9, 1, 1)
    with pytest.raises(ValueError, match=r"^buffers=0 must be an integer in \[1, 8\]$"):
        blt(20, 0, 1, 1)


@pytest.mark.parametrize("T,k,b", [(30, 1, 1), (30, 2, 7), (14, 3, 4)])
def test_blt_is_a_positive_nonincreasing_toeplitz_between_the_toeplitz_optimum_and_independent_noise(T, k, b):
    """BLT is a sub-family of the Toeplitz matrices: its loss is at least the unrestricted Toeplitz optimum
    (bands = T; for k = 1, where that is allowed; rel 1e-9, two optimiser runs) and below independent noise's.
    Its coefficients are positive and nonincreasing from c_0 = 1, so CᵀC ≥ 0 and the worst pattern is rounds
    1, 1 + b, …: sensitivity()'s enumeration agrees. More buffers never cost more (rel 1e-9)."""
    losses = []
    for d in (1, 2, 3):
        C = blt(T, d, k, b)
        c = C[:, 0]
        assert np.array_equal(C, _toep(c, T)) and c[0] == 1.0 and (c > 0).all() and (np.diff(c) <= 0).all()
        sens = sensitivity(C, k, b)
        if T <= 14:
            assert sens == pytest.approx(_brute_sens(C, k, b), rel=1e-12)
        assert sens == pytest.approx(_spread_sens(C, k, b), rel=1e-12)
        losses.append(sens ** 2 * _error(C))
    assert all(later <= earlier * (1 + 1e-9) for earlier, later in zip(losses, losses[1:]))
    assert losses[-1] < min(k, (T - 1) // b + 1) * T * (T + 1) / 2
    if k == 1:
        assert losses[-1] >= _loss(banded_toeplitz(T, T, 1, 1), 1, 1) * (1 - 1e-9)
        assert losses[-1] <= _loss(sqrt_toeplitz(T), 1, 1)  # the fitted start approximates the square root


_DETERMINISM = ("import hashlib, numpy as np; from fedrun.privacy.factorization import banded_toeplitz, blt; "
                "print(hashlib.sha256(banded_toeplitz(40, 7, 2, 8).tobytes() + blt(40, 3, 2, 8).tobytes())"
                ".hexdigest())")


def test_the_optimised_strategies_are_deterministic():
    """Bit-identical output for the same input, in this process and in a fresh one."""
    first = banded_toeplitz(40, 7, 2, 8), blt(40, 3, 2, 8)
    again = banded_toeplitz(40, 7, 2, 8), blt(40, 3, 2, 8)
    assert all(np.array_equal(x, y) for x, y in zip(first, again))
    digest = hashlib.sha256(first[0].tobytes() + first[1].tobytes()).hexdigest()
    out = subprocess.run([sys.executable, "-c", _DETERMINISM], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == digest


# Second implementation: Google DeepMind's jax_privacy 2.0.0 (jax/jaxlib 0.10.2, CPU, float64), not a project
# dependency (jaxlib alone installs ~350 MB). The figures were made in a throwaway venv with:
#   c = toeplitz.optimize_banded_toeplitz(n=T, bands=β, max_optimizer_steps=1000); c = c / c[0]
#   loss = toeplitz.loss(c, n=T) * T        # its mean per-prefix squared error × ‖c‖², times T
#   toeplitz.minsep_sensitivity_squared(toeplitz.optimal_max_error_strategy_coefs(T), min_sep=b,
#                                       max_participations=k, n=T) ** 0.5
#   blt = buffered_toeplitz.optimize(n=T, min_sep=b, max_participations=k, error="mean", min_buffers=d,
#                                    max_buffers=d); loss = minsep_sensitivity_squared(coefs) × ‖A·C⁻¹‖_F²
JAX_PRIVACY_BANDED = {  # (T, bands): sens² · ‖A·C⁻¹‖_F² at one participation
    (50, 2): 702.981595526236, (50, 5): 376.9220490808755, (50, 10): 276.95723798377554,
    (50, 50): 220.87506507328877, (200, 10): 2906.708981547309, (200, 50): 1463.7305865648132,
    (200, 200): 1288.5582717806824, (24, 6): 101.29368970292165,
}
JAX_PRIVACY_SQRT_SENSITIVITY = {(24, 3, 8): 3.020356369838522, (24, 3, 2): 3.5893874482644748,
                                (24, 2, 12): 2.2445402095406934}  # also (50, 5, 10): 4.69766510331155, slow here
JAX_PRIVACY_BLT = {  # (T, k, b, buffers): loss of its optimised BLT
    (50, 1, 1, 1): 226.47142915508869, (50, 1, 1, 2): 221.0287247025303, (50, 1, 1, 3): 221.0287292351015,
    (50, 1, 1, 5): 221.01649008428703, (200, 1, 1, 3): 1289.321011966151, (200, 1, 1, 5): 1289.3008778938276,
    (50, 3, 10, 3): 891.6020201577934, (200, 4, 50, 3): 6346.4924016449495,
}


@pytest.mark.parametrize("T,bands", sorted(JAX_PRIVACY_BANDED))
def test_the_banded_optimum_matches_jax_privacy(T, bands):
    """Same family (banded Toeplitz, c_0 normalised), same loss, different optimiser (optax L-BFGS under jax):
    rel 1e-9. With k participations ≥ bands apart and room for all k full columns, sens² = k‖c‖²: the same
    coefficients, k times the loss."""
    C = banded_toeplitz(T, bands, 1, 1)
    assert _loss(C, 1, 1, banded=bands) == pytest.approx(JAX_PRIVACY_BANDED[T, bands], rel=1e-9)
    if (T, bands) == (24, 6):
        C3 = banded_toeplitz(24, 6, 3, 8)  # 24 − 2·8 = 8 ≥ 6: all three columns are full
        assert _loss(C3, 3, 8, banded=6) == pytest.approx(3 * JAX_PRIVACY_BANDED[24, 6], rel=1e-9)


def test_the_min_separation_sensitivity_of_the_square_root_matches_jax_privacy():
    """Its closed form (k participations exactly b apart from round 1, for nonincreasing positive coefficients)
    against our enumeration of every pattern: rel 1e-12."""
    for (T, k, b), expected in JAX_PRIVACY_SQRT_SENSITIVITY.items():
        assert sensitivity(sqrt_toeplitz(T), k, b) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("key", sorted(JAX_PRIVACY_BLT))
def test_the_blt_optimum_is_at_least_as_good_as_jax_privacys(key):
    """Same family (jax_privacy also keeps Σω ≤ 1, and adds penalties), so our optimum is at most its loss
    (rel 1e-9); one and two buffers (a smooth, well-conditioned optimum) agree to rel 1e-9, and more are within
    0.1% (different optimisers reach slightly different points of a flat landscape)."""
    T, k, b, d = key
    C = blt(T, d, k, b)
    loss = _spread_sens(C, k, b) ** 2 * _error(C)  # the worst pattern of a nonincreasing BLT (checked above)
    assert loss <= JAX_PRIVACY_BLT[key] * (1 + 1e-9)
    assert loss >= JAX_PRIVACY_BLT[key] * (1 - (1e-9 if d <= 2 and k == 1 else 1e-3))


def test_an_independent_dense_nelder_mead_rederivation_finds_the_same_optima():
    """No shared code: the loss from dense matrices (a linear solve for A·C⁻¹; sensitivity by filtering all 2^T
    0/1 vectors) minimised by derivative-free Nelder-Mead from the identity, for a banded Toeplitz (T = 12, k = 2,
    b = 4, 4 bands) and a one-buffer BLT (T = 12, k = 1, over (ω, θ)): rel 1e-7 (Nelder-Mead's tolerance)."""
    T, k, b, bands = 12, 2, 4, 4
    pats = np.array(list(_patterns(T, k, b)))

    def banded_loss(x):
        C = _toep(np.concatenate([[1.0], x]), T)
        return float((np.linalg.norm(pats @ C.T, axis=1) ** 2).max()) * _error(C)

    opts = {"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000, "maxfev": 40000}
    ref = minimize(banded_loss, np.zeros(bands - 1), method="Nelder-Mead", options=opts)
    assert _loss(banded_toeplitz(T, bands, k, b), k, b, banded=bands) == pytest.approx(ref.fun, rel=1e-7)

    def blt_loss(z):
        omega, theta = z
        if not (0 < omega < 1 and 0 < theta < 1):
            return math.inf
        C = _toep(np.concatenate([[1.0], omega * theta ** np.arange(T - 1)]), T)
        return float((C ** 2).sum(0).max()) * _error(C)

    ref = minimize(blt_loss, np.array([0.3, 0.5]), method="Nelder-Mead", options=opts)
    assert sensitivity(blt(T, 1, 1, 1), 1, 1) ** 2 * _error(blt(T, 1, 1, 1)) == pytest.approx(ref.fun, rel=1e-7)
