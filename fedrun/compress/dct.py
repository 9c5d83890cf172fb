"""Orthonormal DCT-II / DCT-III along the last dimension, via one real FFT (Makhoul 1980).

These are the sensing operator of FL-FREQ / FL-CS (paper 000, Sec. III-B, Eq. (3)):
``C(x, m) = Φ x`` with Φ the first ``m`` rows of the orthonormal DCT-II matrix, and its adjoint
``Φᵀ y`` = inverse DCT (DCT-III) of ``y`` zero-padded to ``n``. Both run in O(n log n) on whatever
device the input lives on (CPU or CUDA; there is no CPU fallback), batched over leading dimensions.

Makhoul's reordering: ``v = [x_0, x_2, x_4, ..., x_5, x_3, x_1]`` (evens ascending, odds descending),
``V = FFT(v)``, then the unnormalised DCT-II is ``X_k = 2·Re(exp(-iπk/2n)·V_k)``. It holds for any
``n`` (odd or even). The inverse solves ``exp(-iπk/2n)·V_k = (X_k − i·X_{n−k}) / 2`` with ``X_n = 0``.
"""

from __future__ import annotations

import functools
import math

import torch

_FLOAT_DTYPES = (torch.float32, torch.float64)


def _check_input(x: torch.Tensor, name: str) -> None:
    if x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name}.dtype={x.dtype}; allowed: torch.float32 or torch.float64")
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"{name}.shape={tuple(x.shape)}; the last dimension must have length >= 1")


