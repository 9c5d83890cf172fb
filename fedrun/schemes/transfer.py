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

from typing import Any, Sequence

import torch

from fedrun.schemes.fedavg import FedAvg
from fedrun.transfer.source import check_source_dataset


def label_dtype(num_classes: int) -> torch.dtype:
    """Smallest integer dtype that holds class ids 0..num_classes-1 (what an FbFTL client sends)."""
    if num_classes <= 256:
        return torch.uint8
    if num_classes <= 2**15:
        return torch.int16
    return torch.int32


class TransferScheme(FedAvg):
    """FedAvg with paper 003's initialisation and trainable-set choices (base of FL, FTL-full, FTL-c); the model is
    prepared by :func:`fedrun.transfer.source.prepare_model` before the simulation is built."""

    needs_image_source = True
    init_from_source = True

    def __init__(self, source_dataset: str = "femnist", cut_layer: int | None = None, source_epochs: int = 3,
                 source_batch_size: int = 64, source_lr: float = 0.05, source_momentum: float = 0.9,
                 source_weight_decay: float = 0.0, source_seed: int = 0, source_max_samples: int | None = None,
                 clients_hold_source: bool = False, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        check_source_dataset(str(source_dataset))
        if cut_layer is not None and (isinstance(cut_layer, bool) or not isinstance(cut_layer, int)):
            raise ValueError(f"cut_layer={cut_layer!r} must be an integer body index or null (the model's default)")
        self.source_dataset = str(source_dataset)
        self.cut_layer = cut_layer
        self.source_settings = dict(epochs=source_epochs, batch_size=source_batch_size, lr=source_lr,
                                    momentum=source_momentum, weight_decay=source_weight_decay, seed=source_seed,
                                    max_samples=source_max_samples)
        if source_dataset == "imagenet" and self.init_from_source:
            from fedrun.transfer.source import imagenet_weights_file

            imagenet_weights_file()  # fail now, in one line, before any work
        self.clients_hold_source = bool(clients_hold_source)


class FL(TransferScheme):
    """FL: FedAvg on the whole model from scratch (the source settings are accepted and not used)."""

    init_from_source = False


class FTLFull(TransferScheme):
    """FTL-full: pre-trained f¹, random f², FedAvg on all parameters."""


class FTLc(TransferScheme):
    """FTL-c: pre-trained, frozen f¹; FedAvg on f² only (only f² travels)."""

    train_head_only = True


class FbFTL(TransferScheme):
    """FbFTL (paper 003, Alg. 1): one upload of (f¹(x), y) per sample, shuffled; the server trains f². Its
    protocol is not the FedAvg round: :class:`fedrun.transfer.fbftl.FbFTLRunner` runs it."""

    dp_modes = ("off",)  # clients upload raw features and labels once; no DP mechanism covers them
    train_head_only = True

    def __init__(self, *, server_batch_size: int = 64, server_lr: float | None = None, server_momentum: float = 0.0,
                 server_weight_decay: float = 0.0, epochs_per_round: int = 1, tune_lrs: Sequence[float] | None = None,
                 tune_fraction: float = 0.1, tune_epochs: int = 3, server_threads: int | None = 1,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        checks = [(int(server_batch_size) >= 1, f"server_batch_size={server_batch_size} must be an integer >= 1"),
                  (server_lr is None or float(server_lr) > 0, f"server_lr={server_lr} must be > 0 (or null: the lr)"),
                  (int(epochs_per_round) >= 1, f"epochs_per_round={epochs_per_round} must be an integer >= 1"),
                  (0 <= float(server_momentum) < 1, f"server_momentum={server_momentum} is outside [0, 1)"),
                  (tune_lrs is None or (len(tune_lrs) > 0 and all(float(v) > 0 for v in tune_lrs)),
                   f"tune_lrs={tune_lrs} must be a non-empty list of learning rates > 0 (or null)"),
                  (0 < float(tune_fraction) < 1, f"tune_fraction={tune_fraction} is outside (0, 1)"),
                  (server_threads is None or int(server_threads) >= 1,
                   f"server_threads={server_threads} must be an integer >= 1 (or null: torch's default)")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        self.server_batch_size = int(server_batch_size)
        self.head_lr = None if server_lr is None else float(server_lr)
        self.head_momentum = float(server_momentum)
        self.server_weight_decay = float(server_weight_decay)
        self.epochs_per_round = int(epochs_per_round)
        self.tune_lrs = None if tune_lrs is None else [float(v) for v in tune_lrs]
        self.tune_fraction, self.tune_epochs = float(tune_fraction), int(tune_epochs)
        self.server_threads = None if server_threads is None else int(server_threads)


__all__ = ["FL", "FTLFull", "FTLc", "FbFTL", "TransferScheme", "label_dtype"]
