"""fedrun.secagg: the protocols' byte counts against hand-worked closed forms, FCP's published SecAgg+
parameters, and the field codec (sum mod 2^bits, centred lift) against real sums."""

import math

import pytest
import torch

from fedrun import secagg
from fedrun.secagg import FieldQuantizer, SecAggCost, round_fails, secagg_cost

# K = 33 (P-256 compressed key), S = 36 (share of a 32-byte secret), G = 28 (GCM IV + tag):
# one ShareKeys ciphertext = 2S + G = 100 bytes.


def test_secagg_worked_example():
    # n = 100, m = 10_000, 32-bit field, δ = 0.33 tolerated, γ = 0.05; d = n − 1 = 99.
    c = secagg_cost("secagg", 100, 10_000, 32, dropout=0.33, corrupt=0.05)
    # uplink   = 2K + d(2S+G) + (d+1)S = 66 + 99·100 + 100·36 = 66 + 9900 + 3600 = 13_566
    # downlink = 2Kd + d(2S+G)         = 99·66 + 9900         = 6534 + 9900      = 16_434
    # survivors s = 100 − ⌊33⌋ = 67 = threshold
    # server = n(2K + 2d(2S+G) + 2dK) + s(d+1)S = 100·(66 + 19_800 + 6534) + 67·3600
    #        = 2_640_000 + 241_200 = 2_881_200
    # masked vector = 10_000·32/8 = 40_000
    assert c == SecAggCost("secagg", 100, 13_566, 16_434, 2_881_200, 40_000, 3, 99, 67, 67)
    # no dropout: every one of the n clients unmasks, server = n·(up + down) = 100·30_000
    c0 = secagg_cost("secagg", 100, 10_000, 32)
    assert (c0.server_bytes, c0.threshold, c0.min_survivors) == (3_000_000, 100, 100)
    assert c0.server_bytes == 100 * (c0.client_uplink_bytes + c0.client_downlink_bytes)


def test_secagg_plus_worked_example():
    # Same round; FCP's finder gives k = 28, t = 6 for (n, γ, δ) = (100, .05, .33) (its test table).
    c = secagg_cost("secagg_plus", 100, 10_000, 32, dropout=0.33, corrupt=0.05)
    # uplink   = 66 + 28·100 + 29·36 = 66 + 2800 + 1044 = 3910
    # downlink = 28·66 + 2800        = 1848 + 2800      = 4648
    # server   = 100·(66 + 5600 + 1848) + 67·29·36 = 751_400 + 69_948 = 821_348
    assert c == SecAggCost("secagg_plus", 100, 3910, 4648, 821_348, 40_000, 3, 28, 6, 67)
    # masked vector bytes round up: 10 coordinates of 12 bits = 120 bits = 15 bytes; 11 → 16.5 → 17
    assert secagg_cost("secagg_plus", 100, 10, 12).masked_vector_bytes == 15
    assert secagg_cost("secagg_plus", 100, 11, 12).masked_vector_bytes == 17


def test_reduces_to_bonawitz_total_and_abstract_expansion(monkeypatch):
    # With the paper's a_K = a_S = 256 bits and no AEAD overhead, one client's protocol bytes are
    # 2n·a_K + (5n−4)·a_S; adding a masked vector of 2^20 26-bit entries (room for 2^10 sums of 16-bit
    # inputs) over the 16-bit plaintext gives the abstract's "1.73× expansion for 2^10 users".
    monkeypatch.setattr(secagg, "KEY_BYTES", 32)
    monkeypatch.setattr(secagg, "SHARE_BYTES", 32)
    monkeypatch.setattr(secagg, "AEAD_BYTES", 0)
    n, m = 2 ** 10, 2 ** 20
    c = secagg_cost("secagg", n, m, 26)
    assert c.client_uplink_bytes + c.client_downlink_bytes == 2 * n * 32 + (5 * n - 4) * 32
    expansion = (c.client_uplink_bytes + c.client_downlink_bytes + c.masked_vector_bytes) / (m * 2)
    assert round(expansion, 2) == 1.73


