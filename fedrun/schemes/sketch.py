"""FedSKETCH and FedSKETCHGATE (paper 002, Haddadpour et al., Alg. 5 and 6) and the FedSGD baseline.

Count-sketch operators (``CountSketch``, PRIVIX, HEAPRIX) live in :mod:`fedrun.compress.sketch`; this
module is the protocol around them.

FedSKETCH(R, τ, η, γ), round r (Alg. 5)::

    every participating device j: τ local SGD steps with lr η from x⁽ʳ⁾ → x_j^τ;  Δ_j = x⁽ʳ⁾ − x_j^τ
    uplink 1   device j → server   S_j = S(Δ_j)                     4·t·k bytes
    server                         S̄ = Σ_j w_j S_j  (w_j = 1/K; or client-level DP: clip + sum + noise)
    downlink 1 server → all N      S̄                                4·t·k bytes per device
    [HEAPRIX with exact heavy values only: everyone computes H = heavy_hitters(S̄, m) locally (nothing
     sent); uplink 2 device j → server Δ_j[H] (4·m bytes); server v̄ = Σ_j w_j Δ_j[H];
     downlink 2 server → all N v̄ (4·m bytes per device)]
    every device                   Φ = PRIVIX[S̄] | HEAPRIX[S̄] (| with v̄ on H);  x⁽ʳ⁺¹⁾ = x⁽ʳ⁾ − γ·Φ

The broadcast goes to all N devices, not only the K participants: in FedSKETCH every device keeps the
model itself and updates it from S̄ (the paper: "broadcasts it to all devices"), so no device ever
downloads the model. Because Φ ≈ mean Δ_j = η·(sum of local gradients), ``−γ·Φ`` is a descent step:
with an exact decoder, FedSKETCH is FedAvg with server learning rate γ.

FedSKETCHGATE (Alg. 6) adds gradient tracking for heterogeneous data, with full participation: device j
keeps c_j (zero at start), steps x ← x − η(g − c_j), and after the round updates
``c_j ← c_j − (1/τ)(Φ − Φ_j)`` where Φ_j is its *own* vector decoded the same way as Φ: Φ_j = PRIVIX[S_j],
or HEAPRIX[S_j] on the round's shared heavy set H (with its own exact values Δ_j[H] in the exact mode).
Device j knows S_j and Δ_j, so Φ_j costs no communication. With uniform weights and a decoder that is
linear in the sketch (t = 1 rows, or no collisions) Σ_j Φ_j = K·Φ, so Σ_j c_j stays 0 (the paper's
G_q = 0 "since sketching is a linear compressor"); with a median over t > 1 rows or DP noise on S̄ it
holds only approximately. Fixed point: Φ_j − Φ ≈ ητ(g_j − c_j − ḡ + c̄), so the update is
c_j ← (1 − η)c_j + η(g_j − ḡ) + η·c̄ — an average with rate η of the client's gradient drift g_j − ḡ,
which is what the correction should equal (the paper's 1/τ, not SCAFFOLD's 1/(ητ)).

FedSGD (the paper's uncompressed baseline) is FedAvg with uniform weights and a global learning rate γ: one
local step as in the paper, or τ local steps (uncompressed FedSKETCH, the baseline at the sketches' τ).
"""

from __future__ import annotations

import logging
import math
import statistics
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedrun.aggregation import WeightedSum
from fedrun.comm import Message
from fedrun.compress.sketch import CountSketch, sketch_epsilon
from fedrun.config import ConfigError
from fedrun.schemes.base import Scheme
from fedrun.schemes.fedavg import FedAvg

if TYPE_CHECKING:  # pragma: no cover
    from fedrun.simulation import Simulation

log = logging.getLogger("fedrun")

UNSKETCH = ("privix", "heaprix")
HEAVY_VALUES = ("exact", "sketch")
HASHES = ("fixed", "per_round")
WEIGHTINGS = ("uniform", "size")

#: Assumption 1 of paper 002 (from Li et al.): |x_i| <= C "with a large probability"; the default C/σ
#: makes all l i.i.d. N(0, σ²) entries lie within ±C with probability >= 1 − this (union bound).
ASSUMPTION_FAILURE = 0.05


