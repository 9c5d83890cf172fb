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
import statistics

import numpy as np
import torch

from fedrun.comm import Message
from fedrun.compress.sketch import CountSketch, sketch_epsilon
from fedrun.schemes.base import ClientView, Env, Received, Scheme
from fedrun.schemes.fedavg import FedAvg

log = logging.getLogger("fedrun")

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
    """Shared parts of the count-sketch schemes: the sketch (hashes from the shared seed), sizes, Theorem 1."""

    compresses = True
    dp_modes = ("off", "client")  # no local DP on a sketch; client DP only in the sketch-only modes (see setup)
    broadcast = "aggregate"  # every device keeps the model and receives S̄
    weighting = "uniform"

    def __init__(self, rows: int = 20, cols: int = 40, num_heavy: int | None = None, hashes: str = "fixed",
                 weighting: str = "uniform", server_lr: float = 1.0, c_over_sigma: float | None = None,
                 alpha: float = 4.0) -> None:
        super().__init__(server_lr=server_lr)
        self.rows, self.cols = _int_knob("rows", rows, 1), _int_knob("cols", cols, 1)
        self.num_heavy = None if num_heavy is None else _int_knob("num_heavy", num_heavy, 1)
        self.hashes = _choice("hashes", hashes, ("fixed", "per_round"))
        self.weighting = _choice("weighting", weighting, ("uniform", "size"))
        if c_over_sigma is not None and not (isinstance(c_over_sigma, (int, float)) and c_over_sigma > 0):
            raise ValueError(f"scheme.c_over_sigma={c_over_sigma!r}; allowed: null or a number > 0")
        if not (isinstance(alpha, (int, float)) and alpha > 2):
            raise ValueError(f"scheme.alpha={alpha!r}; allowed: a number > 2 (Theorem 1 needs 1/2 − 1/α > 0)")
        self.c_over_sigma, self.alpha = c_over_sigma, float(alpha)

    def setup(self, env: Env) -> None:
        n, t, k = env.n, self.rows, self.cols
        if t * k > n:
            raise ValueError(f"scheme.rows×scheme.cols = {t}×{k} = {t * k} > {n} model parameters: the sketch would "
                             f"be bigger than the model; allowed: rows·cols <= {n}")
        if self.num_heavy is not None and self.num_heavy > n:
            raise ValueError(f"scheme.num_heavy={self.num_heavy} > {n} model parameters; allowed: 1 <= num_heavy "
                             f"<= {n}")
        if env.dp != "off" and self.queries:
            raise ValueError(self._dp_refusal())
        self.n, self.seed_of = n, env.shared_seed
        self.m = min(self.num_heavy if self.num_heavy is not None else k, n)  # heavy coordinates per round
        self.payload_dim, self.message = t * k, Message.of_shape(t * k, kind="sketch")
        self.compression_ratio = (t * k + (self.m if self.queries else 0)) / n  # floats up / n
        self._cs = CountSketch(n, t, k, seed=env.shared_seed(0, "count_sketch"), device=env.device)
        self._cs_round, self.device = 0, env.device
        self._theorem1(n)

    def _dp_refusal(self) -> str:
        return (f"dp=true with {type(self).__name__} in its exact-values mode: the second exchange sends exact "
                f"coordinates that client-level DP on the sketch does not cover")

    def sketch(self, rnd: int) -> CountSketch:
        """The round's count sketch: hashes from the run's shared seed (fixed, or new every round)."""
        if self.hashes == "per_round" and self._cs_round != rnd:
            self._cs = CountSketch(self.n, self.rows, self.cols, seed=self.seed_of(rnd, "count_sketch"),
                                   device=self.device)
            self._cs_round = rnd
        return self._cs

    def _theorem1(self, n: int) -> None:
        """Paper 002, Theorem 1: ε of one released sketch, only where its assumptions and condition hold."""
        c_sigma = self.c_over_sigma if self.c_over_sigma is not None else default_c_over_sigma(n)
        origin = "given" if self.c_over_sigma is not None else (
            f"default: all {n} entries within ±C w.p. >= {1 - ASSUMPTION_FAILURE:g}")
        assumption = (f"paper 002 Theorem 1 (Li et al.), Assumption 1: the {n} entries of the sketched update are "
                      f"i.i.d. N(0, σ²) and bounded, |x_i| <= C, C/σ = {c_sigma:.4g} ({origin}), α = {self.alpha:g}; "
                      f"holds with high probability, per released sketch (no composition over rounds); "
                      f"not a worst-case DP guarantee")
        self.metrics = {}
        if self.queries:
            status = ("not available: exact heavy-coordinate values are released in a second exchange; "
                      "Theorem 1 covers a release of the sketch only")
        else:
            try:
                self.metrics = {"sketch_epsilon": sketch_epsilon(self.rows, self.cols, n, sigma=1.0, bound_C=c_sigma,
                                                                 alpha=self.alpha)}
                status = "valid"
            except ValueError as exc:
                status = f"not available: {exc}"
        self.tags = {"sketch_epsilon_assumption": assumption[:4900], "sketch_epsilon_status": status[:4900],
                     "sketch.rows": str(self.rows), "sketch.cols": str(self.cols)}
        log.info("sketch_epsilon %s under %s", self.metrics.get("sketch_epsilon", status), assumption)


