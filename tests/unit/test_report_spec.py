"""fedrun.reports: spec validation, aggregation over seeds, the claim rule, the paper's numbers and their marks.

Pure: synthetic records, specs as dicts (no MLflow, no files)."""

from __future__ import annotations

import math

import pytest

from fedrun.reports import build
from fedrun.reports.spec import SpecError, load_spec, parse, yaml_load


def _spec(**over):
    raw = {
        "title": "T", "output": "results/x/t.md", "exports": ["results/x/runs/e"],
        "where": {"status": "FINISHED"},
        "dims": {"scheme": {"from": "tags.scheme", "values": ["a", "b", "c"], "labels": {"a": "A", "b": "B", "c": "C"}},
                 "dp": {"from": "tags.dp", "map": {"client": "on"}, "values": ["off", "on"]},
                 "seed": {"from": "params.seed", "type": "int"}},
        "replicate": "seed",
        "values": {"acc": "metrics.best_test_accuracy", "pct": "acc * 100"},
        "tables": [{"title": "acc", "rows": ["scheme"], "columns": ["dp"],
                    "cells": [{"header": "paper", "paper": "acc", "fmt": "{:.2f}", "level": 0},
                              {"value": "acc", "agg": "mean_std", "fmt": "{:.3f}"}]}],
    }
    raw.update(over)
    return parse(raw, "t")


def _rec(scheme, seed, acc, dp="off", start=0, status="FINISHED", run_id=None):
    return {"run_id": run_id or f"{scheme}{dp}{seed}{start}", "status": status, "start_time": start,
            "tags.scheme": scheme, "tags.dp": dp, "params.seed": str(seed), "metrics.best_test_accuracy": acc}


def test_yaml_keeps_on_and_off_as_text():
    assert yaml_load("a: off\nb: on\nc: true\nd: yes\ne: 0.05") == {"a": "off", "b": "on", "c": True, "d": "yes",
                                                                     "e": 0.05}