# FCP fcp/secagg/server/graph_parameter_finder_test.cc, CURIOUS_SERVER rows: (n, γ, δ) → (degree, threshold).
# (10_000, .45, .45) → (3494, 1771) also matches but takes ~12 s, so it is left out.
FCP_TABLE = [
    (100, .45, .45, 92, 46), (1000, .45, .45, 822, 417),
    (10, .33, .33, 8, 4), (100, .33, .33, 68, 34), (1000, .33, .33, 286, 150), (10_000, .33, .33, 422, 221),
    (100_000, .33, .33, 480, 251), (1_000_000, .33, .33, 518, 270),
    (10, .05, .33, 4, 2), (100, .05, .33, 28, 6), (1000, .05, .33, 72, 24), (10_000, .05, .33, 86, 29),
    (100_000, .05, .33, 96, 32), (1_000_000, .05, .33, 102, 34),
    (10, .33, .05, 4, 4), (100, .33, .05, 34, 29), (1000, .33, .05, 78, 60), (10_000, .33, .05, 92, 70),
    (100_000, .33, .05, 102, 77), (1_000_000, .33, .05, 110, 83),
]


@pytest.mark.parametrize("n,gamma,delta,k,t", FCP_TABLE)
def test_secagg_plus_parameters_match_fcp(n, gamma, delta, k, t):
    c = secagg_cost("secagg_plus", n, 1, 32, dropout=delta, corrupt=gamma)
    assert (c.neighbours, c.threshold) == (k, t)


def test_secagg_plus_falls_back_to_complete_graph_for_small_cohorts():
    # n = 20, γ = δ = .45: no even k < 19 passes FCP's checks → SecAgg (FCP does the same).
    assert secagg.harary_parameters(20, 0.45, 0.45) is None
    plus = secagg_cost("secagg_plus", 20, 100, 16, dropout=0.45, corrupt=0.45)
    full = secagg_cost("secagg", 20, 100, 16, dropout=0.45, corrupt=0.45)
    assert (plus.neighbours, plus.threshold) == (19, 20 - 9) and plus.client_uplink_bytes == full.client_uplink_bytes


def test_threshold_and_round_failure():
    for protocol in ("secagg", "secagg_plus"):
        c = secagg_cost(protocol, 100, 10, 32, dropout=0.1)  # ⌊10⌋ dropouts tolerated → 90 must survive
        assert c.min_survivors == 90
        assert not round_fails(c, 100) and not round_fails(c, 90)
        assert round_fails(c, 89) and round_fails(c, 0)
    assert secagg_cost("secagg", 100, 10, 32, dropout=0.1).threshold == 90
    strict = secagg_cost("secagg", 100, 10, 32)  # δ = 0: any dropout aborts
    assert round_fails(strict, 99) and not round_fails(strict, 100)
    for bad in (-1, 101, 50.0):
        with pytest.raises(ValueError, match="survivors"):
            round_fails(strict, bad)


def test_per_client_cost_linear_in_n_for_secagg_and_logarithmic_for_secagg_plus():
    ns = [10 ** e for e in range(2, 7)]
    full = [secagg_cost("secagg", n, 10, 32, dropout=0.33).client_uplink_bytes for n in ns]
    plus = [secagg_cost("secagg_plus", n, 10, 32, dropout=0.33) for n in ns]
    # SecAgg: uplink = 2K + (n−1)(2S+G) + nS = 66 + 100(n−1) + 36n = 136n − 34: ×10 per decade
    assert full == [136 * n - 34 for n in ns]
    # SecAgg+: k = 28, 72, 86, 96, 102 — increasing, ≤ 8·log2 n; uplink = 102 + 136k grows < 1.5× per decade
    # past 10³ (×1.19, ×1.12, ×1.06)
    ks = [c.neighbours for c in plus]
    assert ks == [28, 72, 86, 96, 102] and all(k <= 8 * math.log2(n) for k, n in zip(ks, ns))
    ups = [c.client_uplink_bytes for c in plus]
    assert all(b / a < 1.5 for a, b in zip(ups[1:], ups[2:]))
    assert all(p < f for p, f in zip(ups, full))
    # more tolerated dropout → larger neighbourhoods (δ = 0 vs .33 at γ = .05, n = 1000: k = 14 vs 72)
    assert secagg_cost("secagg_plus", 1000, 1, 8).neighbours < plus[1].neighbours


