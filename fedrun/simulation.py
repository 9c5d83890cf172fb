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
from fedrun.privacy.accounting import PrivacyAccountant
from fedrun.privacy.mechanisms import PoissonGaussianEvent
from fedrun.rng import derive_seed, torch_generator
from fedrun.sampling import Sampler
from fedrun.schemes.base import Scheme
from fedrun.training import ClientData, LocalSpec, Trainer, evaluate


@dataclass(frozen=True)
class ClientDP:
    """Client-level DP settings (paper 000; DP-FedAvg): clip S, noise multiplier σ, Poisson rate q."""

    clipping_norm: float
    noise_multiplier: float
    sampling_probability: float
    expected_clients: float
    delta: float


class ClientState:
    """Per-client persistent tensors (error feedback, momentum, gradient-tracking terms, …).

    ``get(name, ids, dim)`` returns the rows of the named state for the given clients (zeros the first
    time); ``set`` writes them back. Storage is one dense [num_clients, dim] tensor per name, allocated
    on first use on the simulation's device.
    """

    def __init__(self, num_clients: int, device: torch.device) -> None:
        self.num_clients = int(num_clients)
        self.device = device
        self._store: dict[str, torch.Tensor] = {}

    def get(self, name: str, ids: np.ndarray, dim: int) -> torch.Tensor:
        if name not in self._store:
            self._store[name] = torch.zeros(self.num_clients, int(dim), device=self.device)
        return self._store[name][torch.as_tensor(ids, device=self.device)]

    def set(self, name: str, ids: np.ndarray, values: torch.Tensor) -> None:
        if name not in self._store:
            self._store[name] = torch.zeros(self.num_clients, values.shape[1], device=self.device)
        self._store[name][torch.as_tensor(ids, device=self.device)] = values

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.cpu() for k, v in self._store.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self._store = {k: v.to(self.device) for k, v in state.items()}


class Simulation:
    """One federated run's state and the services schemes use."""

    def __init__(self, *, model: nn.Module, data: ClientData, x_test: torch.Tensor, y_test: torch.Tensor,
                 sampler: Sampler, scheme: Scheme, spec: LocalSpec, seed: int,
                 device: torch.device | str = "cpu", chunk_size: int = 64, workers: int = 1,
                 vectorized: bool = True,
                 client_dp: ClientDP | None = None, local_dp=None,
                 x_val: torch.Tensor | None = None, y_val: torch.Tensor | None = None,
                 layout: FlatParams | None = None) -> None:
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
                               workers=workers)
        self.ledger = Ledger()
        self.client_state = ClientState(data.num_clients, self.device)
        self.client_dp = client_dp
        self.local_dp = local_dp
        self.accountant = PrivacyAccountant(client_dp.delta) if client_dp is not None else None
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
        return ClientLevelDPSum(dim, dp.clipping_norm, dp.noise_multiplier, dp.expected_clients,
                                self.generator(rnd, "client_dp_noise"), self.device)

    def finish_aggregate(self, rnd: int, agg) -> torch.Tensor:
        out = agg.finish()
        if self.client_dp is not None:
            self.accountant.record(PoissonGaussianEvent(self.client_dp.noise_multiplier,
                                                        self.client_dp.sampling_probability))
            self.last_dp_diagnostics = agg.diagnostics()
        return out

    def privatize_upload(self, rnd: int, clients: np.ndarray, payload: torch.Tensor) -> torch.Tensor:
        """Local DP (paper 001): each client noises what it uploads; identity when local DP is off."""
        if self.local_dp is None:
            return payload
        return self.local_dp.privatize(self, rnd, clients, payload)

    def epsilon(self) -> float | None:
        """ε spent so far (client-level: RDP accountant; local: the worst client's), None without DP."""
        if self.accountant is not None:
            return self.accountant.epsilon("rdp")
        if self.local_dp is not None:
            return self.local_dp.epsilon()
        return None

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self, split: str = "test") -> dict[str, float]:
        x, y = (self.x_test, self.y_test) if split == "test" else (self.x_val, self.y_val)
        return evaluate(self.model, self.layout, self.params, x, y, self.spec.loss)
