"""FFT-based orthonormal DCT-II/III (fedrun.compress.dct) against explicit matrices and scipy.fft."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.fft
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrun.compress.dct import dct, dct_matrix, idct
from tolerance import f32_tol, fft_terms

SIZES = [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 64, 100, 127, 128, 255, 1000, 1001]


def explicit_dct_matrix(n: int) -> np.ndarray:
    """Textbook orthonormal DCT-II matrix, written out element by element (independent of dct_matrix)."""
    out = np.empty((n, n))
    for k in range(n):
        scale = math.sqrt(1.0 / n) if k == 0 else math.sqrt(2.0 / n)
        for j in range(n):
            out[k, j] = scale * math.cos(math.pi * k * (2 * j + 1) / (2 * n))
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 16, 17, 31, 32])
def test_dct_equals_explicit_matrix_product(n: int) -> None:
    D = explicit_dct_matrix(n)
    x = torch.randn(3, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    np.testing.assert_allclose(dct(x).numpy(), x.numpy() @ D.T, atol=1e-12)
    np.testing.assert_allclose(dct_matrix(n).numpy(), D, atol=1e-13)


@pytest.mark.parametrize("n", SIZES)
def test_dct_and_idct_match_scipy(n: int) -> None:
    x = torch.randn(2, 3, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    ref = scipy.fft.dct(x.numpy(), type=2, norm="ortho", axis=-1)
    np.testing.assert_allclose(dct(x).numpy(), ref, atol=1e-12)
    for m in sorted({1, max(1, n // 3), n}):
        np.testing.assert_allclose(dct(x, m).numpy(), ref[..., :m], atol=1e-12)
        y = x[..., :m]
        padded = np.concatenate([y.numpy(), np.zeros((*y.shape[:-1], n - m))], axis=-1)
        np.testing.assert_allclose(idct(y, n).numpy(), scipy.fft.idct(padded, type=2, norm="ortho", axis=-1), atol=1e-12)


@pytest.mark.parametrize("n", [5, 64, 1001, 4096])
def test_roundtrip_is_identity_in_float32(n: int) -> None:
    x = torch.randn(4, n, generator=torch.Generator().manual_seed(n))
    back = idct(dct(x))
    assert back.dtype == torch.float32
    # two float32 transforms, each within fft_terms(n) roundings of ‖x‖₂ (normwise)
    assert float((back - x).norm() / x.norm()) <= f32_tol(1.0, terms=2 * fft_terms(n))


@given(n=st.integers(1, 300), data=st.data())
@settings(max_examples=25, deadline=None)
def test_rows_are_orthonormal_and_idct_is_adjoint(n: int, data: st.DataObject) -> None:
    m = data.draw(st.integers(1, n))
    gen = torch.Generator().manual_seed(n * 1000 + m)
    # Φ Φᵀ = I_m, computed column by column through the fast transforms.
    eye = torch.eye(m, dtype=torch.float64)
    np.testing.assert_allclose(dct(idct(eye, n), m).numpy(), eye.numpy(), atol=1e-12)
    # <Φx, y> = <x, Φᵀy>
    x, y = torch.randn(n, dtype=torch.float64, generator=gen), torch.randn(m, dtype=torch.float64, generator=gen)
    assert float(dct(x, m) @ y) == pytest.approx(float(x @ idct(y, n)), abs=1e-10)


def test_linearity() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 777, generator=gen, dtype=torch.float64), torch.randn(3, 777, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(dct(a, 100) + dct(b, 100), dct(a + b, 100), atol=1e-12, rtol=0)
    torch.testing.assert_close(dct(2.5 * a, 100), 2.5 * dct(a, 100), atol=1e-12, rtol=0)


def test_partial_rows_of_dct_matrix() -> None:
    np.testing.assert_allclose(dct_matrix(37, 5).numpy(), explicit_dct_matrix(37)[:5], atol=1e-13)
    assert dct_matrix(10, 3, dtype=torch.float32).dtype == torch.float32


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: dct(torch.zeros(4, dtype=torch.int64)), r"x.dtype=torch.int64; allowed"),
        (lambda: dct(torch.zeros(4, dtype=torch.float16)), r"allowed: torch.float32 or torch.float64"),
        (lambda: dct(torch.zeros(4), 5), r"m=5; allowed: 1 <= m <= n=4"),
        (lambda: dct(torch.zeros(4), 0), r"m=0; allowed"),
        (lambda: dct(torch.zeros(3, 0)), r"last dimension must have length >= 1"),
        (lambda: idct(torch.zeros(4), 3), r"n=3; allowed: n >= m=4"),
        (lambda: dct_matrix(0), r"allowed: n >= 1"),
        (lambda: dct_matrix(3, 4), r"allowed: n >= 1 and 1 <= m <= n"),
    ],
)
def test_bad_input_raises_value_error(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_cuda_without_leaving_the_device() -> None:
    x = torch.randn(2, 1001, device="cuda", dtype=torch.float64)
    y = dct(x, 50)
    assert y.device.type == "cuda" and idct(y, 1001).device.type == "cuda"
    ref = scipy.fft.dct(x.cpu().numpy(), norm="ortho", axis=-1)[..., :50]
    np.testing.assert_allclose(y.cpu().numpy(), ref, atol=1e-12)
