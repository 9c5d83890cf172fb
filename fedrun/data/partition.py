"""Split sample indices across clients. Pure: arrays + ``np.random.Generator`` in, index arrays out.

Every partitioner returns ``num_clients`` sorted int64 arrays that are pairwise disjoint and together
hold every index ``0..N-1`` exactly once.
"""

from __future__ import annotations

import heapq
import operator
from typing import Any

import numpy as np


def _count(value: Any, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what}={value!r}; expected an integer >= {minimum}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{what}={value!r}; expected an integer >= {minimum}") from None
    if v < minimum:
        raise ValueError(f"{what}={v}; expected an integer >= {minimum}")
    return v


def _labels(labels: Any, what: str = "labels") -> np.ndarray:
    a = np.asarray(labels)
    if a.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        if not np.all(np.equal(np.mod(a, 1), 0)):
            raise ValueError(f"{what} must be integers, got dtype {a.dtype}")
        a = a.astype(np.int64)
    return a


def _check_clients(num_clients: Any, num_samples: int) -> int:
    m = _count(num_clients, "num_clients")
    if m > num_samples:
        raise ValueError(f"num_clients={m} is more than the {num_samples} samples; every client needs >= 1 sample")
    return m


def _finish(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def iid(num_samples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Uniformly random split into ``num_clients`` parts whose sizes differ by at most one."""
    n = _count(num_samples, "num_samples", 0)
    m = _check_clients(num_clients, n)
    return _finish(np.array_split(rng.permutation(n), m))


def _apportion(class_sizes: np.ndarray, total: int, cap: int) -> np.ndarray:
    """Shards per class: >= 1 per class, <= min(cap, size), sum = total, largest shard as small as possible."""
    counts = np.ones(len(class_sizes), dtype=np.int64)
    limit = np.minimum(cap, class_sizes)
    heap = [(-s / 1.0, c) for c, s in enumerate(class_sizes) if limit[c] > 1]
    heapq.heapify(heap)
    for _ in range(total - len(class_sizes)):
        _, c = heapq.heappop(heap)
        counts[c] += 1
        if counts[c] < limit[c]:
            heapq.heappush(heap, (-class_sizes[c] / counts[c], c))
    return counts


def shards(
    labels: Any,
    num_clients: int,
    classes_per_client: int,
    rng: np.random.Generator,
    distinct_classes: bool = True,
) -> list[np.ndarray]:
    """Label shards (McMahan et al. 2017, Sec. 3): each client gets ``classes_per_client`` = k shards.

    How: the N samples are grouped by label (random order inside a label) and cut into S = num_clients·k
    shards. Unlike the paper's equal cuts of the sorted list, each shard lies within ONE label: label c gets
    s_c >= 1 shards (at most num_clients), apportioned so that shard sizes are as equal as possible
    (MNIST, 100 clients, k = 2: 200 shards of 270-337 samples instead of 300), and its samples are split
    into s_c near-equal runs. Shards are then dealt to clients at random, k each.

    distinct_classes=True (default): the deal is constrained so that a client's k shards carry k different
    labels, so every client sees exactly k classes (start from a valid deal, then random label-preserving
    swaps). False: the paper's unconstrained random deal; a client may draw two shards of one label and see
    1..k classes (e.g. FedSKETCH's "1-2 classes per worker" with k = 2).

    Raises ValueError if k is outside [1, number of classes present], if S is smaller than the number of
    classes present (some label would have no shard), or if the labels are too few to fill S shards.
    """
    y = _labels(labels)
    m = _check_clients(num_clients, len(y))
    classes, inverse, sizes = np.unique(y, return_inverse=True, return_counts=True)
    c = len(classes)
    k = _count(classes_per_client, "classes_per_client")
    if k > c:
        raise ValueError(f"classes_per_client={k}; expected an integer in [1, {c}] (the classes present)")
    total = m * k
    if total < c:
        raise ValueError(
            f"num_clients * classes_per_client = {m} * {k} = {total} shards < {c} classes present; "
            f"every class needs a shard (use more clients or a larger classes_per_client)"
        )
    if np.minimum(m, sizes).sum() < total:
        raise ValueError(
            f"cannot cut {total} single-label shards with at most {m} (num_clients) per label "
            f"from label counts {sizes.tolist()}; use fewer clients or a smaller classes_per_client"
        )
    per_class = _apportion(sizes, total, m)
    by_class = [rng.permutation(np.flatnonzero(inverse == j)) for j in range(c)]
    shard_list: list[np.ndarray] = []
    shard_label: list[int] = []
    for j in rng.permutation(c):  # random label order → random column layout below
        for part in np.array_split(by_class[j], per_class[j]):
            shard_list.append(part)
            shard_label.append(int(j))
    if distinct_classes:
        # Column-major deal: shard p → client p % m. A label's <= m shards are consecutive → distinct clients.
        grid = np.arange(total).reshape(k, m).T  # grid[client] = shard ids
        _shuffle_deal(grid, np.asarray(shard_label), rng)
    else:
        grid = rng.permutation(total).reshape(m, k)
    order = rng.permutation(m)
    return _finish([np.concatenate([shard_list[s] for s in grid[i]]) for i in order])


def _shuffle_deal(grid: np.ndarray, shard_label: np.ndarray, rng: np.random.Generator, sweeps: int = 4) -> None:
    """Random swaps of shards between clients that keep every client's labels distinct (in place)."""
    m, k = grid.shape
    if m < 2:
        return
    labels = [set(shard_label[row].tolist()) for row in grid]
    n_moves = sweeps * m * k
    a_cl, b_cl = rng.integers(m, size=n_moves), rng.integers(m, size=n_moves)
    a_sl, b_sl = rng.integers(k, size=n_moves), rng.integers(k, size=n_moves)
    for a, b, i, j in zip(a_cl.tolist(), b_cl.tolist(), a_sl.tolist(), b_sl.tolist()):
        if a == b:
            continue
        la, lb = shard_label[grid[a, i]], shard_label[grid[b, j]]
        if la == lb or la in labels[b] or lb in labels[a]:
            continue
        grid[a, i], grid[b, j] = grid[b, j], grid[a, i]
        labels[a].remove(la)
        labels[a].add(lb)
        labels[b].remove(lb)
        labels[b].add(la)


def dirichlet(
    labels: Any,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 1,
    max_retries: int = 100,
) -> list[np.ndarray]:
    """Label-skewed split (Hsu et al. 2019): for each class c, proportions p_c ~ Dir(alpha · 1_num_clients)
    and class c's samples (in random order) are cut at the cumulative proportions.

    Smaller alpha → more skew. The draw is repeated (up to ``max_retries`` times) until every client has at
    least ``min_size`` samples; if it never does, the last draw is repaired by moving random samples from the
    largest clients to the ones short of ``min_size``.
    """
    y = _labels(labels)
    n = len(y)
    m = _check_clients(num_clients, n)
    a = float(alpha)
    if not np.isfinite(a) or a <= 0:
        raise ValueError(f"alpha={alpha!r}; expected a finite number > 0")
    min_size = _count(min_size, "min_size", 0)
    if min_size * m > n:
        raise ValueError(f"min_size={min_size} with num_clients={m} needs {min_size * m} samples; only {n} exist")
    _count(max_retries, "max_retries", 1)
    classes = np.unique(y)
    by_class = [np.flatnonzero(y == c) for c in classes]
    for _ in range(max_retries):
        owner = np.empty(n, dtype=np.int64)
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(m, a))
            cuts = np.round(np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for client, part in enumerate(np.split(idx, cuts)):
                owner[part] = client
        counts = np.bincount(owner, minlength=m)
        if counts.min() >= min_size:
            break
    else:
        _repair(owner, counts, min_size, rng)
    return [np.flatnonzero(owner == i).astype(np.int64) for i in range(m)]


def _repair(owner: np.ndarray, counts: np.ndarray, min_size: int, rng: np.random.Generator) -> None:
    """Move random samples from the currently largest client to each client below ``min_size`` (in place)."""
    for client in np.flatnonzero(counts < min_size):
        while counts[client] < min_size:
            donor = int(np.argmax(counts))
            need = min(min_size - counts[client], counts[donor] - min_size)
            pool = np.flatnonzero(owner == donor)
            moved = rng.choice(pool, size=need, replace=False)
            owner[moved] = client
            counts[donor] -= need
            counts[client] += need


def by_group(
    groups: Any, num_clients: int | None = None, rng: np.random.Generator | None = None, copies: int = 1
) -> list[np.ndarray]:
    """Natural split: one client per group (FEMNIST writer, Lending Club state), groups in sorted id order.

    ``copies`` > 1 repeats the whole list of clients that many times (client ``j + c·len``, c < copies, holds
    the same samples as client ``j``): a federation larger than the data's writers, e.g. the 350 clients per
    round of paper 001 from a 212-writer FEMNIST sample. The copies are distinct clients to the sampler.

    ``num_clients`` smaller than the number of groups merges whole groups: groups are taken largest first
    (ties: smaller id first) and each goes to the client with the fewest samples so far (ties: lowest
    client) — deterministic and size-balanced. ``rng`` is accepted for a uniform signature and unused.
    More clients than groups → ValueError naming the number of groups.
    """
    g = _labels(groups, "groups")
    if len(g) == 0:
        raise ValueError("groups is empty; nothing to partition")
    ids, inverse, sizes = np.unique(g, return_inverse=True, return_counts=True)
    members = np.argsort(inverse, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)])
    per_group = [members[starts[i] : starts[i + 1]] for i in range(len(ids))]
    k = _count(copies, "copies")
    if num_clients is None:
        return _finish(per_group * k)
    m = _count(num_clients, "num_clients")
    if m > len(ids):
        raise ValueError(f"num_clients={m} is more than the {len(ids)} groups; use num_clients <= {len(ids)} or None")
    heap = [(0, client) for client in range(m)]
    assigned: list[list[np.ndarray]] = [[] for _ in range(m)]
    for gi in sorted(range(len(ids)), key=lambda i: (-sizes[i], i)):
        load, client = heapq.heappop(heap)
        assigned[client].append(per_group[gi])
        heapq.heappush(heap, (load + int(sizes[gi]), client))
    return _finish([np.concatenate(parts) for parts in assigned] * k)


def partition_stats(parts: list[np.ndarray], labels: Any | None = None) -> dict[str, float | int]:
    """Summary of a partition: client count, samples per client and (with labels) distinct classes per client."""
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    stats: dict[str, float | int] = {
        "clients": len(parts),
        "samples": int(sizes.sum()),
        "samples_min": int(sizes.min()) if len(sizes) else 0,
        "samples_median": float(np.median(sizes)) if len(sizes) else 0.0,
        "samples_max": int(sizes.max()) if len(sizes) else 0,
        "samples_mean": float(sizes.mean()) if len(sizes) else 0.0,
    }
    if labels is not None and len(parts):
        y = np.asarray(labels)
        k = np.array([len(np.unique(y[p])) for p in parts])
        stats |= {"classes_min": int(k.min()), "classes_median": float(np.median(k)), "classes_max": int(k.max())}
    return stats
