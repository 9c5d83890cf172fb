"""The simulated federation: global model, clients' data, sampler, scheme, ledger, privacy hooks.

:class:`Simulation` is the object schemes talk to (``sim.params``, ``sim.train``, ``sim.ledger``,
``sim.new_aggregator`` …). It holds no Hydra or MLflow objects: :mod:`fedrun.run` builds it from the
config and drives the rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch import nn

from fedrun.aggregation import ClientLevelDPSum, WeightedSum
from fedrun.comm import Ledger
from fedrun.models.flat import FlatParams
from fedrun.privacy.mechanisms import PoissonGaussianEvent
from fedrun.rng import derive_seed, torch_generator
from fedrun.sampling import Sampler
from fedrun.schemes.base import Scheme
from fedrun.training import ClientData, LocalSpec, Trainer, eval_copy, evaluate


@dataclass(frozen=True)
class ClientDP:
    """Client-level DP settings (paper 000; DP-FedAvg): clip S, noise multiplier σ, Poisson rate q, and the
    accountant (``rdp`` | ``pld``) whose ε the run reports as ``epsilon``."""

    clipping_norm: float
    noise_multiplier: float
    sampling_probability: float
    expected_clients: float
    delta: float
    accountant: str = "rdp"


@dataclass(frozen=True)
class AuditSettings:
    """An empirical privacy audit (client-level DP only): ``canaries`` canary clients, the lower bound's
    ``confidence``; ``negative_control`` removes the DP noise while the accountant still claims ε (a run that
    tests the audit itself, never one to report)."""

    canaries: int
    confidence: float = 0.95
    negative_control: bool = False


class PrivacyCheckFailed(RuntimeError):
    """What a round did differs from what was accounted (an upload that skipped the DP path, an accountant
    event without a noised aggregation or the reverse): the run stops FAILED, never reported with a wrong ε."""


class PrivacyGuard:
    """Counts what the simulation's one DP path did in a round and checks it against what was accounted.

    Every upload a scheme records in the ledger (``sim.ledger.uplink``) must have passed through the DP path:
    client-level DP clips it in an aggregator from :meth:`Simulation.new_aggregator`, local DP noises it in
    :meth:`Simulation.privatize_upload`. After each round (:meth:`check`, called by the runner):

    * client-level: every uploaded row was clipped in a DP aggregator, the round had ≥ 1 noised aggregation,
      and the accountant holds exactly one event per noised aggregation (over the whole run);
    * local: every uploaded row was noised, and each noised row was counted by the local-DP accountant.

    Without DP nothing is counted or checked.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode  # "off" | "client" | "local"
        self.noised_aggregations = 0  # over the run (client-level)
        self.round_noised_aggregations = 0
        self.round_private_rows = 0  # rows that went through the DP path this round
        self.round_canary_rows = 0  # of which the audit's canaries (no upload of a client)

    def start_round(self) -> None:
        self.round_noised_aggregations = 0
        self.round_private_rows = 0
        self.round_canary_rows = 0

    def check(self, rnd: int, scheme: str, uploads: int, accountant_events: int, local_rows: int | None) -> None:
        if self.mode == "off":
            return
        where = f"round {rnd} of scheme={scheme} with dp={'true' if self.mode == 'client' else 'local'}"
        private = self.round_private_rows - self.round_canary_rows
        if uploads != private:
            raise PrivacyCheckFailed(f"{where}: {uploads} uploads were sent but {private} went "
                                     f"through the DP path; the scheme bypasses it, so no ε holds for this run")
        if self.mode == "client":
            if self.round_noised_aggregations < 1:
                raise PrivacyCheckFailed(f"{where}: the model changed without a noised aggregation; the scheme "
                                         f"bypasses the DP path, so no ε holds for this run")
            if accountant_events != self.noised_aggregations:
                raise PrivacyCheckFailed(f"{where}: the accountant has {accountant_events} events for "
                                         f"{self.noised_aggregations} noised aggregations")
        elif local_rows is not None and local_rows != self.round_private_rows:
            raise PrivacyCheckFailed(f"{where}: {self.round_private_rows} uploads were noised but the local-DP "
                                     f"accountant counted {local_rows}")


