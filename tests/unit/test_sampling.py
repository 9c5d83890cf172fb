import numpy as np
import pytest

from fedrun.privacy.cohort import CappedPoisson, FixedSize, Poisson, Schema
from fedrun.sampling import (AllSampler, CappedPoissonSampler, CyclicSampler, PoissonSampler, RoundRobinSampler,
                             UniformSampler)


def test_poisson_rate_and_independence_of_rounds():
    s = PoissonSampler(1000, 0.1)
    counts = [len(s.select(t, seed=3)) for t in range(1, 201)]
    # mean of 200 Binomial(1000, 0.1) draws: sd of the mean = sqrt(90/200) ≈ 0.67
    assert abs(np.mean(counts) - 100) < 3
    assert not np.array_equal(s.select(1, 3), s.select(2, 3))
    assert np.array_equal(s.select(5, 3), s.select(5, 3))
    assert s.expected_clients == 100 and s.participation(5) == Poisson(0.1, 1000) and s.fraction == pytest.approx(0.1)


def test_uniform_fixed_size_distinct():
    s = UniformSampler(50, 25)
    for t in range(1, 20):
        sel = s.select(t, 0)
        assert len(sel) == 25 and len(set(sel)) == 25 and sel.max() < 50
    assert s.participation(7) == FixedSize(25, 50)


def test_round_robin_covers_everyone_evenly():
    s = RoundRobinSampler(10, 3)
    counts = np.zeros(10, int)
    for t in range(1, 11):  # 30 participations over 10 clients
        counts[s.select(t, 7)] += 1
    assert (counts == 3).all()
    assert np.array_equal(s.participations(10, 7), counts)
    counts7 = np.zeros(10, int)
    for t in range(1, 8):
        counts7[s.select(t, 7)] += 1
    assert np.array_equal(s.participations(7, 7), counts7)


def test_all_and_validation():
    assert np.array_equal(AllSampler(4).select(1, 0), np.arange(4))
    with pytest.raises(ValueError, match="C=1.5"):
        PoissonSampler(10, 1.5)
    with pytest.raises(ValueError, match="clients_per_round=11"):
        UniformSampler(10, 11)
    with pytest.raises(ValueError, match="num_clients=0"):
        AllSampler(0)


def test_capped_poisson_is_poisson_with_the_excess_dropped_at_random():
    n, q = 200, 0.1
    poisson, capped, loose = PoissonSampler(n, q), CappedPoissonSampler(n, q, 15), CappedPoissonSampler(n, q, n)
    sizes, hits = [], np.zeros(n)
    for t in range(1, 2001):
        drawn, kept = poisson.select(t, 4), capped.select(t, 4)
        assert np.array_equal(loose.select(t, 4), drawn)  # a cap that cannot bind: exactly the Poisson draws
        assert len(kept) == min(len(drawn), 15) and set(kept) <= set(drawn) and np.array_equal(kept, np.sort(kept))
        sizes.append(len(kept))
        hits[kept] += 1
    assert max(sizes) == 15 and np.array_equal(capped.select(9, 4), capped.select(9, 4))
    # E[min(Binomial(200, 0.1), 15)] (exact, scipy) against 2000 rounds: sd of the mean ≈ 3.2/√2000 ≈ 0.07
    from scipy.stats import binom

    exact = sum(min(j, 15) * binom.pmf(j, n, q) for j in range(n + 1))
    assert capped.expected_clients == pytest.approx(exact, rel=1e-12)
    assert abs(np.mean(sizes) - exact) < 0.3
    # every client is kept with the same probability, expected_clients / N: the DP sum ÷ it is unbiased
    p = exact / n  # each client's frequency over 2000 rounds: sd √(p(1−p)/2000) ≈ 0.006; 200 clients within 5 sd
    assert np.abs(hits / 2000 - p).max() < 5 * np.sqrt(p * (1 - p) / 2000)
    assert loose.expected_clients == pytest.approx(n * q, rel=1e-9)
    with pytest.raises(ValueError, match="max_clients=0"):
        CappedPoissonSampler(10, 0.5, 0)


def test_each_sampler_declares_its_participation_law():
    assert PoissonSampler(10, 0.5).participation(4) == Poisson(0.5, 10)
    assert UniformSampler(10, 3).participation(4) == FixedSize(3, 10)
    assert CappedPoissonSampler(10, 0.5, 3).participation(4) == CappedPoisson(0.5, 3, 10)
    assert CyclicSampler(10, 3).participation(7) == Schema(3, 3)  # G = 3 groups: at most ⌈7/3⌉ rounds, 3 apart
    assert RoundRobinSampler(10, 3).participation(4) is None and AllSampler(10).participation(4) is None
    for s in (PoissonSampler(10, 0.5), UniformSampler(10, 3), CappedPoissonSampler(10, 0.5, 3), CyclicSampler(10, 3)):
        assert type(s).law is type(s.participation(4))  # the config edge reads the class's, before a sampler exists
