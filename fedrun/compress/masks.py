"""Shared-seed randomness for compression: FL-RND's random coordinates and FL-CS's shuffling permutation.

Clients and server derive the same indices from a shared integer seed, so no index list is sent
(paper 000, FL-RND [inferred] and "Scalable reconstruction", Sec. III-C). Every draw uses a private
CPU ``torch.Generator`` seeded from a hash of ``(purpose, seed, round)``: the caller's global RNG is
never touched, and the indices are identical whatever device the caller works on (CUDA generators
produce different streams, so indices are drawn on the CPU and then moved).
"""

from __future__ import annotations

import hashlib
import math

import torch


def derive_seed(seed: int, *context: int | str) -> int:
    """A 63-bit seed from ``seed`` and a context (purpose tag, round, ...): stable across runs and platforms."""
    text = ":".join(str(part) for part in (seed, *context))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def generator(seed: int, *context: int | str) -> torch.Generator:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(derive_seed(seed, *context))
    return gen


def shared_permutation(n: int, seed: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Permutation of ``range(n)`` fixed by ``seed`` (the same in every round), as a LongTensor on ``device``.

    The client-side shuffle of FL-CS's scalable reconstruction (paper 000, Sec. III-C): "shuffling is
    also performed identically over all the rounds to maintain the error".
    """
    if n < 1:
        raise ValueError(f"n={n}; allowed: n >= 1")
    return torch.randperm(n, generator=generator(seed, "permutation", n)).to(device)


def num_kept(n: int, r: float) -> int:
    """``m = ceil(r·n)`` (paper 000: ``m = r × n``, rounded up so that m >= 1), after validating n and r."""
    if n < 1:
        raise ValueError(f"n={n}; allowed: n >= 1")
    if not 0.0 < r <= 1.0:
        raise ValueError(f"r={r}; allowed: 0 < r <= 1")
    return min(n, math.ceil(r * n * (1.0 - 1e-12)))  # so that r = m/n given as a float gives back m


class RandomCoordinates:
    """FL-RND's compressor: ``m = ceil(r·n)`` coordinates drawn afresh each round from a shared seed.

    ``indices(t)`` depends only on ``(seed, t)``, so clients and server agree without sending indices: the
    uplink message is the ``m`` float32 values plus the seed (a scheme counts 4·m + 8 bytes). ``compress``
    and ``decompress`` are linear; ``decompress(compress(x, t), t)`` keeps ``x`` on the drawn coordinates and
    is zero elsewhere (the server updates only those coordinates).

    Args:
        n: length of the flat update, ``n >= 1``.
        r: compression ratio, ``0 < r <= 1``.
        seed: integer shared by all clients and the server.
        device: where ``indices`` live (the draw itself always happens on the CPU).
    """

    def __init__(self, n: int, r: float, seed: int = 0, device: torch.device | str | None = None) -> None:
        self.m, self.n, self.r, self.seed = num_kept(n, r), n, r, seed
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    def indices(self, round: int) -> torch.Tensor:
        """Sorted LongTensor ``[m]`` of distinct coordinates for round ``round >= 0``."""
        if round < 0:
            raise ValueError(f"round={round}; allowed: round >= 0")
        perm = torch.randperm(self.n, generator=generator(self.seed, "random-coordinates", self.n, round))
        return perm[: self.m].sort().values.to(self.device)

    def compress(self, x: torch.Tensor, round: int) -> torch.Tensor:
        """``x[..., n] -> x[..., indices(round)]`` of shape ``[..., m]`` (batched over clients)."""
        _check_last_dim(x, self.n, "x")
        return x[..., self.indices(round).to(x.device)]

    def decompress(self, y: torch.Tensor, round: int) -> torch.Tensor:
        """``y[..., m] -> [..., n]``: the values at ``indices(round)``, zeros elsewhere (adjoint of compress)."""
        _check_last_dim(y, self.m, "y")
        out = y.new_zeros(*y.shape[:-1], self.n)
        out[..., self.indices(round).to(y.device)] = y
        return out


def _check_last_dim(x: torch.Tensor, size: int, name: str) -> None:
    if x.ndim < 1 or x.shape[-1] != size:
        raise ValueError(f"{name}.shape={tuple(x.shape)}; allowed: last dimension == {size}")
