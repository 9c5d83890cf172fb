"""Clipping, noise samplers, client-level DP sum and events (fedrun.privacy.mechanisms)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

from fedrun.privacy.privatizer import ClientLevelDPSum
from fedrun.privacy.mechanisms import (
    GaussianEvent,
    LaplaceEvent,
    PoissonGaussianEvent,
    clip_rows,
    clip_vector,
    gaussian_noise,
    laplace_noise,
)
from tolerance import assert_f32_close

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
matrices = st.integers(1, 6).flatmap(lambda k: st.integers(1, 8).flatmap(
    lambda m: arrays(np.float64, (k, m), elements=finite)))


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


# --------------------------------------------------------------------------------------------------- clipping
@settings(max_examples=40, deadline=None)
@given(x=matrices, clipping_norm=st.floats(1e-3, 1e3), ord=st.sampled_from([1, 2]))
def test_clip_rows_invariants(x, clipping_norm, ord):
    t = torch.from_numpy(x)
    clipped, norms = clip_rows(t, clipping_norm, ord=ord)
    ref_norms = np.linalg.norm(x, ord=ord, axis=1)
    np.testing.assert_allclose(norms.numpy(), ref_norms, rtol=1e-12, atol=1e-150)  # numpy underflows tiny rows
    new_norms = np.linalg.norm(clipped.numpy(), ord=ord, axis=1)
    assert np.all(new_norms <= clipping_norm * (1 + 1e-12))
    for k in range(x.shape[0]):
        if ref_norms[k] <= clipping_norm:
            assert torch.equal(clipped[k], t[k])  # untouched, bit for bit
        else:
            # same direction, scaled to the boundary
            np.testing.assert_allclose(clipped[k].numpy(), x[k] * (clipping_norm / ref_norms[k]), rtol=1e-12)
            np.testing.assert_allclose(new_norms[k], clipping_norm, rtol=1e-12)


def test_clip_vector_matches_rows_and_known_values():
    v = torch.tensor([3.0, 4.0])  # L2 norm 5, L1 norm 7
    c, n = clip_vector(v, 1.0)
    assert n.item() == pytest.approx(5.0)
    assert_f32_close(c, [0.6, 0.8], [0.6, 0.8], terms=5)  # float32: the norm (squares, sum, sqrt), S/‖v‖, the product
    c1, n1 = clip_vector(v, 3.5, ord=1)
    assert n1.item() == pytest.approx(7.0)
    assert_f32_close(c1, [1.5, 2.0], [1.5, 2.0], terms=4)  # float32: the L1 norm (a sum), S/‖v‖₁, the product
    same, _ = clip_vector(v, 10.0)
    assert torch.equal(same, v)
    zero, nz = clip_vector(torch.zeros(4), 1.0)
    assert torch.equal(zero, torch.zeros(4)) and nz.item() == 0.0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_clip_rejects_bad_norm(bad):
    with pytest.raises(ValueError, match="clipping_norm"):
        clip_rows(torch.ones(2, 3), bad)


def test_clip_rejects_bad_shape_and_ord():
    with pytest.raises(ValueError, match="2-D"):
        clip_rows(torch.ones(3), 1.0)
    with pytest.raises(ValueError, match="1-D"):
        clip_vector(torch.ones(2, 3), 1.0)
    with pytest.raises(ValueError, match="ord=3"):
        clip_rows(torch.ones(2, 3), 1.0, ord=3)


# ------------------------------------------------------------------------------------------------------ noise
def test_gaussian_noise_distribution():
    x = gaussian_noise((200_000,), 2.5, _gen(0), dtype=torch.float64).numpy()
    assert x.std() == pytest.approx(2.5, rel=0.01)
    assert abs(x.mean()) < 5 * 2.5 / math.sqrt(x.size)
    assert stats.kstest(x, stats.norm(scale=2.5).cdf).pvalue > 1e-3


def test_laplace_noise_distribution():
    b = 0.7
    x = laplace_noise((200_000,), b, _gen(1), dtype=torch.float64).numpy()
    assert x.var() == pytest.approx(2 * b * b, rel=0.02)  # Laplace variance 2b²
    assert np.mean(np.abs(x)) == pytest.approx(b, rel=0.01)  # E|X| = b
    assert stats.kstest(x, stats.laplace(scale=b).cdf).pvalue > 1e-3


def test_noise_seeded_shape_dtype_and_zero_scale():
    a = laplace_noise((3, 4), 1.0, _gen(5))
    b = laplace_noise((3, 4), 1.0, _gen(5))
    assert torch.equal(a, b) and a.shape == (3, 4) and a.dtype == torch.float32
    assert not torch.equal(a, laplace_noise((3, 4), 1.0, _gen(6)))
    assert torch.equal(gaussian_noise((5,), 0.0, _gen(0)), torch.zeros(5))
    assert torch.equal(laplace_noise((5,), 0.0, _gen(0), dtype=torch.float64), torch.zeros(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="std=-1"):
        gaussian_noise((2,), -1.0, _gen(0))
    with pytest.raises(ValueError, match="scale=inf"):
        laplace_noise((2,), math.inf, _gen(0))


# ------------------------------------------------------------------------------------------ client-level sum
def _reference_clipped_sum(payload: np.ndarray, s: float) -> np.ndarray:
    total = np.zeros(payload.shape[1])
    for row in payload:
        n = math.sqrt(sum(v * v for v in row))
        total += row * min(1.0, s / n) if n > 0 else row
    return total


def _dp_sum(payload: torch.Tensor, s: float, sigma: float, w: float, gen: torch.Generator, chunk: int = 3):
    """fedrun's client-level DP sum (the runner's implementation), fed in chunks as the rounds do."""
    agg = ClientLevelDPSum(payload.shape[1], s, sigma, w, gen, payload.device, dtype=payload.dtype)
    for i in range(0, payload.shape[0], chunk):
        agg.add(payload[i:i + chunk])
    return agg.finish(), agg.diagnostics()


def test_dp_sum_without_noise_is_clipped_mean():
    rng = np.random.default_rng(0)
    payload = rng.normal(size=(7, 5)) * rng.uniform(0.1, 3, size=(7, 1))
    est, diag = _dp_sum(torch.from_numpy(payload), 1.0, 0.0, 10.0, _gen(0))
    np.testing.assert_allclose(est.numpy(), _reference_clipped_sum(payload, 1.0) / 10.0, rtol=1e-12)
    norms = np.linalg.norm(payload, axis=1)
    assert diag["dp_clients"] == 7
    assert diag["dp_clipped_fraction"] == pytest.approx(np.mean(norms > 1.0))
    assert diag["dp_mean_norm"] == pytest.approx(norms.mean())
    assert diag["dp_noise_std"] == 0.0


def test_dp_sum_noise_std():
    """Empirical std of (estimate − clipped mean) over many seeded draws is σS/expected_clients: 25·2000
    draws, so the sample std is within 5·(1/√(2·50000)) = 1.6 % of the true one with overwhelming probability."""
    payload = torch.randn(4, 2000, generator=_gen(3), dtype=torch.float64)
    sigma, s, w = 1.3, 0.5, 8.0
    clean = torch.from_numpy(_reference_clipped_sum(payload.numpy(), s) / w)
    residuals = [(_dp_sum(payload, s, sigma, w, _gen(100 + i))[0] - clean) for i in range(25)]
    r = torch.cat(residuals).numpy()
    assert r.std() == pytest.approx(sigma * s / w, rel=5 / math.sqrt(2 * r.size))
    assert abs(r.mean()) < 5 * sigma * s / w / math.sqrt(r.size)
    assert _dp_sum(payload, s, sigma, w, _gen(0))[1]["dp_noise_std"] == pytest.approx(sigma * s / w)


def test_dp_sum_with_no_clients_is_pure_noise():
    empty = torch.zeros(0, 50_000, dtype=torch.float64)
    est, diag = _dp_sum(empty, 2.0, 1.5, 4.0, _gen(9))
    assert est.shape == (50_000,) and est.dtype == torch.float64
    assert est.std().item() == pytest.approx(1.5 * 2.0 / 4.0, rel=5 / math.sqrt(2 * 50_000))
    assert diag["dp_clients"] == 0 and diag["dp_clipped_fraction"] == 0 and diag["dp_mean_norm"] == 0
    est0, _ = _dp_sum(empty, 2.0, 0.0, 4.0, _gen(9))
    assert torch.equal(est0, torch.zeros(50_000, dtype=torch.float64))


def test_dp_sum_bounds_each_clients_contribution():
    """One client with a huge update moves the noiseless estimate by at most S/expected_clients."""
    big = torch.full((1, 100), 1e6, dtype=torch.float64)
    est, _ = _dp_sum(big, 0.5, 0.0, 4.0, _gen(0))
    assert est.norm().item() == pytest.approx(0.5 / 4.0, rel=1e-12)


def test_dp_sum_is_seeded_and_validates():
    p = torch.randn(3, 10, generator=_gen(0))
    a, _ = _dp_sum(p, 1.0, 1.0, 3.0, _gen(1))
    b, _ = _dp_sum(p, 1.0, 1.0, 3.0, _gen(1), chunk=1)
    assert torch.equal(a, b)  # the noise does not depend on how the rows were chunked
    with pytest.raises(ValueError, match="noise_multiplier=-0.5"):
        _dp_sum(p, 1.0, -0.5, 3.0, _gen(1))
    with pytest.raises(ValueError, match="expected_clients=0"):
        _dp_sum(p, 1.0, 1.0, 0.0, _gen(1))
    with pytest.raises(ValueError, match="x has shape"):
        ClientLevelDPSum(3, 1.0, 1.0, 3.0, _gen(1), "cpu").add(torch.ones(3))


# ----------------------------------------------------------------------------------------------------- events
def test_events_are_frozen_hashable_and_validated():
    e = PoissonGaussianEvent(1.1, 0.01)
    assert e == PoissonGaussianEvent(1.1, 0.01) and len({e, PoissonGaussianEvent(1.1, 0.01)}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.noise_multiplier = 2.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="sampling_probability=1.5"):
        PoissonGaussianEvent(1.0, 1.5)
    with pytest.raises(ValueError, match="noise_multiplier=-1"):
        GaussianEvent(-1.0)
    with pytest.raises(ValueError, match="epsilon=0"):
        LaplaceEvent(0.0)
    assert LaplaceEvent(math.inf).epsilon == math.inf  # no noise added: accounted as ε = ∞
