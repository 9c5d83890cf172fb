"""Canary clients for an empirical privacy audit of client-level DP, in the domain the DP sum clips.

The audit (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023; Andrew et
al., "One-shot Empirical Privacy Estimation for Federated Learning", ICLR 2024) needs canaries whose presence
the mechanism must hide: here, ``num`` extra clients whose upload is a fixed random direction of L2 norm S
(the clipping bound, so the clip leaves it as it is) in the payload domain (the full update, m DCT
coefficients, a flattened sketch). Each canary is *included* with probability 1/2, drawn once; an included
canary takes part in each round with the clients' Poisson rate q, exactly as a real client would, so the
accountant's ε covers its inclusion. Each canary is scored by its largest cosine with a round's released
aggregate (the all-rounds statistic of Andrew et al.), and the scores with the inclusion mask give the lower
bound (``fedrun.privacy.audit.steinke_bound``). Any statistic of the released aggregates is post-processing,
so the bound applies to what the accountant bounds.

Pure tensor state: randomness comes in as generators; no I/O.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedrun.privacy.audit import audit_epsilon, canary_scores, make_canaries


class Canaries:
    """``num`` canary clients of norm ``norm`` in a ``dim``-long payload domain; see the module docstring."""

    def __init__(self, num: int, dim: int, norm: float, sampling_probability: float,
                 generator: torch.Generator, included_rng: np.random.Generator, schema=None) -> None:
        if not 0 < sampling_probability <= 1:
            raise ValueError(f"sampling_probability={sampling_probability!r} is outside (0, 1]")
        self.vectors = make_canaries(num, dim, norm, generator)
        self.included = included_rng.random(int(num)) < 0.5
        # under a participation schema (k, b): each canary draws a phase in [0, b) once and takes part in the rounds
        # ≡ phase + 1 (mod b), at most k of them, as the schema allows any client
        self.schema = schema
        self.period = None if schema is None else int(schema.b)
        self.phase = None if schema is None else included_rng.integers(0, self.period, int(num))
        self._included_t = torch.as_tensor(self.included, device=self.vectors.device)
        self.q = float(sampling_probability)
        self.observed = torch.zeros(int(num), dtype=torch.float64, device=self.vectors.device)  # best score so far
        self.participations = np.zeros(int(num), dtype=np.int64)
        self.rounds_observed = 0

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def rows(self, generator: torch.Generator, rnd: int = 1) -> torch.Tensor:
        """Round ``rnd``'s canary uploads ([k, dim]): the included canaries a Poisson(q) draw selects, or, under a
        schema, those whose group's turn it is."""
        if self.period is not None:
            draw = torch.as_tensor(self.phase == (int(rnd) - 1) % self.period, device=self.vectors.device)
        else:
            draw = torch.rand(self.vectors.shape[0], generator=generator, device=self.vectors.device) < self.q
        take = draw & self._included_t
        if self.schema is not None:
            take &= torch.as_tensor(self.participations < self.schema.k, device=self.vectors.device)
        self.taken = np.flatnonzero(take.cpu().numpy())  # their ids, for the participation ledger
        self.participations[self.taken] += 1
        return self.vectors[take]

    def observe(self, aggregate: torch.Tensor) -> None:
        """Score one round's released aggregate (what the server saw): each canary keeps its largest cosine
        with a round's aggregate (Andrew et al.'s all-rounds statistic: a canary's signal is not diluted by
        the rounds it missed, nor by the sum of the clients' updates over the run)."""
        if not float(aggregate.norm()) > 0:  # nothing released this round (no clients, no noise)
            return
        cos = canary_scores(self.vectors, aggregate.detach())
        self.observed = cos if self.rounds_observed == 0 else torch.maximum(self.observed, cos)
        self.rounds_observed += 1

    def result(self, delta: float, confidence: float) -> dict[str, float]:
        """The audit's metrics: the Steinke et al. lower bound at ``confidence`` (guessing game over the
        canaries' scores with their inclusion mask) and the counts behind it."""
        out = {"audit_canaries": float(len(self.included)), "audit_included": float(self.included.sum()),
               "audit_participations_mean": float(self.participations[self.included].mean())
               if self.included.any() else 0.0}
        if self.rounds_observed == 0 or self.included.all() or not self.included.any():
            out.update({"audit_epsilon_lower": 0.0})
            return out
        scores = self.observed.cpu().numpy()
        lower = audit_epsilon(scores, included=self.included, delta=delta, confidence=confidence, method="steinke")
        # the bound only: a Gaussian-fit estimate (Andrew et al.) would assume every inserted canary is in every
        # round, while these take part with probability q (a mixture, not a Gaussian), and it is no bound
        out.update({"audit_epsilon_lower": float(lower.epsilon), "audit_guesses": float(lower.guesses),
                    "audit_correct": float(lower.correct), "audit_confidence": float(confidence)})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"observed": self.observed.cpu(), "participations": self.participations.tolist(),
                "included": self.included.tolist(), "rounds_observed": self.rounds_observed,
                "dim": self.dim}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["included"]) != self.included.tolist():
            raise ValueError("the checkpoint's canaries were drawn with other settings than this run's")
        self.observed = state["observed"].to(self.observed.device)
        self.participations = np.asarray(state["participations"], dtype=np.int64)
        self.rounds_observed = int(state["rounds_observed"])
