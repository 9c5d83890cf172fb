"""Which local-DP sensitivity a run uses (``local_dp_sensitivity``; fedrun.privacy.local_dp.make_local_dp) and the check behind
the paper's: proven by default, the paper's 2ζηE/n_l only where η ≤ 2/β_l is verified on the run's data for the
linear model with the Gaussian (L2) mechanism, or on explicit request (``paper_unchecked``, run marked conditional).

β_l is checked against fedrun's own loss and training step (autograd Hessian; one GD step expands exactly when
η > 2/β_l), and the Laplace refusal against a client on which fedrun's training moves θ_E further in L1 than
the paper's L1 sensitivity allows while the L2 condition holds.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import compose
from fedrun.privacy.local_dp import LocalDP, make_local_dp
from fedrun.models.flat import FlatParams
from fedrun.models.nets import build_model
from fedrun.privacy.local import linear_mse_smoothness, nonexpansive_check, sensitivity
from fedrun.sampling import AllSampler
from fedrun.training import ClientData, LocalSpec, Trainer, _masked_loss
from tolerance import f32_tol

ZETA, E, T_L, EPS = 1.5, 3, 4, 2.0


def _clients(seed: int = 0, sizes=(30, 12, 50), scale=(1.0, 3.0, 0.5)):
    """Three clients with different feature scales (client 1 the least smooth), 3 features."""
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(n, 3)) * s + 0.3 for n, s in zip(sizes, scale)]
    x = np.concatenate(xs).astype(np.float32)
    bounds = np.cumsum([0, *sizes])
    parts = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    return x, parts


def _two_over_beta(x: np.ndarray) -> float:
    """Independent reference: 2/λ_max of the MSE Hessian (2/n)·X̃ᵀX̃, X̃ = [x, 1]."""
    xt = np.hstack([x.astype(np.float64), np.ones((len(x), 1))])
    return 2.0 / np.linalg.eigvalsh(2.0 * xt.T @ xt / len(x)).max()


def _make(sens: str | None, *, mechanism="gaussian", lr=0.05, steps=E, model="lr", loss="mse", clip_mode="per_sample",
          x=None, parts=None):
    if x is None:
        x, parts = _clients()
    from types import SimpleNamespace

    default = compose([]).local_dp_sensitivity  # conf/config.yaml's, the one default
    cfg = SimpleNamespace(dp=f"local_{mechanism}", epsilon=EPS, noise_multiplier=None, local_dp_calibration="classic",
                          local_dp_sensitivity=default if sens is None else sens, rounds=T_L, seed=0, delta=1e-4,
                          accountant="rdp", scheme_name="ldp_fedavg", model=model)
    spec = LocalSpec(mode="gd", steps=steps, lr=lr, clip_norm=ZETA, loss=loss, clip_mode=clip_mode,
                     clip_ord=1 if mechanism == "laplace" else 2)
    return make_local_dp(cfg, AllSampler(num_clients=len(parts)), parts, spec, x_train=x)


def _proven(n: int, lr: float) -> float:
    return 2 * ZETA * lr / n + 2 * ZETA * lr * (E - 1)


# ------------------------------------------------------------------------------------------- the default
def test_default_is_the_proven_sensitivity():
    """conf/config.yaml's default: Δ = 2ζη/n_l + 2ζη(E−1), not marked conditional."""
    assert compose([]).local_dp_sensitivity == "proven"
    for sens in (None, "proven"):
        dp = _make(sens, mechanism="laplace")
        assert dp.sens == pytest.approx([_proven(n, 0.05) for n in (30, 12, 50)])
        assert dp.scales == pytest.approx(dp.sens * T_L / EPS)
        s = dp.summary()
        assert s["ldp_sensitivity_nonexpansive"] == 0 and s["ldp_sensitivity_conditional"] == 0
        assert dp.tags()["dp.local_sensitivity"] == "proven"
        assert dp.tags()["dp.local_sensitivity_conditional"] == "false"