@functools.lru_cache(maxsize=32)
def _twiddle(n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Phases ``exp(-iπk/2n)`` and orthonormal scales ``s_0 = √(1/n)``, ``s_k = √(2/n)`` for k < n.

    The scale folds the factor 2 of ``X_k = 2·Re(...)`` and the orthonormal normalisation into one number.
    Cached per (n, dtype, device): solvers call the transform hundreds of times with the same n.
    """
    k = torch.arange(n, dtype=torch.float64)
    phase = torch.polar(torch.ones(n, dtype=torch.float64), -math.pi * k / (2 * n))
    scale = torch.full((n,), math.sqrt(2.0 / n), dtype=torch.float64)
    scale[0] = math.sqrt(1.0 / n)
    complex_dtype = torch.complex64 if dtype == torch.float32 else torch.complex128
    return phase.to(device=device, dtype=complex_dtype), scale.to(device=device, dtype=dtype)


def _makhoul_order(x: torch.Tensor) -> torch.Tensor:
    """v = [x_0, x_2, ..., (evens), ..., x_3, x_1 (odds reversed)] along the last dimension."""
    return torch.cat([x[..., ::2], x[..., 1::2].flip(-1)], dim=-1)


def _makhoul_unorder(v: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_makhoul_order`."""
    n = v.shape[-1]
    n_even = (n + 1) // 2
    x = torch.empty_like(v)
    x[..., ::2] = v[..., :n_even]
    x[..., 1::2] = v[..., n_even:].flip(-1)
    return x


def dct(x: torch.Tensor, m: int | None = None) -> torch.Tensor:
    """First ``m`` orthonormal DCT-II coefficients of ``x`` along the last dimension.

    ``dct(x, m) = Φ x`` with Φ the first ``m`` rows of :func:`dct_matrix` — the compression operator
    ``C(Δw, m)`` of paper 000, Eq. (3) with Ψ = I. Equals ``scipy.fft.dct(x, type=2, norm="ortho")[..., :m]``.

    Args:
        x: float32/float64 tensor ``[..., n]`` on any device.
        m: number of leading coefficients to keep, ``1 <= m <= n``; ``None`` keeps all ``n``.
    """
    _check_input(x, "x")
    n = x.shape[-1]
    m = n if m is None else m
    if not 1 <= m <= n:
        raise ValueError(f"m={m}; allowed: 1 <= m <= n={n}")
    V = torch.fft.rfft(_makhoul_order(x), dim=-1)  # V_k for k = 0 .. h-1, h = n//2 + 1
    h = V.shape[-1]
    if m > h:  # V_k for h <= k < m by conjugate symmetry: V_k = conj(V_{n-k})
        V = torch.cat([V, V[..., n - m + 1 : n - h + 1].flip(-1).conj()], dim=-1)
    phase, scale = _twiddle(n, x.dtype, x.device)
    return (V[..., :m] * phase[:m]).real * scale[:m]


def idct(y: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Inverse orthonormal DCT (DCT-III) of ``y`` zero-padded to length ``n``, along the last dimension.

    ``idct(y, n) = Φᵀ y`` with Φ the first ``m = y.shape[-1]`` rows of the ``n``-point orthonormal DCT-II
    matrix: the adjoint of :func:`dct` and the zero-filled decoder of FL-FREQ. With ``m = n`` it is the exact
    inverse of :func:`dct`. Equals ``scipy.fft.idct(pad(y, n), type=2, norm="ortho")``.

    Args:
        y: float32/float64 tensor ``[..., m]`` on any device.
        n: output length, ``n >= m``; ``None`` means ``n = m``.
    """
    _check_input(y, "y")
    m = y.shape[-1]
    n = m if n is None else n
    if n < m:
        raise ValueError(f"n={n}; allowed: n >= m={m} (the number of coefficients given)")
    phase, scale = _twiddle(n, y.dtype, y.device)
    u = torch.nn.functional.pad(y, (0, n - m)) / scale  # u_k = X_k / 2 (unnormalised DCT-II over 2)
    h = n // 2 + 1
    u_nk = torch.nn.functional.pad(u[..., n - (h - 1) :].flip(-1), (1, 0))  # u_{n-k}, k = 0 .. n//2; u_n = 0
    V = phase[:h].conj() * torch.complex(u[..., :h], -u_nk)
    return _makhoul_unorder(torch.fft.irfft(V, n=n, dim=-1))


def transform_flops(n: int) -> float:
    """Modelled FLOPs of one length-``n`` :func:`dct` or :func:`idct`: ``2.5·n·log₂n + 4n``.

    The real FFT of length n counted as FFTW's benchmark counts a real transform, 2.5·n·log₂n ("Benchmark
    Methodology", fftw.org: mflops = 2.5·N·log₂N / μs for real transforms), plus Makhoul's twiddle and the
    orthonormal scale, 4 per entry (the real part of a complex product, 2 multiplies + 1 add, and 1 multiply).
    A deterministic count of the algorithm, not of what a given FFT library executes."""
    return 2.5 * n * math.log2(n) + 4.0 * n if n > 1 else 4.0 * n


def dct_matrix(n: int, m: int | None = None, dtype: torch.dtype = torch.float64,
               device: torch.device | str | None = None) -> torch.Tensor:
    """First ``m`` rows (all ``n`` if ``None``) of the orthonormal DCT-II matrix, ``D[k, j] = s_k·cos(π k (2j + 1) / 2n)``.

    ``s_0 = √(1/n)``, ``s_k = √(2/n)``. Row ``k`` is the sensing vector φ_k of paper 000, Sec. II-B, so
    ``dct_matrix(n, m)`` is Φ itself. O(m·n) memory: for tests and the benchmark's matrix baseline only.
    """
    m = n if m is None else m
    if n < 1 or not 1 <= m <= n:
        raise ValueError(f"(n, m)=({n}, {m}); allowed: n >= 1 and 1 <= m <= n")
    out = torch.empty(m, n, dtype=dtype, device=device)
    j2 = 2 * torch.arange(n, dtype=torch.int64, device=device) + 1
    for start in range(0, m, 256):  # row blocks keep the float64 temporaries small for large n
        k = torch.arange(start, min(m, start + 256), dtype=torch.int64, device=device).unsqueeze(1)
        phase = (k * j2) % (4 * n)  # exact integer reduction of the angle π·k(2j+1)/2n to [0, 2π)
        out[start : start + k.numel()] = torch.cos(phase.double() * (math.pi / (2 * n))) * math.sqrt(2.0 / n)
    out[0] /= math.sqrt(2.0)
    return out
