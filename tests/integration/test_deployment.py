"""network= and secagg= in the one round (fedrun/deployment.py): the clock against its closed form, dropouts and
over-selection against the accountant, SecAgg's bytes, field sum and refusals, the ε report at config time."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fedrun.checkpoint import config_hash
from fedrun.config import ConfigError
from fedrun.privacy.accounting import compute_epsilon
from fedrun.run import build, prepare, privacy_report, run
from fedrun.secagg import secagg_cost

MNIST = ["dataset=mnist", "model=lenet5"]
DP = ["dp=true", "noise_multiplier=1.0", "clipping_norm=0.05", "num_clients=40", "sample_rate=0.25"]


def _plain(cfg):
    return OmegaConf.to_container(cfg, resolve=True)


def test_datacenter_clock_is_download_compute_upload(fast_cfg):
    """Constant devices: every client's round is L + 8·4n/B↓ + F·steps·B/FLOPS + L + 8·4n/B↑ (fl_std sends n floats)."""
    sim = build(_plain(fast_cfg(*MNIST, "network=datacenter"))).sim
    dep = sim.deployment
    m = sim.run_round(1)
    n, flops = sim.n, dep.flops_per_sample
    latency, bw, speed = 0.0005, 25e9, 19.5e12
    download = latency + 8 * 4 * n / bw
    compute = flops * 2 * 10 / speed  # local_steps = 2, batch_size = 10
    upload = latency + 8 * 4 * n / bw
    assert m["clock_download_s"] == pytest.approx(download, rel=1e-12)
    assert m["clock_compute_s"] == pytest.approx(compute, rel=1e-12)
    assert m["clock_upload_s"] == pytest.approx(upload, rel=1e-12)
    assert m["clock_round_s"] - m["clock_server_s"] == pytest.approx(download + compute + upload, rel=1e-12)
    assert m["sim_time_s"] == m["clock_round_s"] > 0
    m2 = sim.run_round(2)
    assert m2["sim_time_s"] == pytest.approx(m["sim_time_s"] + m2["clock_round_s"], rel=1e-12)


def test_training_flops_per_sample_of_a_linear_layer_is_4dc():
    """Forward x·W (2dc FLOPs) and the weight gradient (2dc); no input gradient: 4dc."""
    from fedrun.deployment import train_flops_per_sample

    d, c = 37, 5
    layer = torch.nn.Linear(d, c)
    assert train_flops_per_sample(layer, torch.randn(1, d), torch.tensor([2]), "cross_entropy") == 4 * d * c
    assert layer.weight.grad is None  # the count leaves no gradient behind


def test_network_none_changes_nothing(fast_cfg, tmp_path):
    c = _plain(fast_cfg(*MNIST))
    prepare(c)
    assert c["network"] == {"name": "none"} and c["secagg"] == {"name": "none"}
    before = {k: v for k, v in c.items() if k not in ("network", "secagg")}
    assert config_hash(c) == config_hash(before)  # hashes of runs made before network=/secagg= existed still match
    assert build(c).sim.deployment is None
    assert "sim_time_s" not in run(fast_cfg(*MNIST, "rounds=1"), out_dir=tmp_path)


def test_dropouts_keep_q_and_the_denominator(fast_cfg):
    """A client that drops after being sampled only lowers its inclusion probability: the accountant keeps q, the
    DP sum keeps its public denominator qN, and fewer clients are summed."""
    sim = build(_plain(fast_cfg(*MNIST, *DP, "network=datacenter", "network.availability=0.5"))).sim
    assert sim.sampler.probability == 0.25
    assert sim.client_dp.sampling_probability == 0.25 and sim.client_dp.expected_clients == 10
    selected = len(sim.select(1))
    m = sim.run_round(1)
    assert m["clients"] + m["clock_dropped"] == selected and m["clock_dropped"] > 0
    assert sim.accountant.epsilon() == pytest.approx(compute_epsilon(1.0, 0.25, 1, 1e-5))


