"""FEMNIST (LEAF): writer-partitioned handwritten digits and letters, 62 classes.

Two on-disk forms are read:

* ``ROOT/FEMNIST/{train,test}.npz`` (the shared data folder): ``x`` uint8 ``(N, 28, 28)`` in LEAF polarity
  (255 = white background), ``y`` int64 in 0..61, ``writer`` int64 index into ``writers`` (LEAF user ids).
* LEAF's JSON output, ``<leaf_dir>/{train,test}/*.json`` (after ``data/femnist/preprocess.sh``), each file
  ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784 floats in 0..1]], "y": [...]}}}``.
  ``leaf_dir`` may also be LEAF's ``data/femnist`` folder (then ``data/{train,test}`` is used). Without an
  explicit ``leaf_dir``, ``ROOT/FEMNIST/leaf/`` is tried under each root after the ``.npz`` files.

Polarity: images are flipped to MNIST-like polarity (ink bright, background 0): ``v = 1 - leaf_value``,
then standardised with ``NORMALIZATION`` (mean/std of ``v`` over the shared train split).
Labels: 0-9 digits, 10-35 'A'-'Z', 36-61 'a'-'z' (LEAF's mapping). Groups: index of the writer in
``group_names`` (the writers that occur in train or test, in sorted order for JSON; file order for npz).
"""

from __future__ import annotations

import json
import os
import re
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from fedrun.data.dataset import DataIntegrityError, DataNotFoundError, Dataset, not_found, search_roots

NUM_CLASSES = 62
#: (mean, std) of ``1 - x/255`` over the shared FEMNIST train split (29,224 images): 0.03874 / 0.16479.
NORMALIZATION = (0.0387, 0.1648)
_NPZ_KEYS = ("x", "y", "writer", "writers")


def _dataset(v_tr: np.ndarray, y_tr: np.ndarray, v_te: np.ndarray, y_te: np.ndarray, inverse: np.ndarray,
             names: list[str], source: str, fmt: str) -> Dataset:
    """The FEMNIST :class:`Dataset` of the images ``v_*`` (float, MNIST-like polarity [0, 1], (N, 28, 28)),
    standardised to [N, 1, 28, 28], with ``inverse`` the writer index of every train then test sample."""
    mean, std = NORMALIZATION

    def x(v: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((v - mean) / std).astype(np.float32)).unsqueeze(1)

    n_tr = len(y_tr)
    return Dataset(name="femnist", x_train=x(v_tr), y_train=torch.from_numpy(y_tr), x_test=x(v_te),
                   y_test=torch.from_numpy(y_te), task="classification", num_classes=NUM_CLASSES, source=source,
                   groups_train=inverse[:n_tr].astype(np.int64), groups_test=inverse[n_tr:].astype(np.int64),
                   group_names=names, info={"normalization": {"mean": mean, "std": std}, "format": fmt})


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise DataNotFoundError(f"{path} is missing (FEMNIST needs both train.npz and test.npz in {path.parent})")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in _NPZ_KEYS if k not in z.files]
            if missing:
                raise DataIntegrityError(f"{path}: missing array(s) {missing}; expected {list(_NPZ_KEYS)}")
            d = {k: z[k] for k in _NPZ_KEYS}
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as e:
        if isinstance(e, DataIntegrityError):
            raise
        raise DataIntegrityError(f"{path}: cannot read ({type(e).__name__}: {e}); the file is corrupt or truncated") from e
    n = len(d["y"])
    if d["x"].shape != (n, 28, 28) or d["writer"].shape != (n,):
        raise DataIntegrityError(
            f"{path}: inconsistent shapes x{d['x'].shape} y{d['y'].shape} writer{d['writer'].shape}; "
            f"expected x (N, 28, 28), y (N,), writer (N,)"
        )
    if n and (d["y"].min() < 0 or d["y"].max() >= NUM_CLASSES):
        raise DataIntegrityError(f"{path}: labels outside 0..{NUM_CLASSES - 1}")
    return d


def load_npz(folder: Path) -> Dataset:
    """FEMNIST from ``folder/{train,test}.npz``."""
    tr, te = _read_npz(folder / "train.npz"), _read_npz(folder / "test.npz")
    if not np.array_equal(tr["writers"], te["writers"]):
        raise DataIntegrityError(f"{folder}: train.npz and test.npz have different writer lists")
    used, inverse = np.unique(np.concatenate([tr["writer"], te["writer"]]), return_inverse=True)
    names = [str(w) for w in tr["writers"][used]]

    def pixels(x: np.ndarray) -> np.ndarray:
        return (255.0 - x.astype(np.float32)) / 255.0

    return _dataset(pixels(tr["x"]), tr["y"].astype(np.int64), pixels(te["x"]), te["y"].astype(np.int64), inverse,
                    names, str(folder), "npz")


