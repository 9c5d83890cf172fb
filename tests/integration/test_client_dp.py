"""Client-level DP (dp=true) around a scheme: calibrated σ, ε per round, the errors."""

import csv
import math

import pytest
import torch

from fedrun.config import ConfigError
from fedrun.privacy.accounting import compute_epsilon
from fedrun.run import build, run
from tolerance import assert_f32_close

DP = ["dp=true", "delta=1e-5", "num_clients=40", "sample_rate=0.25", "clipping_norm=0.05"]


def test_fl_std_dp_logs_epsilon_per_round_ending_at_target(fast_cfg, tmp_path):
    summary = run(fast_cfg("dataset=mnist", "model=lenet5", "epsilon=1", "rounds=3", *DP), out_dir=tmp_path)
    with open(tmp_path / "metrics.csv") as f:
        eps = [float(r["epsilon"]) for r in csv.DictReader(f)]
    assert len(eps) == 3 and eps == sorted(eps) and 0 < eps[0]
    assert 0.99 <= eps[-1] <= 1.0
    assert summary["epsilon_rdp"] == pytest.approx(eps[-1])
    assert summary["epsilon_pld"] <= summary["epsilon_rdp"]
    # ε is what the accountant gives for the σ that was actually used
    sigma, q = summary["dp_noise_multiplier"], summary["dp_sampling_probability"]
    assert compute_epsilon(sigma, q, 3, 1e-5) == pytest.approx(eps[-1])


def test_noise_multiplier_given_reports_epsilon(fast_cfg, tmp_path):
    summary = run(fast_cfg("dataset=mnist", "model=lenet5", "noise_multiplier=1.2", "rounds=2", *DP), out_dir=tmp_path)
    assert summary["epsilon_final"] == pytest.approx(compute_epsilon(1.2, 0.25, 2, 1e-5))


def test_dp_aggregate_is_clip_sum_noise_over_expected_clients(fast_cfg):
    c = _plain(fast_cfg("dataset=mnist", "model=lenet5", "noise_multiplier=0.0", *DP))
    sim = build(c).sim
    w0 = sim.params.clone()
    clients = sim.select(1)
    # the local models the round aggregates (same training path; training itself is tested elsewhere),
    # then the reference in float64: clip to S = 0.05, sum, divide by E = q·N = 10, not by K
    local = torch.cat([m for _, m, _ in sim.train(clients, 1)])
    d = local.double() - w0.double()
    clipped = d * torch.clamp(0.05 / d.norm(dim=1, keepdim=True), max=1.0)
    assert (d.norm(dim=1) > 0.05).any() and len(clients) != 10  # the clip and the fixed denominator matter
    expected = w0.double() + clipped.sum(0) / (0.25 * 40)
    sim.run_round(1, clients)
    # float32 round-off of Δ = local − w0, its norm over n coordinates, the clip, the sum of K rows, ÷ E; + w0
    terms = len(clients) + math.ceil(math.log2(sim.n)) + 4
    assert_f32_close(sim.params, expected, (w0, 1), clipped.abs().sum(0) / 10, terms=terms)


@pytest.mark.parametrize("extra,message", [
    (["sampler=round_robin", "epsilon=1"], "dp=true needs a sampler that declares a participation law"),
    (["epsilon=1", "noise_multiplier=0.3"], "disagree"),
    (["epsilon=0"], "epsilon=0 is not allowed; use a number > 0"),
    (["epsilon=-1"], "epsilon=-1 is not allowed; use a number > 0"),
])
def test_dp_config_errors(fast_cfg, extra, message):
    with pytest.raises(ConfigError, match=message):
        build(_plain(fast_cfg("dataset=lending_club", *DP, *extra)))


def test_dp_without_a_budget_takes_the_default_epsilon(fast_cfg):
    from fedrun.config import DEFAULT_EPSILON
    from fedrun.run import prepare

    c = _plain(fast_cfg("dataset=lending_club", *DP))
    prepare(c)
    assert c["epsilon"] == DEFAULT_EPSILON == 1.0
    c = _plain(fast_cfg("dataset=lending_club", *DP, "noise_multiplier=0.5"))  # σ given: no ε is imposed
    prepare(c)
    assert c["epsilon"] is None and c["noise_multiplier"] == 0.5


def _plain(cfg):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


# ------------------------------------------------------------------- the noise of the DP path the runner takes
def _round_update(fast_cfg, sigma: float, clients=None, rounds: int = 1):
    """One round of FL-STD with client-level DP through the simulation's DP path: (update, sim, clients)."""
    sim = build(_plain(fast_cfg("dataset=mnist", "model=lenet5", f"noise_multiplier={sigma}", *DP))).sim
    w0 = sim.params.clone()
    clients = sim.select(1) if clients is None else clients
    sim.run_round(1, clients)
    return (sim.params - w0).double(), sim, clients


