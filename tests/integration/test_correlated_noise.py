"""Correlated client-level DP noise (``noise=tree|sqrt_toeplitz|banded|blt``) under the participation schema of
``sampler=cyclic``: the noise the privatizer adds, the accountant's ε, the refusals, the audit and the ε line."""

import csv
import math

import numpy as np
import pytest
import torch

from fedrun.config import ConfigError
from fedrun.privacy.accounting import compute_epsilon
from fedrun.privacy.factorization import strategy
from fedrun.run import build, load, make_client_dp, make_sampler, prepare, privacy_report, run
from fedrun.sampling import CyclicSampler

# 40 clients in 8 groups of 5: each client in rounds g, g + 8, …; 10 rounds → k = 2 participations, b = 8 apart
CYCLIC = ["dp=true", "delta=1e-5", "num_clients=40", "clients_per_round=5", "sampler=cyclic", "clipping_norm=0.05",
          "dataset=mnist", "model=lenet5", "rounds=10"]


def _client_dp(fast_cfg, *extra):
    c = fast_cfg(*CYCLIC, *extra)
    prepare(c)
    cfg = load(c)
    _, sampler, factor, goal = make_sampler(cfg, cfg.num_clients)
    return make_client_dp(cfg, sampler, factor, goal)


def test_the_cyclic_sampler_enforces_its_schema():
    s = CyclicSampler(43, 5)  # 8 groups of 5 or 6
    rounds = 20
    seen = np.zeros((rounds, 43), dtype=bool)
    for t in range(1, rounds + 1):
        seen[t - 1, s.select(t, seed=3)] = True
    law = s.participation(rounds)
    k, b = law.k, law.b
    assert (k, b) == (3, 8)
    for client in range(43):
        when = np.flatnonzero(seen[:, client])
        assert 1 <= len(when) <= k and (np.diff(when) >= b).all()
    assert seen.sum(1).max() == s.max_cohort == 6 and seen[:8].sum() == 43  # every client once per cycle


@pytest.mark.parametrize("noise", ["independent", "tree", "sqrt_toeplitz", "banded", "blt"])
def test_epsilon_is_the_gaussian_of_sigma_over_the_schemas_sensitivity(fast_cfg, noise):
    """σ calibrated to ε = 1 over the run; the accountant's per-round events compose to the Gaussian with σ / s_T."""
    extra = ["noise.bands=4"] if noise == "banded" else []
    dp = _client_dp(fast_cfg, f"noise={noise}", "epsilon=1", *extra)
    k, b = dp.schema
    assert (k, b) == (2, 8)
    _, C, banded = strategy(noise, 10, k, b, bands=4 if noise == "banded" else None)
    from fedrun.privacy.factorization import sensitivity

    s = sensitivity(C, k, b, banded=banded)
    assert dp.sensitivities[-1] == pytest.approx(s, rel=1e-12)
    assert 0.99 <= compute_epsilon(dp.noise_multiplier / s, 1.0, 1, 1e-5) <= 1.0
    from fedrun.privacy.accounting import PrivacyAccountant

    acct = PrivacyAccountant(1e-5)
    for t in range(1, 11):
        if (e := dp.event(t)) is not None:
            acct.record(e)
    # Gaussian RDP adds exactly: the composed increments are the one Gaussian (float64 round-off of 10 terms)
    assert acct.epsilon("rdp") == pytest.approx(compute_epsilon(dp.noise_multiplier / s, 1.0, 1, 1e-5), rel=1e-9)
    assert acct.epsilon("pld") == pytest.approx(compute_epsilon(dp.noise_multiplier / s, 1.0, 1, 1e-5, "pld"),
                                                rel=1e-3)


def test_the_noise_added_is_c_inverse_z(fast_cfg):
    """With no clients' signal (σ given, S = 1 so Z's std is σ), the released noise X over T rounds has C·X with
    i.i.d. N(0, σ²) rows; independent rows X would not (C·Cᵀ ≠ I for the square root of A)."""
    c = fast_cfg(*CYCLIC, "noise=sqrt_toeplitz", "noise_multiplier=1.0", "epsilon=null", "clipping_norm=1.0")
    sim = build(c).sim
    pv = sim.privatizer
    T, dim = 10, 20_000
    X = []
    for t in range(1, T + 1):
        agg = pv.open(t, np.zeros(0, dtype=np.int64), np.zeros(0), dim)
        X.append(pv.close(t, agg).double() * pv.client_dp.expected_clients)
    X = torch.stack(X)
    C = torch.as_tensor(strategy("sqrt_toeplitz", T, 2, 8)[1])
    cov = (C @ X) @ (C @ X).T / dim  # ≈ I: each entry within 5 standard errors (√(2/dim) on the diagonal)
    assert torch.allclose(cov, torch.eye(T, dtype=torch.float64), atol=5 * math.sqrt(2 / dim))
    raw = X @ X.T / dim
    assert raw[1, 0] < -0.2  # the correlation is there: consecutive rounds' noise is anti-correlated


