"""Shared pytest fixtures.

Tests that need real data read it from the data root given by ``FEDRUN_DATA`` (CI points it at
``../shared/data``); without it they look at ``../shared/data`` beside the checkout, and are skipped
with a message when neither holds the files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _shared_data() -> Path | None:
    env = os.environ.get("FEDRUN_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "data")
    for c in candidates:
        if c.is_dir():
            return c
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Read-only folder with the real datasets (MNIST/, FashionMNIST/, FEMNIST/, lending-club/)."""
    root = _shared_data()
    if root is None:
        pytest.skip("no data root: set FEDRUN_DATA to the folder with MNIST/, FashionMNIST/, FEMNIST/, lending-club/")
    return root


@pytest.fixture(autouse=True)
def _few_threads():
    # Keep tests predictable on the 2-core CI machine.
    torch.set_num_threads(2)
    yield
