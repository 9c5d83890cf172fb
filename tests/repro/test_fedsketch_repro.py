"""Paper 002 (FedSKETCH), CI-sized: every method of Figures 1 and 2 on ``experiment=fedsketch_ci``, tracked in a
fresh MLflow store, then the results pipeline on it: ``python -m fedrun.report fedsketch --export`` (MLflow →
export → figures.md, its figures and README's claims block) in a repository-like folder. Slow (a few minutes on
2 cores).

    .venv/bin/python -m pytest -m slow tests/repro/test_fedsketch_repro.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedrun.report import main as report
from fedrun.reports.common import README, markers
from fedrun.run import run
from fedrun.tracking import MlflowTracker

REPO = Path(__file__).resolve().parents[2]

CI_METHODS = [  # (MLflow experiment, overrides)
    ("fedsketch-homogeneous", ["scheme=fedsgd", "local_steps=1"]),
    ("fedsketch-homogeneous", ["scheme=sketchedsgd", "local_steps=1", "scheme.rows=20", "scheme.cols=40"]),
    ("fedsketch-homogeneous", ["scheme=fedsketch", "scheme.unsketch=privix", "scheme.rows=20", "scheme.cols=40",
                               "local_steps=2"]),
    ("fedsketch-homogeneous", ["scheme=fedsketch", "scheme.unsketch=heaprix", "scheme.rows=50", "scheme.cols=100",
                               "local_steps=2"]),
    ("fedsketch-heterogeneous", ["scheme=fedsgd", "local_steps=1", "partition=shards",
                                 "partition.distinct_classes=false"]),
    ("fedsketch-heterogeneous", ["scheme=fedsketchgate", "sampler=all", "scheme.unsketch=heaprix", "scheme.rows=20",
                                 "scheme.cols=40", "local_steps=1", "partition=shards",
                                 "partition.distinct_classes=false"]),
]


@pytest.mark.slow
def test_ci_sized_figures_and_tables(shared_data, tmp_path):
    from conftest import compose

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for i, (experiment, overrides) in enumerate(CI_METHODS):
        cfg = compose(["experiment=fedsketch_ci", f"data_root={shared_data}", "progress=off", *overrides])
        summary = run(cfg, tracker=MlflowTracker(uri, experiment), out_dir=tmp_path / f"run{i}")
        assert summary["rounds_completed"] == 3
    root = tmp_path / "repo"   # the report's text, and a README with its claims block
    (root / "results" / "fedsketch").mkdir(parents=True)
    shutil.copy(REPO / "results" / "fedsketch" / "figures.template.md",
                root / "results" / "fedsketch" / "figures.template.md")
    start, end = markers("fedsketch")
    (root / README).parent.mkdir(parents=True, exist_ok=True)   # the claims file (docs/results.md, with its folder)
    (root / README).write_text(f"# A README\n{start}\n{end}\n")
    # the runs come from this checkout, which may have uncommitted changes
    assert report(["fedsketch", "--root", str(root), "--export", "--uri", uri, "--allow-dirty"]) == 0
    out = root / "results" / "fedsketch"
    assert (out / "runs" / "fedsketch-homogeneous.runs.csv.gz").exists()
    text = (out / "figures.md").read_text()
    for name in ("FedSGD", "SketchedSGD", "PRIVIX", "HEAPRIX", "FSGATE", "(20, 40)", "(50, 100)", "compression",
                 "The paper's claims"):
        assert name in text, name
    assert (out / "figure1_homogeneous.svg").read_bytes().startswith(b"<?xml")
    assert report(["fedsketch", "--root", str(root), "--check"]) == 0


@pytest.mark.slow
def test_heaprix_50x100_learns_like_uncompressed_fedavg_on_a_small_federation(shared_data, tmp_path):
    """12× compression with little loss, CI-sized: 10 workers (5 per round), τ = 5, 30 rounds, same η and γ;
    the uncompressed reference is FedAvg with the same τ (FedSKETCH with an exact decoder)."""
    from conftest import compose

    acc = {}
    for name, overrides in (("fedavg", ["scheme=fl_std"]),
                            ("heaprix", ["scheme=fedsketch", "scheme.unsketch=heaprix", "scheme.rows=50",
                                         "scheme.cols=100"])):
        cfg = compose(["experiment=fedsketch_ci", f"data_root={shared_data}", "progress=off", "tracking=none",
                       "rounds=30", "eval_every=30", "local_steps=5", "lr=0.1", *overrides])
        acc[name] = run(cfg, out_dir=tmp_path / name)["best_test_accuracy"]
    assert acc["fedavg"] > 0.6, acc
    assert acc["heaprix"] > acc["fedavg"] - 0.1, acc
