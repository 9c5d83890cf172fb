"""MNIST and Fashion-MNIST: find the IDX files, check them, and read them (:func:`read_idx`).

The files are read uncompressed, from torchvision's layout ``ROOT/<MNIST|FashionMNIST>/raw/*-ubyte``. Copies
often come as ``.gz`` (recompressed, so torchvision's own md5s do not match and it would try to download) and
may sit in read-only folders. So: each candidate folder is checked for the four files, plain or ``.gz``; a
folder already in torchvision's layout with plain files is used in place, anything else is unpacked once into
``cache_dir()/<MNIST|FashionMNIST>/raw/`` (a stamp file records the source files' sizes and mtimes so later
loads skip the work). Every unpacked file is checked against the known size and md5 of its decompressed
content; a corrupt or truncated file raises :class:`DataIntegrityError` naming it. torchvision is imported only
to download (importing it costs about a second: it loads torch._dynamo).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from fedrun.data.dataset import (
    DEBIAN_FASHION_MNIST_DIR,
    DataIntegrityError,
    Dataset,
    cache_dir,
    not_found,
    search_roots,
)

SPLIT_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_SIZES = {
    "train-images-idx3-ubyte": 16 + 60000 * 28 * 28,
    "train-labels-idx1-ubyte": 8 + 60000,
    "t10k-images-idx3-ubyte": 16 + 10000 * 28 * 28,
    "t10k-labels-idx1-ubyte": 8 + 10000,
}

#: md5 of the *decompressed* files that are accepted. MNIST train images: the published original and the
#: reconstruction in the shared data folder (see shared/data/README.md, max error 1 gray level).
MD5 = {
    "mnist": {
        "train-images-idx3-ubyte": {"6bbc9ace898e44ae57da46a324031adb", "b12f3fe30c63e0620bfad1b1fd6ed221"},
        "train-labels-idx1-ubyte": {"a25bea736e30d166cdddb491f175f624"},
        "t10k-images-idx3-ubyte": {"2646ac647ad5339dbf082846283269ea"},
        "t10k-labels-idx1-ubyte": {"27ae3e4e09519cfbb04c329615203637"},
    },
    "fashion_mnist": {
        "train-images-idx3-ubyte": {"f4a8712d7a061bf5bd6d2ca38dc4d50a"},
        "train-labels-idx1-ubyte": {"9018921c3c673c538a1fc5bad174d6f9"},
        "t10k-images-idx3-ubyte": {"8181f5470baa50b63fa0f6fddb340f0a"},
        "t10k-labels-idx1-ubyte": {"15d484375f8d13e6eb1aabb0c3f46965"},
    },
}

#: (mean, std) of the training pixels in [0, 1]; x = (pixel/255 - mean) / std.
NORMALIZATION = {"mnist": (0.1307, 0.3081), "fashion_mnist": (0.2860, 0.3530)}

_FOLDER = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}  # torchvision's folder and class name
_STAMP = ".fedrun-source.json"
_CHUNK = 1 << 20


def candidate_dirs(name: str, roots: list[Path]) -> list[Path]:
    """Folders that may hold the four files, in search order."""
    folder = _FOLDER[name]
    dirs: list[Path] = []
    for r in roots:
        dirs += [r / folder / "raw", r / folder]
        if name == "fashion_mnist":
            dirs.append(r / "fashion-mnist")
    if name == "fashion_mnist":
        dirs.append(DEBIAN_FASHION_MNIST_DIR)
    return dirs


def _find_files(d: Path) -> dict[str, Path] | None:
    """The four files in ``d`` (plain preferred over ``.gz``), or None if any is missing."""
    found = {}
    for f in SPLIT_FILES:
        for p in (d / f, d / f"{f}.gz"):
            if p.is_file():
                found[f] = p
                break
        else:
            return None
    return found


def _check(name: str, fname: str, path: Path, size: int, md5: str) -> None:
    expected = _SIZES[fname]
    if size != expected:
        kind = "truncated" if size < expected else "too long"
        raise DataIntegrityError(
            f"{path}: {kind}: {size} bytes of IDX data, expected {expected} "
            f"(the IDX file of {name} {fname}); replace the file with a good copy"
        )
    if md5 not in MD5[name][fname]:
        raise DataIntegrityError(
            f"{path}: checksum mismatch: md5 of the decompressed content is {md5}, expected one of "
            f"{sorted(MD5[name][fname])}; the file is corrupt or not {name}. Replace it, or pass verify=False"
        )


def _verify_plain(name: str, files: dict[str, Path]) -> None:
    for f, p in files.items():
        h = hashlib.md5()
        with open(p, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
        _check(name, f, p, p.stat().st_size, h.hexdigest())


def _unpack(name: str, fname: str, src: Path, dst: Path, verify: bool) -> None:
    """Copy or gunzip ``src`` to ``dst`` atomically, checking size and md5 on the way."""
    tmp = dst.with_name(f"{dst.name}.tmp{os.getpid()}")
    h, size = hashlib.md5(), 0
    try:
        opener: Callable = gzip.open if src.suffix == ".gz" else open
        with opener(src, "rb") as fin, open(tmp, "wb") as fout:
            while chunk := fin.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
                fout.write(chunk)
        if verify:
            _check(name, fname, src, size, h.hexdigest())
        os.replace(tmp, dst)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataIntegrityError(
            f"{src}: cannot read/decompress ({type(e).__name__}: {e}); the file is corrupt or truncated. "
            f"Replace it with a good copy"
        ) from e
    finally:
        tmp.unlink(missing_ok=True)


def _stamp(files: dict[str, Path], raw: Path) -> dict[str, list]:
    """Source path, size, mtime of each file, and the size of its unpacked copy in ``raw``."""
    stamp = {f: [str(p.absolute()), p.stat().st_size, p.stat().st_mtime_ns] for f, p in files.items()}
    for f, entry in stamp.items():
        entry.append((raw / f).stat().st_size if (raw / f).is_file() else -1)
    return stamp


def _materialise(name: str, files: dict[str, Path], verify: bool) -> Path:
    """Unpack ``files`` into the cache in torchvision's layout; return that root."""
    root = cache_dir()
    raw = root / _FOLDER[name] / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    stamp_path = raw / _STAMP
    try:
        old = json.loads(stamp_path.read_text())
        if old["files"] == _stamp(files, raw) and (old["verified"] or not verify):
            return root
    except (OSError, ValueError, KeyError, TypeError):
        pass
    stamp_path.unlink(missing_ok=True)
    for f, src in files.items():
        _unpack(name, f, src, raw / f, verify)
    stamp_path.write_text(json.dumps({"files": _stamp(files, raw), "verified": verify}))
    return root


