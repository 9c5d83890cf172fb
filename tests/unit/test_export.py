"""fedrun.export: MLflow runs ⇄ committed gzip'd CSV exports (deterministic bytes, load without MLflow, import)."""

from __future__ import annotations

import math
import random

import pytest

from fedrun import export as ex


def _runs_and_points():
    runs = [{"run_id": f"{i:032x}", "experiment": "e", "run_name": f"fl_cs seed={i}", "status": "FINISHED",
             "start_time": 1_700_000_000_000 + i, "end_time": 1_700_000_100_000 + i,
             "params.seed": str(i), "params.r": "0.05", "tags.scheme": "fl_cs",
             "metrics.summary/best_test_accuracy": 0.1 + 0.2 * i, "metrics.epsilon": math.inf}
            for i in range(3)]
    runs[1]["params.only_here"] = "x, \"quoted\"\nnext line"  # a column one run lacks; CSV quoting
    points = [(r["run_id"], key, step, v) for r in runs for key in ("test_accuracy", "dp/clipped_fraction")
              for step, v in ((1, 0.1 + 0.2), (2, 1e-300), (3, math.nan), (4, -0.0))]
    return runs, points


def test_encode_gives_the_same_bytes_whatever_the_order_and_round_trips_floats(tmp_path):
    runs, points = _runs_and_points()
    a = ex.encode(runs, points)
    rng = random.Random(0)
    shuffled_runs, shuffled_points = runs[:], points[:]
    rng.shuffle(shuffled_runs)
    rng.shuffle(shuffled_points)
    shuffled_runs = [dict(reversed(list(r.items()))) for r in shuffled_runs]  # column order within a run
    assert ex.encode(shuffled_runs, shuffled_points) == a
    for data in a:
        assert data[4:8] == b"\0\0\0\0"  # gzip mtime 0
        assert data[3] & 0x08 == 0  # no file name in the header
    prefix = tmp_path / "e"
    ex.paths(prefix)[0].write_bytes(a[0])
    ex.paths(prefix)[1].write_bytes(a[1])
    back_runs, back_points = ex.read_export(prefix)
    assert ex.encode(back_runs, back_points) == a
    got = {(rid, k, s): v for rid, k, s, v in back_points}
    assert got[(runs[0]["run_id"], "test_accuracy", 1)] == 0.1 + 0.2  # repr: exact
    assert got[(runs[0]["run_id"], "test_accuracy", 2)] == 1e-300
    assert math.isnan(got[(runs[0]["run_id"], "test_accuracy", 3)])
    assert math.copysign(1, got[(runs[0]["run_id"], "test_accuracy", 4)]) == -1
    assert back_runs[1]["params.only_here"] == "x, \"quoted\"\nnext line" and "params.only_here" not in back_runs[0]
    assert back_runs[0]["metrics.epsilon"] == math.inf


def test_load_gives_records_with_fedrun_names_and_series(tmp_path):
    runs, points = _runs_and_points()
    a, b = ex.encode(runs, points)
    ex.paths(tmp_path / "e")[0].write_bytes(a)
    ex.paths(tmp_path / "e")[1].write_bytes(b)
    recs = ex.load(tmp_path / "e")
    rec = next(r for r in recs if r["run_id"] == runs[2]["run_id"])
    assert rec["metrics.best_test_accuracy"] == pytest.approx(0.5)  # summary/… → fedrun's name
    assert rec["params.seed"] == "2" and rec["tags.scheme"] == "fl_cs" and rec["status"] == "FINISHED"
    assert rec["start_time"] == 1_700_000_000_002
    assert [s for s, _ in rec["series"]["dp_clipped_fraction"]] == [1, 2, 3, 4]  # dp/… → dp_…


def test_thin_keeps_every_kth_step_and_each_metrics_first_and_last():
    pts = [("a", "m", s, float(s)) for s in range(0, 23)] + [("a", "once", 7, 1.0)]
    kept = {(k, s) for _, k, s, _ in ex.thin(pts, 10)}
    assert kept == {("m", 0), ("m", 10), ("m", 20), ("m", 22), ("once", 7)}
    assert ex.thin(pts, None) == pts


