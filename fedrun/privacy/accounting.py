"""Privacy accounting: ε of composed mechanisms, noise calibration, a per-run accountant.

Thin wrapper over Google's ``dp_accounting`` (RdpAccountant, PLDAccountant). The neighbouring relation follows
from how the units (clients) of a round were sampled (``SAMPLING_ACCOUNTANTS``: which accountant can do which):

* ``"poisson"`` (``PoissonGaussianEvent``): add-or-remove-one (one client's whole data added or removed); RDP or PLD.
* ``"fixed_size"`` (``FixedSizeGaussianEvent``, k of N without replacement): replace-one (N fixed and public, one
  client's data replaced by other data); RDP only (Wang, Balle, Kasiviswanathan 2019, Thm 27, dp_accounting's
  ``SampledWithoutReplacementDpEvent``; its PLD accountant has no such event). One replacement moves the clipped
  sum by up to 2S, so the Gaussian is charged with noise multiplier σ/2 (σ = noise std / S).
* ``"capped_poisson"`` (``TruncatedPoissonGaussianEvent``, Poisson then at most a cap, the excess dropped at
  random): add-or-remove-one; PLD only (dp_accounting's ``TruncatedSubsampledGaussianDpEvent``; its RDP
  accountant has none: the "rdp" ε of such events is ∞, which is a valid but useless bound).

* ``"schema"`` (a participation schema the sampler enforces, ``sampler=cyclic``: each client at most k times, at
  least b rounds apart; no amplification by sampling): zero-out neighbours (one client's contributions replaced by
  nothing). The T rounds' release is one Gaussian mechanism on C·G (:mod:`fedrun.privacy.factorization`); round t
  records a ``GaussianEvent`` with σ over the growth of the prefix sensitivity, √(s_t² − s_{t−1}²), so that after
  round t the composition (exact for Gaussians, RDP and PLD alike) is the Gaussian with σ / s_t.

Events sampled without replacement are never composed with Poisson-sampled ones (different relations).

* ``"rdp"``: Rényi DP of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019), converted to (ε, δ)
  with the improved bound of Balle et al. 2020 (Prop. 12) — an upper bound, cheap (ms), the moments
  accountant of Abadi et al. 2016 that paper 000 uses, with a tighter conversion.
* ``"pld"``: privacy loss distributions (Koskela et al. 2020; Doroshenko et al. 2022) with pessimistic
  discretization 1e-4 — a tighter, still valid upper bound; 10–100× slower than RDP.

Cost (2-core CI machine; see tests): ε after T = 200 rounds of a q = 0.1 Poisson-Gaussian event is
~0.03–0.08 s with RDP and ~0.2–0.8 s with PLD (σ = 2 … 1). ``PrivacyAccountant`` therefore keeps a running
RDP curve (each round adds a cached vector: ε after every round costs ~0.1 ms) and computes PLD on demand
only (``epsilon("pld")``/``summary()``: rebuilt from the grouped event list, cached until the next event).

Bounded cost, whatever the parameters (σ → 0 or huge, q → 0 or 1, up to 1e18 rounds, any δ in (0, 1)):
every call — compute_epsilon, gaussian_composition_epsilon, PrivacyAccountant.epsilon/summary, with "rdp" or
"pld" — answers with a valid upper bound on ε (possibly ``math.inf``) or raises a one-line ``ValueError``
naming the bad value and what is allowed; none allocates without bound (an unplanned PLD for σ = 1e-6,
q = 0.25 would ask numpy for 35.5 PiB).

* A PLD grid has ≈ (privacy-loss range)/(discretization) points: one Gaussian release spans
  ≈ 1/σ² + 20/σ (sensitivity 1, tails cut at e⁻⁵⁰; about half with subsampling), T releases without
  subsampling one Gaussian with σ/√T, and a T-fold self-composition of a subsampled release dp_accounting's
  Chernoff window, which grows with T. Before building anything, ``_plan_pld`` predicts these sizes: exactly
  from dp_accounting's ``connect_dots_bounds`` (nothing built), and the windows from dp_accounting's own
  ``compute_self_convolve_bounds`` on a probe of ≤ 4096 points (the grid itself when it is that small),
  with a 25 % margin. Their sum — built points of subsampled grids counted 3× (~10 µs each to build, a plain
  Gaussian's ~3.5 µs) — must stay within ``_PLD_MAX_POINTS`` = 2²⁰: a few seconds and ~0.2 GB per call at
  most (measured on the loaded 2-core machine: see tests/unit/test_accounting_bounds.py).
* Within the budget at discretization 1e-4, nothing changes (e.g. σ/√T ≥ 0.25 with q = 1; σ = 1, q = 0.1,
  T = 200; σ = 0.7, q = 0.0043, T = 10⁴). Above it, the discretization is coarsened until the prediction
  fits — a pessimistic PLD is an upper bound at any discretization, only a looser one; in practice ε moves
  by < 1e-8 relative — and the answer is min(that PLD bound, the RDP bound), both upper bounds.
* The RDP bound is the "pld" answer too when the RDP ε already exceeds ``_MEANINGLESS_EPSILON`` = 1e4 (no
  meaningful privacy: a PLD would cost seconds and not change that), when even discretization
  ``_PLD_MAX_DISCRETIZATION`` = 0.1 would not fit, when more than ``_PLD_MAX_EVENT_KINDS`` = 16 distinct
  subsampled/Laplace events were composed, or when a release's loss is 0 in floating point (dp_accounting
  would self-compose its one-point grid T times, one by one). Which path was taken is logged (INFO) and
  kept in ``PrivacyAccountant.pld_info`` and ``summary()["pld_discretization"]`` (NaN: RDP stood in).
* RDP costs ≤ ~1 s for any σ, q, T. Where dp_accounting's arithmetic breaks (σ < 1e-30 or > 1e100, Laplace
  scales > 1e300), ``to_dp_event`` substitutes events with no less privacy loss: still upper bounds.
* Gaussian releases without subsampling compose exactly into one Gaussian with σ = (Σ σᵢ⁻²)^(-1/2), so
  ``gaussian_composition_epsilon`` builds one grid whatever the number of distinct σᵢ.
* ``calibrate_noise_multiplier`` makes a bounded number of such calls (≤ ~250 per accountant; 10–20 usually).
"""

