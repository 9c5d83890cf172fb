"""Strategy matrices of correlated noise against their closed forms and a second implementation (scipy's sqrtm).

Tolerances: these are float64 computations on entries ≤ 1. A product of T×T such matrices is off by at most
T·2⁻⁵² per entry; scipy's sqrtm (a Schur method) by about cond(A)·T·2⁻⁵², with cond₂(A) ≈ 4T/π (A⁻¹ is the
bidiagonal difference matrix, ‖A⁻¹‖₂ ≤ 2, and ‖A‖₂ ≈ 2T/π).
"""

import math

import numpy as np
import pytest
from scipy.linalg import sqrtm

from fedrun.privacy.factorization import (MAX_PATTERNS, prefix_sum_matrix, sensitivity, sqrt_toeplitz,
                                          tree_factorization)

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
