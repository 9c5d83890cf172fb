"""Local DP of paper 001 (fedrun.privacy.local_dp.LocalDP): noise scales, per-client streams, accounting, state.

References are written out here independently of fedrun.privacy.local: the paper's formulas
b = 2ζηE·T_l/(n_l·ε) and σ = (2ζηE/n_l)·√(2·T_l·ln(1.25/δ))/ε, the Laplace variance 2b², and the exact ε
of composed Gaussian releases (Gaussian DP, Dong, Roth & Su 2019: k releases with noise multiplier s are
μ-GDP with μ = √k/s, δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2)).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import norm

from fedrun.privacy.local_dp import LocalDP
from fedrun.rng import torch_generator
from tolerance import f32_tol

DIM = 100_000  # coordinates per draw: the variance estimate's relative error is ~√(5/DIM) ≈ 0.7 % (Laplace)


class FakeScheme:
    def __init__(self, weights: dict[int, float]) -> None:
        self.w = weights

    def weights(self, sim, clients):
        return np.array([self.w[int(c)] for c in clients])


class FakeSim:
    """What LocalDP.privatize uses from a Simulation: n, generator, select, scheme.weights, diagnostics."""

    def __init__(self, n: int, selected: np.ndarray, weights: dict[int, float] | None = None, seed: int = 0):
        self.n, self.seed, self.selected = n, seed, np.asarray(selected)
        self.scheme = FakeScheme(weights or {int(c): 1.0 for c in selected})
        self.last_dp_diagnostics: dict[str, float] = {}

    def generator(self, rnd, *purpose):
        return torch_generator(self.seed, rnd, *purpose)

    def select(self, rnd):
        return self.selected


def _privatize(dp: LocalDP, sim: FakeSim, rnd: int, clients: np.ndarray, payload: torch.Tensor) -> torch.Tensor:
    """What the simulation's privatizer does for one chunk: the round's selected clients and weights once per round
    (``LocalDP.start_round``), then the chunk's noise from the per-client streams."""
    if getattr(sim, "_round", None) != rnd:
        selected = sim.select(rnd)
        dp.start_round(selected, sim.scheme.weights(sim, selected))
        sim._round = rnd
    out = dp.privatize(rnd, clients, payload, lambda l: sim.generator(rnd, "local_dp", l))
    sim.last_dp_diagnostics = dp.diagnostics
    return out


def paper_laplace(zeta, eta, e, t_l, n_l, eps):
    return 2 * zeta * eta * e * t_l / (n_l * eps)


def paper_gaussian(zeta, eta, e, t_l, n_l, eps, delta):
    return (2 * zeta * eta * e / n_l) * math.sqrt(2 * t_l * math.log(1.25 / delta)) / eps


def gdp_epsilon(mu: float, delta: float) -> float:
    """Exact ε(δ) of a μ-GDP mechanism (the composition of Gaussian releases)."""
    f = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e + norm.logcdf(-e / mu - mu / 2)) - delta  # noqa: E731
    return 0.0 if f(0.0) <= 0 else brentq(f, 0.0, 200.0, xtol=1e-12)


def _ldp(mechanism="laplace", eps=2.0, e=3, lr=0.1, t_l=4, n_l=50, clients=1, **kw):
    return LocalDP(mechanism, eps, kw.pop("clip", 1.5), lr, e, np.full(clients, t_l), np.full(clients, n_l),
                   delta=kw.pop("delta", 1e-4), **kw)


def _noise(dp: LocalDP, clients=(0,), rnd=1, dim=DIM) -> torch.Tensor:
    sim = FakeSim(dim, np.array(clients))
    zeros = torch.zeros(len(clients), dim)
    return _privatize(dp, sim, rnd, np.array(clients), zeros)


# ------------------------------------------------------------------------------------------- noise scales
@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_empirical_variance_matches_paper_formula(mechanism):
    dp = _ldp(mechanism)
    var = float(_noise(dp).var())
    if mechanism == "laplace":
        expected = 2 * paper_laplace(1.5, 0.1, 3, 4, 50, 2.0) ** 2
    else:
        expected = paper_gaussian(1.5, 0.1, 3, 4, 50, 2.0, 1e-4) ** 2
    assert var == pytest.approx(expected, rel=0.03)