def test_over_selection_is_accounted_at_the_raised_rate(fast_cfg):
    """Over-selecting f = 1.6 raises every client's inclusion probability to f·q: the sampler draws at it, the
    accountant charges it; the sum's denominator stays the target cohort q·N, and a round closes at the goal. A
    report goal lets an added client push out a kept one (the sum moves by up to 2S): the event is charged at σ/2."""
    sim = build(_plain(fast_cfg(*MNIST, *DP, "network=datacenter", "network.over_selection=1.6"))).sim
    assert sim.sampler.probability == pytest.approx(0.4)
    assert sim.client_dp.sampling_probability == pytest.approx(0.4)
    assert sim.client_dp.expected_clients == pytest.approx(10)
    assert sim.deployment.report_goal == 10
    m = sim.run_round(1)
    assert m["clients"] <= 10 and m["clients"] + m["clock_discarded"] == len(sim.select(1))
    assert sim.client_dp.add_remove_sensitivity == 2
    assert sim.accountant.epsilon() == pytest.approx(compute_epsilon(0.5, 0.4, 1, 1e-5))
    assert sim.accountant.epsilon() > compute_epsilon(1.0, 0.4, 1, 1e-5) > compute_epsilon(1.0, 0.25, 1, 1e-5)


def test_a_report_goal_calibrates_sigma_for_2s(fast_cfg):
    """With epsilon given, σ is calibrated for the report goal's sensitivity 2S: twice the σ that S would need, and
    the run's first line says so (the ε that holds)."""
    from fedrun.privacy.accounting import calibrate_noise_multiplier

    c = ("epsilon=1", "delta=1e-5", "rounds=20", "clipping_norm=0.05", "dp=true", "num_clients=40", "sample_rate=0.25")
    sim = build(_plain(fast_cfg(*MNIST, *c, "network=mobile"))).sim
    unit = calibrate_noise_multiplier(1.0, 0.25 * 1.3, 20, 1e-5, "rdp")
    assert sim.client_dp.noise_multiplier == pytest.approx(2 * unit)
    assert sim.client_dp.charged_noise_multiplier == pytest.approx(unit)


def test_secagg_bytes_and_field_sum(fast_cfg):
    """SecAgg+: the masked vector at 32 bits per coordinate is the upload, the protocol's bytes are in the ledger
    apart, and the model moves by the field sum: within the quantisation bound of the real sum."""
    plain = build(_plain(fast_cfg(*MNIST))).sim
    sa = build(_plain(fast_cfg(*MNIST, "secagg=secagg_plus", "secagg.clip=0.5", "secagg.bits=24"))).sim
    clients = plain.select(1)
    K, n = len(clients), plain.n
    before = plain.params.clone()
    plain.run_round(1, clients)
    m = sa.run_round(1, clients)
    cost = secagg_cost("secagg_plus", K, n, 24, 0.33, 0.05)
    assert sa.ledger.metrics()["uplink_bytes"] == K * math.ceil(n * 24 / 8)
    assert m["secagg_uplink_bytes"] == K * cost.client_uplink_bytes
    assert m["secagg_downlink_bytes"] == K * cost.client_downlink_bytes
    assert sa.ledger.metrics()["secagg_uplink_bytes_total"] == K * cost.client_uplink_bytes
    # the field's sum differs from the real one (24 bits quantise), but by at most the bound
    assert 0 < m["secagg_quantization_error"] <= m["secagg_quantization_bound"]
    diff = (sa.params - plain.params).abs().max().item()
    assert 0 < diff <= m["secagg_quantization_bound"] + 4 * 2.0 ** -24 * before.abs().max().item()


def test_secagg_round_below_its_threshold_fails_and_releases_nothing(fast_cfg):
    # without client-level DP: its abort bit at availability 0.3 is refused (tests/integration/test_abort_charge.py)
    sim = build(_plain(fast_cfg(*MNIST, "dp=false", "num_clients=40", "sample_rate=0.25", "network=datacenter",
                                "network.availability=0.3", "secagg=secagg", "secagg.clip=1", "secagg.dropout=0.1"))).sim
    before = sim.params.clone()
    m = sim.run_round(1)
    assert m["secagg_failed"] == 1 and m["clients"] == 0
    assert torch.equal(sim.params, before)
    assert m["sim_time_s"] > 0 and m["secagg_uplink_bytes"] > 0  # the time and the bytes were spent


@pytest.mark.parametrize("extra,message", [
    (["scheme=topk", "secagg=secagg", "secagg.clip=1"], "must be linear"),
    (["secagg=secagg"], "secagg.clip=None"),
    (["secagg=secagg", "secagg.clip=1", "secagg.bits=7"], r"secagg.bits=7 is not allowed; use an integer in \[8, 62\]"),
    (["secagg=secagg_plus", "secagg.clip=1", "secagg.dropout=0.6", "secagg.corrupt=0.4"], "secagg=secagg_plus: "),
    (["network=mobile", "network.availability=0"], "network.availability"),
    (["network=mobile", "network.over_selection=1.5", "sampler=round_robin"], "needs a sampler that can draw more"),
])
def test_deployment_config_errors(fast_cfg, extra, message):
    with pytest.raises(ConfigError, match=message):
        prepare(_plain(fast_cfg(*MNIST, *extra)))


