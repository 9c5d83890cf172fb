"""The in-memory dataset type, the data errors, and where datasets are looked for.

Data root search order (first hit wins, each dataset looked up separately):

1. ``data_root`` passed to :func:`fedrun.data.sources.load_dataset` (the ``dataset.data_root`` config key);
2. the environment variable ``FEDRUN_DATA``;
3. the per-user cache folder :func:`cache_dir`: ``$FEDRUN_CACHE``, else ``$XDG_CACHE_HOME/fedrun``,
   else ``~/.cache/fedrun`` (also where torchvision downloads land and where ``.gz`` files are unpacked);
4. Fashion-MNIST only: the Debian package folder ``/usr/share/datasets/fashion-mnist``
   (``apt-get install dataset-fashion-mnist``).

Under each root a dataset lives in its usual folder: ``MNIST/raw/``, ``FashionMNIST/raw/``,
``FEMNIST/{train,test}.npz`` (or LEAF JSON under ``FEMNIST/leaf/``), ``lending-club/lending_club.csv``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

#: Folder the Debian package ``dataset-fashion-mnist`` installs its four ``.gz`` files into (flat layout).
DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


class DataNotFoundError(FileNotFoundError):
    """No copy of a dataset was found in any searched place (the message lists them and how to fix it)."""


class DataIntegrityError(ValueError):
    """A dataset file exists but is corrupt, truncated or malformed (the message names the file)."""


@dataclass(eq=False)
class Dataset:
    """A dataset held in memory as tensors, ready to be partitioned across clients.

    ``x_*`` are float32 and normalised (images ``[N, 1, 28, 28]``, tabular ``[N, F]``); ``y_*`` are int64
    class ids (classification) or float32 targets (regression). ``groups_*`` hold each sample's natural
    group id (FEMNIST writer, Lending Club state), an index into ``group_names``; ``None`` if there are none.
    ``info`` records how the data were prepared (normalisation constants, split seed, cache folder, ...).
    """

    name: str
    x_train: torch.Tensor = field(repr=False)
    y_train: torch.Tensor = field(repr=False)
    x_test: torch.Tensor = field(repr=False)
    y_test: torch.Tensor = field(repr=False)
    task: Literal["classification", "regression"]
    num_classes: int | None
    source: str
    groups_train: np.ndarray | None = field(default=None, repr=False)
    groups_test: np.ndarray | None = field(default=None, repr=False)
    group_names: list[str] | None = field(default=None, repr=False)
    feature_names: list[str] | None = None
    info: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.task not in ("classification", "regression"):
            raise ValueError(f"task={self.task!r}; allowed: 'classification', 'regression'")
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            g = getattr(self, f"groups_{split}")
            if len(x) != len(y) or (g is not None and len(g) != len(y)):
                raise ValueError(
                    f"{self.name} {split}: x, y, groups lengths differ "
                    f"({len(x)}, {len(y)}, {None if g is None else len(g)})"
                )

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input sample, e.g. ``(1, 28, 28)`` or ``(10,)``."""
        return tuple(self.x_train.shape[1:])

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    @property
    def num_test(self) -> int:
        return len(self.y_test)


def cache_dir() -> Path:
    """Writable per-user cache: ``$FEDRUN_CACHE``, else ``$XDG_CACHE_HOME/fedrun``, else ``~/.cache/fedrun``."""
    env = os.environ.get("FEDRUN_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "fedrun"


def search_roots(data_root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Data roots in search order: ``data_root``, ``$FEDRUN_DATA``, :func:`cache_dir` (duplicates dropped).

    A folder named explicitly (``data_root`` or ``$FEDRUN_DATA``) must exist: a typo never falls through to
    another copy of the data (:class:`DataNotFoundError`, one line).
    """
    roots: list[Path] = []
    for name, r in (("data_root", data_root), ("FEDRUN_DATA", os.environ.get("FEDRUN_DATA") or None), ("", cache_dir())):
        if r is None or str(r) == "":
            continue
        p = Path(r).expanduser()
        if name and not p.is_dir():  # a folder named explicitly
            what = "does not exist" if not p.exists() else "is not a folder"
            raise DataNotFoundError(f"{name}={r}: the data folder {what}; give an existing folder (or unset it "
                                    f"to use the cache {cache_dir()})")
        if all(p.absolute() != q.absolute() for q in roots):
            roots.append(p)
    return roots


def not_found(name: str, searched: list[str], how: list[str], extra: str = "") -> DataNotFoundError:
    """The error for a dataset missing everywhere: lists each searched place and how to provide the files."""
    lines = [f"dataset {name!r} not found. Searched:"]
    lines += [f"  - {s}" for s in searched]
    lines.append("To provide it:")
    lines += [f"  - {h}" for h in how]
    lines.append(
        "  - or point the loader at a folder that has it: load_dataset(..., data_root=...) (data_root in the "
        "dataset config) or the environment variable FEDRUN_DATA"
    )
    if extra:
        lines.append(extra)
    return DataNotFoundError("\n".join(lines))