def test_fu21_presets_use_the_proven_sensitivity():
    for exp in ("fu21_lending_club", "fu21_femnist"):
        assert compose([f"experiment={exp}"]).local_dp_sensitivity == "proven"


# ------------------------------------------------------------------------------------------ β_l itself
def test_smoothness_is_the_hessian_of_fedruns_loss():
    """β_l = 2·λ_max(X̃ᵀX̃)/n_l equals λ_max of the autograd Hessian of the loss fedrun trains (float64)."""
    x, parts = _clients()
    for part in parts:
        xl = torch.as_tensor(x[part], dtype=torch.float64)
        y = torch.randn(len(part), dtype=torch.float64)
        model = build_model("lr", in_features=3).double()
        layout = FlatParams(model)
        ones = torch.ones(len(part), dtype=torch.float64)

        def loss(flat):
            params = layout.unflatten(flat)
            out = torch.func.functional_call(model, params, (xl,))
            return _masked_loss(out, y, ones, "mse")

        hess = torch.autograd.functional.hessian(loss, layout.flatten(model).double())
        assert linear_mse_smoothness(x[part]) == pytest.approx(float(torch.linalg.eigvalsh(hess).max()), rel=1e-12)
        assert 2 / linear_mse_smoothness(x[part]) == pytest.approx(_two_over_beta(x[part]), rel=1e-12)


@pytest.mark.parametrize("factor,expands", [(0.95, False), (1.05, True)])
def test_one_training_step_expands_exactly_above_two_over_beta(factor, expands):
    """fedrun's full-batch step G(θ) = θ − η∇F(θ) on two starts that differ along the top eigenvector: the
    distance is multiplied by |1 − ηβ| — ≤ 1 for η ≤ 2/β (non-expansive), > 1 above."""
    x, parts = _clients()
    part = parts[1]
    xl, y = torch.as_tensor(x[part]), torch.randn(len(part), generator=torch.Generator().manual_seed(1))
    beta = linear_mse_smoothness(x[part])
    eta = factor * 2 / beta
    model = build_model("lr", in_features=3)
    layout = FlatParams(model)
    spec = LocalSpec(mode="gd", steps=1, lr=eta, clip_norm=None, loss="mse")
    trainer = Trainer(model, layout, ClientData(xl, y, [np.arange(len(part))]), spec, seed=0)
    xt = np.hstack([x[part].astype(np.float64), np.ones((len(part), 1))])
    top = torch.as_tensor(np.linalg.eigh(xt.T @ xt)[1][:, -1], dtype=torch.float32)
    start = layout.flatten(model).detach()
    (_, a, _), = list(trainer.train(start, [0], rnd=1))
    (_, b, _), = list(trainer.train(start + top, [0], rnd=1))
    ratio = float((a - b).norm()) / float(top.norm())
    assert ratio == pytest.approx(abs(1 - eta * beta), abs=1e-4)
    assert (ratio > 1) == expands


# ------------------------------------------------------------------------------ paper: checked or refused
def test_paper_accepted_where_the_check_holds():
    """Gaussian, linear model, η ≤ min 2/β_l: the paper's 2ζηE/n_l, not conditional; min 2/β_l in the summary."""
    x, parts = _clients()
    limits = [_two_over_beta(x[p]) for p in parts]
    worst = int(np.argmin(limits))
    lr = 0.99 * min(limits)
    dp = _make("paper", lr=lr)
    assert dp.sens == pytest.approx([2 * ZETA * lr * E / n for n in (30, 12, 50)])
    s = dp.summary()
    assert s["ldp_sensitivity_nonexpansive"] == 1 and s["ldp_sensitivity_conditional"] == 0
    assert s["ldp_two_over_beta_min"] == pytest.approx(min(limits), rel=1e-12)
    assert s["ldp_two_over_beta_min_client"] == worst
    tags = dp.tags()
    assert tags["dp.local_sensitivity"] == "paper" and tags["dp.local_sensitivity_conditional"] == "false"
    assert "checked" in tags["dp.local_sensitivity_reason"]


