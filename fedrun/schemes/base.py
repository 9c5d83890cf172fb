"""A scheme is a codec with state: the client side encodes an update, the server side decodes an aggregate.

The round itself belongs to :class:`fedrun.simulation.Simulation` (``Simulation.run_round``); a scheme never sees
the global parameters, the clients' local models, the accountant or the simulation. It implements at most five
methods (``setup``; ``encode``, ``decode`` and, for a second exchange, ``query`` and ``feedback``) and declares the
facts the round needs as attributes (see :class:`Scheme`).

The client side is a fresh instance built from the scheme's constructor arguments (:func:`fresh_codec`) for each
client under client-level DP (for each chunk of clients otherwise): nothing ``encode`` keeps on ``self`` reaches
another client or ``decode``, and a client's persistent state lives only in its own slot (:class:`ClientView`).
What the server learns of the clients is the output of the privatizer (and, without DP, the exact values a
``query`` asks for).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from fedrun.comm import Message
from fedrun.rng import derive_seed


def check(name: str, value: Any, allowed: str, ok=lambda v: True, kind=(int, float), null: bool = False) -> Any:
    """``value`` if None (where ``null``) or a ``kind`` (a bool only where ``kind`` has bool) with ``ok(value)``."""
    bad_type = isinstance(value, bool) and bool not in kind or not isinstance(value, kind)
    if not (null and value is None) and (bad_type or not ok(value)):
        raise ValueError(f"scheme.{name}={value!r}; allowed: {allowed}")
    return value


@dataclass(frozen=True, slots=True)
class Env:
    """What a scheme may know at set-up: sizes, device, the codec's shared randomness and public facts of the run:
    ``dp`` is the DP mode (``off`` | ``client`` | ``local``); ``dp_noise_std`` the std of the client-level DP noise
    in each coordinate of the aggregate (σ·S/(qN)), None without client-level DP.

    ``seed`` is the codec's own seed, derived one way (a hash) from the run's seed: the privatizer's noise, drawn
    from the run's seed, cannot be computed from it. The client and the server side each get their own instance
    (``slots``: nothing can be stored on it)."""

    n: int
    device: torch.device
    seed: int
    num_clients: int
    local_mode: str = "sgd"
    local_steps: int = 1
    clients_per_round: float = 1.0
    dp: str = "off"
    dp_noise_std: float | None = None

    def shared_seed(self, rnd: int, *purpose: object) -> int:
        """A seed every participant of round ``rnd`` derives alike (nothing is sent for it)."""
        return derive_seed(self.seed, "shared", rnd, *purpose)

    @property
    def full_participation(self) -> bool:
        """Every client takes part in every round (its expected count is all of them)."""
        return self.clients_per_round >= self.num_clients


class ClientView:
    """The persistent state of the clients a codec is given (one client under client-level DP): owned copies of their
    own rows (``rows``: name → [count, dim]), never the store. ``get`` returns a copy (zeros for a name never set);
    ``set`` keeps a copy, which the round writes back to these clients' slots after the codec returns."""

    def __init__(self, rows: dict[str, torch.Tensor], count: int, device: torch.device) -> None:
        self._rows, self.count, self.device = rows, int(count), device
        self.written: dict[str, torch.Tensor] = {}

    def get(self, name: str, dim: int) -> torch.Tensor:
        rows = self.written.get(name, self._rows.get(name))
        return torch.zeros(self.count, int(dim), device=self.device) if rows is None else rows.clone()

    def set(self, name: str, values: torch.Tensor) -> None:
        if type(values) is not torch.Tensor or values.dim() != 2 or values.shape[0] != self.count:
            raise ValueError(f"client state {name!r}: set takes a [{self.count}, dim] tensor (one row per client of "
                             f"this view); got {type(values).__name__} {tuple(getattr(values, 'shape', ()))}")
        self.written[name] = values.detach().clone()


@dataclass
class Received:
    """What the participants know after the server's decode: the (DP) aggregate, the decoded update, and the
    coordinates and averaged exact values of a second exchange (None without one)."""

    aggregate: torch.Tensor
    update: torch.Tensor
    indices: torch.Tensor | None = None
    values: torch.Tensor | None = None


