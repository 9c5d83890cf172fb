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
    accountant charges it; the sum's denominator stays the target cohort q·N, and a round closes at the goal."""
    sim = build(_plain(fast_cfg(*MNIST, *DP, "network=datacenter", "network.over_selection=1.6"))).sim
    assert sim.sampler.probability == pytest.approx(0.4)
    assert sim.client_dp.sampling_probability == pytest.approx(0.4)
    assert sim.client_dp.expected_clients == pytest.approx(10)
    assert sim.deployment.report_goal == 10
    m = sim.run_round(1)
    assert m["clients"] <= 10 and m["clients"] + m["clock_discarded"] == len(sim.select(1))
    assert sim.accountant.epsilon() == pytest.approx(compute_epsilon(1.0, 0.4, 1, 1e-5))
    assert sim.accountant.epsilon() > compute_epsilon(1.0, 0.25, 1, 1e-5)


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
    sim = build(_plain(fast_cfg(*MNIST, *DP, "network=datacenter", "network.availability=0.3", "secagg=secagg",
                                "secagg.dropout=0.1"))).sim
    before = sim.params.clone()
    m = sim.run_round(1)
    assert m["secagg_failed"] == 1 and m["clients"] == 0
    assert torch.equal(sim.params, before)
    assert sim.accountant.epsilon() == 0  # nothing was released, so nothing is charged
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
