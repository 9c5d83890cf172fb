r"""Noise scales for local DP on FedAvg (paper 001: Fu et al., arXiv 2101.04163, Alg. 1, Thms 1–2).

Setting. Client l holds n_l samples. When engaged it receives θ, runs E full-batch GD steps
θ_{k+1} = θ_k − η_k·ḡ(θ_k) with clipped gradients, and uploads θ_E + w (w = noise, added once per
participation). Round robin with b of N clients per round for T_g rounds: each client participates
T_l = b·T_g/N times (``round_robin_participations`` gives the ceiling, the count the budget must cover).
Protected unit: one sample of a client's data, neighbouring datasets differ by *replacing* one sample
(n_l stays fixed and public); the adversary is anyone who sees the uploads, the server included.

1. Per-step sensitivity. η̃ = max η_k over the E steps (``lr``).
   * ``clip_mode="per_sample"``: ḡ = (1/n_l)·Σ_i clip(∇ℓ(θ; x_i), ζ). At the same θ, replacing one sample
     moves ḡ by ‖clip(g_i) − clip(g_i')‖/n_l ≤ 2ζ/n_l, so one step moves θ by ≤ 2ζη̃/n_l.
   * ``clip_mode="batch"`` (what the paper's text literally says: the full-batch gradient is clipped to ζ):
     one sample can move the unclipped mean arbitrarily far, and both clipped means have norm ≤ ζ, so the
     per-step bound is 2ζη̃ — no 1/n_l. Per-sample clipping is needed for the paper's noise scales.
2. E steps. After the first step the two trajectories sit at different θ. With d_k = ‖θ_k − θ_k'‖:
   d_{k+1} ≤ ‖G(θ_k) − G(θ_k')‖ + η̃‖ḡ_D(θ_k') − ḡ_D'(θ_k')‖, G(θ) = θ − η̃ḡ_D(θ).
   * ``nonexpansive=False`` (the default: proven, no assumption on the loss or the norm): for k ≥ 1 the two
     clipped means are only known to differ by ≤ 2ζ, so Δ = 2ζη̃/n_l + 2ζη̃(E − 1).
   * ``nonexpansive=True`` (the paper's value, Δ = 2ζη̃E/n_l): if G is non-expansive, d_{k+1} ≤ d_k + 2ζη̃/n_l.
     That is an **L2** statement: G = I − η̃∇F is L2 non-expansive when F is convex and β-smooth and
     η̃ ≤ 2/β (Baillon–Haddad: ∇F is (1/β)-co-coercive). Only G_D of the client's *actual* data D enters the
     recursion, so the condition is checked on D and the bound holds for D against every one-sample
     replacement D' (a guarantee for the run's data; the check's outcome — run or refuse — is itself not
     noised). When it holds (``nonexpansive_check``):
       - linear model + MSE (Lending Club): the per-sample loss is (θᵀx̃ − y)², x̃ = [x, 1]. Clipping its
         gradient 2r·x̃ (r the residual) to ζ in any norm gives φ(r)·x̃ with φ(r) = clamp(2r, ±ζ/‖x̃‖): φ is
         non-decreasing and 2-Lipschitz, the derivative of a convex Huber function h with 0 ≤ h'' ≤ 2. So the
         clipped mean ḡ_D is the gradient of F(θ) = (1/n_l)Σ h_i(θᵀx̃_i − y_i), convex with
         ∇²F ≼ (2/n_l)·X̃ᵀX̃, i.e. β_l = 2·λ_max(X̃_lᵀX̃_l)/n_l (``linear_mse_smoothness``, float64; no
         regulariser in fedrun's loss). A scheme training only part of θ sees a principal sub-matrix: β
         no larger.
       - Laplace (L1): L2 non-expansiveness does not give d_{k+1} ≤ d_k + 2ζη̃/n_l in L1 — the L1 operator
         norm of I − η̃∇²F exceeds 1 as soon as features are correlated (on the Lending Club states it is
         1.2–2.4 at η = 0.2), and one replaced sample can move θ_E by more than 2ζη̃E/n_l in L1 while its
         L2 move stays within the bound (tests/unit/test_local_dp_sensitivity.py builds such a client).
         So for Laplace the paper's value is never proven here; ``fedrun.privacy.local_dp`` refuses it unless asked for
         as ``paper_unchecked``. (A proven L1 route would be √p·2ζη̃E/n_l from the L2 bound, not implemented.)
       - any other model (the FEMNIST CNN): not convex, β unknown — the condition cannot be checked.
   * E = 1 or batch clipping: both values agree (no trajectory divergence / each trajectory moves ≤ ζη̃ per
     step): Δ = 2ζη̃/n_l resp. 2ζη̃E, proven either way.
3. Which norm. The Laplace mechanism needs the L1 sensitivity, the Gaussian the L2 one. ζ here is the bound
   of the norm the mechanism needs, as in the paper: for Laplace clip in L1
   (``mechanisms.clip_rows(..., ord=1)``) and the formula holds as is (the non-expansive step 2 is an L2
   argument — in L1 only ``nonexpansive=False`` is proven; an L1 clip ζ also bounds the L2 norm by ζ).
   If gradients are clipped in L2 instead, use ‖v‖₁ ≤ √p·‖v‖₂ and pass ``clip_norm = √p·ζ₂`` (p = 11 for
   Lending Club: 3.3× the noise).
4. Composition over T_l participations.
   * Laplace (pure ε): basic composition, ε/T_l per participation, scale b = Δ₁·T_l/ε
     = 2ζη̃E·T_l/(n_l·ε) with the paper's Δ₁. Per-coordinate variance 2b² ∝ η̃²E²T_l² (z = 2; with the
     proven Δ₁ the E² becomes (1/n_l + E − 1)²).
   * Gaussian: T_l Gaussian releases with std σ and L2 sensitivity Δ₂ compose — adaptively — exactly like
     one Gaussian release with sensitivity √T_l·Δ₂ (Gaussian DP: μ_i-GDP releases compose to √(Σμ_i²)-GDP,
     Dong, Roth & Su 2019).
     The classic mechanism (Dwork & Roth 2014, Thm A.1) on that gives σ = √T_l·Δ₂·√(2 ln(1.25/δ))/ε
     = (2ζη̃E/n_l)·√(2·T_l·ln(1.25/δ))/ε, the paper's formula: each participation spends ε/√T_l at the
     full δ (not the ε/T_l, δ/T_l of basic composition, which would need σ ∝ T_l). Variance ∝ η̃²E²T_l
     (z = 1). Thm A.1 assumes ε < 1; above it the classic σ can fall short (ε = 10, δ = 1e-4: true ε ≈ 10.6),
     so ``calibration="analytic"`` uses the exact analytic Gaussian σ of Balle & Wang 2018 instead.
   ε = ∞ (the paper's benchmark) means no noise: scale 0.
5. Noise item. w_t^b = (N/b)·Σ_{l∈P_t}(n_l/n)·w_t^l with independent w^l, so the per-coordinate variance is
   Σ_l a_l²·Var(w^l), a_l = (N/b)(n_l/n) (``aggregated_noise_variance``).
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from dp_accounting import get_sigma_gaussian

__all__ = [
    "CLIP_MODES",
    "round_robin_participations",
    "sensitivity",
    "laplace_scale",
    "gaussian_std",
    "aggregated_noise_variance",
    "linear_mse_smoothness",
    "NonexpansiveCheck",
    "nonexpansive_check",
]

CLIP_MODES = ("per_sample", "batch")
_MECHANISMS = ("laplace", "gaussian")
_CALIBRATIONS = ("classic", "analytic")


def _positive_finite(name: str, value: float) -> float:
    if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} is outside (0, inf)")
    return float(value)


def _positive_int(name: str, value: int) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}={value!r} must be an integer ≥ 1") from None
    if v < 1:
        raise ValueError(f"{name}={value!r} is outside [1, inf)")
    return v


def _epsilon(epsilon: float) -> float:
    if not (isinstance(epsilon, numbers.Real) and epsilon > 0 and not math.isnan(epsilon)):
        raise ValueError(f"epsilon={epsilon!r} is outside (0, inf]")
    return float(epsilon)


def round_robin_participations(num_clients: int, clients_per_round: int, rounds: int) -> int:
    """Most participations of any client under round robin: ⌈b·T_g/N⌉ (paper 001: T_l = b·T_g/N)."""
    n = _positive_int("num_clients", num_clients)
    b = _positive_int("clients_per_round", clients_per_round)
    t = _positive_int("rounds", rounds)
    if b > n:
        raise ValueError(f"clients_per_round={b} is outside [1, num_clients={n}]")
    return -(-b * t // n)


def sensitivity(
    clip_norm: float,
    lr: float,
    local_iters: int,
    n_l: int,
    clip_mode: str = "per_sample",
    *,
    nonexpansive: bool = False,
) -> float:
    """Sensitivity of one uploaded model (E GD steps from a common start), replace-one-sample; module doc 1–2.

    per_sample: 2ζη/n_l + 2ζη(E−1) (default, proven) or 2ζηE/n_l (``nonexpansive=True``, the paper's: only an
    L2 bound, and only where the steps are non-expansive — see ``nonexpansive_check``); batch: 2ζηE.
    In the norm ζ bounds (L1 for Laplace, L2 for Gaussian).
    """
    zeta = _positive_finite("clip_norm", clip_norm)
    eta = _positive_finite("lr", lr)
    e = _positive_int("local_iters", local_iters)
    n = _positive_int("n_l", n_l)
    if clip_mode == "per_sample":
        if nonexpansive:
            return 2 * zeta * eta * e / n
        return 2 * zeta * eta / n + 2 * zeta * eta * (e - 1)
    if clip_mode == "batch":
        return 2 * zeta * eta * e
    raise ValueError(f"clip_mode={clip_mode!r} is not one of {CLIP_MODES}")


def laplace_scale(
    clip_norm: float,
    lr: float,
    local_iters: int,
    participations: int,
    n_l: int,
    epsilon: float,
    clip_mode: str = "per_sample",
    *,
    nonexpansive: bool = False,
) -> float:
    """Laplace scale b = Δ₁·T_l/ε (basic composition over T_l participations; paper 001, Thm 1).

    With per-sample clipping (ζ an L1 bound): (2ζη/n_l + 2ζη(E−1))·T_l/ε, or the paper's 2ζηE·T_l/(n_l·ε) with
    ``nonexpansive=True`` (not proven in L1: module doc 2). ε = ∞ → 0 (no noise).
    """
    eps = _epsilon(epsilon)
    t_l = _positive_int("participations", participations)
    delta_1 = sensitivity(clip_norm, lr, local_iters, n_l, clip_mode, nonexpansive=nonexpansive)
    if math.isinf(eps):
        return 0.0
    return delta_1 * t_l / eps


def gaussian_std(
    clip_norm: float,
    lr: float,
    local_iters: int,
    participations: int,
    n_l: int,
    epsilon: float,
    delta: float,
    clip_mode: str = "per_sample",
    *,
    nonexpansive: bool = False,
    calibration: str = "classic",
) -> float:
    """Gaussian noise std per coordinate so that T_l uploads are (ε, δ)-DP (paper 001, Thm 2; module doc 4).

    classic: σ = Δ₂·√(2·T_l·ln(1.25/δ))/ε (guaranteed for ε < 1);
    analytic: σ = √T_l·Δ₂·σ_BW(ε, δ) with the exact analytic Gaussian mechanism of Balle & Wang 2018.
    ε = ∞ → 0 (no noise).
    """
    eps = _epsilon(epsilon)
    if not (isinstance(delta, numbers.Real) and 0 < delta < 1):
        raise ValueError(f"delta={delta!r} is outside (0, 1)")
    t_l = _positive_int("participations", participations)
    if calibration not in _CALIBRATIONS:
        raise ValueError(f"calibration={calibration!r} is not one of {_CALIBRATIONS}")
    delta_2 = sensitivity(clip_norm, lr, local_iters, n_l, clip_mode, nonexpansive=nonexpansive)
    if math.isinf(eps):
        return 0.0
    if calibration == "classic":
        return delta_2 * math.sqrt(2 * t_l * math.log(1.25 / delta)) / eps
    return delta_2 * math.sqrt(t_l) * float(get_sigma_gaussian(eps, float(delta)))


def aggregated_noise_variance(
    per_client_std_or_scale: float | Sequence[float],
    weights: Sequence[float],
    mechanism: str,
) -> float:
    """Per-coordinate variance of the noise item Σ_l a_l·w^l (paper 001: a_l = (N/b)·n_l/n).

    ``per_client_std_or_scale``: one value for all clients or one per weight; Gaussian std σ (variance σ²)
    or Laplace scale b (variance 2b²).
    """
    if mechanism not in _MECHANISMS:
        raise ValueError(f"mechanism={mechanism!r} is not one of {_MECHANISMS}")
    weights = [float(w) for w in weights]
    if isinstance(per_client_std_or_scale, numbers.Real):
        scales = [float(per_client_std_or_scale)] * len(weights)
    else:
        scales = [float(s) for s in per_client_std_or_scale]
        if len(scales) != len(weights):
            raise ValueError(
                f"per_client_std_or_scale has {len(scales)} values but weights has {len(weights)}; they must match"
            )
    for i, s in enumerate(scales):
        if not (math.isfinite(s) and s >= 0):
            raise ValueError(f"per_client_std_or_scale[{i}]={s!r} is outside [0, inf)")
    for i, w in enumerate(weights):
        if not math.isfinite(w):
            raise ValueError(f"weights[{i}]={w!r} is not finite")
    factor = 2.0 if mechanism == "laplace" else 1.0
    return sum(factor * (w * s) ** 2 for w, s in zip(weights, scales))


# ------------------------------------------------------------------------------------------------ the paper's condition
def linear_mse_smoothness(x: np.ndarray) -> float:
    """β of one client's (clipped) empirical MSE loss for the linear model y = wᵀx + b (module doc 2).

    ``x``: the client's n_l × p feature rows (without the bias column). β = 2·λ_max(X̃ᵀX̃)/n_l with
    X̃ = [x, 1], computed in float64. Per-sample clipping (any norm) keeps β an upper bound.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"x has shape {x.shape}; need n_l ≥ 1 rows of features")
    xt = np.hstack([x, np.ones((x.shape[0], 1))])
    lam = float(np.linalg.eigvalsh(xt.T @ xt)[-1])
    return 2.0 * max(lam, 0.0) / x.shape[0]


