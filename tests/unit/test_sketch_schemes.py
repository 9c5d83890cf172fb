"""FedSKETCH, FedSKETCHGATE, FedSGD and SketchedSGD (paper 002) on a tiny synthetic federation.

Independent references: the count sketch as an explicit dense matrix built from the hash values, PRIVIX
with ``numpy.median``, heavy hitters with ``numpy.argsort``, FedAvg's own round, and closed forms for the
bytes, all in float64 on the local models the round itself aggregates (local training is tested against
the sequential autograd path in test_training.py). Tolerances: float32 round-off at the scale of the
values (tests/tolerance.py): a bucket of the sketch sums at most ``occupancy`` coordinates.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedrun.compress.sketch import CountSketch, default_c_over_sigma
from fedrun.sampling import AllSampler, UniformSampler
from fedrun.schemes.fedavg import FedAvg
from fedrun.schemes.sketch import FedSGD, FedSketch, FedSketchGate
from fedrun.schemes.sketchedsgd import ERROR, MOMENTUM, SketchedSGD
from fedrun.simulation import ClientDP, Simulation
from fedrun.training import ClientData, LocalSpec
from tolerance import assert_f32_close, f32_tol

N_CLIENTS, FEATURES, CLASSES = 6, 12, 4
DIM = FEATURES * CLASSES + CLASSES  # 52 parameters


def make_sim(scheme, *, steps: int = 2, per_round: int | None = 4, seed: int = 0, lr: float = 0.3,
             client_dp: ClientDP | None = None) -> Simulation:
    g = torch.Generator().manual_seed(123)
    x = torch.randn(N_CLIENTS * 20, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (N_CLIENTS * 20,), generator=g)
    parts = [np.arange(i * 20, (i + 1) * 20) for i in range(N_CLIENTS)]
    torch.manual_seed(seed)
    model = nn.Linear(FEATURES, CLASSES)
    sampler = AllSampler(N_CLIENTS) if per_round is None else UniformSampler(N_CLIENTS, per_round)
    spec = LocalSpec("sgd", steps=steps, batch_size=5, lr=lr)
    return Simulation(model=model, data=ClientData(x, y, parts), x_test=x[:30], y_test=y[:30], sampler=sampler,
                      scheme=scheme, spec=spec, seed=seed, client_dp=client_dp)


def dense_sketch(cs: CountSketch) -> np.ndarray:
    """The sketch as an explicit [t·k, d] matrix A (S(x) = A x), from the hash values."""
    buckets, signs = cs.hashes()
    A = np.zeros((cs.rows * cs.cols, cs.dim))
    for j in range(cs.rows):
        for i in range(cs.dim):
            A[j * cs.cols + int(buckets[j, i]), i] += float(signs[j, i])
    return A


def ref_privix(cs: CountSketch, S: np.ndarray) -> np.ndarray:
    buckets, signs = (a.numpy() for a in cs.hashes())
    S = S.reshape(cs.rows, cs.cols)
    est = np.stack([signs[j] * S[j, buckets[j]] for j in range(cs.rows)])  # [t, d]
    return np.median(est, axis=0)  # midpoint of the middle two for even t


def local_models(sim: Simulation, clients: np.ndarray, rnd: int) -> torch.Tensor:
    """The local models [K, n] the round trains from the current global model (same path, same batches)."""
    name = sim.scheme.correction_state  # gradient tracking (FedSKETCHGATE's c_j), as the round applies it
    correction = sim.client_state.get(name, clients, sim.n) if name else None
    return torch.cat([m for _, m, _ in sim.train(clients, rnd, correction)])


def occupancy(A: np.ndarray) -> int:
    """The most coordinates one bucket of the sketch adds up (terms of its float32 sum)."""
    return int((A != 0).sum(1).max())


def bucket_scale(A: np.ndarray, x_abs: np.ndarray) -> float:
    """Σ|terms| of the largest bucket of S(x) for |x| ≤ x_abs: bounds every sketch entry and PRIVIX value."""
    return float((np.abs(A) @ x_abs).max())


def run_round(sim: Simulation, rnd: int = 1):
    clients = sim.select(rnd)
    p0 = sim.params.clone()
    local = local_models(sim, clients, rnd)
    metrics = sim.run_round(rnd)  # selects the same clients (sim.select) and starts the ledger's round
    assert metrics["clients"] == len(clients)
    return clients, p0, (p0 - local).double().numpy(), metrics


# ------------------------------------------------------------------------------ FedSKETCH
@pytest.mark.parametrize("rows,cols", [(3, 5), (4, 6)])
def test_fedsketch_privix_round_matches_dense_reference(rows, cols):
    scheme = FedSketch("privix", rows=rows, cols=cols, server_lr=0.7)
    sim = make_sim(scheme)
    cs = scheme.sketch(1)
    clients, p0, deltas, _ = run_round(sim)
    A = dense_sketch(cs)
    S_bar = A @ deltas.mean(0)
    expected = p0.double().numpy() - 0.7 * ref_privix(cs, S_bar)
    # float32: Δ, the bucket sums, the mean over K, × γ, p0 − ·
    scale = 0.7 * bucket_scale(A, np.abs(deltas).mean(0))
    assert_f32_close(sim.params, expected, (p0, 1), scale, terms=occupancy(A) + len(clients) + 4)


def test_fedsketch_heaprix_exact_matches_dense_reference():
    scheme = FedSketch("heaprix", rows=5, cols=10, num_heavy=5, server_lr=1.5)
    sim = make_sim(scheme)
    cs = scheme.sketch(1)
    clients, p0, deltas, _ = run_round(sim)
    A = dense_sketch(cs)
    x_bar = deltas.mean(0)
    S_bar = A @ x_bar
    est = np.abs(ref_privix(cs, S_bar))
    order = np.argsort(-est, kind="stable")
    scale, terms = bucket_scale(A, np.abs(deltas).mean(0)), occupancy(A) + len(clients) + 2
    # no tie at the heavy-set boundary: the float32 estimates cannot swap the 5th and 6th
    assert est[order[4]] > est[order[5]] + 2 * f32_tol(scale, terms=terms)
    H = np.sort(order[:5])
    h = np.zeros(DIM)
    h[H] = x_bar[H]  # the exact averaged values of the second exchange
    phi = ref_privix(cs, S_bar - A @ h)
    phi[H] = x_bar[H]
    # float32: S̄ and the re-sketch of h (both ≤ scale per bucket), their difference, × γ, p0 − ·
    assert_f32_close(sim.params, p0.double().numpy() - 1.5 * phi, (p0, 1), 1.5 * 2 * scale, terms=2 * terms + 3)


def assert_same_trajectory(a, b, rounds: int) -> None:
    """Run both simulations round by round; their global models agree after every round.

    Both aggregate the same local models in float32, each its own way: they agree up to the round-off of
    both (a weighted sum of K updates, the server step). Each round then starts both from a's model, so
    that the next round's training does not amplify that round-off."""
    for rnd in range(1, rounds + 1):
        clients = a.select(rnd)
        assert np.array_equal(clients, b.select(rnd))
        w0 = a.params.clone()
        updates = (local_models(a, clients, rnd) - w0).abs().max(0).values  # |Δ_j| ≤ this, any weights
        for sim in (a, b):
            assert sim.run_round(rnd)["clients"] == len(clients)
        lr = max(a.scheme.server_lr, b.scheme.server_lr)
        assert_f32_close(a.params, b.params, (w0, 2), lr * updates, terms=2 * (len(clients) + 4),
                         msg=f"round {rnd}")
        b.params.copy_(a.params)