@pytest.mark.parametrize("over,message", [
    ({"tables": [{"rows": ["schem"], "cells": [{"value": "acc"}]}]}, r"tables\[0\]\.rows: 'schem' is not a dim"),
    ({"tables": [{"rows": ["seed"], "cells": [{"value": "acc"}]}]}, r"'seed' is the replicate dim"),
    ({"tables": [{"rows": ["scheme"], "cells": [{"value": "acc", "agg": "avg"}]}]}, r"agg: 'avg'; allowed: mean_std"),
    ({"tables": [{"rows": ["scheme"], "cells": [{"value": "accuracy"}]}]}, r"'accuracy' is not a value"),
    ({"values": {"acc": "metrics.x + __import__('os')"}}, r"values\.acc: .*only numbers are allowed as constants"),
    ({"values": {"acc": "metrics.x + exit(1, 2)"}}, r"values\.acc: .*'exit' is not a function here; allowed: reach, at"),
    ({"values": {"acc": "reach(metrics.best_test_accuracy, 0.5)"}},
     r"reach\(\)'s first argument must be a per-round series like series\.test_accuracy"),
    ({"values": {"acc": "at(series.test_accuracy)"}}, r"at\(\) takes two arguments"),
    ({"values": {"acc": "reach(series.test_accuracy, nope)"}}, r"'nope' is neither a record key"),
    ({"values": {"acc": "series.test_accuracy * 2"}}, r"'series\.test_accuracy' is neither a record key"),
    ({"values": {"acc": "foo * 2"}}, r"'foo' is neither a record key"),
    ({"paper": [{"at": "scheme=a dp=off", "quantity": "acc", "number": 0.9, "where": "p. 3",
                 "status": "inferred"}]}, r"paper\[0\]: an inferred number needs 'how'"),
    ({"paper": [{"at": "scheme=z", "quantity": "acc", "number": 0.9, "where": "p. 3"}]},
     r"paper\[0\]\.at: scheme=z in 'scheme=z' is not among the values of dim 'scheme': a, b, c"),
    ({"paper": [{"at": "schema=a", "quantity": "acc", "number": 0.9, "where": "p. 3"}]},
     r"'schema' in 'schema=a' is not a dim"),
    ({"claims": [{"text": "x", "value": "acc", "compare": [["scheme=a", "=>", "scheme=b"]]}]}, r"op '=>'; allowed"),
    ({"claims": [{"text": "x {r}", "value": "acc", "compare": [["scheme=a", ">", "scheme=b"]]}]},
     r"claims\[0\]\.text: .*placeholder"),
    ({"dims": {"dp": {"from": "tags.dp", "values": [False, True]}},
      "tables": [{"rows": ["dp"], "cells": [{"value": "acc"}]}]},
     r"False for dim 'dp' is a boolean"),
    ({"expect": [{"scheme": "a"}]}, r"expect\[0\] does not name dp"),
    ({"colour": 1}, r"unknown key 'colour'"),
    ({"tables": [{"rows": ["scheme"], "cells": [{"value": "acc", "best": "lowest"}]}]},
     r"tables\[0\]\.cells\[0\]\.best: 'lowest'; allowed: min, max"),
    ({"tables": [{"rows": ["scheme"], "cells": [{"paper": "acc", "best": "min"}]}]},
     r"cells\[0\]\.best: only a measured cell"),
    ({"claims": [{"text": "x", "value": "acc", "combine": "some", "compare": [["scheme=a", ">", "scheme=b"]]}]},
     r"claims\[0\]\.combine: 'some'; allowed: all, any"),
    ({"claims": [{"text": "x", "kind": "saving", "value": "acc", "left": "scheme=a", "right": "scheme=b",
                  "at_least": 0.5, "combine": "any"}]}, r"claims\[0\]\.combine: only a compare claim"),
    ({"figures": [{"file": "f.svg", "series": "test_accuracy", "yscale": "symlog"}]},
     r"figures\[0\]\.yscale: 'symlog'; allowed: linear, log"),
])
def test_a_bad_spec_is_one_line_naming_the_value(over, message):
    with pytest.raises(SpecError, match=message) as err:
        _spec(**over)
    assert "\n" not in str(err.value)


def test_load_spec_names_the_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("title: T\noutput: x.md\nexports: [e]\ndims: {s: {from: tags.s}}\ntables: [{rows: [q], cells: []}]\n")
    with pytest.raises(SpecError, match=r"bad\.yaml: tables\[0\]\.rows: 'q' is not a dim; dims: s"):
        load_spec(p)
    with pytest.raises(SpecError, match=r"nope\.yaml: no such report spec"):
        load_spec(tmp_path / "nope.yaml")


def test_cells_aggregate_over_seeds_and_keep_the_newest_repeat():
    spec = _spec()
    recs = [_rec("a", 0, 0.80), _rec("a", 1, 0.82), _rec("a", 2, 0.84),
            _rec("a", 2, 0.10, start=-1),            # an older run of seed 2: replaced by the newer one
            _rec("b", 0, 0.5, status="FAILED"),      # filtered by where
            _rec("c", 0, 0.6, dp="local_laplace"),   # a dp value outside the spec
            _rec("b", 0, 0.70, dp="client")]
    placed = build.collect(spec, recs)
    assert placed.duplicates == 1 and placed.filtered == 1 and placed.outside == {"dp": 1}
    s = build.cell_stat(spec, placed, {"scheme": "a", "dp": "off"}, "acc")
    assert s.n == 3 and s.mean == pytest.approx(0.82) and s.std == pytest.approx(0.02)
    assert s.render("mean_std", "{:.3f}") == "0.820 ± 0.020 (3)"
    assert build.cell_stat(spec, placed, {"scheme": "b", "dp": "on"}, "pct").render("mean_std", "{:.0f}") == "70 (1)"
    md = build.table_sections(spec, spec.tables[0], placed, {})[0][1]
    assert md.splitlines()[0] == "| scheme | paper | off | on |"
    assert "| A |  | 0.820 ± 0.020 (3) | – |" in md and "| B |  | – | 0.700 (1) |" in md


