"""Local DP (dp=local_laplace|local_gaussian) and scheme=ldp_fedavg end to end on Lending Club (small settings)."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import compose
from fedrun.config import ConfigError
from fedrun.run import build, run
from tolerance import assert_f32_close

# 10 clients (states merged by size), 5 per round, round robin: every client takes part every 2 rounds.
LDP = ["~experiment", "dataset=lending_club", "scheme=ldp_fedavg", "sampler=round_robin", "clients_per_round=5", "num_clients=10",
       "local_mode=gd", "local_steps=2", "rounds=4", "lr=0.1", "local_clip=150", "local_clip_ord=1",
       "tracking=none", "progress=off"]


@pytest.fixture
def cfg(shared_data):
    def make(*overrides: str) -> dict:
        return OmegaConf.to_container(compose(LDP + [f"data_root={shared_data}", *overrides]), resolve=True)

    return make


def _final_params(c: dict) -> torch.Tensor:
    sim = build(c).sim
    for rnd in range(1, int(c["rounds"]) + 1):
        sim.run_round(rnd, sim.select(rnd))
    return sim.params


@pytest.mark.parametrize("mode", ["local_laplace", "local_gaussian"])
def test_infinite_epsilon_is_exactly_the_non_private_run(cfg, mode):
    ord_ = "local_clip_ord=2" if mode == "local_gaussian" else "local_clip_ord=1"
    private = _final_params(cfg(f"dp={mode}", "epsilon=inf", ord_))
    plain = _final_params(cfg("dp=false", ord_))
    noisy = _final_params(cfg(f"dp={mode}", "epsilon=50", ord_))
    assert torch.equal(private, plain)
    assert not torch.equal(noisy, plain)


def test_aggregate_uses_paper_weights(cfg):
    """w ← w + Σ_l (N/b)(n_l/n)·Δ_l: checked against the weights written out, in float64, on the local models
    the round aggregates (the training path itself is tested in test_training.py)."""
    c = cfg("dp=false")
    sim = build(c).sim
    w0 = sim.params.clone()
    clients = sim.select(1)
    local = torch.cat([m for _, m, _ in sim.train(clients, 1)])
    sizes = sim.data.sizes
    a = (10 / 5) * sizes[clients] / sizes.sum()
    terms = torch.as_tensor(a)[:, None] * (local.double() - w0.double())
    expected = w0.double() + terms.sum(0)
    sim.run_round(1, clients)
    # float32 round-off: Δ_l, the weights' cast, a sum of b products, + w0
    assert_f32_close(sim.params, expected, (w0, 1), terms.abs().sum(0), terms=len(clients) + 3)
    assert not math.isclose(float(a.sum()), 1.0)  # unequal clients: the paper's weights do not sum to 1


def test_laplace_run_logs_epsilon_per_round_and_reaches_the_budget(cfg, tmp_path):
    summary = run(cfg("dp=local_laplace", "epsilon=3"), out_dir=tmp_path)
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    eps = [float(r["epsilon"]) for r in rows]
    # T_l = 5·4/10 = 2 participations, ε/2 each; every client takes part in round 1 or 2 and again 2 rounds later
    assert eps == [1.5, 1.5, 3.0, 3.0]
    assert summary["ldp_epsilon_max"] == pytest.approx(3.0) and summary["ldp_epsilon_median"] == pytest.approx(3.0)
    assert summary["ldp_participations_max"] == 2 and summary["epsilon_final"] == pytest.approx(3.0)
    zeta, eta, e = 150, 0.1, 2  # the default local_dp_sensitivity=proven: Δ = 2ζη/n_l + 2ζη(E−1)
    sens = [2 * zeta * eta / n + 2 * zeta * eta * (e - 1)
            for n in build(cfg("dp=local_laplace", "epsilon=3")).sim.data.sizes]
    assert summary["ldp_scale_median"] == pytest.approx(float(np.median([s * 2 / 3 for s in sens])))
    assert all("ldp_noise_item_var" in r for r in rows)


def test_gaussian_summary_has_rdp_and_pld(cfg, tmp_path):
    summary = run(cfg("dp=local_gaussian", "epsilon=10", "delta=1e-4", "local_clip_ord=2"), out_dir=tmp_path)
    assert summary["ldp_delta"] == 1e-4
    assert summary["ldp_epsilon_pld_max"] <= summary["ldp_epsilon_rdp_max"]
    assert summary["epsilon_final"] == pytest.approx(summary["ldp_epsilon_rdp_max"])
    # the classic formula at ε = 10 ≥ 1 gives a composed ε above the target (that is why both are reported)
    assert summary["ldp_epsilon_pld_max"] > 10.0


def test_total_iterations_sets_rounds(cfg):
    sim_cfg = cfg("dp=false", "total_iterations=12", "rounds=null", "local_steps=3")
    build(sim_cfg)
    assert sim_cfg["rounds"] == 4


@pytest.mark.parametrize("extra,message", [
    (["sampler=poisson"], "sampler=poisson does not fix it; allowed: round_robin"),
    (["sampler=uniform"], "sampler=uniform does not fix it; allowed: round_robin"),
    (["model=lenet5", "dataset=mnist", "local_clip=null"], "needs local_clip=ζ"),
    (["local_clip_ord=2"], "dp=local_laplace needs local_clip_ord=1"),
    (["local_mode=sgd", "scheme=fl_std"], "needs local_mode=gd"),
    (["noise_multiplier=1.0"], "noise_multiplier=1.0 is for dp=true"),
    (["local_dp_calibration=exact"], "local_dp_calibration='exact' is not allowed"),
    (["total_iterations=10", "rounds=null", "local_steps=3"], "total_iterations=10 is not a multiple of local_steps=3"),
    (["total_iterations=10", "local_steps=2"], "disagrees with total_iterations=10"),
])
def test_local_dp_config_errors(cfg, extra, message):
    with pytest.raises(ConfigError, match=message):
        build(cfg("dp=local_laplace", "epsilon=1", *extra))


def test_ldp_fedavg_needs_full_batch(cfg):
    with pytest.raises(ConfigError, match="scheme=ldp_fedavg runs E full-batch"):
        build(cfg("dp=false", "local_mode=sgd"))


def test_all_sampler_is_accounted(cfg, tmp_path):
    summary = run(cfg("dp=local_laplace", "epsilon=4", "sampler=all", "rounds=2"), out_dir=tmp_path)
    assert summary["ldp_participations_min"] == 2 and summary["ldp_epsilon_max"] == pytest.approx(4.0)


def test_state_dict_resume_equals_uninterrupted_run(cfg, tmp_path):
    """Params + LocalDP.state_dict() after round 2 (through torch.save, as checkpoints do) → rounds 3–4 give the
    uninterrupted run's model and ε bit for bit (noise streams are keyed by seed, round and client)."""
    c = cfg("dp=local_gaussian", "epsilon=4", "delta=1e-4", "local_clip_ord=2")

    def rounds(sim, rs):
        eps = []
        for rnd in rs:
            sim.run_round(rnd, sim.select(rnd))
            eps.append(sim.epsilon())
        return eps

    whole = build(dict(c)).sim
    eps_whole = rounds(whole, range(1, 5))
    first = build(dict(c)).sim
    rounds(first, range(1, 3))
    torch.save({"params": first.params, "local_dp": first.local_dp.state_dict()}, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    resumed = build(dict(c)).sim
    resumed.params.copy_(state["params"])
    resumed.local_dp.load_state_dict(state["local_dp"])
    assert rounds(resumed, range(3, 5)) == eps_whole[2:]
    assert torch.equal(resumed.params, whole.params)
