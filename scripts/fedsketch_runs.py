#!/usr/bin/env python
"""Paper 002 (FedSKETCH): what ``scripts/fedsketch_report.py`` still needs to read the runs.

The job queue that used to live here is retired: the figures are Hydra sweeps declared in their experiment
files (results/fedsketch/README.md, "Commands"):

    nice -n 5 .venv/bin/fedrun -m experiment=fedsketch_homogeneous      # Figure 1
    nice -n 5 .venv/bin/fedrun -m experiment=fedsketch_heterogeneous    # Figure 2
    nice -n 5 .venv/bin/fedrun -m experiment=fedsketch_tune "+fedsketch_run=[fs_privix,sketch20x40]" lr=0.01,0.03,0.1,0.3,1.0

Only the tuning grid and the method labels of the MLflow records remain, until the generic report replaces
``scripts/fedsketch_report.py``.
"""

from __future__ import annotations

LR_GRID = (0.01, 0.03, 0.1, 0.3, 1.0)  # the η grid of the tuning table (results/fedsketch/fedsketch.md)


def method_of(record: dict) -> str:
    """The method label of an MLflow record (params of the resolved config), e.g. ``fs-heaprix 20x40``."""
    name = record.get("params.scheme.name", "")
    if name == "fedsgd":
        return "fedsgd"
    size = f"{record.get('params.scheme.rows')}x{record.get('params.scheme.cols')}"
    if name == "sketchedsgd":
        return f"sketchedsgd {size}"
    family = {"fedsketch": "fs", "fedsketchgate": "gate"}.get(name, name)
    return f"{family}-{record.get('params.scheme.unsketch')} {size}"
