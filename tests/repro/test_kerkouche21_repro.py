"""Paper 000, Table III CI-sized: the sweep command itself (``scripts/kerkouche21_table3.py run --ci``: 20 fedrun
processes on ``experiment=kerkouche21_ci``) into a fresh MLflow store, then ``table --ci`` from it. Slow (each
run is a fedrun process: ~15–60 s on the loaded 2-core machine).

    .venv/bin/python -m pytest -m slow tests/repro/test_kerkouche21_repro.py
"""

from __future__ import annotations


import pytest


@pytest.mark.slow
def test_ci_sized_table3_sweep_and_table(shared_data, tmp_path, monkeypatch, load_script):
    from mlflow.tracking import MlflowClient

    from fedrun.report import mlflow_records

    monkeypatch.setenv("FEDRUN_DATA", str(shared_data))
    monkeypatch.chdir(tmp_path)  # MLflow's artifact folder (./mlruns) goes here
    script = load_script("kerkouche21_table3")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert script.main(["run", "--ci", "--jobs", "2", "--tracking-uri", uri, "--outputs", str(tmp_path / "out")]) == 0
    records = [r for r in mlflow_records(uri, "kerkouche21-ci") if r["status"] == "FINISHED"]
    assert len(records) == 20
    client = MlflowClient(tracking_uri=uri)
    cs = next(r for r in records if r["tags.mlflow.runName"] == "fl_cs-r0.05-dp")
    for key in ("test_accuracy", "uplink_bytes", "cost_bits", "epsilon", "decoder/residual_ratio"):
        assert client.get_metric_history(cs["run_id"], key), key
    assert cs["tags.compression.m"] == str(5716) and float(cs["metrics.epsilon_final"]) <= 1.0
    # a second `run` finds everything finished and starts nothing
    assert script.main(["run", "--ci", "--tracking-uri", uri, "--outputs", str(tmp_path / "out")]) == 0
    assert len(mlflow_records(uri, "kerkouche21-ci")) == 20
    out = tmp_path / "table3.md"
    assert script.main(["table", "--ci", "--tracking-uri", uri, "--out", str(out)]) == 0
    text = out.read_text()
    for name in ("| FL-STD |", "| FL-CS-DP | 0.05 |", "(0.78)", "(0.61)", "The paper's claims", "bandwidth saving"):
        assert name in text, name
    assert (tmp_path / "table3_accuracy.png").stat().st_size > 10_000