def test_fedsketch_heaprix_with_all_coordinates_heavy_is_fedavg():
    """m = d: every coordinate's exact average travels, so FedSKETCH-HEAPRIX = FedAvg with server lr γ."""
    a = make_sim(FedSketch("heaprix", rows=1, cols=DIM, num_heavy=DIM, server_lr=0.8), steps=3)
    b = make_sim(FedAvg(server_lr=0.8), steps=3)
    assert_same_trajectory(a, b, rounds=3)


def test_fedsketch_sketch_only_heaprix_equals_operator():
    scheme = FedSketch("heaprix", rows=3, cols=6, num_heavy=3, heavy_values="sketch")
    sim = make_sim(scheme)
    cs = scheme.sketch(1)
    clients, p0, deltas, _ = run_round(sim)
    A = dense_sketch(cs)
    S_bar = torch.as_tensor(A @ deltas.mean(0), dtype=torch.float32).reshape(3, 6)
    # both sides float32: S̄ (the scheme's bucket sums; the test's a cast), the heavy estimates (each ≤ scale),
    # their re-sketch (≤ occupancy of them per bucket), the residual, p0 − ·
    scale, occ = bucket_scale(A, np.abs(deltas).mean(0)), occupancy(A)
    assert_f32_close(sim.params, p0 - cs.heaprix(S_bar, 3), (p0, 2), (occ + 2) * scale,
                     terms=2 * (2 * occ + len(clients) + 4))
    assert sim.ledger.uplink_round == 4 * 4 * 18  # one exchange only