def _int_knob(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < low:
        raise ValueError(f"scheme.{name}={value!r}; allowed: an integer >= {low}")
    return int(value)


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"scheme.{name}={value!r} is unknown; allowed: {', '.join(allowed)}")
    return str(value)


def default_c_over_sigma(length: int, failure: float = ASSUMPTION_FAILURE) -> float:
    """C/σ such that ``length`` i.i.d. N(0, σ²) entries all satisfy |x_i| <= C w.p. >= 1 − failure."""
    return statistics.NormalDist().inv_cdf(1.0 - failure / (2.0 * length))


class SketchScheme(Scheme):
    """Shared parts of the count-sketch schemes: the sketch, validation, byte sizes, Theorem 1 tags."""

    compresses = True
    dp_modes = ("off", "client")  # no local DP on a sketch; client DP only in the sketch-only modes (see setup)

    weighting = "uniform"
    #: whether exact coordinates leave the devices (a second exchange), outside Theorem 1 and DP
    sends_exact_values = False

    def __init__(self, rows: int = 20, cols: int = 40, num_heavy: int | None = None,
                 hashes: str = "fixed", weighting: str = "uniform", server_lr: float = 1.0,
                 c_over_sigma: float | None = None, alpha: float = 4.0) -> None:
        super().__init__(server_lr=server_lr)
        self.rows = _int_knob("rows", rows, 1)
        self.cols = _int_knob("cols", cols, 1)
        self.num_heavy = None if num_heavy is None else _int_knob("num_heavy", num_heavy, 1)
        self.hashes = _choice("hashes", hashes, HASHES)
        self.weighting = _choice("weighting", weighting, WEIGHTINGS)
        if c_over_sigma is not None and not (isinstance(c_over_sigma, (int, float)) and c_over_sigma > 0):
            raise ValueError(f"scheme.c_over_sigma={c_over_sigma!r}; allowed: null or a number > 0")
        if not (isinstance(alpha, (int, float)) and alpha > 2):
            raise ValueError(f"scheme.alpha={alpha!r}; allowed: a number > 2 (Theorem 1 needs 1/2 − 1/α > 0)")
        self.c_over_sigma = None if c_over_sigma is None else float(c_over_sigma)
        self.alpha = float(alpha)
        self.sketch_epsilon: float | None = None
        self._tags: dict[str, str] = {}
        self._cs: CountSketch | None = None
        self._cs_round = -1

    # -- set-up -----------------------------------------------------------------------------------
    def setup(self, sim: "Simulation") -> None:
        n = sim.n
        if self.rows * self.cols > n:
            raise ConfigError(f"scheme.rows×scheme.cols = {self.rows}×{self.cols} = {self.rows * self.cols} > "
                              f"{n} model parameters: the sketch would be bigger than the model; allowed: "
                              f"rows·cols <= {n}")
        if self.num_heavy is not None and self.num_heavy > n:
            raise ConfigError(f"scheme.num_heavy={self.num_heavy} > {n} model parameters; allowed: 1 <= num_heavy "
                              f"<= {n}")
        if sim.local_dp is not None:
            raise ConfigError(f"{type(self).__name__} does not support local DP (dp=local_*); allowed: dp=false, "
                              f"or dp=true (client-level: clip + noise on the aggregated sketch)")
        if sim.client_dp is not None and self.sends_exact_values:
            raise ConfigError(self._dp_refusal())
        self._theorem1(n)
        if self.hashes == "fixed":
            self._cs = CountSketch(n, self.rows, self.cols, seed=sim.shared_seed(0, "count_sketch"),
                                   device=sim.device)
            self._cs_round = 0

    def _dp_refusal(self) -> str:
        return (f"dp=true with {type(self).__name__} in its exact-values mode: the second exchange sends exact "
                f"coordinates that client-level DP on the sketch does not cover")

    def sketch(self, sim: "Simulation", rnd: int) -> CountSketch:
        """The round's count sketch: hashes from the run's shared seed (fixed, or new every round)."""
        if self.hashes == "fixed" and self._cs is not None:
            return self._cs
        if self._cs is None or self._cs_round != rnd:
            self._cs = CountSketch(sim.n, self.rows, self.cols, seed=sim.shared_seed(rnd, "count_sketch"),
                                   device=sim.device)
            self._cs_round = rnd
        return self._cs

    @property
    def heavy(self) -> int:
        """m: heavy coordinates per round (default: cols, see CountSketch.default_num_heavy)."""
        return self.num_heavy if self.num_heavy is not None else self.cols

    def _theorem1(self, n: int) -> None:
        """Paper 002, Theorem 1: ε of one released sketch, only where its assumptions and condition hold."""
        c_sigma = self.c_over_sigma if self.c_over_sigma is not None else default_c_over_sigma(n)
        origin = "given" if self.c_over_sigma is not None else (
            f"default: all {n} entries within ±C w.p. >= {1 - ASSUMPTION_FAILURE:g}")
        assumption = (f"paper 002 Theorem 1 (Li et al.), Assumption 1: the {n} entries of the sketched update are "
                      f"i.i.d. N(0, σ²) and bounded, |x_i| <= C, C/σ = {c_sigma:.4g} ({origin}), α = {self.alpha:g}; "
                      f"holds with high probability, per released sketch (no composition over rounds); "
                      f"not a worst-case DP guarantee")
        self.sketch_epsilon = None
        if self.sends_exact_values:
            status = ("not available: exact heavy-coordinate values are released in a second exchange; "
                      "Theorem 1 covers a release of the sketch only")
        else:
            try:
                self.sketch_epsilon = sketch_epsilon(self.rows, self.cols, n, sigma=1.0, bound_C=c_sigma,
                                                     alpha=self.alpha)
                status = "valid"
            except ValueError as exc:
                status = f"not available: {exc}"
        self._tags = {"sketch_epsilon_assumption": assumption[:4900], "sketch_epsilon_status": status[:4900],
                      "sketch.rows": str(self.rows), "sketch.cols": str(self.cols)}
        if self.sketch_epsilon is None:
            log.info("sketch_epsilon %s", status)
        else:
            log.info("sketch_epsilon = %.4g under %s", self.sketch_epsilon, assumption)

    def tags(self, sim: "Simulation") -> dict[str, str]:
        return dict(self._tags)

    def _round_metrics(self, losses: list[torch.Tensor]) -> dict[str, float]:
        out = {"train_loss": float(torch.cat(losses).mean()) if losses else math.nan}
        if self.sketch_epsilon is not None:
            out["sketch_epsilon"] = self.sketch_epsilon
        return out

    # -- sizes ------------------------------------------------------------------------------------
    def payload_dim(self, sim: "Simulation") -> int:
        return self.rows * self.cols

    def uplink_floats(self) -> int:
        """float32 values one participant uploads per round."""
        return self.rows * self.cols + (self.heavy if self.sends_exact_values else 0)

    def compression_ratio(self, sim: "Simulation") -> float:
        """r = uploaded floats / n per participant and round (paper 000's cost formula; 1/r = the ratio)."""
        return self.uplink_floats() / sim.n

    # -- helpers ----------------------------------------------------------------------------------
    def _sketch_and_aggregate(self, sim: "Simulation", rnd: int, clients: np.ndarray, weights: np.ndarray,
                              cs: CountSketch, vectors, keep: bool):
        """Uplink 1: sketch every participant's vector, aggregate (weighted sum or DP), count bytes.

        ``vectors`` yields (ids, [k, n] vectors, losses). Returns (S̄ [t, k], kept vectors [K, n] or None,
        kept sketches [K, t, k] or None, losses).
        """
        t, k = self.rows, self.cols
        agg = sim.new_aggregator(rnd, weights, t * k)
        kept_x, kept_s, losses = [], [], []
        for chunk, x, loss in vectors:
            S = cs.sketch(x)  # [k, t, k]: one batched op
            sim.ledger.uplink(Message.of_shape(t * k, kind="sketch"), len(chunk))
            agg.add(S.reshape(len(chunk), t * k))
            losses.append(loss)
            if keep:
                kept_x.append(x)
                kept_s.append(S)
        S_bar = sim.finish_aggregate(rnd, agg).reshape(t, k)
        if not keep:
            return S_bar, None, None, losses
        X = torch.cat(kept_x) if kept_x else torch.zeros(0, sim.n, device=sim.device)
        Ss = torch.cat(kept_s) if kept_s else torch.zeros(0, t, k, device=sim.device)
        return S_bar, X, Ss, losses

    def _exact_values(self, sim: "Simulation", X: torch.Tensor, H: torch.Tensor, weights: np.ndarray,
                      kind: str = "heavy_values") -> torch.Tensor:
        """Uplink 2: every participant sends X_j[H] (4m bytes); the server's weighted sum v̄ = Σ w_j X_j[H]."""
        vals = X[:, H]
        sim.ledger.uplink(Message.of_shape(H.numel(), kind=kind), X.shape[0])
        agg = WeightedSum(weights, H.numel(), sim.device)
        agg.add(vals)
        return agg.finish()


