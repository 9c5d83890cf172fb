"""Local DP around any FedAvg-shaped scheme (paper 001: Fu et al., arXiv 2101.04163, Alg. 1, Thms 1–2).

``dp=local_laplace`` / ``dp=local_gaussian``: every engaged client, after its E full-batch gradient steps
with per-sample gradients clipped to ζ (``local_clip``), adds noise to the model it uploads. The server
knows the model it broadcast, so noise on the uploaded model is the same noise on the uploaded update:
:meth:`LocalDP.privatize` adds it to each client's update — the vector the sensitivity below is stated for — before
the scheme's codec encodes it, so whatever the codec does after (scale, compress, decode) is post-processing.
Only schemes that declare ``local`` in ``dp_modes`` take it.

Noise scales (``fedrun.privacy.local``, derivation in its docstring): client l, n_l samples, T_l
participations over the run, η = ``lr``, E = ``local_steps``, ζ = ``local_clip``:

* Laplace, per coordinate scale  b_l = Δ₁·T_l/ε                (ζ an L1 bound)
* Gaussian, per coordinate std   σ_l = Δ₂·√(2·T_l·ln(1.25/δ))/ε  (ζ an L2 bound)
  (``local_dp_calibration=analytic``: σ_l = √T_l·Δ₂·σ_BW(ε, δ), the exact analytic Gaussian.)

with Δ from ``local_dp_sensitivity`` (derivations in ``fedrun.privacy.local``, module doc 2):

* ``proven`` (default): Δ = 2ζη/n_l + 2ζη(E−1) — no assumption on the model, the loss or the norm.
* ``paper``: the paper's Δ = 2ζηE/n_l, accepted only where its condition is checked on the run's data: E
  non-expansive gradient steps, an L2 argument. fedrun checks it for the linear model with MSE (model=lr,
  Lending Club): η ≤ 2/β_l for every client that uploads, β_l = 2·λ_max(X̃_lᵀX̃_l)/n_l computed from the
  client's rows. It is refused (one-line ValueError (a config error at the edge)) for the Laplace mechanism — L2 non-expansiveness does
  not bound the L1 sensitivity Laplace needs — for any other model (β unknown, e.g. the FEMNIST CNN), and
  where η > 2/β_l for some client (the error names the worst one).
* ``paper_unchecked``: the paper's Δ without the check, on explicit request: the run logs a warning and is
  marked conditional (summary ``ldp_sensitivity_conditional = 1``, tag ``dp.local_sensitivity_conditional``
  from :meth:`LocalDP.tags`, with the reason — including the check's result where it can be computed).

With E = 1 or ``local_clip_mode=batch`` the two values coincide and are proven whatever is chosen. For the
linear model the summary also has the run's min 2/β_l (``ldp_two_over_beta_min``, ``…_client``).

T_l must be known when the run starts, so only samplers with a deterministic participation count are
allowed: ``round_robin`` (exact counts from :meth:`RoundRobinSampler.participations`) and ``all``
(T_l = rounds). Others raise a ValueError (reported as a one-line config error by ``fedrun.run.build``).

Accounting is done from what was actually added, one event per client and participation: Laplace
releases with pure ε_i = Δ₁/b_l composed by basic composition (Σ ε_i), Gaussian releases with noise
multiplier σ_l/Δ₂ composed with RDP (per round, logged as ``epsilon``) and PLD (in the summary). The
logged ε is the worst client's. So a reader sees the target ε (what the paper's formula was asked for)
beside the ε actually composed (e.g. the classic Gaussian formula overshoots its target for ε ≥ 1).

Deliberate choices on clip settings (each bad combination is a one-line ValueError, reported as a config error):

* no ``local_clip`` → error (the sensitivity needs ζ); ``local_mode`` must be ``gd`` (E full-batch steps);
* Laplace needs ``local_clip_ord=1`` (its sensitivity is an L1 bound; an L2 clip ζ₂ would bound it only by
  √p·ζ₂ — set ``local_clip_ord=1`` instead). Gaussian accepts ord 2 (its own norm) or 1 (‖v‖₂ ≤ ‖v‖₁);
* ``local_clip_mode=batch`` is allowed but uses its own, correct sensitivity 2ζηE — no 1/n_l, i.e. n_l times
  the noise of per-sample clipping (a warning is logged); the paper's scales need ``per_sample``;
* ``local_dp_sensitivity``: ``proven`` (default), ``paper`` (checked) or ``paper_unchecked`` (conditional), above.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedrun.privacy.accounting import gaussian_composition_epsilon, laplace_basic_composition
from fedrun.privacy.local import (
    NonexpansiveCheck,
    aggregated_noise_variance,
    gaussian_std,
    laplace_scale,
    nonexpansive_check,
    sensitivity,
)
from fedrun.privacy.mechanisms import gaussian_noise, laplace_noise
from fedrun.training import LocalSpec

log = logging.getLogger("fedrun")

__all__ = ["LocalDP", "make_local_dp", "MECHANISMS", "CALIBRATIONS", "SENSITIVITIES", "SensitivityChoice"]

MECHANISMS = ("laplace", "gaussian")
CALIBRATIONS = ("classic", "analytic")
SENSITIVITIES = ("proven", "paper", "paper_unchecked")
SENSITIVITY_ALTERNATIVES = "local_dp_sensitivity=proven (the default) or paper_unchecked (ε then conditional)"
ALLOWED_SAMPLERS = "round_robin (exact T_l) or all (T_l = rounds)"


@dataclass(frozen=True)
class SensitivityChoice:
    """Which Δ a run uses and on what it rests (``local_dp_sensitivity``; module doc).

    ``nonexpansive``: the paper's 2ζηE/n_l is used (else the proven 2ζη/n_l + 2ζη(E−1)); ``conditional``: the
    run's ε holds only under an assumption that was not verified (``reason`` says which, and what is known);
    ``check``: η against 2/β_l per client, where it could be computed (linear model).
    """

    name: str
    nonexpansive: bool
    conditional: bool
    reason: str
    check: NonexpansiveCheck | None = None


class LocalDP:
    """Per-client local-DP noise (paper 001) and the accounting of what was added.

    ``participations[l]`` = T_l (the number of rounds client l will take part in), ``sizes[l]`` = n_l.
    Clients with T_l = 0 (never selected) or n_l = 0 (no data) get no noise and no events.
    ``sensitivity_choice`` (set by :func:`make_local_dp`) records which Δ is used and whether the run's ε is
    conditional; without it, ``nonexpansive=True`` with E > 1 and per-sample clipping counts as unchecked.
    """

    def __init__(self, mechanism: str, epsilon: float, clip_norm: float, lr: float, local_iters: int,
                 participations: np.ndarray, sizes: np.ndarray, *, delta: float | None = None,
                 clip_mode: str = "per_sample", nonexpansive: bool = True, calibration: str = "classic",
                 accountant: str = "rdp", sensitivity_choice: SensitivityChoice | None = None) -> None:
        if mechanism not in MECHANISMS:
            raise ValueError(f"mechanism={mechanism!r} is not one of {MECHANISMS}")
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration={calibration!r} is not one of {CALIBRATIONS}")
        if mechanism == "gaussian" and not (delta is not None and 0 < delta < 1):
            raise ValueError(f"delta={delta!r} is outside (0, 1) (needed by the Gaussian mechanism)")
        if not (epsilon > 0 and not math.isnan(epsilon)):
            raise ValueError(f"epsilon={epsilon!r} is outside (0, inf]")
        participations = np.asarray(participations, dtype=np.int64)
        sizes = np.asarray(sizes, dtype=np.int64)
        if participations.shape != sizes.shape:
            raise ValueError(f"participations has {participations.size} entries, sizes {sizes.size}; they must match")
        self.mechanism = mechanism
        self.epsilon_target = float(epsilon)
        self.delta = float(delta) if delta is not None else None
        self.clip_norm, self.lr, self.local_iters = float(clip_norm), float(lr), int(local_iters)
        self.clip_mode, self.nonexpansive, self.calibration = clip_mode, bool(nonexpansive), calibration
        self.accountant = accountant
        self.participations, self.sizes = participations, sizes
        same = clip_mode == "batch" or self.local_iters == 1  # paper's Δ = proven Δ
        if sensitivity_choice is None:
            if self.nonexpansive and not same:
                sensitivity_choice = SensitivityChoice("paper_unchecked", True, True,
                                                       "non-expansive local steps assumed, not checked")
            else:
                sensitivity_choice = SensitivityChoice("paper" if self.nonexpansive else "proven", self.nonexpansive,
                                                       False, "proven")
        if sensitivity_choice.nonexpansive != self.nonexpansive:
            raise ValueError(f"sensitivity_choice.nonexpansive={sensitivity_choice.nonexpansive} disagrees with "
                             f"nonexpansive={self.nonexpansive}")
        self.sensitivity_choice = sensitivity_choice
        n = len(sizes)
        self.sens = np.zeros(n)
        self.scales = np.zeros(n)  # Laplace scale b_l or Gaussian std σ_l, per coordinate
        for l in range(n):
            if participations[l] < 1 or sizes[l] < 1:
                continue
            self.sens[l] = sensitivity(self.clip_norm, self.lr, self.local_iters, int(sizes[l]), clip_mode,
                                       nonexpansive=self.nonexpansive)
            if mechanism == "laplace":
                self.scales[l] = laplace_scale(self.clip_norm, self.lr, self.local_iters, int(participations[l]),
                                               int(sizes[l]), self.epsilon_target, clip_mode,
                                               nonexpansive=self.nonexpansive)
            else:
                self.scales[l] = gaussian_std(self.clip_norm, self.lr, self.local_iters, int(participations[l]),
                                              int(sizes[l]), self.epsilon_target, self.delta, clip_mode,
                                              nonexpansive=self.nonexpansive, calibration=calibration)
        self.counts = np.zeros(n, dtype=np.int64)  # participations noised so far
        self._eps_cache: dict[tuple[str, float, int], float] = {}
        self._item: torch.Tensor | None = None
        self._round_weights: dict[int, float] = {}
        self._round_formula = 0.0
        self._round_std = 0.0
        self.diagnostics: dict[str, float] = {}
        #: the scheme's name (set by make_local_dp; for messages)
        self.scheme_name: str | None = None

    # -- noise -------------------------------------------------------------------------------------
    @property
    def noiseless(self) -> bool:
        return math.isinf(self.epsilon_target)

    def start_round(self, clients: np.ndarray, weights: np.ndarray) -> None:
        """The round's selected clients and the scheme's weights a_l (for the noise item's diagnostics)."""
        self._round_weights = {int(c): float(w) for c, w in zip(clients, weights)}
        self._item = None
        self._round_formula = aggregated_noise_variance([float(self.scales[c]) for c in clients], list(weights),
                                                        self.mechanism)
        factor = math.sqrt(2) if self.mechanism == "laplace" else 1.0  # Laplace std = √2·b
        self._round_std = float(np.mean(self.scales[clients])) * factor if len(clients) else 0.0

    def privatize(self, rnd: int, clients: np.ndarray, payload: torch.Tensor, generator) -> torch.Tensor:
        """Add client l's noise (Laplace scale b_l or Gaussian std σ_l per coordinate) to its row of ``payload``.

        Each client draws from its own stream ``generator(l)``, so chunking and order do not change the noise.
        ε = ∞ returns ``payload`` itself (the non-private computation, bit for bit).
        """
        clients = np.asarray(clients, dtype=np.int64)
        if payload.shape[0] != len(clients):
            raise ValueError(f"payload has {payload.shape[0]} rows for {len(clients)} clients")
        for l in clients:
            if self.participations[l] < 1 and self.sizes[l] > 0:
                raise RuntimeError(f"client {l} takes part in round {rnd} but was planned for T_l = 0 participations")
            if self.counts[l] >= self.participations[l] and self.sizes[l] > 0 and not self.noiseless:
                log.warning("client %d takes part more often than the T_l=%d its noise was calibrated for; "
                            "its composed ε now exceeds the target", l, self.participations[l])
        self.counts[clients] += (self.sizes[clients] > 0)
        if self.noiseless:
            return payload
        draw = laplace_noise if self.mechanism == "laplace" else gaussian_noise
        noise = torch.stack([draw((payload.shape[1],), float(self.scales[l]), generator(int(l)), device=payload.device,
                                  dtype=payload.dtype) for l in clients])
        self._diagnose(clients, noise)
        return payload + noise

    def _diagnose(self, clients: np.ndarray, noise: torch.Tensor) -> None:
        """Per-round measured vs formula variance of the noise item Σ_l a_l·w_l (a_l = the scheme's weights)."""
        if self._item is None:
            self._item = torch.zeros(noise.shape[1], dtype=torch.float64, device=noise.device)
        a = torch.tensor([self._round_weights.get(int(l), 0.0) for l in clients], dtype=torch.float64,
                         device=noise.device)
        self._item += a @ noise.double()
        self.diagnostics = {
            "ldp_noise_item_var": float(self._item.pow(2).mean()),
            "ldp_noise_item_var_formula": self._round_formula,
            "ldp_noise_std_mean": self._round_std,
        }

    # -- accounting --------------------------------------------------------------------------------
    def _client_epsilon(self, l: int, accountant: str | None = None) -> float:
        """Client l's ε composed from its noised participations so far (0 before any)."""
        k = int(self.counts[l])
        if k == 0:
            return 0.0
        if self.noiseless:
            return math.inf
        per = self.sens[l] / self.scales[l]  # Laplace: pure ε of one release; Gaussian: 1 / noise multiplier
        if self.mechanism == "laplace":
            return laplace_basic_composition([per] * k)
        acc = accountant or self.accountant
        key = (acc, float(self.scales[l] / self.sens[l]), k)
        if key not in self._eps_cache:
            self._eps_cache[key] = gaussian_composition_epsilon([key[1]] * k, self.delta, acc)
        return self._eps_cache[key]

    def _ranked_clients(self) -> np.ndarray:
        """Clients that took part, ordered by their composed ε (ascending).

        A client's releases all have the same noise, so its ε is an increasing function of k·Δ/b
        (Laplace: exactly k·ε_i) or k·Δ²/σ² (Gaussian: k releases of noise multiplier s compose to one
        with s/√k — RDP and PLD alike); ranking by that score avoids an accountant call per client.
        """
        active = np.flatnonzero(self.counts > 0)
        if len(active) == 0 or self.noiseless:
            return active
        power = 1 if self.mechanism == "laplace" else 2
        score = self.counts[active] * (self.sens[active] / self.scales[active]) ** power
        return active[np.argsort(score, kind="stable")]

    def epsilon(self) -> float:
        """The worst client's ε composed so far from the noise actually added (basic composition / RDP)."""
        ranked = self._ranked_clients()
        return 0.0 if len(ranked) == 0 else self._client_epsilon(int(ranked[-1]))

    def summary(self) -> dict[str, float]:
        """Mechanism parameters, target ε, the per-client ε composed (max / median over clients that took
        part; Gaussian: RDP and PLD), the noise scales used and the paper formula's scale."""
        active = np.flatnonzero(self.counts > 0)
        planned = np.flatnonzero((self.participations > 0) & (self.sizes > 0))
        s: dict[str, float] = {
            "ldp_epsilon_target": self.epsilon_target,
            "ldp_clip_norm": self.clip_norm, "ldp_lr": self.lr, "ldp_local_iters": float(self.local_iters),
            "ldp_participations_max": float(self.participations.max()) if len(self.participations) else 0.0,
            "ldp_participations_min": float(self.participations[planned].min()) if len(planned) else 0.0,
            "ldp_clients_noised": float(len(active)),
        }
        if self.delta is not None and self.mechanism == "gaussian":
            s["ldp_delta"] = self.delta
        choice = self.sensitivity_choice
        s["ldp_sensitivity_nonexpansive"] = float(choice.nonexpansive)  # 1: the paper's 2ζηE/n_l was used
        s["ldp_sensitivity_conditional"] = float(choice.conditional)    # 1: ε rests on an unchecked assumption
        if choice.check is not None:
            s["ldp_two_over_beta_min"] = choice.check.min_two_over_beta
            s["ldp_two_over_beta_min_client"] = float(choice.check.worst_client)
        if len(planned):
            s["ldp_sensitivity_median"] = float(np.median(self.sens[planned]))
            s["ldp_scale_median"] = float(np.median(self.scales[planned]))
            s["ldp_scale_max"] = float(self.scales[planned].max())
            s["ldp_scale_min"] = float(self.scales[planned].min())
            s["ldp_scale_formula_median"] = float(np.median([self._paper_scale(l) for l in planned]))
        accountants = ("basic",) if self.mechanism == "laplace" else ("rdp", "pld")
        ranked = self._ranked_clients()
        for acc in accountants:
            name = "ldp_epsilon" if acc == "basic" else f"ldp_epsilon_{acc}"
            if len(ranked) == 0:
                s[f"{name}_max"] = s[f"{name}_median"] = 0.0
                continue
            eps_of = lambda i: self._client_epsilon(int(ranked[i]), None if acc == "basic" else acc)  # noqa: E731
            m = len(ranked)
            s[f"{name}_max"] = eps_of(m - 1)
            s[f"{name}_median"] = eps_of(m // 2) if m % 2 else 0.5 * (eps_of(m // 2 - 1) + eps_of(m // 2))
        return s

    def tags(self) -> dict[str, str]:
        """Run tags: the sensitivity used, whether the run's ε is conditional and why, the min 2/β_l."""
        choice = self.sensitivity_choice
        t = {"dp.local_sensitivity": choice.name,
             "dp.local_sensitivity_formula": "2ζηE/n_l" if choice.nonexpansive else "2ζη/n_l + 2ζη(E−1)",
             "dp.local_sensitivity_conditional": "true" if choice.conditional else "false",
             "dp.local_sensitivity_reason": choice.reason}
        if choice.check is not None:
            t["dp.local_two_over_beta_min"] = f"{choice.check.min_two_over_beta:.6g}"
            t["dp.local_two_over_beta_min_client"] = str(choice.check.worst_client)
        return t

    def _paper_scale(self, l: int) -> float:
        """Paper 001's formula (per-sample, non-expansive sensitivity, classic Gaussian) for client l."""
        t, n = int(self.participations[l]), int(self.sizes[l])
        if self.mechanism == "laplace":
            return laplace_scale(self.clip_norm, self.lr, self.local_iters, t, n, self.epsilon_target,
                                 nonexpansive=True)
        return gaussian_std(self.clip_norm, self.lr, self.local_iters, t, n, self.epsilon_target, self.delta,
                            nonexpansive=True)

    # -- checkpoints -------------------------------------------------------------------------------
    def _fingerprint(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "epsilon": self.epsilon_target, "delta": self.delta,
                "participations": self.participations.tolist(), "sizes": self.sizes.tolist()}

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: the settings the scales came from and each client's noised participations."""
        return {**self._fingerprint(), "counts": self.counts.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self._fingerprint()
        for key, value in mine.items():
            if state.get(key) != value:
                raise ValueError(f"local-DP state has {key}={state.get(key)!r}, this run has {value!r}")
        counts = np.asarray(state["counts"], dtype=np.int64)
        if counts.shape != self.counts.shape:
            raise ValueError(f"local-DP state has {counts.size} clients, this run has {self.counts.size}")
        self.counts = counts.copy()
        self._round = None


# ---------------------------------------------------------------------------------------------- build
def _participations(sampler, rounds: int, seed: int, mode: str) -> np.ndarray:
    counts = sampler.participations(rounds, seed)
    if counts is None:
        raise ValueError(f"dp={mode} needs each client's participation count T_l in advance; sampler={sampler.name} "
                         f"does not fix it; allowed: {ALLOWED_SAMPLERS}")
    return counts


def _choose_sensitivity(model: str, mode: str, mechanism: str, requested: str, spec: LocalSpec,
                        parts: list[np.ndarray], participations: np.ndarray, x_train) -> SensitivityChoice:
    """Which Δ the run uses (module doc); one-line ValueError (a config error at the edge) where ``paper`` is asked for and not verified."""
    linear = model == "lr" and spec.loss == "mse"
    check = None
    if linear:  # 2/β_l of every client that uploads (n_l ≥ 1, T_l ≥ 1): logged whatever was requested
        x = np.asarray(x_train, dtype=np.float64)
        uploading = [l for l, p in enumerate(parts) if len(p) > 0 and participations[l] > 0]
        if uploading:
            check = nonexpansive_check(x, parts, float(spec.lr), uploading)
            log.info("dp=%s: local steps %s the paper's condition η ≤ 2/β_l (%s)", mode,
                     "meet" if check.passed else "do not meet", check.describe())
    if requested == "proven":
        return SensitivityChoice("proven", False, False, "proven: no assumption on the model, the loss or the norm",
                                 check)
    if spec.clip_mode == "batch" or int(spec.steps) == 1:
        why = "local_clip_mode=batch" if spec.clip_mode == "batch" else "E = 1"
        return SensitivityChoice(requested, True, False, f"proven: with {why} the paper's Δ equals the proven one",
                                 check)
    where = (f"on this data {check.describe()}" if check is not None else
             f"the condition cannot be checked for model={model} (fedrun checks it for model=lr with MSE only)")
    if requested == "paper_unchecked":
        reason = "non-expansive local steps (η ≤ 2/β_l, an L2 argument) assumed, not checked"
        if mechanism == "laplace":
            reason += "; the Laplace mechanism needs an L1 sensitivity, which L2 non-expansiveness does not bound"
        reason += f"; {where}"
        log.warning("dp=%s with local_dp_sensitivity=paper_unchecked: Δ = 2ζηE/n_l, so the run's ε is conditional "
                    "(%s)", mode, reason)
        return SensitivityChoice("paper_unchecked", True, True, reason, check)
    # requested == "paper": accepted only where verified
    if mechanism == "laplace":
        also = f" (its L2 condition on this data: {check.describe()})" if check is not None else ""
        raise ValueError(f"dp={mode}: local_dp_sensitivity=paper (Δ = 2ζηE/n_l) rests on non-expansive gradient "
                          f"steps, an L2 argument that does not bound the L1 sensitivity the Laplace mechanism "
                          f"needs{also}; use {SENSITIVITY_ALTERNATIVES}")
    if check is None:
        raise ValueError(f"dp={mode}: local_dp_sensitivity=paper needs its condition η ≤ 2/β_l checked on the run's "
                          f"data, which fedrun can do only for model=lr (linear regression, MSE), not "
                          f"model={model}; use {SENSITIVITY_ALTERNATIVES}")
    if not check.passed:
        l = check.worst_client
        raise ValueError(f"dp={mode}: local_dp_sensitivity=paper needs η ≤ 2/β_l for every client (non-expansive "
                          f"steps); client {l} (n_l={int(check.sizes[l])}) has 2/β_l={check.min_two_over_beta:.4g} "
                          f"< lr={check.lr:g}; use lr ≤ {check.min_two_over_beta:.4g}, or {SENSITIVITY_ALTERNATIVES}")
    return SensitivityChoice("paper", True, False, f"checked on this run's data (L2, Gaussian): {check.describe()}",
                             check)


def make_local_dp(cfg, sampler, parts: list[np.ndarray], spec: LocalSpec, x_train) -> LocalDP:
    """The local-DP object for ``dp=local_laplace|local_gaussian`` from the resolved config (one-line errors).

    ``x_train``: the training rows ``parts`` index (only read for the linear model's 2/β_l check).
    """
    mode = cfg.dp
    mechanism = mode.removeprefix("local_")
    if mechanism not in MECHANISMS:
        raise ValueError(f"dp={mode} is not a local-DP mode; use local_laplace or local_gaussian")
    if spec.clip_norm is None:
        raise ValueError(f"dp={mode} needs local_clip=ζ (the per-iteration gradient clip that bounds the "
                          f"sensitivity; paper 001 uses 150 for Lending Club, 3 for FEMNIST)")
    if spec.mode != "gd":
        raise ValueError(f"dp={mode} needs local_mode=gd (E = local_steps full-batch gradient steps, paper 001's "
                          f"Alg. 1); got local_mode={spec.mode}")
    if mechanism == "laplace" and spec.clip_ord != 1:
        raise ValueError(f"dp=local_laplace needs local_clip_ord=1: the Laplace mechanism's sensitivity is an L1 "
                          f"bound (got local_clip_ord={spec.clip_ord}; an L2 clip ζ bounds the L1 norm only by √p·ζ)")
    if spec.clip_mode == "batch":
        log.warning("dp=%s with local_clip_mode=batch: the sensitivity is 2ζηE (no 1/n_l), n_l times the noise of "
                    "local_clip_mode=per_sample, which paper 001's scales assume", mode)
    eps = cfg.epsilon
    if eps is None:
        raise ValueError(f"dp={mode} needs epsilon=ε, the per-client budget over the whole run (.inf = no noise)")
    if cfg.noise_multiplier is not None:
        raise ValueError(f"noise_multiplier={cfg.noise_multiplier} is for dp=true; dp={mode} derives its noise "
                          f"from epsilon (give noise_multiplier=null)")
    calibration = cfg.local_dp_calibration
    if calibration not in CALIBRATIONS:
        raise ValueError(f"local_dp_calibration={calibration!r} is not allowed; use {' or '.join(CALIBRATIONS)}")
    sens = cfg.local_dp_sensitivity
    if sens not in SENSITIVITIES:
        raise ValueError(f"local_dp_sensitivity={sens!r} is not allowed; use {', '.join(SENSITIVITIES)}")
    participations = _participations(sampler, cfg.rounds, cfg.seed, mode)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    choice = _choose_sensitivity(cfg.model, mode, mechanism, sens, spec, parts, participations, x_train)
    log.info("dp=%s: local_dp_sensitivity=%s, Δ = %s (%s)", mode, choice.name,
             "2ζηE/n_l" if choice.nonexpansive else "2ζη/n_l + 2ζη(E−1)", choice.reason)
    try:
        dp = LocalDP(mechanism, float(eps), float(spec.clip_norm), float(spec.lr), int(spec.steps),
                     participations, sizes, delta=cfg.delta, clip_mode=spec.clip_mode,
                     nonexpansive=choice.nonexpansive, calibration=calibration,
                     accountant=cfg.accountant, sensitivity_choice=choice)
    except ValueError as exc:
        raise ValueError(f"dp={mode}: {exc}") from None
    dp.scheme_name = cfg.scheme_name
    return dp
