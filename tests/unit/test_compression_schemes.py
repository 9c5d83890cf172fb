"""FL-RND, FL-FREQ and FL-CS (paper 000) on a tiny synthetic federation, against independent references.

References: FedAvg's own round, the DCT as an explicit matrix from ``scipy.fft.dct`` of the identity, FL-RND's
coordinates from ``RandomCoordinates`` (tested separately), clipping and BPDN's orthonormal closed form (soft
threshold) written out with numpy, and the closed forms 4·m (+8) for the bytes; all in float64 on the local
models the round itself aggregates (local training is tested against the sequential autograd path in
test_training.py). Tolerances: float32 round-off at the scale of the values (tests/tolerance.py); a DCT
coefficient (FFT or matrix) errs by at most ~n roundings of the input's L2 norm.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.fft
import torch
from torch import nn

from fedrun.comm import SEED_BYTES
from fedrun.sampling import PoissonSampler, UniformSampler
from fedrun.schemes.dct import CompressiveSensingScheme, FreqScheme
from fedrun.schemes.fedavg import FedAvg
from fedrun.schemes.random import RandomCoordinatesScheme
from fedrun.simulation import ClientDP, Simulation
from fedrun.training import ClientData, LocalSpec
from tolerance import assert_f32_close, f32_tol

N_CLIENTS, FEATURES, CLASSES = 6, 12, 4
DIM = FEATURES * CLASSES + CLASSES  # n = 52 parameters


def make_sim(scheme, *, seed: int = 0, client_dp: ClientDP | None = None, per_round: int = 4) -> Simulation:
    g = torch.Generator().manual_seed(123)
    x = torch.randn(N_CLIENTS * 20, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (N_CLIENTS * 20,), generator=g)
    sizes = [20, 20, 15, 20, 10, 20]  # unequal |D_k|: the FedAvg weights matter
    starts = np.cumsum([0] + sizes)
    parts = [np.arange(starts[i], starts[i + 1]) for i in range(N_CLIENTS)]
    torch.manual_seed(seed)
    model = nn.Linear(FEATURES, CLASSES)
    sampler = PoissonSampler(N_CLIENTS, 0.99) if client_dp is not None else UniformSampler(N_CLIENTS, per_round)
    spec = LocalSpec("sgd", steps=2, batch_size=5, lr=0.3)
    return Simulation(model=model, data=ClientData(x, y, parts), x_test=x[:30], y_test=y[:30], sampler=sampler,
                      scheme=scheme, spec=spec, seed=seed, client_dp=client_dp)


def dct_rows(n: int, m: int) -> np.ndarray:
    """Φ: the first m rows of the orthonormal DCT-II matrix, from scipy (independent of fedrun's FFT code)."""
    return scipy.fft.dct(np.eye(n), type=2, norm="ortho", axis=0)[:m]


def round_with_reference(sim: Simulation, rnd: int):
    """Run one round; return (clients, w before, deltas [K, n] float64, FedAvg weights, metrics)."""
    clients = sim.select(rnd)
    w0 = sim.params.clone()
    local = local_models(sim, clients, rnd)
    weights = sim.weights(clients)
    metrics = sim.run_round(rnd)  # selects the same clients (sim.select) and starts the ledger's round
    assert metrics["clients"] == len(clients)
    return clients, w0.double().numpy(), (local - w0).double().numpy(), weights, metrics


def local_models(sim: Simulation, clients: np.ndarray, rnd: int) -> torch.Tensor:
    """The local models [K, n] the round trains from the current global model (same path, same batches)."""
    return torch.cat([m for _, m, _ in sim.train(clients, rnd)])


def l2(x) -> float:
    return float(np.linalg.norm(np.asarray(x, dtype=np.float64)))


def soft(v: np.ndarray, lam: float) -> np.ndarray:
    return np.sign(v) * np.maximum(np.abs(v) - lam, 0.0)


# ------------------------------------------------------------------------------ FL-FREQ
def test_fl_freq_at_r_1_is_fl_std():
    a, b = make_sim(FreqScheme(r=1.0)), make_sim(FedAvg())
    for rnd in (1, 2):
        clients = a.select(rnd)
        w0 = a.params.clone()
        deltas = (local_models(a, clients, rnd) - w0).double().numpy()
        weights = a.weights(clients)
        for sim in (a, b):
            assert sim.run_round(rnd)["clients"] == len(clients)
        # both float32: FedAvg's weighted sum; FL-FREQ's DCT of each Δ_k, weighted sum, inverse DCT, + w0
        scale = sum(w * l2(d) for w, d in zip(weights, deltas))
        assert_f32_close(a.params, b.params, (w0, 2), scale, terms=2 * (len(clients) + 2 * DIM + 4),
                         msg=f"round {rnd}")
        b.params.copy_(a.params)  # the next round from the same model: training does not amplify round-off


@pytest.mark.parametrize("r", [0.1, 0.5])
def test_fl_freq_update_is_the_zero_filled_inverse_dct_of_the_mean_coefficients(r):
    sim = make_sim(FreqScheme(r=r))
    _, w0, deltas, weights, _ = round_with_reference(sim, 1)
    m = math.ceil(r * DIM)
    phi = dct_rows(DIM, m)
    expected = w0 + phi.T @ (phi @ (weights @ deltas))
    # float32: Δ_k, its DCT (≤ n roundings of ‖Δ_k‖₂), the weighted sum, the inverse DCT, + w0
    scale = sum(w * l2(d) for w, d in zip(weights, deltas))
    assert_f32_close(sim.params, expected, (w0, 1), scale, terms=2 * DIM + len(weights) + 4)
    assert sim.scheme.m == m and sim.scheme.compression_ratio == m / DIM


# ------------------------------------------------------------------------------ FL-RND
@pytest.mark.parametrize("r", [0.1, 0.3])
def test_fl_rnd_update_is_the_masked_fedavg_update(r):
    sim = make_sim(RandomCoordinatesScheme(r=r))
    _, w0, deltas, weights, _ = round_with_reference(sim, 3)
    idx = sim.scheme.coords.indices(3).numpy()
    mask = np.zeros(DIM)
    mask[idx] = 1.0
    assert len(idx) == math.ceil(r * DIM)
    # float32: Δ_k, a weighted sum of K, + w0
    assert_f32_close(sim.params, w0 + mask * (weights @ deltas), (w0, 1), weights @ np.abs(deltas),
                     terms=len(weights) + 3)


def test_fl_rnd_draws_new_coordinates_each_round_from_the_shared_seed():
    a, b = make_sim(RandomCoordinatesScheme(r=0.2)), make_sim(RandomCoordinatesScheme(r=0.2))
    assert torch.equal(a.scheme.coords.indices(1), b.scheme.coords.indices(1))
    assert not torch.equal(a.scheme.coords.indices(1), a.scheme.coords.indices(2))


# ------------------------------------------------------------------------------ FL-CS
def test_fl_cs_at_r_1_without_momentum_is_soft_thresholded_fedavg():
    """Φ orthonormal (r = 1, P = 1): BPDN's solution is soft(Φᵀy, λ), and the error is y − Φs."""
    scheme = CompressiveSensingScheme(r=1.0, chunks=1, momentum=0.0, lam_rel=0.2, max_iter=50)
    sim = make_sim(scheme)
    _, w0, deltas, weights, metrics = round_with_reference(sim, 1)
    phi = dct_rows(DIM, DIM)
    y = phi @ (weights @ deltas)
    z = phi.T @ y
    s = soft(z, 0.2 * np.abs(z).max())
    # float32: y as above, λ = 0.2·max|z| from a DCT, then the solver's iterates s ← soft(s + Φᵀ(y − Φs), λ): with Φ
    # orthonormal an iteration maps any s to soft(Φᵀy, λ) whatever the error in s (I − ΦᵀΦ = 0), so the round-off
    # does not add up over iterations; FISTA's extrapolation mixes the last three iterates. Soft thresholding is
    # 1-Lipschitz; + w0.
    scale = sum(w * l2(d) for w, d in zip(weights, deltas))
    assert 1 <= metrics["cs_iterations"] <= 50
    terms = len(weights) + 3 * (4 * DIM + 6)
    assert_f32_close(sim.params, w0 + s, (w0, 1), scale, terms=terms)
    assert_f32_close(scheme.e, y - phi @ s, scale, terms=terms + DIM + 1)


@pytest.mark.parametrize("chunks", [1, 2])
def test_fl_cs_momentum_and_accumulated_error_follow_the_definition(chunks):
    """Alg. 3 lines 8–13 recomputed in numpy over two rounds: u, p, e and w."""
    rho = 0.8
    scheme = CompressiveSensingScheme(r=0.3, chunks=chunks, momentum=rho, lam_rel=0.1, max_iter=400, tol=1e-8)
    sim = make_sim(scheme)
    m = scheme.m
    if chunks == 1:
        phi = dct_rows(DIM, m)
    else:  # the shuffled/chunked layout itself is tested in test_compress_cs.py; Φ = the operator on the identity
        phi = scheme.comp.compress(torch.eye(DIM, dtype=torch.float64).T.contiguous().float()).double().numpy().T
    u, e = np.zeros(m), np.zeros(m)
    u_scale = e_scale = 0.0  # the same recursions on L2 norms: the scale of u's and e's float32 round-off
    u_terms = e_terms = 0
    readback = 0.0  # the reference e uses s read back from w_t: one rounding of ‖w_t‖₂ per round, carried along
    for rnd in (1, 2):
        _, w0, deltas, weights, metrics = round_with_reference(sim, rnd)
        y = phi @ (weights @ deltas)  # line 8
        u = rho * u + y  # line 9
        p = u + e  # line 10
        s = sim.params.double().numpy() - w0  # line 13: w_t = w_{t−1} + s_t
        e = p - phi @ s  # line 12
        # float32: y (Δ_k, a DCT of n terms, a weighted sum of K), ρ·u + y; e: p − Φs (n terms), where the s read
        # back from w_t carries w_t's rounding (≤ eps32·‖w_t‖₂ in L2, Φ orthonormal rows)
        y_scale = sum(w * l2(d) for w, d in zip(weights, deltas))
        u_scale, u_terms = rho * u_scale + y_scale, u_terms + DIM + len(weights) + 4
        e_scale = u_scale + e_scale + l2(s)
        e_terms = max(e_terms, u_terms) + DIM + 3
        readback += l2(w0 + s)
        assert_f32_close(scheme.u, u, u_scale, terms=u_terms)
        assert_f32_close(scheme.e, e, (readback, 1), e_scale, terms=e_terms)
        assert np.abs(s).sum() > 0 and metrics["cs_iterations"] >= 1
        # s is a BPDN solution for p (KKT on the support: Φᵀ(p − Φs) = λ·sign(s), up to the solver's tolerance
        # of 2% of λ), plus the float32 round-off of p and of the s read back from w_t
        lam = 0.1 * np.abs(phi.T @ p).max()
        grad = phi.T @ (p - phi @ s)
        assert np.all(np.abs(grad) <= lam * 1.02 + f32_tol((readback, 1), e_scale, terms=e_terms + DIM))


def test_fl_cs_without_error_feedback_keeps_no_error():
    scheme = CompressiveSensingScheme(r=0.3, chunks=1, error_feedback=False, max_iter=5)
    sim = make_sim(scheme)
    round_with_reference(sim, 1)
    assert float(scheme.e.abs().max()) == 0.0 and float(scheme.u.abs().max()) > 0


def test_fl_cs_state_dict_resumes_exactly():
    def scheme():
        return CompressiveSensingScheme(r=0.3, chunks=2, momentum=0.9, max_iter=10)

    full = make_sim(scheme())
    for rnd in (1, 2, 3):
        full.run_round(rnd)
    first = make_sim(scheme())
    for rnd in (1, 2):
        first.run_round(rnd)
    second = make_sim(scheme())
    second.params.copy_(first.params)
    second.scheme.load_state_dict(first.scheme.state_dict())
    second.run_round(3)
    torch.testing.assert_close(second.params, full.params, atol=0, rtol=0)
    torch.testing.assert_close(second.scheme.e, full.scheme.e, atol=0, rtol=0)


def test_fl_cs_owlqn_and_fista_reach_the_same_bpdn_objective():
    sims = [make_sim(CompressiveSensingScheme(r=0.5, chunks=1, momentum=0.0, solver=solver, max_iter=1000, tol=1e-8))
            for solver in ("fista", "owlqn")]
    phi = dct_rows(DIM, math.ceil(0.5 * DIM))
    values, duals, sols, w_scale = [], [], [], 0.0
    for sim in sims:
        w0 = sim.params.double().numpy()
        w_scale = max(w_scale, float(np.linalg.norm(w0)))
        sim.run_round(1)
        p, s = sim.scheme.u.double().numpy(), sim.params.double().numpy() - w0  # round 1, ρ = 0: p = y
        lam = sim.scheme.lam_rel * np.abs(phi.T @ p).max()
        r = p - phi @ s
        values.append(0.5 * r @ r + lam * np.abs(s).sum())
        u = r * min(1.0, lam / np.abs(phi.T @ r).max())  # dual-feasible: ‖Φᵀu‖∞ ≤ λ
        duals.append(0.5 * p @ p - 0.5 * np.sum((p - u) ** 2))  # weak duality: f* ≥ this
        sols.append(s)
    # solver tolerances (tol=1e-8 on the iterates of two different algorithms), not float32 round-off: the
    # objective is flat near the minimum, so the objectives agree far better than the minimizers
    assert values[1] == pytest.approx(values[0], rel=1e-4)
    # with m < n rows the minimizer need not be unique (the solvers may differ along Φ's null space), but Φs is:
    # ½‖Φ(s − s*)‖² ≤ f(s) − f* ≤ f(s) − max dual, so ‖Φ(s₁ − s₂)‖ is bounded by the certified gaps (plus the
    # float32 round-off of s = w − w0, at most a few ulps of ‖w‖)
    lower = max(duals)
    bound = sum(math.sqrt(2 * max(v - lower, 0.0)) for v in values) + 8 * np.finfo(np.float32).eps * w_scale
    assert np.linalg.norm(phi @ (sols[0] - sols[1])) <= bound


# ------------------------------------------------------------------------------ bytes
@pytest.mark.parametrize("scheme,extra", [
    (lambda: RandomCoordinatesScheme(r=0.1), SEED_BYTES),
    (lambda: FreqScheme(r=0.1), 0),
    (lambda: CompressiveSensingScheme(r=0.1, chunks=2, max_iter=3), 0),
])
def test_uplink_is_4m_plus_the_seed_per_selected_client(scheme, extra):
    sim = make_sim(scheme())
    clients, *_ = round_with_reference(sim, 1)
    m = math.ceil(0.1 * DIM)
    assert sim.scheme.payload_dim == m
    assert sim.ledger.uplink_round == len(clients) * (4 * m + extra)
    assert sim.ledger.downlink_round == len(clients) * 4 * DIM


# ------------------------------------------------------------------------------ client-level DP
def _clip(rows: np.ndarray, S: float) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows * np.minimum(1.0, S / np.maximum(norms, 1e-30))


DP0 = ClientDP(clipping_norm=0.02, noise_multiplier=0.0, sampling_probability=0.99, expected_clients=0.99 * N_CLIENTS,
               delta=1e-5)


def test_dp_fl_rnd_clips_the_m_coordinates_it_sends():
    sim = make_sim(RandomCoordinatesScheme(r=0.2), client_dp=DP0)
    _, w0, deltas, _, _ = round_with_reference(sim, 1)
    idx = sim.scheme.coords.indices(1).numpy()
    sent = deltas[:, idx]
    assert np.all(np.linalg.norm(sent, axis=1) > 0.02)  # every client is clipped in the m-dim domain …
    assert np.all(np.linalg.norm(sent, axis=1) < np.linalg.norm(deltas, axis=1))  # … a smaller norm than Δw
    expected = w0.copy()
    clipped = _clip(sent, 0.02)
    expected[idx] += clipped.sum(0) / DP0.expected_clients
    # float32: Δ, its norm over m coordinates, the clip, a sum of K, ÷ E, + w0
    K, m = len(sent), len(idx)
    update = np.zeros(DIM)
    update[idx] = np.abs(clipped).sum(0) / DP0.expected_clients
    assert_f32_close(sim.params, expected, (w0, 1), update, terms=K + m + 5)
    # a mean of K float32 norms of m coordinates: relative round-off
    assert sim.privatizer.diagnostics["dp_mean_norm"] == pytest.approx(np.linalg.norm(sent, axis=1).mean(),
                                                                    rel=f32_tol(1.0, terms=K + m + 3))


@pytest.mark.parametrize("make", [lambda: FreqScheme(r=0.2), lambda: CompressiveSensingScheme(
    r=0.2, chunks=1, momentum=0.0, lam_rel=0.3, max_iter=200)])
def test_dp_dct_schemes_clip_the_m_coefficients_they_send(make):
    sim = make_sim(make(), client_dp=DP0)
    _, w0, deltas, _, _ = round_with_reference(sim, 1)
    m = math.ceil(0.2 * DIM)
    phi = dct_rows(DIM, m)
    coefs = deltas @ phi.T
    y = _clip(coefs, 0.02).sum(0) / DP0.expected_clients
    # float32 DCT coefficients: ≤ n roundings of ‖Δ_k‖₂ each, so their norms err by ≤ √m of that
    K = len(deltas)
    norm_tol = f32_tol(np.sqrt(m) * np.linalg.norm(deltas, axis=1).mean(), terms=DIM + m + 3)
    mean_norm = np.linalg.norm(coefs, axis=1).mean()
    assert sim.privatizer.diagnostics["dp_mean_norm"] == pytest.approx(mean_norm, abs=norm_tol)
    s = sim.params.double().numpy() - w0
    # float32: the coefficients, the clip, a sum of K, ÷ E, the inverse DCT; s read back from w_t carries w_t's rounding
    y_scale = K * 0.02 / DP0.expected_clients  # ‖y‖₂ ≤ Σ‖clip‖₂ ≤ K·S/E
    terms = 2 * DIM + K + m + 6
    if isinstance(sim.scheme, FreqScheme):
        assert_f32_close(s, phi.T @ y, (np.abs(w0) + np.abs(s), 1), y_scale, terms=terms)
    else:  # the reconstruction fits y up to λ: Φᵀ(y − Φs) within the L1 subgradient bound
        lam = 0.3 * np.abs(phi.T @ y).max()
        assert np.abs(phi.T @ (y - phi @ s)).max() <= lam * 1.05
        assert_f32_close(sim.scheme.e, y - phi @ s, (l2(w0 + s), 1), y_scale + l2(s), terms=terms + DIM)


def test_dp_noise_raises_lambda_with_lam_noise():
    dp = ClientDP(clipping_norm=0.5, noise_multiplier=2.0, sampling_probability=0.99, expected_clients=5.0, delta=1e-5)
    scheme = CompressiveSensingScheme(r=0.3, chunks=1, momentum=0.5, lam_rel=0.01, lam_noise=1.0, max_iter=5)
    sim = make_sim(scheme, client_dp=dp)
    sim.run_round(1)
    sigma_p = 2.0 * 0.5 / 5.0  # one round: Σ ρ^{2i} = 1
    assert scheme.noise_std() == pytest.approx(sigma_p)
    assert scheme.lam(1e9) == pytest.approx(0.01 * 1e9)  # lam_rel wins when it is larger
    assert scheme.lam(1e-9) == pytest.approx(sigma_p * math.sqrt(2 * math.log(DIM)))
    sim.run_round(2)
    assert scheme.noise_std() == pytest.approx(sigma_p * math.sqrt(1 + 0.25))


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("make,message", [
    (lambda: RandomCoordinatesScheme(r=0.0), r"r=0.0 is outside \(0, 1\]"),
    (lambda: FreqScheme(r=1.5), r"r=1.5 is outside \(0, 1\]"),
    (lambda: CompressiveSensingScheme(r=-0.1), r"r=-0.1 is outside \(0, 1\]"),
    (lambda: CompressiveSensingScheme(r=0.1, chunks=0), r"scheme.chunks=0; allowed: an integer P >= 1"),
    (lambda: CompressiveSensingScheme(r=0.1, solver="lasso"), r"scheme.solver='lasso' is unknown; allowed: fista, owlqn"),
    (lambda: CompressiveSensingScheme(r=0.1, lam_rel=0.0), r"scheme.lam_rel=0.0; allowed: 0 < lam_rel < 1"),
    (lambda: CompressiveSensingScheme(r=0.1, momentum=1.0), r"scheme.momentum=1.0; allowed: 0 <= momentum < 1"),
    (lambda: CompressiveSensingScheme(r=0.1, max_iter=0), r"scheme.max_iter=0; allowed: an integer >= 1"),
])
def test_bad_scheme_values_are_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_more_chunks_than_coefficients_is_refused_at_setup():
    # the scheme's setup (run by the Simulation's constructor) raises ValueError; fedrun.run.build reports it as a
    # ConfigError
    with pytest.raises(ValueError, match=r"scheme.chunks=10 with r=0.1 and n=52: chunks=10; allowed: 1 <= chunks <= m=6"):
        make_sim(CompressiveSensingScheme(r=0.1, chunks=10))