def test_noise_of_a_round_has_std_sigma_s_over_qn(fast_cfg):
    """Noised update − the same round's update without noise (same seed: same training) is the noise the DP sum
    added, ÷ q·N: per coordinate N(0, (σS/qN)²). Over n ≈ 44k coordinates the sample std is within
    5/√(2n) ≈ 1.7 % of σS/qN and the mean within 5·std/√n, with overwhelming probability; float32 round-off
    of the parameters (~1e-8 · |w|) is negligible at that scale. Fails if the noise is removed or scaled."""
    noisy, sim, clients = _round_update(fast_cfg, 1.0)
    clean, _, _ = _round_update(fast_cfg, 0.0, clients)
    residual = noisy - clean
    n, std = residual.numel(), 1.0 * 0.05 / (0.25 * 40)
    assert residual.std().item() == pytest.approx(std, rel=5 / math.sqrt(2 * n))
    assert abs(residual.mean().item()) < 5 * std / math.sqrt(n)
    assert len(sim.accountant.events) == 1  # one event for the round's one noised aggregation


def test_an_empty_round_is_pure_noise(fast_cfg):
    import numpy as np

    update, sim, _ = _round_update(fast_cfg, 1.5, clients=np.zeros(0, dtype=np.int64))
    n, std = update.numel(), 1.5 * 0.05 / (0.25 * 40)
    assert update.std().item() == pytest.approx(std, rel=5 / math.sqrt(2 * n))
    assert len(sim.accountant.events) == 1 and sim.epsilon() > 0  # an empty round is still a release


def test_clipping_bounds_each_clients_contribution(fast_cfg):
    """Without noise, one client's effect on the round's update has norm ≤ S/(qN), however far it trained."""
    import numpy as np

    cfg = ("dataset=mnist", "model=lenet5", "noise_multiplier=0.0", "lr=5", *DP)  # lr=5: far beyond S
    sim = build(_plain(fast_cfg(*cfg))).sim
    w0 = sim.params.clone()
    one = np.array([3])
    sim.run_round(1, one)
    bound = 0.05 / (0.25 * 40)
    # float32: the clip scales by S/‖Δ‖ (rounding ~n·u relative) and ÷ qN, added to w0 (round-off u·|w0|)
    assert (sim.params - w0).double().norm().item() <= bound * (1 + 1e-4) + 1e-7 * w0.norm().item()
    assert sim.privatizer.diagnostics["dp_clipped_fraction"] == 1.0


# ------------------------------------------------------------------------- a scheme cannot bypass the DP path
class Smuggler:
    """A scheme that tries to apply the raw, un-noised mean of the clients' updates through the public API: its
    client side keeps the raw updates on ``self`` and uploads zeros; its server side returns what was kept."""

    def __new__(cls, **kwargs):
        from fedrun.schemes.fedavg import FedAvg

        class _Smuggler(FedAvg):
            def encode(self, rnd, updates, state):
                self.raw = updates.clone()
                state.set("raw", updates)  # the client state is the clients' own: the server side never reads it
                return torch.zeros_like(updates)

            def decode(self, rnd, aggregate, exact=None):
                raw = getattr(self, "raw", None)
                return aggregate if raw is None else raw.mean(0)

        return _Smuggler(**kwargs)


def test_a_scheme_cannot_apply_an_unnoised_update(fast_cfg):
    """The round applies only what the DP aggregator released: with zero uploads that is pure noise (÷ qN), not
    the raw mean the scheme kept; and no hook of the scheme API receives the global parameters, the local models,
    the accountant or the simulation."""
    import inspect

    from fedrun.schemes.base import Env, Scheme

    c = _plain(fast_cfg("dataset=mnist", "model=lenet5", "noise_multiplier=1.0", *DP))
    c["scheme"] = {"_target_": f"{__name__}.Smuggler"}
    sim = build(c).sim
    clients = sim.select(1)
    w0 = sim.params.clone()
    raw = torch.cat([m for _, m, _ in sim.train(clients, 1)]) - w0
    sim.run_round(1, clients)
    applied = (sim.params - w0).double()
    assert len(clients) > 0 and not torch.allclose(applied, raw.double().mean(0), atol=1e-6)
    n, std = applied.numel(), 1.0 * 0.05 / (0.25 * 40)
    assert applied.std().item() == pytest.approx(std, rel=5 / math.sqrt(2 * n))  # the noise alone
    assert not hasattr(sim.scheme, "raw")
    hooks = ["setup", "encode", "decode", "query", "feedback"]
    names = {p for h in hooks for p in inspect.signature(getattr(Scheme, h)).parameters}
    assert names == {"self", "env", "rnd", "updates", "state", "aggregate", "exact", "sent", "values", "received"}
    assert all(f.type in ("int", "str", "float", "float | None", "torch.device")
               for f in __import__("dataclasses").fields(Env)), "Env carries only sizes and facts"


