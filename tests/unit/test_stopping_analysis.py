"""FL-STD-DP read the paper's way (fedrun.reports.kerkouche21.stopping): which runs it reads, and the claims of its
two explanations (early stopping; the model's size) decided by the claim test."""

import shutil
from pathlib import Path

import pandas as pd

from fedrun.reports import kerkouche21 as k

REPO = Path(__file__).resolve().parents[2]


def _rec(seed, opts, acc, scheme="fl_std", dp="client", model=None):
    series = {"test_accuracy": [(10, acc[0]), (20, acc[1]), (30, acc[2]), (200, acc[3])]}
    r = {"run_id": f"{scheme}{dp}{opts}{model}{seed}", "status": "FINISHED", "start_time": seed, "end_time": None,
         "tags.scheme": scheme, "tags.dp": dp, "params.server_opts": opts, "params.seed": str(seed), "series": series,
         "metrics.best_test_accuracy": max(acc), "metrics.best_round": 200.0}
    if model:
        r["params.model.name"] = model
    return r


def _stopping(tmp_path, records) -> str:
    out = tmp_path / "results" / "kerkouche21"
    out.mkdir(parents=True, exist_ok=True)
    for f in ("fl_std_dp_stopping.template.md", "claims.csv", "paper_numbers.csv"):
        shutil.copy(REPO / "results" / "kerkouche21" / f, out)
    files = k.stopping(tmp_path, pd.DataFrame(records, dtype=object))
    assert list(files) == [Path("results/kerkouche21/fl_std_dp_stopping.md"),   # no README block
                           Path("results/kerkouche21/fl_std_dp_stopping.verdicts.csv")]
    return files[Path("results/kerkouche21/fl_std_dp_stopping.md")].decode()


def test_reads_fl_std_dp_as_published(tmp_path):
    text = _stopping(tmp_path, [
        _rec(0, "off", (0.45, 0.58, 0.61, 0.78)), _rec(1, "off", (0.46, 0.59, 0.62, 0.77)),
        _rec(0, "on", (0.47, 0.45, 0.29, 0.1)),                       # server momentum: not FL-STD as published
        _rec(0, "off", (0.4, 0.5, 0.6, 0.7), scheme="fl_cs"), _rec(0, "off", (0.5, 0.6, 0.7, 0.8), dp="off")])
    assert "| fashion_cnn | 0 | 0.580 | 0.610 | 0.610 | 0.780 | 200 |" in text and "| fashion_cnn | 1 |" in text
    assert "0.290" not in text and "Runs: 5 in the exports" in text and "2 in the tables" in text


def test_the_claims_of_the_two_explanations(tmp_path):
    small = [_rec(s, "off", (0.45, 0.58, 0.61 + d, b)) for s, d, b in ((0, 0.001, 0.78), (1, -0.002, 0.79),
                                                                         (2, 0.0, 0.80), (3, 0.001, 0.79))]
    large = [_rec(s, "off", (0.3, 0.4, 0.5, b), model="fashion_cnn_1m") for s, b in ((0, 0.62), (1, 0.60), (2, 0.61))]
    text = _stopping(tmp_path, small + large)
    lines = [x for x in text.splitlines() if x.startswith("- ")]
    verdicts = [x.split("**")[1] for x in lines]
    # near round 25 where the paper is (0.61 ± 0.02: met); the paper's "can not achieve more than 61 %" against
    # fedrun's best over 200 rounds (0.79: not met, a verdict against the paper); the large model at 0.61 ± 0.02
    # on 3 seeds (df 2, p × 2 looks: inconclusive); the large model with the small one (not met)
    assert verdicts == ["met", "not met", "inconclusive", "not met"], verdicts
    assert "(the secondary family of 4)" in lines[0] and "model = fashion_cnn_1m 0.610 ± 0.010 (n=3)" in lines[2]
    assert "cannot achieve more than 61 %" in lines[1]
