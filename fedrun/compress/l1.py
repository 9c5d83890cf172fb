"""Basis Pursuit Denoising (BPDN) solvers: FL-CS's decompression operator (paper 000, Eq. (4)).

    s* = argmin_s  F(s) = ½‖y − Φs‖² + λ‖s‖₁

Φ is given as a pair of functions ``forward(s) = Φs`` and ``adjoint(v) = Φᵀv`` (e.g. the fast DCT of
:mod:`fedrun.compress.dct`), never as a matrix. Two solvers:

* :func:`owlqn` — OWL-QN (Andrew & Gao 2007), the paper's choice, through PyLBFGS (liblbfgs). liblbfgs
  keeps its iterate in a float64 numpy array on the CPU; the objective and gradient are evaluated in
  float64 on ``y``'s device. CPU-bound by nature.
* :func:`fista` — FISTA (Beck & Teboulle 2009) with adaptive restart (O'Donoghue & Candès 2015), pure
  torch on ``y``'s device. Requires ``‖Φ‖₂ <= 1`` (true for rows of an orthonormal matrix, ΦΦᵀ = I, and
  for the chunked/padded operator), so the step size is 1.

Both solve the scale-normalised problem (y/c, λ/c with c = λ_max = ‖Φᵀy‖_∞) and rescale the answer:
BPDN is scale-equivariant, and this makes the stopping tolerances independent of the update's magnitude.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

Operator = Callable[[torch.Tensor], torch.Tensor]
CONTINUATION, OWLQN_MEMORY = 0.3, 6  # bpdn's λ-continuation ratio; OWL-QN's L-BFGS memory (pairs)


class BPDNSolution(NamedTuple):
    """A BPDN solution ``s`` (same shape/dtype/device as ``Φᵀy``) and the iterations the solver used."""

    s: torch.Tensor
    iterations: int


def soft_threshold(v: torch.Tensor, lam: float) -> torch.Tensor:
    """prox of ``lam·‖·‖₁``: ``sign(v)·max(|v| − lam, 0)``."""
    return torch.sign(v) * torch.clamp(v.abs() - lam, min=0.0)


def lambda_max(adjoint: Operator, y: torch.Tensor) -> float:
    """``‖Φᵀy‖_∞``: the smallest λ for which s = 0 solves BPDN (0 ∈ ∂F(0) ⇔ ‖Φᵀy‖_∞ <= λ)."""
    return float(adjoint(y).abs().max())


def bpdn_objective(forward: Operator, y: torch.Tensor, s: torch.Tensor, lam: float) -> float:
    """``F(s) = ½‖y − Φs‖² + λ‖s‖₁`` (paper 000, Eq. (4)), accumulated in float64."""
    residual = (y - forward(s)).double()
    return float(0.5 * residual.square().sum() + lam * s.double().abs().sum())


def _check_problem(y: torch.Tensor, lam: float, max_iter: int, tol: float) -> None:
    if y.ndim != 1 or y.numel() < 1:
        raise ValueError(f"y.shape={tuple(y.shape)}; allowed: one non-empty dimension [m]")
    if not bool(torch.isfinite(y).all()):
        raise ValueError("y has non-finite entries; allowed: finite measurements")
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"lam={lam}; allowed: 0 < lam < inf")
    if max_iter < 1:
        raise ValueError(f"max_iter={max_iter}; allowed: max_iter >= 1")
    if not 0 < tol < 1:
        raise ValueError(f"tol={tol}; allowed: 0 < tol < 1")


def _start(adjoint: Operator, y: torch.Tensor, lam: float, x0: torch.Tensor | None, max_iter: int,
           tol: float) -> tuple[torch.Tensor, float]:
    """Validate one solver call; return ``Φᵀy`` and ``c = λ_max = ‖Φᵀy‖_∞``."""
    _check_problem(y, lam, max_iter, tol)
    atb = adjoint(y)
    if x0 is not None and x0.shape != atb.shape:
        raise ValueError(f"x0.shape={tuple(x0.shape)}; allowed: {tuple(atb.shape)} (the shape of Φᵀy)")
    return atb, float(atb.abs().max())


def fista(forward: Operator, adjoint: Operator, y: torch.Tensor, lam: float, x0: torch.Tensor | None = None,
          max_iter: int = 500, tol: float = 1e-6) -> BPDNSolution:
    """BPDN by FISTA with step 1 (needs ``‖Φ‖₂ <= 1``) and gradient-based adaptive restart.

    Iteration (Beck & Teboulle 2009, FISTA with L = 1)::

        x_k = soft(z_k − Φᵀ(Φz_k − y), λ)
        t_{k+1} = (1 + √(1 + 4t_k²)) / 2,   z_{k+1} = x_k + (t_k − 1)/t_{k+1} · (x_k − x_{k−1})

    restarting the momentum (t = 1) whenever ``⟨z_k − x_k, x_k − x_{k−1}⟩ > 0``. Stops when
    ``‖x_k − x_{k−1}‖ <= tol·‖x_k‖`` or after ``max_iter`` iterations. Runs in ``y``'s dtype on ``y``'s device.

    Args:
        forward, adjoint: ``s -> Φs`` and ``v -> Φᵀv``.
        y: measurements ``[m]``.
        lam: λ > 0 (absolute, in the units of ``y``).
        x0: warm start (shape of ``Φᵀy``), e.g. the previous round's solution; zeros if ``None``.
    """
    atb, c = _start(adjoint, y, lam, x0, max_iter, tol)
    if c == 0.0:
        return BPDNSolution(torch.zeros_like(atb), 0)
    y, atb, lam = y / c, atb / c, lam / c  # scale-free problem; the solution is rescaled by c at the end
    x = torch.zeros_like(atb) if x0 is None else x0.to(atb) / c
    z, t = x, 1.0
    for k in range(1, max_iter + 1):
        x_prev = x
        x = soft_threshold(z - adjoint(forward(z)) + atb, lam)
        step = x - x_prev
        if torch.dot((z - x).flatten(), step.flatten()) > 0:  # momentum points uphill: restart
            t, z = 1.0, x
        else:
            t_next = (1.0 + math.sqrt(1.0 + 4.0 * t * t)) / 2.0
            z, t = x + ((t - 1.0) / t_next) * step, t_next
        if float(step.norm()) <= tol * float(x.norm()):
            break
    return BPDNSolution(x * c, k)


def owlqn(forward: Operator, adjoint: Operator, y: torch.Tensor, lam: float, x0: torch.Tensor | None = None,
          max_iter: int = 500, tol: float = 1e-6, memory: int = OWLQN_MEMORY) -> BPDNSolution:
    """BPDN by OWL-QN (the paper's decoder, Sec. III-C) via ``lbfgs.fmin_lbfgs(..., orthantwise_c=λ)``.

    liblbfgs minimises ``f(s) + λ‖s‖₁`` with ``f(s) = ½‖y − Φs‖²`` and ``∇f(s) = Φᵀ(Φs − y)``, both evaluated
    here in float64 on ``y``'s device (the iterate itself is a CPU numpy array: liblbfgs is CPU-only).
    Stops when liblbfgs' test ``‖pseudo-gradient‖ < tol·max(1, ‖s‖)`` holds on the normalised problem,
    when the relative objective decrease over 10 iterations falls below ``tol``, or after ``max_iter``
    iterations. The result has ``y``'s dtype and device.

    Args:
        forward, adjoint: ``s -> Φs`` and ``v -> Φᵀv``; must accept float64 tensors.
        y: measurements ``[m]``.
        lam: λ > 0 (absolute, in the units of ``y``).
        x0: warm start (shape of ``Φᵀy``); zeros if ``None``.
        memory: number of L-BFGS correction pairs (liblbfgs' ``m``).
    """
    import lbfgs  # PyLBFGS; imported here so that the rest of fedrun.compress works without it

    atb, c = _start(adjoint, y, lam, x0, max_iter, tol)
    if c == 0.0:
        return BPDNSolution(torch.zeros_like(atb), 0)
    y64 = y.double() / c
    shape = atb.shape

    def value_and_grad(s: np.ndarray, g: np.ndarray) -> float:
        residual = forward(torch.from_numpy(s).to(y64.device).view(shape)) - y64
        g[:] = adjoint(residual).reshape(-1).cpu().numpy()
        return 0.5 * float(residual.square().sum())

    start = np.zeros(atb.numel()) if x0 is None else x0.double().reshape(-1).cpu().numpy() / c
    last = {"s": start, "k": 0}

    def progress(s: np.ndarray, g: np.ndarray, fx: float, xnorm: float, gnorm: float, step: float, k: int, ls: int) -> int:
        last["s"], last["k"] = s.copy(), k  # the last accepted iterate, kept in case liblbfgs gives up
        return 0

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The algorithm routine reaches the maximum number")
        try:
            s = lbfgs.fmin_lbfgs(
                value_and_grad,
                start,
                progress=progress,
                orthantwise_c=lam / c,
                line_search="wolfe",
                epsilon=tol,
                past=10,
                delta=tol,
                max_iterations=max_iter,
                m=memory,
            )
        except lbfgs.LBFGSError:  # line search stalled near the optimum (rounding): keep the last iterate
            s = last["s"]
    return BPDNSolution(torch.from_numpy(s * c).view(shape).to(dtype=y.dtype, device=y.device), last["k"])


_SOLVERS = {"fista": fista, "owlqn": owlqn}


def lambda_path(lam_max: float, lam: float, ratio: float) -> list[float]:
    """Continuation path ``λ_max·ρ, λ_max·ρ², ...`` while above ``lam``, then ``lam`` itself."""
    path = []
    lam_j = lam_max * ratio
    while lam_j > lam:
        path.append(lam_j)
        lam_j *= ratio
    return path + [lam]


def bpdn(forward: Operator, adjoint: Operator, y: torch.Tensor, lam: float, solver: str = "fista",
         x0: torch.Tensor | None = None, max_iter: int = 300, tol: float = 1e-4,
         continuation: float | None = CONTINUATION) -> BPDNSolution:
    """Solve BPDN (paper 000, Eq. (4)) with ``solver`` ("fista" or "owlqn"), using λ-continuation from a cold start.

    From a cold start (``x0 is None``) the solver is run along :func:`lambda_path` (ratio ``continuation``),
    each stage warm-started from the previous one with the loose tolerance ``max(tol, 1e-3)`` and at most
    half of ``max_iter`` in all; the last stage (the requested λ) gets the rest of the budget and ``tol``.
    Continuation (Hale, Yin & Zhang 2008) cut the iterations 2–4× at λ = 1e-3..1e-4·λ_max in our tests. With a warm
    start, or ``continuation=None``, the solver runs once at ``lam``. ``iterations`` sums all stages.
    """
    if solver not in _SOLVERS:
        raise ValueError(f"solver={solver!r}; allowed: {tuple(_SOLVERS)}")
    if continuation is not None and not 0.0 < continuation < 1.0:
        raise ValueError(f"continuation={continuation}; allowed: None or 0 < continuation < 1")
    _check_problem(y, lam, max_iter, tol)
    solve = _SOLVERS[solver]
    if x0 is not None or continuation is None:
        return solve(forward, adjoint, y, lam, x0, max_iter, tol)
    path = lambda_path(lambda_max(adjoint, y), lam, continuation)
    stage_iter = max(1, (max_iter // 2) // max(1, len(path) - 1))
    used, x = 0, None
    for lam_j in path[:-1]:
        sol = solve(forward, adjoint, y, lam_j, x, stage_iter, max(tol, 1e-3))
        used, x = used + sol.iterations, sol.s
    sol = solve(forward, adjoint, y, lam, x, max(1, max_iter - used), tol)
    return BPDNSolution(sol.s, used + sol.iterations)


def bpdn_budget(lam_rel: float, max_iter: int, continuation: float = CONTINUATION) -> tuple[int, int]:
    """(S, I): the λ-continuation stages and the iterations that a cold-start :func:`bpdn` runs at most at
    λ/λ_max = ``lam_rel`` (a larger λ only shortens the path): I = ``max_iter``, or (S − 1)·⌊(max_iter//2)/(S − 1)⌋ + 1
    when one iteration per early stage exceeds it."""
    stages = len(lambda_path(1.0, lam_rel, continuation))
    early = max(1, (max_iter // 2) // max(1, stages - 1)) * (stages - 1)
    return stages, early + max(1, max_iter - early)