class _Recorder:
    """A tracker that keeps the tags and the final status."""

    run_id, where = None, "test"

    def __init__(self):
        self.tags, self.status, self.metrics = {}, None, []

    def check(self): pass
    def start(self, params, tags, run_name=None, run_id=None): self.tags.update(tags)
    def set_tags(self, tags): self.tags.update(tags)
    def log_metrics(self, metrics, step): self.metrics.append((step, dict(metrics)))
    def log_artifact(self, path): pass
    def last_step(self, metric): return 0
    def end(self, status="FINISHED"): self.status = status


def test_one_accountant_event_per_noised_aggregation(fast_cfg):
    sim = build(_plain(fast_cfg("dataset=mnist", "model=lenet5", "noise_multiplier=1.0", *DP))).sim
    for rnd in (1, 2, 3):
        sim.run_round(rnd)
        assert len(sim.accountant.events) == rnd


# ------------------------------------------------------------------------------ ε from the configured accountant
def test_pld_accountant_logs_pld_epsilon_within_budget(fast_cfg, tmp_path):
    """`accountant=pld epsilon=1`: σ calibrated with PLD, and the ε logged each round is PLD's (≤ 1), with
    epsilon_rdp beside it (RDP is looser: above PLD's)."""
    summary = run(fast_cfg("dataset=mnist", "model=lenet5", "epsilon=1", "accountant=pld", "rounds=3", *DP),
                  out_dir=tmp_path)
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    for r in rows:
        assert float(r["epsilon"]) == float(r["epsilon_pld"]) and float(r["epsilon_rdp"]) >= float(r["epsilon"])
    assert 0.99 <= summary["epsilon_final"] <= 1.0 and summary["epsilon_final"] == summary["epsilon_pld"]
    assert summary["epsilon_at_best"] <= 1.0


# ------------------------------------------------------------------------------- cohorts accounted as sampled
K_OF_N = ["sampler=uniform", "clients_per_round=4"]  # with DP's num_clients=40: fixed-size cohorts, 4 of 40


def _dp_accounting_fixed_size_epsilon(sigma: float, n: int, k: int, rounds: int, delta: float) -> float:
    """dp_accounting's own RDP of k-of-N sampling without replacement, replace-one neighbours; the clipped sum
    moves by up to 2S when one client's data is replaced, so the Gaussian's multiplier is σ/2."""
    import dp_accounting
    from dp_accounting import rdp

    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, k, dp_accounting.GaussianDpEvent(sigma / 2)), rounds)
    return acc.get_epsilon(delta)


def test_fixed_size_cohort_takes_k_clients_and_logs_its_epsilon_beside_poissons(fast_cfg, tmp_path, caplog):
    """sampler=uniform dp=true: every round has exactly k = 4 clients, the ε logged after round t is dp_accounting's
    RDP of t fixed-size rounds (replace-one) — fails if the run records the Poisson event —, and the start-up note
    gives that ε with the Poisson one at q = k/N beside it."""
    import logging

    caplog.set_level(logging.INFO, logger="fedrun")
    summary = run(fast_cfg("dataset=mnist", "model=lenet5", "noise_multiplier=1.3", "rounds=3", *DP, *K_OF_N),
                  out_dir=tmp_path)
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["clients"]) for r in rows] == [4.0, 4.0, 4.0]
    for t, r in enumerate(rows, 1):
        assert float(r["epsilon"]) == pytest.approx(_dp_accounting_fixed_size_epsilon(1.3, 40, 4, t, 1e-5), rel=1e-9)
    assert summary["dp_sampling_probability"] == 0.1
    assert summary["epsilon_rdp"] == pytest.approx(float(rows[-1]["epsilon"]))
    # dp_accounting's PLD has no event for a fixed-size cohort: no epsilon_pld (not the RDP value under its name)
    assert "epsilon_pld" not in summary and not any(r.get("epsilon_pld") for r in rows)
    eps, poisson = summary["epsilon_final"], compute_epsilon(1.3, 0.1, 3, 1e-5)
    notes = [m for m in caplog.messages if m.startswith("dp: fixed-size")]
    assert notes == [f"dp: fixed-size 4 of 40 per round, RDP (replace-one, sensitivity 2S): ε = {eps:.4g} after 3 "
                     f"rounds (σ = 1.3, δ = 1e-05); Poisson at q = 0.1 would give ε = {poisson:.4g} (RDP) / "
                     f"{compute_epsilon(1.3, 0.1, 3, 1e-5, 'pld'):.4g} (PLD) (add/remove-one)"]
    assert eps > poisson


