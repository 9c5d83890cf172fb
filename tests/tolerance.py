"""Tolerances for float32 results that hold on every machine: float32 round-off at the scale of the values.

Why not a number like ``atol=1e-6``: the order in which a float32 kernel adds up terms (vector width,
blocking, threads, fused multiply-add) differs between CPU kernels (``ATEN_CPU_CAPABILITY=default``, avx2,
avx512), BLAS/oneDNN builds and GPUs, so the round-off of the same computation differs from machine to
machine; a tolerance tuned on one machine fails on another. What does not depend on the order is the
bound: each float32 operation rounds its exact result by at most u = eps32/2 relative (eps32 = 2⁻²³ ≈
1.19e-7), so a sum of k terms, computed in any order, is within (k − 1)·u·Σᵢ|xᵢ| of the exact sum (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., §4.2). A test therefore compares a float32 result
with a float64 reference computed from the same float32 inputs, elementwise, within

    f32_tol(*magnitudes, terms=k) = C · k · (eps32 · Σⱼ |magnitudesⱼ| + 2⁻¹⁴⁹)     (worst case, any order)

- ``magnitudes``: arrays or numbers whose absolute values, added elementwise, bound the size of what went
  into each element of the result, e.g. the start point and the summed terms, ``w0, Σₖ|wₖ·Δₖ|``. Give the terms
  (Σ|x|), not the result (|Σx|): that is what keeps the bound valid when the terms cancel. A pair
  ``(magnitude, k)`` counts its own number of roundings: ``(w0, 1)`` for a start point that only meets the
  final add, while the update's terms go through the whole sum.
- ``terms``: how many float32 roundings one element can accumulate: k for a sum or dot product of k terms,
  plus one per further operation on its path (a difference, a scaling, the final add), plus ⌈log₂ n⌉ when
  a norm over n coordinates rescales it (torch's reductions are cascaded/blocked).
- C = 2: the first-order worst case is u·k·Σ|x| = (eps32/2)·k·Σ|x|; C = 2 leaves a factor 4 for the
  second-order terms (γₖ = k·u/(1 − k·u)) and for terms that carry roundings of their own (a product wᵢxᵢ,
  a difference). It is a bound, not a typical value: a correct float32 computation stays below it on
  every kernel, and a wrong term (a missing clip, a misplaced coordinate, a wrong weight) is off by the
  size of a term, ≫ eps32·k·Σ|x| for the k of these tests.
- 2⁻¹⁴⁹, the spacing of float32 subnormals: results that underflow err by up to half of it absolutely,
  whatever their scale (the underflow term of the standard model, Higham §2.1).

Long chains (local training: thousands of products per gradient element, several steps) make the worst
case useless. For them ``probabilistic=True`` uses the probabilistic bound of Higham & Mary ("A new
approach to probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019): with rounding errors
independent and of mean zero, k accumulated roundings err by at most ≈ λ·√k·u·Σ|x| with probability
≥ 1 − 2k·exp(−λ²(1 − u)²/2); λ = 10 (C = λ/2 = 5 in units of eps32) makes that ≥ 1 − 1e-16 for any
k ≤ 10⁵. It assumes the dynamics do not amplify the error (a few small steps), and it does not cover
discrete events (a ReLU or max-pool tie broken differently by two kernels: on MNIST, lenet5's vectorized
and sequential training paths differ by 1.9e-5 in a few weights under avx2, 1.5e-8 under default). That is
why a test of a scheme compares it with a reference built from the same local models the scheme
aggregated (``sim.train``), not from another training path.

When both sides are float32 computations (two code paths, neither exact), add both sides' terms. Paths that
can run in float64 (local training) are best compared there: ``dtype=torch.float64`` gives the same bounds
with eps64, far below any difference in the math.

``FEDRUN_TOL_LOG=<file>``: every :func:`assert_f32_close` appends ``<test id> <max error/tolerance>`` to
the file, to see the margin each test keeps on a given machine or kernel choice.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

EPS32 = float(torch.finfo(torch.float32).eps)  # 2⁻²³: twice the unit round-off u
C_WORST = 2.0  # × eps32·k: 4× the first-order worst case u·k (see the module docstring)
C_PROBABILISTIC = 5.0  # × eps32·√k = λ·√k·u with λ = 10


def _signed(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _abs64(x) -> np.ndarray:
    return np.abs(_signed(x))


def fft_terms(n: int) -> int:
    """``terms`` for a DCT/FFT of length n, in the L2 norm of its input (elementwise ≤ normwise).

    A radix-2 FFT errs by ≤ log₂n·η·‖x‖₂ with η ≈ 5u + the twiddles' error (Higham §24.1, Thm. 24.2), i.e.
    ≈ 3·log₂n roundings; Bluestein's algorithm for other lengths chains three FFTs of length ≥ 2n, so
    6·⌈log₂ 2n⌉, + 4 for the DCT's reordering, twiddle multiplication and scaling."""
    return 6 * math.ceil(math.log2(2 * n)) + 4


