"""Paper 003 (Wang, Gursoy, Velipasalar, Globecom 2022): FL, FTL-full, FTL-c and FbFTL.

The model is split at a fully connected cut layer m_c (``cut_layer``, a body index; default the model's
``default_cut``): f¹ = layers before it (feature extractor), f² = the rest (task-specific part).

* ``fl`` (:class:`FL`) — FedAvg on the whole model from its random initialisation.
* ``ftl_full`` (:class:`FTLFull`) — f¹ copied from the source model, f² random; FedAvg on all parameters.
* ``ftl_c`` (:class:`FTLc`) — f¹ copied and frozen; FedAvg on f² only: only f² travels each round.
* ``fbftl`` (:class:`FbFTL`) — f¹ copied and frozen; in round 1 every client computes z = f¹(x) for all of
  its samples and uploads (z, y) once; the server shuffles all uploads together (no client ids reach it)
  and trains f² itself. Each later fedrun "round" is one more server epoch (``epochs_per_round``) with
  no communication, so test accuracy is logged per epoch. The sampler is not used: every client uploads.

The source model (``source_dataset``; trained here and cached, see :mod:`fedrun.transfer.source`) has the
target's architecture with the source task's classes; only f¹ is copied (the paper re-initialises f²).

Bytes. Measured in the ledger from what is sent: FedAvg messages are float32 vectors of the trained
parameters; an FbFTL upload is the client's features as float32 plus its labels in the smallest integer
type that holds the class ids (uint8 for ≤ 256 classes). Downlink of the frozen extractor: clients need
f¹ to compute anything. By default (``clients_hold_source: false``) the server sends f¹ (float32) to each
client once: FbFTL to every client in round 1, FTL-c to each client the first time it is selected (FL
and FTL-full send the whole model every round anyway). With ``clients_hold_source: true`` the clients
already hold the public source model and nothing extra is sent. The ledger counts a broadcast once per
receiving client; ``downlink_broadcast_bytes_total`` counts each broadcast once, as the paper's (10) does.

Extra metrics per round (cumulative): ``paper_uplink_bits`` / ``paper_downlink_bits`` (the paper's
formulas, :mod:`fedrun.transfer.split`, with U·C the sampler's expected clients per round and I the
rounds so far), ``upload_batches_total`` (client updates; FbFTL: samples, uploaded separately as in the
paper), ``params_per_batch`` (trained parameters; FbFTL: N⁻_{m_c} features), ``uplink_bytes_per_batch``
(measured), ``downlink_broadcast_bytes_total``; round 1 also logs the source model's test accuracy.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from fedrun.comm import Message
from fedrun.config import ConfigError
from fedrun.schemes.fedavg import FedAvg
from fedrun.transfer import server as srv
from fedrun.transfer import split
from fedrun.transfer.source import SourceSpec, check_source_dataset, load_or_train

if TYPE_CHECKING:  # pragma: no cover
    from fedrun.simulation import Simulation

log = logging.getLogger("fedrun")


def _model_name(c: dict) -> str:
    name = c["model"]["name"]
    return c["dataset"]["default_model"] if name == "auto" else name


def label_dtype(num_classes: int) -> torch.dtype:
    """Smallest integer dtype that holds class ids 0..num_classes-1 (what an FbFTL client sends)."""
    if num_classes <= 256:
        return torch.uint8
    if num_classes <= 2**15:
        return torch.int16
    return torch.int32


class TransferScheme(FedAvg):
    """FedAvg with paper 003's initialisation and trainable-set choices (base of FL, FTL-full, FTL-c)."""

    needs_image_source = True

    init_from_source: bool = True
    train_head_only: bool = False

    def __init__(self, source_dataset: str = "femnist", cut_layer: int | None = None, source_epochs: int = 3,
                 source_batch_size: int = 64, source_lr: float = 0.05, source_momentum: float = 0.9,
                 source_weight_decay: float = 0.0, source_seed: int = 0, source_max_samples: int | None = None,
                 clients_hold_source: bool = False, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_source_dataset(str(source_dataset))
        if cut_layer is not None and (isinstance(cut_layer, bool) or not isinstance(cut_layer, int)):
            raise ConfigError(f"cut_layer={cut_layer!r} must be an integer body index or null (the model's default)")
        self.source_dataset = str(source_dataset)
        self.cut_layer = cut_layer
        self.source_settings = dict(epochs=source_epochs, batch_size=source_batch_size, lr=source_lr,
                                    momentum=source_momentum, weight_decay=source_weight_decay, seed=source_seed,
                                    max_samples=source_max_samples)
        if source_dataset == "imagenet" and self.init_from_source:
            from fedrun.transfer.source import imagenet_weights_file

            imagenet_weights_file()  # fail now, in one line, before any work
        self.clients_hold_source = bool(clients_hold_source)
        self.cut = -1
        self.frozen_numel = 0
        self.head_numel = 0
        self.features = 0
        self.source_info: dict[str, Any] = {}
        self._uploads = 0
        self._broadcast_bytes = 0
        self._have_extractor: np.ndarray | None = None

    # -- set-up ------------------------------------------------------------------------------------
    def prepare_model(self, model: torch.nn.Module, context: dict) -> set[str] | None:
        c, dataset = context["config"], context["dataset"]
        name = _model_name(c)
        self.cut = split.check_cut(model, name, self.cut_layer)
        f1, f2 = split.split_names(model, self.cut)
        self.frozen_numel, self.head_numel = split.numel_of(model, f1), split.numel_of(model, f2)
        self.features = split.feature_dim(model, self.cut, dataset.x_test[:1])
        if self.init_from_source:
            self._load_source(model, name, c, dataset, context["device"])
        return set(f2) if self.train_head_only else None

    def _load_source(self, model: torch.nn.Module, name: str, c: dict, dataset, device) -> None:
        from fedrun.models.nets import build_model

        check_source_dataset(self.source_dataset, name)
        if self.source_dataset == dataset.name:
            log.warning("source_dataset=%s is the target dataset itself: not transfer learning", dataset.name)
        spec = SourceSpec(dataset=self.source_dataset, model=name, **self.source_settings)
        src_data = None
        if self.source_dataset != "imagenet":
            from fedrun.data.sources import load_dataset

            src_data = load_dataset(self.source_dataset, c.get("data_root"))
            if tuple(src_data.input_shape) != tuple(dataset.input_shape):
                raise ConfigError(f"source_dataset={self.source_dataset} has inputs {src_data.input_shape}, "
                                  f"dataset={dataset.name} has {dataset.input_shape}; they must match")
        src = load_or_train(spec, lambda k: build_model(name, num_classes=k), data_root=c.get("data_root"),
                            device=device, dataset=src_data)
        split.copy_extractor(model, src.state_dict, self.cut)
        self.source_info = {"source_test_accuracy": float(src.info.get("test_accuracy", math.nan)),
                            "source_train_seconds": float(src.info.get("train_seconds", math.nan)),
                            "source_cached": float(src.cached)}

    def setup(self, sim: "Simulation") -> None:
        self._have_extractor = np.zeros(sim.num_clients, dtype=bool)

    def state_dict(self) -> dict:
        """Counters and which clients hold f¹ (for checkpoint/resume)."""
        have = None if self._have_extractor is None else torch.from_numpy(self._have_extractor.copy())
        return {"uploads": self._uploads, "broadcast_bytes": self._broadcast_bytes, "have_extractor": have}

    def load_state_dict(self, state: dict) -> None:
        self._uploads = int(state["uploads"])
        self._broadcast_bytes = int(state["broadcast_bytes"])
        if state.get("have_extractor") is not None:
            self._have_extractor = state["have_extractor"].numpy().astype(bool).copy()

    # -- paper formulas ----------------------------------------------------------------------------
    def paper_bits(self, sim: "Simulation", rnd: int) -> tuple[float, float]:
        uc = sim.sampler.expected_clients
        up = split.fedavg_uplink_bits(rnd, uc, sim.n)
        frozen = self.frozen_numel if self.train_head_only else 0
        return up, split.fedavg_downlink_bits(rnd, sim.n, frozen)

    # -- the round ---------------------------------------------------------------------------------
    def round(self, sim: "Simulation", rnd: int, clients: np.ndarray) -> dict[str, float]:
        if self.train_head_only and not self.clients_hold_source and len(clients):
            new = np.asarray(clients)[~self._have_extractor[clients]]
            if len(new):  # the frozen f¹ (float32), once per client, the first time it takes part
                if not self._have_extractor.any():
                    self._broadcast_bytes += 4 * self.frozen_numel
                sim.ledger.downlink(Message.of_shape(self.frozen_numel, kind="extractor"), len(new))
                self._have_extractor[new] = True
        metrics = super().round(sim, rnd, clients)
        if len(clients):
            self._uploads += len(clients)
            self._broadcast_bytes += 4 * sim.n
        up, down = self.paper_bits(sim, rnd)
        metrics.update({"paper_uplink_bits": up, "paper_downlink_bits": down,
                        "upload_batches_total": float(self._uploads), "params_per_batch": float(sim.n),
                        "uplink_bytes_per_batch": float(4 * sim.n),
                        "downlink_broadcast_bytes_total": float(self._broadcast_bytes),
                        "frozen_params": float(self.frozen_numel if self.init_from_source else 0),
                        "feature_dim": float(self.features), "cut_layer": float(self.cut)})
        if rnd == 1:
            metrics.update(self.source_info)
        return metrics


class FL(TransferScheme):
    """FL: FedAvg on the whole model from scratch (the source settings are accepted and not used)."""

    init_from_source = False


class FTLFull(TransferScheme):
    """FTL-full: pre-trained f¹, random f², FedAvg on all parameters."""


class FTLc(TransferScheme):
    """FTL-c: pre-trained, frozen f¹; FedAvg on f² only (only f² travels)."""

    train_head_only = True


class FbFTL(TransferScheme):
    """FbFTL (paper 003, Alg. 1): one upload of (f¹(x), y) per sample, shuffled; the server trains f²."""

    dp_modes = ("off",)  # clients upload raw features and labels once; no DP mechanism covers them

    train_head_only = True

    def __init__(self, *, server_batch_size: int = 64, server_lr: float | None = None, server_momentum: float = 0.0,
                 server_weight_decay: float = 0.0, epochs_per_round: int = 1, tune_lrs: Sequence[float] | None = None,
                 tune_fraction: float = 0.1, tune_epochs: int = 3, server_threads: int | None = 1,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if int(server_batch_size) < 1:
            raise ConfigError(f"server_batch_size={server_batch_size} must be an integer >= 1")
        if server_lr is not None and not float(server_lr) > 0:
            raise ConfigError(f"server_lr={server_lr} must be > 0 (or null: the run's lr)")
        if int(epochs_per_round) < 1:
            raise ConfigError(f"epochs_per_round={epochs_per_round} must be an integer >= 1")
        if not 0 <= float(server_momentum) < 1:
            raise ConfigError(f"server_momentum={server_momentum} is outside [0, 1)")
        if tune_lrs is not None and (len(tune_lrs) == 0 or any(not float(v) > 0 for v in tune_lrs)):
            raise ConfigError(f"tune_lrs={list(tune_lrs)} must be a non-empty list of learning rates > 0 (or null)")
        if not 0 < float(tune_fraction) < 1:
            raise ConfigError(f"tune_fraction={tune_fraction} is outside (0, 1)")
        self.server_batch_size = int(server_batch_size)
        self.head_lr = None if server_lr is None else float(server_lr)
        self.server_momentum = float(server_momentum)
        self.server_weight_decay = float(server_weight_decay)
        self.epochs_per_round = int(epochs_per_round)
        self.tune_lrs = None if tune_lrs is None else [float(v) for v in tune_lrs]
        self.tune_fraction = float(tune_fraction)
        self.tune_epochs = int(tune_epochs)
        if server_threads is not None and int(server_threads) < 1:
            raise ConfigError(f"server_threads={server_threads} must be an integer >= 1 (or null: torch's default)")
        self.server_threads = None if server_threads is None else int(server_threads)
        self.z: torch.Tensor | None = None
        self.y: torch.Tensor | None = None
        self.num_classes = 0
        self._optimizer: torch.optim.Optimizer | None = None
        self._upload_metrics: dict[str, float] = {}
        self._epochs = 0
        self._uploaded = False
        self._optimizer_state: dict | None = None

    def prepare_model(self, model: torch.nn.Module, context: dict) -> set[str] | None:
        trainable = super().prepare_model(model, context)
        if self.head_lr is None:
            self.head_lr = float(context["config"]["lr"])
        self.num_classes = int(context["dataset"].num_classes)
        return trainable

    def paper_bits(self, sim: "Simulation", rnd: int) -> tuple[float, float]:
        return (split.fbftl_uplink_bits(int(sim.data.sizes.sum()), self.features),
                split.fbftl_downlink_bits(self.frozen_numel))

    # -- clients: one upload ------------------------------------------------------------------------
    @torch.no_grad()
    def client_features(self, sim: "Simulation", block: int = 4096) -> torch.Tensor:
        """z = f¹(x) for every training sample (each client's own forward pass; computed in blocks here)."""
        model = sim.model
        was_training = model.training
        model.eval()
        out = torch.cat([model.features(sim.data.x[s:s + block], self.cut).flatten(1)
                         for s in range(0, len(sim.data.x), block)])
        model.train(was_training)
        return out

    def _client_uploads(self, sim: "Simulation") -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """What each client sends: its features (float32) and labels (smallest integer type), client by client."""
        z_all = self.client_features(sim)
        ldt = label_dtype(self.num_classes)
        zs, ys = [], []
        for part in sim.data.parts:
            idx = torch.as_tensor(part, device=z_all.device)
            zs.append(z_all[idx].to(torch.float32))
            ys.append(sim.data.y[idx].to(ldt))
        return zs, ys

    def _pool(self, sim: "Simulation", zs: list[torch.Tensor], ys: list[torch.Tensor]) -> None:
        """The operator mixes all uploads and strips addresses: the server holds one shuffled pool."""
        z, y = torch.cat(zs), torch.cat(ys).to(torch.int64)
        perm = torch.randperm(len(y), generator=sim.generator(0, "fbftl_shuffle"), device=sim.device)
        self.z, self.y = z[perm], y[perm]

    def upload(self, sim: "Simulation") -> dict[str, float]:
        """Round 1: f¹ down (unless clients hold it), (z, y) of every sample up, shuffled at the server."""
        if not self.clients_hold_source:
            sim.ledger.downlink(Message.of_shape(self.frozen_numel, kind="extractor"), sim.num_clients)
            self._broadcast_bytes += 4 * self.frozen_numel
        zs, ys = self._client_uploads(sim)
        for z_u, y_u in zip(zs, ys):
            sim.ledger.uplink(Message.of(z_u, y_u, kind="features"), 1)
        self._pool(sim, zs, ys)
        self._uploaded = True
        n = len(self.y)
        self._uploads = n
        metrics = {"uploading_clients": float(len(zs)), "uploaded_samples": float(n),
                   "uplink_bytes_per_batch": sim.ledger.uplink_round / n}
        metrics.update(self._leakage([y_u.cpu().numpy().astype(np.int64) for y_u in ys]))
        return metrics

    def state_dict(self) -> dict:
        """Counters, the server's optimizer and learning rate. The pool of uploads is not saved: a resumed
        run rebuilds it (f¹ is frozen and the shuffle is seeded) without sending anything again."""
        state = super().state_dict()
        state.update({"uploaded": self._uploaded, "epochs": self._epochs, "head_lr": self.head_lr,
                      "upload_metrics": dict(self._upload_metrics),
                      "optimizer": None if self._optimizer is None else self._optimizer.state_dict()})
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._uploaded = bool(state["uploaded"])
        self._epochs = int(state["epochs"])
        self.head_lr = state["head_lr"]
        self._upload_metrics = dict(state["upload_metrics"])
        self._optimizer_state = state["optimizer"]

    def _leakage(self, labels: list[np.ndarray]) -> dict[str, float]:
        """Observed and expected label leakage of this shuffled upload (eq. (19), uniform prior y0), when
        every client has the same number K of samples and the batch types can be enumerated."""
        from fedrun.transfer import leakage as lk

        sizes = {len(v) for v in labels}
        if len(sizes) != 1:
            return {}
        k, u, n = sizes.pop(), len(labels), self.num_classes
        if lk.num_batch_types(n, k) > 200_000:
            return {}
        s = lk.type_counts_from_labels(np.stack(labels).astype(np.int64), n)
        return {"label_leakage_bits": lk.leakage(s, n, k),
                "label_leakage_expected_bits": lk.expected_leakage(n, k, u).mean,
                "label_prior_bits": lk.prior_entropy(n, k)}

    # -- server: train f² ---------------------------------------------------------------------------
    def _head(self, sim: "Simulation"):
        return sim.model.body[self.cut:]

    def round(self, sim: "Simulation", rnd: int, clients: np.ndarray) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if self.z is None and self._uploaded:  # resumed from a checkpoint: rebuild the pool, send nothing
            self._pool(sim, *self._client_uploads(sim))
        elif self.z is None:
            self._upload_metrics = self.upload(sim)
            metrics.update(self._upload_metrics)
            metrics.update(self.source_info)
        with srv.intra_op_threads(self.server_threads if sim.device.type == "cpu" else None):
            metrics.update(self._train(sim))
        up, down = self.paper_bits(sim, rnd)
        metrics.update({"server_epochs": float(self._epochs),
                        "server_lr": float(self.head_lr), "paper_uplink_bits": up, "paper_downlink_bits": down,
                        "upload_batches_total": float(self._uploads), "params_per_batch": float(self.features),
                        "uplink_bytes_per_batch": self._upload_metrics["uplink_bytes_per_batch"],
                        "downlink_broadcast_bytes_total": float(self._broadcast_bytes),
                        "frozen_params": float(self.frozen_numel), "feature_dim": float(self.features),
                        "cut_layer": float(self.cut)})
        return metrics

    def _train(self, sim: "Simulation") -> dict[str, float]:
        """``epochs_per_round`` server epochs of SGD on f² over the shuffled uploads (lr tuning first, once)."""
        metrics: dict[str, float] = {}
        head = self._head(sim)
        sim.layout.load_into(sim.model, sim.params)
        params = list(head.parameters())
        if self._optimizer is None and self._optimizer_state is not None:  # resumed
            self._optimizer = srv.make_optimizer(params, self.head_lr, self.server_momentum, self.server_weight_decay)
            self._optimizer.load_state_dict(self._optimizer_state)
        if self._optimizer is None:
            if self.tune_lrs:
                best, scores = srv.tune_learning_rate(
                    head, self.z, self.y, self.tune_lrs, epochs=self.tune_epochs, batch_size=self.server_batch_size,
                    validation_fraction=self.tune_fraction, momentum=self.server_momentum,
                    weight_decay=self.server_weight_decay, generator=sim.generator(0, "fbftl_tune"))
                log.info("FbFTL server: learning rate %g chosen from %s (held-out accuracy), no communication",
                         best, {k: round(v, 4) for k, v in scores.items()})
                self.head_lr = best
                metrics["tune_best_val_accuracy"] = scores[best]
            self._optimizer = srv.make_optimizer(params, self.head_lr, self.server_momentum, self.server_weight_decay)
        losses = []
        for e in range(self.epochs_per_round):
            self._epochs += 1
            batches = srv.epoch_batches(len(self.y), self.server_batch_size,
                                        sim.generator(self._epochs, "fbftl_epoch"))
            losses.append(srv.sgd_epoch(head, params, self.z, self.y, batches, self._optimizer))
        sim.params.copy_(sim.layout.flatten(sim.model))
        metrics["train_loss"] = float(np.mean(losses))
        return metrics


__all__ = ["FL", "FTLFull", "FTLc", "FbFTL", "TransferScheme", "label_dtype"]