class ClientState:
    """Per-client persistent tensors (error feedback, momentum, gradient-tracking terms, …), stored sparsely.

    ``get(name, ids, dim)`` returns the rows of the named state for the given clients (zeros for a client
    whose row was never set), as a new tensor the caller may change; ``set`` writes them back. Only clients
    that have been set hold a row: per name, a [rows, dim] tensor on the simulation's device (grown by doubling,
    so at most twice the touched clients' rows) and a client → row map. A checkpoint keeps those clients' ids
    and rows only (:meth:`state_dict`), so its size grows with the clients that took part, not with num_clients.
    """

    def __init__(self, num_clients: int, device: torch.device) -> None:
        self.num_clients = int(num_clients)
        self.device = torch.device(device)
        self._rows: dict[str, torch.Tensor] = {}  # name → [capacity, dim]; rows [0, count) are in use
        self._slot: dict[str, np.ndarray] = {}  # name → [num_clients] row of each client, -1 = none
        self._count: dict[str, int] = {}

    def _ids(self, ids) -> np.ndarray:
        return np.asarray(ids.cpu() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64).reshape(-1)

    def clients(self, name: str) -> np.ndarray:
        """The ids of the clients holding a row of ``name``, in the order their rows were made."""
        if name not in self._rows:
            return np.zeros(0, dtype=np.int64)
        slot = self._slot[name]
        held = np.flatnonzero(slot >= 0)
        return held[np.argsort(slot[held])]

    def nbytes(self) -> int:
        """Bytes of the rows in use (what a checkpoint holds, less the ids)."""
        return sum(self._count[k] * v.shape[1] * v.element_size() for k, v in self._rows.items())

    def get(self, name: str, ids: np.ndarray, dim: int) -> torch.Tensor:
        ids = self._ids(ids)
        if name not in self._rows:
            return torch.zeros(len(ids), int(dim), device=self.device)
        rows, slots = self._rows[name], self._slot[name][ids]
        held = slots >= 0
        if held.all():
            return rows[torch.as_tensor(slots, device=self.device)]
        out = torch.zeros(len(ids), rows.shape[1], dtype=rows.dtype, device=self.device)
        if held.any():
            out[torch.as_tensor(np.flatnonzero(held), device=self.device)] = \
                rows[torch.as_tensor(slots[held], device=self.device)]
        return out

    def set(self, name: str, ids: np.ndarray, values: torch.Tensor) -> None:
        ids = self._ids(ids)
        if name not in self._rows:
            self._rows[name] = torch.zeros(0, values.shape[1], device=self.device)
            self._slot[name] = np.full(self.num_clients, -1, dtype=np.int64)
            self._count[name] = 0
        slot = self._slot[name]
        new = ids[slot[ids] < 0]
        if len(new):
            _, first = np.unique(new, return_index=True)
            new = new[np.sort(first)]  # each new client once, in order of appearance
            count = self._count[name]
            need = count + len(new)
            rows = self._rows[name]
            if need > rows.shape[0]:
                cap = min(self.num_clients, max(need, 2 * rows.shape[0], 16))
                grown = torch.zeros(cap, rows.shape[1], dtype=rows.dtype, device=self.device)
                grown[:count] = rows[:count]
                self._rows[name] = grown
            slot[new] = np.arange(count, need)
            self._count[name] = need
        self._rows[name][torch.as_tensor(slot[ids], device=self.device)] = values

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """Per name: ``ids`` [k] (int64) of the clients holding a row and their ``rows`` [k, dim] (on the CPU)."""
        out = {}
        for name, rows in self._rows.items():
            count = self._count[name]
            if count < rows.shape[0]:  # torch.save writes a view's whole storage: keep only the rows in use
                rows = self._rows[name] = rows[:count].clone()
            ids = torch.from_numpy(self.clients(name))
            out[name] = {"ids": ids, "rows": rows.cpu()}
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output; a dense [num_clients, dim] tensor per name (checkpoint format 1)
        is read as every client holding its row."""
        self._rows, self._slot, self._count = {}, {}, {}
        for name, entry in state.items():
            if isinstance(entry, torch.Tensor):
                ids, rows = torch.arange(entry.shape[0]), entry
            else:
                ids, rows = entry["ids"], entry["rows"]
            ids = ids.numpy().astype(np.int64)
            if len(ids) and (ids.min() < 0 or ids.max() >= self.num_clients or len(np.unique(ids)) != len(ids)):
                raise ValueError(f"client state {name!r}: ids outside [0, {self.num_clients}) or repeated")
            slot = np.full(self.num_clients, -1, dtype=np.int64)
            slot[ids] = np.arange(len(ids))
            self._rows[name] = rows.to(self.device)
            self._slot[name] = slot
            self._count[name] = len(ids)


class Simulation:
    """One federated run's state and the services schemes use."""

    def __init__(self, *, model: nn.Module, data: ClientData, x_test: torch.Tensor, y_test: torch.Tensor,
                 sampler: Sampler, scheme: Scheme, spec: LocalSpec, seed: int,
                 device: torch.device | str = "cpu", chunk_size: int = 64, workers: int = 1,
                 vectorized: bool = True, batched_layers: bool = True,
                 client_dp: ClientDP | None = None, local_dp=None,
                 x_val: torch.Tensor | None = None, y_val: torch.Tensor | None = None,
                 layout: FlatParams | None = None, audit: AuditSettings | None = None) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.layout = layout or FlatParams(self.model)
        self.n = self.layout.numel
        self.params = self.layout.flatten(self.model).to(self.device)
        self.data = data
        self.x_test, self.y_test = x_test, y_test
        self.x_val, self.y_val = x_val, y_val
        self.sampler = sampler
        self.scheme = scheme
        self.spec = spec
        self.seed = int(seed)
        self.vectorized = bool(vectorized)
        self.trainer = Trainer(self.model, self.layout, data, spec, seed=self.seed, chunk_size=chunk_size,
                               workers=workers, batched=batched_layers)
        self.ledger = Ledger()
        self.client_state = ClientState(data.num_clients, self.device)
        self.client_dp = client_dp
        self.local_dp = local_dp
        if client_dp is not None and local_dp is not None:
            raise ValueError("client-level and local DP are exclusive: give client_dp or local_dp, not both")
        self.accountant = None
        if client_dp is not None:
            from fedrun.privacy.accounting import PrivacyAccountant  # dp_accounting costs ~2 s of import

            self.accountant = PrivacyAccountant(client_dp.delta)
        self.privacy = PrivacyGuard("client" if client_dp is not None else "local" if local_dp is not None
                                    else "off")
        if audit is not None and client_dp is None:
            raise ValueError("an audit needs client-level DP (its canaries are clients of the DP sum)")
        self.audit = audit
        self.canaries = None  # made at the first DP aggregation, when the payload's length is known
        self._eval_model: nn.Module | None = None
        self.last_dp_diagnostics: dict[str, float] = {}
        scheme.setup(self)

    # -- randomness -------------------------------------------------------------------------------
    def generator(self, rnd: int, *purpose: object) -> torch.Generator:
        """A torch generator on the simulation's device for one (round, purpose) stream."""
        return torch_generator(self.seed, rnd, *purpose, device=self.device)

    def shared_seed(self, rnd: int, *purpose: object) -> int:
        """A seed shared by all participants of a round (e.g. FL-RND's coordinates)."""
        return derive_seed(self.seed, "shared", rnd, *purpose)

    # -- clients ----------------------------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    def select(self, rnd: int) -> np.ndarray:
        return self.sampler.select(rnd, self.seed)

    def train(self, clients: np.ndarray, rnd: int,
              correction: torch.Tensor | None = None) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
        """Local training of ``clients`` from the global model: yields (ids, local models [k, n], losses [k])."""
        if len(clients) == 0:
            return
        if self.vectorized:
            yield from self.trainer.train(self.params, clients, rnd, correction)
        else:
            local, losses = self.trainer.train_sequential(self.params, clients, rnd, correction)
            yield np.asarray(clients), local, losses

    # -- aggregation and privacy hooks ------------------------------------------------------------
    def new_aggregator(self, rnd: int, weights: np.ndarray, dim: int):
        """Weighted sum, or client-level DP (clip + sum + noise + fixed denominator) when enabled."""
        if self.client_dp is None:
            return WeightedSum(weights, dim, self.device)
        dp = self.client_dp
        sigma = 0.0 if self.audit is not None and self.audit.negative_control else dp.noise_multiplier
        agg = ClientLevelDPSum(dim, dp.clipping_norm, sigma, dp.expected_clients,
                               self.generator(rnd, "client_dp_noise"), self.device)
        if self.audit is not None:  # the audit's canary clients upload through the same DP sum
            rows = self.make_canaries(dim).rows(self.generator(rnd, "audit_participation"))
            agg.add(rows)
            self.privacy.round_canary_rows += rows.shape[0]  # rows of the audit, not uploads of clients
        return agg

    def make_canaries(self, dim: int):
        """The audit's canaries for a ``dim``-long payload (drawn once, from the run's seed)."""
        if self.canaries is None:
            from fedrun.privacy.canaries import Canaries
            from fedrun.rng import numpy_rng

            dp = self.client_dp
            self.canaries = Canaries(self.audit.canaries, dim, dp.clipping_norm, dp.sampling_probability,
                                     self.generator(0, "audit_canaries"), numpy_rng(self.seed, "audit_included"))
        if dim != self.canaries.dim:
            raise ValueError(f"the audit's canaries have length {self.canaries.dim}; this aggregation {dim}")
        return self.canaries

    def finish_aggregate(self, rnd: int, agg) -> torch.Tensor:
        """The aggregate of the rows added to ``agg``; with client-level DP, the noised sum, one accountant
        event for it and the rows it clipped counted as privatized uploads."""
        out = agg.finish()
        if self.client_dp is not None and isinstance(agg, ClientLevelDPSum):
            self.accountant.record(PoissonGaussianEvent(self.client_dp.noise_multiplier,
                                                        self.client_dp.sampling_probability))
            self.privacy.noised_aggregations += 1
            self.privacy.round_noised_aggregations += 1
            self.privacy.round_private_rows += agg.seen
            self.last_dp_diagnostics = agg.diagnostics()
            if self.canaries is not None:
                self.canaries.observe(out)
        return out

    def privatize_upload(self, rnd: int, clients: np.ndarray, payload: torch.Tensor) -> torch.Tensor:
        """Local DP (paper 001): each client noises what it uploads; identity when local DP is off."""
        if self.local_dp is None:
            return payload
        out = self.local_dp.privatize(self, rnd, clients, payload)
        self.privacy.round_private_rows += len(clients)
        return out

    def start_round(self) -> None:
        """Reset the round's byte and privacy counters (the runner calls it before ``scheme.round``)."""
        self.ledger.start_round()
        self.privacy.start_round()
        if self.local_dp is not None:
            self.local_dp.start_round()

    def check_privacy(self, rnd: int) -> None:
        """After ``scheme.round``: every upload went through the DP path and was accounted (see
        :class:`PrivacyGuard`); raises :class:`PrivacyCheckFailed` otherwise."""
        events = len(self.accountant.events) if self.accountant is not None else 0
        local_rows = self.local_dp.round_noised_rows if self.local_dp is not None else None
        self.privacy.check(rnd, type(self.scheme).__name__, self.ledger.uplink_messages_round, events, local_rows)

    def epsilon(self, accountant: str | None = None) -> float | None:
        """ε spent so far, None without DP. Client-level: from ``accountant`` (default: the configured one,
        ``client_dp.accountant``); local: the worst client's (its own accountant)."""
        if self.accountant is not None:
            return self.accountant.epsilon(accountant or self.client_dp.accountant)
        if self.local_dp is not None:
            return self.local_dp.epsilon()
        return None

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self, split: str = "test") -> dict[str, float]:
        x, y = (self.x_test, self.y_test) if split == "test" else (self.x_val, self.y_val)
        if self._eval_model is None:  # made at the first evaluation (after the scheme's prepare_model)
            self._eval_model = eval_copy(self.model, self.device)
        return evaluate(self._eval_model, self.layout, self.params, x, y, self.spec.loss)
