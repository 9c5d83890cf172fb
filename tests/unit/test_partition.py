"""fedrun.data.partition: invariants (property tests), heterogeneity, determinism, validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrun.data.partition import by_group, dirichlet, iid, partition_stats, shards

FAST = settings(max_examples=60, deadline=None)


def assert_partition(parts: list[np.ndarray], n: int, num_clients: int) -> None:
    """Disjoint, union = range(n), int64, num_clients parts."""
    assert len(parts) == num_clients
    assert all(p.dtype == np.int64 and p.ndim == 1 for p in parts)
    allidx = np.concatenate(parts) if parts else np.array([], dtype=np.int64)
    assert len(allidx) == n
    assert np.array_equal(np.sort(allidx), np.arange(n))


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@st.composite
def labelled(draw, max_classes: int = 8, max_per_class: int = 40):
    """Labels with 1..max_classes classes (non-contiguous ids), shuffled."""
    c = draw(st.integers(1, max_classes))
    counts = draw(st.lists(st.integers(1, max_per_class), min_size=c, max_size=c))
    ids = draw(st.lists(st.integers(-5, 100), min_size=c, max_size=c, unique=True))
    y = np.repeat(np.array(ids), counts)
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(y)


# ---------------------------------------------------------------- iid


@FAST
@given(n=st.integers(1, 500), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_iid_is_a_partition(n, data, seed):
    m = data.draw(st.integers(1, n))
    parts = iid(n, m, rng(seed))
    assert_partition(parts, n, m)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_iid_deterministic_and_random():
    a, b, c = iid(100, 7, rng(1)), iid(100, 7, rng(1)), iid(100, 7, rng(2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


# ---------------------------------------------------------------- shards


@FAST
@given(y=labelled(), data=st.data(), seed=st.integers(0, 2**32 - 1), distinct=st.booleans())
def test_shards_partition_and_classes_per_client(y, data, seed, distinct):
    c = len(np.unique(y))
    k = data.draw(st.integers(1, c))
    m = data.draw(st.integers(1, 30))
    try:
        parts = shards(y, m, k, rng(seed), distinct_classes=distinct)
    except ValueError as e:  # only the documented infeasible cases
        counts = np.unique(y, return_counts=True)[1]
        assert m > len(y) or m * k < c or np.minimum(m, counts).sum() < m * k, str(e)
        return
    assert_partition(parts, len(y), m)
    per_client = [len(np.unique(y[p])) for p in parts]
    if distinct:
        assert per_client == [k] * m
    else:
        assert all(1 <= q <= k for q in per_client)


def test_shards_mnist_like_classic_setting():
    y = np.repeat(np.arange(10), [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949])
    parts = shards(y, 100, 2, rng(0))
    assert_partition(parts, len(y), 100)
    s = partition_stats(parts, y)
    assert (s["classes_min"], s["classes_max"]) == (2, 2)
    assert 540 <= s["samples_min"] and s["samples_max"] <= 680  # 2 shards of 270-337
    # pairs of classes are mixed, not a fixed pattern
    pairs = {tuple(np.unique(y[p])) for p in parts}
    assert len(pairs) >= 20
    loose = shards(y, 100, 2, rng(0), distinct_classes=False)
    assert partition_stats(loose, y)["classes_min"] >= 1


def test_shards_one_class_per_client():
    y = np.repeat(np.arange(4), 25)
    parts = shards(y, 8, 1, rng(3))
    assert [len(np.unique(y[p])) for p in parts] == [1] * 8
    assert sorted(len(p) for p in parts) == [12] * 4 + [13] * 4


def test_shards_deterministic():
    y = np.repeat(np.arange(5), 30)
    a, b = shards(y, 10, 2, rng(5)), shards(y, 10, 2, rng(5))
    assert all(np.array_equal(x, z) for x, z in zip(a, b))


# ---------------------------------------------------------------- dirichlet


@FAST
@given(
    y=labelled(),
    data=st.data(),
    alpha=st.floats(0.01, 100),
    seed=st.integers(0, 2**32 - 1),
)
def test_dirichlet_is_a_partition_with_min_size(y, data, alpha, seed):
    m = data.draw(st.integers(1, min(20, len(y))))
    min_size = data.draw(st.integers(0, len(y) // m))
    parts = dirichlet(y, m, alpha, rng(seed), min_size=min_size, max_retries=3)
    assert_partition(parts, len(y), m)
    assert min(len(p) for p in parts) >= min_size


def _mean_tv(parts: list[np.ndarray], y: np.ndarray) -> float:
    """Mean total-variation distance between client label distributions and the global one."""
    glob = np.bincount(y) / len(y)
    return float(np.mean([0.5 * np.abs(np.bincount(y[p], minlength=len(glob)) / len(p) - glob).sum() for p in parts]))


def test_dirichlet_heterogeneity_grows_as_alpha_shrinks():
    y = np.repeat(np.arange(10), 600)
    tv = [np.mean([_mean_tv(dirichlet(y, 20, a, rng(s), min_size=5), y) for s in range(3)]) for a in (100, 1, 0.1)]
    assert tv[0] < 0.1 < tv[1] < tv[2]
    classes = [partition_stats(dirichlet(y, 20, a, rng(0), min_size=5), y)["classes_median"] for a in (100, 0.05)]
    assert classes[0] == 10 and classes[1] <= 3


def test_dirichlet_repair_reaches_min_size():
    y = np.repeat(np.arange(3), 100)
    parts = dirichlet(y, 30, 0.01, rng(0), min_size=8, max_retries=1)
    assert_partition(parts, 300, 30)
    assert min(len(p) for p in parts) >= 8


def test_dirichlet_deterministic():
    y = np.repeat(np.arange(4), 50)
    a, b = dirichlet(y, 6, 0.5, rng(9)), dirichlet(y, 6, 0.5, rng(9))
    assert all(np.array_equal(x, z) for x, z in zip(a, b))


# ---------------------------------------------------------------- by_group


@FAST
@given(
    groups=st.lists(st.integers(0, 40), min_size=1, max_size=300),
    data=st.data(),
)
def test_by_group_keeps_groups_intact(groups, data):
    g = np.array(groups)
    n_groups = len(np.unique(g))
    m = data.draw(st.one_of(st.none(), st.integers(1, n_groups)))
    parts = by_group(g, m, rng(0))
    assert_partition(parts, len(g), n_groups if m is None else m)
    owner = np.empty(len(g), dtype=int)
    for i, p in enumerate(parts):
        owner[p] = i
    for gid in np.unique(g):  # each group lies within exactly one client
        assert len(np.unique(owner[g == gid])) == 1
    assert all(len(p) > 0 for p in parts)
    if m is not None:  # greedy balance: spread at most the largest group
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= np.bincount(g).max()


def test_by_group_one_client_per_group_in_id_order():
    g = np.array([3, 1, 3, 2, 1, 3])
    assert [p.tolist() for p in by_group(g)] == [[1, 4], [3], [0, 2, 5]]


def test_by_group_merges_balanced_and_deterministic():
    g = np.repeat(np.arange(6), [10, 9, 5, 4, 3, 1])
    parts = by_group(g, 2)
    assert sorted(len(p) for p in parts) == [15, 17]  # largest first, each to the lighter client
    assert all(np.array_equal(a, b) for a, b in zip(parts, by_group(g, 2, rng(123))))


def test_by_group_copies_repeat_every_client():
    g = np.array([3, 1, 3, 2, 1, 3])
    assert [p.tolist() for p in by_group(g, copies=3)] == [[1, 4], [3], [0, 2, 5]] * 3
    merged = by_group(g, 2)
    assert [p.tolist() for p in by_group(g, 2, copies=2)] == [p.tolist() for p in merged] * 2
    with pytest.raises(ValueError, match=r"copies=0; expected an integer >= 1"):
        by_group(g, copies=0)


def test_by_group_too_many_clients_names_group_count():
    with pytest.raises(ValueError, match=r"num_clients=4 is more than the 3 groups"):
        by_group(np.array([0, 1, 2, 2]), 4)


# ---------------------------------------------------------------- validation and stats


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_num_clients_validation(bad):
    y = np.repeat(np.arange(3), 10)
    for call in (
        lambda: iid(30, bad, rng()),
        lambda: shards(y, bad, 1, rng()),
        lambda: dirichlet(y, bad, 1.0, rng()),
        lambda: by_group(y, bad),
    ):
        with pytest.raises(ValueError, match=rf"num_clients={bad!r}|num_clients={bad}"):
            call()


def test_more_clients_than_samples():
    with pytest.raises(ValueError, match="num_clients=11 is more than the 10 samples"):
        iid(10, 11, rng())
    with pytest.raises(ValueError, match="num_clients=11 is more than the 10 samples"):
        dirichlet(np.zeros(10, dtype=int), 11, 1.0, rng())


@pytest.mark.parametrize("k", [0, 4])
def test_classes_per_client_range(k):
    with pytest.raises(ValueError, match=rf"classes_per_client={k}.*\[1, 3\]|classes_per_client={k}; expected"):
        shards(np.repeat(np.arange(3), 10), 5, k, rng())


def test_shards_too_few_shards_for_classes():
    with pytest.raises(ValueError, match=r"2 \* 1 = 2 shards < 3 classes"):
        shards(np.repeat(np.arange(3), 10), 2, 1, rng())


@pytest.mark.parametrize("alpha", [0, -0.5, float("nan"), float("inf")])
def test_alpha_validation(alpha):
    with pytest.raises(ValueError, match=rf"alpha={alpha!r}"):
        dirichlet(np.repeat(np.arange(3), 10), 3, alpha, rng())


def test_min_size_too_large():
    with pytest.raises(ValueError, match=r"min_size=11 with num_clients=3 needs 33 samples; only 30"):
        dirichlet(np.repeat(np.arange(3), 10), 3, 1.0, rng(), min_size=11)


def test_labels_must_be_1d():
    with pytest.raises(ValueError, match=r"labels must be 1-D"):
        shards(np.zeros((4, 2), dtype=int), 2, 1, rng())


def test_partition_stats():
    y = np.array([0, 0, 1, 1, 2, 2, 2])
    s = partition_stats([np.array([0, 1]), np.array([2, 3, 4]), np.array([5, 6])], y)
    assert s == {
        "clients": 3, "samples": 7, "samples_min": 2, "samples_median": 2.0, "samples_max": 3,
        "samples_mean": pytest.approx(7 / 3), "classes_min": 1, "classes_median": 1.0, "classes_max": 2,
    }
    assert "classes_min" not in partition_stats([np.array([0])])