@dataclass(frozen=True)
class NonexpansiveCheck:
    """η ≤ 2/β_l for every checked client (linear model + MSE): the L2 condition of the paper's sensitivity.

    ``two_over_beta[l]`` is 2/β_l (NaN for clients not checked: no data or no participation; inf for β_l = 0).
    """

    lr: float
    two_over_beta: np.ndarray
    worst_client: int          # the checked client with the smallest 2/β_l
    sizes: np.ndarray

    @property
    def min_two_over_beta(self) -> float:
        return float(self.two_over_beta[self.worst_client])

    @property
    def passed(self) -> bool:
        return self.lr <= self.min_two_over_beta

    def describe(self) -> str:
        l = self.worst_client
        rel = "≤" if self.passed else ">"
        return (f"lr={self.lr:g} {rel} min 2/β_l={self.min_two_over_beta:.4g} (client {l}, n_l={int(self.sizes[l])})")


def nonexpansive_check(x: np.ndarray, parts: Sequence[np.ndarray], lr: float,
                       clients: Sequence[int] | np.ndarray | None = None) -> NonexpansiveCheck:
    """2/β_l of each client (``linear_mse_smoothness`` on its rows ``x[parts[l]]``) against the step size η.

    ``clients``: the clients whose uploads need the bound (default: every client with data); others get NaN.
    """
    eta = _positive_finite("lr", lr)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    chosen = np.flatnonzero(sizes > 0) if clients is None else np.asarray(clients, dtype=np.int64)
    chosen = np.array([l for l in chosen if sizes[l] > 0], dtype=np.int64)
    if len(chosen) == 0:
        raise ValueError("no client with data to check")
    x = np.asarray(x, dtype=np.float64)
    out = np.full(len(parts), np.nan)
    for l in chosen:
        beta = linear_mse_smoothness(x[np.asarray(parts[l])])
        out[l] = math.inf if beta == 0 else 2.0 / beta
    worst = int(chosen[np.argmin(out[chosen])])
    return NonexpansiveCheck(lr=eta, two_over_beta=out, worst_client=worst, sizes=sizes)
