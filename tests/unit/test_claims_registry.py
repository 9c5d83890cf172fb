"""The claims registries (results/<paper>/claims.csv, read by fedrun.reports.common.registry): one claim per row,
its family, test shape and seeds; a bad row is one line naming it; every registry row belongs to a report."""

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from fedrun.reports import REPORTS, stats
from fedrun.reports.common import registry

ROOT = Path(__file__).resolve().parents[2]
REGISTRIES = sorted(ROOT.glob("results/*/claims.csv"))


def test_a_row_is_one_claim_with_its_family_test_and_seeds():
    claims = registry(ROOT, "results/correlated/claims.csv", "correlated")
    assert [c.id for c in claims] == ["P1", "P2", "P3", "S1", "S2", "S3", "S4", "S5", "B1"]
    assert {c.family for c in claims} == {"primary", "secondary", "by construction"}
    (terms, kind, bound, _), = claims[0].comps
    assert kind == ">" and bound == 0.0 and claims[0].value == "final" and claims[0].seeds == (0, 1, 2)
    assert terms == (({"condition": "sqrt_toeplitz", "scheme": "fl_cs@0.05"}, 1.0),
                     ({"condition": "sqrt_toeplitz", "scheme": "fl_std"}, -1.0))
    (_, kind, bound, _), = claims[-1].comps
    assert kind == "saving" and bound == 0.9  # bytes: no test, listed apart as true by construction


def test_shapes_config_any_and_ranges():
    """P3 of paper 000: two comparisons that must both hold, the shared config in every cell; P1 of paper 001: an
    *any of* claim; a magnitude is an equivalence around the paper's number; seeds ``1000-1003`` is a range."""
    k = {c.id: c for c in registry(ROOT, "results/kerkouche21/claims.csv", "kerkouche21_table3")}
    assert not k["P3"].any and len(k["P3"].comps) == 2 and k["P1"].seeds == (1000, 1001, 1002, 1003)
    assert all(c["dp"] == "off" and c["r"] == "0.05" for terms, *_ in k["P3"].comps for c, _ in terms)
    assert k["P2"].comps[0][1:] == ("≈", 0.02, 0.17)
    f = {c.id: c for c in registry(ROOT, "results/fu21/claims.csv", "fu21_lending_club_paper_unchecked")}
    assert f["P1"].any and len(f["P1"].comps) == 5


@pytest.mark.parametrize("column,bad,message", [
    ("test", "dominance", "test='dominance' is not one of superiority, inferiority"),
    ("family", "tertiary", "family='tertiary' is not primary, secondary"),
    ("comparisons", "fl_cs - fl_std", "expected signed cells like"),
])
def test_a_bad_row_is_one_line_naming_it(tmp_path, column, bad, message):
    rows = list(csv.DictReader(open(ROOT / "results/correlated/claims.csv", encoding="utf-8")))
    rows[0][column] = bad
    with open(tmp_path / "claims.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(ValueError, match=message):
        registry(tmp_path, "claims.csv", "correlated")


@pytest.mark.parametrize("path", REGISTRIES, ids=lambda p: p.parent.name)
def test_every_row_names_a_report_and_a_primary_claim_fixed_seeds(path):
    rows = list(csv.DictReader(open(path, encoding="utf-8")))
    assert {r["report"] for r in rows} <= set(REPORTS)
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["registered"] and (r["family"] != "primary" or r["seeds"] not in ("", "all")), r["id"]


def test_kaplan_meier_median_with_censored_runs():
    """Times 10, 20 (reached), 30 (censored), 40 (reached): S drops to 3/4 at 10, 1/2 at 20 → median 20; with the
    run at 20 censored instead, S = 3/4 until 40, where it falls to 0 → median 40. Under half reached: NaN."""
    t = np.array([10.0, 20, 30, 40])
    assert stats.km_median(t, np.array([True, True, False, True])) == 20.0
    assert stats.km_median(t, np.array([True, False, False, True])) == 40.0
    assert math.isnan(stats.km_median(t[:3], np.array([True, False, False])))


def test_fedsketch_claims_read_the_eta_fixed_by_the_tuning_seeds():
    """No claim reads a cell re-run at a smaller η after an evaluation seed diverged: every cell's η is the sweep's
    (conf/experiment/fedsketch_homogeneous.yaml's ``fedsketch_lr``, tuned by experiment=fedsketch_tune)."""
    import yaml

    table = yaml.safe_load((ROOT / "conf/experiment/fedsketch_homogeneous.yaml").read_text())["fedsketch_lr"]
    cells = [cell for c in registry(ROOT, "results/fedsketch/claims.csv", "fedsketch")
             for terms, *_ in c.comps for cell, _ in terms]
    assert len(cells) > 50
    for cell in cells:
        assert float(cell["lr"]) == float(table[cell["scheme"]]), cell
