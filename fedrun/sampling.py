"""Client selection per round (pure; randomness from the (seed, round) stream).

* :class:`PoissonSampler` — each client independently with probability C (client-level DP: add/remove-one
  neighbours, RDP or PLD);
* :class:`CappedPoissonSampler` — Poisson with probability C, then at most a cap: when more clients were drawn,
  a uniformly random subset of cap of them (client-level DP: add/remove-one, PLD of the truncated Poisson sample);
* :class:`UniformSampler` — a fixed number k of distinct clients uniformly at random, i.e. k of N without
  replacement (client-level DP: replace-one neighbours, RDP);
* :class:`RoundRobinSampler` — b clients per round in a fixed cyclic order (paper 001);
* :class:`CyclicSampler` — the clients split once into G fixed groups that take turns (group (t − 1) mod G in round
  t): a participation schema, each client at most ⌈T/G⌉ times, G rounds apart (client-level DP with correlated
  noise: :mod:`fedrun.privacy.factorization`; no amplification by sampling is claimed);
* :class:`AllSampler` — every client every round (FedSKETCHGATE's full participation).
"""

from __future__ import annotations

import numpy as np

from fedrun.privacy.cohort import CappedPoisson, FixedSize, Law, Poisson, Schema
from fedrun.rng import numpy_rng


class Sampler:
    """Chooses the clients of each round."""

    #: the config name (conf/sampler/<name>.yaml)
    name: str = "base"

    #: the class of its participation law (:mod:`fedrun.privacy.cohort`), read by the config edge before the sampler
    #: exists; None: no law, so no client-level DP
    law: type | None = None

    def participation(self, rounds: int) -> Law | None:
        """The participation law of its rounds, one typed value the accountant, the canaries and the harness read,
        and the ledger checks every realised round against (None: it promises none)."""
        return None

    def participations(self, rounds: int, seed: int) -> np.ndarray | None:
        """Each client's number of rounds among 1..``rounds`` when fixed in advance (local DP calibrates to it), else
        None."""
        return None

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
    def max_cohort(self) -> int:
        """The most clients one round can select (a public bound: secure aggregation's field is sized for it)."""
        return self.num_clients

    @property
    def fraction(self) -> float:
        """Expected fraction C of clients selected per round (paper 000's cost formula)."""
        return self.expected_clients / self.num_clients


class PoissonSampler(Sampler):
    name = "poisson"
    law = Poisson

    def __init__(self, num_clients: int, probability: float) -> None:
        super().__init__(num_clients)
        if not 0 < float(probability) <= 1:
            raise ValueError(f"sampling probability C={probability} is outside (0, 1]")
        self.probability = float(probability)

    def participation(self, rounds: int) -> Poisson:
        return Poisson(self.probability, self.num_clients)

    def select(self, rnd: int, seed: int) -> np.ndarray:
        draws = numpy_rng(seed, "sampler", rnd).random(self.num_clients)
        return np.flatnonzero(draws < self.probability)

    @property
    def expected_clients(self) -> float:
        return self.probability * self.num_clients


class CappedPoissonSampler(Sampler):
    """Poisson with probability C (the same draws as :class:`PoissonSampler` with the same seed), then, when more
    than ``max_clients`` were drawn, a uniformly random subset of ``max_clients`` of them (the rest are dropped): the
    ones with the smallest i.i.d. priorities, each read at the client's id."""

    name = "poisson_capped"
    law = CappedPoisson

    def __init__(self, num_clients: int, probability: float, max_clients: int) -> None:
        super().__init__(num_clients)
        if not 0 < float(probability) <= 1:
            raise ValueError(f"sampling probability C={probability} is outside (0, 1]")
        if isinstance(max_clients, bool) or int(max_clients) != max_clients or int(max_clients) < 1:
            raise ValueError(f"max_clients={max_clients} must be an integer >= 1")
        self.probability = float(probability)
        self.max_clients = int(max_clients)

    def participation(self, rounds: int) -> CappedPoisson:
        return CappedPoisson(self.probability, self.max_clients, self.num_clients)

    def select(self, rnd: int, seed: int) -> np.ndarray:
        draws = numpy_rng(seed, "sampler", rnd).random(self.num_clients)
        chosen = np.flatnonzero(draws < self.probability)
        if len(chosen) <= self.max_clients:
            return chosen
        # a uniformly random subset of the drawn: the cap smallest of i.i.d. priorities read at each client's id, so
        # one more drawn client changes the kept set by at most one swap (the accountant's replace-one branch)
        priority = numpy_rng(seed, "sampler_cap", rnd).random(self.num_clients)[chosen]
        return np.sort(chosen[np.argsort(priority, kind="stable")[:self.max_clients]])

    @property
    def max_cohort(self) -> int:
        return min(self.max_clients, self.num_clients)

    @property
    def expected_clients(self) -> float:
        """E[min(Binomial(N, C), cap)]: each client takes part with probability this / N, so a sum divided by it is
        unbiased."""
        return self.participation(0).expected_clients