from __future__ import annotations

import logging
import math
import numbers
import operator
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import dp_accounting
import numpy as np
from absl import logging as absl_logging
from dp_accounting import pld, rdp
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution, privacy_loss_mechanism
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import stats

from fedrun.privacy.mechanisms import (
    EVENT_TYPES,
    Event,
    FixedSizeGaussianEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonGaussianEvent,
    TruncatedPoissonGaussianEvent,
)

__all__ = [
    "ACCOUNTANTS",
    "SAMPLING_ACCOUNTANTS",
    "UNSUPPORTED_PAIRS",
    "NEIGHBOURING_RELATIONS",
    "check_sampling_accountant",
    "sampled_gaussian_event",
    "compute_epsilon",
    "calibrate_noise_multiplier",
    "PrivacyAccountant",
    "laplace_basic_composition",
    "gaussian_composition_epsilon",
    "to_dp_event",
    "event_to_dict",
    "event_from_dict",
]

# dp_accounting warns (through absl) for every fractional RDP order whose series it cannot converge and
# then drops that order — harmless for the bound (fewer orders = still valid) but noisy on every run.
absl_logging.set_verbosity(absl_logging.ERROR)
_log = logging.getLogger(__name__)

ACCOUNTANTS = ("rdp", "pld")
#: how a round's units are sampled → the accountants dp_accounting can do it with (fedrun.config refuses the rest)
SAMPLING_ACCOUNTANTS: dict[str, tuple[str, ...]] = {
    "poisson": ("rdp", "pld"), "fixed_size": ("rdp",), "capped_poisson": ("pld",), "schema": ("rdp", "pld")}
#: the neighbouring relation each sampling's ε holds under
NEIGHBOURING_RELATIONS = {"poisson": "add/remove-one", "fixed_size": "replace-one", "capped_poisson": "add/remove-one",
                          "schema": "zero-out"}
#: why an accountant cannot do a sampling (the pairs SAMPLING_ACCOUNTANTS leaves out)
UNSUPPORTED_PAIRS = {
    ("fixed_size", "pld"): "dp_accounting's PLD accountant has no event for sampling without replacement",
    ("capped_poisson", "rdp"): "dp_accounting's RDP accountant has no bound for truncated Poisson sampling"}
_MIXED_RELATIONS = ("events sampled without replacement (replace-one neighbours) cannot be composed with "
                    "Poisson-sampled ones (add/remove-one neighbours)")
_NEIGHBORS = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
_REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE
_PLD_DISCRETIZATION = 1e-4
_MIN_NOISE_MULTIPLIER = 1e-2
_MAX_NOISE_MULTIPLIER = 1e6
_CALIBRATION_TOLERANCE = 0.01  # calibrated ε lies in [(1 - tol)·target, target]
# Bounded PLD evaluation (see the module docstring).
_PLD_MAX_POINTS = 1 << 20  # Σ over the grids of max(weight × built points, self-convolution length)
_SUBSAMPLED_BUILD_WEIGHT = 3.0  # a subsampled grid point costs ~3× a plain Gaussian's to build (~10 µs)
_PLD_MAX_DISCRETIZATION = 0.1  # coarser than this: the RDP bound answers instead
_PLD_MAX_EVENT_KINDS = 16  # distinct subsampled/Laplace events (each builds its own grid and probes)
_PLD_PROBE_POINTS = 4096  # grid of the probe that measures a self-composition's Chernoff window
_PLD_WINDOW_SAFETY = 1.25  # margin on the probe's window (and next_fast_len rounding)
_PLD_TAIL_MASS_TRUNCATION = 1e-15  # dp_accounting's default in self_compose
_MEANINGLESS_EPSILON = 1e4  # RDP bound above this: no PLD is built (it cannot make ε meaningful)
_NEGLIGIBLE_NOISE_MULTIPLIER = 1e-30  # below: no noise (RDP arithmetic overflows near 1e-154)
_MAX_ROUNDS = 10**18  # more would overflow float arithmetic (and no run has them)
_HUGE_NOISE_MULTIPLIER = 1e100  # above: treated as 1e100 (less noise; PLD arithmetic overflows near 1e154)
_ALMOST_ONE = 1 - 1e-9  # sampling probabilities above: treated as 1 (PLD arithmetic fails at 1 − q ≲ 1e-12)


# ------------------------------------------------------------------------------------------------ validation
def _check_accountant(accountant: str) -> None:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant={accountant!r} is not one of {ACCOUNTANTS}")


def _check_real(name: str, value: float, allowed: str, ok: Callable[[float], bool]) -> None:
    """One-line ValueError unless ``value`` is a real number with ``ok(value)`` (``allowed`` says which)."""
    if not (isinstance(value, numbers.Real) and ok(value)):
        raise ValueError(f"{name}={value!r} is outside {allowed}")


def _check_delta(delta: float) -> None:
    _check_real("delta", delta, "(0, 1)", lambda d: 0 < d < 1)


def _check_int(name: str, value: int | None, low: int, high: int | None = None) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        v = low - 1
    if v < low:
        raise ValueError(f"{name}={value!r} must be an integer >= {low}")
    if high is not None and v > high:
        raise ValueError(f"{name}={value!r} is outside [{low}, {high:.0e}]")
    return v


