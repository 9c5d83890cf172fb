"""FedSKETCH, FedSKETCHGATE (paper 002, Haddadpour et al., Alg. 5, 6), FedSGD; sketch: :mod:`fedrun.compress.sketch`.

FedSKETCH(R, τ, η, γ), round r (Alg. 5)::

    every participating device j: τ local SGD steps with lr η from x⁽ʳ⁾ → x_j^τ;  Δ_j = x⁽ʳ⁾ − x_j^τ
    uplink 1   device j → server   S_j = S(Δ_j)                     4·t·k bytes
    server                         S̄ = Σ_j w_j S_j  (w_j = 1/K; or client-level DP: clip + sum + noise)
    downlink 1 server → all N      S̄                                4·t·k bytes per device
    [HEAPRIX, exact heavy values only: everyone computes H = heavy_hitters(S̄, m) locally (nothing sent); uplink 2
     device j → server Δ_j[H] (4·m bytes); server v̄ = Σ_j w_j Δ_j[H]; downlink 2 server → all N v̄ (4·m bytes each)]
    every device                   Φ = PRIVIX[S̄] | HEAPRIX[S̄] (| with v̄ on H);  x⁽ʳ⁺¹⁾ = x⁽ʳ⁾ − γ·Φ

Every device keeps the model and updates it from S̄ (the paper "broadcasts it to all devices"). Φ ≈ mean Δ_j =
η·(sum of local gradients), so with an exact decoder FedSKETCH is FedAvg with server learning rate γ.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import torch

from fedrun.comm import Message
from fedrun.compress.sketch import CountSketch, theorem1, unsketch_flops
from fedrun.schemes.base import ClientView, Env, Received, Scheme, check
from fedrun.schemes.fedavg import FedAvg

log = logging.getLogger("fedrun")


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"scheme.{name}={value!r} is unknown; allowed: {', '.join(allowed)}")
    return str(value)


#: a run's count sketches and Theorem 1's figure, built once (each client's codec is set up afresh)
_count_sketch = functools.lru_cache(maxsize=4)(CountSketch)


@functools.lru_cache(maxsize=16)
def _theorem1(t: int, k: int, n: int, c_over_sigma, alpha: float, exact_values: bool):
    epsilon, tags = theorem1(t, k, n, c_over_sigma, alpha, exact_values=exact_values)
    log.info("sketch_epsilon %s under %s", tags["sketch_epsilon_status"] if epsilon is None else epsilon,
             tags["sketch_epsilon_assumption"])
    return epsilon, tags


class SketchScheme(Scheme):
    """The count-sketch schemes' shared parts: the sketch, sizes, Theorem 1; options: conf/scheme/fedsketch.yaml."""

    compresses = True
    dp_modes = ("off", "client")  # no local DP on a sketch; client DP only in the sketch-only modes (see setup)
    broadcast = "aggregate"  # every device keeps the model and receives S̄
    weighting = "uniform"

    def __init__(self, rows: int = 20, cols: int = 40, num_heavy: int | None = None, hashes: str = "fixed",
                 weighting: str = "uniform", server_lr: float = 1.0, c_over_sigma: float | None = None,
                 alpha: float = 4.0) -> None:
        super().__init__(server_lr=server_lr)
        count = dict(allowed="an integer >= 1", ok=lambda v: v >= 1, kind=(int, np.integer))
        self.rows, self.cols = int(check("rows", rows, **count)), int(check("cols", cols, **count))
        self.num_heavy = None if num_heavy is None else int(check("num_heavy", num_heavy, **count))
        self.hashes = _choice("hashes", hashes, ("fixed", "per_round"))
        self.weighting = _choice("weighting", weighting, ("uniform", "size"))
        self.c_over_sigma = check("c_over_sigma", c_over_sigma, "null or a number > 0", lambda v: v > 0,
                                  (int, float, bool), null=True)  # a bool passes, as it always did
        self.alpha = float(check("alpha", alpha, "a number > 2 (Theorem 1 needs 1/2 − 1/α > 0)", lambda v: v > 2))

    def setup(self, env: Env) -> None:
        if self.correction_state and not env.full_participation:  # FedSKETCHGATE
            raise ValueError(f"scheme=fedsketchgate needs full participation (every client every round), got "
                             f"{env.clients_per_round:g} of {env.num_clients} clients per round; allowed: sampler=all "
                             f"(or sampler=poisson sample_rate=1.0 with dp=true)")
        n, t, k = env.n, self.rows, self.cols
        if t * k > n:
            raise ValueError(f"scheme.rows×scheme.cols = {t}×{k} = {t * k} > {n} model parameters: the sketch would "
                             f"be bigger than the model; allowed: rows·cols <= {n}")
        if self.num_heavy is not None and self.num_heavy > n:
            raise ValueError(f"scheme.num_heavy={self.num_heavy} > {n} model parameters; allowed: 1 <= num_heavy "
                             f"<= {n}")
        if env.dp != "off" and self.queries:
            raise ValueError(self.dp_refusal)
        self.n, self.seed_of, self.device, self._cs, self.tau = n, env.shared_seed, env.device, {}, env.local_steps
        self.sketch(0)
        self.m = min(self.num_heavy if self.num_heavy is not None else k, n)  # heavy coordinates per round
        self.payload_dim, self.message = t * k, Message.of_shape(t * k, kind="sketch")
        self.compression_ratio = (t * k + (self.m if self.queries else 0)) / n  # floats up / n
        epsilon, tags = _theorem1(t, k, n, self.c_over_sigma, self.alpha, self.queries)
        self.tags, self.metrics = dict(tags), {} if epsilon is None else {"sketch_epsilon": epsilon}

    def sketch(self, rnd: int) -> CountSketch:
        """The round's count sketch: hashes from the run's shared seed (fixed: round 0's, or new every round)."""
        rnd = rnd if self.hashes == "per_round" else 0
        if rnd not in self._cs:
            self._cs = {rnd: _count_sketch(self.n, self.rows, self.cols, self.seed_of(rnd, "count_sketch"), self.device)}
        return self._cs[rnd]

    def query(self, rnd: int, aggregate: torch.Tensor) -> torch.Tensor:
        """H = heavy_hitters(S̄, m), computed by every device from S̄ (nothing sent for H)."""
        return self.sketch(rnd).heavy_hitters(aggregate.reshape(self.rows, self.cols), self.m)


