"""SketchedSGD (Ivkin et al., NeurIPS 2019) against an independent implementation of the algorithm.

With a sketch whose heavy hitters are exact, SketchedSGD is top-k SGD with worker momentum and error
accumulation (the reference code github.com/dhroth/sketchedsgd, ``SketchedSum._aggAndZeroTrueTopk`` and
``_backwardWorker``): every worker j of the round computes its gradient g_j at the global model x and keeps

    u_j ← ρ·u_j + g_j          (momentum)
    v_j ← v_j + u_j            (error accumulation)

the server takes the top-m coordinates H of the aggregated v (here the average over the K participants:
Ivkin et al. sum, which rescales the learning rate by K), applies x ← x − lr·v̄ on H, and the workers zero
u_j and v_j on H (momentum stopping, error reset). fedrun folds η into the local step (u_j holds η·g_j)
and applies γ on the server, so lr = η·γ.

The reference here is written from that description only: the gradients of the tiny softmax regression
in closed form (numpy, float64; each client's one batch is its whole data, so the batch order does not
matter), the top-m with ``numpy.argsort``; nothing of fedrun but the client sampler (who takes part) is
reused. The scheme runs with an exact "sketch" (the identity: S(v) = v, heavy hitters = the exact top-m of
|v̄|) substituted for the count sketch, so the test checks the protocol — momentum, error accumulation, their
reset on the applied coordinates, the scaling by η·γ and 1/K, the sign, absent workers keeping their state —
over six rounds of partial participation. fedrun keeps models and worker state in float32, the reference in
float64: each round starts the reference from the scheme's model (the workers' u_j, v_j are compared over all
rounds, never re-synchronised), within float32 round-off at the scale of the values (tests/tolerance.py,
probabilistic bound); a wrong mechanism is off by the size of a gradient term, far beyond it. The count
sketch's own heavy-hitter search is tested against a dense matrix in tests/unit/test_sketch_schemes.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedrun.sampling import UniformSampler
from fedrun.schemes.sketchedsgd import ERROR, MOMENTUM, SketchedSGD
from fedrun.simulation import Simulation
from fedrun.training import ClientData, LocalSpec
from tolerance import assert_f32_close, f32_tol

N_CLIENTS, PER_CLIENT, FEATURES, CLASSES = 6, 20, 12, 4
DIM = FEATURES * CLASSES + CLASSES  # 52 parameters: nn.Linear's weight [C, F] (row-major), then its bias [C]
#: float32 roundings on one element's path in a round: the gradient's sums over the batch × features, the
#: local step, Δ = x − x¹, ρu + Δ, v + u, the mean over K, × γ, x − ·
ROUND_TERMS = PER_CLIENT * (FEATURES + 1) + N_CLIENTS + 8


def _data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N_CLIENTS * PER_CLIENT, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (N_CLIENTS * PER_CLIENT,), generator=g)
    parts = [np.arange(i * PER_CLIENT, (i + 1) * PER_CLIENT) for i in range(N_CLIENTS)]
    return x, y, parts


class ExactSketch:
    """A "sketch" that loses nothing: S(v) = v as one row, heavy hitters = the exact top-m of |S|."""

    def sketch(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], 1, x.shape[1]).clone()

    def heavy_hitters(self, S: torch.Tensor, m: int) -> torch.Tensor:
        return S.reshape(-1).abs().topk(m).indices.sort().values


def make_sim(scheme: SketchedSGD, lr: float, per_round: int) -> Simulation:
    x, y, parts = _data()
    torch.manual_seed(3)
    model = nn.Linear(FEATURES, CLASSES)
    spec = LocalSpec("sgd", steps=1, batch_size=PER_CLIENT, lr=lr)  # one batch = the client's whole data
    sim = Simulation(model=model, data=ClientData(x, y, parts), x_test=x[:30], y_test=y[:30],
                     sampler=UniformSampler(N_CLIENTS, per_round), scheme=scheme, spec=spec, seed=5)
    assert sim.scheme is scheme
    return sim


class ExactSketchedSGD(SketchedSGD):
    """The count sketch replaced by an exact one (rows·cols = DIM) on both sides of the protocol: the clients'
    codecs (encode: S(v_j), each built afresh from this class) and the server's (query: the heavy set H)."""

    def sketch(self, rnd):
        return ExactSketch()