def test_hashes_fixed_or_per_round():
    fixed = FedSketch(rows=2, cols=5)
    sim = make_sim(fixed)
    assert fixed.sketch(1) is fixed.sketch(2)
    fresh = FedSketch(rows=2, cols=5, hashes="per_round")
    sim2 = make_sim(fresh)
    h1 = fresh.sketch(1).hash_coefficients
    assert torch.equal(fresh.sketch(1).hash_coefficients, h1)
    assert not torch.equal(fresh.sketch(2).hash_coefficients, h1)


# ------------------------------------------------------------------------------ bytes
@pytest.mark.parametrize("scheme,up,down", [
    # K = 4 participants of N = 6, t = 3, k = 5, m = 5 (default m = k), n = 52
    (lambda: FedSketch("privix", rows=3, cols=5), 4 * 4 * 15, 6 * 4 * 15),
    (lambda: FedSketch("heaprix", rows=3, cols=5), 4 * 4 * (15 + 5), 6 * 4 * (15 + 5)),
    (lambda: FedSketch("heaprix", rows=3, cols=5, heavy_values="sketch"), 4 * 4 * 15, 6 * 4 * 15),
    (lambda: SketchedSGD(rows=3, cols=5), 4 * 4 * (15 + 5), 4 * 4 * 5 + 6 * 8 * 5),
    (lambda: FedSGD(), 4 * 4 * DIM, 4 * 4 * DIM),
])
def test_bytes_per_round_closed_form(scheme, up, down):
    s = scheme()
    sim = make_sim(s, steps=1)
    for rnd in (1, 2):
        sim.run_round(rnd)
        assert (sim.ledger.uplink_round, sim.ledger.downlink_round) == (up, down)
    assert sim.ledger.uplink_total == 2 * up


def test_gate_bytes_count_every_client():
    sim = make_sim(FedSketchGate("heaprix", rows=2, cols=5, num_heavy=3), per_round=None)
    sim.run_round(1)
    assert sim.ledger.uplink_round == N_CLIENTS * 4 * (10 + 3)
    assert sim.ledger.downlink_round == N_CLIENTS * 4 * (10 + 3)


def test_compression_ratio_hook():
    s = FedSketch("privix", rows=2, cols=5)
    sim = make_sim(s)
    assert s.compression_ratio == pytest.approx(10 / DIM)
    h = FedSketch("heaprix", rows=2, cols=5, num_heavy=4)
    make_sim(h)
    assert h.compression_ratio == pytest.approx(14 / DIM)


# ------------------------------------------------------------------------------ FedSKETCHGATE
@pytest.mark.parametrize("unsketch,heavy", [("privix", "exact"), ("heaprix", "exact"), ("heaprix", "sketch")])
def test_gate_corrections_sum_to_zero_with_a_linear_decoder(unsketch, heavy):
    """t = 1 row: PRIVIX (and HEAPRIX on a fixed heavy set) is linear, so Σ_j Φ_j = N·Φ and Σ_j c_j = 0."""
    scheme = FedSketchGate(unsketch, rows=1, cols=20, num_heavy=4, heavy_values=heavy)
    sim = make_sim(scheme, per_round=None, steps=3)
    ids = np.arange(N_CLIENTS)
    A = dense_sketch(scheme.sketch(1))
    scale, terms = 0.0, 0
    for rnd in (1, 2, 3):
        clients = sim.select(rnd)
        deltas = (local_models(sim, clients, rnd) - sim.params).double().abs().numpy()
        # Σ_j c_j: each round adds Σ_j (Φ − Φ_j)/τ (τ = 3); Φ_j and Φ are decoded from buckets of Σ|terms| ≤
        # bucket_scale, minus (HEAPRIX) a re-sketch of the m = 4 heavy values, each ≤ bucket_scale: so the N
        # clients' |Φ| + |Φ_j| add up to ≤ 2·N·(1 + 4)·bucket_scale; float32 sums of N clients, of the buckets,
        # of the m heavy values, and a few operations
        scale += 2 * N_CLIENTS * (1 + 4) * bucket_scale(A, deltas.max(0)) / 3
        terms += N_CLIENTS + occupancy(A) + 4 + 4
        metrics = sim.run_round(rnd)
        assert metrics["clients"] == len(clients)
        c = sim.client_state.get(FedSketchGate.correction_state, ids, DIM)
        tol = f32_tol(scale, terms=terms)
        assert c.abs().max() > 100 * tol  # the corrections are not trivially zero, far above round-off
        assert c.sum(0).abs().max() <= tol
        assert metrics["client_gate_c_mean_norm"] <= np.sqrt(DIM) * tol / N_CLIENTS < metrics["client_gate_c_rms_norm"]


