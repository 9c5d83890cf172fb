"""Count sketch, PRIVIX / HEAVYMIX / HEAPRIX (paper 002) against independent references.

References used here: a brute-force per-coordinate Python loop (sketch, PRIVIX with ``statistics.median``),
the hash formula evaluated with Python integers, numpy sorting for the heavy set, closed forms for the
compression ratios and Theorem 1, and statistical bounds over many seeds. Float32 results are compared
within float32 round-off at the scale of the values (tests/tolerance.py): a bucket is a float32 sum of at
most ``occupancy(cs)`` coordinates, so it errs by at most that many roundings of ``bucket_abs`` (Σ|xᵢ| over
the bucket); PRIVIX only selects and halves bucket values.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrun.compress.sketch import MERSENNE_PRIME, CountSketch, compression_ratio, sketch_epsilon
from tolerance import assert_f32_close, f32_tol

P = MERSENNE_PRIME


# ---------------------------------------------------------------- independent references
def ref_hashes(coeffs: torch.Tensor, k: int, coords: range) -> tuple[list[list[int]], list[list[int]]]:
    """h_j(i) = ((a i + b) mod p) mod k and s_j(i) = 1 - 2 (((c i + e) mod p) mod 2), in Python integers."""
    buckets, signs = [], []
    for a, b, c, e in coeffs.tolist():
        buckets.append([((a * i + b) % P) % k for i in coords])
        signs.append([1 - 2 * (((c * i + e) % P) % 2) for i in coords])
    return buckets, signs


def ref_sketch(x: list[float], buckets: list[list[int]], signs: list[list[int]], k: int) -> list[list[float]]:
    S = [[0.0] * k for _ in buckets]
    for j, (bj, sj) in enumerate(zip(buckets, signs)):
        for i, xi in enumerate(x):
            S[j][bj[i]] += sj[i] * xi
    return S


def ref_privix(S: list[list[float]], buckets: list[list[int]], signs: list[list[int]]) -> list[float]:
    d = len(buckets[0])
    return [statistics.median(signs[j][i] * S[j][buckets[j][i]] for j in range(len(S))) for i in range(d)]


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def heavy_tailed(d: int, seed: int) -> torch.Tensor:
    """Standard Cauchy entries: a few coordinates dominate the norm."""
    u = torch.rand(d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.tan(math.pi * (u - 0.5)).float()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def bucket_abs(cs: CountSketch, x_abs: torch.Tensor) -> torch.Tensor:
    """Σ|xᵢ| over each bucket, [t, k] (x_abs: [d], nonnegative): the scale of each sketch entry's round-off."""
    buckets, _ = cs.hashes()
    return torch.zeros(cs.rows, cs.cols, dtype=torch.float64).scatter_add_(
        1, buckets.long(), x_abs.double().expand(cs.rows, -1))


def occupancy(cs: CountSketch) -> int:
    """The most coordinates a bucket adds up: the terms of a sketch entry's float32 sum."""
    buckets, _ = cs.hashes()
    return int(max(torch.bincount(row.long(), minlength=cs.cols).max() for row in buckets))


# ---------------------------------------------------------------- hashes
@pytest.mark.parametrize("cache", [True, False])
def test_hashes_match_the_universal_formula(cache: bool) -> None:
    cs = CountSketch(300, 4, 7, seed=11, cache_hashes=cache)
    buckets, signs = cs.hashes()
    rb, rs = ref_hashes(cs.hash_coefficients, 7, range(300))
    assert buckets.tolist() == rb
    assert signs.tolist() == [[float(v) for v in row] for row in rs]
    a, b, c, e = cs.hash_coefficients.T
    assert bool(((a >= 1) & (a < P) & (b >= 0) & (b < P) & (c >= 1) & (c < P) & (e >= 0) & (e < P)).all())