class UniformSampler(Sampler):
    name = "uniform"
    law = FixedSize

    def __init__(self, num_clients: int, clients_per_round: int) -> None:
        super().__init__(num_clients)
        if not 1 <= int(clients_per_round) <= self.num_clients:
            raise ValueError(f"clients_per_round={clients_per_round} must be in [1, num_clients={self.num_clients}]")
        self.k = int(clients_per_round)

    def participation(self, rounds: int) -> FixedSize:
        return FixedSize(self.k, self.num_clients)

    def select(self, rnd: int, seed: int) -> np.ndarray:
        return np.sort(numpy_rng(seed, "sampler", rnd).choice(self.num_clients, self.k, replace=False))

    @property
    def max_cohort(self) -> int:
        return self.k

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
    def max_cohort(self) -> int:
        return self.k

    @property
    def expected_clients(self) -> float:
        return float(self.k)


class CyclicSampler(Sampler):
    """The clients, in a seeded order, split into G = ⌊N / clients_per_round⌋ fixed groups of clients_per_round or
    one more (``np.array_split``); round t (1-based) takes group (t − 1) mod G. So each client takes part in at most
    k = ⌈T / G⌉ of T rounds, exactly G rounds apart (b-min-separation with b = G): :meth:`participation`. Client-level DP
    accounts it by the participation schema alone (law :class:`Schema`: the release is one Gaussian mechanism
    with the strategy matrix's sensitivity under (k, b)), neighbours by zero-out (one client's contributions replaced
    by nothing; its slot in its group kept)."""

    name = "cyclic"
    law = Schema

    def __init__(self, num_clients: int, clients_per_round: int) -> None:
        super().__init__(num_clients)
        if isinstance(clients_per_round, bool) or int(clients_per_round) != clients_per_round \
                or not 1 <= int(clients_per_round) <= self.num_clients:
            raise ValueError(f"clients_per_round={clients_per_round} must be an integer in [1, num_clients="
                             f"{self.num_clients}]")
        self.k = int(clients_per_round)
        self.groups = self.num_clients // self.k
        self._group_of: dict[int, np.ndarray] = {}

    def group_of(self, seed: int) -> np.ndarray:
        """Each client's group index in [0, G) (the same for every round of a run)."""
        if seed not in self._group_of:
            group = np.empty(self.num_clients, dtype=np.int64)
            order = numpy_rng(seed, "cyclic").permutation(self.num_clients)
            for g, members in enumerate(np.array_split(order, self.groups)):
                group[members] = g
            self._group_of = {seed: group}
        return self._group_of[seed]

    def select(self, rnd: int, seed: int) -> np.ndarray:
        return np.flatnonzero(self.group_of(seed) == (int(rnd) - 1) % self.groups)

    def participation(self, rounds: int) -> Schema:
        return Schema(-(-int(rounds) // self.groups), self.groups)

    @property
    def max_cohort(self) -> int:
        return -(-self.num_clients // self.groups)

    @property
    def expected_clients(self) -> float:
        return self.num_clients / self.groups


class AllSampler(Sampler):
    name = "all"

    def participations(self, rounds: int, seed: int) -> np.ndarray:
        return np.full(self.num_clients, int(rounds), dtype=np.int64)

    def select(self, rnd: int, seed: int) -> np.ndarray:
        return np.arange(self.num_clients)

    @property
    def expected_clients(self) -> float:
        return float(self.num_clients)


def over_select(sampler: Sampler, factor: float) -> Sampler:
    """The same kind of sampler drawing ``factor`` ≥ 1 times as many clients (deployments over-select to absorb
    dropouts): Poisson at min(1, f·C), a fixed-size cohort of ⌈f·k⌉, a capped Poisson at f·C capped at ⌈f·cap⌉. Each
    client's inclusion probability rises accordingly, and client-level DP accounts the raised one."""
    import math

    f = float(factor)
    if not f >= 1:
        raise ValueError(f"over_selection={factor} must be >= 1")
    n = sampler.num_clients
    if isinstance(sampler, CappedPoissonSampler):
        return CappedPoissonSampler(n, min(1.0, f * sampler.probability), min(n, math.ceil(f * sampler.max_clients)))
    if isinstance(sampler, PoissonSampler):
        return PoissonSampler(n, min(1.0, f * sampler.probability))
    if isinstance(sampler, UniformSampler):
        return UniformSampler(n, min(n, math.ceil(f * sampler.k)))
    raise ValueError(f"over_selection={factor} needs sampler=poisson, uniform or poisson_capped; got {sampler.name}")