@pytest.mark.parametrize("extra,message", [
    (["noise=tree", "sampler=poisson", "epsilon=1"], "noise=tree needs sampler=cyclic"),
    (["noise=sqrt_toeplitz", "dp=false"], "noise=sqrt_toeplitz is client-level DP noise"),
    (["noise=banded", "noise.bands=0", "epsilon=1"], "noise.bands=0 is not allowed"),
    (["noise=blt", "noise.buffers=9", "epsilon=1"], "noise.buffers=9 is not allowed"),
    (["noise=banded", "noise.bands=12", "epsilon=1"], "bands"),
    (["noise=tree", "epsilon=1", "network=mobile"],
     "network.over_selection=1.3 needs a sampler that can draw more .*got sampler=cyclic"),
])
def test_correlated_noise_config_errors(fast_cfg, extra, message):
    with pytest.raises(ConfigError, match=message):
        _client_dp(fast_cfg, *extra)


def test_cfg_job_and_first_line_state_mechanism_schema_and_accountant(fast_cfg):
    line = privacy_report(fast_cfg(*CYCLIC, "noise=tree", "epsilon=1", "accountant=pld"))
    assert "noise=tree" in line and "k = 2" in line and "b = 8" in line and "PLD" in line
    assert "no amplification" in line and "ε = 0.99" in line


AUDITED = [*CYCLIC, "noise=sqrt_toeplitz", "epsilon=2", "audit.canaries=400", "rounds=8", "eval_every=8"]


def test_a_correlated_run_logs_epsilon_and_audits_below_it(fast_cfg, tmp_path):
    summary = run(fast_cfg(*AUDITED), out_dir=tmp_path)
    with open(tmp_path / "metrics.csv") as f:
        eps = [float(r["epsilon"]) for r in csv.DictReader(f)]
    assert eps == sorted(eps) and eps[-1] <= 2.0
    assert summary["audit_participations_mean"] == 1.0  # 8 rounds, 8 groups: each canary's group once
    assert 0 <= summary["audit_epsilon_lower"] < eps[-1]


def test_the_audit_catches_correlated_noise_left_out(fast_cfg, tmp_path, monkeypatch):
    """The same audited run with a privatizer that adds no noise while ε = 2 is still claimed (a test double): the
    canaries, taking part by the cyclic schema, give a lower bound above the claimed ε."""
    from fedrun.simulation import Privatizer

    monkeypatch.setattr(Privatizer, "noise_multiplier", property(lambda self: 0.0))
    summary = run(fast_cfg(*AUDITED), out_dir=tmp_path)
    assert summary["epsilon_final"] <= 2.0 < summary["audit_epsilon_lower"]


def test_a_round_that_releases_nothing_is_still_charged_under_a_schema(fast_cfg):
    """SecAgg may abort a round (nothing released). The events charge the growth of the prefix sensitivity, so an
    uncharged round would leave ε at √(s_T² − s_1²)-worth — below what the later releases can carry (a client of
    round 1's group takes part again b rounds later, and C's second column is longer than that). Every round is
    charged: after T rounds ε is the Gaussian with σ / s_T whatever was aborted."""
    c = fast_cfg(*CYCLIC, "noise=sqrt_toeplitz", "noise_multiplier=3.0", "epsilon=null")
    sim = build(c).sim
    pv, dp = sim.privatizer, sim.privatizer.client_dp
    pv.skip(1)  # round 1: aborted
    for t in range(2, 11):
        pv.close(t, pv.open(t, np.zeros(0, dtype=np.int64), np.zeros(0), 16))
    assert pv.accountant.epsilon("rdp") == pytest.approx(
        compute_epsilon(3.0 / dp.sensitivities[-1], 1.0, 1, 1e-5), rel=1e-9)