def test_gate_mean_correction_drifts_with_a_median_decoder():
    """t = 3 rows: the median makes Σ_j Φ_j ≠ N·Φ, so c̄ = mean c_j leaves 0 (nothing pulls it back)."""
    scheme = FedSketchGate("privix", rows=3, cols=7)
    sim = make_sim(scheme, per_round=None, steps=1)
    metrics = sim.run_round(1)
    assert metrics["client_gate_c_mean_norm"] > 1e-4  # a drift of the size of the updates' disagreement, not round-off


def test_gate_update_matches_formula_and_correction_enters_local_steps():
    scheme = FedSketchGate("privix", rows=3, cols=7, server_lr=1.0)
    sim = make_sim(scheme, per_round=None, steps=2)
    cs = scheme.sketch(1)
    A = dense_sketch(cs)
    ids = np.arange(N_CLIENTS)
    c_prev = np.zeros((N_CLIENTS, DIM))
    c_scale, c_terms = 0.0, 0
    for rnd in (1, 2):
        clients, p0, deltas, _ = run_round(sim, rnd)  # the local models trained with the current c_j
        S_j = deltas @ A.T
        phi = ref_privix(cs, S_j.mean(0))
        phi_j = np.stack([ref_privix(cs, s) for s in S_j])
        # float32: Δ, bucket sums, the mean over N, p0 − Φ; c_j accumulates (Φ − Φ_j)/τ over the rounds
        scale, terms = bucket_scale(A, np.abs(deltas).max(0)), occupancy(A) + N_CLIENTS + 4
        assert_f32_close(sim.params, p0.double().numpy() - phi, (p0, 1), scale, terms=terms)
        c_prev = c_prev - (phi[None] - phi_j) / 2
        c_scale, c_terms = c_scale + scale, c_terms + terms + 2
        assert_f32_close(sim.client_state.get(FedSketchGate.correction_state, ids, DIM), c_prev, c_scale, terms=c_terms)
    assert np.abs(c_prev).max() > 1e-3


def test_gate_needs_full_participation():
    # setup (run by the Simulation's constructor) raises ValueError; fedrun.run.build reports it as a ConfigError
    with pytest.raises(ValueError, match="full participation.*sampler=all"):
        make_sim(FedSketchGate(rows=2, cols=5), per_round=3)


# ------------------------------------------------------------------------------ SketchedSGD and FedSGD
def test_sketchedsgd_with_every_coordinate_heavy_is_fedsgd():
    """m = d: all of v_j is applied and reset each round, momentum included, so the update is FedSGD's."""
    a = make_sim(SketchedSGD(rows=1, cols=DIM, num_heavy=DIM, momentum=0.9, server_lr=0.5), steps=1)
    b = make_sim(FedSGD(server_lr=0.5), steps=1)
    assert_same_trajectory(a, b, rounds=3)


# small sketches often give tied |estimates| (coordinates whose median picks the same bin); with these seeds the
# heavy-set boundary is tie-free in all three rounds, so the reference heavy set is unambiguous
@pytest.mark.parametrize("seed", [0, 8])
def test_sketchedsgd_momentum_error_feedback_reference(seed):
    scheme = SketchedSGD(rows=5, cols=10, num_heavy=4, momentum=0.5, server_lr=2.0)
    sim = make_sim(scheme, steps=1, seed=seed)
    cs = scheme.sketch(1)
    A = dense_sketch(cs)
    u = np.zeros((N_CLIENTS, DIM))
    v = np.zeros((N_CLIENTS, DIM))
    u_abs, v_abs = np.zeros((N_CLIENTS, DIM)), np.zeros((N_CLIENTS, DIM))  # the same recursions on |·|: scales
    for rnd in (1, 2, 3):
        clients, p0, deltas, _ = run_round(sim, rnd)
        u[clients] = 0.5 * u[clients] + deltas
        v[clients] = v[clients] + u[clients]
        u_abs[clients] = 0.5 * u_abs[clients] + np.abs(deltas)
        v_abs[clients] = v_abs[clients] + u_abs[clients]
        terms = 3 * rnd + 1  # float32 roundings of u and v so far (Δ, 0.5·u, + Δ, v + u per round)
        est = np.abs(ref_privix(cs, A @ v[clients].mean(0)))
        order = np.argsort(-est, kind="stable")
        est_tol = f32_tol(bucket_scale(A, v_abs[clients].mean(0)), terms=terms + occupancy(A) + len(clients) + 1)
        assert est[order[3]] > est[order[4]] + 2 * est_tol  # no tie at the heavy-set boundary, even in float32
        H = np.sort(order[:4])
        step = np.zeros(DIM)
        step[H] = v[clients][:, H].mean(0)
        assert_f32_close(sim.params, p0.double().numpy() - 2.0 * step, (p0, 1), 2.0 * v_abs[clients].mean(0),
                         terms=terms + len(clients) + 3)
        u[np.ix_(clients, H)] = 0.0
        v[np.ix_(clients, H)] = 0.0
        u_abs[np.ix_(clients, H)] = 0.0
        v_abs[np.ix_(clients, H)] = 0.0
        all_ids = np.arange(N_CLIENTS)
        assert_f32_close(sim.client_state.get(MOMENTUM, all_ids, DIM), u, u_abs, terms=terms)
        assert_f32_close(sim.client_state.get(ERROR, all_ids, DIM), v, v_abs, terms=terms)