@pytest.mark.parametrize("left,right,op,tol,verdict", [
    ([0.80, 0.81, 0.82], [0.70, 0.71, 0.72], ">", 0.0, "met"),
    ([0.70, 0.71, 0.72], [0.80, 0.81, 0.82], ">", 0.0, "not met"),
    ([0.70, 0.71, 0.72], [0.80, 0.81, 0.82], "<", 0.0, "met"),
    ([0.80, 0.85, 0.90], [0.79, 0.84, 0.89], ">", 0.0, "inconclusive (within noise)"),
    ([0.80, 0.81], [0.10, 0.11, 0.12], ">", 0.0, "inconclusive (fewer than 3 seeds)"),
    ([0.78, 0.79, 0.80], [0.80, 0.81, 0.82], ">=", 0.05, "met"),        # within the tolerance in the claim's favour
    ([], [0.8, 0.8, 0.8], ">", 0.0, "not checkable"),
])
def test_the_claim_rule(left, right, op, tol, verdict):
    got, d, band = build.compare(build.stat(left), build.stat(right), op, tol)
    assert got == verdict
    if verdict in ("met", "not met"):
        assert abs(d) > band


def _claims_spec(compare, **extra):
    return _spec(claims=[{"text": "A beats B {dp}", "value": "acc", "for_each": {"dp": "present"},
                          "compare": compare, "paper": "A > B", "where": "p. 3", **extra}])


def test_claims_on_records_met_not_met_and_combined():
    recs = [_rec("a", s, 0.80 + 0.01 * s) for s in range(3)] + [_rec("b", s, 0.70 + 0.01 * s) for s in range(3)] \
        + [_rec("c", s, 0.75 + 0.01 * s) for s in range(3)]
    spec = _claims_spec([["scheme=a dp={dp}", ">", "scheme=b dp={dp}"]])
    [(text, v)] = build.evaluate(spec, spec.claims[0], build.collect(spec, recs))
    assert text == "A beats B off" and v.verdict == "met"
    assert v.detail.startswith("A 0.810 ± 0.010 (n=3) > B 0.710 ± 0.010 (n=3): difference +0.100, 2·SE = 0.016")
    chain = _claims_spec([["scheme=a dp={dp}", ">=", "scheme=c dp={dp}"],
                          ["scheme=c dp={dp}", ">=", "scheme=b dp={dp}"]])
    assert build.evaluate(chain, chain.claims[0], build.collect(chain, recs))[0][1].verdict == "met"
    broken = _claims_spec([["scheme=a dp={dp}", ">=", "scheme=c dp={dp}"],
                           ["scheme=b dp={dp}", ">=", "scheme=c dp={dp}"]])
    assert build.evaluate(broken, broken.claims[0], build.collect(broken, recs))[0][1].verdict == "not met"
    few = [r for r in recs if not (r["tags.scheme"] == "b" and r["params.seed"] == "2")]
    assert build.evaluate(spec, spec.claims[0], build.collect(spec, few))[0][1].verdict == \
        "inconclusive (fewer than 3 seeds)"
    text = build.render(spec, recs)
    assert "- A beats B off: **met** — A 0.810" in text and "Rule: each comparison" in text


def test_a_claim_cell_that_matches_several_cells_is_not_checkable():
    recs = [_rec("a", 0, 0.8), _rec("a", 0, 0.7, dp="client"), _rec("b", 0, 0.6)]
    spec = _spec(claims=[{"text": "x", "value": "acc", "compare": [["scheme=a", ">", "scheme=b"]]}])
    [(_, v)] = build.evaluate(spec, spec.claims[0], build.collect(spec, recs))
    assert v.verdict == "not checkable" and "matches 2 cells (name dp)" in v.detail