# ---------------------------------------------------------------- the independent reference
def ref_gradient(w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """∇ of the mean cross-entropy of softmax(X Wᵀ + b) at w = [W.ravel(), b]."""
    W, b = w[:CLASSES * FEATURES].reshape(CLASSES, FEATURES), w[CLASSES * FEATURES:]
    z = X @ W.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    p /= len(y)
    return np.concatenate([(p.T @ X).ravel(), p.sum(0)])


class TopKMomentumEF:
    """Ivkin et al.'s SketchedSGD with exact heavy hitters: top-m SGD, worker momentum + error accumulation."""

    def __init__(self, w0: np.ndarray, lr: float, rho: float, m: int) -> None:
        self.w, self.lr, self.rho, self.m = w0.copy(), lr, rho, m
        self.u = np.zeros((N_CLIENTS, DIM))
        self.v = np.zeros((N_CLIENTS, DIM))
        x, y, parts = _data()
        self.data = [(x.double().numpy()[p], y.numpy()[p]) for p in parts]

    def round(self, clients: np.ndarray) -> np.ndarray:
        for j in clients:
            self.u[j] = self.rho * self.u[j] + ref_gradient(self.w, *self.data[j])
            self.v[j] = self.v[j] + self.u[j]
        v_bar = self.v[clients].mean(0)
        order = np.argsort(-np.abs(v_bar), kind="stable")
        gap = abs(v_bar[order[self.m - 1]]) - abs(v_bar[order[self.m]])
        H = np.sort(order[:self.m])
        self.w[H] -= self.lr * v_bar[H]
        self.u[np.ix_(clients, H)] = 0.0
        self.v[np.ix_(clients, H)] = 0.0
        return gap


# ---------------------------------------------------------------- the tests
@pytest.mark.parametrize("rho,m,per_round", [(0.9, 8, 4), (0.5, 3, 3), (0.0, 13, 6)])
def test_sketchedsgd_with_exact_heavy_hitters_is_topk_sgd_with_momentum_and_error_feedback(rho, m, per_round):
    eta, gamma, rounds = 0.4, 1.5, 6
    scheme = ExactSketchedSGD(rows=1, cols=DIM, num_heavy=m, momentum=rho, server_lr=gamma)
    sim = make_sim(scheme, lr=eta, per_round=per_round)
    ref = TopKMomentumEF(sim.params.double().numpy(), lr=eta * gamma, rho=rho, m=m)
    all_ids = np.arange(N_CLIENTS)
    seen = set()
    for rnd in range(1, rounds + 1):
        clients = sim.select(rnd)
        seen.update(int(c) for c in clients)
        p0 = sim.params.double().numpy()
        ref.w = p0.copy()  # the round starts from the scheme's (float32) model
        assert sim.run_round(rnd)["clients"] == len(clients)  # the round selects the same clients (sim.select)
        gap = ref.round(clients)
        # scale of every value on the path: the model and the (η-scaled) accumulated error; roundings add up
        # over the rounds in u_j and v_j
        scale = np.abs(p0).max() + eta * (1 + gamma) * np.abs(ref.v).max() + eta * np.abs(ref.u).max() + 1.0
        terms = rnd * ROUND_TERMS
        tol = f32_tol(scale, terms=terms, probabilistic=True)
        # the heavy set is unambiguous: no near-tie at its boundary within float32 round-off (v_j is η-scaled)
        assert eta * gap > 2 * tol, f"round {rnd}: top-{m} boundary tie ({eta * gap:g} <= {2 * tol:g})"
        assert_f32_close(sim.params, ref.w, scale, terms=terms, probabilistic=True, msg=f"model, round {rnd}")
        # the workers' state, η folded in: u_j, v_j of fedrun = η × the reference's (absent workers keep theirs)
        assert_f32_close(sim.client_state.get(MOMENTUM, all_ids, DIM), eta * ref.u, scale, terms=terms,
                         probabilistic=True, msg=f"momentum, round {rnd}")
        assert_f32_close(sim.client_state.get(ERROR, all_ids, DIM), eta * ref.v, scale, terms=terms,
                         probabilistic=True, msg=f"error, round {rnd}")
    if per_round < N_CLIENTS:
        assert len(seen) == N_CLIENTS  # every worker took part, and some rounds left some out


def test_one_round_without_momentum_and_m_1_is_top1_sgd():
    """Guard on the harness (data layout, gradient, scaling): ρ = 0, m = 1, one round = plain top-1 SGD."""
    scheme = ExactSketchedSGD(rows=1, cols=DIM, num_heavy=1, momentum=0.0, server_lr=1.0)
    sim = make_sim(scheme, lr=0.5, per_round=N_CLIENTS)
    w0 = sim.params.double().numpy()
    clients = sim.select(1)
    assert sim.run_round(1)["clients"] == len(clients) == N_CLIENTS
    x, y, parts = _data()
    g = np.mean([ref_gradient(w0, x.double().numpy()[p], y.numpy()[p]) for p in parts], axis=0)
    i = int(np.argmax(np.abs(g)))
    expected = w0.copy()
    expected[i] -= 0.5 * g[i]
    assert_f32_close(sim.params, expected, np.abs(w0).max() + 1.0, terms=ROUND_TERMS)
    assert np.count_nonzero(sim.params.double().numpy() != w0) == 1