def test_fbftl_refuses_the_clock(fast_cfg):
    with pytest.raises(ConfigError, match="FbFTL's protocol"):
        prepare(_plain(fast_cfg("scheme=fbftl", "network=mobile")))


def test_config_time_report_shows_both_samplings(fast_cfg):
    poisson = privacy_report(_plain(fast_cfg(*MNIST, *DP)))
    assert f"ε = {compute_epsilon(1.0, 0.25, 2, 1e-5):.4g}" in poisson and "fixed-size cohort of 10 of 40" in poisson
    fixed = privacy_report(_plain(fast_cfg(*MNIST, *DP, "sampler=uniform", "clients_per_round=10")))
    assert fixed.startswith("dp: fixed-size 10 of 40") and "Poisson at q = 0.25 would give" in fixed
    with pytest.raises(ConfigError, match="accountant=pld is not available with sampler=uniform"):
        privacy_report(_plain(fast_cfg(*MNIST, *DP, "sampler=uniform", "accountant=pld")))


def test_over_selected_round_ends_at_the_goal_th_report(fast_cfg):
    """Heterogeneous devices (mobile): the round closes when the target cohort has reported — at the goal-th
    fastest completed client, not the slowest — and only those first reports are summed."""
    sim = build(_plain(fast_cfg(*MNIST, "num_clients=40", "sample_rate=0.25", "network=mobile",
                                "network.over_selection=1.6", "network.availability=1.0"))).sim
    dep = sim.deployment
    selected = sim.select(1)
    m = sim.run_round(1)
    t = dep._timing
    finish = np.sort(t.total_s[t.completed])
    assert len(finish) > dep.report_goal == 10 and m["clients"] == 10
    assert m["clock_round_s"] - m["clock_server_s"] == pytest.approx(finish[9], rel=1e-12)
    assert finish[9] < finish[-1]
    assert set(selected[dep.done]) == set(selected[np.argsort(t.total_s)[:10]])


def _sim_times(out_dir):
    import csv

    with open(out_dir / "metrics.csv") as f:
        return [(row["round"], row["sim_time_s"], row["clock_server_s"]) for row in csv.DictReader(f)]


def test_the_same_command_gives_the_same_clock(fast_cfg, tmp_path):
    """The clock is a model, not a measurement: the same command twice gives the same sim_time_s in every round, to
    the bit — FL-CS's L1 decoder included, whose host time differs from run to run (it is logged apart)."""
    args = (*MNIST, "scheme=fl_cs", "r=0.1", "network=datacenter", "rounds=3")
    run(fast_cfg(*args), out_dir=tmp_path / "a")
    run(fast_cfg(*args), out_dir=tmp_path / "b")
    first, second = _sim_times(tmp_path / "a"), _sim_times(tmp_path / "b")
    assert len(first) == 3 and all(float(t) > 0 for _, t, _ in first)
    assert first == second


def test_server_time_is_the_schemes_flops_at_the_server_speed(fast_cfg):
    sim = build(_plain(fast_cfg(*MNIST, "scheme=fl_cs", "r=0.1", "network=datacenter"))).sim
    m = sim.run_round(1)
    assert m["clock_server_flops"] == sim.scheme.server_flops(sim.n)
    assert m["clock_server_s"] == m["clock_server_flops"] / 19.5e12  # the A100 of conf/network/datacenter.yaml
    assert m["clock_host_server_s"] > 0  # measured, a diagnostic beside the clock
    assert m["clock_round_s"] == pytest.approx(m["clock_download_s"] + m["clock_compute_s"] + m["clock_upload_s"]
                                               + m["clock_server_s"], rel=1e-12)


def test_secagg_crypto_and_round_trips_on_the_clock(fast_cfg):
    """SecAgg on the datacenter profile (no dropouts): each client pays 2d key agreements and d + 1 PRG-expanded masks
    of m coordinates, the server each survivor's own mask; 3 rounds × 2 RTTs are added to every client's time."""
    sim = build(_plain(fast_cfg(*MNIST, "network=datacenter", "secagg=secagg", "secagg.clip=0.5"))).sim
    clients = sim.select(1)
    n, dim, speed, latency = len(clients), sim.n, 19.5e12, 0.0005
    A, G, d = 9.75e8, 19500.0, n - 1
    m = sim.run_round(1, clients)
    train = sim.deployment.flops_per_sample * 2 * 10
    assert m["clock_compute_s"] == pytest.approx((train + 2 * d * A + (d + 1) * dim * G) / speed, rel=1e-12)
    assert m["clock_server_flops"] == pytest.approx(sim.scheme.server_flops(dim) + n * dim * G, rel=1e-12)
    t = sim.deployment._timing
    extra = t.total_s - t.download_s - t.compute_s - t.upload_s
    assert extra == pytest.approx(np.full(n, 3 * 2 * latency), rel=1e-12)