def test_saving_claim_reads_counted_bytes():
    spec = _spec(values={"acc": "metrics.best_test_accuracy", "up": "metrics.uplink"},
                 claims=[{"text": "saving", "kind": "saving", "value": "up", "left": "scheme=a dp=off",
                          "right": "scheme=b dp=off", "at_least": 0.945}])
    recs = [dict(_rec("a", 0, 0.8), **{"metrics.uplink": 5.0}), dict(_rec("b", 0, 0.8), **{"metrics.uplink": 100.0})]
    [(_, v)] = build.evaluate(spec, spec.claims[0], build.collect(spec, recs))
    assert v.verdict == "met" and v.detail.startswith("saving 95.0 %")
    recs[0]["metrics.uplink"] = 6.0
    assert build.evaluate(spec, spec.claims[0], build.collect(spec, recs))[0][1].verdict == "not met"


def test_inferred_paper_numbers_carry_a_mark_and_a_footnote():
    spec = _spec(paper=[
        {"at": "scheme=a dp=off", "quantity": "acc", "number": 0.91, "where": "text, line 87", "status": "inferred",
         "how": "0.61 + about 30 points"},
        {"at": "scheme=a dp=on", "quantity": "acc", "number": 0.61, "where": "text, line 87"},
        {"at": "scheme=b dp=on", "quantity": "acc", "number": 0.8, "where": "text, line 81"}])
    spec = parse({**_raw_of(spec), "tables": [{"title": "acc", "rows": ["scheme"], "columns": ["dp"], "cells": [
        {"header": "paper", "paper": "acc", "fmt": "{:.2f}"}, {"value": "acc"}]}]}, "t")
    recs = [_rec("a", 0, 0.84), _rec("a", 0, 0.78, dp="client"), _rec("b", 0, 0.7, dp="client")]
    text = build.render(spec, recs)
    assert "| A | 0.91† | 0.840 (1) | 0.61 | 0.780 (1) |" in text
    assert "| B |  | – | 0.80 | 0.700 (1) |" in text  # a read number: no mark; the table's format
    assert "† inferred, not stated in the paper: 0.61 + about 30 points (text, line 87)" in text
    assert "0.61†" not in text and "0.80†" not in text
    assert "| A dp = off | acc | 0.91† | text, line 87 | **inferred**†: 0.61 + about 30 points |" in text
    assert "| A dp = on | acc | 0.61 | text, line 87 | read (stated) |" in text


def _raw_of(spec):
    """The raw dict of the _spec() defaults plus the paper entries of ``spec`` (to vary the tables)."""
    raw = {
        "title": "T", "output": "results/x/t.md", "exports": ["results/x/runs/e"], "where": {"status": "FINISHED"},
        "dims": {"scheme": {"from": "tags.scheme", "values": ["a", "b", "c"], "labels": {"a": "A", "b": "B", "c": "C"}},
                 "dp": {"from": "tags.dp", "map": {"client": "on"}, "values": ["off", "on"]},
                 "seed": {"from": "params.seed", "type": "int"}},
        "replicate": "seed", "values": {"acc": "metrics.best_test_accuracy"},
    }
    raw["paper"] = [{"at": " ".join(f"{d}={v}" for d, v in p.at.items()), "quantity": p.quantity, "number": p.number,
                     "where": p.where, "status": p.status, **({"how": p.how} if p.how else {})} for p in spec.paper]
    return raw


def test_committed_specs_parse():
    from pathlib import Path

    specs = sorted((Path(__file__).resolve().parents[2] / "conf" / "report").glob("*.yaml"))
    assert specs
    for p in specs:
        spec = load_spec(p)
        assert all(p.status != "inferred" or p.how for p in spec.paper)


def test_fmt_number_marks_missing_and_infinite():
    assert build.fmt_number(math.nan) == "–" and build.fmt_number(math.inf, "{:.2f}") == "∞"
    assert build.stat([math.nan, 1.0]).n == 1


