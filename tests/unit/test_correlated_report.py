"""The correlated-noise report's pure pieces: the claims registry it reads, and the censored time to target."""

import math
from pathlib import Path

import pytest

from fedrun.reports.correlated import kaplan_meier, registry

ROOT = Path(__file__).resolve().parents[2]


def test_the_registry_gives_one_claim_per_row_with_its_family_and_test():
    rows = registry(ROOT)
    assert [r["id"] for r in rows] == ["P1", "P2", "P3", "S1", "S2", "S3", "S4", "S5", "B1"]
    assert {r["family"] for r in rows} == {"primary", "secondary", "by construction"}
    p1 = rows[0]["claim"]
    (terms, kind, bound, _), = p1.comps
    assert kind == ">" and bound == 0.0 and p1.value == "final"
    assert terms == (({"condition": "sqrt_toeplitz", "scheme": "fl_cs@0.05"}, 1.0),
                     ({"condition": "sqrt_toeplitz", "scheme": "fl_std"}, -1.0))
    (_, kind, bound, _), = rows[-1]["claim"].comps
    assert kind == "saving" and bound == 0.9  # bytes: no test, listed apart as true by construction


def test_an_unknown_test_shape_is_refused(tmp_path):
    text = (ROOT / "results/correlated/claims.csv").read_text().replace(",superiority,", ",dominance,", 1)
    (tmp_path / "claims.csv").write_text(text)
    with pytest.raises(ValueError, match="test='dominance' is not superiority, non-inferiority, equivalence or saving"):
        registry(tmp_path, "claims.csv")


def test_kaplan_meier_median_with_censored_runs():
    """Times 10, 20 (reached), 30 (censored), 40 (reached): S drops to 3/4 at 10, 1/2 at 20 → median 20; with the
    run at 20 censored instead, S = 3/4 until 40, where it falls to 0 → median 40. Under half reached: NaN."""
    assert kaplan_meier([10, 20, 30, 40], [True, True, False, True]) == (20.0, 0.75)
    assert kaplan_meier([10, 20, 30, 40], [True, False, False, True]) == (40.0, 0.5)
    med, frac = kaplan_meier([10, 20, 30], [True, False, False])
    assert math.isnan(med) and frac == pytest.approx(1 / 3)
