"""Tests for fedrun.transfer.leakage (paper 003, label leakage of the shuffled upload).

References are independent of the module: brute force over ordered label sequences, hand computations,
exhaustive enumeration of every client's labels for tiny U, and the Miller-Madow large-U limit.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrun.transfer import leakage as lk

SMALL = [(n, k) for n in (1, 2, 3, 4) for k in (1, 2, 3, 4)]


def _brute_types(n: int, k: int) -> dict[tuple[int, ...], float]:
    """Type -> probability under uniform labels, by walking all N^K ordered batches."""
    out: Counter = Counter()
    for seq in itertools.product(range(n), repeat=k):
        out[tuple(np.bincount(seq, minlength=n).tolist())] += 1
    return {t: c / n**k for t, c in out.items()}


def _brute_types_y(y: np.ndarray, k: int) -> dict[tuple[int, ...], float]:
    out: Counter = Counter()
    for seq in itertools.product(range(len(y)), repeat=k):
        out[tuple(np.bincount(seq, minlength=len(y)).tolist())] += float(np.prod(y[list(seq)]))
    return dict(out)


def _h(p) -> float:
    p = np.asarray([q for q in p if q > 0], dtype=float)
    return float(-(p * np.log2(p)).sum())


# ------------------------------------------------------------------------------------------ batch types
@pytest.mark.parametrize("n,k", SMALL)
def test_num_batch_types_matches_brute_force(n, k):
    assert lk.num_batch_types(n, k) == len(_brute_types(n, k)) == math.comb(n + k - 1, k)


@pytest.mark.parametrize("n,k", SMALL)
def test_batch_types_are_all_types_in_lexicographic_order(n, k):
    types = lk.batch_types(n, k)
    ref = [np.bincount(c, minlength=n) for c in itertools.combinations_with_replacement(range(n), k)]
    np.testing.assert_array_equal(types, np.array(ref))
    assert types.dtype == np.int64 and np.all(types.sum(axis=1) == k)


@pytest.mark.parametrize("n,k", SMALL)
def test_uniform_batch_distribution_matches_ordered_sequences(n, k):
    p = lk.batch_distribution(n, k)
    ref = _brute_types(n, k)
    np.testing.assert_allclose(p, [ref[tuple(t)] for t in lk.batch_types(n, k).tolist()], rtol=1e-12)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("n,k", [(2, 3), (3, 4), (4, 2)])
def test_nonuniform_batch_distribution_matches_ordered_sequences(n, k):
    y = np.random.default_rng(n * 10 + k).dirichlet(np.ones(n))
    y[0] = 0.0  # a class that never occurs
    y /= y.sum()
    ref = _brute_types_y(y, k)
    p = lk.batch_distribution(n, k, y)
    np.testing.assert_allclose(p, [ref[tuple(t)] for t in lk.batch_types(n, k).tolist()], rtol=1e-12, atol=1e-300)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)


def test_type_counts_from_labels():
    labels = np.array([[0, 1], [1, 0], [2, 2], [1, 1]])
    s = lk.type_counts_from_labels(labels, 3)
    # order: (2,0,0) (1,1,0) (1,0,1) (0,2,0) (0,1,1) (0,0,2)
    np.testing.assert_array_equal(s, [0, 2, 0, 1, 0, 1])


# -------------------------------------------------------------------------------------------- entropies
@pytest.mark.parametrize(
    "n,k,bits",
    [
        (2, 1, 1.0),
        (3, 1, math.log2(3)),
        (10, 1, math.log2(10)),
        (2, 2, 1.5),  # (1/4, 1/2, 1/4)
        (2, 3, 0.75 + 0.75 * math.log2(8 / 3)),  # (1/8, 3/8, 3/8, 1/8)
        (1, 5, 0.0),
    ],
)
def test_prior_entropy_by_hand(n, k, bits):
    assert lk.prior_entropy(n, k) == pytest.approx(bits, abs=1e-12)


def test_prior_entropy_nonuniform_by_hand():
    # N = 2, K = 1, y = (1/4, 3/4): binary entropy
    assert lk.prior_entropy(2, 1, [0.25, 0.75]) == pytest.approx(_h([0.25, 0.75]), abs=1e-12)
    # a certain label: no uncertainty
    assert lk.prior_entropy(3, 4, [0.0, 1.0, 0.0]) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("s,bits", [([1, 1], 1.0), ([3, 0, 0], 0.0), ([2, 1, 1], 1.5), ([1, 1, 1], math.log2(3))])
def test_shuffled_entropy_by_hand(s, bits):
    assert lk.shuffled_entropy(s) == pytest.approx(bits, abs=1e-12)


def test_leakage_of_one_observation():
    # U = 1 or all clients alike: the adversary knows the batch, leakage = prior uncertainty
    assert lk.leakage([0, 5, 0], 2, 2) == pytest.approx(1.5)
    # N = 2, K = 2, one batch of each type: more spread than the prior, negative leakage (see module doc)
    assert lk.leakage([1, 1, 1], 2, 2) == pytest.approx(1.5 - math.log2(3))
    # frequencies equal to the prior: no leakage
    assert lk.leakage([1, 2, 1], 2, 2) == pytest.approx(0.0, abs=1e-12)
    y = [0.25, 0.75]
    assert lk.leakage([1, 3], 2, 1, y) == pytest.approx(0.0, abs=1e-12)


# ------------------------------------------------------------------------------------ expected leakage
def _brute_expected_leakage(n: int, k: int, u: int) -> float:
    """Walk every assignment of labels to all U clients (N^(K U) cases), uniform labels."""
    h_prior = _h(_brute_types(n, k).values())
    total = 0.0
    for seq in itertools.product(range(n), repeat=k * u):
        types = Counter(tuple(sorted(seq[i * k : (i + 1) * k])) for i in range(u))
        total += h_prior - _h([c / u for c in types.values()])
    return total / n ** (k * u)


@pytest.mark.parametrize("n,k,u", [(2, 1, 1), (2, 1, 2), (2, 1, 5), (2, 2, 3), (3, 1, 4), (3, 2, 2), (2, 3, 3)])
def test_expected_leakage_matches_exhaustive_clients(n, k, u):
    ref = _brute_expected_leakage(n, k, u)
    for method in ("exact", "enumerate"):
        est = lk.expected_leakage(n, k, u, method=method)
        assert est.mean == pytest.approx(ref, abs=1e-12)
        assert est.stderr == 0.0 and est.exact and est.method == method


def test_expected_leakage_by_hand():
    # N = 2, K = 1, U = 2: the two labels differ with prob 1/2 (1 bit), else 0 bits; prior 1 bit
    assert lk.expected_leakage(2, 1, 2).mean == pytest.approx(0.5, abs=1e-12)
    # U = 1: the adversary sees the one batch
    for n, k in [(2, 2), (3, 3), (10, 2)]:
        assert lk.expected_leakage(n, k, 1).mean == pytest.approx(lk.prior_entropy(n, k), abs=1e-12)


@given(
    n=st.integers(1, 4),
    k=st.integers(1, 3),
    u=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
    zero_class=st.booleans(),
)
@settings(max_examples=40, deadline=None)
def test_exact_equals_enumeration_and_is_between_zero_and_prior(n, k, u, seed, zero_class):
    y = np.random.default_rng(seed).dirichlet(np.ones(n))
    if zero_class and n > 1:
        y[-1] = 0.0
        y /= y.sum()
    exact = lk.expected_leakage(n, k, u, y, method="exact").mean
    enum = lk.expected_leakage(n, k, u, y, method="enumerate").mean
    assert exact == pytest.approx(enum, abs=1e-10)
    assert -1e-10 <= exact <= lk.prior_entropy(n, k, y) + 1e-10


@pytest.mark.parametrize("n,k,u,y", [(3, 2, 7, [0.5, 0.3, 0.2]), (2, 8, 20, None), (10, 2, 40, None)])
def test_monte_carlo_agrees_with_exact(n, k, u, y):
    exact = lk.expected_leakage(n, k, u, y, method="exact")
    mc = lk.expected_leakage(n, k, u, y, method="monte_carlo", rng=np.random.default_rng(2022), num_samples=4000)
    assert not mc.exact and mc.num_samples == 4000 and mc.stderr > 0
    assert abs(mc.mean - exact.mean) <= 4 * mc.stderr
    assert mc.log10_outcomes == pytest.approx(exact.log10_outcomes)


def test_monte_carlo_is_reproducible_from_the_generator():
    a = lk.expected_leakage(3, 2, 7, method="monte_carlo", rng=np.random.default_rng(5), num_samples=50)
    b = lk.expected_leakage(3, 2, 7, method="monte_carlo", rng=np.random.default_rng(5), num_samples=50)
    assert a == b


U_GRID = [1, 2, 3, 5, 10, 20, 50, 100, 300, 1000, 3000, 10_000]


@pytest.mark.parametrize("n,k", [(2, 1), (2, 2), (2, 8), (10, 1), (10, 2), (4, 3)])
def test_expected_leakage_decreases_to_zero(n, k):
    values = [lk.expected_leakage(n, k, u).mean for u in U_GRID]
    assert all(b <= a + 1e-12 for a, b in zip(values, values[1:])), values
    assert values[0] == pytest.approx(lk.prior_entropy(n, k))
    assert values[-1] < 0.02 * values[0]
    # large U: Miller-Madow limit (|B| - 1) / (2 U ln 2)
    big = 200 * lk.num_batch_types(n, k)
    assert lk.expected_leakage(n, k, big).mean == pytest.approx(lk.asymptotic_leakage(n, k, big), rel=0.03)


def test_expected_leakage_nonuniform_decreases():
    y = np.array([0.6, 0.25, 0.1, 0.05])
    values = [lk.expected_leakage(4, 3, u, y).mean for u in U_GRID]
    assert all(b <= a + 1e-12 for a, b in zip(values, values[1:])), values
    assert values[-1] < 0.01


def test_auto_switches_between_exact_and_monte_carlo():
    assert lk.expected_leakage(10, 2, 100).method == "exact"
    mc = lk.expected_leakage(10, 2, 100, rng=np.random.default_rng(0), max_exact_terms=10, num_samples=20)
    assert mc.method == "monte_carlo" and mc.num_samples == 20
    est = lk.expected_leakage(2, 2, 5)
    assert est.log10_outcomes == pytest.approx(math.log10(lk.num_outcomes(5, 3)))
    assert lk.num_outcomes(5, 3) == math.comb(7, 2) == 21


def test_large_case_is_fast_and_sane():
    # the paper's setting (CIFAR-10, K = 8, U = 6250), uniform labels
    est = lk.expected_leakage(10, 8, 6250)
    assert est.exact and 0.0 < est.mean < lk.prior_entropy(10, 8)


# ------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: lk.num_batch_types(0, 3), "num_classes"),
        (lambda: lk.num_batch_types(2, 0), "batch_size"),
        (lambda: lk.num_batch_types(2, 1.5), "batch_size"),
        (lambda: lk.num_batch_types(True, 2), "num_classes"),
        (lambda: lk.batch_types(100, 20), "batch types"),
        (lambda: lk.batch_distribution(3, 2, [0.5, 0.5]), "shape"),
        (lambda: lk.batch_distribution(2, 2, [1.5, -0.5]), ">= 0"),
        (lambda: lk.batch_distribution(2, 2, [0.5, 0.6]), "sum to 1"),
        (lambda: lk.batch_distribution(2, 2, [np.nan, 1.0]), "finite"),
        (lambda: lk.entropy_bits([0.2, 0.2]), "sum to 1"),
        (lambda: lk.shuffled_entropy([0, 0]), "sum to U"),
        (lambda: lk.shuffled_entropy([1, -1, 2]), "non-negative integers"),
        (lambda: lk.shuffled_entropy([0.5, 1.5]), "non-negative integers"),
        (lambda: lk.shuffled_entropy(np.ones((2, 2))), "1-D"),
        (lambda: lk.leakage([1, 1], 2, 2), "one entry per batch type"),
        (lambda: lk.type_counts_from_labels(np.array([[0, 3]]), 3), r"\[0, 3\)"),
        (lambda: lk.type_counts_from_labels(np.array([0, 1]), 3), "shape"),
        (lambda: lk.type_counts_from_labels(np.array([[0.0, 1.0]]), 3), "integers"),
        (lambda: lk.num_outcomes(0, 3), "num_clients"),
        (lambda: lk.expected_leakage(2, 2, 0), "num_clients"),
        (lambda: lk.expected_leakage(2, 2, 5, method="bogus"), "method"),
        (lambda: lk.expected_leakage(2, 2, 5, method="monte_carlo"), "rng"),
        (lambda: lk.expected_leakage(2, 2, 5, method="monte_carlo", rng=np.random.default_rng(0), num_samples=1),
         "num_samples"),
        (lambda: lk.expected_leakage(10, 8, 100, method="enumerate"), "max_outcomes"),
        (lambda: lk.expected_leakage(2, 2, 50, method="enumerate", max_outcomes=10), "max_outcomes"),
        (lambda: lk.expected_leakage(2, 2, 5, max_exact_terms=-1), "max_exact_terms"),
    ],
)
def test_validation_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------------------ script
def test_leakage_table_script(tmp_path, capsys, load_script):
    mod = load_script("leakage_table")
    out = tmp_path / "t.md"
    mod.main(["--num-classes", "2", "--batch-sizes", "1", "--num-clients", "1", "2", "--out", str(out)])
    text = out.read_text()
    assert text == capsys.readouterr().out
    assert "| 2 | 1 | 2 | 1 | 1 (exact) | 0.5 (exact) |" in text
    mod.main(["--num-classes", "3", "--batch-sizes", "2", "--num-clients", "4", "--method", "monte_carlo",
              "--num-samples", "10"])
    assert "(MC)" in capsys.readouterr().out


@pytest.mark.parametrize("n,k", [(2, 1), (2, 2), (10, 1), (10, 2)])
def test_expected_leakage_falls_as_the_number_of_clients_grows(n, k):
    """Paper 003's trend ("U is typically large ... the privacy leakage with shuffled output is negligible", line 101):
    the exact expected leakage of the shuffled upload strictly falls with U (results/fbftl/claims.csv cites this
    test for its "check" line; leakage.md tabulates it)."""
    us = (1, 2, 5, 10, 100, 1000)
    leak = [lk.expected_leakage(n, k, u, method="exact").mean for u in us]
    assert all(a > b for a, b in zip(leak, leak[1:])), leak
    assert leak[0] == pytest.approx(lk.prior_entropy(n, k), abs=1e-12)