@pytest.mark.parametrize("mechanism,z", [("laplace", 2), ("gaussian", 1)])
@pytest.mark.parametrize("knob,factor", [("e", 4), ("lr", 3), ("t_l", 4)])
def test_variance_scales_as_eta2_E2_Tl_z(mechanism, z, knob, factor):
    """Var ∝ η²·E²·T_l^z (z = 2 Laplace, 1 Gaussian): paper 001's asymptotic variance."""
    base = dict(e=2, lr=0.05, t_l=2)
    big = {**base, knob: base[knob] * factor}
    v0 = float(_noise(_ldp(mechanism, **base)).var())
    v1 = float(_noise(_ldp(mechanism, **big)).var())
    power = z if knob == "t_l" else 2
    assert v1 / v0 == pytest.approx(factor ** power, rel=0.05)


def test_laplace_draws_are_laplace():
    """Shape check: kurtosis 6 (Laplace) vs 3 (Gaussian); mean |x| = b."""
    dp = _ldp("laplace")
    x = _noise(dp)[0].double()
    b = paper_laplace(1.5, 0.1, 3, 4, 50, 2.0)
    assert float(x.abs().mean()) == pytest.approx(b, rel=0.02)
    kurt = float((x ** 4).mean() / (x ** 2).mean() ** 2)
    assert kurt == pytest.approx(6.0, rel=0.1)


def test_per_client_scale_follows_n_l_and_T_l():
    dp = LocalDP("laplace", 1.0, 2.0, 0.1, 2, np.array([1, 3, 0]), np.array([10, 40, 5]))
    assert dp.scales[0] == pytest.approx(paper_laplace(2.0, 0.1, 2, 1, 10, 1.0))
    assert dp.scales[1] == pytest.approx(paper_laplace(2.0, 0.1, 2, 3, 40, 1.0))
    assert dp.scales[2] == 0.0  # never engaged: no noise planned


def test_noise_is_per_client_stream_independent_of_chunking():
    dp = _ldp("gaussian", clients=5)
    whole = _noise(dp, clients=range(5), dim=1000)
    dp2 = _ldp("gaussian", clients=5)
    parts = torch.cat([_noise(dp2, clients=[0, 1], dim=1000), _noise(dp2, clients=[2, 3, 4], dim=1000)])
    assert torch.equal(whole, parts)
    assert not torch.equal(whole[0], whole[1])
    other_round = _ldp("gaussian", clients=5)
    assert not torch.equal(_noise(other_round, clients=range(5), rnd=2, dim=1000), whole)


def test_infinite_epsilon_returns_payload_unchanged():
    payload = torch.randn(2, 7)
    dp = _ldp("laplace", eps=math.inf, clients=2)
    out = _privatize(dp, FakeSim(7, np.array([0, 1])), 1, np.array([0, 1]), payload)
    assert out is payload
    assert dp.epsilon() == math.inf


def test_noise_item_diagnostics_match_weighted_formula():
    """Measured per-coordinate variance of Σ a_l w_l vs Σ a_l²·2b_l² (Laplace), a_l = the scheme's weights."""
    sizes = np.array([20, 50, 80])
    dp = LocalDP("laplace", 3.0, 1.0, 0.2, 2, np.array([2, 2, 2]), sizes)
    a = {0: 0.5, 1: 1.2, 2: 2.0}
    sim = FakeSim(DIM, np.array([0, 1, 2]), a)
    _privatize(dp, sim, 1, np.array([0, 1]), torch.zeros(2, DIM))
    _privatize(dp, sim, 1, np.array([2]), torch.zeros(1, DIM))
    expected = sum(a[l] ** 2 * 2 * paper_laplace(1.0, 0.2, 2, 2, int(sizes[l]), 3.0) ** 2 for l in range(3))
    d = sim.last_dp_diagnostics
    assert d["ldp_noise_item_var_formula"] == pytest.approx(expected, rel=1e-9)
    assert d["ldp_noise_item_var"] == pytest.approx(expected, rel=0.03)


