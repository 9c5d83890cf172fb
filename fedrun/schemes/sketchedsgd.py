"""SketchedSGD (Ivkin, Rothchild, Ullah, Braverman, Stoica, Arora, NeurIPS 2019): paper 002's sketch baseline.

One local step per round (τ = 1). Worker j keeps momentum u_j and error accumulation v_j (``sim.client_state``,
persistent across the rounds it takes part in). Round r, K participating workers, weights w_j = 1/K::

    worker j      g_j at x⁽ʳ⁾ (lr η folded in: ηg_j = x⁽ʳ⁾ − x_j¹);  u_j ← ρ·u_j + ηg_j;  v_j ← v_j + u_j
    uplink 1      S(v_j)                                    4·t·k bytes per worker
    server        S̄ = Σ_j w_j S(v_j);  H = top-m of |PRIVIX[S̄]| (heavy hitters)
    downlink 1    H to the K workers (int32)                4·m bytes per worker
    uplink 2      v_j[H] (exact values)                     4·m bytes per worker
    server        v̄ = Σ_j w_j v_j[H]
    downlink 2    the sparse update (v̄, H) to all N workers 8·m bytes per worker (every replica applies it)
    everyone      x⁽ʳ⁺¹⁾ = x⁽ʳ⁾ − γ·v̄ on H;  participating workers set u_j[H] = v_j[H] = 0

Deviations from Ivkin et al.: their workers all take part every round (synchronous data-parallel SGD);
here the sampler picks K of N and absent workers keep their u_j, v_j. Their server sums the sketches; we
average (1/K), which only rescales the learning rate. Exact values make this scheme non-private in the
sense of paper 002 (no ``sketch_epsilon``), and ``dp=true`` is refused (the second exchange is not covered).

With an exact heavy-hitter search this is top-m SGD with momentum and error accumulation
(tests/unit/test_sketchedsgd_reference.py checks it against an independent implementation). At most m
coordinates move per round: with paper 002's sketches (m = k = 40 or 100 of LeNet-5's 61,706 weights) an
80-round run can touch at most 5 % (13 %) of the model, which is why it stays near chance there; a larger
``num_heavy`` (more exact values in the second exchange) learns more. The measured accuracies are in
results/fedsketch/sketchedsgd_heavy.md (experiment=fedsketch_sketchedsgd_heavy), not here.
"""

from __future__ import annotations

import torch

from fedrun.compress.sketch import heavy_flops
from fedrun.schemes.base import ClientView, Env, Received, check
from fedrun.schemes.sketch import SketchScheme

MOMENTUM = "sketchedsgd_momentum"
ERROR = "sketchedsgd_error"


class SketchedSGD(SketchScheme):
    """SketchedSGD with worker momentum ρ (``momentum``) and error accumulation; m = ``num_heavy`` (default k)."""

    dp_modes = ("off",)  # its second exchange sends exact coordinates that DP on the sketch does not cover
    broadcast = "none"  # every worker keeps a replica; it receives the sparse update (v̄, H) only
    query_source = ERROR  # the second exchange sends v_j[H]
    queries = True
    dp_refusal = ("dp=true with scheme=sketchedsgd: its second exchange sends exact coordinates that client-level DP "
                  "on the sketch does not cover; allowed with dp=true: scheme=fedsketch with unsketch=privix or "
                  "heavy_values=sketch")

    def __init__(self, rows: int = 20, cols: int = 40, num_heavy: int | None = None, momentum: float = 0.9,
                 hashes: str = "fixed", weighting: str = "uniform", server_lr: float = 1.0) -> None:
        super().__init__(rows=rows, cols=cols, num_heavy=num_heavy, hashes=hashes, weighting=weighting,
                         server_lr=server_lr)
        self.momentum = float(check("momentum", momentum, "0 <= momentum < 1", lambda v: 0 <= v < 1))

    def setup(self, env: Env) -> None:
        if env.local_steps != 1:
            raise ValueError(f"scheme=sketchedsgd takes one local step per round (τ = 1); got "
                             f"local_steps={env.local_steps}; allowed: local_steps=1")
        super().setup(env)

    def encode(self, rnd: int, updates: torch.Tensor, state: ClientView) -> torch.Tensor:
        u, v = state.get(MOMENTUM, self.n), state.get(ERROR, self.n)
        u.mul_(self.momentum).add_(-updates)  # u ← ρu + ηg
        v.add_(u)  # v ← v + u
        state.set(MOMENTUM, u)
        state.set(ERROR, v)
        return self.sketch(rnd).sketch(v).reshape(len(v), -1)

    def query(self, rnd: int, aggregate: torch.Tensor) -> torch.Tensor:
        """H = top-m of |PRIVIX[S̄]|, sent to the participants."""
        self.H = super().query(rnd, aggregate)
        return self.H

    def server_flops(self, n: int) -> float:
        """The step (:meth:`Scheme.server_flops`) + the query's heavy hitters, n·t·(1 + ⌈log₂t⌉) + n·(1 + ⌈log₂m⌉);
        the decode places v̄ on H (memory moves only)."""
        return super().server_flops(n) + heavy_flops(self.n, self.rows, self.m)

    def decode(self, rnd: int, aggregate: torch.Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
        """x ← x − γ·v̄ on H."""
        return torch.zeros(self.n, device=aggregate.device).index_put_((self.H,), -exact)

    def feedback(self, rnd: int, state: ClientView, sent: torch.Tensor, values: torch.Tensor | None,
                 received: Received) -> None:
        """Participating workers set u_j[H] = v_j[H] = 0."""
        for name in (MOMENTUM, ERROR):
            rows = state.get(name, self.n)
            rows[:, received.indices] = 0.0
            state.set(name, rows)