def _natural_key(p: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def _read_leaf_split(folder: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(writer of each sample, x float (N, 784), y int) from every ``*.json`` in ``folder``."""
    writers: list[str] = []
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    files = sorted(folder.glob("*.json"), key=_natural_key)
    if not files:
        raise DataIntegrityError(f"{folder}: no *.json files (expected LEAF's output shards)")
    for f in files:
        try:
            with open(f) as fh:
                doc = json.load(fh)
            users, data = doc["users"], doc["user_data"]
        except (ValueError, KeyError, TypeError) as e:
            raise DataIntegrityError(
                f"{f}: not a LEAF JSON shard ({type(e).__name__}: {e}); expected keys users, num_samples, user_data"
            ) from e
        for u in users:
            try:
                x = np.asarray(data[u]["x"], dtype=np.float32)
                y = np.asarray(data[u]["y"], dtype=np.int64)
            except (KeyError, TypeError, ValueError) as e:
                raise DataIntegrityError(f"{f}: user {u!r}: bad or missing x/y ({type(e).__name__}: {e})") from e
            if y.ndim != 1 or x.shape != (len(y), 784):
                raise DataIntegrityError(
                    f"{f}: user {u!r}: x has shape {x.shape}, y {y.shape}; expected ({len(y)}, 784) and ({len(y)},)"
                )
            if len(y) and (y.min() < 0 or y.max() >= NUM_CLASSES):
                raise DataIntegrityError(f"{f}: user {u!r}: labels outside 0..{NUM_CLASSES - 1}")
            writers += [u] * len(y)
            xs.append(x)
            ys.append(y)
    return writers, np.concatenate(xs).reshape(-1, 28, 28), np.concatenate(ys)


def leaf_split_dirs(leaf_dir: Path) -> tuple[Path, Path] | None:
    """``(train, test)`` JSON folders under ``leaf_dir`` or ``leaf_dir/data``, or None."""
    for base in (leaf_dir, leaf_dir / "data"):
        if (base / "train").is_dir() and (base / "test").is_dir():
            return base / "train", base / "test"
    return None


def load_leaf(leaf_dir: Path) -> Dataset:
    """FEMNIST from LEAF's JSON output folder (see the module docstring)."""
    dirs = leaf_split_dirs(leaf_dir)
    if dirs is None:
        raise not_found(
            "femnist",
            [str(leaf_dir / "train"), str(leaf_dir / "data" / "train")],
            ["run LEAF's data/femnist/preprocess.sh and pass its data/femnist/data folder as femnist_leaf_dir"],
        )
    w_tr, x_tr, y_tr = _read_leaf_split(dirs[0])
    w_te, x_te, y_te = _read_leaf_split(dirs[1])
    names, inverse = np.unique(np.array(w_tr + w_te, dtype=object).astype(str), return_inverse=True)
    return _dataset(1.0 - x_tr, y_tr, 1.0 - x_te, y_te, inverse, [str(n) for n in names], str(leaf_dir), "leaf-json")


def load_femnist(data_root: str | os.PathLike[str] | None, leaf_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """FEMNIST from an explicit LEAF folder, else the first root with ``FEMNIST/*.npz`` or ``FEMNIST/leaf/``."""
    if leaf_dir is not None:
        return load_leaf(Path(leaf_dir).expanduser())
    searched = []
    for root in search_roots(data_root):
        folder = root / "FEMNIST"
        searched.append(str(folder / "{train,test}.npz"))
        if (folder / "train.npz").is_file() or (folder / "test.npz").is_file():
            return load_npz(folder)  # one of the two missing → a clear error from _read_npz
        searched.append(str(folder / "leaf" / "{train,test}" / "*.json"))
        if leaf_split_dirs(folder / "leaf") is not None:
            return load_leaf(folder / "leaf")
    raise not_found(
        "femnist",
        searched,
        [
            "copy train.npz and test.npz (the shared data folder's FEMNIST/) into DATA_ROOT/FEMNIST/",
            "or run LEAF's data/femnist/preprocess.sh and copy (or point femnist_leaf_dir at) its "
            "data/femnist/data folder with train/ and test/ JSON shards (DATA_ROOT/FEMNIST/leaf/)",
        ],
    )
