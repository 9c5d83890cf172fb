"""The simulated federation and its one round.

:meth:`Simulation.run_round` is the round every FedAvg-shaped scheme runs, written once, top to bottom::

    sample → broadcast (downlink bytes) → local training → [local DP noise] → client encode (checked: one plain
      row per client) → upload (uplink bytes)
      → aggregate (client-level DP: clip + sum + noise, one accountant event) → [second exchange]
      → server decode → server optimizer (η_g, momentum) → client feedback

A scheme (:mod:`fedrun.schemes.base`) is a codec: its client side (a copy made after set-up) encodes updates,
its server side decodes the output of the :class:`Privatizer`. Neither sees the global parameters, the local
models, the accountant or this object. FbFTL's protocol is not this round: :mod:`fedrun.transfer.fbftl`.
The module holds no Hydra or MLflow objects: :mod:`fedrun.run` builds the simulation from the config.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
from torch import nn

from fedrun.aggregation import ClientLevelDPSum, WeightedSum
from fedrun.comm import Ledger, Message
from fedrun.models.flat import FlatParams
from fedrun.privacy.abort import record_abort
from fedrun.privacy.mechanisms import (Event, FixedSizeGaussianEvent, GaussianEvent, PoissonGaussianEvent,
                                       TruncatedPoissonGaussianEvent)
from fedrun.rng import derive_seed, torch_generator
from fedrun.sampling import Sampler
from fedrun.schemes.base import ClientView, Env, Received, Scheme
from fedrun.training import ClientData, LocalSpec, Trainer, eval_copy, evaluate


class SchemeContractError(ValueError):
    """A codec handed the round something the privatizer does not accept (reported in one line)."""


@dataclass(frozen=True)
class ClientDP:
    """Client-level DP settings (paper 000; DP-FedAvg): clip S, noise multiplier σ (noise std σS), sampling rate q,
    the fixed denominator of the DP sum (``expected_clients``), and the accountant (``rdp`` | ``pld``) whose ε the
    run reports as ``epsilon``.

    ``sampling`` says how the cohort is drawn, and so which event each round records (:meth:`event`):
    ``poisson`` (q, denominator qN), ``fixed_size`` (``cohort_size`` k of ``num_clients`` N without replacement,
    q = k/N, denominator k; replace-one neighbours, sensitivity 2S) or ``capped_poisson`` (Poisson with q, at most
    ``cohort_size``; denominator E[min(Binomial(N, q), cap)]).

    ``add_remove_sensitivity`` (units of S): how far adding or removing one client can move the clipped sum. 1,
    or 2 where a round closes at a report goal (over-selection): an added fast client is kept and pushes out the
    report next in line, so the sum moves by g(x) − g(y). The event then charges σ / 2 (:attr:`charged_noise_multiplier`).
    Under replace-one (``fixed_size``) the report goal changes the kept set by at most one swap, within the 2S the
    event already charges."""

    clipping_norm: float
    noise_multiplier: float
    sampling_probability: float
    expected_clients: float
    delta: float
    accountant: str = "rdp"
    sampling: str = "poisson"
    num_clients: int | None = None
    cohort_size: int | None = None
    add_remove_sensitivity: float = 1.0
    noise: str = "independent"
    schema: tuple[int, int] | None = None
    sensitivities: tuple[float, ...] | None = None
    noise_weights: np.ndarray | None = field(default=None, compare=False, repr=False)
    abort_noise_multiplier: float | None = None  # SecAgg's abort bit, charged each round (fedrun.privacy.abort)

    @property
    def charged_noise_multiplier(self) -> float:
        """The noise multiplier the accountant is charged: σ over the sensitivity in units of S (fixed-size cohorts:
        σ, their event charges 2S itself; a participation schema: the whole run's sensitivity s_T)."""
        if self.sampling == "schema":
            return self.noise_multiplier / self.sensitivities[-1]
        return self.noise_multiplier / (1.0 if self.sampling == "fixed_size" else self.add_remove_sensitivity)

    def round_noise(self, rnd: int) -> list[tuple[int, float]]:
        """Round ``rnd``'s noise as (Z row, weight) pairs: Σ weight · Z_row with Z's rows i.i.d. N(0, σ²S²) (row r
        drawn from the generator of round r + 1, so independent noise is the same draw under every sampler). Under a
        participation schema, row ``rnd`` of M = A⁻¹B (:func:`fedrun.privacy.factorization.round_noise_matrix`)."""
        if self.noise_weights is None:
            return [(rnd - 1, 1.0)]
        if rnd > self.noise_weights.shape[0]:
            raise ValueError(f"round {rnd} is past the {self.noise_weights.shape[0]} rounds the noise was planned for")
        row = self.noise_weights[rnd - 1]
        return [(int(r), float(row[r])) for r in np.flatnonzero(row)]

    def event(self, rnd: int = 1) -> Event | None:
        """The accountant event of round ``rnd``'s noised client-level sum under this sampling (None: under a
        schema, a round that cannot raise the release's sensitivity)."""
        if self.sampling == "schema":
            s = self.sensitivities
            grown = s[rnd - 1] ** 2 - (s[rnd - 2] ** 2 if rnd > 1 else 0.0)
            return GaussianEvent(self.noise_multiplier / math.sqrt(grown)) if grown > 0 else None
        sigma = self.charged_noise_multiplier
        if self.sampling == "fixed_size":
            return FixedSizeGaussianEvent(sigma, self.num_clients, self.cohort_size)
        if self.sampling == "capped_poisson":
            return TruncatedPoissonGaussianEvent(sigma, self.sampling_probability, self.num_clients, self.cohort_size)
        if self.sampling != "poisson":
            raise ValueError(f"sampling={self.sampling!r} is not one of poisson, fixed_size, capped_poisson, schema")
        return PoissonGaussianEvent(sigma, self.sampling_probability)


@dataclass(frozen=True)
class AuditSettings:
    """An empirical privacy audit (client-level DP only): ``canaries`` canary clients, the lower bound's
    ``confidence``."""

    canaries: int
    confidence: float = 0.95


class Privatizer:
    """The one DP stage every upload passes through; it owns the accountant.

    * client-level (``client_dp``): :meth:`open` makes the DP sum (each row clipped to S in the scheme's payload
      domain; the audit's canary clients join it), :meth:`close` adds N(0, σ²S²), divides by the fixed
      denominator (qN; k for a fixed-size cohort) and records one accountant event of the cohort's sampling;
    * local (``local_dp``): :meth:`upload` noises each client's update before encode (one release each, counted by its
      accountant), summed with the scheme's weights;
    * off: the weighted sum.
    """

    def __init__(self, client_dp: ClientDP | None, local_dp, audit: AuditSettings | None, seed: int,
                 device: torch.device) -> None:
        if client_dp is not None and local_dp is not None:
            raise ValueError("client-level and local DP are exclusive: give client_dp or local_dp, not both")
        if audit is not None and client_dp is None:
            raise ValueError("an audit needs client-level DP (its canaries are clients of the DP sum)")
        self.client_dp, self.local_dp, self.audit = client_dp, local_dp, audit
        self.seed, self.device = seed, device
        self.mode = "client" if client_dp is not None else "local" if local_dp is not None else "off"
        self.accountant = None
        if client_dp is not None:
            from fedrun.privacy.accounting import PrivacyAccountant  # dp_accounting costs ~2 s of import

            self.accountant = PrivacyAccountant(client_dp.delta)
        self.canaries = None  # made at the first DP aggregation, when the payload's length is known
        self.diagnostics: dict[str, float] = {}

    def generator(self, rnd: int, *purpose: object) -> torch.Generator:
        return torch_generator(self.seed, rnd, *purpose, device=self.device)

    @property
    def noise_multiplier(self) -> float:
        return self.client_dp.noise_multiplier

    def noise_std(self) -> float | None:
        """Std of the client-level noise in each coordinate of the aggregate, σS over the fixed denominator (qN, k,
        …; correlated noise: its root mean square over the rounds); None without it."""
        dp = self.client_dp
        if dp is None:
            return None
        gain = 1.0 if dp.noise_weights is None else math.sqrt(float((dp.noise_weights ** 2).sum(1).mean()))
        return gain * dp.noise_multiplier * dp.clipping_norm / dp.expected_clients

    def open(self, rnd: int, clients: np.ndarray, weights: np.ndarray, dim: int, field=None):
        """The round's sum (``field``: summed in secure aggregation's Z_{2^bits}, :mod:`fedrun.secagg`)."""
        if self.client_dp is None:
            if self.local_dp is not None:
                self.local_dp.start_round(clients, weights)
            return WeightedSum(weights, dim, self.device, field)
        dp = self.client_dp
        agg = ClientLevelDPSum(dim, dp.clipping_norm, self.noise_multiplier, dp.expected_clients,
                               [(w, self.generator(r + 1, "client_dp_noise")) for r, w in dp.round_noise(rnd)],
                               self.device, field=field)
        if self.audit is not None:  # the audit's canary clients upload through the same DP sum
            agg.add(self.make_canaries(dim).rows(self.generator(rnd, "audit_participation"), rnd))
        return agg

    def upload(self, rnd: int, clients: np.ndarray, payload: torch.Tensor) -> torch.Tensor:
        """Local DP (paper 001): each client noises its update [k, n] (before the codec sees it); identity
        otherwise."""
        if self.local_dp is None:
            return payload
        out = self.local_dp.privatize(rnd, clients, payload, lambda l: self.generator(rnd, "local_dp", l))
        self.diagnostics = self.local_dp.diagnostics
        return out

    def close(self, rnd: int, agg) -> torch.Tensor:
        out = agg.finish()
        if self.client_dp is not None:
            record_abort(self.accountant, self.client_dp, rnd)
            if (event := self.client_dp.event(rnd)) is not None:
                self.accountant.record(event)
            self.diagnostics = agg.diagnostics()
            if self.canaries is not None:
                self.canaries.observe(out)
        return out

    def skip(self, rnd: int) -> None:
        """A round that released nothing (SecAgg aborted it). Under a participation schema its event is recorded all
        the same: the rounds' events charge the growth of the prefix sensitivity, which adds up to the run's s_T only
        if every round is charged (a later release can still carry this round's clients' later participations)."""
        record_abort(self.accountant, self.client_dp, rnd)
        if self.client_dp is not None and self.client_dp.sampling == "schema":
            if (event := self.client_dp.event(rnd)) is not None:
                self.accountant.record(event)

    def make_canaries(self, dim: int):
        """The audit's canaries for a ``dim``-long payload (drawn once, from the run's seed)."""
        if self.canaries is None:
            from fedrun.privacy.canaries import Canaries
            from fedrun.rng import numpy_rng

            dp = self.client_dp
            self.canaries = Canaries(self.audit.canaries, dim, dp.clipping_norm, dp.sampling_probability,
                                     self.generator(0, "audit_canaries"), numpy_rng(self.seed, "audit_included"),
                                     period=dp.schema[1] if dp.schema is not None else None)
        if dim != self.canaries.dim:
            raise ValueError(f"the audit's canaries have length {self.canaries.dim}; this aggregation {dim}")
        return self.canaries


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
        """Restore :meth:`state_dict`'s output."""
        self._rows, self._slot, self._count = {}, {}, {}
        for name, entry in state.items():
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
    """One federated run's state (global model, clients' data and state, ledger, privatizer) and its round."""

    def __init__(self, *, model: nn.Module, data: ClientData, x_test: torch.Tensor, y_test: torch.Tensor,
                 sampler: Sampler, scheme: Scheme, spec: LocalSpec, seed: int,
                 device: torch.device | str = "cpu", chunk_size: int = 64, workers: int = 1,
                 vectorized: bool = True, batched_layers: bool = True,
                 client_dp: ClientDP | None = None, local_dp=None,
                 x_val: torch.Tensor | None = None, y_val: torch.Tensor | None = None,
                 layout: FlatParams | None = None, audit: AuditSettings | None = None,
                 frozen_numel: int = 0, deployment=None) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.layout = layout or FlatParams(self.model)
        self.n = self.layout.numel
        self.params = self.layout.flatten(self.model).to(self.device)
        self.data = data
        self.x_test, self.y_test = x_test, y_test
        self.x_val, self.y_val = x_val, y_val
        self.sampler = sampler
        self.spec = spec
        self.seed = int(seed)
        self.vectorized = bool(vectorized)
        self.trainer = Trainer(self.model, self.layout, data, spec, seed=self.seed, chunk_size=chunk_size,
                               workers=workers, batched=batched_layers)
        self.ledger = Ledger()
        self.client_state = ClientState(data.num_clients, self.device)
        self.privatizer = Privatizer(client_dp, local_dp, audit, self.seed, self.device)
        self.client_dp, self.local_dp, self.audit = client_dp, local_dp, audit
        #: f¹ values each client needs once before it can train (paper 003's frozen extractor); 0 = none
        self.frozen_numel = int(frozen_numel)
        self.holds_frozen = np.zeros(data.num_clients, dtype=bool)
        self.velocity: torch.Tensor | None = None  # server momentum
        #: the clock and secure aggregation (:mod:`fedrun.deployment`); None = neither (network=none secagg=none)
        self.deployment = deployment
        self._eval_model: nn.Module | None = None
        self.scheme = scheme
        self.client_codec = copy.deepcopy(scheme)  # the clients' side: nothing it keeps reaches the server's
        # each side its own Env, with the codec's seed (one way from the run's: the privatizer's noise stays unknown)
        envs = [Env(n=self.n, device=self.device, seed=derive_seed(self.seed, "codec"), num_clients=data.num_clients,
                    local_mode=spec.mode, local_steps=spec.steps, clients_per_round=sampler.expected_clients,
                    dp=self.privatizer.mode, dp_noise_std=self.privatizer.noise_std()) for _ in range(2)]
        scheme.setup(envs[0])
        self.client_codec.setup(envs[1])
        if local_dp is not None and scheme.correction_state:
            raise ValueError(f"dp=local_{local_dp.mechanism} is not available with scheme={type(scheme).__name__}: "
                             f"its correction state changes the local steps the noise is calibrated to")

    @property
    def accountant(self):
        return self.privatizer.accountant

    @property
    def canaries(self):
        return self.privatizer.canaries

    # -- clients ----------------------------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    def generator(self, rnd: int, *purpose: object) -> torch.Generator:
        """A torch generator on the simulation's device for one (round, purpose) stream."""
        return torch_generator(self.seed, rnd, *purpose, device=self.device)

    def select(self, rnd: int) -> np.ndarray:
        return self.sampler.select(rnd, self.seed)

    def weights(self, clients: np.ndarray) -> np.ndarray:
        """The scheme's client weights (``Scheme.weighting``), aligned with ``clients``."""
        if len(clients) == 0:
            return np.zeros(0)
        if self.scheme.weighting == "uniform":
            return np.full(len(clients), 1.0 / len(clients))
        sizes = self.data.sizes[np.asarray(clients)].astype(np.float64)
        if self.scheme.weighting == "population":  # (N/b)·n_l/n: unbiased for the all-clients average
            return self.num_clients / float(self.sampler.expected_clients) * sizes / float(self.data.sizes.sum())
        return sizes / sizes.sum()

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

    # -- the round --------------------------------------------------------------------------------
    def run_round(self, rnd: int, clients: np.ndarray | None = None) -> dict[str, float]:
        """One round of the scheme (module docstring) with the sampler's clients (or ``clients``); its metrics."""
        server, client, ledger, dp = self.scheme, self.client_codec, self.ledger, self.privatizer
        ledger.start_round()
        clients = np.asarray(self.select(rnd) if clients is None else clients, dtype=np.int64)
        K = len(clients)
        down = np.zeros(K)  # each selected client's download this round (the clock's input)
        if self.frozen_numel:  # the frozen f¹, once per client, the first time it takes part
            fresh = ~self.holds_frozen[clients]
            ledger.downlink(Message.of_shape(self.frozen_numel, kind="extractor"), int(fresh.sum()), once=True)
            down += fresh * Message.of_shape(self.frozen_numel).nbytes
            self.holds_frozen[clients] = True
        if server.broadcast == "model":
            ledger.downlink(Message.of_shape(self.n, kind="model"), K)
            down += Message.of_shape(self.n).nbytes
        elif server.broadcast == "aggregate":  # the latest aggregate, sent to every client after each round
            down += Message.of_shape(server.payload_dim).nbytes
        dep, message, field = self.deployment, server.message, None
        if dep is not None:  # the clock and secure aggregation: whose upload reaches the server
            message = Message(dep.upload_bytes(message.nbytes, server.payload_dim), message.kind)
            clients, failed = dep.admit(rnd, clients, down, message.nbytes, server.payload_dim)
            if dep.discarded:  # late reports past the report goal: uploaded, then discarded (not summed)
                ledger.uplink(Message(message.nbytes, "discarded"), dep.discarded)
            if dep.secagg is not None:
                ledger.secagg(dep.metrics["secagg_uplink_bytes"], dep.metrics["secagg_downlink_bytes"])
            if failed:  # SecAgg: too few survivors to unmask (or fewer than 2 clients: no instance); nothing is
                ledger.uplink(message, len(clients))  # released, the model stays (masked vectors sent before it told)
                dp.skip(rnd)
                return {**dep.close(0.0), "clients": 0.0}
            field = dep.quantizer(len(clients) + (self.audit.canaries if self.audit is not None else 0))
        weights = self.weights(clients)
        correction = (self.client_state.get(server.correction_state, clients, self.n)
                      if server.correction_state else None)
        feedback = type(server).feedback is not Scheme.feedback
        keep_updates = server.queries and server.query_source is None
        agg = dp.open(rnd, clients, weights, server.payload_dim, field)
        sent, updates, losses = [], [], []
        for ids, local, loss in self.train(clients, rnd, correction):
            update = dp.upload(rnd, ids, local - self.params)  # local DP: noise on each update, before encode
            payload = self.encode(rnd, ids, update)
            ledger.uplink(message, len(ids))
            agg.add(payload)
            losses.append(loss)
            if feedback:
                sent.append(payload)
            if keep_updates:
                updates.append(update)
        aggregate = dp.close(rnd, agg)
        t0 = time.perf_counter()
        if server.broadcast == "aggregate":
            ledger.downlink(Message.of(aggregate, kind="aggregate"), self.num_clients)
        H, exact, values = server.query(rnd, aggregate) if server.queries else None, None, None
        exchange = None
        if H is not None:  # second exchange: the participants' exact values on H (never under DP)
            if dp.mode != "off":
                raise RuntimeError(f"scheme={type(server).__name__} asks for exact values under dp={dp.mode}")
            down_h = Message.of(H.to(torch.int32), kind="heavy_indices")
            if server.broadcast != "aggregate":
                ledger.downlink(down_h, len(clients))
            source = (self.client_state.get(server.query_source, clients, self.n) if server.query_source
                      else torch.cat(updates) if updates else torch.zeros(0, self.n, device=self.device))
            values = source[:, H]
            up_h = Message.of_shape(H.numel(), kind="heavy_values")
            ledger.uplink(up_h, len(clients))
            exact_sum = WeightedSum(weights, H.numel(), self.device)
            exact_sum.add(values)
            exact = exact_sum.finish()
            ledger.downlink(Message.of(exact, *([] if server.broadcast == "aggregate" else [H.to(torch.int32)]),
                                       kind="heavy_values_avg"), self.num_clients)
            exchange = (clients, up_h.nbytes, down_h.nbytes + Message.of(exact).nbytes)
        update = server.decode(rnd, aggregate, exact)
        self.server_step(update)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        server_seconds = time.perf_counter() - t0
        if feedback:
            payloads = torch.cat(sent) if sent else torch.zeros(0, server.payload_dim, device=self.device)
            values, *received = (None if t is None else t.clone() for t in (values, aggregate, update, H, exact))
            client.feedback(rnd, ClientView(self.client_state, clients), payloads, values, Received(*received))
        clock = ({**dep.close(server.server_flops(self.n), exchange, host_seconds=server_seconds),  # modelled;
                  **agg.quantization()} if dep is not None else {})  # the measured time is a diagnostic only
        return {**server.metrics, **client.metrics, **clock, "clients": float(len(clients)),
                "train_loss": float(torch.cat(losses).mean()) if losses else math.nan}

    def encode(self, rnd: int, ids: np.ndarray, updates: torch.Tensor) -> torch.Tensor:
        """The client codec's payloads of ``ids``, checked: a plain dense float32 tensor [len(ids), payload_dim].
        Under client-level DP each client is encoded alone, so a row can hold nothing of another client."""
        codec = self.client_codec
        if self.privatizer.mode == "client":
            rows = [codec.encode(rnd, updates[i:i + 1], ClientView(self.client_state, ids[i:i + 1]))
                    for i in range(len(ids))]
            for row in rows:
                self._check_payload(row, 1)
            payload = torch.cat(rows) if rows else updates.new_zeros(0, self.scheme.payload_dim)
        else:
            payload = codec.encode(rnd, updates, ClientView(self.client_state, ids))
        return self._check_payload(payload, len(ids))

    def _check_payload(self, payload, rows: int) -> torch.Tensor:
        shape = (rows, self.scheme.payload_dim)
        if (type(payload) is not torch.Tensor or payload.layout != torch.strided or payload.dtype != torch.float32
                or tuple(payload.shape) != shape or payload.device != self.device):
            got = (f"{type(payload).__name__} {tuple(payload.shape)} {payload.dtype} {payload.layout} on "
                   f"{payload.device}" if isinstance(payload, torch.Tensor) else type(payload).__name__)
            raise SchemeContractError(f"scheme={type(self.scheme).__name__}: encode must return a plain dense "
                                      f"float32 tensor of shape {shape} (one row per client) on {self.device}; "
                                      f"got {got}")
        return payload

    def server_step(self, update: torch.Tensor) -> None:
        """w ← w + η_g·(ρ·v + update) (server momentum ρ, FedAvgM; ρ = 0: none)."""
        rho = self.scheme.server_momentum
        if rho > 0:
            if self.velocity is None:
                self.velocity = torch.zeros_like(update)
            update = self.velocity.mul_(rho).add_(update)
        self.params.add_(update, alpha=self.scheme.server_lr)

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
        if self._eval_model is None:  # made at the first evaluation
            self._eval_model = eval_copy(self.model, self.device)
        return evaluate(self._eval_model, self.layout, self.params, x, y, self.spec.loss)