def test_secagg_refuses_a_codec_whose_instance_asks_for_a_second_exchange(fast_cfg):
    """HEAPRIX-exact sets ``queries`` on the instance (the class says False): refused in one line by prepare(),
    before any data is loaded; the one-exchange HEAPRIX is linear and accepted."""
    from fedrun.resolve import check_secagg_codec
    from fedrun.schemes.sketch import FedSketch

    heaprix = ["scheme=fedsketch", "scheme.unsketch=heaprix", "secagg=secagg", "secagg.clip=1", "data_root=/absent"]
    with pytest.raises(ConfigError, match=r"^secagg=secagg .*scheme=fedsketch: it asks for a second exchange"):
        prepare(_plain(fast_cfg(*MNIST, *heaprix)))
    prepare(_plain(fast_cfg(*MNIST, *heaprix, "scheme.heavy_values=sketch")))
    check_secagg_codec("secagg", "fedsketch", FedSketch)  # the class alone does not tell
    with pytest.raises(ConfigError, match="second exchange"):  # build()'s own check, on the instance
        check_secagg_codec("secagg_plus", "fedsketch", FedSketch(unsketch="heaprix"))


def test_secagg_round_of_fewer_than_two_clients_fails_without_a_traceback(fast_cfg, tmp_path):
    """One client (or none) cannot run SecAgg: the round fails as the protocol's would — nothing released, the model
    stays, secagg_failed = 1 — and the run goes on (it used to end in secagg_cost's 'clients ≥ 2' traceback)."""
    sim = build(_plain(fast_cfg(*MNIST, "secagg=secagg_plus", "secagg.clip=1.0", "num_clients=20",
                                "sample_rate=0.05"))).sim
    before = sim.params.clone()
    for rnd, clients in ((1, [3]), (2, [])):
        m = sim.run_round(rnd, np.array(clients, dtype=np.int64))
        assert m["secagg_failed"] == 1 and m["clients"] == 0 and m["secagg_uplink_bytes"] == 0
        assert sim.ledger.metrics()["uplink_bytes"] == 0
        assert torch.equal(sim.params, before)
    summary = run(fast_cfg(*MNIST, "secagg=secagg", "secagg.clip=1.0", "sampler=uniform", "clients_per_round=1",
                           "rounds=2"), out_dir=tmp_path)
    assert summary["secagg_failed_rounds"] == 2


MASKED_ROUND = [*MNIST, "num_clients=40", "sample_rate=0.25", "network=mobile", "network.over_selection=1.6",
                "network.availability=0.9", "secagg=secagg", "secagg.clip=1", "secagg.dropout=0.2", "seed=0"]


def _recomputed_ledger(sim, selected, m):
    """The round's uplink from the per-client facts: every selected client advertised keys and sent its share
    ciphertexts; every client whose upload completed (kept or discarded) sent its masked vector; those same
    clients sent their Unmasking shares, unless the round failed at the threshold first."""
    K, S, G = 33, 36, 12 + 16
    t, dep = sim.deployment._timing, sim.deployment
    n, completed, kept = len(selected), int(t.completed.sum()), int(dep.done.sum())
    d = secagg_cost("secagg", n, 1, 32, 0.2).neighbours if dep.secagg else 0
    unmasking = 0 if m.get("secagg_failed") else completed
    vector = math.ceil(sim.n * 32 / 8) if dep.secagg else 4 * sim.n
    return {"secagg_up": n * (2 * K + d * (2 * S + G)) + unmasking * (d + 1) * S,
            "secagg_down": n * (d * 2 * K + d * (2 * S + G)),
            "uplink": completed * vector, "discarded": (completed - kept) * vector, "completed": completed,
            "kept": kept, "dropped": n - completed}