def test_fixed_size_dp_aggregate_is_clip_sum_noise_over_k(fast_cfg):
    """The fixed-size DP sum divides by k (the cohort's size, fixed), not by q·N of the Poisson sample rate."""
    c = _plain(fast_cfg("dataset=mnist", "model=lenet5", "noise_multiplier=0.0", *DP, *K_OF_N))
    sim = build(c).sim
    w0 = sim.params.clone()
    clients = sim.select(1)
    assert len(clients) == 4 and sim.client_dp.expected_clients == 4.0
    local = torch.cat([m for _, m, _ in sim.train(clients, 1)])
    d = local.double() - w0.double()
    clipped = d * torch.clamp(0.05 / d.norm(dim=1, keepdim=True), max=1.0)
    expected = w0.double() + clipped.sum(0) / 4
    sim.run_round(1, clients)
    terms = len(clients) + math.ceil(math.log2(sim.n)) + 4
    assert_f32_close(sim.params, expected, (w0, 1), clipped.abs().sum(0) / 4, terms=terms)


def test_capped_poisson_cohort_runs_with_the_truncated_poisson_pld(fast_cfg, tmp_path):
    """sampler=poisson_capped accountant=pld: at most the cap per round, ε from the truncated-Poisson PLD, and the
    DP sum divided by E[min(Binomial(N, q), cap)] (each client's inclusion probability × N: unbiased)."""
    from scipy.stats import binom

    summary = run(fast_cfg("dataset=mnist", "model=lenet5", "noise_multiplier=1.0", "rounds=2", "accountant=pld",
                           "sampler=poisson_capped", "clients_per_round=8", *DP), out_dir=tmp_path)
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert all(float(r["clients"]) <= 8 for r in rows)
    capped = dict(sampling="capped_poisson", num_clients=40, cohort_size=8)
    assert summary["epsilon_final"] == pytest.approx(compute_epsilon(1.0, 0.25, 2, 1e-5, "pld", **capped), rel=1e-9)
    assert summary["epsilon_final"] > compute_epsilon(1.0, 0.25, 2, 1e-5, "pld")
    denominator = sum(min(j, 8) * binom.pmf(j, 40, 0.25) for j in range(41))
    assert float(rows[0]["dp_noise_std"]) == pytest.approx(1.0 * 0.05 / denominator, rel=1e-9)


@pytest.mark.parametrize("extra,message", [
    (["sampler=uniform", "accountant=pld"],
     "accountant=pld is not available with sampler=uniform (fixed_size cohorts): dp_accounting's PLD accountant has "
     "no event for sampling without replacement; allowed: accountant=rdp"),
    (["sampler=poisson_capped"],
     "accountant=rdp is not available with sampler=poisson_capped (capped_poisson cohorts): dp_accounting's RDP "
     "accountant has no bound for truncated Poisson sampling; allowed: accountant=pld"),
    (["sampler=uniform", "audit.canaries=4"],
     "audit.canaries=4 needs sampler=poisson or cyclic (each canary takes part like a client of those cohorts); "
     "got sampler=uniform; allowed: sampler=poisson|cyclic or audit.canaries=0"),
    (["sampler=all"], "dp=true needs a sampler that declares a participation law (the cohorts an accountant knows): "
                      "sampler=cyclic|poisson|poisson_capped|uniform; got sampler=all"),
])
def test_unsupported_sampling_and_accountant_pairs_are_refused_before_data_loads(fast_cfg, extra, message):
    from fedrun.run import prepare

    with pytest.raises(ConfigError) as err:
        prepare(_plain(fast_cfg("dataset=lending_club", *DP, "epsilon=1", *extra)))  # prepare loads no data
    assert str(err.value) == message


def test_dp_auto_stays_off_without_poisson_sampling(fast_cfg):
    from fedrun.run import prepare

    for sampler in ("uniform", "poisson_capped"):
        c = _plain(fast_cfg("dataset=mnist", "model=lenet5", "dp=auto", f"sampler={sampler}"))
        notes = prepare(c)
        assert c["dp"] is False and any("dp=auto turns client-level DP on with sampler=poisson only" in n
                                        for n in notes)
