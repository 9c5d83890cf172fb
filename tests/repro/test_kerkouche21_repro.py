"""Paper 000, Table III CI-sized: the sweep command itself (``fedrun -m experiment=kerkouche21_ci``: 24 jobs of
the Hydra sweep, 20 distinct runs) into a fresh MLflow store; a second run of the command skips every finished
job; the export of the runs loads back without MLflow. Slow (a few minutes on the loaded 2-core machine).

    .venv/bin/python -m pytest -m slow tests/repro/test_kerkouche21_repro.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_ci_sized_table3_sweep_skips_finished_runs_and_exports(shared_data, tmp_path):
    from fedrun.export import export, load
    from fedrun.export import mlflow_records

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "FEDRUN_DATA": str(shared_data)}
    cmd = [str(Path(sys.executable).parent / "fedrun"), "-m", "experiment=kerkouche21_ci", f"tracking.uri={uri}",
           "progress=off", f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    subprocess.run(cmd, cwd=tmp_path, env=env, check=True, capture_output=True, text=True, timeout=3000)
    records = [r for r in mlflow_records(uri, "kerkouche21-ci") if r["status"] == "FINISHED"]
    assert len(records) == 20
    assert len({r["tags.fedrun.config_hash"] for r in records}) == 20
    cs = next(r for r in records if r["tags.scheme"] == "fl_cs" and r["params.r"] == "0.05" and r["tags.dp"] == "client")
    assert cs["tags.compression.m"] == str(5716) and float(cs["metrics.epsilon_final"]) <= 1.0
    # the same command again finds every job finished and starts nothing
    subprocess.run(cmd, cwd=tmp_path, env=env, check=True, capture_output=True, text=True, timeout=3000)
    assert len(mlflow_records(uri, "kerkouche21-ci")) == 20
    export(uri, ["kerkouche21-ci"], tmp_path / "runs", allow_dirty=True)   # made from this checkout, maybe dirty
    loaded = load(tmp_path / "runs" / "kerkouche21-ci")
    assert len(loaded) == 20 and all(r["series"] for r in loaded)
