"""Find a dataset under the data root (or fetch it) and return it as tensors: :func:`load_dataset`.

Where data are looked for, in order (see :mod:`fedrun.data.dataset`):
``data_root`` argument → ``$FEDRUN_DATA`` → per-user cache (``$FEDRUN_CACHE``, else
``$XDG_CACHE_HOME/fedrun``, else ``~/.cache/fedrun``) → for Fashion-MNIST also the Debian package folder
``/usr/share/datasets/fashion-mnist``. The cache is the only place written to (unpacked IDX files,
torchvision downloads). Nothing found → :class:`DataNotFoundError` listing every place searched.

Per dataset: :mod:`fedrun.data.mnist` (MNIST, Fashion-MNIST), :mod:`fedrun.data.femnist`,
:mod:`fedrun.data.lending_club`.
"""

from __future__ import annotations

import os

# DataIntegrityError, DataNotFoundError, cache_dir and search_roots: re-exported beside load_dataset
from fedrun.data.dataset import DataIntegrityError, DataNotFoundError, Dataset, cache_dir, search_roots  # noqa: F401

DATASETS = ("fashion_mnist", "mnist", "femnist", "lending_club")


def load_dataset(
    name: str,
    data_root: str | os.PathLike[str] | None = None,
    download: bool | None = None,
    *,
    verify: bool = True,
    femnist_leaf_dir: str | os.PathLike[str] | None = None,
    lending_club_csv: str | os.PathLike[str] | None = None,
) -> Dataset:
    """Load dataset ``name`` ∈ :data:`DATASETS` as a :class:`Dataset`.

    download: MNIST/Fashion-MNIST only. ``None`` (default): let torchvision download into the cache only
    if no local copy is found; ``True``: the same, and a local copy that fails its checksum is also
    replaced by a download instead of raising; ``False``: never touch the network.
    verify: check sizes and md5s of the IDX files (MNIST family) when they are read or unpacked.
    femnist_leaf_dir: read FEMNIST from this LEAF JSON output folder (``train/`` and ``test/`` of ``*.json``).
    lending_club_csv: read Lending Club from this CSV file instead of searching the roots.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}")
    if download not in (None, True, False):
        raise ValueError(f"download={download!r}; allowed: None, True, False")
    if name in ("mnist", "fashion_mnist"):
        from fedrun.data.mnist import load_idx_dataset

        return load_idx_dataset(name, data_root, download, verify=verify)
    if name == "femnist":
        from fedrun.data.femnist import load_femnist

        return load_femnist(data_root, leaf_dir=femnist_leaf_dir)
    from fedrun.data.lending_club import load_lending_club

    return load_lending_club(data_root, csv_path=lending_club_csv)
