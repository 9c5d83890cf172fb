"""Lending Club loans as a linear-regression task: predict ``int_rate`` (percent) from 10 features.

File: ``ROOT/lending-club/lending_club.csv`` (the shared copy: tidymodels/modeldata's 2016Q1 subset,
9,857 rows) or any CSV with the Lending Club column names, e.g. a full public export (``.csv`` or
``.csv.gz``; extra columns are ignored, a notice line above the header is skipped, values like ``"13.56%"``
and ``" 36 months"`` are understood, rows with a missing/empty value in a used column are dropped and
counted in ``info["dropped_rows"]``).

Features (10, so that a linear model with a bias has exactly 11 parameters). Chosen by greedy forward
selection of OLS with 5-fold cross-validation *inside the training split* over all numeric columns plus
``term`` and ``verification_status`` as 0/1; the ten below reach CV R^2 ~ 0.43 (all 18 candidates: ~ 0.43):

    term_60           1 if term is 60 months, else 0 (36)        corr. with int_rate +0.40
    verified          1 if verification_status is Verified or Source_Verified, else 0        +0.25
    all_util          balance / credit limit on all trades (%)                               +0.29
    inq_last_6mths    credit inquiries in the last 6 months                                  +0.23
    log1p_annual_inc  log(1 + annual income)                                                 -0.16
    open_il_12m       installment accounts opened in the last 12 months                      +0.23
    inq_last_12m      credit inquiries in the last 12 months                                 +0.24
    revol_util        revolving line utilisation (%)                                         +0.22
    funded_amnt       loan amount                                                            +0.11
    num_il_tl         number of installment accounts                                         +0.04

Left out on purpose: ``sub_grade`` (int_rate is almost a function of it, corr. 0.997), ``Class`` (the
loan's outcome, known only later), ``addr_state`` (the natural client split instead, see groups).

Split: a fixed 80/20 split, ``numpy.random.default_rng(SPLIT_SEED).permutation(n)``, first
``round(0.8 n)`` rows train (each split kept in file order); the seed is independent of the experiment seed.
Features are standardised with the mean/std of the *training* split (stored in ``info``); constant → std 1.
Target: ``int_rate`` kept in percent, unstandardised (mean ~12.5, std ~4.9), so losses and gradients are
on the raw scale, as clipping thresholds such as zeta = 150 suggest.
Groups: index of ``addr_state`` in the sorted list of states present (``group_names``).
"""

from __future__ import annotations

import csv
import gzip
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from fedrun.data.dataset import DataIntegrityError, Dataset, not_found, search_roots

SPLIT_SEED = 0
TRAIN_FRACTION = 0.8
TARGET = "int_rate"
GROUP_COLUMN = "addr_state"
RELATIVE_PATH = Path("lending-club") / "lending_club.csv"


def _number(v: str) -> float | None:
    v = v.strip().rstrip("%").strip()
    if v == "" or v.lower() in ("na", "nan", "null", "none"):
        return None
    return float(v)


def _term_60(v: str) -> float | None:
    m = re.search(r"\d+", v)
    if m is None:
        return None
    months = int(m.group())
    if months not in (36, 60):
        raise ValueError(f"term {v!r}: expected 36 or 60 months")
    return float(months == 60)


def _verified(v: str) -> float | None:
    key = re.sub(r"[\s\-]+", "_", v.strip().lower())
    if key == "":
        return None
    table = {"not_verified": 0.0, "verified": 1.0, "source_verified": 1.0}
    if key not in table:
        raise ValueError(f"verification_status {v!r}: expected one of Not Verified, Verified, Source Verified")
    return table[key]


def _log1p(v: str) -> float | None:
    x = _number(v)
    return None if x is None else float(np.log1p(max(x, 0.0)))


#: feature name → (source column, parser). Order = column order of x.
FEATURES: dict[str, tuple[str, Callable[[str], float | None]]] = {
    "term_60": ("term", _term_60),
    "verified": ("verification_status", _verified),
    "all_util": ("all_util", _number),
    "inq_last_6mths": ("inq_last_6mths", _number),
    "log1p_annual_inc": ("annual_inc", _log1p),
    "open_il_12m": ("open_il_12m", _number),
    "inq_last_12m": ("inq_last_12m", _number),
    "revol_util": ("revol_util", _number),
    "funded_amnt": ("funded_amnt", _number),
    "num_il_tl": ("num_il_tl", _number),
}
REQUIRED_COLUMNS = [c for c, _ in FEATURES.values()] + [TARGET, GROUP_COLUMN]