def test_best_marks_the_lowest_or_highest_column_of_a_row_in_bold():
    recs = [_rec("a", s, 0.80 + 0.01 * s) for s in range(3)] + [_rec("a", s, 0.70, dp="client") for s in range(3)] \
        + [_rec("b", 0, 0.5), _rec("b", 0, 0.9, dp="client")]
    table = {"rows": ["scheme"], "columns": ["dp"], "cells": [{"value": "acc", "fmt": "{:.2f}", "best": "max"}]}
    spec = _spec(tables=[table])
    md = build.table_sections(spec, spec.tables[0], build.collect(spec, recs), {})[0][1]
    assert "| A | **0.81 ± 0.01 (3)** | 0.70 ± 0.00 (3) |" in md and "| B | 0.50 (1) | **0.90 (1)** |" in md
    spec = _spec(tables=[{**table, "cells": [{"value": "acc", "fmt": "{:.2f}", "best": "min"}]}])
    md = build.table_sections(spec, spec.tables[0], build.collect(spec, recs), {})[0][1]
    assert "| A | 0.81 ± 0.01 (3) | **0.70 ± 0.00 (3)** |" in md and "| B | **0.50 (1)** | 0.90 (1) |" in md
    spec = _spec(tables=[{**table, "cells": [{"value": "acc", "fmt": "{:.2f}"}]}])   # no best: nothing bold
    assert "**" not in build.table_sections(spec, spec.tables[0], build.collect(spec, recs), {})[0][1]


def test_an_any_claim_is_met_by_one_comparison_and_not_met_only_by_all():
    recs = [_rec("a", s, 0.80 + 0.01 * s) for s in range(3)] + [_rec("b", s, 0.70 + 0.01 * s) for s in range(3)] \
        + [_rec("c", s, 0.75 + 0.01 * s) for s in range(3)]
    one = _claims_spec([["scheme=b dp={dp}", ">", "scheme=c dp={dp}"], ["scheme=a dp={dp}", ">", "scheme=c dp={dp}"]],
                       combine="any")
    [(_, v)] = build.evaluate(one, one.claims[0], build.collect(one, recs))
    assert v.verdict == "met" and v.detail.startswith("any of: B 0.710")
    assert "listed as *any of*" in build.render(one, recs)
    assert "listed as *any of*" not in build.render(_claims_spec([["scheme=a dp={dp}", ">", "scheme=b dp={dp}"]]), recs)
    every = _claims_spec([["scheme=b dp={dp}", ">", "scheme=c dp={dp}"], ["scheme=a dp={dp}", ">", "scheme=c dp={dp}"]])
    assert build.evaluate(every, every.claims[0], build.collect(every, recs))[0][1].verdict == "not met"
    none = _claims_spec([["scheme=b dp={dp}", ">", "scheme=c dp={dp}"], ["scheme=c dp={dp}", ">", "scheme=a dp={dp}"]],
                        combine="any")
    assert build.evaluate(none, none.claims[0], build.collect(none, recs))[0][1].verdict == "not met"
    assert build.combine(["not met", "inconclusive (within noise)"], "any") == "inconclusive (within noise)"
    assert build.combine(["not met", "not checkable"], "any") == "not checkable"


def test_mlflow_infinity_reads_as_infinity():
    import sys

    from fedrun.reports.spec import as_float

    assert as_float(sys.float_info.max) == math.inf and as_float(-sys.float_info.max) == -math.inf
    assert as_float("1e300") == 1e300 and math.isnan(as_float(None))