class FedSketch(SketchScheme):
    """FedSKETCH (paper 002, Alg. 5) with the PRIVIX or HEAPRIX unsketch; Δ_j = x⁽ʳ⁾ − x_j^τ = −update.

    Args:
        unsketch: ``privix`` (Alg. 2, unbiased) or ``heaprix`` (Alg. 4).
        rows, cols: the sketch's t hash rows and k bins per row; t·k <= n.
        num_heavy: m for HEAPRIX (default: k).
        heavy_values: HEAPRIX only — ``exact`` (a second exchange: the heavy coordinates' exact averaged values,
            4m bytes more each way) or ``sketch`` (the paper's one-exchange Alg. 4 from S̄ alone).
        hashes: ``fixed`` (one shared hash family for the run) or ``per_round`` (fresh hashes each round).
        server_lr: γ, the global learning rate (x ← x − γ·Φ).
        c_over_sigma, alpha: Theorem 1's Assumption 1 for ``sketch_epsilon`` (see ``_theorem1``).
    """

    def __init__(self, unsketch: str = "privix", heavy_values: str = "exact", **kwargs) -> None:
        super().__init__(**kwargs)
        self.unsketch = _choice("unsketch", unsketch, ("privix", "heaprix"))
        self.heavy_values = _choice("heavy_values", heavy_values, ("exact", "sketch"))
        self.queries = self.unsketch == "heaprix" and self.heavy_values == "exact"

    def _dp_refusal(self) -> str:
        return ("dp=true with scheme.unsketch=heaprix scheme.heavy_values=exact: the second exchange sends exact "
                "coordinates that client-level DP on the sketch does not cover; allowed with dp=true: "
                "unsketch=privix, or heavy_values=sketch (the paper's one-exchange HEAPRIX)")

    def encode(self, rnd: int, updates: torch.Tensor, state: ClientView) -> torch.Tensor:
        return self.sketch(rnd).sketch(-updates).reshape(len(updates), -1)  # S_j = S(Δ_j)

    def query(self, rnd: int, aggregate: torch.Tensor) -> torch.Tensor | None:
        """H = heavy_hitters(S̄, m), computed by every device from S̄ (nothing sent): exact mode only."""
        return self._heavy(rnd, aggregate)

    def _heavy(self, rnd: int, aggregate: torch.Tensor) -> torch.Tensor:
        return self.sketch(rnd).heavy_hitters(aggregate.reshape(self.rows, self.cols), self.m)

    def unsketch_(self, rnd: int, S: torch.Tensor, H: torch.Tensor | None, values: torch.Tensor | None):
        """Φ of a sketch S [t, k] or [K, t, k] (HEAPRIX on the heavy set H, with exact values Δ[H] if given)."""
        cs = self.sketch(rnd)
        if self.unsketch == "privix":
            return cs.privix(S)
        if H is None:
            return cs.heaprix(S, self.m)
        if S.dim() == 3:
            H = H.unsqueeze(0).expand(S.shape[0], -1).contiguous()
        return cs.heaprix(S, self.m, exact_heavy_values=values, indices=H)

    def decode(self, rnd: int, aggregate: torch.Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
        H = self._heavy(rnd, aggregate) if exact is not None else None
        if H is None and self.correction_state and self.unsketch == "heaprix":
            H = self._heavy(rnd, aggregate)  # GATE decodes Φ and every Φ_j on the same heavy set
        v_bar = None if exact is None else -exact
        return -self.unsketch_(rnd, aggregate.reshape(self.rows, self.cols), H, v_bar)  # x ← x − γ·Φ


class FedSketchGate(FedSketch):
    """FedSKETCHGATE (paper 002, Alg. 6): FedSKETCH + gradient tracking c_j, full participation.

    Local step x ← x − η(g − c_j); after the round ``c_j ← c_j − (1/τ)(Φ − Φ_j)`` with Φ_j the device's own
    sketch decoded like Φ (module docstring). State ``gate_c`` in the client state.
    """

    correction_state = "gate_c"

    def setup(self, env: Env) -> None:
        if not env.full_participation:
            raise ValueError(f"scheme=fedsketchgate needs full participation (every client every round), got "
                             f"{env.clients_per_round:g} of {env.num_clients} clients per round; allowed: sampler=all "
                             f"(or sampler=poisson sample_rate=1.0 with dp=true)")
        super().setup(env)
        self.tau = env.local_steps

    def feedback(self, rnd: int, state: ClientView, sent: torch.Tensor, values: torch.Tensor | None,
                 received: Received) -> None:
        """Update every participant's c_j; report ‖c̄‖ (0 for a linear decoder) and the RMS ‖c_j‖."""
        if len(sent) == 0:
            return
        H = received.indices
        if H is None and self.unsketch == "heaprix":
            H = self._heavy(rnd, received.aggregate)
        own = self.unsketch_(rnd, sent.reshape(-1, self.rows, self.cols), H, None if values is None else -values)
        c = state.get(self.correction_state, self.n)
        c -= (-received.update.unsqueeze(0) - own) / float(self.tau)
        state.set(self.correction_state, c)
        self.metrics = {**self.metrics, "gate_c_mean_norm": float(c.mean(0).norm()),
                        "gate_c_rms_norm": float(c.norm(dim=1).pow(2).mean().sqrt())}


class FedSGD(FedAvg):
    """Paper 002's uncompressed baseline: x ← x + γ·(1/K) Σ_j (x_j^τ − x), uniform weights over K participants.

    With τ = ``local_steps`` = 1 this is FedSGD as the paper defines it; with τ > 1 it is uncompressed FedSKETCH
    (same τ, η, uniform weights and γ, with the exact average of the updates in place of the unsketched Φ).
    """

    weighting = "uniform"