def _rows(path: Path) -> Iterator[list[str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="", encoding="utf-8", errors="replace") as fh:  # type: ignore[operator]
        yield from csv.reader(fh)


def read_csv(path: Path) -> tuple[np.ndarray, np.ndarray, list[str], int]:
    """(features (n, 10) float64 before standardisation, int_rate (n,), state per row, rows dropped)."""
    rows = _rows(path)
    header: list[str] | None = None
    first: list[str] = []
    i = 0
    for i, row in zip(range(5), rows):  # full exports start with a notice line above the header
        first = first or row
        if TARGET in [c.strip() for c in row]:
            header = [c.strip() for c in row]
            break
    header = header or [c.strip() for c in first]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise DataIntegrityError(
            f"{path}: missing column(s) {missing}; the Lending Club loader needs {REQUIRED_COLUMNS}"
        )
    pos = {c: header.index(c) for c in REQUIRED_COLUMNS}
    feats: list[list[float]] = []
    target: list[float] = []
    states: list[str] = []
    dropped = 0
    width = max(pos.values()) + 1
    for line, row in enumerate(rows, start=i + 2):
        if len(row) < width:
            dropped += 1
            continue
        try:
            vals = [parse(row[pos[col]]) for col, parse in FEATURES.values()]
            y = _number(row[pos[TARGET]])
        except ValueError as e:
            raise DataIntegrityError(f"{path}: row {line}: {e}") from e
        state = row[pos[GROUP_COLUMN]].strip().upper()
        if y is None or state == "" or any(v is None for v in vals):
            dropped += 1
            continue
        feats.append(vals)  # type: ignore[arg-type]
        target.append(y)
        states.append(state)
    if not target:
        raise DataIntegrityError(f"{path}: no usable rows ({dropped} dropped for missing values)")
    return np.asarray(feats, dtype=np.float64), np.asarray(target, dtype=np.float64), states, dropped


def split_indices(n: int, seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """The fixed train/test split: sorted index arrays of sizes round(0.8 n) and the rest."""
    perm = np.random.default_rng(seed).permutation(n)
    n_train = int(round(TRAIN_FRACTION * n))
    return np.sort(perm[:n_train]), np.sort(perm[n_train:])


def load_csv(path: Path) -> Dataset:
    """Lending Club regression dataset from one CSV file (see the module docstring)."""
    x, y, states, dropped = read_csv(path)
    tr, te = split_indices(len(y))
    mean = x[tr].mean(axis=0)
    std = x[tr].std(axis=0)
    std[std == 0] = 1.0
    z = (x - mean) / std
    names, groups = np.unique(np.asarray(states), return_inverse=True)

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

    return Dataset(
        name="lending_club",
        x_train=t(z[tr]),
        y_train=t(y[tr]),
        x_test=t(z[te]),
        y_test=t(y[te]),
        task="regression",
        num_classes=None,
        source=str(path),
        groups_train=groups[tr].astype(np.int64),
        groups_test=groups[te].astype(np.int64),
        group_names=[str(s) for s in names],
        feature_names=list(FEATURES),
        info={
            "target": "int_rate (percent, unstandardised)",
            "feature_mean": mean.tolist(),
            "feature_std": std.tolist(),
            "split_seed": SPLIT_SEED,
            "train_fraction": TRAIN_FRACTION,
            "dropped_rows": dropped,
        },
    )


def load_lending_club(
    data_root: str | os.PathLike[str] | None, csv_path: str | os.PathLike[str] | None = None
) -> Dataset:
    """From ``csv_path`` if given, else the first root holding ``lending-club/lending_club.csv``."""
    if csv_path is not None:
        p = Path(csv_path).expanduser()
        if not p.is_file():
            raise not_found("lending_club", [str(p)], ["check the lending_club_csv path"])
        return load_csv(p)
    searched = []
    for root in search_roots(data_root):
        p = root / RELATIVE_PATH
        searched.append(str(p))
        if p.is_file():
            return load_csv(p)
    raise not_found(
        "lending_club",
        searched,
        [
            f"copy lending_club.csv (the shared data folder's lending-club/, or a Lending Club export with the "
            f"columns {REQUIRED_COLUMNS}) to DATA_ROOT/{RELATIVE_PATH.as_posix()}",
            "or pass lending_club_csv=<path to the CSV>",
        ],
    )
