"""Shared pytest fixtures.

Tests that need real data read it from the data root given by ``FEDRUN_DATA`` (CI points it at
``../shared/data``); without it they look at ``../shared/data`` beside the checkout, and are skipped
with a message when neither holds the files.
"""

from __future__ import annotations

import importlib.util
import os
import sys
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


CONF_DIR = str(REPO / "conf")

# Small settings for integration runs on the 2-core CI machine.
FAST = ["~experiment", "scheme=fl_std", "dp=false", "r=1.0", "eval_every=1", "lr=0.05", "local_mode=sgd", "sampler=poisson", "rounds=2", "num_clients=10", "sample_rate=0.5", "local_steps=2",
        "batch_size=10", "clients_per_round=10", "clipping_norm=1.0", "tracking=none",
        "progress=off"]


def compose(overrides: list[str]):
    """The resolved fedrun config for ``overrides`` (Hydra compose API, as the CLI would build it)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


@pytest.fixture
def fast_cfg(shared_data):
    """compose() with the fast settings and the shared data root."""

    def make(*overrides: str):
        return compose(FAST + [f"data_root={shared_data}", *overrides])

    return make


@pytest.fixture
def load_script(monkeypatch):
    """``load_script("name")``: ``scripts/name.py`` imported as a module (the scripts are CLIs, not a package);
    registered in ``sys.modules`` for the test, which dataclasses in a script need."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, mod)
        spec.loader.exec_module(mod)
        return mod

    return load