def test_paper_refused_where_one_client_fails_the_check():
    """One line naming the worst client, its 2/β_l, η and the alternatives."""
    x, parts = _clients()
    limits = [_two_over_beta(x[p]) for p in parts]
    worst = int(np.argmin(limits))
    lr = 1.01 * min(limits)
    assert lr < sorted(limits)[1]  # only the worst client fails
    with pytest.raises(ValueError) as err:
        _make("paper", lr=lr)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"client {worst} (n_l={len(parts[worst])}) has 2/β_l={min(limits):.4g} < lr={lr:g}" in msg
    assert "local_dp_sensitivity=proven" in msg and "paper_unchecked" in msg


def test_paper_refused_for_laplace_even_where_the_l2_check_holds():
    x, parts = _clients()
    lr = 0.5 * min(_two_over_beta(x[p]) for p in parts)
    with pytest.raises(ValueError, match=r"L2 argument that does not bound the L1 sensitivity the Laplace") as err:
        _make("paper", mechanism="laplace", lr=lr)
    assert "proven" in str(err.value) and "paper_unchecked" in str(err.value)


@pytest.mark.parametrize("model,loss", [("femnist_cnn", "cross_entropy"), ("lenet5", "cross_entropy")])
def test_paper_refused_where_the_condition_cannot_be_checked(model, loss):
    with pytest.raises(ValueError, match=f"only for model=lr .*not model={model}; use local_dp_sensitivity=proven"):
        _make("paper", model=model, loss=loss)


@pytest.mark.parametrize("kw", [dict(steps=1), dict(clip_mode="batch")])
def test_paper_needs_no_check_where_it_equals_the_proven_value(kw):
    """E = 1 or batch clipping: the two sensitivities coincide, so `paper` is proven whatever the model/mechanism."""
    dp = _make("paper", mechanism="laplace", model="femnist_cnn", loss="cross_entropy", lr=10.0, **kw)
    ref = [sensitivity(ZETA, 10.0, kw.get("steps", E), n, kw.get("clip_mode", "per_sample")) for n in (30, 12, 50)]
    assert dp.sens == pytest.approx(ref)
    assert dp.summary()["ldp_sensitivity_conditional"] == 0


def test_paper_unchecked_is_marked_conditional_and_warned(caplog):
    x, parts = _clients()
    lr = 2 * max(_two_over_beta(x[p]) for p in parts)  # every client fails the condition
    with caplog.at_level(logging.WARNING, logger="fedrun"):
        dp = _make("paper_unchecked", mechanism="laplace", lr=lr)
    assert dp.sens == pytest.approx([2 * ZETA * lr * E / n for n in (30, 12, 50)])
    s = dp.summary()
    assert s["ldp_sensitivity_nonexpansive"] == 1 and s["ldp_sensitivity_conditional"] == 1
    tags = dp.tags()
    assert tags["dp.local_sensitivity"] == "paper_unchecked" and tags["dp.local_sensitivity_conditional"] == "true"
    reason = tags["dp.local_sensitivity_reason"]
    assert "not checked" in reason and "L1" in reason and f"lr={lr:g} >" in reason
    assert any("paper_unchecked" in r.getMessage() and "conditional" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)
    cnn = _make("paper_unchecked", model="femnist_cnn", loss="cross_entropy").tags()["dp.local_sensitivity_reason"]
    assert "cannot be checked for model=femnist_cnn" in cnn


def test_unknown_value_refused():
    with pytest.raises(ValueError, match="local_dp_sensitivity='exact' is not allowed; use proven, paper, "
                                          "paper_unchecked"):
        _make("exact")


def test_localdp_built_directly_with_the_paper_value_counts_as_unchecked():
    dp = LocalDP("laplace", EPS, ZETA, 0.1, E, np.full(2, T_L), np.array([10, 20]))
    assert dp.summary()["ldp_sensitivity_conditional"] == 1
    one_step = LocalDP("laplace", EPS, ZETA, 0.1, 1, np.full(2, T_L), np.array([10, 20]))
    assert one_step.summary()["ldp_sensitivity_conditional"] == 0