class FedSketch(SketchScheme):
    """FedSKETCH (Alg. 5), ``unsketch`` privix (Alg. 2) | heaprix (Alg. 4; ``heavy_values``: exact | sketch)."""

    dp_refusal = ("dp=true with scheme.unsketch=heaprix scheme.heavy_values=exact: the second exchange sends exact "
                  "coordinates that client-level DP on the sketch does not cover; allowed with dp=true: "
                  "unsketch=privix, or heavy_values=sketch (the paper's one-exchange HEAPRIX)")

    def __init__(self, unsketch: str = "privix", heavy_values: str = "exact", **kwargs) -> None:
        super().__init__(**kwargs)
        self.unsketch = _choice("unsketch", unsketch, ("privix", "heaprix"))
        self.heavy_values = _choice("heavy_values", heavy_values, ("exact", "sketch"))
        self.queries = self.unsketch == "heaprix" and self.heavy_values == "exact"

    def encode(self, rnd: int, updates: torch.Tensor, state: ClientView) -> torch.Tensor:
        return self.sketch(rnd).sketch(-updates).reshape(len(updates), -1)  # S_j = S(Δ_j)

    def server_flops(self, n: int) -> float:
        """The step (:meth:`Scheme.server_flops`) + the unsketch (with exact values, the query's H too):
        :func:`fedrun.compress.sketch.unsketch_flops`. FedSKETCHGATE's server does the same (its feedback is the
        devices' work)."""
        work = unsketch_flops(self.n, self.rows, self.cols, self.unsketch, self.m, self.queries)
        return super().server_flops(n) + float(work)

    def decode(self, rnd: int, aggregate: torch.Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
        shared_heavy = exact is not None or (self.correction_state and self.unsketch == "heaprix")  # GATE: Φ, Φ_j
        H = self.query(rnd, aggregate) if shared_heavy else None
        return -self.sketch(rnd).unsketch(aggregate.reshape(self.rows, self.cols), self.unsketch, self.m, H,
                                          None if exact is None else -exact)  # x ← x − γ·Φ


class FedSketchGate(FedSketch):
    """FedSKETCHGATE (paper 002, Alg. 6): FedSKETCH + gradient tracking for heterogeneous data, full participation.

    Device j keeps c_j (client state ``gate_c``, zero at start), steps x ← x − η(g − c_j) and after the round sets
    c_j ← c_j − (1/τ)(Φ − Φ_j), Φ_j its own S_j decoded as Φ is (same H, its own Δ_j[H]; nothing more sent). Uniform
    weights and a decoder linear in the sketch (t = 1, or no collisions) give Σ_j Φ_j = K·Φ, so Σ_j c_j stays 0 (the
    paper's G_q = 0 "since sketching is a linear compressor"); only approximately with a median over t > 1 rows or DP
    noise on S̄. Fixed point: Φ_j − Φ ≈ ητ(g_j − c_j − ḡ + c̄), so c_j ← (1 − η)c_j + η(g_j − ḡ) + η·c̄, an average with
    rate η of the drift g_j − ḡ, which the correction should equal (the paper's 1/τ, not SCAFFOLD's 1/(ητ))."""

    correction_state = "gate_c"

    def feedback(self, rnd: int, state: ClientView, sent: torch.Tensor, values: torch.Tensor | None,
                 received: Received) -> None:
        """Update every participant's c_j; report ‖c̄‖ (0 for a linear decoder) and the RMS ‖c_j‖."""
        if len(sent) == 0:
            return
        H = received.indices  # exact mode: the query's; else every device computes it (HEAPRIX)
        H = self.query(rnd, received.aggregate) if H is None and self.unsketch == "heaprix" else H
        own = self.sketch(rnd).unsketch(sent.reshape(-1, self.rows, self.cols), self.unsketch, self.m, H,
                                        None if values is None else -values)  # Φ_j
        c = state.get(self.correction_state, self.n)
        c -= (-received.update.unsqueeze(0) - own) / float(self.tau)  # τ = local_steps
        state.set(self.correction_state, c)
        self.metrics = {**self.metrics, "gate_c_mean_norm": float(c.mean(0).norm()),
                        "gate_c_rms_norm": float(c.norm(dim=1).pow(2).mean().sqrt())}


class FedSGD(FedAvg):
    """Paper 002's uncompressed baseline: x ← x + γ·(1/K) Σ_j (x_j^τ − x), uniform weights over K participants; with
    τ = ``local_steps`` = 1 the paper's FedSGD, with τ > 1 uncompressed FedSKETCH (the exact mean in place of Φ)."""

    weighting = "uniform"