def test_hashes_are_exact_at_the_largest_coordinates() -> None:
    # a·i + b must not overflow int64 for i close to p: compare with Python integers there.
    dim = P - 1
    cs = CountSketch(dim, 3, 1000, seed=5, cache_hashes=False)
    buckets, signs = cs.hashes(dim - 20, dim)
    rb, rs = ref_hashes(cs.hash_coefficients, 1000, range(dim - 20, dim))
    assert buckets.tolist() == rb
    assert signs.tolist() == [[float(v) for v in row] for row in rs]


def test_hashes_are_roughly_uniform() -> None:
    d, k = 20000, 50
    buckets, signs = CountSketch(d, 3, k, seed=2).hashes()
    for j in range(3):
        counts = torch.bincount(buckets[j], minlength=k).double()
        chi2 = float(((counts - d / k) ** 2 / (d / k)).sum())
        assert chi2 < (k - 1) + 6 * math.sqrt(2 * (k - 1)), chi2  # ~6 sigma of a chi^2_{k-1}
        assert abs(float(signs[j].mean())) < 6 / math.sqrt(d)
    assert set(torch.unique(signs).tolist()) == {-1.0, 1.0}


def test_same_seed_same_hashes_different_seed_different() -> None:
    server = CountSketch(5000, 5, 40, seed=123)
    client = CountSketch(5000, 5, 40, seed=123, cache_hashes=False)  # another participant, other code path
    other = CountSketch(5000, 5, 40, seed=124)
    hs, ss = server.hashes()
    hc, sc = client.hashes()
    ho, so = other.hashes()
    assert torch.equal(hs, hc) and torch.equal(ss, sc)
    x = rand(5000)
    # sparse mm vs scatter: two float32 summation orders of the same buckets
    assert_f32_close(server.sketch(x), client.sketch(x), bucket_abs(server, x.abs()), terms=2 * occupancy(server))
    assert float((hs == ho).double().mean()) < 0.1  # ~1/k agree by chance
    assert float((ss == so).double().mean()) < 0.6  # ~1/2 agree by chance


def test_caller_rng_is_untouched() -> None:
    torch.manual_seed(2024)
    np.random.seed(2024)
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()
    cs = CountSketch(1000, 5, 20, seed=9)
    S = cs.sketch(rand(3, 1000))
    cs.privix(S)
    cs.heaprix(S)
    CountSketch(1000, 5, 20, seed=10, cache_hashes=False).sketch(rand(1000))
    assert torch.equal(torch.get_rng_state(), torch_state)
    after = np.random.get_state()
    assert after[0] == np_state[0] and np.array_equal(after[1], np_state[1]) and after[2:] == np_state[2:]
    # and the hashes do not depend on the global seed
    torch.manual_seed(7)
    assert torch.equal(CountSketch(1000, 5, 20, seed=9).hashes()[0], cs.hashes()[0])


# ---------------------------------------------------------------- Alg. 1: sketch
@pytest.mark.parametrize(
    ("d", "t", "k", "cache", "chunk"),
    [
        (50, 1, 5, True, 1 << 22),
        (97, 4, 8, True, 7),
        (97, 4, 8, False, 13),
        (200, 3, 250, False, 1 << 22),
        (20000, 4, 64, True, 1 << 22),  # large enough for the sparse-matrix path
    ],
)
def test_sketch_matches_brute_force_loop(d: int, t: int, k: int, cache: bool, chunk: int) -> None:
    cs = CountSketch(d, t, k, seed=3, cache_hashes=cache, chunk_elements=chunk)
    assert (cs._matrix is not None) == (d * t >= 1 << 16)  # noqa: SLF001 — both code paths are covered
    rb, rs = ref_hashes(cs.hash_coefficients, k, range(d))
    x = rand(d, seed=1)
    expected = torch.tensor(ref_sketch(x.double().tolist(), rb, rs, k), dtype=torch.float64)
    got = cs.sketch(x)
    assert got.shape == (t, k) and got.dtype == torch.float32
    # float32 sums of up to occupancy terms of size ~1: a misplaced or mis-signed term is off by ~1
    assert_f32_close(got, expected, bucket_abs(cs, x.abs()), terms=occupancy(cs))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**63 - 1),
    coef=st.floats(-100, 100, allow_nan=False),
    data_seed=st.integers(0, 10_000),
)
def test_sketch_is_linear(seed: int, coef: float, data_seed: int) -> None:
    cs = CountSketch(333, 5, 17, seed=seed)
    a, b = rand(333, seed=data_seed), rand(333, seed=data_seed + 1)
    occ = occupancy(cs)  # both sides float32: two sums of ≤ occ terms (+ the rounding of a + b, of coef·a)
    assert_f32_close(cs.sketch(a) + cs.sketch(b), cs.sketch(a + b), bucket_abs(cs, a.abs() + b.abs()),
                     terms=2 * occ + 2)
    assert_f32_close(cs.sketch(coef * a), coef * cs.sketch(a), abs(coef) * bucket_abs(cs, a.abs()),
                     terms=2 * occ + 2)


