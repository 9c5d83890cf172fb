import numpy as np
import pytest

from fedrun.sampling import AllSampler, PoissonSampler, RoundRobinSampler, UniformSampler


def test_poisson_rate_and_independence_of_rounds():
    s = PoissonSampler(1000, 0.1)
    counts = [len(s.select(t, seed=3)) for t in range(1, 201)]
    # mean of 200 Binomial(1000, 0.1) draws: sd of the mean = sqrt(90/200) ≈ 0.67
    assert abs(np.mean(counts) - 100) < 3
    assert not np.array_equal(s.select(1, 3), s.select(2, 3))
    assert np.array_equal(s.select(5, 3), s.select(5, 3))
    assert s.expected_clients == 100 and s.poisson_probability == 0.1 and s.fraction == pytest.approx(0.1)


def test_uniform_fixed_size_distinct():
    s = UniformSampler(50, 25)
    for t in range(1, 20):
        sel = s.select(t, 0)
        assert len(sel) == 25 and len(set(sel)) == 25 and sel.max() < 50
    assert s.poisson_probability is None


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