# ------------------------------------------------------------------------- why Laplace is refused: L1
def test_paper_l1_sensitivity_exceeded_although_the_l2_condition_holds():
    """A client on which fedrun's training (per-sample L1 clip ζ, E full-batch steps, η ≤ 2/β) moves θ_E further
    in L1 than the paper's L1 sensitivity 2ζηE/n_l when one sample is replaced — while the L2 move stays within
    the same bound (the non-expansive argument, an L2 one) and the L1 move within the proven bound."""
    gen = torch.Generator().manual_seed(0)
    n, e, zeta = 20, 3, 1.0
    x = 2.0 + 0.3 * torch.randn(n + 1, 1, generator=gen)  # correlated with the bias column
    y = 0.02 * torch.randn(n + 1, generator=gen)
    x[0], y[0] = 0.0, 10.0
    x[n], y[n] = 0.0, -10.0  # the replacement of sample 0: its clipped gradient flips along the bias
    parts = [np.arange(n), np.r_[n, np.arange(1, n)]]
    check = nonexpansive_check(x.numpy(), parts, 1.0, [0])
    eta = 0.95 * check.min_two_over_beta  # the paper's L2 condition holds on the client's data
    model = build_model("lr", in_features=1)
    layout = FlatParams(model)
    spec = LocalSpec(mode="gd", steps=e, lr=eta, clip_norm=zeta, loss="mse", clip_mode="per_sample", clip_ord=1)
    trainer = Trainer(model, layout, ClientData(x, y, parts), spec, seed=0)
    (_, local, _), = list(trainer.train(torch.zeros(2), [0, 1], rnd=1))
    gap = (local[0] - local[1]).double()
    paper = sensitivity(zeta, eta, e, n, nonexpansive=True)
    slack = f32_tol(float((local[0].abs() + local[1].abs()).norm(p=1)), terms=e + 4)
    assert float(gap.norm(p=2)) <= paper + slack
    assert float(gap.norm(p=1)) > 1.1 * paper  # 1.14× here: the paper's Δ is not an L1 sensitivity
    assert float(gap.norm(p=1)) <= sensitivity(zeta, eta, e, n) + slack


# ---------------------------------------------------------------------------------- the real Lending Club
def test_lending_club_state_fails_the_check_at_the_papers_step(shared_data):
    """On the real data (50 states) client 32 (n_l = 107) has 2/β_l ≈ 0.171 < η = 0.2: `paper` is refused; at
    η = 0.17 the Gaussian run is accepted with the paper's sensitivity; the default run logs the same min 2/β_l."""
    from fedrun.run import build

    def cfg(*extra):
        return OmegaConf.to_container(compose(["experiment=fu21_lending_club", f"data_root={shared_data}",
                                               "tracking=none", "progress=off", *extra]), resolve=True)

    gauss = ["dp=local_gaussian", "delta=1e-4", "local_dp_sensitivity=paper"]
    with pytest.raises(ValueError, match=r"client 32 \(n_l=107\) has 2/β_l=0.1709 < lr=0.2; use lr ≤ 0.1709"):
        build(cfg(*gauss))
    with pytest.raises(ValueError, match="Laplace mechanism needs.*lr=0.2 > min 2/β_l=0.1709 \\(client 32"):
        build(cfg("local_dp_sensitivity=paper"))
    ok = build(cfg(*gauss, "lr=0.17")).sim.local_dp.summary()
    assert ok["ldp_sensitivity_nonexpansive"] == 1 and ok["ldp_sensitivity_conditional"] == 0
    assert ok["ldp_two_over_beta_min"] == pytest.approx(0.17086, abs=1e-5) and ok["ldp_two_over_beta_min_client"] == 32
    default = build(cfg()).sim.local_dp
    assert default.sensitivity_choice.name == "proven"
    assert default.summary()["ldp_two_over_beta_min"] == pytest.approx(ok["ldp_two_over_beta_min"], rel=1e-12)