class FedSketch(SketchScheme):
    """FedSKETCH (paper 002, Alg. 5) with the PRIVIX or HEAPRIX unsketch.

    Args:
        unsketch: ``privix`` (Alg. 2, unbiased) or ``heaprix`` (Alg. 4).
        rows, cols: the sketch's t hash rows and k bins per row; t·k <= n.
        num_heavy: m for HEAPRIX (default: k).
        heavy_values: HEAPRIX only — ``exact`` (two exchanges: the heavy coordinates' exact averaged values,
            4m bytes more each way, as in ``CountSketch.heaprix``) or ``sketch`` (the paper's one-exchange
            Alg. 4 from S̄ alone; then consider ``num_heavy`` ≈ k/4 … k/2).
        hashes: ``fixed`` (one shared hash family for the run) or ``per_round`` (fresh hashes each round,
            derived from the run's shared seed and the round number, so nothing is sent).
        server_lr: γ, the global learning rate (x ← x − γ·Φ).
        c_over_sigma, alpha: Theorem 1's Assumption 1 for ``sketch_epsilon`` (see ``_theorem1``).
    """

    def __init__(self, unsketch: str = "privix", rows: int = 20, cols: int = 40, num_heavy: int | None = None,
                 heavy_values: str = "exact", hashes: str = "fixed", weighting: str = "uniform",
                 server_lr: float = 1.0, c_over_sigma: float | None = None, alpha: float = 4.0) -> None:
        super().__init__(rows=rows, cols=cols, num_heavy=num_heavy, hashes=hashes, weighting=weighting,
                         server_lr=server_lr, c_over_sigma=c_over_sigma, alpha=alpha)
        self.unsketch = _choice("unsketch", unsketch, UNSKETCH)
        self.heavy_values = _choice("heavy_values", heavy_values, HEAVY_VALUES)
        self.sends_exact_values = self.unsketch == "heaprix" and self.heavy_values == "exact"

    def _dp_refusal(self) -> str:
        return ("dp=true with scheme.unsketch=heaprix scheme.heavy_values=exact: the second exchange sends exact "
                "coordinates that client-level DP on the sketch does not cover; allowed with dp=true: "
                "unsketch=privix, or heavy_values=sketch (the paper's one-exchange HEAPRIX)")

    def round(self, sim: "Simulation", rnd: int, clients: np.ndarray) -> dict[str, float]:
        cs = self.sketch(sim, rnd)
        weights = self.weights(sim, clients)
        keep = self.sends_exact_values or self._needs_own_decode
        deltas = ((ids, sim.params - local, loss)  # Δ_j = x⁰ − x^τ
                  for ids, local, loss in sim.train(clients, rnd, self.correction(sim, clients)))
        S_bar, X, Ss, losses = self._sketch_and_aggregate(sim, rnd, clients, weights, cs, deltas, keep)
        sim.ledger.downlink(Message.of(S_bar, kind="sketch_avg"), sim.num_clients)
        m = min(self.heavy, sim.n)
        H = v_bar = None
        if self.unsketch == "privix":
            phi = cs.privix(S_bar)
        elif self.heavy_values == "exact":
            H = cs.heavy_hitters(S_bar, m)  # computed by every participant from S̄: nothing sent
            v_bar = self._exact_values(sim, X, H, weights)
            sim.ledger.downlink(Message.of(v_bar, kind="heavy_values_avg"), sim.num_clients)
            phi = cs.heaprix(S_bar, m, exact_heavy_values=v_bar, indices=H)
        elif self._needs_own_decode:
            H = cs.heavy_hitters(S_bar, m)
            phi = cs.heaprix(S_bar, m, indices=H)
        else:
            phi = cs.heaprix(S_bar, m)
        sim.params.add_(phi, alpha=-self.server_lr)  # x ← x − γ·Φ
        metrics = self._round_metrics(losses)
        if self._needs_own_decode:
            metrics.update(self._track(sim, cs, clients, phi, X, Ss, H, m))
        return metrics

    # FedSKETCHGATE hooks (no-ops here)
    _needs_own_decode = False

    def _track(self, sim, cs, clients, phi, X, Ss, H, m) -> dict[str, float]:  # pragma: no cover - overridden
        raise NotImplementedError


