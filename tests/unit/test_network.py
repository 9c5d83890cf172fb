"""The network/device model (fedrun.network) and its shipped profiles (conf/network/*.yaml).

Worked examples (one per shipped profile, its median device: every sigma set to 0). The workload: a
114,000-parameter float32 model, so the download is 114,000 · 4 = 456,000 bytes = 3,648,000 bits; an upload of
22,800 bytes = 182,400 bits; training of 2 local steps × batch 10 × 684,000 FLOPs per sample (6 FLOPs per parameter
per sample: forward 2, backward 4) = 13,680,000 FLOPs. Latency is an RTT, paid once per exchange (2 exchanges).

  mobile (Ookla Q1 2023 mobile medians; 15 GFLOP/s phone):
    download = 0.028 + 3,648,000 / 41,540,000 = 0.028 + 0.0878190 = 0.1158190 s
    compute  = 13,680,000 / 15e9                                  = 0.0009120 s
    upload   = 0.028 +   182,400 / 10,420,000 = 0.028 + 0.0175048 = 0.0455048 s
    total                                                         = 0.1622358 s
  broadband (Ookla Q1 2023 fixed-broadband medians; same phone):
    download = 0.009 + 3,648,000 / 79,000,000 = 0.009 + 0.0461772 = 0.0551772 s
    compute  = 13,680,000 / 15e9                                   = 0.0009120 s
    upload   = 0.009 +   182,400 / 34,920,000 = 0.009 + 0.0052234 = 0.0142234 s
    total                                                          = 0.0703126 s
  datacenter (25 Gbit/s, 0.5 ms RTT, A100 FP32 19.5 TFLOP/s):
    download = 0.0005 + 3,648,000 / 25e9 = 0.0005 + 0.00014592 = 0.00064592 s
    compute  = 13,680,000 / 19.5e12                          = 0.00000070 s (7.0154e-7)
    upload   = 0.0005 +   182,400 / 25e9 = 0.0005 + 0.00000730 = 0.00050730 s
    total                                                    = 0.00115392 s

Mutation check (done when this file was written: each mechanism removed in turn from fedrun/network.py, the
tests that then fail): latency term dropped or bytes counted as bits → the three worked examples and
test_extra_exchanges_and_bytes; (exchanges − 2)·L or the extra bytes dropped → test_extra_exchanges_and_bytes;
dropout ignored → test_availability_rate, test_dropout_independent_of_cohort_order,
test_dropped_client_does_not_set_duration; dropout read by cohort position instead of client id →
test_dropout_independent_of_cohort_order; one dropout stream for all rounds → test_availability_rate,
test_dropped_client_does_not_set_duration; deadline ignored → test_deadline; duration counting dropped clients →
test_dropped_client_does_not_set_duration; seed unused, or draws depending on num_clients →
test_devices_reproducible; sigma ignored → test_lognormal_draws (and test_devices_reproducible); min/max clip
dropped → test_lognormal_draws; trace ×1024 or median anchor dropped → test_trace_units; trace shuffle dropped
or unseeded → test_trace_assignment; availability > 1 accepted → test_refusals; name: none not returning None →
test_none_profile_is_off.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from fedrun.network import Devices, Profile, round_timing, time_to

CONF = Path(__file__).resolve().parents[2] / "conf" / "network"
DOWN_BYTES, UP_BYTES, FLOPS = 456_000.0, 22_800.0, 2 * 10 * 684_000.0


def _median_profile(name: str) -> Profile:
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))
    for k in ("uplink_bps", "downlink_bps", "latency_s", "flops_per_s"):
        if cfg[k]["dist"] == "lognormal":
            cfg[k]["sigma"] = 0.0
    return Profile.from_config(cfg)


def _const(up=1e6, down=2e6, lat=0.1, flops=1e9, **kw) -> Profile:
    c = lambda v: {"dist": "constant", "value": v}  # noqa: E731
    return Profile.from_config({"name": "t", "uplink_bps": c(up), "downlink_bps": c(down), "latency_s": c(lat),
                                "flops_per_s": c(flops), "server_flops_per_s": 1e12, **kw})


# --- the shipped profiles ---------------------------------------------------------------------------------

def test_none_profile_is_off():
    assert Profile.from_config(OmegaConf.load(CONF / "none.yaml")) is None
    assert Profile.from_config({"name": "none"}) is None


@pytest.mark.parametrize("name", ["mobile", "broadband", "datacenter"])
def test_shipped_profiles_parse_from_omegaconf(name):
    p = Profile.from_config(OmegaConf.load(CONF / f"{name}.yaml"))
    assert p.name == name and p.trace is None and p.deadline_s is None


@pytest.mark.parametrize("name, cited, expected", [
    # (downlink, uplink, RTT, FLOP/s medians; availability; over_selection), then the hand-worked seconds
    ("mobile", (41.54e6, 10.42e6, 0.028, 15e9, 0.92, 1.3), (0.1158190, 0.0009120, 0.0455048, 0.1622358)),
    ("broadband", (79.0e6, 34.92e6, 0.009, 15e9, 0.92, 1.3), (0.0551772, 0.0009120, 0.0142234, 0.0703126)),
    ("datacenter", (25e9, 25e9, 0.0005, 19.5e12, 1.0, 1.0), (0.00064592, 7.0154e-7, 0.00050730, 0.00115392)),
])
def test_worked_example_median_device(name, cited, expected):
    p = _median_profile(name)
    med = lambda s: s.get("median", s.get("value"))  # noqa: E731
    assert (med(p.downlink_bps), med(p.uplink_bps), med(p.latency_s), med(p.flops_per_s), p.availability,
            p.over_selection) == cited
    d = Devices(p, 1, seed=0)
    t = round_timing(d, p, np.array([0]), rnd=0, seed=0, down_bytes=DOWN_BYTES, up_bytes=UP_BYTES, flops=FLOPS)
    got = (t.download_s[0], t.compute_s[0], t.upload_s[0], t.total_s[0])
    for g, e in zip(got, expected):
        assert g == pytest.approx(e, rel=1e-4)


# --- formula details --------------------------------------------------------------------------------------

def test_extra_exchanges_and_bytes():
    # L = 0.1 s, up 1 Mbit/s, down 2 Mbit/s, 1 GFLOP/s. Down 1,000 + 250 extra bytes = 10,000 bits → 0.005 s;
    # up 500 + 125 extra bytes = 5,000 bits → 0.005 s; 2e6 FLOPs → 0.002 s. exchanges = 5: 3 more RTTs = 0.3 s.
    # total = (0.1 + 0.005) + 0.002 + (0.1 + 0.005) + 0.3 = 0.512 s
    p = _const()
    t = round_timing(Devices(p, 3, 0), p, np.array([2]), 0, 0, down_bytes=1000, up_bytes=500, flops=2e6,
                     exchanges=5, extra_up_bytes=125, extra_down_bytes=250)
    assert (t.download_s[0], t.compute_s[0], t.upload_s[0]) == pytest.approx((0.105, 0.002, 0.105))
    assert t.total_s[0] == pytest.approx(0.512) and t.duration_s == pytest.approx(0.512)


def test_rtt_conventions_and_connection_set_up():
    # L = 0.1 s, bytes 0, flops 2e6 at 1 GFLOP/s = 0.002 s. rtt_per_exchange e = 2, connect_rtt c = 3, one extra
    # exchange (exchanges = 3) and extra_rtt = 1.5: download (3 + 2)·0.1 = 0.5, upload 2·0.1 = 0.2,
    # total = 0.5 + 0.002 + 0.2 + ((3 − 2)·2 + 1.5)·0.1 = 1.052 s
    p = _const(rtt_per_exchange=2, connect_rtt=3)
    t = round_timing(Devices(p, 1, 0), p, np.array([0]), 0, 0, down_bytes=0, up_bytes=0, flops=2e6, exchanges=3,
                     extra_rtt=1.5)
    assert (t.download_s[0], t.upload_s[0], t.total_s[0]) == pytest.approx((0.5, 0.2, 1.052))
    # every new cost term may be 0: no latency at all, only compute
    z = _const(rtt_per_exchange=0, connect_rtt=0, secagg_rtt_per_round=0, secagg_agreement_flops=0, secagg_prg_flops=0)
    t = round_timing(Devices(z, 1, 0), z, np.array([0]), 0, 0, down_bytes=0, up_bytes=0, flops=2e6, exchanges=4,
                     extra_rtt=z.secagg_rtt_per_round * 3)  # as Deployment.admit charges SecAgg's 3 rounds
    assert t.total_s[0] == pytest.approx(0.002)


@pytest.mark.parametrize("name", ["mobile", "broadband", "datacenter"])
def test_shipped_profiles_keep_the_conventions(name):
    """The shipped defaults reproduce the byte/latency conventions before they were parameters: 1 RTT per exchange,
    no connection set-up, 2 RTTs per SecAgg round; the server is the cited A100 (19.5 TFLOP/s FP32 peak)."""
    p = Profile.from_config(OmegaConf.load(CONF / f"{name}.yaml"))
    assert (p.server_flops_per_s, p.rtt_per_exchange, p.connect_rtt, p.secagg_rtt_per_round) == (19.5e12, 1, 0, 2)
    assert p.secagg_agreement_flops > 0 and p.secagg_prg_flops > 0  # the ASSUMPTIONS in the yaml comments


# --- the server's modelled work (fedrun.schemes.*.server_flops): closed forms at small sizes ------------------

def _scheme(cls, n, local_steps=1, **kw):
    import torch

    from fedrun.schemes.base import Env

    s = cls(**kw)
    s.setup(Env(n=n, device=torch.device("cpu"), seed=0, num_clients=4, local_steps=local_steps))
    return s


def test_server_flops_fedavg_and_fl_freq():
    from fedrun.schemes.dct import FreqScheme
    from fedrun.schemes.fedavg import FedAvg
    from fedrun.schemes.random import RandomCoordinatesScheme

    assert _scheme(FedAvg, 10).server_flops(10) == 20  # w += η·update: 2n
    assert _scheme(FedAvg, 10, server_momentum=0.9).server_flops(10) == 40  # + v = ρv + update: 2n
    assert _scheme(RandomCoordinatesScheme, 10, r=0.5).server_flops(10) == 20  # scatter: memory only
    # FL-FREQ n = 8, r = 0.5: Φᵀ of length 8 = 2.5·8·3 + 4·8 = 92; + the step 16
    assert _scheme(FreqScheme, 8, r=0.5).server_flops(8) == 108


def test_server_flops_fl_cs_is_the_solver_budget():
    import torch

    from fedrun.schemes.dct import CompressiveSensingScheme as CS

    # n = 16, r = 0.5 → m = 8; P = 2 chunks of c = 8 (5-smooth already): T = 2·92 = 184, N = 16.
    # λ path at lam_rel 0.05, ratio 0.3: [0.3, 0.09, 0.05] → S = 3; max_iter 20: early stages 2·⌊10/2⌋ = 10, I = 20.
    fista = _scheme(CS, 16, r=0.5, chunks=2, max_iter=20, lam_rel=0.05)
    assert fista.solver_bound() == (3, 20)
    # 4m + (3 + 2S)(T + 2N) + (I + 1)T + I(T + 15N) + 2n = 32 + 9·216 + 21·184 + 20·424 + 32
    assert fista.server_flops(16) == 32 + 1944 + 3864 + 8480 + 32 == 14352
    # OWL-QN, per chunk T_c = 92, c = 8, M = 6: 4m + 2(T + 2N) + T + P[(1 + 2S)(T_c + 2c) + I(2T_c + 37c)] + 2n
    owlqn = _scheme(CS, 16, r=0.5, chunks=2, max_iter=20, lam_rel=0.05, solver="owlqn")
    assert owlqn.server_flops(16) == 32 + 432 + 184 + 2 * (7 * 108 + 20 * (184 + 296)) + 32 == 21392
    # the count is the budget, never the run: an upper bound of what the solver did, unchanged by decoding
    before = fista.server_flops(16)
    fista.decode(1, torch.randn(8, generator=torch.Generator().manual_seed(0)))
    assert 0 < fista.metrics["cs_iterations"] <= fista.solver_bound()[1] and fista.server_flops(16) == before
    assert _scheme(CS, 16, r=0.5, chunks=2, max_iter=3, lam_rel=0.001).solver_bound() == (6, 6)  # 5 early + 1


def test_server_flops_sketches():
    from fedrun.schemes.sketch import FedSketch
    from fedrun.schemes.sketchedsgd import SketchedSGD

    # n = 100, t = 4 rows, k = 5 cols, m = k = 5. PRIVIX A = n·t·(1 + ⌈log₂4⌉) = 1200; heavy hitters
    # B = A + n·(1 + ⌈log₂5⌉) = 1600; the step 2n = 200.
    kw = dict(rows=4, cols=5)
    assert _scheme(FedSketch, 100, unsketch="privix", **kw).server_flops(100) == 1200 + 200
    # HEAPRIX sketch-only: B + 2mt + tk + A + m = 1600 + 40 + 20 + 1200 + 5
    assert _scheme(FedSketch, 100, unsketch="heaprix", heavy_values="sketch", **kw).server_flops(100) == 2865 + 200
    # HEAPRIX with exact values: the query's B, then 2mt + tk + A
    assert _scheme(FedSketch, 100, unsketch="heaprix", heavy_values="exact", **kw).server_flops(100) == 2860 + 200
    assert _scheme(SketchedSGD, 100, **kw).server_flops(100) == 1600 + 200  # the query's B; decode places v̄


def test_per_client_flops_array():
    p = _const()
    t = round_timing(Devices(p, 4, 0), p, np.array([0, 3]), 0, 0, down_bytes=0, up_bytes=0, flops=np.array([1e9, 3e9]))
    assert t.compute_s == pytest.approx([1.0, 3.0])


def test_time_to():
    assert time_to(0.8, [0.1, 0.5, 0.85, 0.9], [1.0, 2.0, 3.5, 4.0]) == 3.5
    assert time_to(0.5, [0.1, 0.5], [1.0, 2.0]) == 2.0  # reaching the target exactly counts
    assert math.isnan(time_to(0.95, [0.1, 0.5, 0.9], [1, 2, 3]))


# --- draws ------------------------------------------------------------------------------------------------

def test_devices_reproducible():
    p = Profile.from_config(OmegaConf.load(CONF / "mobile.yaml"))
    a, b, c = Devices(p, 50, seed=1), Devices(p, 50, seed=1), Devices(p, 50, seed=2)
    for f in ("up_bps", "down_bps", "latency_s", "flops_per_s"):
        assert np.array_equal(getattr(a, f), getattr(b, f))
        assert not np.any(getattr(a, f) == getattr(c, f))
    # client i's draws do not depend on how many clients exist beyond it
    big = Devices(p, 5000, seed=1)
    assert np.array_equal(big.up_bps[:50], a.up_bps) and np.array_equal(big.flops_per_s[:50], a.flops_per_s)


def test_lognormal_draws():
    # median and sigma of the draws are the spec's; min/max clip
    p = Profile.from_config({"name": "t", "uplink_bps": {"dist": "lognormal", "median": 1e7, "sigma": 0.8},
                             "downlink_bps": {"dist": "uniform", "low": 1e6, "high": 3e6},
                             "latency_s": {"dist": "lognormal", "median": 0.03, "sigma": 0.5, "max": 0.05},
                             "flops_per_s": {"dist": "constant", "value": 5e9}, "server_flops_per_s": 1e12})
    d = Devices(p, 20_000, seed=3)
    logs = np.log(d.up_bps)
    assert np.exp(np.median(logs)) == pytest.approx(1e7, rel=0.03)
    assert logs.std() == pytest.approx(0.8, rel=0.03)
    assert d.down_bps.min() >= 1e6 and d.down_bps.max() <= 3e6 and d.down_bps.mean() == pytest.approx(2e6, rel=0.02)
    assert d.latency_s.max() == 0.05 and (d.latency_s == 0.05).mean() == pytest.approx(0.153, abs=0.02)  # P(z > 1.02)
    assert np.all(d.flops_per_s == 5e9)


# --- availability -----------------------------------------------------------------------------------------

def test_availability_rate():
    n, a = 20_000, 0.8
    p = _const(availability=a)
    d = Devices(p, n, 0)
    rates = [round_timing(d, p, np.arange(n), r, 0, down_bytes=1, up_bytes=1, flops=1).completed.mean()
             for r in range(3)]
    bound = 4.5 * math.sqrt(a * (1 - a) / n)  # binomial: 4.5 standard deviations
    assert all(abs(x - a) <= bound for x in rates)
    assert len(set(rates)) > 1  # rounds draw afresh
    assert round_timing(Devices(_const(), 100, 0), _const(), np.arange(100), 0, 0, down_bytes=1, up_bytes=1,
                        flops=1).completed.all()


def test_dropout_independent_of_cohort_order():
    p = _const(availability=0.5)
    d = Devices(p, 200, 0)
    clients = np.arange(0, 200, 3)
    perm = np.random.default_rng(9).permutation(clients.size)
    kw = dict(down_bytes=1, up_bytes=1, flops=1)
    a = round_timing(d, p, clients, 4, 7, **kw).completed
    b = round_timing(d, p, clients[perm], 4, 7, **kw).completed
    assert np.array_equal(a[perm], b)
    # a client's fate does not depend on who else is selected
    c = round_timing(d, p, clients[:5], 4, 7, **kw).completed
    assert np.array_equal(a[:5], c)
    assert not np.array_equal(a, round_timing(d, p, clients, 4, 8, **kw).completed)  # the seed matters


def test_deadline():
    # latency 0, 1 Mbit/s both ways, 1 GFLOP/s; 0 bytes; flops 1e9 · (1, 2, 3) → totals 1, 2, 3 s
    p = _const(up=1e6, down=1e6, lat=0.0, deadline_s=2.5)
    t = round_timing(Devices(p, 3, 0), p, np.arange(3), 0, 0, down_bytes=0, up_bytes=0, flops=np.array([1e9, 2e9, 3e9]))
    assert t.total_s == pytest.approx([1, 2, 3])
    assert t.completed.tolist() == [True, True, False] and t.duration_s == 2.5
    q = _const(up=1e6, down=1e6, lat=0.0, deadline_s=3.5)
    t = round_timing(Devices(q, 3, 0), q, np.arange(3), 0, 0, down_bytes=0, up_bytes=0, flops=np.array([1e9, 2e9, 3e9]))
    assert t.completed.all() and t.duration_s == pytest.approx(3.0)


def test_dropped_client_does_not_set_duration():
    p = _const(up=1e6, down=1e6, lat=0.0, availability=0.5)
    d = Devices(p, 400, 0)
    flops = np.arange(1, 401) * 1e9  # client i takes i + 1 seconds
    t = round_timing(d, p, np.arange(400), 0, 0, down_bytes=0, up_bytes=0, flops=flops)
    assert 0 < t.completed.sum() < 400
    assert not t.completed[-1] and t.completed[-3]  # the two slowest clients (400 s, 399 s) dropped out
    assert t.duration_s == pytest.approx(398.0) == pytest.approx(t.total_s[t.completed].max())
    # with a deadline only an available late client sets duration = deadline
    q = _const(up=1e6, down=1e6, lat=0.0, availability=0.5, deadline_s=1e6)
    assert round_timing(d, q, np.arange(400), 0, 0, down_bytes=0, up_bytes=0, flops=flops).duration_s == t.duration_s


# --- trace files ------------------------------------------------------------------------------------------

def _trace(tmp_path, table) -> str:
    path = tmp_path / "capacity.pkl"
    path.write_bytes(pickle.dumps(table))
    return str(path)


def _trace_profile(path, flops_median=10e9) -> Profile:
    return Profile.from_config({"name": "trace", "trace": path, "latency_s": {"dist": "constant", "value": 0.02},
                                "flops_per_s": {"dist": "lognormal", "median": flops_median, "sigma": 0.6},
                                "server_flops_per_s": 1e12})


def test_trace_units(tmp_path):
    # FedScale: computation = ms per sample, communication = kbit/s (kbit = 1024 bits). Entries 20 ms → median
    # device; 40 ms → half its speed. up = down = communication · 1024; FLOP/s = 10e9 · median(ms) / ms.
    table = {1: {"computation": 20.0, "communication": 1000.0}, 2: {"computation": 40.0, "communication": 500.0},
             3: {"computation": 10.0, "communication": 8000.0}}
    p = _trace_profile(_trace(tmp_path, table))
    d = Devices(p, 6, seed=0)
    pairs = {(u, f) for u, f in zip(d.up_bps, d.flops_per_s)}
    assert pairs == {(1_024_000.0, 10e9), (512_000.0, 5e9), (8_192_000.0, 20e9)}
    assert np.array_equal(d.up_bps, d.down_bps) and np.all(d.latency_s == 0.02)


def test_trace_assignment(tmp_path):
    table = {k: {"computation": float(k), "communication": 100.0 * k} for k in range(1, 8)}
    p = _trace_profile(_trace(tmp_path, table))
    a = Devices(p, 17, seed=0)
    assert np.array_equal(a.up_bps[:7], a.up_bps[7:14]) and len(set(a.up_bps[:7])) == 7  # i → entry (i mod 7)
    assert np.array_equal(a.up_bps, Devices(p, 17, seed=0).up_bps)
    assert not np.array_equal(a.up_bps[:7], Devices(p, 17, seed=1).up_bps[:7])  # a seeded shuffle
    assert not np.array_equal(a.up_bps[:7], np.sort(a.up_bps[:7]))


# --- refusals ---------------------------------------------------------------------------------------------

GOOD = {"name": "x", "uplink_bps": {"dist": "constant", "value": 1e6},
        "downlink_bps": {"dist": "constant", "value": 1e6}, "latency_s": {"dist": "constant", "value": 0.01},
        "flops_per_s": {"dist": "constant", "value": 1e9}, "server_flops_per_s": 1e12}


@pytest.mark.parametrize("change, words", [
    ({"bandwidth": 3}, "network.bandwidth: unknown key"),
    ({"uplink_bps": {"dist": "gamma", "value": 1}}, "network.uplink_bps"),
    ({"uplink_bps": {"dist": "lognormal", "median": 1e6}}, "missing sigma"),
    ({"uplink_bps": {"dist": "lognormal", "median": 1e6, "sigma": -1}}, "uplink_bps.sigma"),
    ({"uplink_bps": {"dist": "lognormal", "median": 1e6, "sigma": 1, "mean": 2}}, "uplink_bps.mean: unknown key"),
    ({"uplink_bps": {"dist": "constant", "value": 0}}, "uplink_bps.value"),
    ({"downlink_bps": {"dist": "uniform", "low": 5e6, "high": 1e6}}, "high"),
    ({"flops_per_s": {"dist": "constant", "value": 1e9, "min": 2e9, "max": 1e9}}, "min"),
    ({"latency_s": {"dist": "constant", "value": -0.1}}, "latency_s.value"),
    ({"latency_s": None}, "network.latency_s: missing"),
    ({"availability": 0}, "availability"),
    ({"availability": 1.2}, "availability"),
    ({"over_selection": 0.9}, "over_selection"),
    ({"deadline_s": 0}, "deadline_s"),
    ({"deadline_s": "soon"}, "deadline_s"),
    ({"trace": "/no/such/file.pkl"}, "network.trace"),
    ({"name": ""}, "name"),
    ({"server_flops_per_s": None}, "network.server_flops_per_s: missing"),
    ({"server_flops_per_s": 0}, "network.server_flops_per_s = 0: must be > 0.0"),
    ({"server_flops_per_s": "fast"}, "network.server_flops_per_s = 'fast': expected a finite number"),
    ({"rtt_per_exchange": -1}, "network.rtt_per_exchange = -1: must be >= 0.0"),
    ({"connect_rtt": True}, "network.connect_rtt = True: expected a finite number"),
    ({"secagg_rtt_per_round": -0.5}, "network.secagg_rtt_per_round = -0.5: must be >= 0.0"),
    ({"secagg_agreement_flops": math.inf}, "network.secagg_agreement_flops = inf: expected a finite number"),
    ({"secagg_prg_flops": None}, "network.secagg_prg_flops = None: expected a finite number"),
])
def test_refusals(change, words):
    with pytest.raises(ValueError) as e:
        Profile.from_config({**GOOD, **change})
    assert words in str(e.value) and "\n" not in str(e.value)


def test_refusals_none_and_runtime(tmp_path):
    with pytest.raises(ValueError, match="network.latency_s: unknown key for profile none"):
        Profile.from_config({"name": "none", "latency_s": 1})
    p = Profile.from_config(GOOD)
    d = Devices(p, 3, 0)
    with pytest.raises(ValueError, match="exchanges"):
        round_timing(d, p, np.array([0]), 0, 0, down_bytes=1, up_bytes=1, flops=1, exchanges=1)
    with pytest.raises(ValueError, match="client ids"):
        round_timing(d, p, np.array([3]), 0, 0, down_bytes=1, up_bytes=1, flops=1)
    bad = _trace_profile(_trace(tmp_path, {1: {"computation": 0.0, "communication": 1.0}}))
    with pytest.raises(ValueError, match="computation"):
        Devices(bad, 2, 0)
