"""Client selection per round (pure; randomness from the (seed, round) stream).

* :class:`PoissonSampler` — each client independently with probability C (what the DP accountant
  assumes for client-level DP);
* :class:`UniformSampler` — a fixed number of distinct clients uniformly at random;
* :class:`RoundRobinSampler` — b clients per round in a fixed cyclic order (paper 001);
* :class:`AllSampler` — every client every round (FedSKETCHGATE's full participation).
"""

from __future__ import annotations

import numpy as np

from fedrun.rng import numpy_rng


class Sampler:
    """Chooses the clients of each round."""

    #: the config name (conf/sampler/<name>.yaml)
    name: str = "base"

    #: probability that a given client takes part in a round, when the selection is Poisson (else None)
    poisson_probability: float | None = None

    def __init__(self, num_clients: int) -> None:
        if int(num_clients) < 1:
            raise ValueError(f"num_clients={num_clients} must be >= 1")
        self.num_clients = int(num_clients)

    def select(self, rnd: int, seed: int) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def expected_clients(self) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def fraction(self) -> float:
        """Expected fraction C of clients selected per round (paper 000's cost formula)."""
        return self.expected_clients / self.num_clients


class PoissonSampler(Sampler):
    name = "poisson"

    def __init__(self, num_clients: int, probability: float) -> None:
        super().__init__(num_clients)
        if not 0 < float(probability) <= 1:
            raise ValueError(f"sampling probability C={probability} is outside (0, 1]")
        self.probability = float(probability)
        self.poisson_probability = self.probability

    def select(self, rnd: int, seed: int) -> np.ndarray:
        draws = numpy_rng(seed, "sampler", rnd).random(self.num_clients)
        return np.flatnonzero(draws < self.probability)

    @property
    def expected_clients(self) -> float:
        return self.probability * self.num_clients


class UniformSampler(Sampler):
    name = "uniform"

    def __init__(self, num_clients: int, clients_per_round: int) -> None:
        super().__init__(num_clients)
        if not 1 <= int(clients_per_round) <= self.num_clients:
            raise ValueError(f"clients_per_round={clients_per_round} must be in [1, num_clients={self.num_clients}]")
        self.k = int(clients_per_round)

    def select(self, rnd: int, seed: int) -> np.ndarray:
        return np.sort(numpy_rng(seed, "sampler", rnd).choice(self.num_clients, self.k, replace=False))

    @property
    def expected_clients(self) -> float:
        return float(self.k)


class RoundRobinSampler(Sampler):
    """Round t (1-based) takes clients (t−1)·b … t·b − 1 modulo N, in a fixed seeded order."""

    name = "round_robin"

    def __init__(self, num_clients: int, clients_per_round: int, shuffle: bool = True) -> None:
        super().__init__(num_clients)
        if not 1 <= int(clients_per_round) <= self.num_clients:
            raise ValueError(f"clients_per_round={clients_per_round} must be in [1, num_clients={self.num_clients}]")
        self.k = int(clients_per_round)
        self.shuffle = bool(shuffle)

    def select(self, rnd: int, seed: int) -> np.ndarray:
        order = self._order(seed)
        start = (rnd - 1) * self.k
        return np.sort(order[np.arange(start, start + self.k) % self.num_clients])

    def _order(self, seed: int) -> np.ndarray:
        return numpy_rng(seed, "round_robin").permutation(self.num_clients) if self.shuffle \
            else np.arange(self.num_clients)

    def participations(self, rounds: int, seed: int) -> np.ndarray:
        """How many of rounds 1..``rounds`` each client takes part in (T_l = b·T_g/N when N divides b·T_g)."""
        total = int(rounds) * self.k
        position = np.empty(self.num_clients, dtype=np.int64)
        position[self._order(seed)] = np.arange(self.num_clients)
        return np.maximum(0, (total - position + self.num_clients - 1) // self.num_clients)

    @property
    def expected_clients(self) -> float:
        return float(self.k)


class AllSampler(Sampler):
    name = "all"

    def select(self, rnd: int, seed: int) -> np.ndarray:
        return np.arange(self.num_clients)

    @property
    def expected_clients(self) -> float:
        return float(self.num_clients)