def test_a_log_y_axis_and_no_band_reaching_zero():
    from fedrun.reports.figure import draw

    line = build.Curve("x", (1, 2, 3), (1.0, 10.0, 100.0), (0.5, 20.0, 5.0), 3, None, None)
    bare = build.Curve("x", (1, 2, 3), (1.0, 10.0, 100.0), (math.nan,) * 3, 3, None, None)
    assert _spec(figures=[{"file": "f.svg", "series": "mse", "yscale": "log"}]).figures[0].yscale == "log"
    assert _spec(figures=[{"file": "f.svg", "series": "mse"}]).figures[0].yscale == "linear"
    lin, log = (draw([("p", [bare])], "f.svg", yscale=y) for y in ("linear", "log"))
    assert lin != log
    assert draw([("p", [line])], "f.svg", yscale="log") == draw([("p", [bare])], "f.svg", yscale="log")
    assert draw([("p", [line])], "f.svg") != draw([("p", [bare])], "f.svg")   # linear: the band is drawn


def test_series_functions_read_the_per_round_history():
    # reach: the first evaluated round at or above the target; at: the value recorded at exactly that round
    spec = _spec(values={"acc": "metrics.best_test_accuracy", "target": "0.8",
                         "rounds": "reach(series.test_accuracy, target)",
                         "uplink": "at(series.uplink_bytes_total, rounds) / 1000"})
    rec = _rec("a", 0, 0.85)
    rec["series"] = {"test_accuracy": [(5, 0.5), (10, 0.79), (15, 0.8), (20, 0.85)],
                     "uplink_bytes_total": [(5, 500.0), (10, 1000.0), (15, 1500.0), (20, 2000.0)]}
    never = _rec("b", 0, 0.7)
    never["series"] = {"test_accuracy": [(5, 0.6), (10, 0.7)], "uplink_bytes_total": [(5, 1.0), (10, 2.0)]}
    thinned = _rec("c", 0, 0.9)   # the uplink kept every 10th round only: the round of the target is not there
    thinned["series"] = {"test_accuracy": [(5, 0.9), (10, 0.95)], "uplink_bytes_total": [(10, 2.0)]}
    placed = build.collect(spec, [rec, never, thinned])
    vals = {r.dims["scheme"]: r.values for r in placed.runs}
    assert vals["a"]["rounds"] == 15 and vals["a"]["uplink"] == 1.5
    assert math.isnan(vals["b"]["rounds"]) and math.isnan(vals["b"]["uplink"])
    assert vals["c"]["rounds"] == 5 and math.isnan(vals["c"]["uplink"])
    # MLflow stores an infinite metric as the largest float: read back as infinity, as the summary metrics are
    inf = _rec("a", 1, 0.85)
    inf["series"] = {"test_accuracy": [(5, 0.9)], "uplink_bytes_total": [(5, 1.7976931348623157e308)]}
    assert build.collect(spec, [inf]).runs[0].values["uplink"] == math.inf
    # the MLflow metric name maps to fedrun's (series.<either> reads the same history)
    nospec = _spec(values={"acc": "metrics.best_test_accuracy", "rounds": "reach(series.test_accuracy, 0.8)"})
    assert build.collect(nospec, [rec]).runs[0].values["rounds"] == 15


def test_the_replicate_dims_values_keep_only_those_seeds():
    """``values`` on the replicate dim keeps those seeds only (a one-seed budget among runs with more seeds);
    without ``values`` every seed counts."""
    recs = [_rec("a", s, 0.80 + 0.01 * s) for s in range(3)]
    every = _spec()
    assert [r.dims["seed"] for r in build.collect(every, recs).cells[("a", "off")]] == [0, 1, 2]
    assert every.dims["seed"].values is None
    one = _spec(dims={"scheme": {"from": "tags.scheme", "values": ["a", "b", "c"]},
                      "dp": {"from": "tags.dp", "map": {"client": "on"}, "values": ["off", "on"]},
                      "seed": {"from": "params.seed", "type": "int", "values": [0]}})
    placed = build.collect(one, recs)
    assert [r.dims["seed"] for r in placed.cells[("a", "off")]] == [0]
    assert build.stat([r.values["acc"] for r in placed.cells[("a", "off")]]).n == 1