def test_sketchedsgd_refuses_more_than_one_local_step():
    # FedSGD takes τ local steps (uncompressed FedSKETCH): tests/unit/test_fedsgd_local_steps.py
    with pytest.raises(ValueError, match="local_steps=2.*allowed: local_steps=1"):
        make_sim(SketchedSGD(rows=2, cols=5), steps=2)


# ------------------------------------------------------------------------------ validation, ε, DP
@pytest.mark.parametrize("kwargs,match", [
    ({"unsketch": "median"}, r"scheme.unsketch='median' is unknown; allowed: privix, heaprix"),
    ({"rows": 0}, r"scheme.rows=0; allowed: an integer >= 1"),
    ({"cols": 0}, r"scheme.cols=0; allowed: an integer >= 1"),
    ({"num_heavy": 0}, r"scheme.num_heavy=0; allowed"),
    ({"heavy_values": "approx"}, r"scheme.heavy_values='approx' is unknown; allowed: exact, sketch"),
    ({"hashes": "random"}, r"scheme.hashes='random' is unknown"),
    ({"server_lr": 0}, r"server_lr=0"),
])
def test_bad_constructor_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedSketch(**kwargs)


def test_sketch_bigger_than_the_model():
    with pytest.raises(ValueError, match=r"5×11 = 55 > 52 model parameters.*allowed: rows·cols <= 52"):
        make_sim(FedSketch(rows=5, cols=11))
    with pytest.raises(ValueError, match=r"num_heavy=60 > 52"):
        make_sim(FedSketch("heaprix", rows=2, cols=5, num_heavy=60))


def test_sketch_epsilon_only_where_theorem_1_holds():
    ok = FedSketch("privix", rows=2, cols=2, c_over_sigma=0.5)
    sim = make_sim(ok)
    tags = ok.tags
    assert tags["sketch_epsilon_status"] == "valid" and "Assumption 1" in tags["sketch_epsilon_assumption"]
    assert "C/σ = 0.5 (given)" in tags["sketch_epsilon_assumption"]
    m = sim.run_round(1)
    eps = ok.metrics.get("sketch_epsilon")
    assert eps is not None and m["sketch_epsilon"] == pytest.approx(eps) and eps > 0
    bad = FedSketch("privix", rows=2, cols=2)  # default C/σ = 3.30 for 52 entries: condition fails
    sim = make_sim(bad)
    assert bad.tags["sketch_epsilon_status"].startswith("not available: Theorem 1 condition violated")
    assert "sketch_epsilon" not in sim.run_round(1)
    exact = FedSketch("heaprix", rows=2, cols=2)
    make_sim(exact)
    assert "second exchange" in exact.tags["sketch_epsilon_status"]
    assert default_c_over_sigma(DIM) == pytest.approx(3.30, abs=0.01)  # Φ⁻¹(1 − 0.025/52)


DP = ClientDP(clipping_norm=0.5, noise_multiplier=1.0, sampling_probability=1.0, expected_clients=4.0, delta=1e-5)


def test_dp_clips_and_noises_the_sketch():
    scheme = FedSketch("privix", rows=2, cols=7)
    sim = make_sim(scheme, client_dp=DP)
    sim.run_round(1)
    assert sim.accountant is not None and sim.epsilon() > 0
    assert 0 <= sim.privatizer.diagnostics["dp_clipped_fraction"] <= 1


@pytest.mark.parametrize("scheme", [lambda: FedSketch("heaprix", rows=2, cols=5), lambda: SketchedSGD(rows=2, cols=5)])
def test_dp_refused_when_exact_values_travel(scheme):
    with pytest.raises(ValueError, match="second exchange sends exact coordinates"):
        make_sim(scheme(), steps=1, client_dp=DP)
