"""FL-RND's shared-seed random coordinates and the shared shuffling permutation (fedrun.compress.masks)."""

from __future__ import annotations

import math

import pytest
import torch

from fedrun.compress.masks import RandomCoordinates, derive_seed, num_kept, shared_permutation


def test_client_and_server_draw_the_same_indices() -> None:
    client, server = RandomCoordinates(10_000, 0.05, seed=7), RandomCoordinates(10_000, 0.05, seed=7)
    for t in (0, 1, 5, 199):
        torch.testing.assert_close(client.indices(t), server.indices(t), rtol=0, atol=0)


def test_indices_are_m_distinct_sorted_coordinates_that_change_with_round_and_seed() -> None:
    rc = RandomCoordinates(1000, 0.1, seed=3)
    idx = rc.indices(0)
    assert idx.dtype == torch.long and idx.shape == (100,) and rc.m == 100
    assert idx.unique().numel() == 100 and int(idx.min()) >= 0 and int(idx.max()) < 1000
    assert torch.equal(idx, idx.sort().values)
    assert not torch.equal(idx, rc.indices(1))
    assert not torch.equal(idx, RandomCoordinates(1000, 0.1, seed=4).indices(0))


def test_caller_rng_is_left_alone() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    RandomCoordinates(500, 0.2, seed=1).indices(3)
    shared_permutation(500, seed=1)
    assert torch.equal(torch.get_rng_state(), state)


def test_compress_decompress_keep_the_drawn_coordinates_and_are_linear() -> None:
    gen = torch.Generator().manual_seed(0)
    rc = RandomCoordinates(300, 0.1, seed=2)
    a, b = torch.randn(4, 300, generator=gen), torch.randn(4, 300, generator=gen)
    ya, yb = rc.compress(a, 5), rc.compress(b, 5)
    assert ya.shape == (4, 30)
    torch.testing.assert_close(ya + yb, rc.compress(a + b, 5), rtol=0, atol=0)  # selection commutes with + exactly
    idx = rc.indices(5)
    restored = rc.decompress(ya, 5)
    expected = torch.zeros_like(a)
    expected[:, idx] = a[:, idx]  # explicit reference: the drawn coordinates, zeros elsewhere
    torch.testing.assert_close(restored, expected, rtol=0, atol=0)
    # decompress is the adjoint of compress: <Cx, y> = <x, Dy>
    y = torch.randn(30, generator=gen, dtype=torch.float64)
    x = torch.randn(300, generator=gen, dtype=torch.float64)
    assert float(rc.compress(x, 5) @ y) == pytest.approx(float(x @ rc.decompress(y, 5)))


def test_shared_permutation_is_a_fixed_permutation() -> None:
    p = shared_permutation(1000, seed=11)
    assert torch.equal(p.sort().values, torch.arange(1000))
    assert torch.equal(p, shared_permutation(1000, seed=11))
    assert not torch.equal(p, shared_permutation(1000, seed=12))


def test_derive_seed_is_stable_and_context_dependent() -> None:
    assert derive_seed(1, "a", 2) == derive_seed(1, "a", 2)
    assert len({derive_seed(1, "a", 2), derive_seed(1, "a", 3), derive_seed(2, "a", 2), derive_seed(1, "b", 2)}) == 4
    assert 0 <= derive_seed(2**70, "x") < 2**63


@pytest.mark.parametrize(("n", "r", "m"), [(10, 0.7, 7), (61706, 0.05, 3086), (5, 1e-9, 1), (3, 1.0, 3), (100, 0.333, 34)])
def test_num_kept_is_ceil_r_n(n: int, r: float, m: int) -> None:
    assert num_kept(n, r) == m
    assert m == max(1, math.ceil(round(r * n, 9)))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: RandomCoordinates(10, 0.0), r"r=0.0; allowed: 0 < r <= 1"),
        (lambda: RandomCoordinates(10, 1.5), r"r=1.5; allowed: 0 < r <= 1"),
        (lambda: RandomCoordinates(0, 0.5), r"n=0; allowed: n >= 1"),
        (lambda: RandomCoordinates(10, 0.5).indices(-1), r"round=-1; allowed: round >= 0"),
        (lambda: RandomCoordinates(10, 0.5).compress(torch.zeros(9), 0), r"x.shape=\(9,\); allowed: last dimension == 10"),
        (lambda: RandomCoordinates(10, 0.5).decompress(torch.zeros(4), 0), r"y.shape=\(4,\); allowed: last dimension == 5"),
        (lambda: shared_permutation(0, 1), r"n=0; allowed: n >= 1"),
    ],
)
def test_bad_input_raises_value_error(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