def test_batch_equals_per_vector() -> None:
    cs = CountSketch(500, 6, 30, seed=4, chunk_elements=1000)  # several chunks per call
    X = rand(7, 500, seed=5)
    S = cs.sketch(X)
    assert S.shape == (7, 6, 30)
    occ = occupancy(cs)
    scale = torch.stack([bucket_abs(cs, x.abs()) for x in X])
    assert_f32_close(S, torch.stack([cs.sketch(x) for x in X]), scale, terms=2 * occ)
    P_ = cs.privix(S)
    assert P_.shape == (7, 500)
    # the same S: a median selects, the midpoint of an even count rounds once
    assert_f32_close(P_, torch.stack([cs.privix(s) for s in S]), S.abs().amax((1, 2))[:, None], terms=2)
    H = cs.heaprix(S, 10)
    # the heavy estimates (≤ max|S|) re-sketched (≤ 10 per bucket), subtracted from S, decoded: (1 + 10)·max|S|
    heavy_scale = 11 * S.abs().amax((1, 2))[:, None]
    assert_f32_close(H, torch.stack([cs.heaprix(s, 10) for s in S]), heavy_scale, terms=2 * (10 + 3))
    hh = cs.heavy_hitters(S, 10)
    assert hh.shape == (7, 10)
    assert torch.equal(hh, torch.stack([cs.heavy_hitters(s, 10) for s in S]))


def test_nbytes_and_compression_ratios() -> None:
    assert CountSketch(60000, 20, 40, seed=0, cache_hashes=False).nbytes == 20 * 40 * 4
    assert compression_ratio(60000, 20, 40) == 75.0
    assert compression_ratio(60000, 50, 100) == 12.0
    # LeNet-5 (61,706 parameters): 61706/800 and 61706/5000
    assert compression_ratio(61706, 20, 40) == pytest.approx(77.1325)
    assert compression_ratio(61706, 50, 100) == pytest.approx(12.3412)
    assert CountSketch(60000, 50, 100, seed=0, cache_hashes=False).compression_ratio == 12.0


# ---------------------------------------------------------------- Alg. 2: PRIVIX
@pytest.mark.parametrize(("t", "k"), [(1, 5), (3, 4), (4, 4), (6, 3)])
def test_privix_matches_brute_force_median(t: int, k: int) -> None:
    d = 40
    cs = CountSketch(d, t, k, seed=8)
    rb, rs = ref_hashes(cs.hash_coefficients, k, range(d))
    x = rand(d, seed=2)
    S = cs.sketch(x)
    # statistics.median takes the midpoint of the two middle values when t is even
    expected = torch.tensor(ref_privix(S.double().tolist(), rb, rs), dtype=torch.float64)
    assert_f32_close(cs.privix(S), expected, S.abs().max(), terms=2)  # selection; an even t's midpoint rounds once