def test_a_missing_or_broken_export_is_one_line_naming_it(tmp_path, capsys):
    with pytest.raises(ex.ExportError, match=r"nope\.runs\.csv\.gz not found"):
        ex.load(tmp_path / "nope")
    (tmp_path / "bad.runs.csv.gz").write_bytes(b"not gzip")
    assert ex.main(["info", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedrun export: error:") and "bad.runs.csv.gz" in err and "\n" not in err


def _log_runs(uri: str, experiment: str) -> None:
    """Three tiny runs logged as fedrun logs them (MlflowTracker: metric names grouped, summary at the end)."""
    from fedrun.tracking import MlflowTracker

    for seed in range(3):
        tr = MlflowTracker(uri, experiment, parent_run_id=None, name_suffix=f"seed={seed}")
        tr.start({"seed": str(seed), "r": "0.05", "scheme.name": "fl_cs", "num_clients": "60"},
                 {"scheme": "fl_cs", "dp": "client", "git_commit": "abc", "fedrun.num_parameters": "10"},
                 run_name="fl_cs-fashion_mnist")
        for step in (1, 2, 3):
            tr.log_metrics({"test_accuracy": 0.1 * step + 0.01 * seed, "dp_clipped_fraction": 0.5,
                            "uplink_bytes_total": 100.0 * step}, step=step)
        tr.log_metrics({"best_test_accuracy": 0.3 + 0.01 * seed, "best_round": 3.0}, step=3)
        tr.end("FINISHED" if seed < 2 else "FAILED")


def test_export_load_import_round_trip_through_mlflow(tmp_path):
    from fedrun.export import mlflow_records

    uri = f"sqlite:///{tmp_path / 'a.db'}"
    _log_runs(uri, "exp")
    runs_file, metrics_file, n = ex.export(uri, ["exp"], tmp_path / "out")
    assert n == 3 and runs_file.name == "exp.runs.csv.gz"
    first = (runs_file.read_bytes(), metrics_file.read_bytes())
    ex.export(uri, ["exp"], tmp_path / "out")
    assert (runs_file.read_bytes(), metrics_file.read_bytes()) == first  # re-export: identical bytes

    recs = {r["run_id"]: r for r in ex.load(tmp_path / "out" / "exp")}
    direct = {r["run_id"]: r for r in mlflow_records(uri, "exp")}
    assert set(recs) == set(direct)
    for rid, rec in recs.items():
        for key, value in direct[rid].items():
            if key.startswith(("params.", "metrics.")) or key in ("status", "start_time"):
                assert rec[key] == value, key
            elif key.startswith("tags.") and ex.kept_tag(key[5:]):
                assert rec[key] == value, key
        assert "tags.mlflow.note.content" not in rec
        assert rec["series"]["test_accuracy"] == [(s, pytest.approx(0.1 * s + 0.01 * int(rec["params.seed"])))
                                                  for s in (1, 2, 3)]
    assert {r["status"] for r in recs.values()} == {"FINISHED", "FAILED"}

    uri_b = f"sqlite:///{tmp_path / 'b.db'}"
    new = ex.import_runs(tmp_path / "out" / "exp", uri_b)
    assert len(new) == 3
    assert ex.import_runs(tmp_path / "out" / "exp", uri_b) == []  # imported before: skipped
    ex.export(uri_b, ["exp"], tmp_path / "back")
    back = ex.load(tmp_path / "back" / "exp")
    by_source = {r[f"tags.{ex.SOURCE_TAG}"]: r for r in back}
    assert set(by_source) == set(recs)
    for rid, rec in recs.items():
        b = by_source[rid]
        strip = lambda r: {k: v for k, v in r.items() if k != "run_id"  # noqa: E731
                           and not k.startswith("tags.fedrun.export.") and k != "tags.mlflow.parentRunId"}
        assert strip(b) == strip(rec)


def test_export_append_keeps_the_runs_the_store_lacks_and_their_rows_unchanged(tmp_path):
    uri_a, uri_b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    _log_runs(uri_a, "exp")                          # seeds made on one machine, exported, the store then lost
    _log_runs(uri_b, "exp")                          # more runs in a fresh store
    ex.export(uri_a, ["exp"], tmp_path / "out")
    before = {r["run_id"]: r for r in ex.load(tmp_path / "out" / "exp")}
    _, _, n = ex.export(uri_b, ["exp"], tmp_path / "out", append=True)
    after = {r["run_id"]: r for r in ex.load(tmp_path / "out" / "exp")}
    assert n == 6 and len(after) == 6 and all(after[k] == v for k, v in before.items())
    first = [f.read_bytes() for f in ex.paths(tmp_path / "out" / "exp")]
    ex.export(uri_b, ["exp"], tmp_path / "out", append=True)
    assert [f.read_bytes() for f in ex.paths(tmp_path / "out" / "exp")] == first     # appending again: same bytes
    assert ex.export(uri_b, ["exp"], tmp_path / "out")[2] == 3                       # without it: this store's only


def test_loading_an_export_and_building_a_report_never_imports_mlflow(tmp_path):
    import subprocess
    import sys

    runs, points = _runs_and_points()
    a, b = ex.encode(runs, points)
    ex.paths(tmp_path / "e")[0].write_bytes(a)
    ex.paths(tmp_path / "e")[1].write_bytes(b)
    code = ("import sys, pathlib; from fedrun.reports import common as c; "
            f"df = c.load(pathlib.Path({str(tmp_path)!r}), [c.Export('e', 'e')]); "
            "df['s'] = c.column(df, 'tags.scheme'); df['seed'] = c.column(df, 'params.seed', kind=int); "
            "rep = c.Report('t', pathlib.Path('.'), 'o.md', [], df, c.dims(s={}, seed={})); "
            "assert 'fl_cs' in rep.table(['s'], [c.Cell(value='metrics.best_test_accuracy')]); "
            "assert 'mlflow' not in sys.modules, 'mlflow imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_import_clean_only_leaves_out_the_runs_of_a_dirty_tree(tmp_path):
    uri = f"sqlite:///{tmp_path / 'a.db'}"
    _log_runs(uri, "exp")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    for r, dirty in zip(runs, ("true", "false", "true")):
        client.set_tag(r.info.run_id, "git_dirty", dirty)
    ex.export(uri, ["exp"], tmp_path / "out", allow_dirty=True)
    uri_b = f"sqlite:///{tmp_path / 'b.db'}"
    new = ex.import_runs(tmp_path / "out" / "exp", uri_b, clean_only=True)
    back = MlflowClient(tracking_uri=uri_b)
    assert [back.get_run(rid).data.tags["git_dirty"] for rid in new] == ["false"]
    assert len(ex.import_runs(tmp_path / "out" / "exp", uri_b)) == 2  # without it, the dirty ones come too
