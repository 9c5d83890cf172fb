"""fedrun.reports.common: placing runs in cells (filters, newest repeat), mean ± sd, tables, the paper's numbers and
their marks, claims. Pure: synthetic records, no files."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from fedrun.reports import common as c

DIMS = c.dims(scheme=dict(values=["a", "b", "c"], labels={"a": "A", "b": "B", "c": "C"}), dp=dict(values=["off", "on"]),
              seed={})


def _rec(scheme, seed, acc, dp="off", start=0, status="FINISHED", **more):
    return {"run_id": f"{scheme}{dp}{seed}{start}", "status": status, "start_time": start, "end_time": None,
            "tags.scheme": scheme, "tags.dp": dp, "params.seed": str(seed), "metrics.best_test_accuracy": acc, **more}


def _report(records, dims=DIMS, **kw) -> c.Report:
    df = pd.DataFrame(records, dtype=object)
    df["scheme"] = c.column(df, "tags.scheme")
    df["dp"] = c.column(df, "tags.dp", map={"client": "on"})
    df["seed"] = c.column(df, "params.seed", kind=int)
    df["acc"] = df["metrics.best_test_accuracy"].astype(float)
    return c.Report("t", Path("."), "results/x/t.md", [c.Export("results/x/runs/e", "e")], df, dims, **kw)


def test_cells_aggregate_over_seeds_and_keep_the_newest_repeat():
    rep = _report([_rec("a", 0, 0.80), _rec("a", 1, 0.82), _rec("a", 2, 0.84),
                   _rec("a", 2, 0.10, start=-1),            # an older run of seed 2: replaced by the newer one
                   _rec("b", 0, 0.5, status="FAILED"),      # left out by the status filter
                   _rec("c", 0, 0.6, dp="local_laplace"),   # a dp value outside the dim's values
                   _rec("b", 0, 0.70, dp="client")])
    assert rep.left == ["1 not matching status = FINISHED", "1 outside the spec's dp values",
                        "1 older repeats of a (cell, seed) with the same config"]
    assert rep.mixed == {}
    v = rep.values({"scheme": "a", "dp": "off"}, "acc")
    assert len(v) == 3 and c.mean(v) == pytest.approx(0.82) and c.sd(v) == pytest.approx(0.02)
    assert c.show(v) == "0.820 ± 0.020 (3)" and c.show([0.7], spec="{:.0f}") == "1 (1)"
    md = rep.table(["scheme"], [c.Cell("paper", paper="acc", spec="{:.2f}", level=0), c.Cell(value="acc")], ["dp"])
    assert md.splitlines()[0] == "| scheme | paper | off | on |"
    assert "| A |  | 0.820 ± 0.020 (3) | – |" in md and "| B |  | – | 0.700 (1) |" in md
    assert rep.runs_line().startswith("Runs: 7 in the export `results/x/runs/e.runs.csv.gz`; 4 in the tables (left out")


def test_show_same_min_max_n_and_missing():
    assert c.show([1.0, 1.0], "same", "{:g}") == "1" and c.show([1.0, 2.0], "same", "{:g}") == "1–2"
    assert c.show([1.0, 2.0], "min", "{:g}") == "1" and c.show([1.0, 2.0], "max", "{:g}") == "2"
    assert c.show([], "n") == "0" and c.show([]) == "–"
    assert c.fmt(math.nan) == "–" and c.fmt(math.inf, "{:.2f}") == "∞" and c.finite([math.nan, 1.0]) == [1.0]


def test_the_seed_dims_values_keep_only_those_seeds():
    recs = [_rec("a", s, 0.80 + 0.01 * s) for s in range(3)]
    assert sorted(_report(recs).match({"scheme": "a"})["seed"]) == [0, 1, 2]
    one = _report(recs, dims=c.dims(scheme={}, dp={}, seed=dict(values=[0])))
    assert list(one.match({"scheme": "a"})["seed"]) == [0] and one.left == ["2 outside the spec's seed values"]


def test_best_marks_the_lowest_or_highest_column_of_a_row_in_bold():
    rep = _report([_rec("a", s, 0.80 + 0.01 * s) for s in range(3)] + [_rec("a", s, 0.70, dp="client")
                                                                        for s in range(3)]
                  + [_rec("b", 0, 0.5), _rec("b", 0, 0.9, dp="client")])
    md = rep.table(["scheme"], [c.Cell(value="acc", spec="{:.2f}", best="max")], ["dp"])
    assert "| A | **0.81 ± 0.01 (3)** | 0.70 ± 0.00 (3) |" in md and "| B | 0.50 (1) | **0.90 (1)** |" in md
    md = rep.table(["scheme"], [c.Cell(value="acc", spec="{:.2f}", best="min")], ["dp"])
    assert "| A | 0.81 ± 0.01 (3) | **0.70 ± 0.00 (3)** |" in md and "| B | **0.50 (1)** | 0.90 (1) |" in md
    assert "**" not in rep.table(["scheme"], [c.Cell(value="acc", spec="{:.2f}")], ["dp"])


def test_inferred_paper_numbers_carry_a_mark_and_a_footnote():
    paper = [c.P({"scheme": "a", "dp": "off"}, "acc", 0.91, "text, line 87", "0.61 + about 30 points"),
             c.P({"scheme": "a", "dp": "on"}, "acc", 0.61, "text, line 87"),
             c.P({"scheme": "b", "dp": "on"}, "acc", 0.8, "text, line 81")]
    rep = _report([_rec("a", 0, 0.84), _rec("a", 0, 0.78, dp="client"), _rec("b", 0, 0.7, dp="client")], paper=paper,
                  quantities={"acc": ("acc", "{:.2f}")})
    text = rep.table(["scheme"], [c.Cell("paper", paper="acc", spec="{:.2f}"), c.Cell(value="acc")], ["dp"])
    assert "| A | 0.91† | 0.840 (1) | 0.61 | 0.780 (1) |" in text
    assert "| B |  | – | 0.80 | 0.700 (1) |" in text  # a read number: no mark; the table's format
    assert "† inferred, not stated in the paper: 0.61 + about 30 points (text, line 87)" in text
    numbers = rep.paper_numbers()
    assert "| A dp = off | acc | 0.91† | text, line 87 | **inferred**†: 0.61 + about 30 points |" in numbers
    assert "| A dp = on | acc | 0.61 | text, line 87 | read (stated) |" in numbers


def test_mlflow_infinity_and_the_series_functions():
    assert c.number(sys.float_info.max) == math.inf and c.number(-sys.float_info.max) == -math.inf
    assert c.number("1e300") == 1e300 and math.isnan(c.number(None))
    points = [(5, 0.5), (10, 0.79), (15, 0.8), (20, 0.85)]
    assert c.reach(points, 0.8) == 15 and math.isnan(c.reach(points, 0.9))
    assert c.at(points, 10) == 0.79 and math.isnan(c.at(points, 12)) and c.at([(5, sys.float_info.max)], 5) == math.inf
    df = pd.DataFrame({"series": [{"test_accuracy": points}, {}, None]}, dtype=object)
    got = c.series_value(df, "test_accuracy", lambda p: c.reach(p, 0.8))
    assert got[0] == 15 and math.isnan(got[1]) and math.isnan(got[2])


def test_a_log_y_axis_and_no_band_reaching_zero():
    from fedrun.reports.common import Curve, draw

    line = Curve("x", (1, 2, 3), (1.0, 10.0, 100.0), (0.5, 20.0, 5.0), 3, None, None)
    bare = Curve("x", (1, 2, 3), (1.0, 10.0, 100.0), (math.nan,) * 3, 3, None, None)
    lin, log = (draw([("p", [bare])], "f.svg", yscale=y) for y in ("linear", "log"))
    assert lin != log
    assert draw([("p", [line])], "f.svg", yscale="log") == draw([("p", [bare])], "f.svg", yscale="log")
    assert draw([("p", [line])], "f.svg") != draw([("p", [bare])], "f.svg")   # linear: the band is drawn
    assert draw([("p", [line])], "f.png").startswith(b"\x89PNG")


def test_splice_replaces_one_block_and_names_a_missing_one():
    start, end = c.markers("t")
    text = f"# R\n\n{start}\nold\n{end}\n\nend\n"
    assert c.splice(text, "t", "new") == f"# R\n\n{start}\nnew\n{end}\n\nend\n"
    with pytest.raises(ValueError, match=f"{re.escape(c.README)} has no claims block for u"):
        c.splice(text, "u", "new")


def test_a_run_of_another_config_is_no_repeat_and_its_cell_is_marked_mixed():
    """The same (cell, seed) at another server lr is not a repeat to drop: both runs stay and the cell is marked as
    pooling two configs; a param that follows the seed (a source model per seed) and a config group missing from an
    older run (it ran the group's default) do not make a cell mixed."""
    rep = _report([_rec("a", 0, 0.80, **{"params.scheme.server_lr": "1.0"}),
                   _rec("a", 0, 0.85, start=1, **{"params.scheme.server_lr": "3.0"}),
                   _rec("b", 0, 0.6, **{"params.scheme.source_seed": "0"}),
                   _rec("b", 1, 0.7, **{"params.scheme.source_seed": "1", "params.network.name": "none"})])
    assert len(rep.runs) == 4 and rep.left == []
    assert rep.mixed == {("a", "off"): 2}
