"""DCTCompressor (fedrun.compress.cs): FL-CS / FL-FREQ operator, chunked layout, reconstruction."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrun.compress.cs import DCTCompressor
from fedrun.compress.dct import dct_matrix
from fedrun.compress.l1 import bpdn_objective
from fedrun.compress.masks import shared_permutation
from tolerance import assert_f32_close, fft_terms


def reference_matrix(comp: DCTCompressor) -> np.ndarray:
    """Φ of the documented layout, built with explicit DCT matrices and loops (not the code under test).

    Shuffle with the shared permutation (if on), give chunk p the next n//P (+1 for p < n%P) entries, pad it
    with zeros to chunk_len, keep its first m//P (+1 for p < m%P) DCT rows; stack the chunks' rows.
    """
    n, P, c = comp.n, comp.chunks, comp.chunk_len
    order = shared_permutation(n, comp.seed).numpy() if comp.shuffle else np.arange(n)
    rows, start = [], 0
    for p in range(P):
        n_p = n // P + (1 if p < n % P else 0)
        m_p = comp.m // P + (1 if p < comp.m % P else 0)
        D = dct_matrix(c, m_p).numpy()  # [m_p, c]
        block = np.zeros((m_p, n))
        for i in range(n_p):
            block[:, order[start + i]] = D[:, i]
        rows.append(block)
        start += n_p
    return np.concatenate(rows)


@pytest.mark.parametrize(
    ("n", "r", "chunks", "shuffle", "fast"),
    [(64, 0.25, 1, None, None), (101, 0.1, 1, None, None), (101, 0.3, 1, True, None), (100, 0.2, 4, None, None),
     (103, 0.3, 7, None, None), (103, 0.3, 7, False, False), (97, 0.5, 3, True, True), (50, 1.0, 1, None, True)],
)
def test_operator_matches_explicit_reference(n: int, r: float, chunks: int, shuffle, fast) -> None:
    comp = DCTCompressor(n, r, chunks=chunks, seed=5, shuffle=shuffle, pad_to_fast_len=fast, device="cpu")
    phi = reference_matrix(comp)
    assert phi.shape == (comp.m, n) and sum(comp.chunk_m) == comp.m
    x = torch.randn(3, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    np.testing.assert_allclose(comp.compress(x).numpy(), x.numpy() @ phi.T, atol=1e-12)
    y = torch.randn(3, comp.m, dtype=torch.float64, generator=torch.Generator().manual_seed(n + 1))
    np.testing.assert_allclose(comp.zero_fill(y).numpy(), y.numpy() @ phi, atol=1e-12)


def test_unchunked_default_is_the_first_m_dct_rows_with_orthonormal_rows() -> None:
    comp = DCTCompressor(200, 0.1)
    assert (comp.m, comp.chunks, comp.shuffle, comp.chunk_len) == (20, 1, False, 200)
    phi = comp.compress(torch.eye(200, dtype=torch.float64)).T  # columns Φe_j
    np.testing.assert_allclose(phi.numpy(), dct_matrix(200, 20).numpy(), atol=1e-12)
    np.testing.assert_allclose((phi @ phi.T).numpy(), np.eye(20), atol=1e-12)


@given(n=st.integers(2, 200), r=st.floats(0.01, 1.0), chunks=st.integers(1, 9), shuffle=st.booleans(), fast=st.booleans())
@settings(max_examples=20, deadline=None)
def test_linear_and_adjoint_for_any_layout(n: int, r: float, chunks: int, shuffle: bool, fast: bool) -> None:
    comp = DCTCompressor(n, r, seed=1, shuffle=shuffle, pad_to_fast_len=fast, chunks=min(chunks, DCTCompressor(n, r).m))
    gen = torch.Generator().manual_seed(n)
    a, b = torch.randn(2, n, generator=gen, dtype=torch.float64), torch.randn(2, n, generator=gen, dtype=torch.float64)
    np.testing.assert_allclose((comp.compress(a) + comp.compress(b)).numpy(), comp.compress(a + b).numpy(), atol=1e-12)
    y = torch.randn(comp.m, generator=gen, dtype=torch.float64)
    assert float(comp.compress(a[0]) @ y) == pytest.approx(float(a[0] @ comp.adjoint(y)), abs=1e-10)
    assert comp.compress(a).shape == (2, comp.m)
    # ‖Φ‖₂ <= 1 (FISTA's step size 1 relies on it), measured on the explicit matrix.
    phi = comp.compress(torch.eye(n, dtype=torch.float64))
    assert float(torch.linalg.matrix_norm(phi, ord=2)) <= 1 + 1e-9


def test_clients_and_server_with_the_same_seed_agree() -> None:
    x = torch.randn(1000)
    a, b = DCTCompressor(1000, 0.1, chunks=4, seed=9), DCTCompressor(1000, 0.1, chunks=4, seed=9)
    assert torch.equal(a.compress(x), b.compress(x))
    assert not torch.equal(a.compress(x), DCTCompressor(1000, 0.1, chunks=4, seed=10).compress(x))


def test_aggregation_in_the_compressed_domain() -> None:
    """Paper 000, Sec. II-C: Σ_k C(Δw_k) = C(Σ_k Δw_k), so the server can average messages."""
    comp = DCTCompressor(5000, 0.05, chunks=8)
    updates = torch.randn(10, 5000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    # the identity in float64: both sides' round-off, a DCT of each chunk (≤ the vector's L2 norm) and a mean of 10
    scale = updates.norm(dim=1).mean()
    assert_f32_close(comp.compress(updates).mean(0), comp.compress(updates.mean(0)), scale,
                     terms=2 * (fft_terms(comp.chunk_len) + 10 + 1), dtype=torch.float64)


def random_sparse(n: int, count: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.zeros(n, dtype=torch.float64)
    idx = torch.randperm(n, generator=gen)[:count]
    x[idx] = (torch.randint(0, 2, (count,), generator=gen) * 2 - 1) * (1 + torch.rand(count, generator=gen, dtype=torch.float64))
    return x


def rel_err(s: torch.Tensor, x: torch.Tensor) -> float:
    return float((s - x).norm() / x.norm())


@pytest.mark.parametrize("solver", ["fista", "owlqn"])
def test_chunked_reconstruction_is_as_good_as_unchunked_on_shuffled_sparse_vectors(solver: str) -> None:
    x = random_sparse(2048, 6, torch.Generator().manual_seed(3))
    errors = {}
    for chunks in (1, 4):
        comp = DCTCompressor(2048, 0.25, chunks=chunks, shuffle=True, seed=1)
        s = comp.reconstruct(comp.compress(x), lam_rel=1e-3, solver=solver, max_iter=3000, tol=1e-8)
        errors[chunks] = rel_err(s, x)
    assert errors[1] < 1e-2 and errors[4] < 1e-2  # bias ~ lam_rel
    assert abs(errors[4] - errors[1]) < 5e-3


def test_shuffling_rescues_a_clustered_support() -> None:
    """First-m DCT rows are a low-pass sensor: contiguous spikes are lost, the same spikes shuffled are recovered."""
    x = torch.zeros(2048, dtype=torch.float64)
    x[1000:1008] = torch.tensor([1.0, -1.5, 2.0, -1.0, 1.2, -1.8, 1.1, -1.3], dtype=torch.float64)
    errors = {}
    for shuffle in (False, True):
        comp = DCTCompressor(2048, 0.25, shuffle=shuffle, seed=2)
        errors[shuffle] = rel_err(comp.reconstruct(comp.compress(x), lam_rel=1e-3, max_iter=2000, tol=1e-8), x)
    assert errors[False] > 0.2 and errors[True] < 1e-2


def test_owlqn_chunk_by_chunk_and_batched_fista_solve_the_same_problem() -> None:
    gen = torch.Generator().manual_seed(4)
    comp = DCTCompressor(1001, 0.21, chunks=3, seed=0)  # uneven n and m: padded chunks, unequal m_p
    x = random_sparse(1001, 8, gen) + 0.01 * torch.randn(1001, generator=gen, dtype=torch.float64)
    y = comp.compress(x)
    lam = 0.05 * comp.lambda_max(y)
    assert comp.chunk_len > 334 and len(set(comp.chunk_m)) == 2
    objective = {
        solver: bpdn_objective(comp.compress, y, comp.reconstruct(y, 0.05, solver, max_iter=3000, tol=1e-9), lam)
        for solver in ("fista", "owlqn")
    }
    assert objective["owlqn"] == pytest.approx(objective["fista"], rel=1e-5)


def test_reconstruction_satisfies_kkt_for_the_chunked_operator() -> None:
    gen = torch.Generator().manual_seed(5)
    comp = DCTCompressor(600, 0.3, chunks=3, seed=0)
    x = random_sparse(600, 10, gen)
    y = comp.compress(x) + 0.01 * torch.randn(comp.m, generator=gen, dtype=torch.float64)
    s = comp.reconstruct(y, lam_rel=0.05, max_iter=5000, tol=1e-10)
    phi = reference_matrix(comp)
    g = phi.T @ (y.numpy() - phi @ s.numpy())
    lam = 0.05 * np.abs(phi.T @ y.numpy()).max()
    support = s.numpy() != 0
    assert np.abs(g).max() <= lam * (1 + 1e-4)
    np.testing.assert_allclose(g[support], lam * np.sign(s.numpy()[support]), rtol=0, atol=1e-4 * lam)


def test_warm_start_helps_the_next_round() -> None:
    gen = torch.Generator().manual_seed(6)
    comp = DCTCompressor(2048, 0.25, chunks=4)
    x = random_sparse(2048, 6, gen)
    first = comp.reconstruct_with_info(comp.compress(x), 0.01, max_iter=3000, tol=1e-6)
    x_next = x + 0.01 * random_sparse(2048, 6, gen)  # the next round's update is close to this one
    cold = comp.reconstruct_with_info(comp.compress(x_next), 0.01, max_iter=3000, tol=1e-6)
    warm = comp.reconstruct_with_info(comp.compress(x_next), 0.01, max_iter=3000, tol=1e-6, warm_start=first.s)
    assert warm.iterations < cold.iterations
    assert rel_err(warm.s, cold.s) < 1e-3


def test_reconstruct_keeps_dtype_shape_and_returns_zero_for_zero() -> None:
    comp = DCTCompressor(500, 0.2, chunks=2)
    y = comp.compress(torch.randn(500))
    for solver in ("fista", "owlqn"):
        s = comp.reconstruct(y, solver=solver, max_iter=20)
        assert s.shape == (500,) and s.dtype == torch.float32
        assert torch.equal(comp.reconstruct(torch.zeros(comp.m), solver=solver), torch.zeros(500))
        assert torch.equal(comp.reconstruct(y, lam_rel=1.0, solver=solver), torch.zeros(500))  # λ = λ_max


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: DCTCompressor(100, 0.0), r"r=0.0; allowed: 0 < r <= 1"),
        (lambda: DCTCompressor(100, 1.01), r"r=1.01; allowed: 0 < r <= 1"),
        (lambda: DCTCompressor(0, 0.5), r"n=0; allowed: n >= 1"),
        (lambda: DCTCompressor(100, 0.1, chunks=0), r"chunks=0; allowed: 1 <= chunks <= m=10"),
        (lambda: DCTCompressor(100, 0.1, chunks=11), r"chunks=11; allowed: 1 <= chunks <= m=10"),
        (lambda: DCTCompressor(100, 0.1).compress(torch.zeros(99)), r"x.shape=\(99,\); allowed: last dimension == 100"),
        (lambda: DCTCompressor(100, 0.1).zero_fill(torch.zeros(11)), r"y.shape=\(11,\); allowed: last dimension == 10"),
        (lambda: DCTCompressor(100, 0.1).reconstruct(torch.ones(10), lam_rel=0.0), r"lam_rel=0.0; allowed: 0 < lam_rel < inf"),
        (lambda: DCTCompressor(100, 0.1).reconstruct(torch.ones(10), lam_rel=float("nan")), r"lam_rel=nan; allowed"),
        (lambda: DCTCompressor(100, 0.1).reconstruct(torch.ones(10), solver="cg"), r"solver='cg'; allowed"),
        (lambda: DCTCompressor(100, 0.1).reconstruct(torch.ones(2, 10)), r"y.shape=\(2, 10\); allowed: \[m=10\]"),
        (lambda: DCTCompressor(100, 0.1).reconstruct(torch.ones(10), warm_start=torch.ones(5)), r"warm_start.shape=\(5,\)"),
        (lambda: DCTCompressor(100, 0.1).reconstruct(torch.ones(10), max_iter=0), r"max_iter=0; allowed"),
    ],
)
def test_bad_input_raises_value_error(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_compress_and_fista_stay_on_the_device() -> None:
    comp = DCTCompressor(10_000, 0.1, chunks=4, device="cuda")
    x = random_sparse(10_000, 10, torch.Generator().manual_seed(7)).float().cuda()
    y = comp.compress(x)
    assert y.device.type == "cuda"
    s = comp.reconstruct(y, lam_rel=1e-3, max_iter=2000, tol=1e-7)
    assert s.device.type == "cuda" and rel_err(s, x) < 1e-2
    cpu = DCTCompressor(10_000, 0.1, chunks=4)
    # cuFFT vs pocketfft in float32: both sides' FFT round-off at the scale of ‖x‖₂
    assert_f32_close(y, cpu.compress(x.cpu()), x.norm(), terms=2 * fft_terms(comp.chunk_len))
    s_owlqn = comp.reconstruct(y, lam_rel=1e-3, solver="owlqn", max_iter=2000, tol=1e-7)
    assert s_owlqn.device.type == "cuda" and rel_err(s_owlqn, x) < 1e-2