def _zscores(estimates: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(mean − x) / standard error, per coordinate, from the draws themselves."""
    est = estimates.double()
    se = est.std(dim=0) / math.sqrt(est.shape[0])
    return (est.mean(dim=0) - x.double()) / se.clamp_min(1e-12)


def _over_seeds(fn, d: int, t: int, k: int, x: torch.Tensor, n: int = 400) -> torch.Tensor:
    out = []
    for seed in range(n):
        cs = CountSketch(d, t, k, seed=seed)
        out.append(fn(cs, cs.sketch(x)))
    return torch.stack(out)


X_UNBIASED = rand(30, seed=3) * torch.tensor([5.0] * 3 + [1.0] * 27)


@pytest.mark.parametrize(("t", "k"), [(1, 4), (3, 4), (4, 4)])
def test_privix_is_unbiased_over_seeds(t: int, k: int) -> None:
    # Small k: heavy collisions, so the per-row noise is large. t = 1 is unbiased exactly (pairwise
    # independent signs); t = 3 (odd median) and t = 4 (midpoint median) are unbiased because the row noises
    # are independent and symmetric. 30 coordinates; 4.5 standard errors each.
    est = _over_seeds(lambda cs, S: cs.privix(S), 30, t, k, X_UNBIASED)
    z = _zscores(est, X_UNBIASED)
    assert float(z.abs().max()) < 4.5, z


def test_the_unbiasedness_check_has_power() -> None:
    # The same check rejects (i) the lower median torch.median takes for even t, (ii) biased HEAVYMIX.
    def lower_median(cs: CountSketch, S: torch.Tensor) -> torch.Tensor:
        b, s = cs.hashes()
        return (S[torch.arange(cs.rows)[:, None], b] * s).median(dim=0).values

    z_low = _zscores(_over_seeds(lower_median, 30, 4, 4, X_UNBIASED), X_UNBIASED)
    assert float(z_low.abs().max()) > 6, z_low
    z_heavy = _zscores(_over_seeds(lambda cs, S: cs.heavymix(S, 3), 30, 3, 4, X_UNBIASED), X_UNBIASED)
    assert float(z_heavy.abs().max()) > 6, z_heavy


# ---------------------------------------------------------------- Alg. 3: HEAVYMIX
def test_heavy_hitters_are_the_top_m_of_the_estimate() -> None:
    cs = CountSketch(400, 5, 30, seed=1)
    S = cs.sketch(heavy_tailed(400, seed=1))
    est = cs.privix(S).numpy()
    expected = np.sort(np.argsort(-np.abs(est), kind="stable")[:12])
    got = cs.heavy_hitters(S, 12)
    assert got.dtype == torch.int64
    assert got.tolist() == expected.tolist()
    assert cs.heavy_hitters(S).shape == (30,)  # default m = k


@pytest.mark.parametrize("seed", range(5))
def test_heavymix_recovers_a_sparse_vector(seed: int) -> None:
    # 10 nonzeros, 500 bins: a zero coordinate collides with a nonzero one in a row w.p. ~0.02, so its
    # median over 9 rows is nonzero w.p. ~C(9,5)·0.02^5 ≈ 4e-7; a nonzero one is exact unless >= 5 rows collide.
    d, nnz = 5000, 10
    g = torch.Generator().manual_seed(seed)
    support = torch.randperm(d, generator=g)[:nnz]
    x = torch.zeros(d)
    x[support] = (torch.rand(nnz, generator=g) + 0.5) * (torch.randint(0, 2, (nnz,), generator=g) * 2 - 1)
    cs = CountSketch(d, 9, 500, seed=seed)
    S = cs.sketch(x)
    H = cs.heavy_hitters(S, nnz)
    assert H.tolist() == sorted(support.tolist())
    # a bucket holding other nonzeros errs by ≤ nnz roundings of Σ|x|
    assert_f32_close(cs.heavymix(S, nnz), x, x.abs().sum(), terms=nnz + 1)
    torch.testing.assert_close(cs.heavymix(S, nnz, exact_values=x[H]), x, rtol=0, atol=0)


def test_heavymix_keeps_exactly_m_coordinates() -> None:
    cs = CountSketch(1000, 5, 40, seed=2)
    x = heavy_tailed(1000, seed=2)
    S = cs.sketch(x)
    H = cs.heavy_hitters(S, 25)
    out = cs.heavymix(S, 25, exact_values=x[H])
    assert int((out != 0).sum()) == 25
    torch.testing.assert_close(out[H], x[H], rtol=0, atol=0)
    torch.testing.assert_close(cs.heavymix(S, 25)[H], cs.privix(S)[H], rtol=0, atol=0)
    torch.testing.assert_close(cs.heavymix(S, 25, indices=H), cs.heavymix(S, 25), rtol=0, atol=0)


# ---------------------------------------------------------------- Alg. 4: HEAPRIX
def test_heaprix_is_heavymix_plus_privix_of_the_residual_sketch() -> None:
    # Composition from the public operators (dense re-sketch of h) vs heaprix (sparse re-sketch).
    cs = CountSketch(800, 6, 30, seed=3)
    x = heavy_tailed(800, seed=3)
    S = cs.sketch(x)
    h = cs.heavymix(S, 15)
    # both float32: S − S(h) with h ≤ max|S| on 15 coordinates (≤ 16·max|S| per bucket), decoded, + h
    scale, terms = 16 * S.abs().max(), 2 * (15 + 4)
    assert_f32_close(cs.heaprix(S, 15), h + cs.privix(S - cs.sketch(h)), scale, terms=terms)
    H = cs.heavy_hitters(S, 15)
    h_exact = torch.zeros(800)
    h_exact[H] = x[H]
    residual = cs.privix(S - cs.sketch(h_exact))
    residual[H] = 0.0
    scale = S.abs().max() + bucket_abs(cs, h_exact.abs()).max()
    assert_f32_close(cs.heaprix(S, 15, x[H]), h_exact + residual, scale, terms=terms)


def test_two_exchange_protocol_equals_heaprix_of_the_average() -> None:
    # Round 1: devices upload sketches, server averages; round 2: exact values on H, averaged.
    K, d = 6, 1500
    cs = CountSketch(d, 5, 40, seed=21)
    X = torch.stack([heavy_tailed(d, seed=s) for s in range(K)])
    w = torch.rand(K, generator=torch.Generator().manual_seed(0))
    w = w / w.sum()
    S_bar = (w[:, None, None] * cs.sketch(X)).sum(dim=0)
    H = cs.heavy_hitters(S_bar)
    v_bar = (w[:, None] * X[:, H]).sum(dim=0)
    phi = cs.heaprix(S_bar, exact_heavy_values=v_bar, indices=H)
    x_bar = (w[:, None] * X).sum(dim=0)
    direct = cs.heaprix(cs.sketch(x_bar), exact_heavy_values=x_bar[H])
    # float32 sums in two orders (Σ_j w_j·S(x_j) vs S(Σ_j w_j x_j)), then the same decode; on H the heavy
    # values' re-sketch (≤ Σ over the bucket of Σ_j w_j|x_j|) is subtracted
    wx_abs = (w[:, None] * X.abs()).sum(0)
    scale = 2 * bucket_abs(cs, wx_abs).max()
    assert_f32_close(phi, direct, scale, terms=2 * (K + occupancy(cs) + 4))
    assert_f32_close(phi[H], x_bar[H], wx_abs[H], terms=2 * (K + 1))  # both Σ_j w_j x_j[H], two orders


def test_heaprix_tends_to_identity_as_the_sketch_grows() -> None:
    d, t = 1000, 5
    x = heavy_tailed(d, seed=7)
    ks = [20, 100, 500, 2000]
    errs_sketch, errs_exact = [], []
    for k in ks:
        e_s = e_x = 0.0
        for seed in range(6):
            cs = CountSketch(d, t, k, seed=seed)
            S = cs.sketch(x)
            H = cs.heavy_hitters(S)
            e_s += rel_err(cs.heaprix(S), x) / 6
            e_x += rel_err(cs.heaprix(S, exact_heavy_values=x[H]), x) / 6
        errs_sketch.append(e_s)
        errs_exact.append(e_x)
    assert all(a > b for a, b in zip(errs_sketch, errs_sketch[1:])), errs_sketch
    assert all(a > b for a, b in zip(errs_exact, errs_exact[1:])), errs_exact
    assert errs_exact[-1] == 0.0  # m = min(k, d) = d: every coordinate is exact
    assert errs_sketch[-1] < 1e-3  # k = 2d: peeling the heavy part leaves almost no collisions


@pytest.mark.parametrize(
    ("d", "t", "k", "m", "exact"), [(2000, 5, 50, 50, True), (6000, 20, 40, 20, False), (6000, 20, 40, 40, True)]
)
def test_heaprix_error_below_privix_on_heavy_tailed_vectors(d: int, t: int, k: int, m: int, exact: bool) -> None:
    # Sketch-only HEAPRIX (paper's Alg. 4) needs t large or m < k to win: with the same hashes the
    # estimation error of the heavy part is subtracted in all t rows (see the report / docstring).
    e_privix = e_heaprix = 0.0
    for seed in range(8):
        x = heavy_tailed(d, seed=100 + seed)
        cs = CountSketch(d, t, k, seed=seed)
        S = cs.sketch(x)
        values = x[cs.heavy_hitters(S, m)] if exact else None
        e_privix += rel_err(cs.privix(S), x)
        e_heaprix += rel_err(cs.heaprix(S, m, values), x)
    assert e_heaprix < 0.95 * e_privix, (e_heaprix, e_privix)


# ---------------------------------------------------------------- Theorem 1
def test_sketch_epsilon_by_hand() -> None:
    # l = m + 1 makes ln(l - m) = 0: q = alpha C^2 m / sigma^2.
    # m=2, alpha=4, C=0.5, sigma^2=8: q = 4 * 0.25 * 2 / 8 = 0.25 = 1/2 - 1/4 (the boundary, allowed).
    assert sketch_epsilon(3, 2, 3, math.sqrt(8), 0.5, 4.0) == pytest.approx(3 * math.log(1.25), rel=1e-12)
    # alpha=10, C=1, sigma^2=200: q = 10 * 2 / 200 = 0.1 <= 0.4; eps = 5 ln 1.1
    assert sketch_epsilon(5, 2, 3, math.sqrt(200), 1.0, 10.0) == pytest.approx(5 * math.log(1.1), rel=1e-12)
    # one bin: m(m-1) = 0 → eps = 0
    assert sketch_epsilon(7, 1, 100, 1.0, 3.0, 4.0) == 0.0
    # a case with the log term: t=2, m=3, l=1000, sigma=1, C=0.1, alpha=4
    # q = 4*0.01*6/998 * (1 + ln 997) = 2.40481e-4 * 7.904752 = 1.900944e-3; eps = 2 ln(1.001900944)
    assert sketch_epsilon(2, 3, 1000, 1.0, 0.1, 4.0) == pytest.approx(2 * 1.899139e-3, rel=1e-5)


def test_sketch_epsilon_condition_and_validation() -> None:
    with pytest.raises(ValueError, match="condition violated"):
        sketch_epsilon(3, 2, 3, math.sqrt(8), 0.5 * 1.001, 4.0)  # just over the boundary case above
    with pytest.raises(ValueError, match="condition violated"):
        sketch_epsilon(20, 40, 60000, 1.0, 4.0, 4.0)  # paper's (20, 40) on LeNet-5 with C = 4 sigma
    with pytest.raises(ValueError, match="condition violated"):
        sketch_epsilon(1, 2, 3, 1.0, 1e-3, 1.5)  # alpha < 2: the right side is negative
    # (20, 40) on l = 60,000: the condition holds iff C/sigma <= 1/(4 sqrt(1560 (1 + ln 59960) / 59998)) ≈ 0.4475
    assert sketch_epsilon(20, 40, 60000, 1.0, 0.447, 4.0) == pytest.approx(20 * math.log(1.25), rel=3e-3)
    with pytest.raises(ValueError, match="condition violated"):
        sketch_epsilon(20, 40, 60000, 1.0, 0.448, 4.0)
    for kwargs, name in [
        (dict(rows=0), "rows"),
        (dict(cols=0), "cols"),
        (dict(length=40), "length"),
        (dict(sigma=0.0), "sigma"),
        (dict(bound_C=-1.0), "bound_C"),
        (dict(alpha=float("inf")), "alpha"),
    ]:
        args = dict(rows=2, cols=40, length=1000, sigma=1.0, bound_C=0.01, alpha=4.0) | kwargs
        with pytest.raises(ValueError, match=name):
            sketch_epsilon(**args)


# ---------------------------------------------------------------- validation
def test_constructor_validation() -> None:
    for kwargs, name in [
        (dict(dim=0), "dim"),
        (dict(dim=P), "dim"),
        (dict(rows=0), "rows"),
        (dict(cols=0), "cols"),
        (dict(seed=-1), "seed"),
        (dict(seed=2**63), "seed"),
        (dict(seed=1.5), "seed"),
        (dict(rows=True), "rows"),
    ]:
        args = dict(dim=10, rows=2, cols=3, seed=0) | kwargs
        with pytest.raises(ValueError, match=name):
            CountSketch(**args)


def test_operator_validation() -> None:
    cs = CountSketch(100, 3, 10, seed=0)
    S = cs.sketch(rand(100))
    with pytest.raises(ValueError, match=r"x.shape=\(99,\)"):
        cs.sketch(rand(99))
    with pytest.raises(ValueError, match="x.dtype"):
        cs.sketch(rand(100).double())
    with pytest.raises(ValueError, match="x.device"):
        cs.sketch(torch.zeros(100, device="meta"))
    with pytest.raises(ValueError, match="S.shape"):
        cs.privix(torch.zeros(3, 11))
    with pytest.raises(ValueError, match="m=0"):
        cs.heavymix(S, 0)
    with pytest.raises(ValueError, match="m=101"):
        cs.heaprix(S, 101)
    with pytest.raises(ValueError, match="exact_values.shape"):
        cs.heavymix(S, 5, exact_values=torch.zeros(6))
    with pytest.raises(ValueError, match="exact_heavy_values.dtype"):
        cs.heaprix(S, 5, exact_heavy_values=torch.zeros(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="indices.shape"):
        cs.heavymix(S, 5, indices=torch.arange(4))
    with pytest.raises(ValueError, match="duplicates"):
        cs.heaprix(S, 3, indices=torch.tensor([1, 1, 2]))
    with pytest.raises(ValueError, match="allowed: 0 <= index < 100"):
        cs.heaprix(S, 2, indices=torch.tensor([1, 100]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    x = heavy_tailed(5000, seed=1)
    cpu = CountSketch(5000, 5, 50, seed=3)
    gpu = CountSketch(5000, 5, 50, seed=3, device="cuda")
    S = cpu.sketch(x)
    S_gpu = gpu.sketch(x.cuda())
    assert_f32_close(S_gpu, S, bucket_abs(cpu, x.abs()), terms=2 * occupancy(cpu))  # two summation orders
    assert_f32_close(gpu.privix(S.cuda()), cpu.privix(S), S.abs().max(), terms=2)  # the same S: selection
    assert torch.equal(gpu.heavy_hitters(S.cuda()).cpu(), cpu.heavy_hitters(S))
    m = cpu.default_num_heavy
    assert_f32_close(gpu.heaprix(S.cuda()), cpu.heaprix(S), (m + 1) * S.abs().max(), terms=2 * (m + 4))
