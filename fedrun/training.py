"""Local training of many clients at once, plus the sequential reference path.

Two local-training modes cover the papers:

* ``sgd`` — T mini-batch SGD steps with batch size B (papers 000, 002, 003);
* ``gd``  — E full-batch gradient steps on the client's whole data (paper 001).

Each step may clip the client's gradient to an L2 norm (``clip_norm``, paper 001's per-iteration
clipping ζ) — either the client's whole (mini-)batch gradient (``clip_mode="batch"``) or each sample's
gradient before averaging (``clip_mode="per_sample"``, which bounds one sample's influence by 2ζ/n_l as
the local-DP sensitivity needs) — and subtract a per-client correction vector c (FedSKETCHGATE's gradient tracking,
x ← x − η(g − c)).

The vectorized path runs all selected clients together. Where the model is a plain sequential stack of
convolutions, linear layers and parameter-free per-channel layers (the papers' conv nets), it runs on
client-batched layers (:mod:`fedrun.models.batched`: one grouped channels-last convolution or batched matmul
per layer for all clients, per-layer parameter leaves [K, *shape] kept across the steps, and per-sample
clipping from activations × output gradients without per-sample gradient vectors). Any other model runs a
``vmap``-ed ``torch.func.grad`` over the rows of one [K, n] parameter tensor. Unequal client sizes are
handled by padding each batch to a common size with a 0/1 mask in the loss. Clients are processed
in chunks of ``chunk_size`` so memory stays bounded. The sequential path trains client after client with
the ordinary ``nn.Module`` + autograd idiom and the same batches; it is the reference the vectorized
path is tested against and the baseline of the speed benchmark. Both compute in the dtype of the data and
the parameters (float32 in runs; the tests compare the two paths in float64, where round-off is far below
any difference in the math).
"""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedrun.models.batched import compile_sequential
from fedrun.models.flat import FlatParams
from fedrun.rng import numpy_rng

MODES = ("sgd", "gd")
LOSSES = ("cross_entropy", "mse")
CLIP_MODES = ("batch", "per_sample")
SAMPLE_BLOCK = 64  # per-sample gradients are computed at least this many samples at a time …
SAMPLE_ELEMENTS = 1 << 22  # … and more while a block's [k, b, n] gradients stay under this many entries (small models)


@dataclass(frozen=True)
class LocalSpec:
    """What one selected client does locally in a round."""

    mode: str = "sgd"
    steps: int = 10
    batch_size: int = 10
    lr: float = 0.05
    clip_norm: float | None = None
    loss: str = "cross_entropy"
    clip_mode: str = "batch"
    clip_ord: int = 2

    def __post_init__(self) -> None:
        if self.clip_ord not in (1, 2):
            raise ValueError(f"clip_ord={self.clip_ord} is not allowed; use 1 (L1, for the Laplace mechanism) or 2")
        if self.clip_mode not in CLIP_MODES:
            raise ValueError(f"clip_mode={self.clip_mode!r} is unknown; allowed: {', '.join(CLIP_MODES)}")
        if self.mode not in MODES:
            raise ValueError(f"local mode={self.mode!r} is unknown; allowed: {', '.join(MODES)}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} is unknown; allowed: {', '.join(LOSSES)}")
        if int(self.steps) < 1:
            raise ValueError(f"local steps={self.steps} must be >= 1")
        if int(self.batch_size) < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1")
        if not float(self.lr) > 0:
            raise ValueError(f"lr={self.lr} must be > 0")
        if self.clip_norm is not None and not float(self.clip_norm) > 0:
            raise ValueError(f"clip_norm={self.clip_norm} must be > 0 (or null for no clipping)")


@dataclass
class ClientData:
    """The training samples (on the compute device) and which of them each client holds."""

    x: torch.Tensor
    y: torch.Tensor
    parts: list[np.ndarray]

    def __post_init__(self) -> None:
        self.sizes = np.array([len(p) for p in self.parts], dtype=np.int64)

    @property
    def num_clients(self) -> int:
        return len(self.parts)