class FedSketchGate(FedSketch):
    """FedSKETCHGATE (paper 002, Alg. 6): FedSKETCH + gradient tracking c_j, full participation.

    Local step x ← x − η(g − c_j) (``Scheme.correction``); after the round
    ``c_j ← c_j − (1/τ)(Φ − Φ_j)`` with Φ_j the device's own vector decoded like Φ (module docstring).
    State ``gate_c`` in ``sim.client_state``.
    """

    _needs_own_decode = True
    STATE = "gate_c"

    def setup(self, sim: "Simulation") -> None:
        if sim.sampler.fraction < 1.0:
            raise ConfigError(f"scheme=fedsketchgate needs full participation (every client every round), got "
                              f"sampler={type(sim.sampler).__name__} with {sim.sampler.expected_clients:g} of "
                              f"{sim.num_clients} clients per round; allowed: sampler=all (or sampler=poisson "
                              f"sample_rate=1.0 with dp=true)")
        super().setup(sim)

    def correction(self, sim: "Simulation", clients: np.ndarray) -> torch.Tensor:
        return sim.client_state.get(self.STATE, clients, sim.n)

    def own_decode(self, cs: CountSketch, Ss: torch.Tensor, X: torch.Tensor, H: torch.Tensor | None,
                   m: int) -> torch.Tensor:
        """Φ_j for every device: its own sketch decoded like Φ (on the shared heavy set H for HEAPRIX)."""
        if self.unsketch == "privix":
            return cs.privix(Ss)
        HK = H.unsqueeze(0).expand(Ss.shape[0], -1).contiguous()
        if self.heavy_values == "exact":
            return cs.heaprix(Ss, m, exact_heavy_values=X.gather(1, HK), indices=HK)
        return cs.heaprix(Ss, m, indices=HK)

    def _track(self, sim, cs, clients, phi, X, Ss, H, m) -> dict[str, float]:
        """Update every participant's c_j; report ‖c̄‖ (0 for a linear decoder) and the RMS ‖c_j‖."""
        if len(clients) == 0:
            return {}
        phi_j = self.own_decode(cs, Ss, X, H, m)
        c = sim.client_state.get(self.STATE, clients, sim.n)
        c -= (phi.unsqueeze(0) - phi_j) / float(sim.spec.steps)
        sim.client_state.set(self.STATE, clients, c)
        return {"gate_c_mean_norm": float(c.mean(0).norm()),
                "gate_c_rms_norm": float(c.norm(dim=1).pow(2).mean().sqrt())}


class FedSGD(FedAvg):
    """Paper 002's uncompressed baseline: x ← x + γ·(1/K) Σ_j (x_j^τ − x), uniform weights over K participants.

    With one local SGD step (τ = ``local_steps`` = 1) this is FedSGD as the paper defines it. With τ > 1 it is
    **uncompressed FedSKETCH**: the same τ local SGD steps with lr η, the same uniform weights and the same
    global learning rate γ (``server_lr``) as FedSKETCH (Alg. 5), with the exact average of the updates in
    place of the unsketched Φ — the baseline that isolates what the sketch costs at the sketches' τ (paper
    002 ran FedSGD at τ = 1 only; its FedSKETCH runs used τ = 2 and 5). The whole float32 update travels up
    and the model down at each participant (FedAvg's messages).
    """

    weighting = "uniform"