def _check_query(sigma_name: str, sigma: float, q: float, rounds: int, delta: float, sampling: str,
                 accountant: str) -> int:
    """Validate a compute_epsilon/calibrate_noise_multiplier query; the rounds as an int."""
    _check_real(sigma_name, sigma, "(0, inf)", lambda x: 0 < x < math.inf)
    _check_real("sampling_probability", q, "(0, 1]", lambda x: 0 < x <= 1)
    rounds = _check_int("rounds", rounds, 1, _MAX_ROUNDS)
    _check_delta(delta)
    check_sampling_accountant(sampling, accountant)
    return rounds


def check_sampling_accountant(sampling: str, accountant: str) -> None:
    """One-line ValueError unless ``accountant`` can account rounds sampled by ``sampling``."""
    if sampling not in SAMPLING_ACCOUNTANTS:
        raise ValueError(f"sampling={sampling!r} is not one of {tuple(SAMPLING_ACCOUNTANTS)}")
    _check_accountant(accountant)
    allowed = SAMPLING_ACCOUNTANTS[sampling]
    if accountant not in allowed:
        raise ValueError(f"accountant={accountant} cannot account sampling={sampling}: "
                         f"{UNSUPPORTED_PAIRS[sampling, accountant]}; allowed: accountant={'|'.join(allowed)}")


def sampled_gaussian_event(
    noise_multiplier: float,
    sampling_probability: float,
    *,
    sampling: str = "poisson",
    num_clients: int | None = None,
    cohort_size: int | None = None,
) -> Event:
    """The event of one round of the Gaussian mechanism (σ = noise std / S) on units sampled by ``sampling``:

    * ``"poisson"``: each unit with probability q (``sampling_probability``) — ``PoissonGaussianEvent``;
    * ``"fixed_size"``: ``cohort_size`` k of ``num_clients`` N without replacement; q must be k/N —
      ``FixedSizeGaussianEvent``;
    * ``"capped_poisson"``: Poisson with q, at most ``cohort_size`` kept — ``TruncatedPoissonGaussianEvent``.
    """
    if sampling not in SAMPLING_ACCOUNTANTS:
        raise ValueError(f"sampling={sampling!r} is not one of {tuple(SAMPLING_ACCOUNTANTS)}")
    if sampling == "poisson":
        return PoissonGaussianEvent(float(noise_multiplier), float(sampling_probability))
    n = _check_int("num_clients", num_clients, 1)
    k = _check_int("cohort_size", cohort_size, 1)
    if sampling == "fixed_size":
        if k > n:
            raise ValueError(f"cohort_size={k} is outside [1, num_clients={n}]")
        if not math.isclose(float(sampling_probability), k / n, rel_tol=1e-9):
            raise ValueError(f"sampling_probability={sampling_probability!r} is not cohort_size/num_clients = "
                             f"{k}/{n} (sampling=fixed_size)")
        return FixedSizeGaussianEvent(float(noise_multiplier), n, k)
    return TruncatedPoissonGaussianEvent(float(noise_multiplier), float(sampling_probability), n, k)


# ------------------------------------------------------------------------------------------------ events
def to_dp_event(event: Event) -> dp_accounting.DpEvent:
    """The ``dp_accounting`` event that a fedrun event stands for, made safe for dp_accounting's arithmetic: a
    noise multiplier below ``_NEGLIGIBLE_NOISE_MULTIPLIER`` counts as no noise (ε = ∞, a valid bound;
    dp_accounting's RDP overflows there and even returned ε = 0 at σ = 1e-154); a noise multiplier above
    ``_HUGE_NOISE_MULTIPLIER`` and a Laplace scale 1/ε that overflows to ∞ are lowered to 1e100 and 1e300
    (less noise than was added: still an upper bound; dp_accounting's PLD overflows at σ ≈ 1e154), and a
    sampling probability above 1 − 1e-9 is raised to 1 (more sampling: still an upper bound; dp_accounting's
    PLD breaks at 1 − q ≲ 1e-12)."""
    if not isinstance(event, tuple(EVENT_TYPES.values())):
        raise ValueError(f"event={event!r} is not one of {sorted(EVENT_TYPES)}")
    if isinstance(event, LaplaceEvent):  # dp_accounting's Laplace noise_multiplier is scale / L1 sensitivity = 1/ε
        scale = 1.0 / float(event.epsilon)
        return dp_accounting.LaplaceDpEvent(min(scale, 1e300)) if scale > 0 else dp_accounting.NonPrivateDpEvent()
    q = float(getattr(event, "sampling_probability", 1.0))
    if q == 0 or getattr(event, "sample_size", 1) == 0 or getattr(event, "max_sample_size", 1) == 0:
        return dp_accounting.NoOpDpEvent()
    # fixed size, replace-one: one unit's clipped contribution (norm ≤ S) replaced by another moves the sum by ≤ 2S
    sigma = float(event.noise_multiplier) / (2 if isinstance(event, FixedSizeGaussianEvent) else 1)
    if sigma < _NEGLIGIBLE_NOISE_MULTIPLIER:
        return dp_accounting.NonPrivateDpEvent()
    gaussian = dp_accounting.GaussianDpEvent(min(sigma, _HUGE_NOISE_MULTIPLIER))
    q = 1.0 if q > _ALMOST_ONE else q
    if isinstance(event, FixedSizeGaussianEvent):
        return dp_accounting.SampledWithoutReplacementDpEvent(int(event.dataset_size), int(event.sample_size), gaussian)
    if isinstance(event, TruncatedPoissonGaussianEvent):
        return dp_accounting.TruncatedSubsampledGaussianDpEvent(
            int(event.dataset_size), q, int(event.max_sample_size), gaussian.noise_multiplier)
    return gaussian if q == 1 else dp_accounting.PoissonSampledDpEvent(q, gaussian)


_COUNT_FIELDS = ("dataset_size", "sample_size", "max_sample_size")


def event_to_dict(event: Event) -> dict[str, Any]:
    """JSON-able form: ``{"type": class name, **fields}`` (counts as int, the rest as float)."""
    if type(event).__name__ not in EVENT_TYPES:
        raise ValueError(f"event={event!r} is not one of {sorted(EVENT_TYPES)}")
    return {"type": type(event).__name__,
            **{k: int(v) if k in _COUNT_FIELDS else float(v) for k, v in vars(event).items()}}