# ------------------------------------------------------------------------------------------- accounting
def test_laplace_epsilon_is_basic_composition_of_what_was_added():
    sizes, t_l = np.array([10, 30]), np.array([3, 1])
    dp = LocalDP("laplace", 2.0, 1.0, 0.1, 2, t_l, sizes)
    assert dp.epsilon() == 0.0
    _privatize(dp, FakeSim(4, np.array([0, 1])), 1, np.array([0, 1]), torch.zeros(2, 4))
    # client 0 spent 1 of its 3 participations (2/3 each), client 1 its only one (2.0): worst = 2.0
    assert dp.epsilon() == pytest.approx(2.0)
    s = dp.summary()
    assert s["ldp_epsilon_max"] == pytest.approx(2.0)
    assert s["ldp_epsilon_median"] == pytest.approx((2.0 / 3 + 2.0) / 2)
    for rnd in (2, 3):
        _privatize(dp, FakeSim(4, np.array([0])), rnd, np.array([0]), torch.zeros(1, 4))
    assert dp.summary()["ldp_epsilon_median"] == pytest.approx(2.0)  # both clients at the target


@pytest.mark.parametrize("calibration", ["classic", "analytic"])
def test_gaussian_epsilon_rdp_pld_vs_exact_gdp(calibration):
    eps_target, delta, t_l = 0.8, 1e-4, 5
    dp = _ldp("gaussian", eps=eps_target, t_l=t_l, delta=delta, calibration=calibration)
    sim = FakeSim(3, np.array([0]))
    for rnd in range(1, t_l + 1):
        _privatize(dp, sim, rnd, np.array([0]), torch.zeros(1, 3))
    sens = 2 * 1.5 * 0.1 * 3 / 50
    sigma = float(dp.scales[0])
    if calibration == "classic":
        assert sigma == pytest.approx(paper_gaussian(1.5, 0.1, 3, t_l, 50, eps_target, delta), rel=1e-12)
    exact = gdp_epsilon(math.sqrt(t_l) * sens / sigma, delta)
    s = dp.summary()
    if calibration == "classic":
        assert exact <= eps_target  # Dwork & Roth Thm A.1 holds for ε < 1
    else:
        assert exact == pytest.approx(eps_target, rel=1e-6)  # analytic Gaussian: exactly the target
    assert exact <= s["ldp_epsilon_pld_max"] <= exact * 1.02 + 1e-3  # PLD: pessimistic, tight
    assert s["ldp_epsilon_pld_max"] <= s["ldp_epsilon_rdp_max"] <= exact * 1.3  # RDP: looser upper bound
    assert dp.epsilon() == pytest.approx(s["ldp_epsilon_rdp_max"])


def test_classic_gaussian_formula_overshoots_for_large_epsilon():
    """The reason the composed ε is reported beside the target: at ε = 10 the classic σ is too small."""
    dp = _ldp("gaussian", eps=10.0, t_l=1, delta=1e-4)
    _privatize(dp, FakeSim(3, np.array([0])), 1, np.array([0]), torch.zeros(1, 3))
    s = dp.summary()
    assert s["ldp_epsilon_pld_max"] > 10.0
    sens = 2 * 1.5 * 0.1 * 3 / 50
    assert s["ldp_epsilon_pld_max"] == pytest.approx(gdp_epsilon(sens / float(dp.scales[0]), 1e-4), rel=0.02)


def test_worst_client_is_the_max_over_clients():
    # three clients with different n_l and T_l; the analytic calibration puts each at its budget
    t_l, sizes = np.array([1, 4, 2]), np.array([30, 30, 60])
    dp = LocalDP("gaussian", 1.0, 1.0, 0.1, 1, t_l, sizes, delta=1e-5, calibration="analytic")
    for rnd in range(1, 5):
        ids = np.array([c for c in range(3) if dp.counts[c] < t_l[c]])
        _privatize(dp, FakeSim(3, ids), rnd, ids, torch.zeros(len(ids), 3))
    per_client = [dp._client_epsilon(c) for c in range(3)]
    assert dp.epsilon() == pytest.approx(max(per_client))
    pld = [dp._client_epsilon(c, "pld") for c in range(3)]
    assert all(e == pytest.approx(1.0, rel=0.02) for e in pld)  # every client ends at its budget
    assert dp.summary()["ldp_epsilon_pld_max"] == pytest.approx(max(pld))