class Scheme:
    """The codec base: identity encode/decode (FedAvg). Declared facts (class or set-up attributes):

    * ``dp_modes`` — DP modes it takes: ``off``, ``client`` (clip + noise on the aggregate, in the payload domain),
      ``local`` (noise on each client's update before ``encode``; opt-in: a scheme declares it). Checked before any
      data is loaded.
    * ``weighting`` — client weights without client-level DP: ``size`` (|D_k| / Σ_selected |D_j|), ``uniform``
      (1/K) or ``population`` ((N/b)·|D_k| / Σ_all |D_j|, paper 001).
    * ``compresses`` — refused on a model too small to compress; ``linear`` — encode is linear in the update.
    * ``broadcast`` — ``model`` (the global model to each selected client before training), ``aggregate`` (every
      device keeps a replica and receives the aggregate) or ``none`` (replicas receive a query's result only).
    * ``correction_state`` — a client-state name subtracted from each local gradient (gradient tracking), or None.
    * ``queries`` — a second exchange may follow (``query``); ``query_source`` — the client-state name whose values
      answer it (None: the update itself).
    * ``state`` — server-side attributes a checkpoint keeps; set at ``setup``: ``payload_dim``, ``message`` (one
      client's upload, for the byte ledger), ``compression_ratio`` (r of paper 000's cost formula), ``tags``;
      after each ``decode``: ``metrics`` (diagnostics of the round).
    * ``server_flops(n)`` — the server's modelled work per round (query + decode + optimizer step), a closed form of
      the configuration that the simulated clock charges at the profile's server speed (never a measured time)."""

    dp_modes: tuple[str, ...] = ("off", "client")
    weighting: str = "size"
    compresses: bool = False
    linear: bool = True
    broadcast: str = "model"
    correction_state: str | None = None
    queries: bool = False
    query_source: str | None = None
    state: tuple[str, ...] = ()
    #: paper 003's transfer settings (FL, FTL-full, FTL-c): initialise f¹ from a source model, train f² only
    needs_image_source: bool = False
    init_from_source: bool = False
    train_head_only: bool = False

    def __new__(cls, *args: Any, **kwargs: Any) -> "Scheme":
        """Keeps the constructor's arguments: the round builds each client's codec afresh from them
        (:func:`fresh_codec`), never by copying a set-up object."""
        self = super().__new__(cls)
        self._config = copy.deepcopy((args, kwargs))
        return self

    def __init__(self, server_lr: float = 1.0, server_momentum: float = 0.0) -> None:
        self.server_lr = float(check("server_lr", server_lr, "a number > 0", lambda v: v > 0))
        self.server_momentum = float(check("server_momentum", server_momentum, "0 <= server_momentum < 1",
                                           lambda v: 0.0 <= v < 1.0))
        self.metrics: dict[str, float] = {}
        self.tags: dict[str, str] = {}

    def setup(self, env: Env) -> None:
        """Sizes are known: allocate server state, set ``payload_dim``, ``message`` and ``compression_ratio``."""
        self.payload_dim, self.message, self.compression_ratio = env.n, Message.of_shape(env.n), 1.0

    def server_flops(self, n: int) -> float:
        """The server's operations in one round, for a model of ``n`` parameters: a deterministic function of the
        configuration (sizes, r, sketch shape, solver budget), never of measured time or data-dependent iteration
        counts. An operation is a float add, multiply or compare; index and memory moves are free.

        Here (identity decode, which moves memory only) just the optimizer step w ← w + η_g·(ρ·v + update):
        2n (one multiply-add per coordinate), and 2n more with server momentum ρ > 0 (v ← ρ·v + update).
        Schemes whose decode or query computes add theirs to this."""
        return 2.0 * n * (2 if self.server_momentum > 0 else 1)

    def encode(self, rnd: int, updates: torch.Tensor, state: ClientView) -> torch.Tensor:
        """Client side: updates [k, n] (local − global) → payloads [k, payload_dim]: a plain dense float32 tensor,
        one row per client (anything else is refused). Under client-level DP it is called one client at a time."""
        return updates

    def decode(self, rnd: int, aggregate: torch.Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
        """Server side: the aggregate [payload_dim] (and a query's averaged exact values) → the update [n]."""
        return aggregate

    def query(self, rnd: int, aggregate: torch.Tensor) -> torch.Tensor | None:
        """Server side: coordinates whose exact (averaged) values a second exchange asks for, or None."""
        return None

    def feedback(self, rnd: int, state: ClientView, sent: torch.Tensor, values: torch.Tensor | None,
                 received: Received) -> None:
        """Client side, after the round: update client state from its own payloads ``sent`` [K, d], its answers
        to the query ``values`` [K, m] and what it received."""

    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.state:  # a tensor goes to the device of the one it replaces
            value, old = state[name], getattr(self, name, None)
            moved = isinstance(value, torch.Tensor) and isinstance(old, torch.Tensor)
            setattr(self, name, value.to(old.device) if moved else value)


def fresh_codec(scheme: Scheme, env: Env) -> Scheme:
    """A new instance of ``scheme``'s class built from its constructor's arguments and set up with ``env``: nothing a
    codec keeps on ``self`` (or in closures it made) reaches another client or the server side."""
    args, kwargs = copy.deepcopy(object.__getattribute__(scheme, "_config"))
    codec = type(scheme)(*args, **kwargs)
    codec.setup(env)
    return codec