def batch_plan(data: ClientData, client_ids: Sequence[int], spec: LocalSpec, seed: int,
               rnd: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample indices for every step of every client: ([K, S, B] global indices, [K, S, B] 0/1 mask).

    ``sgd``: client k's T batches take min(B, n_k) samples each, walking through fresh random
    permutations of its data (epoch by epoch); ``gd``: one plan row (S = 1) with all of the client's
    samples, reused by every step. Padding positions point at the client's first sample with mask 0.
    Draws come from the (seed, round, client) stream, so any subset or order of clients gets the
    same batches.
    """
    ids = [int(c) for c in client_ids]
    sizes = data.sizes[ids]
    if spec.mode == "gd":
        width, steps = int(sizes.max()), 1
    else:
        width, steps = int(min(spec.batch_size, sizes.max())), int(spec.steps)
    idx = np.empty((len(ids), steps, width), dtype=np.int64)
    mask = np.zeros((len(ids), steps, width), dtype=np.float32)
    for row, (cid, n_k) in enumerate(zip(ids, sizes)):
        part = data.parts[cid]
        if spec.mode == "gd":
            idx[row, 0, :n_k] = part
            idx[row, 0, n_k:] = part[0]
            mask[row, 0, :n_k] = 1.0
            continue
        b = min(width, n_k)
        need = steps * b
        rng = numpy_rng(seed, "batches", rnd, cid)
        perms = [rng.permutation(n_k) for _ in range(-(-need // n_k))]
        order = np.concatenate(perms)[:need].reshape(steps, b)
        idx[row, :, :b] = part[order]
        idx[row, :, b:] = part[0]
        mask[row, :, :b] = 1.0
    return torch.from_numpy(idx), torch.from_numpy(mask)


def _per_sample_losses(out: torch.Tensor, y: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-sample losses of the outputs ``out`` [*y.shape, …] for the targets ``y`` (any leading shape)."""
    if kind == "cross_entropy":
        return F.cross_entropy(out.reshape(y.numel(), -1), y.reshape(-1), reduction="none").view(y.shape)
    return (out - y) ** 2


def _masked_loss(out: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, kind: str) -> torch.Tensor:
    return (_per_sample_losses(out, y, kind) * mask).sum() / mask.sum().clamp_min(1.0)


def _clip(g: torch.Tensor, clip_norm: float | None, ord: int = 2) -> torch.Tensor:
    """Scale each row of g to L_ord norm ≤ clip_norm (ord 2, or 1 for the Laplace mechanism's sensitivity)."""
    if clip_norm is None:
        return g
    norms = g.norm(p=ord, dim=-1, keepdim=True)
    return g * torch.clamp(clip_norm / norms.clamp_min(1e-12), max=1.0)


class Trainer:
    """Runs local training for a set of clients, vectorized (default) or sequentially."""

    def __init__(self, model: nn.Module, layout: FlatParams, data: ClientData, spec: LocalSpec,
                 seed: int, chunk_size: int = 64, workers: int = 1, batched: bool = True) -> None:
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size={chunk_size} must be >= 1")
        if int(workers) < 1:
            raise ValueError(f"workers={workers} must be >= 1")
        self.model = model
        self.layout = layout
        self.data = data
        self.spec = spec
        self.seed = int(seed)
        self.chunk_size = int(chunk_size)
        self.workers = int(workers)
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        # client-batched layers (grouped channels-last convolutions, batched matmuls, per-sample norms from
        # activations) where the model allows; otherwise vmap over clients
        self.batched = compile_sequential(model, layout.names) if batched else None

    def _fns(self) -> tuple[Callable, Callable]:
        """This thread's vmapped (step, per-sample) gradient functions.

        ``functional_call`` swaps a module's parameters while it runs, so each worker thread gets its own
        copy of the module (the main thread uses the model itself).
        """
        fns = getattr(self._local, "fns", None)
        if fns is not None:
            return fns
        model = self.model if threading.current_thread() is threading.main_thread() else copy.deepcopy(self.model)
        layout, spec = self.layout, self.spec
        frozen = {n: p.detach() for n, p in model.named_parameters() if n not in set(layout.names)}

        def loss_fn(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            params = {**frozen, **layout.unflatten(flat)}
            return _masked_loss(functional_call(model, params, (x,)), y, m, spec.loss)

        def sample_loss(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            params = {**frozen, **layout.unflatten(flat)}
            out = functional_call(model, params, (x.unsqueeze(0),))
            return _masked_loss(out, y.unsqueeze(0), torch.ones(1, device=x.device, dtype=x.dtype), spec.loss)

        # per-client gradients, and [k clients] × [b samples] gradients for per-sample clipping
        fns = (vmap(grad_and_value(loss_fn)), vmap(vmap(grad_and_value(sample_loss), in_dims=(None, 0, 0))))
        self._local.fns = fns
        return fns

    def _per_sample_step(self, p: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor,
                         mb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean over each client's samples of per-sample gradients clipped to clip_norm; mean loss."""
        total = torch.zeros_like(p)
        loss_total = torch.zeros(p.shape[0], device=p.device, dtype=p.dtype)
        block = max(SAMPLE_BLOCK, SAMPLE_ELEMENTS // max(1, p.shape[0] * p.shape[1]))
        for s in range(0, xb.shape[1], block):
            g, loss = self._fns()[1](p, xb[:, s:s + block], yb[:, s:s + block])
            m = mb[:, s:s + block]
            g = _clip(g, self.spec.clip_norm, self.spec.clip_ord)
            total += torch.einsum("kb,kbn->kn", m, g)
            loss_total += (loss * m).sum(1)
        count = mb.sum(1).clamp_min(1.0)
        return total / count[:, None], loss_total / count

    # -- vectorized -------------------------------------------------------------------------------
    def train(self, params: torch.Tensor, client_ids: Sequence[int], rnd: int,
              correction: torch.Tensor | None = None) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
        """Yield (client ids of the chunk, their local models [k, n], their mean local loss [k]) chunk by chunk.

        ``correction`` (optional, [K, n] aligned with ``client_ids``) is subtracted from every local
        gradient (gradient tracking). With ``workers > 1`` on the CPU, chunks (balanced, at most
        ``chunk_size`` clients each, at least one per worker) train concurrently in worker threads, each
        running single-threaded torch ops: small per-client convolutions use the cores better this way
        than through intra-op threads. Results are identical to ``workers = 1``.
        """
        ids = np.asarray(client_ids, dtype=np.int64)
        if len(ids) == 0:
            return
        parallel = self.workers > 1 and self.data.x.device.type == "cpu"
        n_chunks = -(-len(ids) // self.chunk_size)
        if parallel:
            n_chunks = min(len(ids), -(-max(n_chunks, self.workers) // self.workers) * self.workers)
        bounds = np.cumsum([0] + [len(c) for c in np.array_split(ids, n_chunks)])
        jobs = [(ids[a:b], None if correction is None else correction[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        if not parallel:
            for chunk, corr in jobs:
                yield (chunk, *self._train_chunk(params, chunk, rnd, corr))
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="fedrun-train")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            futures = [self._pool.submit(self._train_chunk, params, chunk, rnd, corr) for chunk, corr in jobs]
            results = [f.result() for f in futures]
        finally:
            torch.set_num_threads(threads)
        for (chunk, _), (new, losses) in zip(jobs, results):
            yield chunk, new, losses

    def _train_chunk(self, params: torch.Tensor, chunk: np.ndarray, rnd: int,
                     corr: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        spec, data = self.spec, self.data
        idx, mask = batch_plan(data, chunk, spec, self.seed, rnd)
        idx, mask = idx.to(data.x.device), mask.to(data.x.device, params.dtype)
        if self.batched is not None:
            return self._train_chunk_batched(params, len(chunk), idx, mask, corr)
        p = params.detach().unsqueeze(0).repeat(len(chunk), 1)
        loss_sum = torch.zeros(len(chunk), device=params.device, dtype=params.dtype)
        full_batch = idx.shape[1] == 1
        for t in range(spec.steps):
            if t == 0 or not full_batch:  # full-batch: gathered once
                xb, yb, mb = data.x[idx[:, t]], data.y[idx[:, t]], mask[:, t]
            if spec.clip_norm is not None and spec.clip_mode == "per_sample":
                g, loss = self._per_sample_step(p, xb, yb, mb)
            else:
                g, loss = self._fns()[0](p, xb, yb, mb)
                g = _clip(g, spec.clip_norm, spec.clip_ord)
            if corr is not None:
                g = g - corr
            p = p - spec.lr * g
            loss_sum += loss.detach()
        return p, loss_sum / spec.steps

    def _train_chunk_batched(self, params: torch.Tensor, k: int, idx: torch.Tensor, mask: torch.Tensor,
                             corr: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_train_chunk` on the client-batched layers: per-layer leaves [k, *shape] for all the steps."""
        spec, data, names = self.spec, self.data, self.layout.names
        engine = self.batched
        leaves = {n: t.detach().unsqueeze(0).expand(k, *t.shape).clone()
                  for n, t in self.layout.unflatten(params).items()}
        corrs = self.layout.unflatten(corr) if corr is not None else None
        loss_sum = torch.zeros(k, device=params.device, dtype=params.dtype)
        full_batch = idx.shape[1] == 1
        per_sample = spec.clip_norm is not None and spec.clip_mode == "per_sample"
        for t in range(spec.steps):
            if t == 0 or not full_batch:
                xb, yb, mb = data.x[idx[:, t]], data.y[idx[:, t]], mask[:, t]
                count = mb.sum(1).clamp_min(1.0)
            if per_sample:
                grads, per = engine.per_sample_clipped_grad(
                    leaves, xb, lambda out: _per_sample_losses(out, yb, spec.loss), mb / count[:, None],
                    float(spec.clip_norm), spec.clip_ord)
                g = [grads[n] for n in names]
                loss = (per * mb).sum(1) / count
            else:
                for v in leaves.values():
                    v.requires_grad_(True)
                per = _per_sample_losses(engine.forward(leaves, xb), yb, spec.loss)
                loss = (per * mb).sum(1) / count
                g = list(torch.autograd.grad(loss.sum(), [leaves[n] for n in names]))
                if spec.clip_norm is not None:
                    if spec.clip_ord == 2:
                        norm = torch.stack([x.pow(2).flatten(1).sum(1) for x in g]).sum(0).sqrt()
                    else:
                        norm = torch.stack([x.abs().flatten(1).sum(1) for x in g]).sum(0)
                    factor = torch.clamp(spec.clip_norm / norm.clamp_min(1e-12), max=1.0)
                    g = [x * factor.view(-1, *[1] * (x.dim() - 1)) for x in g]
            with torch.no_grad():
                for n, gn in zip(names, g):
                    v = leaves[n].detach()
                    if corrs is not None:
                        gn = gn - corrs[n]
                    leaves[n] = v - spec.lr * gn
            loss_sum += loss.detach()
        p = torch.cat([leaves[n].detach().reshape(k, -1) for n in names], 1)
        return p, loss_sum / spec.steps

    # -- sequential reference ---------------------------------------------------------------------
    def train_sequential(self, params: torch.Tensor, client_ids: Sequence[int], rnd: int,
                         correction: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Client after client with a plain nn.Module and autograd; same batches and math as :meth:`train`."""
        spec, data = self.spec, self.data
        ids = np.asarray(client_ids, dtype=np.int64)
        idx, mask = batch_plan(data, ids, spec, self.seed, rnd)
        idx, mask = idx.to(data.x.device), mask.to(data.x.device, params.dtype)
        module = copy.deepcopy(self.model)
        trainable = [dict(module.named_parameters())[n] for n in self.layout.names]
        for p in module.parameters():
            p.requires_grad_(False)
        for p in trainable:
            p.requires_grad_(True)
        out_params, out_losses = [], []
        for row in range(len(ids)):
            self.layout.load_into(module, params)
            total = 0.0
            for t in range(spec.steps):
                s = 0 if idx.shape[1] == 1 else t
                xb, yb, mb = data.x[idx[row, s]], data.y[idx[row, s]], mask[row, s]
                loss = _masked_loss(module(xb), yb, mb, spec.loss)
                if spec.clip_norm is not None and spec.clip_mode == "per_sample":
                    g = self._sequential_per_sample(module, trainable, xb, yb, mb)
                else:
                    grads = torch.autograd.grad(loss, trainable)
                    g = torch.cat([gr.reshape(-1) for gr in grads])
                    g = _clip(g.unsqueeze(0), spec.clip_norm, spec.clip_ord)[0]
                if correction is not None:
                    g = g - correction[row]
                with torch.no_grad():
                    offset = 0
                    for p in trainable:
                        n = p.numel()
                        p -= spec.lr * g[offset:offset + n].view_as(p)
                        offset += n
                total += float(loss.detach())
            out_params.append(self.layout.flatten(module))
            out_losses.append(total / spec.steps)
        return torch.stack(out_params), torch.tensor(out_losses, dtype=params.dtype)

    def _sequential_per_sample(self, module: nn.Module, trainable: list[torch.Tensor], xb: torch.Tensor,
                               yb: torch.Tensor, mb: torch.Tensor) -> torch.Tensor:
        total, count = None, 0
        for i in torch.nonzero(mb > 0).flatten().tolist():
            one = _masked_loss(module(xb[i:i + 1]), yb[i:i + 1], torch.ones(1, device=xb.device, dtype=xb.dtype),
                               self.spec.loss)
            g = torch.cat([gr.reshape(-1) for gr in torch.autograd.grad(one, trainable)])
            g = _clip(g.unsqueeze(0), self.spec.clip_norm, self.spec.clip_ord)[0]
            total = g if total is None else total + g
            count += 1
        return total / max(count, 1)


#: evaluation batch: on a 2-core CPU a batch of 250 images in channels-last runs a conv net's forward fastest
#: (results/bench/eval.md: scripts/bench_eval.py)
EVAL_BATCH_SIZE = 250


def eval_copy(model: nn.Module, device: torch.device | str) -> nn.Module:
    """A copy of ``model`` for :func:`evaluate`: in channels-last memory format for a conv net on the CPU (its
    forward is ~1.5× faster there at batch 250), as it is elsewhere. The training path never sees it."""
    m = copy.deepcopy(model)
    if torch.device(device).type == "cpu" and any(isinstance(x, nn.Conv2d) for x in m.modules()):
        m = m.to(memory_format=torch.channels_last)
    return m


def evaluate(model: nn.Module, layout: FlatParams, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
             loss: str, batch_size: int = EVAL_BATCH_SIZE) -> dict[str, float]:
    """Loss and accuracy (classification) or MSE (regression) of the flat ``params`` on (x, y).

    The parameters are copied into ``model`` (the layout's parameters only; frozen ones stay; pass an
    :func:`eval_copy` to keep the simulation's own module untouched) and the plain module runs under
    ``torch.inference_mode`` in batches of ``batch_size`` (inputs in the module's memory format): no autograd
    bookkeeping and no ``functional_call`` re-binding per batch (results/bench/eval.md)."""
    layout.load_into(model, params)
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    channels_last = conv is not None and conv.weight.is_contiguous(memory_format=torch.channels_last) \
        and not conv.weight.is_contiguous()
    total_loss, correct, count = 0.0, 0, 0
    with torch.inference_mode():
        for s in range(0, len(x), batch_size):
            xb, yb = x[s:s + batch_size], y[s:s + batch_size]
            if channels_last and xb.dim() == 4:
                xb = xb.contiguous(memory_format=torch.channels_last)
            out = model(xb)
            if loss == "cross_entropy":
                total_loss += float(F.cross_entropy(out, yb, reduction="sum"))
                correct += int((out.argmax(-1) == yb).sum())
            else:
                total_loss += float(((out - yb) ** 2).sum())
            count += len(xb)
    if count == 0:
        raise ValueError("cannot evaluate on an empty split")
    mean = total_loss / count
    if loss == "cross_entropy":
        return {"loss": mean, "accuracy": correct / count}
    return {"loss": mean, "mse": mean}