# ------------------------------------------------------------------------------------------- state
def test_state_dict_round_trip_and_mismatch():
    dp = _ldp("laplace", clients=3, t_l=2)
    _privatize(dp, FakeSim(5, np.array([0, 2])), 1, np.array([0, 2]), torch.zeros(2, 5))
    state = dp.state_dict()
    fresh = _ldp("laplace", clients=3, t_l=2)
    fresh.load_state_dict(state)
    assert fresh.epsilon() == dp.epsilon() and fresh.summary() == dp.summary()
    with pytest.raises(ValueError, match="epsilon"):
        _ldp("laplace", eps=5.0, clients=3, t_l=2).load_state_dict(state)


def test_bad_arguments():
    with pytest.raises(ValueError, match="mechanism"):
        LocalDP("exponential", 1.0, 1.0, 0.1, 1, np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="delta"):
        LocalDP("gaussian", 1.0, 1.0, 0.1, 1, np.ones(2), np.ones(2), delta=None)
    with pytest.raises(ValueError, match="epsilon"):
        LocalDP("laplace", 0.0, 1.0, 0.1, 1, np.ones(2), np.ones(2))


def test_batch_clipping_and_proven_sensitivity_scales():
    """Deliberate choices: batch clipping has no 1/n_l (Δ = 2ζηE); 'proven' drops the non-expansive assumption."""
    t_l, n_l = np.array([2]), np.array([40])
    batch = LocalDP("laplace", 1.0, 1.0, 0.1, 3, t_l, n_l, clip_mode="batch")
    assert batch.scales[0] == pytest.approx(2 * 1.0 * 0.1 * 3 * 2 / 1.0)
    proven = LocalDP("laplace", 1.0, 1.0, 0.1, 3, t_l, n_l, nonexpansive=False)
    assert proven.scales[0] == pytest.approx((2 * 0.1 / 40 + 2 * 0.1 * 2) * 2 / 1.0)
    paper = LocalDP("laplace", 1.0, 1.0, 0.1, 3, t_l, n_l)
    assert paper.scales[0] == pytest.approx(paper_laplace(1.0, 0.1, 3, 2, 40, 1.0))
    assert paper.summary()["ldp_scale_formula_median"] == pytest.approx(paper.scales[0])
    assert proven.summary()["ldp_scale_formula_median"] == pytest.approx(paper.scales[0])  # the paper's, for reference


@pytest.mark.parametrize("ord_", [2, 1])
def test_trainer_respects_the_sensitivity_bound_on_linear_regression(ord_):
    """E full-batch steps with per-sample clipping on neighbouring datasets (one sample replaced by an extreme
    one) end within Δ = 2ζηE/n_l: the non-expansive 'paper' bound, proven in L2 for convex LR with η below 2/β,
    checked here in L1 too (the Laplace clip); without clipping the gap on this instance is ~100× larger."""
    from fedrun.models.flat import FlatParams
    from fedrun.models.nets import build_model
    from fedrun.privacy.local import sensitivity
    from fedrun.training import ClientData, LocalSpec, Trainer

    gen = torch.Generator().manual_seed(3)
    n, p, e, eta, zeta = 30, 4, 6, 0.1, 2.0
    x = torch.randn(2 * n, p, generator=gen) * 0.5
    y = torch.randn(2 * n, generator=gen) * 3 + 5
    x[n], y[n] = torch.full((p,), 4.0), torch.tensor(-40.0)  # the replacement sample
    parts = [np.arange(n), np.r_[n, np.arange(1, n)]]  # client 1 = client 0 with sample 0 replaced
    model = build_model("lr", in_features=p)
    layout = FlatParams(model)
    spec = LocalSpec(mode="gd", steps=e, lr=eta, clip_norm=zeta, loss="mse", clip_mode="per_sample", clip_ord=ord_)
    trainer = Trainer(model, layout, ClientData(x, y, parts), spec, seed=0)
    start = layout.flatten(model)
    (_, local, _), = list(trainer.train(start, [0, 1], rnd=1))
    gap = float((local[0] - local[1]).norm(p=ord_))
    assert gap > 0
    paper = sensitivity(zeta, eta, e, n, nonexpansive=True)
    # up to float32 round-off: e steps p − η·g on each model (≤ |p| per step), their difference, a norm of p terms
    scale = float((local[0].abs() + local[1].abs()).norm(p=ord_))
    slack = f32_tol(scale, terms=e + 2 + p)
    assert 0.3 * paper < gap <= paper + slack  # in L1 an empirical check on this instance (proven: L2)
    assert gap <= sensitivity(zeta, eta, e, n, nonexpansive=False)
