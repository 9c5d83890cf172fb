"""Deterministic random streams keyed by (seed, round, purpose, …).

Every random draw of a run comes from a stream derived from the run's seed and the place it is used
(round number, purpose, client id), never from a global RNG. Two consequences: the vectorized and the
sequential training paths draw the same batches, and a resumed run continues with exactly the draws an
uninterrupted run would have made, without saving RNG states.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def _key(*parts: object) -> int:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def numpy_rng(seed: int, *parts: object) -> np.random.Generator:
    """A numpy Generator for one (seed, *parts) stream."""
    return np.random.default_rng(_key(int(seed), *parts))


def torch_generator(seed: int, *parts: object, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch Generator for one (seed, *parts) stream, on ``device``."""
    g = torch.Generator(device=device)
    g.manual_seed(_key(int(seed), *parts))
    return g


def derive_seed(seed: int, *parts: object) -> int:
    """A 63-bit integer seed for one (seed, *parts) stream (e.g. a shared seed sent to clients)."""
    return _key(int(seed), *parts)
