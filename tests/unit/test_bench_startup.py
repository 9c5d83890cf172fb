"""scripts/bench_startup.py: the import breakdown read from ``python -X importtime`` lines (fixed lines: no timing)."""

from __future__ import annotations

import pytest

IMPORTTIME = """\
import time: self [us] | cumulative | imported package
import time:       100 |        100 | site
import time:      1000 |       1000 |       torch._C
import time:      2000 |       3000 |     torch
import time:       300 |        300 |       hydra.core
import time:       200 |        500 |     hydra
import time:       400 |       3900 |   fedrun.data
import time:        70 |       3970 | fedrun.cli
[2026-12-02 14:00:00,000][fedrun][INFO] - round 1/50 test_accuracy=0.1 (1.00s)
"""


def test_imports_by_package(load_script):
    """Another package imported by fedrun counts with its cumulative time (what it imports is inside it), fedrun's
    modules with their own time, a top-level import with its cumulative time; other lines are ignored."""
    bench = load_script("bench_startup")
    got = bench.imports_by_package(IMPORTTIME)
    assert got == pytest.approx({"site": 100e-6, "torch": 3000e-6, "hydra": 500e-6, "fedrun": 470e-6})
