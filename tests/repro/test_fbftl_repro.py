"""Paper 003 (FbFTL), reduced: the MNIST → Fashion-MNIST experiment of results/fbftl/ with 30 rounds instead
of 100, all four schemes tracked in a fresh MLflow store, exported, and the report (fedrun.reports.fbftl.table)
pointed at that export and 30 rounds. Checks the paper's claims that hold on our data (see results/fbftl/README.md).
Slow: about 5 minutes on the 2-core machine (source model trained from scratch into a temporary cache).

    .venv/bin/python -m pytest -m slow tests/repro/test_fbftl_repro.py
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from fedrun.export import export
from fedrun.export import mlflow_records
from fedrun.reports import fbftl
from fedrun.reports.common import README, Export, markers
from fedrun.run import run
from fedrun.tracking import MlflowTracker

REPO = Path(__file__).resolve().parents[2]
SCHEMES = ("fl", "ftl_full", "ftl_c", "fbftl")
ROUNDS = 30


@pytest.mark.slow
def test_mnist_to_fashion_claims(shared_data, tmp_path, monkeypatch):
    from conftest import compose

    monkeypatch.setenv("FEDRUN_CACHE", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for scheme in SCHEMES:
        cfg = compose(["experiment=fbftl_mnist_fashion", f"scheme={scheme}", f"rounds={ROUNDS}", "progress=off",
                       f"data_root={shared_data}"])
        run(cfg, tracker=MlflowTracker(uri, "fbftl-repro"), out_dir=tmp_path / scheme)
    recs = {r["tags.scheme"]: r for r in mlflow_records(uri, "fbftl-repro") if r["status"] == "FINISHED"}
    assert set(recs) == set(SCHEMES)
    m = {s: (lambda k, s=s: recs[s][f"metrics.{k}"]) for s in SCHEMES}

    # bytes: FbFTL uploads 60,000 × (120 float32 + 1 uint8 label) once; FL and FTL-full the same rounds and
    # clients (same seed) with the whole LeNet-5; FTL-c the head only
    assert m["fbftl"]("uplink_bytes_total") == 60_000 * (120 * 4 + 1)
    assert m["fl"]("uplink_bytes_total") == m["ftl_full"]("uplink_bytes_total")
    assert m["ftl_c"]("uplink_bytes_total") * 61_706 == m["fl"]("uplink_bytes_total") * 11_014
    assert m["fbftl"]("uplink_bytes_total") < m["ftl_c"]("uplink_bytes_total") < m["fl"]("uplink_bytes_total")
    for s in ("fl", "ftl_full", "ftl_c"):  # Poisson sampling: measured ≈ the paper's I·U·C·d·ΣT
        assert abs(8 * m[s]("uplink_bytes_total") / m[s]("paper_uplink_bits") - 1) < 0.05
    # accuracy (margins from results/fbftl/table.md, 100 rounds, and this reduced run)
    assert m["fbftl"]("source_test_accuracy") > 0.97
    assert m["ftl_full"]("test_accuracy") > m["fl"]("test_accuracy")  # pre-trained f¹ helps at a fixed budget
    assert m["fbftl"]("best_test_accuracy") > m["ftl_c"]("best_test_accuracy")  # server SGD: many more steps
    assert m["fbftl"]("best_test_accuracy") > 0.72

    root = tmp_path / "repo"   # the report's text and a README with its claims block; the export of these runs
    (root / "results" / "fbftl").mkdir(parents=True)
    shutil.copy(REPO / "results" / "fbftl" / "table.template.md", root / "results" / "fbftl" / "table.template.md")
    start, end = markers("fbftl")
    (root / README).parent.mkdir(parents=True, exist_ok=True)   # the claims file (docs/results.md, with its folder)
    (root / README).write_text(f"# A README\n{start}\n{end}\n")
    # the runs come from this checkout, which may have uncommitted changes
    export(uri, ["fbftl-repro"], root / "results" / "fbftl" / "runs", every=5, allow_dirty=True)
    exports = (Export("results/fbftl/runs/fbftl-repro", "fbftl-repro", every=5),)
    files = fbftl.table(root, exports, rounds=ROUNDS)
    text = files[Path("results/fbftl/table.md")].decode()
    assert "### target Fashion-MNIST" in text and text.count("| MNIST | F") == 4 * 3   # 4 schemes × 3 tables
    assert fbftl.table(root, exports, rounds=ROUNDS) == files   # the same export gives the same files
    assert os.environ["FEDRUN_CACHE"] == str(tmp_path / "cache")