def f32_tols(*magnitudes, terms: int = 1, probabilistic: bool = False,
             dtype: torch.dtype = torch.float32) -> np.ndarray:
    """Elementwise tolerance C·k·(eps32·Σⱼ|magnitudesⱼ| + 2⁻¹⁴⁹) (k → √k with ``probabilistic``); float64
    array, the magnitudes broadcast together. A magnitude given as a pair ``(m, kₘ)`` counts its own kₘ
    roundings instead of ``terms`` (e.g. ``(w0, 1)``: the start point only goes through the final add).
    ``dtype=torch.float64``: the same bound for a float64 computation (eps64 = 2⁻⁵², subnormals 2⁻¹⁰⁷⁴)."""
    if terms < 1:
        raise ValueError(f"terms={terms} must be >= 1")
    if not magnitudes:
        raise ValueError("f32_tols needs at least one magnitude (the scale of the values)")
    info = torch.finfo(dtype)

    def bound(m, k):
        factor = C_PROBABILISTIC * math.sqrt(k) if probabilistic else C_WORST * k
        return factor * (info.eps * _abs64(m) + info.smallest_normal * info.eps)

    return sum(bound(*m) if isinstance(m, tuple) else bound(m, terms) for m in magnitudes)


def f32_tol(*magnitudes, terms: int = 1, probabilistic: bool = False,
            dtype: torch.dtype = torch.float32) -> float:
    """One absolute tolerance at the scale of the largest element: max of :func:`f32_tols` (for a plain
    ``err < tol``, an ``atol=``, or with magnitude 1 a relative tolerance ``rel=``)."""
    return float(np.max(f32_tols(*magnitudes, terms=terms, probabilistic=probabilistic, dtype=dtype)))


def assert_f32_close(actual, expected, *magnitudes, terms: int = 1, probabilistic: bool = False,
                     dtype: torch.dtype = torch.float32, msg: str = "") -> None:
    """|actual − expected| ≤ f32_tols(*magnitudes, terms=…) elementwise (shapes must match).

    ``expected`` is best a float64 reference computed from the same float32 inputs; ``magnitudes`` (at
    least one) give the scale of the values (see the module docstring)."""
    a, e = _signed(actual), _signed(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{msg} shapes differ: {a.shape} vs {e.shape}")
    tol = np.broadcast_to(f32_tols(*magnitudes, terms=terms, probabilistic=probabilistic, dtype=dtype), a.shape)
    err = np.abs(a - e)
    ratio = float(np.max(err / np.maximum(tol, np.finfo(np.float64).tiny))) if err.size else 0.0
    log = os.environ.get("FEDRUN_TOL_LOG")
    if log:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(log, "a") as f:
            f.write(f"{test} {(msg or '-').replace(' ', '_')} {ratio:.3g}\n")
    if not np.all(err <= tol):
        i = np.unravel_index(int(np.argmax(err - tol)), err.shape)
        raise AssertionError(
            f"{msg + ': ' if msg else ''}{int(np.sum(err > tol))} of {err.size} elements differ by more than "
            f"the {dtype} round-off bound (terms={terms}{', probabilistic' if probabilistic else ''}); "
            f"worst at {tuple(int(j) for j in i)}: actual {a[i]:.9g}, expected {e[i]:.9g}, "
            f"error {err[i]:.3g} > tolerance {tol[i]:.3g} (max error/tolerance {ratio:.3g})")