def _tv_root(name: str, d: Path, files: dict[str, Path], verify: bool) -> Path:
    """The root in torchvision's layout: ``d``'s grandparent if ``d`` is ``ROOT/<Folder>/raw`` with plain files."""
    in_layout = d.name == "raw" and d.parent.name == _FOLDER[name]
    if in_layout and all(p.suffix != ".gz" for p in files.values()):
        if verify:
            _verify_plain(name, files)
        return d.parent.parent
    return _materialise(name, files, verify)


def read_idx(path: Path, ndim: int) -> torch.Tensor:
    """An IDX file of unsigned bytes with ``ndim`` dimensions as a uint8 tensor (the format: 2 zero bytes, the type
    code 0x08, the number of dimensions, each dimension as a big-endian int32, then the bytes)."""
    with open(path, "rb") as f:
        head = f.read(4)
        shape = struct.unpack(f">{ndim}i", f.read(4 * ndim)) if head == bytes([0, 0, 8, ndim]) else None
        data = np.fromfile(f, dtype=np.uint8)
    if shape is None or data.size != np.prod(shape):
        raise DataIntegrityError(f"{path}: not an IDX file of {ndim}-dimensional unsigned bytes (header "
                                 f"{head.hex()}, {data.size} data bytes); replace the file with a good copy")
    return torch.from_numpy(data).view(shape)


def _origin(d: Path) -> str:
    """``d``, or for a folder this module unpacked into, the folder its files were unpacked from."""
    try:
        files = json.loads((d / _STAMP).read_text())["files"]
        return str(Path(next(iter(files.values()))[0]).parent)
    except (OSError, ValueError, KeyError, TypeError, StopIteration, IndexError):
        return str(d)


def _download(name: str) -> tuple[Path | None, str]:
    """Let torchvision download into the cache; returns (root, '') or (None, reason)."""
    from torchvision import datasets

    cls = getattr(datasets, _FOLDER[name])
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        for train in (True, False):
            cls(str(root), train=train, download=True)
    except Exception as e:  # offline: URLError / RuntimeError from torchvision
        return None, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return root, ""


def load_idx_dataset(
    name: str, data_root: str | os.PathLike[str] | None, download: bool | None, verify: bool = True
) -> Dataset:
    """Load ``name`` in {'mnist', 'fashion_mnist'} (see the module docstring for where it looks)."""
    folder = _FOLDER[name]
    dirs = candidate_dirs(name, search_roots(data_root))
    root: Path | None = None
    source = ""
    for d in dirs:
        files = _find_files(d)
        if files is None:
            continue
        try:
            root = _tv_root(name, d, files, verify)
        except DataIntegrityError:
            if not download:
                raise
            continue  # download=True: a corrupt local copy falls back to a fresh download
        source = _origin(d)
        break
    if root is None:
        reason = "not attempted (download=False)"
        if download is not False:
            root, reason = _download(name)
            source = str(cache_dir() / folder / "raw") if root is not None else ""
            if root is not None and verify:
                _verify_plain(name, {f: root / folder / "raw" / f for f in SPLIT_FILES})
        if root is None:
            how = [
                f"copy the four IDX files ({', '.join(SPLIT_FILES)}, plain or .gz) into DATA_ROOT/{folder}/raw/",
            ]
            if name == "fashion_mnist":
                how.append("apt-get install dataset-fashion-mnist (installs them into /usr/share/datasets/fashion-mnist)")
            how.append("or run online with download=None/True so torchvision downloads them into the cache")
            raise not_found(name, [str(d) for d in dirs], how, extra=f"Download: {reason}")
    mean, std = NORMALIZATION[name]
    raw = root / folder / "raw"

    def norm(data: torch.Tensor) -> torch.Tensor:
        return data.to(torch.float32).div_(255.0).sub_(mean).div_(std).unsqueeze(1)

    return Dataset(
        name=name,
        x_train=norm(read_idx(raw / "train-images-idx3-ubyte", 3)),
        y_train=read_idx(raw / "train-labels-idx1-ubyte", 1).to(torch.int64),
        x_test=norm(read_idx(raw / "t10k-images-idx3-ubyte", 3)),
        y_test=read_idx(raw / "t10k-labels-idx1-ubyte", 1).to(torch.int64),
        task="classification",
        num_classes=10,
        source=source,
        info={"normalization": {"mean": mean, "std": std}, "torchvision_root": str(root)},
    )