def test_discarded_reports_are_alive_for_the_threshold_and_charged_as_sent(fast_cfg):
    """Over-selection with a report goal: 13 selected, 1 drops, 12 complete, the first 10 are kept and 2 discarded;
    SecAgg needs 13 − ⌊0.2·13⌋ = 11. The discarded clients are alive and answer Unmasking, so the round holds (it
    failed when they counted as dropouts), and the ledger charges what was really sent (recomputed per client)."""
    sim = build(_plain(fast_cfg(*MASKED_ROUND))).sim
    selected = sim.select(1)
    m = sim.run_round(1)
    want = _recomputed_ledger(sim, selected, m)
    assert (len(selected), want["dropped"], want["completed"], want["kept"]) == (13, 1, 12, 10)
    assert m["secagg_min_survivors"] == 11 and m["secagg_survivors"] == 12
    assert m["secagg_failed"] == 0 and m["clients"] == 10
    assert m["secagg_uplink_bytes"] == sim.ledger.secagg_uplink_total == want["secagg_up"]
    assert m["secagg_downlink_bytes"] == want["secagg_down"]
    assert sim.ledger.metrics()["uplink_bytes"] == want["uplink"]
    assert sim.ledger.by_kind["up:discarded"] == want["discarded"] > 0
    # a round that fails at the threshold: the masked vectors were sent, no Unmasking share was
    failing = build(_plain(fast_cfg(*MASKED_ROUND, "network.availability=0.85"))).sim
    selected = failing.select(1)
    m = failing.run_round(1)
    want = _recomputed_ledger(failing, selected, m)
    assert m["secagg_failed"] == 1 and want["completed"] < m["secagg_min_survivors"]
    assert m["secagg_uplink_bytes"] == want["secagg_up"] and failing.ledger.metrics()["uplink_bytes"] == want["uplink"]
    # without SecAgg the discarded reports were uploaded all the same
    plain = build(_plain(fast_cfg(*MASKED_ROUND[:-4], "seed=0"))).sim
    selected = plain.select(1)
    m = plain.run_round(1)
    want = _recomputed_ledger(plain, selected, m)
    assert m["clients"] == want["kept"] == 10 and want["discarded"] > 0
    assert plain.ledger.metrics()["uplink_bytes"] == want["uplink"]
    assert plain.ledger.by_kind["up:discarded"] == want["discarded"]


@pytest.mark.parametrize("extra,bound", [
    (["sampler=poisson"], 40),                                          # N
    (["sampler=uniform", "clients_per_round=7"], 7),                    # k
    (["sampler=poisson_capped", "clients_per_round=7"], 7),             # the cap
    (["sampler=uniform", "clients_per_round=7", "network=datacenter", "network.over_selection=2.0"], 7),  # the goal
    (["sampler=poisson", *DP[:3], "audit.canaries=3", "sample_rate=0.5"], 43),  # N + the canaries (q: a negligible
                                                                    # SecAgg abort bit, fedrun/privacy/abort.py)
])
def test_the_fields_bound_is_the_largest_cohort_the_sampler_can_draw(fast_cfg, extra, bound):
    """The field is sized once for the run (fedrun.run.make_deployment): N for poisson, k for uniform, the cap for
    poisson_capped, at most the report goal under over-selection, plus the audit's canaries."""
    sim = build(_plain(fast_cfg(*MNIST, "num_clients=40", "sample_rate=0.25", "secagg=secagg", "secagg.clip=1",
                                *extra))).sim
    assert sim.deployment.max_clients == bound
    assert sim.deployment.quantizer(1).scale == sim.deployment.quantizer(bound).scale


def test_too_few_bits_for_the_runs_largest_cohort_is_a_config_error(fast_cfg):
    with pytest.raises(ConfigError, match=r"^secagg.bits=8 is too few for up to 200 clients a round \(sampler=poisson\) "
                                          r"and 0 canaries in the field: need at least 9$"):
        build(_plain(fast_cfg(*MNIST, "num_clients=200", "sample_rate=0.05", "secagg=secagg", "secagg.clip=1",
                              "secagg.bits=8")))


def test_cfg_job_prints_the_epsilon_that_holds_under_a_report_goal(fast_cfg):
    """What `fedrun --cfg job` prints below the config: σ calibrated for 2S under over-selection's report goal, and
    the ε it spends (≤ the target), computed before any data is loaded."""
    c = ("epsilon=1", "delta=1e-5", "rounds=20", "clipping_norm=0.05", "dp=true", "num_clients=40", "sample_rate=0.25")
    line = privacy_report(_plain(fast_cfg(*MNIST, *c, "network=mobile")))
    assert "sensitivity 2S: a report goal lets an added client push out a kept one" in line
    eps = float(line.split("ε = ")[1].split(" ")[0])
    assert 0.98 <= eps <= 1.0
    assert "report goal" not in privacy_report(_plain(fast_cfg(*MNIST, *c, "network=datacenter")))