def event_from_dict(d: dict[str, Any]) -> Event:
    """Inverse of ``event_to_dict``."""
    fields = dict(d)
    name = fields.pop("type", None)
    if name not in EVENT_TYPES:
        raise ValueError(f"event type {name!r} is not one of {sorted(EVENT_TYPES)}")
    return EVENT_TYPES[name](**fields)


def _event_kinds(counts: dict[Event, int]) -> tuple[list[tuple[dp_accounting.DpEvent, int]], bool]:
    """``(kinds, non_private)``: the distinct dp_accounting events with their counts (no-ops dropped), and
    whether any event added no noise. Several Gaussian kinds (no subsampling) are merged exactly into one
    Gaussian with σ = (Σ count·σ⁻²)^(-1/2), in the place of the first — one grid instead of one per σ; a
    single Gaussian kind is left as it is (σ/√count inside dp_accounting)."""
    merged: Counter[dp_accounting.DpEvent] = Counter()
    non_private = False
    for event, count in counts.items():
        dp_event = to_dp_event(event)
        if isinstance(dp_event, dp_accounting.NoOpDpEvent):
            continue
        if isinstance(dp_event, dp_accounting.NonPrivateDpEvent):
            non_private = True
            continue
        merged[dp_event] += int(count)
    gaussians = [(e, c) for e, c in merged.items() if isinstance(e, dp_accounting.GaussianDpEvent)]
    if len(gaussians) <= 1:
        return list(merged.items()), non_private
    precision = math.fsum(c * (1.0 / e.noise_multiplier) ** 2 for e, c in gaussians)
    if precision > 0:
        sigma = precision**-0.5
    else:  # every σ so large that σ⁻² underflows: σ_eff ≥ min σ/√(Σ count), so that is an upper bound
        sigma = min(e.noise_multiplier for e, _ in gaussians) / math.sqrt(sum(c for _, c in gaussians))
    kinds: list[tuple[dp_accounting.DpEvent, int]] = []
    for e, c in merged.items():
        if not isinstance(e, dp_accounting.GaussianDpEvent):
            kinds.append((e, c))
        elif e is gaussians[0][0]:
            kinds.append((dp_accounting.GaussianDpEvent(sigma), 1))
    return kinds, non_private


def _event_relation(dp_event: dp_accounting.DpEvent) -> dp_accounting.NeighboringRelation | None:
    """The neighbouring relation a sampled event's bound holds under; None for events without sampling (their
    bound, in their own sensitivity, holds under either)."""
    if isinstance(dp_event, dp_accounting.SampledWithoutReplacementDpEvent):
        return _REPLACE_ONE
    if isinstance(dp_event, (dp_accounting.PoissonSampledDpEvent, dp_accounting.TruncatedSubsampledGaussianDpEvent)):
        return _NEIGHBORS
    return None


def _relation(dp_events: Sequence[dp_accounting.DpEvent]) -> dp_accounting.NeighboringRelation:
    """The one neighbouring relation of a composition; ValueError when its sampled events need different ones."""
    relations = {r for r in map(_event_relation, dp_events) if r is not None}
    if len(relations) > 1:
        raise ValueError(_MIXED_RELATIONS)
    return relations.pop() if relations else _NEIGHBORS


def _rdp_unsupported(dp_event: dp_accounting.DpEvent) -> bool:
    """dp_accounting's RDP accountant has no bound for the event (its ε is then ∞)."""
    return isinstance(dp_event, dp_accounting.TruncatedSubsampledGaussianDpEvent)


def _rdp_epsilon(kinds: list[tuple[dp_accounting.DpEvent, int]], delta: float) -> float:
    if any(_rdp_unsupported(e) for e, _ in kinds):
        return math.inf
    acc = rdp.RdpAccountant(neighboring_relation=_relation([e for e, _ in kinds]))
    for dp_event, count in kinds:
        acc.compose(dp_event, count)
    return _clean_epsilon(acc.get_epsilon(delta))


def _clean_epsilon(eps: float) -> float:
    eps = float(eps)
    return math.inf if math.isnan(eps) else max(eps, 0.0)


# --------------------------------------------------------------------------------------- bounded PLD plan
@dataclass(frozen=True)
class _GridShape:
    """One grid a PLD evaluation builds: privacy-loss range [low, high] of the discretized single event, and
    (for a self-composition) the Chernoff window ``window`` (in privacy-loss units) of the composed one.
    ``weight``: cost of building one point relative to a plain Gaussian's (~3.5 µs; subsampled ~3×)."""

    low: float
    high: float
    window: float | None = None
    weight: float = 1.0

    def built_points(self, interval: float) -> float:
        """Points of the single-event grid at ``interval`` — exactly dp_accounting's connect-the-dots count."""
        if (self.high - self.low) / interval > 1e15:
            return math.inf
        return float(math.ceil(self.high / interval) - math.floor(self.low / interval) + 1)

    def points(self, interval: float) -> float:
        """max(weight × points built, self-convolution length) at ``interval``: what the budget counts."""
        built = self.weight * self.built_points(interval)
        if self.window is None:
            return built
        return max(built, _PLD_WINDOW_SAFETY * self.window / interval + 1)


@dataclass(frozen=True)
class PldPlan:
    """How a "pld" ε was (or will be) obtained: ``method`` is ``"pld"`` (discretization 1e-4, unchanged),
    ``"pld-coarse"`` (coarser ``discretization``; answer min(PLD, RDP)) or ``"rdp"`` (the RDP bound stands
    in; ``discretization`` is NaN); ``grid_points`` is the predicted total grid size."""

    method: str
    discretization: float
    grid_points: float
    reason: str = ""



