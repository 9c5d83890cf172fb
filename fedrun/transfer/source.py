"""Pre-trained source models for transfer learning (paper 003), trained here and cached.

The paper copies the feature extractor f¹ of a source model pre-trained on a different task (VGG-16 on
ImageNet). No downloads are possible in fedrun's workplace, so fedrun trains its own source model: the
target's architecture with the source task's number of classes, trained centrally with plain mini-batch
SGD on the source dataset's training split (e.g. LeNet-5 on FEMNIST's 62 classes → MNIST digits).

Cache: ``cache_dir()/source_models/<dataset>-<model>-<key>.pt`` where ``key`` is a hash of everything that
determines the weights (:func:`source_key`: architecture, source dataset and a fingerprint of its training
labels and size, epochs, batch size, learning rate, momentum, weight decay, seed, sample limit, format
version). The file is written atomically (temporary file + ``os.replace``) under an exclusive lock, so
parallel sweep jobs train it once; it stores the key and the training settings, and a file whose key does
not match is retrained. The device the source was trained on is recorded but not part of the key.

The weights are the same only where kernels add up terms in the same order: SGD amplifies round-off, so the thread
count and the CPU change the source model, even in float64 (FEMNIST's LeNet-5: 0.7930 test accuracy with 1 thread,
0.8094 with 2, 0.7933 and 0.7924 on two other machines; MNIST's in float64: 0.9773 and 0.9835). A source model is a
random draw, so paper 003's configs draw one per seed (``source_seed: ${seed}``) and each run tags the sha256 of its
weights (``transfer.source_sha256``).

ImageNet: ``source_dataset=imagenet`` (only with ``model=vgg16``) loads torchvision's VGG-16 ImageNet
weights from the torch hub cache if a user has them (``$TORCH_HOME/hub/checkpoints``); fedrun never
downloads them, and says so in one line when they are missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedrun.transfer import split

log = logging.getLogger("fedrun")

FORMAT_VERSION = 1
SOURCE_DATASETS = ("femnist", "mnist", "fashion_mnist", "imagenet")
IMAGENET_MODELS = ("vgg16",)


@dataclass(frozen=True)
class SourceSpec:
    """How the source model is obtained: which task, which architecture, and how it is trained."""

    dataset: str
    model: str
    epochs: int = 3
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    seed: int = 0
    max_samples: int | None = None  # train on the first max_samples samples of a fixed permutation (tests)

    def __post_init__(self) -> None:
        check_source_dataset(self.dataset, self.model)
        if self.dataset == "imagenet":
            return
        if int(self.epochs) < 1:
            raise ValueError(f"source_epochs={self.epochs} must be an integer >= 1")
        if int(self.batch_size) < 1:
            raise ValueError(f"source_batch_size={self.batch_size} must be an integer >= 1")
        if not float(self.lr) > 0 or math.isinf(float(self.lr)):
            raise ValueError(f"source_lr={self.lr} must be > 0")
        if not 0 <= float(self.momentum) < 1:
            raise ValueError(f"source_momentum={self.momentum} is outside [0, 1)")
        if float(self.weight_decay) < 0:
            raise ValueError(f"source_weight_decay={self.weight_decay} must be >= 0")
        if self.max_samples is not None and int(self.max_samples) < 1:
            raise ValueError(f"source_max_samples={self.max_samples} must be >= 1 (or null for all)")


def check_source_dataset(name: str, model: str | None = None) -> None:
    """One-line ValueError for an unknown source, or ImageNet with a model that has no ImageNet weights."""
    if name not in SOURCE_DATASETS:
        raise ValueError(f"source_dataset={name!r} is unknown; allowed: {', '.join(SOURCE_DATASETS)} "
                          f"(imagenet only with model=vgg16 and torchvision's weights in the torch cache)")
    if name == "imagenet" and model is not None and model not in IMAGENET_MODELS:
        raise ValueError(f"source_dataset=imagenet needs model=vgg16 (torchvision's ImageNet VGG-16); got "
                          f"model={model}; for model={model} use source_dataset=femnist, mnist or fashion_mnist")


# ---------------------------------------------------------------------------------------------- cache key
def data_fingerprint(y_train: torch.Tensor, x_train: torch.Tensor) -> str:
    """Cheap identity of a training split: size, a hash of the labels and of a strided slice of the inputs."""
    h = hashlib.sha256()
    h.update(str(tuple(x_train.shape)).encode())
    h.update(np.ascontiguousarray(y_train.cpu().numpy()).tobytes())
    stride = max(1, len(x_train) // 256)
    h.update(np.ascontiguousarray(x_train[::stride].cpu().numpy().astype(np.float32)).tobytes())
    return h.hexdigest()[:16]


def source_key(spec: SourceSpec, num_classes: int, fingerprint: str) -> str:
    """Hash of what determines the source weights (the cache file's name and its stored key)."""
    what = {"format": FORMAT_VERSION, "num_classes": int(num_classes), "data": fingerprint, **asdict(spec)}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


def cache_path(spec: SourceSpec, key: str) -> Path:
    from fedrun.data.dataset import cache_dir

    return cache_dir() / "source_models" / f"{spec.dataset}-{spec.model}-{key}.pt"


# --------------------------------------------------------------------------------------------- training
class _Progress:
    """tqdm bar over steps on a terminal, else one log line per epoch."""

    def __init__(self, total: int, desc: str) -> None:
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)

    def step(self, loss: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss={loss:.4g}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 2048) -> float:
    model.eval()
    correct = sum(int((model(x[s:s + batch_size]).argmax(-1) == y[s:s + batch_size]).sum())
                  for s in range(0, len(x), batch_size))
    return correct / max(1, len(x))


