"""FbFTL's own protocol (paper 003, Alg. 1), which is not a FedAvg round: clients upload (f¹(x), y) once; the server
trains f². Its metrics per round are FL's, FTL-full's and FTL-c's (:func:`fedrun.transfer.split.round_metrics`) with
FbFTL's payloads: eqs. (6) and (10), ``upload_batches_total`` in samples, ``params_per_batch`` = N⁻_{m_c} features.

Re-exported for :mod:`fedrun.run`: ``prepare_model`` (:mod:`fedrun.transfer.source`), ``round_metrics``.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from fedrun.comm import Message
from fedrun.schemes.transfer import FbFTL, label_dtype
from fedrun.transfer import server as srv
from fedrun.transfer import split
from fedrun.transfer.source import prepare_model
from fedrun.transfer.split import round_metrics

log = logging.getLogger("fedrun")


class FbFTLRunner:
    """FbFTL's protocol on a simulation: round 1 uploads, every round ``epochs_per_round`` server epochs on f²."""

    def __init__(self, scheme: FbFTL, facts: dict, sim, lr: float, num_classes: int) -> None:
        self.scheme, self.facts, self.sim = scheme, facts, sim
        self.head_lr = scheme.head_lr if scheme.head_lr is not None else float(lr)
        self.num_classes = int(num_classes)
        self.z = self.y = self.optimizer = self.optimizer_state = None
        self.uploaded, self.epochs, self.upload_metrics = False, 0, {}

    def state_dict(self) -> dict:
        """The pool of uploads is not saved: a resumed run rebuilds it (f¹ is frozen, the shuffle seeded)."""
        return {"uploaded": self.uploaded, "epochs": self.epochs, "head_lr": self.head_lr,
                "upload_metrics": dict(self.upload_metrics),
                "optimizer": None if self.optimizer is None else self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.uploaded, self.epochs, self.head_lr = bool(state["uploaded"]), int(state["epochs"]), state["head_lr"]
        self.upload_metrics, self.optimizer_state = dict(state["upload_metrics"]), state["optimizer"]

    @torch.no_grad()
    def _uploads(self, block: int = 4096) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each client's features z = f¹(x) (float32) and labels (smallest integer type)."""
        sim, cut = self.sim, self.facts["cut"]
        was_training = sim.model.training
        sim.model.eval()
        z = torch.cat([sim.model.features(sim.data.x[s:s + block], cut).flatten(1)
                       for s in range(0, len(sim.data.x), block)])
        sim.model.train(was_training)
        ldt = label_dtype(self.num_classes)
        parts = [torch.as_tensor(p, device=z.device) for p in sim.data.parts]
        return [z[i].to(torch.float32) for i in parts], [sim.data.y[i].to(ldt) for i in parts]

    def _pool(self, zs: list[torch.Tensor], ys: list[torch.Tensor]) -> None:
        """The operator mixes all uploads and strips addresses: the server holds one shuffled pool."""
        z, y = torch.cat(zs), torch.cat(ys).to(torch.int64)
        perm = torch.randperm(len(y), generator=self.sim.generator(0, "fbftl_shuffle"), device=self.sim.device)
        self.z, self.y = z[perm], y[perm]

    def _upload(self) -> dict[str, float]:
        sim = self.sim
        if not self.scheme.clients_hold_source:
            sim.ledger.downlink(Message.of_shape(self.facts["frozen_numel"], kind="extractor"), sim.num_clients)
        zs, ys = self._uploads()
        for z_u, y_u in zip(zs, ys):
            sim.ledger.uplink(Message.of(z_u, y_u, kind="features"), 1)
        self._pool(zs, ys)
        self.uploaded = True
        out = {"uploading_clients": float(len(zs)), "uploaded_samples": float(len(self.y)),
               "uplink_bytes_per_batch": sim.ledger.uplink_round / len(self.y)}
        return {**out, **_leakage([y.cpu().numpy().astype(np.int64) for y in ys], self.num_classes)}

    def run_round(self, rnd: int) -> dict[str, float]:
        sim, s, metrics = self.sim, self.scheme, {}
        sim.ledger.start_round()
        if self.z is None and self.uploaded:  # resumed from a checkpoint: rebuild the pool, send nothing
            self._pool(*self._uploads())
        elif self.z is None:
            self.upload_metrics = self._upload()
            metrics.update(self.upload_metrics, **self.facts["source_info"])
        head = sim.model.body[self.facts["cut"]:]
        sim.layout.load_into(sim.model, sim.params)
        params = list(head.parameters())
        with srv.intra_op_threads(s.server_threads if sim.device.type == "cpu" else None):
            if self.optimizer is None and self.optimizer_state is None and s.tune_lrs:
                best, scores = srv.tune_learning_rate(
                    head, self.z, self.y, s.tune_lrs, epochs=s.tune_epochs, batch_size=s.server_batch_size,
                    validation_fraction=s.tune_fraction, momentum=s.head_momentum,
                    weight_decay=s.server_weight_decay, generator=sim.generator(0, "fbftl_tune"))
                log.info("FbFTL server: learning rate %g chosen from %s (held-out accuracy), no communication",
                         best, {k: round(v, 4) for k, v in scores.items()})
                self.head_lr, metrics["tune_best_val_accuracy"] = best, scores[best]
            if self.optimizer is None:
                self.optimizer = srv.make_optimizer(params, self.head_lr, s.head_momentum, s.server_weight_decay)
                if self.optimizer_state is not None:
                    self.optimizer.load_state_dict(self.optimizer_state)
            losses = []
            for _ in range(s.epochs_per_round):
                self.epochs += 1
                batches = srv.epoch_batches(len(self.y), s.server_batch_size, sim.generator(self.epochs, "fbftl_epoch"))
                losses.append(srv.sgd_epoch(head, params, self.z, self.y, batches, self.optimizer))
        sim.params.copy_(sim.layout.flatten(sim.model))
        f = self.facts
        metrics.update({"train_loss": float(np.mean(losses)), "clients": float(len(sim.select(rnd))),
                        "server_epochs": float(self.epochs),
                        "server_lr": float(self.head_lr),
                        "paper_uplink_bits": split.fbftl_uplink_bits(int(sim.data.sizes.sum()), f["features"]),
                        "paper_downlink_bits": split.fbftl_downlink_bits(f["frozen_numel"]),
                        "upload_batches_total": float(len(self.y)), "params_per_batch": float(f["features"]),
                        "uplink_bytes_per_batch": self.upload_metrics["uplink_bytes_per_batch"],
                        "downlink_broadcast_bytes_total": float(sim.ledger.broadcast_total),
                        "frozen_params": float(f["frozen_numel"]), "feature_dim": float(f["features"]),
                        "cut_layer": float(f["cut"])})
        return metrics


def _leakage(labels: list[np.ndarray], num_classes: int) -> dict[str, float]:
    """Observed and expected label leakage of the shuffled upload (eq. (19), uniform prior y0), when every client
    has the same number K of samples and the batch types can be enumerated."""
    from fedrun.transfer import leakage as lk

    sizes = {len(v) for v in labels}
    if len(sizes) != 1:
        return {}
    k, u, n = sizes.pop(), len(labels), num_classes
    if lk.num_batch_types(n, k) > 200_000:
        return {}
    s = lk.type_counts_from_labels(np.stack(labels).astype(np.int64), n)
    return {"label_leakage_bits": lk.leakage(s, n, k), "label_leakage_expected_bits": lk.expected_leakage(n, k, u).mean,
            "label_prior_bits": lk.prior_entropy(n, k)}