def _single_pld(dp_event: dp_accounting.DpEvent, interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The one-event PLD that ``PLDAccountant`` self-composes for a subsampled or Laplace kind."""
    if isinstance(dp_event, dp_accounting.PoissonSampledDpEvent):
        return privacy_loss_distribution.from_gaussian_mechanism(
            dp_event.event.noise_multiplier, value_discretization_interval=interval,
            sampling_prob=dp_event.sampling_probability, neighboring_relation=_NEIGHBORS)
    if isinstance(dp_event, dp_accounting.TruncatedSubsampledGaussianDpEvent):
        return privacy_loss_distribution.from_truncated_subsampled_gaussian_mechanism(
            dp_event.dataset_size, dp_event.sampling_probability, dp_event.truncated_batch_size,
            dp_event.noise_multiplier, value_discretization_interval=interval, neighboring_relation=_NEIGHBORS)
    return privacy_loss_distribution.from_laplace_mechanism(
        dp_event.noise_multiplier, value_discretization_interval=interval)


def _loss_ranges(dp_event: dp_accounting.DpEvent, count: int) -> list[tuple[float, float]]:
    """Privacy-loss range of each grid (REMOVE, and ADD when asymmetric) dp_accounting builds for the kind —
    its own ``connect_dots_bounds``, so the predicted grid size is exact; no grid is built. A capped Poisson
    sample's grid mixes the Poisson-subsampled Gaussian (σ, q) with, when the cap can bind, a replace-one
    subsampled Gaussian (σ/2, the conditional sampling probability): the quantities that dp_accounting's
    ``from_truncated_subsampled_gaussian_mechanism`` computes."""
    plm = privacy_loss_mechanism
    if isinstance(dp_event, dp_accounting.GaussianDpEvent):
        grids = [[plm.GaussianPrivacyLoss(dp_event.noise_multiplier / math.sqrt(count))]]
    elif isinstance(dp_event, dp_accounting.LaplaceDpEvent):
        grids = [[plm.LaplacePrivacyLoss(dp_event.noise_multiplier)]]
    else:
        capped = isinstance(dp_event, dp_accounting.TruncatedSubsampledGaussianDpEvent)
        sigma = dp_event.noise_multiplier if capped else dp_event.event.noise_multiplier
        q = dp_event.sampling_probability
        grids = [[plm.GaussianPrivacyLoss(sigma, sampling_prob=q, adjacency_type=a)]
                 for a in (plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD)]
        if capped:
            n, cap = dp_event.dataset_size, dp_event.truncated_batch_size
            truncation = stats.binom.sf(cap - 1, n - 1, q)
            if truncation > 0:
                q2 = stats.binom.sf(cap, n, q) * cap / truncation / n
                replace = plm.GaussianPrivacyLoss(sigma / 2, sampling_prob=q2, adjacency_type=plm.AdjacencyType.REPLACE)
                grids = [g + [replace] for g in grids]
    bounds = [[loss.connect_dots_bounds() for loss in g] for g in grids]
    return [(float(min(b.epsilon_lower for b in g)), float(max(b.epsilon_upper for b in g))) for g in bounds]


def _build_weight(dp_event: dp_accounting.DpEvent) -> float:
    subsampled = (dp_accounting.PoissonSampledDpEvent, dp_accounting.TruncatedSubsampledGaussianDpEvent)
    return _SUBSAMPLED_BUILD_WEIGHT if isinstance(dp_event, subsampled) else 1.0


def _grid_shapes(
    dp_event: dp_accounting.DpEvent, count: int, ranges: list[tuple[float, float]], interval: float
) -> list[_GridShape] | None:
    """The grids of one kind at discretization ``interval``. A self-composition (count > 1, not a Gaussian)
    spans the Chernoff window that dp_accounting's ``self_convolve`` computes from the grid; it is measured
    on a probe: the grid itself when that has ≤ ``_PLD_PROBE_POINTS`` points (exact), else the same grid at
    a discretization giving that many points (the window in privacy-loss units then hardly depends on the
    discretization: it is far below the spread of one event's loss). None when the probe would need a
    discretization above ``_PLD_MAX_DISCRETIZATION`` (the kind is then too large for any grid anyway)."""
    weight = _build_weight(dp_event)
    if count == 1 or isinstance(dp_event, dp_accounting.GaussianDpEvent):
        return [_GridShape(lo, hi, None, weight) for lo, hi in ranges]
    width = max(hi - lo for lo, hi in ranges)
    probe_interval = max(interval, width / _PLD_PROBE_POINTS)
    if probe_interval > _PLD_MAX_DISCRETIZATION:
        return None
    probe = _single_pld(dp_event, probe_interval)
    pmfs = [probe._pmf_remove] if probe._symmetric else [probe._pmf_remove, probe._pmf_add]  # noqa: SLF001
    shapes = []
    for (lo, hi), pmf in zip(ranges, pmfs):
        probs = pmf.to_dense_pmf()._probs  # noqa: SLF001
        low, high = pld_common.compute_self_convolve_bounds(probs, count, _PLD_TAIL_MASS_TRUNCATION)
        shapes.append(_GridShape(lo, hi, (high - low + 1) * probe_interval, weight))
    return shapes


def _plan_pld(
    kinds: list[tuple[dp_accounting.DpEvent, int]], rdp_epsilon: Callable[[], float]
) -> PldPlan:
    """Choose how to answer a "pld" query within ``_PLD_MAX_POINTS`` grid points (see module docstring)."""
    budget = _PLD_MAX_POINTS
    if not kinds:
        return PldPlan("pld", _PLD_DISCRETIZATION, 0.0)
    if any(isinstance(e, dp_accounting.SampledWithoutReplacementDpEvent) for e, _ in kinds):
        return PldPlan("rdp", math.nan, math.inf, UNSUPPORTED_PAIRS["fixed_size", "pld"])
    complex_kinds = sum(not isinstance(e, dp_accounting.GaussianDpEvent) for e, _ in kinds)
    if complex_kinds > _PLD_MAX_EVENT_KINDS:
        return PldPlan("rdp", math.nan, math.inf, f"{complex_kinds} distinct events > {_PLD_MAX_EVENT_KINDS}")
    ranges = [(e, c, _loss_ranges(e, c)) for e, c in kinds]  # exact, nothing built
    for e, c, rs in ranges:
        if c > 1 and not isinstance(e, dp_accounting.GaussianDpEvent) and any(lo == hi == 0 for lo, hi in rs):
            # Loss ≡ 0 in floating point (σ ≈ 1e100, or q ≈ 1e-300): a one-point grid, which dp_accounting
            # self-composes one copy at a time (count steps). The RDP bound (≈ 0 here) answers instead.
            return PldPlan("rdp", math.nan, math.inf, f"one-point grid composed {c} times")

    probes: dict[tuple[int, float], list[_GridShape] | None] = {}

    def grid_points(interval: float) -> float:
        total = 0.0
        for i, (e, c, rs) in enumerate(ranges):
            width = max(hi - lo for lo, hi in rs)
            key = (i, max(interval, width / _PLD_PROBE_POINTS))  # same probe ⇒ same shapes
            if key not in probes:
                probes[key] = _grid_shapes(e, c, rs, interval)
            shapes = probes[key]
            if shapes is None:
                return math.inf
            total += sum(g.points(interval) for g in shapes)
        return total

    # The single grids alone first (no probe): whether probing at 1e-4 is worth it, and a first interval.
    single_points = sum(
        _GridShape(lo, hi, None, _build_weight(e)).points(_PLD_DISCRETIZATION) for e, _, rs in ranges for lo, hi in rs)
    if single_points <= budget:
        points = grid_points(_PLD_DISCRETIZATION)
        if points <= budget:
            return PldPlan("pld", _PLD_DISCRETIZATION, points)
    # Only where RDP bounds every kind: for a capped Poisson sample its ε is ∞ for want of a bound, not because
    # privacy is meaningless, so the PLD is coarsened instead.
    eps_rdp = rdp_epsilon() if not any(_rdp_unsupported(e) for e, _ in kinds) else None
    if eps_rdp is not None and not eps_rdp <= _MEANINGLESS_EPSILON:
        return PldPlan("rdp", math.nan, math.inf, f"RDP epsilon {eps_rdp:.3g} > {_MEANINGLESS_EPSILON:g}")
    interval = _PLD_DISCRETIZATION * max(1.0, single_points / budget)
    points = grid_points(interval) if interval <= _PLD_MAX_DISCRETIZATION else math.inf
    for _ in range(12):  # points ≈ ∝ 1/interval (plus a few per grid): converges in a few steps
        if points <= budget or interval > _PLD_MAX_DISCRETIZATION:
            break
        interval *= 1.02 * points / budget
        points = grid_points(interval) if interval <= _PLD_MAX_DISCRETIZATION else math.inf
    if not points <= budget:
        return PldPlan("rdp", math.nan, math.inf, f"no grid of ≤ {budget} points at discretization "
                       f"≤ {_PLD_MAX_DISCRETIZATION:g}")
    reason = f"grid at discretization {_PLD_DISCRETIZATION:g} exceeds {budget} points"
    return PldPlan("pld-coarse", interval, points, reason)


def _pld_epsilon(
    kinds: list[tuple[dp_accounting.DpEvent, int]], delta: float, rdp_epsilon: Callable[[], float]
) -> tuple[float, PldPlan]:
    """PLD ε (a valid upper bound) of the composition of the kinds, computed within the grid budget."""
    try:
        plan = _plan_pld(kinds, rdp_epsilon)
        if plan.method == "rdp":
            eps = rdp_epsilon()
        else:
            acc = pld.PLDAccountant(
                neighboring_relation=_NEIGHBORS, value_discretization_interval=plan.discretization)
            for dp_event, count in kinds:
                acc.compose(dp_event, count)
            eps = _clean_epsilon(acc.get_epsilon(delta))
    except (ArithmeticError, ValueError) as exc:  # dp_accounting's numerics at an extreme: RDP still bounds ε
        plan = PldPlan("rdp", math.nan, math.inf, f"PLD failed: {type(exc).__name__}: {exc}")
        eps = rdp_epsilon()
    if plan.method != "pld":
        _log.info("PLD accounting: %s (%s)", plan.method, plan.reason)
    if plan.method == "pld-coarse":
        eps = min(eps, rdp_epsilon())
    return eps, plan


def _epsilon_of_counts(
    counts: dict[Event, int], delta: float, accountant: str, rdp_epsilon: Callable[[], float] | None = None
) -> tuple[float, PldPlan | None]:
    """ε of the composition of ``count`` copies of each event (composition is order-free), and the PLD plan
    (None for "rdp" and trivial cases). ``rdp_epsilon``: the RDP bound of the same events, if known."""
    kinds, non_private = _event_kinds(counts)
    if non_private:
        return math.inf, None
    if not kinds:
        return 0.0, None
    if accountant == "rdp":
        return _rdp_epsilon(kinds, delta), None
    cache: list[float] = []

    def cached_rdp_epsilon() -> float:
        if not cache:
            cache.append(rdp_epsilon() if rdp_epsilon is not None else _rdp_epsilon(kinds, delta))
        return cache[0]

    return _pld_epsilon(kinds, delta, cached_rdp_epsilon)


# ------------------------------------------------------------------------------------------------ public API
def compute_epsilon(
    noise_multiplier: float,
    sampling_probability: float,
    rounds: int,
    delta: float,
    accountant: str = "rdp",
    *,
    sampling: str = "poisson",
    num_clients: int | None = None,
    cohort_size: int | None = None,
) -> float:
    """ε after ``rounds`` rounds of the subsampled Gaussian mechanism (DP-FedAvg / DP-SGD).

    ``noise_multiplier`` σ = noise std / L2 sensitivity (the clip S of one unit), ``sampling_probability`` q
    (1 = no subsampling). ``sampling`` (see :func:`sampled_gaussian_event`): ``"poisson"`` (default; add/remove-one
    neighbours; Abadi et al. 2016 moments accountant / Mironov et al. 2019, or PLD), ``"fixed_size"``
    (``cohort_size`` k of ``num_clients`` N without replacement, q = k/N; replace-one neighbours, RDP only),
    ``"capped_poisson"`` (Poisson with q, at most ``cohort_size`` kept; add/remove-one, PLD only). A pair the
    accountants cannot do is a one-line ValueError.
    """
    rounds = _check_query("noise_multiplier", noise_multiplier, sampling_probability, rounds, delta, sampling,
                          accountant)
    event = sampled_gaussian_event(noise_multiplier, sampling_probability, sampling=sampling,
                                   num_clients=num_clients, cohort_size=cohort_size)
    return _epsilon_of_counts({event: rounds}, delta, accountant)[0]


def _smallest_feasible(
    eps_of: Callable[[float], float], target: float, guess: float, describe: str
) -> float:
    """Smallest x with eps_of(x) ≤ target (eps_of non-increasing): eps_of(x) ∈ [0.99·target, target]."""
    cache: dict[float, float] = {}

    def f(x: float) -> float:
        if x not in cache:
            cache[x] = eps_of(x)
        return cache[x]

    hi = min(max(guess, _MIN_NOISE_MULTIPLIER), _MAX_NOISE_MULTIPLIER)
    if f(hi) > target:  # expand upwards until feasible
        lo = hi
        while f(hi) > target:
            if hi >= _MAX_NOISE_MULTIPLIER:
                raise ValueError(
                    f"target_epsilon={target!r} cannot be met for {describe}: "
                    f"even noise_multiplier={_MAX_NOISE_MULTIPLIER:g} gives epsilon={f(hi):.4g}"
                )
            lo, hi = hi, min(hi * 2, _MAX_NOISE_MULTIPLIER)
    else:  # expand downwards until infeasible; first step from ε ∝ 1/σ (roughly true for the Gaussian)
        lo = max(hi * max(0.5, min(0.98, 0.97 * f(hi) / target)), _MIN_NOISE_MULTIPLIER)
        while f(lo) <= target:
            if lo <= _MIN_NOISE_MULTIPLIER:
                raise ValueError(
                    f"target_epsilon={target!r} is met for {describe} even with "
                    f"noise_multiplier={_MIN_NOISE_MULTIPLIER:g} (epsilon={f(lo):.4g}); "
                    "no meaningful calibration (is delta ≥ sampling_probability?)"
                )
            hi, lo = lo, max(lo / 2, _MIN_NOISE_MULTIPLIER)
    # Invariant: f(lo) > target ≥ f(hi). Safeguarded bisection on log σ: interpolate log ε linearly in
    # log σ towards the middle of the accepted band, kept inside the inner 90 % of the bracket.
    aim = math.log((1 - _CALIBRATION_TOLERANCE / 2) * target)
    while f(hi) < (1 - _CALIBRATION_TOLERANCE) * target and hi / lo - 1 > 1e-9:
        a, b = math.log(lo), math.log(hi)
        fa, fb = math.log(f(lo)) if math.isfinite(f(lo)) else math.inf, math.log(max(f(hi), 1e-300))
        t = (fa - aim) / (fa - fb) if math.isfinite(fa) else 0.5
        mid = math.exp(a + min(max(t, 0.1), 0.9) * (b - a))
        if f(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def calibrate_noise_multiplier(
    target_epsilon: float,
    sampling_probability: float,
    rounds: int,
    delta: float,
    accountant: str = "rdp",
    *,
    sampling: str = "poisson",
    num_clients: int | None = None,
    cohort_size: int | None = None,
) -> float:
    """Smallest σ (bisection) with ``compute_epsilon(σ, q, rounds, δ, …) ≤ target_epsilon``, for any sampling
    :func:`compute_epsilon` takes.

    The returned σ gives ε within 1 % below the target (unless ε(σ) jumps to 0 there: a target so small
    that only (0, δ)-DP meets it). Paper 000 calibrates σ so that ε ≤ 1 after T_cl rounds.
    ValueError when no σ in [1e-2, 1e6] reaches the target. Cost: RDP ~0.1–1 s (fixed-size ~1–4 s), PLD ~1–10 s.
    """
    rounds = _check_query("target_epsilon", target_epsilon, sampling_probability, rounds, delta, sampling, accountant)
    sampled_gaussian_event(1.0, sampling_probability, sampling=sampling, num_clients=num_clients,
                           cohort_size=cohort_size)  # validates the cohort before any search

    def solve(name: str, guess: float, how: str) -> float:
        describe = f"sampling_probability={sampling_probability}, rounds={rounds}, delta={delta}, accountant={name!r}"
        if how != "poisson":
            describe += f", sampling={how!r}, num_clients={num_clients}, cohort_size={cohort_size}"
        eps_of = lambda s: compute_epsilon(s, sampling_probability, rounds, delta, name, sampling=how,  # noqa: E731
                                           num_clients=num_clients, cohort_size=cohort_size)
        return _smallest_feasible(eps_of, target_epsilon, guess, describe)

    if accountant == "rdp":
        return solve("rdp", 1.0, sampling)
    # PLD is usually tighter than RDP, so the cheap RDP answer is a good first guess; for a capped Poisson sample
    # (no RDP bound) the Poisson one at the same q, whose ε is no larger (the search then goes up from it).
    try:
        guess = solve("rdp", 1.0, "poisson" if sampling == "capped_poisson" else sampling)
    except ValueError:
        guess = 1.0
    return solve("pld", guess, sampling)


def laplace_basic_composition(epsilons: Sequence[float]) -> float:
    """Pure ε of composing Laplace releases with pure ε_i each: Σ ε_i (basic composition, Dwork & Roth Thm 3.14)."""
    total = 0.0
    for i, e in enumerate(epsilons):
        if not (isinstance(e, numbers.Real) and e > 0 and not math.isnan(e)):
            raise ValueError(f"epsilons[{i}]={e!r} is outside (0, inf]")
        total += float(e)
    return total


def gaussian_composition_epsilon(
    noise_multipliers: Sequence[float], delta: float, accountant: str = "rdp"
) -> float:
    """ε (at ``delta``) of composing Gaussian releases without subsampling, release i with σ_i = std/Δ₂.

    For local DP (paper 001): one release per participation of a client, from the noise actually added.
    A σ_i = 0 (no noise) makes ε = ∞. No releases → 0.
    """
    _check_delta(delta)
    _check_accountant(accountant)
    counts: Counter[Event] = Counter()
    for i, s in enumerate(noise_multipliers):
        if not (isinstance(s, numbers.Real) and math.isfinite(s) and s >= 0):
            raise ValueError(f"noise_multipliers[{i}]={s!r} is outside [0, inf)")
        counts[GaussianEvent(float(s))] += 1
    return _epsilon_of_counts(counts, delta, accountant)[0]


# ------------------------------------------------------------------------------------------------ stateful
class PrivacyAccountant:
    """Composes one event per round for a training run; ε at ``delta`` on demand.

    ``record`` adds the event's RDP vector (cached per distinct event) to a running RDP curve, so
    ``epsilon("rdp")`` after every round is cheap (~0.1 ms). ``epsilon("pld")`` and ``summary()`` rebuild a
    PLD from the event counts (one self-composition per distinct event; ~0.2–0.8 s for 200 rounds at
    q = 0.1) and cache it until the next ``record``: call them every k rounds, not every round. The PLD is
    built within a fixed grid budget (module docstring); ``pld_info`` says how the last PLD ε was obtained.
    """

    def __init__(self, delta: float) -> None:
        _check_delta(delta)
        self.delta = float(delta)
        self._events: list[Event] = []
        self._rdp_cache: dict[Event, np.ndarray] = {}
        self._orders = np.asarray(rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=np.float64)
        self._rdp_curve = np.zeros_like(self._orders)
        self._pld_cache: tuple[int, float, PldPlan | None] | None = None
        self._relation: dp_accounting.NeighboringRelation | None = None

    @property
    def events(self) -> tuple[Event, ...]:
        """The events recorded so far, in order."""
        return tuple(self._events)

    @property
    def pld_info(self) -> dict[str, Any] | None:
        """How the last ``epsilon("pld")`` was obtained: ``{"method": "pld" | "pld-coarse" | "rdp",
        "discretization", "grid_points", "reason"}`` (None before any PLD ε, or when ε was trivially 0/∞)."""
        if self._pld_cache is None or self._pld_cache[2] is None:
            return None
        return asdict(self._pld_cache[2])

    def record(self, event: Event) -> None:
        """Compose one more event (one round). Events sampled without replacement (replace-one) and
        Poisson-sampled ones (add/remove-one) cannot be mixed: ValueError. An event RDP has no bound for (a
        capped Poisson sample) makes the running RDP ε ∞."""
        dp_event = to_dp_event(event)  # validates the type
        relation = _event_relation(dp_event)
        if relation is not None and self._relation is not None and relation != self._relation:
            raise ValueError(_MIXED_RELATIONS)
        if event not in self._rdp_cache:
            if _rdp_unsupported(dp_event):
                self._rdp_cache[event] = np.full_like(self._orders, np.inf)
            else:
                acc = rdp.RdpAccountant(orders=self._orders, neighboring_relation=relation or _NEIGHBORS)
                acc.compose(dp_event)
                self._rdp_cache[event] = acc.rdp
        self._rdp_curve = self._rdp_curve + self._rdp_cache[event]
        self._events.append(event)
        self._relation = relation or self._relation

    def epsilon(self, accountant: str = "rdp") -> float:
        """ε at ``self.delta`` of everything recorded so far (0.0 before any event)."""
        _check_accountant(accountant)
        if not self._events:
            return 0.0
        if accountant == "rdp":
            return self._rdp_epsilon()
        if self._pld_cache is None or self._pld_cache[0] != len(self._events):
            eps, plan = _epsilon_of_counts(Counter(self._events), self.delta, "pld", self._rdp_epsilon)
            self._pld_cache = (len(self._events), eps, plan)
        return self._pld_cache[1]

    def _rdp_epsilon(self) -> float:
        eps, _ = rdp_privacy_accountant.compute_epsilon(self._orders, self._rdp_curve, self.delta)
        return _clean_epsilon(eps)

    def summary(self) -> dict[str, float]:
        """``{"epsilon_rdp", "epsilon_pld", "delta", "rounds", "pld_discretization"}`` — both accountants
        side by side; ``pld_discretization`` is the PLD grid's interval (1e-4 normally, coarser when the
        grid budget required it, NaN when the RDP bound stood in for the PLD or ε was trivially 0 or ∞)."""
        eps_pld = self.epsilon("pld")
        info = self.pld_info
        return {
            "epsilon_rdp": self.epsilon("rdp"),
            "epsilon_pld": eps_pld,
            "delta": self.delta,
            "rounds": float(len(self._events)),
            "pld_discretization": float(info["discretization"]) if info is not None else math.nan,
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: ``{"delta": δ, "events": [{"type": ..., fields...}, ...]}``."""
        return {"delta": self.delta, "events": [event_to_dict(e) for e in self._events]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the recorded events by those in ``state`` (from ``state_dict``); δ must match."""
        if "delta" in state and float(state["delta"]) != self.delta:
            raise ValueError(
                f"state delta={state['delta']!r} differs from this accountant's delta={self.delta!r}"
            )
        events = [event_from_dict(d) for d in state.get("events", [])]
        self._events = []
        self._rdp_curve = np.zeros_like(self._orders)
        self._pld_cache = None
        self._relation = None
        for e in events:
            self.record(e)