@pytest.mark.parametrize("args,kwargs,match", [
    (("secagg_pluss", 10, 1, 8), {}, "protocol='secagg_pluss'"),
    (("secagg", 1, 1, 8), {}, "clients=1"),
    (("secagg", 10.0, 1, 8), {}, "clients=10.0"),
    (("secagg", 10, 0, 8), {}, "dim=0"),
    (("secagg", 10, 1, 0), {}, "bits=0"),
    (("secagg", 10, 1, 65), {}, "bits=65"),
    (("secagg", 10, 1, 8), {"dropout": 1.0}, "dropout=1.0"),
    (("secagg", 10, 1, 8), {"corrupt": -0.1}, "corrupt=-0.1"),
    (("secagg_plus", 10, 1, 8), {"dropout": 0.5, "corrupt": 0.5}, "dropout \\+ corrupt = 1"),
    (("secagg", 2, 1, 8), {"dropout": 0.5, "corrupt": 0.0}, "threshold 1"),
    (("secagg", 5, 1, 8), {"dropout": 0.4, "corrupt": 0.5}, "threshold 3 must exceed"),
])
def test_cost_refusals(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        secagg_cost(*args, **kwargs)


# ---------------------------------------------------------------- field codec

def _field_sum(fq, encoded_rows):
    acc = torch.zeros_like(encoded_rows[0])
    for row in encoded_rows:
        acc = fq.add(acc, row)
        assert int(acc.min()) >= 0 and int(acc.max()) < fq.modulus  # reduced after every addition
    return acc


@pytest.mark.parametrize("bits,clip,max_clients", [(8, 1.0, 127), (16, 0.1, 1000), (32, 3.7, 7), (62, 1e-3, 1),
                                                   (62, 123.456, 3), (40, 0.3, 999_999)])
def test_scale_cannot_wrap(bits, clip, max_clients):
    fq = FieldQuantizer(bits, clip, max_clients)
    assert max_clients * clip * fq.scale < 2 ** (bits - 1)
    top = fq.encode(torch.tensor([[clip], [-clip]], dtype=torch.float64))
    # ±clip → ±q with q ≤ L (= L unless float64 round-off at ≥ 54 bits), and L·max_clients < 2^(b−1)
    q = int(top[0])
    assert 0 < q <= fq.level and int(top[1]) == fq.modulus - q and fq.level - q <= 2 ** max(bits - 53, 0)
    assert fq.level * max_clients <= 2 ** (bits - 1) - 1


def test_sum_matches_real_sum_within_bound_with_clipping_and_wrap():
    torch.manual_seed(0)
    bits, clip, clients, m = 20, 1.5, 50, 2000
    fq = FieldQuantizer(bits, clip, clients)
    rows = (torch.rand(clients, m) * 4 - 2) * clip  # half the mass beyond ±clip on each side
    rows[:, :10] = clip
    rows[:, 10:20] = -clip
    rows[::2, 20:30] = clip
    rows[1::2, 20:30] = -clip
    enc = fq.encode(rows)
    assert fq.clipped == int((rows.abs() > clip).sum()) > 0
    assert int(enc.min()) >= 0 and int(enc.max()) < fq.modulus
    # wrap-around happens: the integer sum of the representatives leaves [0, 2^bits) on most coordinates
    raw = enc.sum(0)
    assert int((raw >= fq.modulus).sum()) > m // 2
    real = rows.double().clamp(-clip, clip)
    for count in (1, 7, clients):
        dec = fq.decode(_field_sum(fq, enc[:count]))
        ref = real[:count].sum(0)
        err = (dec.double() - ref).abs()
        # quantisation bound + the float32 cast of the result (half an ulp at |ref|)
        tol = fq.bound(count) + ref.abs() * 2.0 ** -24 + 1e-12
        assert bool((err <= tol).all()), float((err - tol).max())
    full = fq.decode(_field_sum(fq, enc)).double()
    tol = fq.bound(clients) + clients * clip * 2.0 ** -24
    assert float((full[:10] - clients * clip).abs().max()) <= tol
    assert float((full[10:20] + clients * clip).abs().max()) <= tol
    assert float(full[20:30].abs().max()) <= fq.bound(clients)


def test_values_beyond_clip_are_clipped_not_wrapped():
    bits, clip, clients = 12, 1.0, 15  # L = ⌊2047/15⌋ = 136
    fq = FieldQuantizer(bits, clip, clients)
    assert fq.level == 136
    rows = torch.full((clients, 3), 3.0)  # unclipped: 15·408 = 6120 > 2047 would wrap to a negative sum
    rows[:, 1] = -3.0
    rows[:, 2] = 0.5
    dec = fq.decode(_field_sum(fq, fq.encode(rows)))
    assert fq.clipped == 2 * clients
    assert torch.allclose(dec, torch.tensor([15.0, -15.0, 7.5]), rtol=0, atol=fq.bound(clients) + 1e-5)
    # −clip encodes to 4096 − 136 = 3960; fifteen of them sum to 59_400 before the reduction
    assert int(fq.encode(torch.tensor([[-1.0]]))) == 3960


def test_round_to_nearest_and_centred_lift():
    fq = FieldQuantizer(16, 1.0, 7)  # L = ⌊32767/7⌋ = 4681 = scale
    s = fq.scale
    assert s == 4681.0
    x = torch.tensor([[0.4 / s, 0.6 / s, -0.4 / s, -0.6 / s, 2.4 / s]], dtype=torch.float64)
    assert fq.encode(x).tolist() == [[0, 1, 0, 2 ** 16 - 1, 2]]
    # centred lift: 2^15 is the largest positive residue, 2^15 + 1 is −(2^15 − 1)
    lifted = fq.decode(torch.tensor([2 ** 15, 2 ** 15 + 1, 2 ** 16 - 1, 0]))
    assert lifted.tolist() == pytest.approx([2 ** 15 / s, -(2 ** 15 - 1) / s, -1 / s, 0.0], rel=1e-7)
    assert lifted.dtype == torch.float32


def test_bound_is_tight():
    # Every client's value sits just below a half step: each rounds down by ≈ 0.5/scale, all the same way.
    bits, clip, clients = 24, 2.0, 9
    fq = FieldQuantizer(bits, clip, clients)
    steps = torch.arange(1, clients + 1, dtype=torch.float64) * 37
    x = ((steps + 0.5 - 1e-3) / fq.scale).to(torch.float32)  # float32 inputs, as the simulator sends
    rows = x.reshape(clients, 1)
    dec = fq.decode(_field_sum(fq, fq.encode(rows)))
    err = float(rows.double().sum() - dec.double())
    ref = float(rows.double().sum())
    assert err <= fq.bound(clients) + ref * 2.0 ** -24
    assert err >= fq.bound(clients) * (1 - 3e-3) - ref * 2.0 ** -24


def test_codec_refusals():
    for kwargs, match in [
        (dict(bits=7, clip=1.0, max_clients=1), "bits=7"),
        (dict(bits=63, clip=1.0, max_clients=1), "bits=63"),
        (dict(bits=16.0, clip=1.0, max_clients=1), "bits=16.0"),
        (dict(bits=16, clip=0.0, max_clients=1), "clip=0.0"),
        (dict(bits=16, clip=float("nan"), max_clients=1), "clip=nan"),
        (dict(bits=16, clip=float("inf"), max_clients=1), "clip=inf"),
        (dict(bits=16, clip=1.0, max_clients=0), "max_clients=0"),
        (dict(bits=8, clip=1.0, max_clients=128), "need at least 9"),
        (dict(bits=20, clip=1.0, max_clients=10 ** 6), "need at least 21"),
    ]:
        with pytest.raises(ValueError, match=match):
            FieldQuantizer(**kwargs)
    assert FieldQuantizer(8, 1.0, 127).level == 1  # the boundary is allowed
    fq = FieldQuantizer(16, 1.0, 4)
    with pytest.raises(ValueError, match="count=5"):
        fq.bound(5)
    with pytest.raises(ValueError, match="NaN"):
        fq.encode(torch.tensor([[float("nan")]]))


def _deployment(max_clients=50, protocol="secagg", bits=20):
    import numpy as np

    from fedrun.deployment import Deployment, SecAggSettings

    return Deployment(None, SecAggSettings(protocol, bits, 1.0), num_clients=50, seed=0, flops_per_sample=0.0,
                      samples=np.ones(50), max_clients=max_clients)


def test_field_scale_is_the_runs_bound_not_the_rounds_cohort():
    """The field's scale is set by the run's public bound, not by how many clients a round has: the same 3 rows
    quantise to the same field sum whether 3 or 4 clients take part, and the 4th adds exactly its own encoding
    (under client-level DP, one more client changes no other client's rounding)."""
    dep = _deployment()
    rows = torch.rand(4, 257, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2 - 1
    q3, q4 = dep.quantizer(3), dep.quantizer(4)
    assert q3.scale == q4.scale == FieldQuantizer(20, 1.0, 50).scale
    sum3 = _field_sum(q3, q3.encode(rows[:3]))
    sum4 = _field_sum(q4, q4.encode(rows))
    assert torch.equal(_field_sum(q4, q4.encode(rows[:3])), sum3)
    assert torch.equal(q4.add(sum3, q4.encode(rows[3:]).squeeze(0)), sum4)
    assert torch.equal(q3.decode(sum3), q4.decode(_field_sum(q4, q4.encode(rows[:3]))))
    with pytest.raises(ValueError, match="51 summands exceed the field's bound max_clients=50"):
        dep.quantizer(51)
    with pytest.raises(ValueError, match="need at least 9"):  # the bits must hold the run's bound
        _deployment(max_clients=200, bits=8)


@pytest.mark.parametrize("protocol", ["secagg", "secagg_plus"])
def test_fewer_than_two_clients_fail_the_round_without_an_instance(protocol):
    """0 or 1 selected client: no SecAgg instance can run (its threshold is ≥ 2): the round fails, nothing is
    uploaded or released, no protocol bytes are charged, and the metrics say so — no traceback."""
    import numpy as np

    dep = _deployment(protocol=protocol)
    for clients in (np.array([], dtype=np.int64), np.array([3])):
        active, failed = dep.admit(1, clients, np.zeros(len(clients)), 100, 10)
        assert failed and len(active) == 0
        assert dep.metrics["secagg_uplink_bytes"] == dep.metrics["secagg_downlink_bytes"] == 0
        assert dep.metrics["secagg_survivors"] == len(clients) and dep.metrics["secagg_min_survivors"] == 2
        assert dep.close(0.0)["secagg_failed"] == 1
    active, failed = dep.admit(1, np.array([3, 4]), np.zeros(2), 100, 10)  # two: an instance, and no dropout
    assert not failed and list(active) == [3, 4] and dep.close(0.0)["secagg_failed"] == 0
