"""Clipping and noise samplers, plus the events that describe what a mechanism did.

Pure tensor math: no I/O, randomness comes in as a ``torch.Generator``.

* The client-level DP sum built from them (DP-FedAvg's clip → sum → N(0, σ²S²) → ÷ qW) has one
  implementation, :class:`fedrun.aggregation.ClientLevelDPSum`, the one the simulation runs.
* The events (frozen dataclasses at the bottom) describe what a mechanism did; ``accounting.py`` composes
  them (habit 2 of the design: dp_accounting-style events).
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

__all__ = [
    "clip_rows",
    "clip_vector",
    "gaussian_noise",
    "laplace_noise",
    "PoissonGaussianEvent",
    "FixedSizeGaussianEvent",
    "TruncatedPoissonGaussianEvent",
    "GaussianEvent",
    "LaplaceEvent",
    "Event",
]


def _check_positive_finite(name: str, value: float) -> None:
    if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} is outside (0, inf); it must be a finite positive number")


def _check_nonnegative_finite(name: str, value: float) -> None:
    if not (isinstance(value, numbers.Real) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}={value!r} is outside [0, inf); it must be a finite non-negative number")


def _check_ord(ord: int) -> None:
    if ord not in (1, 2):
        raise ValueError(f"ord={ord!r} is not allowed; use 2 (L2, Gaussian mechanism) or 1 (L1, Laplace mechanism)")


# --------------------------------------------------------------------------------------------------- clipping
def clip_rows(x: Tensor, clipping_norm: float, *, ord: int = 2) -> tuple[Tensor, Tensor]:
    """Scale each row of ``x`` ([K, m]) to norm ≤ ``clipping_norm`` (S): x_k · min(1, S/‖x_k‖).

    Returns ``(clipped, norms)`` with ``norms`` the pre-clip norms [K]. Rows with norm ≤ S are returned
    bit-for-bit unchanged; clipped rows keep their direction. ``ord=2`` is the L2 clipping of DP-FedAvg /
    DP-SGD; ``ord=1`` bounds the L1 norm, which is what the Laplace mechanism's sensitivity needs (see
    ``local.py``). Floating-point rounding can leave a clipped row a few ulps above S.
    """
    if x.dim() != 2:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected a 2-D tensor [K, m]")
    _check_positive_finite("clipping_norm", clipping_norm)
    _check_ord(ord)
    norms = torch.linalg.vector_norm(x, ord=ord, dim=1)
    over = norms > clipping_norm
    factor = clipping_norm / torch.where(over, norms, torch.ones_like(norms))
    clipped = torch.where(over.unsqueeze(1), x * factor.unsqueeze(1), x)
    return clipped, norms


def clip_vector(x: Tensor, clipping_norm: float, *, ord: int = 2) -> tuple[Tensor, Tensor]:
    """``clip_rows`` for one vector (e.g. one flat gradient): returns ``(clipped, norm)`` with a 0-d norm."""
    if x.dim() != 1:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected a 1-D tensor")
    clipped, norms = clip_rows(x.unsqueeze(0), clipping_norm, ord=ord)
    return clipped[0], norms[0]


# ----------------------------------------------------------------------------------------------------- noise
def _device(generator: torch.Generator, device: torch.device | str | None) -> torch.device:
    return torch.device(device) if device is not None else generator.device


def gaussian_noise(
    shape: Sequence[int] | torch.Size,
    std: float,
    generator: torch.Generator,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """I.i.d. N(0, std²) noise of ``shape`` (Gaussian mechanism, Dwork & Roth 2014, App. A).

    ``device`` defaults to the generator's device. ``std = 0`` gives zeros (no draw is made).
    """
    _check_nonnegative_finite("std", std)
    dev = _device(generator, device)
    if std == 0:
        return torch.zeros(tuple(shape), device=dev, dtype=dtype)
    return torch.randn(tuple(shape), generator=generator, device=dev, dtype=dtype) * std


def laplace_noise(
    shape: Sequence[int] | torch.Size,
    scale: float,
    generator: torch.Generator,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """I.i.d. Laplace(0, scale) noise (density e^{-|x|/b}/(2b), variance 2b²) of ``shape``.

    Drawn as b·(E₁ − E₂) with E₁, E₂ i.i.d. standard exponential, which needs no log(0) guard.
    ``device`` defaults to the generator's device. ``scale = 0`` gives zeros (no draw is made).
    """
    _check_nonnegative_finite("scale", scale)
    dev = _device(generator, device)
    shape = tuple(shape)
    if scale == 0:
        return torch.zeros(shape, device=dev, dtype=dtype)
    e = torch.empty((2, *shape), device=dev, dtype=dtype).exponential_(generator=generator)
    return (e[0] - e[1]) * scale


# ---------------------------------------------------------------------------------------------------- events
@dataclass(frozen=True)
class PoissonGaussianEvent:
    """One round of the Gaussian mechanism on a Poisson-sampled set (each unit kept with prob. q).

    ``noise_multiplier`` = noise std / L2 sensitivity (σ); ``sampling_probability`` = q ∈ [0, 1].
    σ = 0 means no noise (the accountant then reports ε = ∞).
    """

    noise_multiplier: float
    sampling_probability: float

    def __post_init__(self) -> None:
        _check_nonnegative_finite("noise_multiplier", self.noise_multiplier)
        q = self.sampling_probability
        if not (isinstance(q, numbers.Real) and 0 <= q <= 1):
            raise ValueError(f"sampling_probability={q!r} is outside [0, 1]")


def _check_count(name: str, value: int, low: int, high: int | None = None) -> None:
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}={value!r} must be an integer") from None
    if v < low or (high is not None and v > high):
        raise ValueError(f"{name}={value!r} is outside [{low}, {high if high is not None else 'inf'}]")


@dataclass(frozen=True)
class FixedSizeGaussianEvent:
    """One round of the Gaussian mechanism on a fixed-size sample: ``sample_size`` k of ``dataset_size`` N units,
    drawn uniformly without replacement (a fixed-size cohort of k clients out of N).

    ``noise_multiplier`` σ = noise std / S, where S bounds each unit's contribution (the clip), as for
    :class:`PoissonGaussianEvent`. Its neighbouring relation is **replace-one** (N is fixed and public; one unit's
    data is replaced by other data), the only one for which an amplification bound of sampling without replacement
    exists in dp_accounting (Wang, Balle, Kasiviswanathan 2019, Thm 27). Replacing one unit changes the sum by up
    to 2S, so the accountant charges the Gaussian with σ/2 per unit of that sensitivity.
    """

    noise_multiplier: float
    dataset_size: int
    sample_size: int

    def __post_init__(self) -> None:
        _check_nonnegative_finite("noise_multiplier", self.noise_multiplier)
        _check_count("dataset_size", self.dataset_size, 1)
        _check_count("sample_size", self.sample_size, 0, operator.index(self.dataset_size))


@dataclass(frozen=True)
class TruncatedPoissonGaussianEvent:
    """One round of the Gaussian mechanism on a capped Poisson sample: each of ``dataset_size`` N units kept with
    probability q, then, when more than ``max_sample_size`` were kept, a uniformly random subset of that many
    (dp_accounting's ``TruncatedSubsampledGaussianDpEvent``, arXiv:2508.15089). Add/remove-one neighbours, as
    for :class:`PoissonGaussianEvent`; ``noise_multiplier`` σ = noise std / S (S the clip of each unit)."""

    noise_multiplier: float
    sampling_probability: float
    dataset_size: int
    max_sample_size: int

    def __post_init__(self) -> None:
        _check_nonnegative_finite("noise_multiplier", self.noise_multiplier)
        q = self.sampling_probability
        if not (isinstance(q, numbers.Real) and 0 <= q <= 1):
            raise ValueError(f"sampling_probability={q!r} is outside [0, 1]")
        _check_count("dataset_size", self.dataset_size, 1)
        _check_count("max_sample_size", self.max_sample_size, 0)


@dataclass(frozen=True)
class GaussianEvent:
    """One Gaussian-mechanism release without subsampling; ``noise_multiplier`` = std / L2 sensitivity."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        _check_nonnegative_finite("noise_multiplier", self.noise_multiplier)


@dataclass(frozen=True)
class LaplaceEvent:
    """One Laplace-mechanism release: pure ``epsilon`` = L1 sensitivity / scale (∞ when no noise was added)."""

    epsilon: float

    def __post_init__(self) -> None:
        e = self.epsilon
        if not (isinstance(e, numbers.Real) and e > 0 and not math.isnan(e)):
            raise ValueError(f"epsilon={e!r} is outside (0, inf]")


Event = PoissonGaussianEvent | FixedSizeGaussianEvent | TruncatedPoissonGaussianEvent | GaussianEvent | LaplaceEvent
EVENT_TYPES: dict[str, Any] = {cls.__name__: cls for cls in (PoissonGaussianEvent, FixedSizeGaussianEvent,
                                                             TruncatedPoissonGaussianEvent, GaussianEvent, LaplaceEvent)}
