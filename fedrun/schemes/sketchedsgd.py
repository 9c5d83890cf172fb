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

from typing import TYPE_CHECKING

import numpy as np
import torch

from fedrun.comm import Message
from fedrun.config import ConfigError
from fedrun.schemes.sketch import SketchScheme

if TYPE_CHECKING:  # pragma: no cover
    from fedrun.simulation import Simulation

MOMENTUM = "sketchedsgd_momentum"
ERROR = "sketchedsgd_error"


class SketchedSGD(SketchScheme):
    """SketchedSGD with worker momentum ρ (``momentum``) and error accumulation; m = ``num_heavy`` (default k)."""

    dp_modes = ("off",)  # its second exchange sends exact coordinates that DP on the sketch does not cover

    sends_exact_values = True

    def __init__(self, rows: int = 20, cols: int = 40, num_heavy: int | None = None, momentum: float = 0.9,
                 hashes: str = "fixed", weighting: str = "uniform", server_lr: float = 1.0) -> None:
        super().__init__(rows=rows, cols=cols, num_heavy=num_heavy, hashes=hashes, weighting=weighting,
                         server_lr=server_lr)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ValueError(f"scheme.momentum={momentum!r}; allowed: 0 <= momentum < 1")
        self.momentum = float(momentum)

    def _dp_refusal(self) -> str:
        return ("dp=true with scheme=sketchedsgd: its second exchange sends exact coordinates that client-level DP "
                "on the sketch does not cover; allowed with dp=true: scheme=fedsketch with unsketch=privix or "
                "heavy_values=sketch")

    def setup(self, sim: "Simulation") -> None:
        if sim.spec.steps != 1:
            raise ConfigError(f"scheme=sketchedsgd takes one local step per round (τ = 1); got "
                              f"local_steps={sim.spec.steps}; allowed: local_steps=1")
        super().setup(sim)

    def round(self, sim: "Simulation", rnd: int, clients: np.ndarray) -> dict[str, float]:
        cs = self.sketch(sim, rnd)
        n, rho = sim.n, self.momentum
        weights = self.weights(sim, clients)

        def accumulated():
            for ids, local, loss in sim.train(clients, rnd):
                u = sim.client_state.get(MOMENTUM, ids, n)
                v = sim.client_state.get(ERROR, ids, n)
                u.mul_(rho).add_(sim.params - local)  # u ← ρu + ηg
                v.add_(u)  # v ← v + u
                sim.client_state.set(MOMENTUM, ids, u)
                sim.client_state.set(ERROR, ids, v)
                yield ids, v, loss

        S_bar, V, _, losses = self._sketch_and_aggregate(sim, rnd, clients, weights, cs, accumulated(), keep=True)
        m = min(self.heavy, n)
        H = cs.heavy_hitters(S_bar, m)
        K = len(clients)
        sim.ledger.downlink(Message.of(H.to(torch.int32), kind="heavy_indices"), K)
        if K:
            v_bar = self._exact_values(sim, V, H, weights)
        else:
            v_bar = torch.zeros(m, device=sim.device)
        sim.ledger.downlink(Message.of(v_bar, H.to(torch.int32), kind="sparse_update"), sim.num_clients)
        sim.params.index_add_(0, H, v_bar, alpha=-self.server_lr)
        if K:
            for name in (MOMENTUM, ERROR):
                state = sim.client_state.get(name, clients, n)
                state[:, H] = 0.0
                sim.client_state.set(name, clients, state)
        return self._round_metrics(losses)
