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

import math
import time
from typing import Iterator

import numpy as np
import torch
from torch import nn

from fedrun.aggregation import WeightedSum
from fedrun.comm import Ledger, Message
from fedrun.models.flat import FlatParams
from fedrun.privacy.client_dp import ClientDP
from fedrun.privacy.privatizer import AuditSettings, Privatizer, SchemeContractError  # noqa: F401 (re-exported)
from fedrun.rng import derive_seed, torch_generator
from fedrun.sampling import Sampler
from fedrun.schemes.base import ClientView, Env, Received, Scheme, fresh_codec
from fedrun.training import ClientData, LocalSpec, Trainer, eval_copy, evaluate


class RunDiverged(FloatingPointError):
    """The global model, a client's update or the training loss became NaN/inf; metrics up to the previous round are
    kept."""


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

    def view(self, ids: np.ndarray) -> ClientView:
        """The clients ``ids``' own rows, copied, for a codec (never the store itself)."""
        ids = self._ids(ids)
        return ClientView({name: self.get(name, ids, rows.shape[1]) for name, rows in self._rows.items()}, len(ids),
                          self.device)

    def commit(self, ids: np.ndarray, view: ClientView) -> None:
        """Write back what a codec ``set`` on its view: those clients' rows only."""
        for name, values in view.written.items():
            self.set(name, ids, values)

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
        self.privatizer = Privatizer(client_dp, local_dp, audit, self.seed, self.device, type(scheme).__name__,
                                     sampler.name, data.num_clients)
        self.client_dp, self.local_dp, self.audit = client_dp, local_dp, audit
        #: f¹ values each client needs once before it can train (paper 003's frozen extractor); 0 = none
        self.frozen_numel = int(frozen_numel)
        self.holds_frozen = np.zeros(data.num_clients, dtype=bool)
        self.velocity: torch.Tensor | None = None  # server momentum
        #: the clock and secure aggregation (:mod:`fedrun.deployment`); None = neither (network=none secagg=none)
        self.deployment = deployment
        self._eval_model: nn.Module | None = None
        self.scheme = scheme
        # each side its own Env, with the codec's seed (one way from the run's: the privatizer's noise stays unknown);
        # the client side is a fresh codec per client (per chunk without client-level DP), built from the config
        self.client_env, env = (Env(n=self.n, device=self.device, seed=derive_seed(self.seed, "codec"),
                                    num_clients=data.num_clients, local_mode=spec.mode, local_steps=spec.steps,
                                    clients_per_round=sampler.expected_clients, dp=self.privatizer.mode,
                                    dp_noise_std=self.privatizer.noise_std()) for _ in range(2))
        scheme.setup(env)
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
        server, ledger, dp = self.scheme, self.ledger, self.privatizer
        ledger.start_round()
        clients = np.asarray(self.select(rnd) if clients is None else clients, dtype=np.int64)
        dp.cohort(rnd, clients)  # client-level DP: held to the sampler's declared participation law
        self.client_metrics: list[dict[str, float]] = []
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
            update = local - self.params
            if not bool(torch.isfinite(update).all()):
                bad = int(ids[int((~torch.isfinite(update)).any(1).nonzero()[0])])
                raise RunDiverged(f"the run diverged at round {rnd}: client {bad}'s local update is NaN/inf")
            update = dp.upload(rnd, ids, update)  # local DP: noise on each update, before encode
            payload = dp.add(agg, self.encode(rnd, ids, update))  # the privatizer's own copy
            ledger.uplink(message, len(ids))
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
            received = Received(aggregate, update, H, exact)
            # under client-level DP each client's own codec sees its own row only; else one codec for all
            for i in (range(len(clients)) if dp.mode == "client" else [slice(None)]):
                part = slice(i, i + 1) if isinstance(i, int) else i
                self.client_side(clients[part], lambda codec, view: codec.feedback(
                    rnd, view, payloads[part].clone(), None if values is None else values[part].clone(),
                    Received(*(None if t is None else t.clone() for t in vars(received).values()))))
        clock = ({**dep.close(server.server_flops(self.n), exchange, host_seconds=server_seconds),  # modelled;
                  **agg.quantization()} if dep is not None else {})  # the measured time is a diagnostic only
        return {**server.metrics, **self.client_side_metrics(), **clock, "clients": float(len(clients)),
                "train_loss": float(torch.cat(losses).mean()) if losses else math.nan}

    def client_side(self, ids: np.ndarray, call):
        """``call(codec, view)`` on a fresh client codec with the clients ``ids``' own state rows (copies), whose
        writes go back to those clients' slots only; its metrics are kept for the round (:meth:`client_side_metrics`)."""
        codec, view = fresh_codec(self.scheme, self.client_env), self.client_state.view(ids)
        out = call(codec, view)
        self.client_state.commit(ids, view)
        self.client_metrics.append(dict(codec.metrics))
        return out

    def client_side_metrics(self) -> dict[str, float]:
        """The round's client-side codec metrics, averaged over its codecs, each prefixed ``client_``: computed on the
        clients' side, so never covered by ε (:mod:`fedrun.metric_names`)."""
        keys = {k for m in self.client_metrics for k in m if k not in self.scheme.metrics}
        return {f"client_{k}": float(np.mean([m[k] for m in self.client_metrics if k in m])) for k in sorted(keys)}

    def encode(self, rnd: int, ids: np.ndarray, updates: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
        """The clients' payloads as (codec output, clients) parts: each client encodes an owned copy of its update with
        its own fresh codec under client-level DP (one part per client: a row can hold nothing of another client);
        one fresh codec per chunk otherwise. The privatizer checks and copies each part (:meth:`Privatizer.add`)."""
        if self.privatizer.mode != "client":
            return [(self.client_side(ids, lambda codec, view: codec.encode(rnd, updates.clone(), view)), len(ids))]
        return [(self.client_side(ids[i:i + 1], lambda codec, view: codec.encode(rnd, updates[i:i + 1].clone(), view)),
                 1) for i in range(len(ids))]

    def server_step(self, update: torch.Tensor) -> None:
        """w ← w + η_g·(ρ·v + update) (server momentum ρ, FedAvgM; ρ = 0: none)."""
        rho = self.scheme.server_momentum
        if rho > 0:
            if self.velocity is None:
                self.velocity = torch.zeros_like(update)
            update = self.velocity.mul_(rho).add_(update)
        self.params.add_(update, alpha=self.scheme.server_lr)

    def epsilon(self, accountant: str | None = None) -> float | None:
        """ε spent so far (:meth:`Privatizer.epsilon`), None without DP."""
        return self.privatizer.epsilon(accountant)

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self, split: str = "test") -> dict[str, float]:
        x, y = (self.x_test, self.y_test) if split == "test" else (self.x_val, self.y_val)
        if self._eval_model is None:  # made at the first evaluation
            self._eval_model = eval_copy(self.model, self.device)
        return evaluate(self._eval_model, self.layout, self.params, x, y, self.spec.loss)
