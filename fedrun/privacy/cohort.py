"""Who takes part: a sampler's participation law, one typed value, and the ledger that holds every round to it.

A sampler declares its law (:meth:`fedrun.sampling.Sampler.participation`); the accountant, the audit's canaries and
the neighbour harness read only that value. What the law promises per round is checked on every realised cohort
(canaries included) by :class:`ParticipationLedger`, which stops the run with a one-line
:class:`CohortContractError` at the first round that breaks it:

* :class:`Poisson` (q, N) — each of N clients independently with probability q: distinct ids in [0, N);
* :class:`FixedSize` (k, N) — k distinct clients of N: exactly k distinct ids;
* :class:`CappedPoisson` (q, cap, N) — Poisson, then at most ``cap``: at most ``cap`` distinct ids;
* :class:`Schema` (k, b) — a participation schema: each client in at most k rounds, any two at least b rounds apart
  (no amplification by sampling is claimed, so the whole promise is checkable and is checked).

A law's probability (q) cannot be read off one round; what a round can show (ids, sizes, repeats, separation) is
checked. A sampler without a law (``None``) is refused with client-level DP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Union

import numpy as np


class CohortContractError(RuntimeError):
    """A realised round broke the participation law its sampler declared (reported in one line)."""


@dataclass(frozen=True)
class Poisson:
    q: float
    n: int
    kind: ClassVar[str] = "poisson"


@dataclass(frozen=True)
class FixedSize:
    k: int
    n: int
    kind: ClassVar[str] = "fixed_size"


@dataclass(frozen=True)
class CappedPoisson:
    q: float
    cap: int
    n: int
    kind: ClassVar[str] = "capped_poisson"

    @property
    def expected_clients(self) -> float:
        """E[min(Binomial(N, q), cap)] = Σ_{j<cap} P(Binomial(N, q) > j)."""
        from scipy.stats import binom

        return float(binom.sf(np.arange(min(self.cap, self.n)), self.n, self.q).sum())


@dataclass(frozen=True)
class Schema:
    k: int
    b: int
    kind: ClassVar[str] = "schema"


Law = Union[Poisson, FixedSize, CappedPoisson, Schema]
LAWS = (Poisson, FixedSize, CappedPoisson, Schema)


class ParticipationLedger:
    """Every realised round of ``num_clients`` clients (and ``extra`` canaries, ids N … N + extra − 1, who follow the
    same law) against ``law``: :meth:`record` raises :class:`CohortContractError` at the first breach."""

    def __init__(self, law: Law, num_clients: int, sampler: str, extra: int = 0) -> None:
        if not isinstance(law, LAWS):
            raise TypeError(f"sampler={sampler}: participation law {law!r} is none of "
                            f"{', '.join(c.__name__ for c in LAWS)}")
        self.law, self.n, self.sampler, self.extra = law, int(num_clients), sampler, int(extra)
        self.count = np.zeros(self.n + self.extra, dtype=np.int64)  # participations so far
        self.last = np.full(self.n + self.extra, -(1 << 40), dtype=np.int64)  # last round taken part in

    def _fail(self, rnd: int, what: str) -> None:
        raise CohortContractError(f"sampler={self.sampler} broke its declared participation law {self.law} in round "
                                  f"{rnd}: {what}; the accountant's ε would not hold, so the run stops")

    def record(self, rnd: int, clients: np.ndarray | None, canaries: np.ndarray | None = None) -> None:
        """Round ``rnd``'s cohort drawn by the sampler (``clients``; None: only canaries this call) and canaries."""
        ids = np.asarray([] if clients is None else clients, dtype=np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n):
            self._fail(rnd, f"client id {int(ids.min() if ids.min() < 0 else ids.max())} outside [0, {self.n})")
        if len(np.unique(ids)) != len(ids):
            self._fail(rnd, "a client selected twice in one round")
        law = self.law
        if clients is None:
            pass
        elif isinstance(law, FixedSize) and len(ids) != law.k:
            self._fail(rnd, f"{len(ids)} clients selected, not k = {law.k}")
        if isinstance(law, CappedPoisson) and len(ids) > law.cap:
            self._fail(rnd, f"{len(ids)} clients selected, more than the cap {law.cap}")
        if canaries is not None:
            ids = np.concatenate([ids, self.n + np.asarray(canaries, dtype=np.int64).reshape(-1)])
        if isinstance(law, Schema):
            close = ids[rnd - self.last[ids] < law.b]
            if len(close):
                who = f"canary {close[0] - self.n}" if close[0] >= self.n else f"client {close[0]}"
                self._fail(rnd, f"{who} takes part {rnd - self.last[close[0]]} round(s) after its last, less than "
                                f"b = {law.b}")
            over = ids[self.count[ids] >= law.k]
            if len(over):
                who = f"canary {over[0] - self.n}" if over[0] >= self.n else f"client {over[0]}"
                self._fail(rnd, f"{who} takes part a {self.count[over[0]] + 1}th time, more than k = {law.k}")
        self.count[ids] += 1
        self.last[ids] = rnd

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count.tolist(), "last": self.last.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        count, last = np.asarray(state["count"], dtype=np.int64), np.asarray(state["last"], dtype=np.int64)
        if count.shape != self.count.shape:
            raise ValueError(f"the checkpoint's participation ledger has {count.size} ids, this run {self.count.size}")
        self.count, self.last = count, last