def train_source(model: nn.Module, x: torch.Tensor, y: torch.Tensor, spec: SourceSpec,
                 device: torch.device | str = "cpu") -> dict[str, float]:
    """Centralised mini-batch SGD (momentum, weight decay) of ``model`` on (x, y), in place.

    Batches come from a fresh permutation each epoch drawn from a generator seeded with ``spec.seed``; the
    model's initial weights must already be set by the caller. Returns the final epoch's mean loss.
    """
    device = torch.device(device)
    model.to(device).train()
    gen = torch.Generator().manual_seed(int(spec.seed))
    if spec.max_samples is not None and spec.max_samples < len(y):
        keep = torch.randperm(len(y), generator=gen)[: int(spec.max_samples)]
        x, y = x[keep], y[keep]
    opt = torch.optim.SGD(model.parameters(), lr=float(spec.lr), momentum=float(spec.momentum),
                          weight_decay=float(spec.weight_decay))
    steps_per_epoch = -(-len(y) // int(spec.batch_size))
    progress = _Progress(steps_per_epoch * int(spec.epochs), f"source {spec.model} on {spec.dataset}")
    t0 = time.perf_counter()
    epoch_loss = math.nan
    try:
        for epoch in range(1, int(spec.epochs) + 1):
            order = torch.randperm(len(y), generator=gen)
            total = 0.0
            for s in range(0, len(y), int(spec.batch_size)):
                idx = order[s:s + int(spec.batch_size)]
                xb, yb = x[idx].to(device), y[idx].to(device)
                loss = F.cross_entropy(model(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                value = float(loss.detach())
                total += value * len(idx)
                progress.step(value)
            epoch_loss = total / len(y)
            if not math.isfinite(epoch_loss):
                raise ValueError(f"source training diverged (loss {epoch_loss}) at epoch {epoch}; "
                                  f"try a smaller source_lr than {spec.lr}")
            log.info("source model %s on %s: epoch %d/%d loss %.4f (%.0fs)", spec.model, spec.dataset, epoch,
                     spec.epochs, epoch_loss, time.perf_counter() - t0)
    finally:
        progress.close()
    model.eval()
    return {"train_loss": epoch_loss, "train_seconds": time.perf_counter() - t0}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive advisory lock on ``path`` + '.lock' (parallel sweep jobs train a source model once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(path.name + ".lock")
    with open(lock, "a+") as f:
        try:
            import fcntl

            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - not on POSIX: no lock, the write stays atomic
            pass
        yield


def _atomic_save(obj: Any, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; a cache file is as readable as any other
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def weights_hash(state: dict[str, torch.Tensor]) -> str:
    """sha256 of a state dict's names, dtypes, shapes and bytes (which source model a run used)."""
    h = hashlib.sha256()
    for k in sorted(state):
        v = state[k].detach().cpu().contiguous()
        h.update(f"{k}:{v.dtype}:{tuple(v.shape)};".encode())
        h.update(v.numpy().tobytes())
    return h.hexdigest()


@dataclass
class SourceModel:
    """A source model's weights and where they came from."""

    state_dict: dict[str, torch.Tensor]
    key: str
    path: Path | None
    cached: bool
    info: dict[str, Any]


def load_or_train(spec: SourceSpec, make_model, *, data_root: str | None = None,
                  device: torch.device | str = "cpu", dataset=None) -> SourceModel:
    """The source model for ``spec``: from the cache if its key matches, else trained now and cached.

    ``make_model(num_classes)`` builds the (randomly initialised) architecture; ``dataset`` may pass an
    already loaded source :class:`~fedrun.data.dataset.Dataset` (else it is loaded from ``data_root``).
    """
    if spec.dataset == "imagenet":
        return load_imagenet(spec)
    if dataset is None:
        from fedrun.data.sources import load_dataset

        dataset = load_dataset(spec.dataset, data_root)
    num_classes = int(dataset.num_classes)
    key = source_key(spec, num_classes, data_fingerprint(dataset.y_train, dataset.x_train))
    path = cache_path(spec, key)
    with _locked(path):
        if path.exists():
            try:
                blob = torch.load(path, map_location="cpu", weights_only=True)
                if blob.get("key") == key:
                    log.info("source model: cached %s", path)
                    return SourceModel(blob["state_dict"], key, path, True, blob.get("info", {}))
                log.warning("source model %s has key %s, expected %s: retraining", path, blob.get("key"), key)
            except Exception as exc:  # noqa: BLE001 - an unreadable cache file is retrained, not fatal
                log.warning("source model %s is unreadable (%s): retraining", path, exc)
        log.info("source model: training %s on %s (%d samples, %d epochs) → %s", spec.model, spec.dataset,
                 dataset.num_train if spec.max_samples is None else min(spec.max_samples, dataset.num_train),
                 spec.epochs, path)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(spec.seed))
            model = make_model(num_classes)
        stats = train_source(model, dataset.x_train, dataset.y_train, spec, device)
        stats["test_accuracy"] = accuracy(model, dataset.x_test.to(torch.device(device)),
                                          dataset.y_test.to(torch.device(device)))
        log.info("source model %s on %s: test accuracy %.4f", spec.model, spec.dataset, stats["test_accuracy"])
        info = {**stats, "num_classes": num_classes, "spec": asdict(spec), "device": str(device),
                "torch": str(torch.__version__)}
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        _atomic_save({"key": key, "state_dict": state, "info": info}, path)
        return SourceModel(state, key, path, False, info)


def prepare_model(scheme, model: torch.nn.Module, name: str, dataset, data_root, device):
    """Paper 003's model preparation: initialise f¹ from the source model (FTL-*, FbFTL) in place, before the
    simulation is built; returns (the trainable names, or None for all; facts: cut, sizes, source info)."""
    cut = split.check_cut(model, name, scheme.cut_layer)
    f1, f2 = split.split_names(model, cut)
    facts = {"cut": cut, "frozen_numel": split.numel_of(model, f1),
             "features": split.feature_dim(model, cut, dataset.x_test[:1]), "source_info": {}}
    if scheme.init_from_source:
        from fedrun.models.nets import build_model

        check_source_dataset(scheme.source_dataset, name)
        if scheme.source_dataset == dataset.name:
            log.warning("source_dataset=%s is the target dataset itself: not transfer learning", dataset.name)
        src_data = None
        if scheme.source_dataset != "imagenet":
            from fedrun.data.sources import load_dataset

            src_data = load_dataset(scheme.source_dataset, data_root)
            if tuple(src_data.input_shape) != tuple(dataset.input_shape):
                raise ValueError(f"source_dataset={scheme.source_dataset} has inputs {src_data.input_shape}, "
                                 f"dataset={dataset.name} has {dataset.input_shape}; they must match")
        spec = SourceSpec(dataset=scheme.source_dataset, model=name, **scheme.source_settings)
        src = load_or_train(spec, lambda k: build_model(name, num_classes=k), data_root=data_root, device=device,
                            dataset=src_data)
        split.copy_extractor(model, src.state_dict, cut)
        facts["source_info"] = {"source_test_accuracy": float(src.info.get("test_accuracy", math.nan)),
                                "source_train_seconds": float(src.info.get("train_seconds", math.nan)),
                                "source_cached": float(src.cached)}
        scheme.tags["transfer.source_sha256"] = weights_hash(src.state_dict)
    return (set(f2) if scheme.train_head_only else None), facts


# --------------------------------------------------------------------------------------------- ImageNet
def imagenet_weights_file(model: str = "vgg16") -> Path:
    """Where torchvision keeps ``model``'s ImageNet weights; ValueError (one line) when they are missing."""
    from torchvision.models import VGG16_Weights

    if model not in IMAGENET_MODELS:
        raise ValueError(f"source_dataset=imagenet needs model=vgg16; got model={model}")
    name = os.path.basename(VGG16_Weights.IMAGENET1K_V1.url)
    path = Path(torch.hub.get_dir()) / "checkpoints" / name
    if not path.is_file():
        raise ValueError(f"source_dataset=imagenet needs torchvision's ImageNet VGG-16 weights {name} in "
                          f"{path.parent} (not found; fedrun does not download them); copy the file there "
                          f"or set TORCH_HOME, or use source_dataset=femnist, mnist or fashion_mnist")
    return path


def load_imagenet(spec: SourceSpec) -> SourceModel:
    """torchvision VGG-16 ImageNet weights renamed to fedrun's ``vgg16`` body (see models.nets.VGG16)."""
    from fedrun.models.nets import VGG16

    path = imagenet_weights_file(spec.model)
    tv = torch.load(path, map_location="cpu", weights_only=True)
    state = {VGG16.torchvision_name_map().get(k, k): v for k, v in tv.items()}
    return SourceModel(state, "imagenet:" + path.name, path, True, {"num_classes": 1000})
