"""FedSGD at τ local steps (paper 002's uncompressed baseline at the sketches' τ = uncompressed FedSKETCH).

Reference: x ← x + γ·(1/K) Σ_j (x_j^τ − x) over the K participants, uniform weights even when the clients
hold different amounts of data (FedSKETCH's weights, not FedAvg's |D_j|-weighting), computed in float64 from
the local models the round itself aggregates (the same ``sim.train`` path: local training is tested in
test_training.py). Also: FedSGD equals FedSKETCH with an exact decoder (HEAPRIX with every coordinate heavy
and its exact values) at the same τ, η, γ.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedrun.sampling import UniformSampler
from fedrun.schemes.sketch import FedSGD, FedSketch
from fedrun.simulation import Simulation
from fedrun.training import ClientData, LocalSpec
from tolerance import assert_f32_close

FEATURES, CLASSES = 10, 3
DIM = FEATURES * CLASSES + CLASSES
SIZES = (8, 30, 15, 22, 40)  # unequal: uniform and size weights differ


def make_sim(scheme, steps: int, seed: int = 0) -> Simulation:
    g = torch.Generator().manual_seed(11)
    n = sum(SIZES)
    x = torch.randn(n, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    cuts = np.cumsum((0,) + SIZES)
    parts = [np.arange(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    torch.manual_seed(seed)
    spec = LocalSpec("sgd", steps=steps, batch_size=4, lr=0.2)
    return Simulation(model=nn.Linear(FEATURES, CLASSES), data=ClientData(x, y, parts), x_test=x[:20],
                      y_test=y[:20], sampler=UniformSampler(len(SIZES), 3), scheme=scheme, spec=spec, seed=seed)


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_fedsgd_takes_tau_local_steps_with_uniform_weights(steps):
    sim = make_sim(FedSGD(server_lr=1.7), steps=steps)
    for rnd in (1, 2, 3):
        clients = sim.select(rnd)
        p0 = sim.params.clone()
        local = torch.cat([m for _, m, _ in sim.train(clients, rnd)])
        deltas = (local - p0).double().numpy()
        assert len(set(np.asarray(SIZES)[clients])) > 1  # participants of different sizes: weights matter
        assert sim.run_round(rnd)["clients"] == len(clients)  # the round selects the same clients (sim.select)
        expected = p0.double().numpy() + 1.7 * deltas.mean(0)
        # float32: the K updates, their weighted sum, × γ, p0 + ·
        assert_f32_close(sim.params, expected, (p0, 1), 1.7 * np.abs(deltas).mean(0), terms=len(clients) + 3)
        if steps > 1:  # τ steps moved the local models further than one step would have: τ is honoured
            one = make_sim(FedSGD(), steps=1)
            one.params.copy_(p0)
            one_local = torch.cat([m for _, m, _ in one.train(clients, rnd)])
            assert not torch.allclose(one_local, local)


def test_fedsgd_is_fedsketch_with_an_exact_decoder_at_the_same_tau():
    """Uncompressed FedSKETCH: HEAPRIX with m = d (every coordinate heavy, exact values) is the exact average."""
    a = make_sim(FedSGD(server_lr=0.8), steps=3)
    b = make_sim(FedSketch("heaprix", rows=1, cols=DIM, num_heavy=DIM, server_lr=0.8), steps=3)
    for rnd in (1, 2, 3):
        clients = a.select(rnd)
        assert np.array_equal(clients, b.select(rnd))
        b.params.copy_(a.params)  # each round from the same model (float32 round-off is not amplified)
        p0 = a.params.clone()
        deltas = (torch.cat([m for _, m, _ in a.train(clients, rnd)]) - p0).double().numpy()
        for sim in (a, b):
            assert sim.run_round(rnd)["clients"] == len(clients)
        assert_f32_close(a.params, b.params.double().numpy(), (p0, 2), 0.8 * np.abs(deltas).mean(0),
                         terms=2 * (len(clients) + 4))
