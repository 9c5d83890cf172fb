"""Committed run data: an MLflow experiment ⇄ two small gzip'd CSV files a results folder keeps.

``<out>/<name>.runs.csv.gz``: one row per run. Columns: ``run_id``, ``experiment``, ``run_name``, ``status``,
``start_time``, ``end_time`` (ms since the epoch), then every ``params.*``, the kept ``tags.*``
(:func:`kept_tag`) and ``metrics.*`` (each metric's latest value, its MLflow name), columns sorted by name. A run
with DP keeps its marks: the metrics ε does not cover under their MLflow names ``metrics.nonprivate/…`` and the
tag ``tags.dp.not_covered_by_epsilon`` (their fedrun names); :func:`load` gives them their fedrun names, the tag
stays in the record (exports made before the mark read as before).

``<out>/<name>.metrics.csv.gz``: ``run_id, key, step, value``: every logged point of every metric (MLflow
names, ``step`` = round), or a thinned history: only the ``--metrics`` names (:func:`keep_metric`), only
every k-th round (``--every k``, :func:`thin`; each metric's first and last point are kept).

Size: a run logs ~20 per-round metrics (FL-CS-DP: bytes, ε, loss, dp/…, decoder/…); 100 runs × 200 rounds
× 21 metrics are 3.8 MB gzip'd (the values are full-precision floats, ~9 bytes each after gzip), 0.4 MB with
``--every 10``, 0.9 MB with only six key metrics at every round.

The bytes are a function of the runs alone: rows and columns sorted, floats written with ``repr`` (exact
round trip), an empty cell for a missing value, gzip without a timestamp or file name. Exporting the same
runs again gives identical files, so git sees a change only when a run changed.

:func:`load` reads an export back as records, the flat dicts :func:`mlflow_records` gives
(``params.*``, ``metrics.*`` with fedrun's own metric names, ``tags.*``, ``run_id``, ``status``,
``start_time``) plus ``series``: {metric name: [(step, value), …]}, without importing MLflow.
:func:`import_runs` writes an export into an MLflow store (new runs, same params/tags/metrics, the original
run id in the tag ``fedrun.export.source_run_id``) to browse it in the MLflow UI.

    python -m fedrun.export export --experiment kerkouche21-table3 --out results/kerkouche21/runs
    python -m fedrun.export import results/kerkouche21/runs/kerkouche21-table3 --uri sqlite:///browse.db
    python -m fedrun.export info results/kerkouche21/runs/kerkouche21-table3
"""

from __future__ import annotations

import csv
import fnmatch
import gzip
import io
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

RUNS_SUFFIX = ".runs.csv.gz"
METRICS_SUFFIX = ".metrics.csv.gz"
INFO_COLUMNS = ("run_id", "experiment", "run_name", "status", "start_time", "end_time")
METRIC_COLUMNS = ("run_id", "key", "step", "value")
SOURCE_TAG = "fedrun.export.source_run_id"  # on an imported run: the run id it was exported from
SOURCE_PARENT_TAG = "fedrun.export.source_parent_run_id"
#: MLflow's own tags an export keeps (the rest are UI state, user names, or text derived from the metrics)
KEPT_MLFLOW_TAGS = ("mlflow.runName", "mlflow.parentRunId")
DROPPED_TAGS = ("mlflow.note.content",)
DEFAULT_STATUSES = ("FINISHED", "FAILED")


class ExportError(ValueError):
    """A missing or malformed export, a bad argument: one line that names it."""


def kept_tag(key: str) -> bool:
    """Tags an export keeps: fedrun's own (``scheme``, ``dp``, ``git_commit``, ``fedrun.*``, ``dp.*``, …) and
    :data:`KEPT_MLFLOW_TAGS`; not MLflow's UI state or the run's description (a summary of its metrics)."""
    if key in DROPPED_TAGS:
        return False
    return not key.startswith("mlflow.") or key in KEPT_MLFLOW_TAGS


def keep_metric(key: str, patterns: Sequence[str] | None) -> bool:
    """Is ``key`` (an MLflow metric name) in the per-round file? All when ``patterns`` is None, else those
    matching one of the glob patterns (``test_*``, ``dp/*``); a DP run's metric that ε does not cover
    (``nonprivate/train_loss``) matches by its name with or without the mark."""
    from fedrun.metric_names import NOT_COVERED

    keys = (key, key.removeprefix(NOT_COVERED))
    return patterns is None or any(fnmatch.fnmatchcase(k, p) for p in patterns for k in keys)


def thin(points: Iterable[tuple[str, str, int, float]], every: int | None) -> list[tuple[str, str, int, float]]:
    """Keep the points at steps that are multiples of ``every`` and each (run, metric)'s first and last
    point (all when ``every`` is None or 1)."""
    points = list(points)
    if not every or every <= 1:
        return points
    ends: dict[tuple[str, str], tuple[int, int]] = {}
    for rid, key, step, _ in points:
        lo, hi = ends.get((rid, key), (step, step))
        ends[(rid, key)] = (min(lo, step), max(hi, step))
    return [p for p in points if p[2] % every == 0 or p[2] in ends[p[:2]]]


def paths(prefix: str | Path) -> tuple[Path, Path]:
    """(runs file, metrics file) of an export named by its prefix (``results/x/runs/name``)."""
    prefix = str(prefix)
    for suffix in (RUNS_SUFFIX, METRICS_SUFFIX):
        if prefix.endswith(suffix):
            prefix = prefix[: -len(suffix)]
    return Path(prefix + RUNS_SUFFIX), Path(prefix + METRICS_SUFFIX)


# ----------------------------------------------------------------------------------- bytes (pure)
def csv_gz(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> bytes:
    """A CSV file (``\\n`` line ends, minimal quoting; '' for a missing value, ``repr`` for a float: an exact round
    trip, ``nan``/``inf`` included), gzip'd with no file name and mtime 0: the same rows always give the same bytes."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows([repr(v) if isinstance(v, float) else v for v in row] for row in rows)  # None: '', the rest: str
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=9, mtime=0) as gz:
        gz.write(buf.getvalue().encode("utf-8"))
    return out.getvalue()


def encode(runs: Sequence[dict[str, Any]], points: Iterable[tuple[str, str, int, float]]) -> tuple[bytes, bytes]:
    """(runs file, metrics file) bytes of an export.

    ``runs``: one dict per run with the keys of :data:`INFO_COLUMNS` and ``params.*`` / ``tags.*`` /
    ``metrics.*``; ``points``: (run_id, MLflow metric name, step, value)."""
    columns = sorted({k for r in runs for k in r if k not in INFO_COLUMNS})
    header = [*INFO_COLUMNS, *columns]
    ordered = sorted(runs, key=lambda r: (str(r.get("run_name") or ""), int(r.get("start_time") or 0), r["run_id"]))
    pts = sorted((str(rid), str(key), int(step), float(value)) for rid, key, step, value in points)
    return csv_gz(header, ([r.get(k) for k in header] for r in ordered)), csv_gz(METRIC_COLUMNS, pts)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------- MLflow → files
def read_mlflow(uri: str, experiments: Sequence[str], filter_string: str = "",
                statuses: Sequence[str] | None = DEFAULT_STATUSES,
                metrics: Sequence[str] | None = None, every: int | None = None,
                ) -> tuple[list[dict[str, Any]], list[tuple[str, str, int, float]]]:
    """The runs of MLflow ``experiments`` (sweep parent runs left out; only ``statuses``, all if None) as
    (runs, points) for :func:`encode`; the per-round history thinned by ``metrics`` and ``every``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs: list[dict[str, Any]] = []
    points: list[tuple[str, str, int, float]] = []
    for name in experiments:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise ExportError(f"experiment {name!r} not found at {uri}")
        found, token = [], None
        while True:  # every page: search_runs stops at max_results
            page = client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=1000,
                                      page_token=token)
            found += page
            if not (token := page.token):
                break
        for run in found:
            tags = run.data.tags
            if tags.get("fedrun.kind") == "sweep":
                continue
            if statuses is not None and run.info.status not in statuses:
                continue
            rec: dict[str, Any] = {"run_id": run.info.run_id, "experiment": name,
                                   "run_name": run.info.run_name or tags.get("mlflow.runName", ""),
                                   "status": run.info.status, "start_time": run.info.start_time,
                                   "end_time": run.info.end_time}
            rec.update({f"params.{k}": v for k, v in run.data.params.items()})
            rec.update({f"tags.{k}": v for k, v in tags.items() if kept_tag(k)})
            rec.update({f"metrics.{k}": float(v) for k, v in run.data.metrics.items()})
            runs.append(rec)
            for key in sorted(run.data.metrics):
                if not keep_metric(key, metrics):
                    continue
                for m in client.get_metric_history(run.info.run_id, key):
                    points.append((run.info.run_id, key, int(m.step), float(m.value)))
    # one value per (run, metric, step): a resumed run can hold a step twice; the last logged value wins (MLflow's
    # history is in logging order)
    last = {p[:3]: p[3] for p in points}
    return runs, thin([(rid, key, step, value) for (rid, key, step), value in last.items()], every)


def mlflow_records(uri: str, experiment: str, filter_string: str = "") -> list[dict[str, Any]]:
    """The runs of an MLflow experiment (any status, sweep parents left out) as flat records with fedrun's metric
    names (``metrics.best_test_accuracy``, not ``summary/best_test_accuracy``): what :func:`load` gives for an
    export, without the per-round series."""
    runs, _ = read_mlflow(uri, [experiment], filter_string, statuses=None, metrics=())
    return [_fedrun_names(r) for r in runs]


def _fedrun_names(run: dict[str, Any]) -> dict[str, Any]:
    """A run record with fedrun's metric names (``metrics.<fedrun name>``) for MLflow's."""
    from fedrun.metric_names import internal_name

    return {(f"metrics.{internal_name(k[8:])}" if k.startswith("metrics.") else k): v for k, v in run.items()}


def check_source(runs: list[dict[str, Any]], allow_dirty: bool = False) -> list[dict[str, Any]]:
    """Every run names its code: a run from a clean tree without the tag ``fedrun.source_hash`` (made before it
    existed) gets the hash of its commit and an empty diff (:func:`fedrun.provenance.source_hash`). A run made from a
    working tree with uncommitted changes (tag ``git_dirty``) is refused unless ``allow_dirty``: its code is its
    commit plus the diff in its MLflow artifacts (``source.diff``, earlier ``git_diff.patch``), which an export does
    not hold."""
    from fedrun.provenance import TAG, source_hash

    dirty = [r for r in runs if str(r.get("tags.git_dirty", "")).lower() == "true"]
    if dirty and not allow_dirty:
        raise ExportError(f"{len(dirty)} of {len(runs)} runs were made from a working tree with uncommitted changes "
                          f"(tag git_dirty; e.g. {dirty[0]['run_id']}): re-run them from a clean checkout, or pass "
                          f"--allow-dirty to export them anyway (every table then says how many)")
    for r in runs:
        commit = str(r.get("tags.git_commit") or "")
        if f"tags.{TAG}" not in r and commit and str(r.get("tags.git_dirty", "")).lower() == "false":
            r[f"tags.{TAG}"] = source_hash(commit, "")
    return runs


def export(uri: str, experiments: Sequence[str], out_dir: str | Path, name: str | None = None,
           filter_string: str = "", statuses: Sequence[str] | None = DEFAULT_STATUSES,
           metrics: Sequence[str] | None = None, every: int | None = None,
           allow_dirty: bool = False, append: bool = False) -> tuple[Path, Path, int]:
    """Export the runs of ``experiments`` to ``out_dir/<name>.runs.csv.gz`` and ``.metrics.csv.gz`` (name:
    the first experiment's); returns (runs file, metrics file, number of runs). Runs from a dirty working tree are
    refused unless ``allow_dirty`` (:func:`check_source`). ``append``: keep the runs already in the export that
    this store does not hold (an MLflow store does not outlive its machine; the export does), rows unchanged."""
    if not experiments:
        raise ExportError("no experiment given: --experiment NAME")
    runs, points = read_mlflow(uri, experiments, filter_string, statuses, metrics, every)
    runs = check_source(runs, allow_dirty)
    if not runs:
        raise ExportError(f"no runs to export in {', '.join(map(repr, experiments))} at {uri}"
                          + (f" matching {filter_string!r}" if filter_string else "")
                          + (f" with status {'/'.join(statuses)}" if statuses else ""))
    prefix = Path(out_dir) / (name or experiments[0])
    runs_file, metrics_file = paths(prefix)
    if append and runs_file.exists():
        old, old_points = read_export(prefix)
        keep = {r["run_id"] for r in old} - {r["run_id"] for r in runs}
        runs += [r for r in old if r["run_id"] in keep]
        points += [p for p in old_points if p[0] in keep]
    runs_bytes, metrics_bytes = encode(runs, points)
    _write_atomic(runs_file, runs_bytes)
    _write_atomic(metrics_file, metrics_bytes)
    return runs_file, metrics_file, len(runs)


# ------------------------------------------------------------------------------------- files → records
def _read_csv_gz(path: Path) -> tuple[list[str], list[list[str]]]:
    if not path.exists():
        raise ExportError(f"{path} not found (make it with `python -m fedrun.export export --experiment NAME "
                          f"--out {path.parent}`)")
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, EOFError, csv.Error, UnicodeDecodeError) as exc:
        raise ExportError(f"{path} is not a gzip'd CSV export: {exc}") from None
    if not rows:
        raise ExportError(f"{path} is empty (no header)")
    return rows[0], rows[1:]


def read_export(prefix: str | Path) -> tuple[list[dict[str, Any]], list[tuple[str, str, int, float]]]:
    """The raw content of an export: (runs with MLflow metric names, points), as :func:`encode` takes them."""
    runs_file, metrics_file = paths(prefix)
    header, rows = _read_csv_gz(runs_file)
    if tuple(header[: len(INFO_COLUMNS)]) != INFO_COLUMNS:
        raise ExportError(f"{runs_file}: header starts {header[:len(INFO_COLUMNS)]}, expected {list(INFO_COLUMNS)}")
    runs = []
    for i, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise ExportError(f"{runs_file}: line {i} has {len(row)} cells, the header {len(header)}")
        rec: dict[str, Any] = {}
        for key, text in zip(header, row):
            if text == "":
                continue
            if key in ("start_time", "end_time"):
                rec[key] = int(text)
            elif key.startswith("metrics."):
                try:
                    rec[key] = float(text)
                except ValueError:
                    raise ExportError(f"{runs_file}: line {i}: {key}={text!r} is not a number") from None
            else:
                rec[key] = text
        runs.append(rec)
    mheader, mrows = _read_csv_gz(metrics_file)
    if tuple(mheader) != METRIC_COLUMNS:
        raise ExportError(f"{metrics_file}: header {mheader}, expected {list(METRIC_COLUMNS)}")
    points = []
    for i, row in enumerate(mrows, start=2):
        try:
            rid, key, step, value = row
            points.append((rid, key, int(step), float(value)))
        except ValueError:
            raise ExportError(f"{metrics_file}: line {i} is not run_id,key,step,value: {row}") from None
    return runs, points


def load(prefixes: str | Path | Sequence[str | Path]) -> list[dict[str, Any]]:
    """Records of one or more exports: the flat dicts of :func:`mlflow_records` (``run_id``,
    ``status``, ``start_time``, ``end_time``, ``run_name``, ``experiment``, ``params.*``, ``tags.*``,
    ``metrics.<fedrun name>``) plus ``series``: {fedrun metric name: [(step, value), …] by step}."""
    from fedrun.metric_names import internal_name

    if isinstance(prefixes, (str, Path)):
        prefixes = [prefixes]
    records: list[dict[str, Any]] = []
    for prefix in prefixes:
        runs, points = read_export(prefix)
        series: dict[str, dict[str, list[tuple[int, float]]]] = {}
        for rid, key, step, value in points:
            series.setdefault(rid, {}).setdefault(internal_name(key), []).append((step, value))
        for run in runs:
            rec = _fedrun_names(run)
            rec["series"] = {k: sorted(v) for k, v in sorted(series.get(run["run_id"], {}).items())}
            records.append(rec)
    return records


# ------------------------------------------------------------------------------------- files → MLflow
def import_runs(prefix: str | Path, uri: str, experiment: str | None = None, clean_only: bool = False) -> list[str]:
    """Write an export's runs into the MLflow store at ``uri`` (experiment: ``experiment``, else each run's
    own) as new runs with the same params, tags, metrics, status and times; the original run id goes into the
    tag :data:`SOURCE_TAG`. Runs imported before (same source id in the experiment) are skipped, and with
    ``clean_only`` the runs made from a working tree with uncommitted changes (tag ``git_dirty``), so that a sweep
    with ``skip_finished=true`` re-makes just those from a clean checkout. Returns the new run ids."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from fedrun.tracking import prepare_store

    runs, points = read_export(prefix)
    by_run: dict[str, list[tuple[str, int, float]]] = {}
    for rid, key, step, value in points:
        by_run.setdefault(rid, []).append((key, step, value))
    client = MlflowClient(tracking_uri=uri)
    created = []
    exp_ids: dict[str, str] = {}
    for run in runs:
        if clean_only and str(run.get("tags.git_dirty", "")).lower() == "true":
            continue
        name = experiment or run.get("experiment") or "fedrun-import"
        if name not in exp_ids:
            exp_ids[name] = prepare_store(uri, name)
        exp_id = exp_ids[name]
        done = client.search_runs([exp_id], filter_string=f"tags.`{SOURCE_TAG}` = '{run['run_id']}'",
                                  max_results=1)
        if done:
            continue
        start = int(run.get("start_time") or 0)
        tags = {k[5:]: v for k, v in run.items() if k.startswith("tags.")}
        parent = tags.pop("mlflow.parentRunId", None)  # the parent is not in this store
        if parent:
            tags[SOURCE_PARENT_TAG] = parent
        tags[SOURCE_TAG] = run["run_id"]
        new = client.create_run(exp_id, start_time=start, tags=tags, run_name=run.get("run_name") or None)
        rid = new.info.run_id
        params = [Param(k[7:], str(v)[:6000]) for k, v in sorted(run.items()) if k.startswith("params.")]
        hist = by_run.get(run["run_id"], [])
        have = {key for key, _, _ in hist}
        metrics = [Metric(key, value, start, step) for key, step, value in hist]
        last_step = max((step for _, step, _ in hist), default=0)
        metrics += [Metric(k[8:], float(v), start, last_step) for k, v in sorted(run.items())
                    if k.startswith("metrics.") and k[8:] not in have]  # metrics the per-round file left out
        client.log_batch(rid, metrics=metrics, params=params)  # MLflow splits it into requests it accepts
        client.set_terminated(rid, status=run.get("status") or "FINISHED", end_time=run.get("end_time"))
        created.append(rid)
    return created


def info(prefix: str | Path) -> str:
    """A few lines about an export: runs, statuses, experiments, metric points, file sizes."""
    runs, points = read_export(prefix)
    runs_file, metrics_file = paths(prefix)
    statuses = Counter(r.get("status", "?") for r in runs)
    exps = sorted({r.get("experiment", "?") for r in runs})
    keys = sorted({key for _, key, _, _ in points})
    return "\n".join([
        f"{runs_file}: {len(runs)} runs ({', '.join(f'{n} {s}' for s, n in sorted(statuses.items()))}) of "
        f"{', '.join(exps)}; {runs_file.stat().st_size / 1e3:.1f} kB",
        f"{metrics_file}: {len(points)} points of {len(keys)} metrics; {metrics_file.stat().st_size / 1e3:.1f} kB",
    ])


# ------------------------------------------------------------------------------------------ the CLI
def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from fedrun.tracking import resolve_uri

    ap = argparse.ArgumentParser(prog="python -m fedrun.export", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="MLflow experiment(s) → <out>/<name>.runs.csv.gz + .metrics.csv.gz")
    e.add_argument("--experiment", action="append", required=True, help="MLflow experiment name (repeatable)")
    e.add_argument("--out", required=True, help="folder of the export, e.g. results/kerkouche21/runs")
    e.add_argument("--name", default=None, help="file name prefix (default: the first experiment's name)")
    e.add_argument("--uri", default=None, help="tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    e.add_argument("--filter", default="", help="an MLflow search filter, e.g. \"params.seed = '0'\"")
    e.add_argument("--status", default=",".join(DEFAULT_STATUSES),
                   help="run statuses to export, comma-separated, or 'all' (default: %(default)s)")
    e.add_argument("--metrics", default=None,
                   help="per-round metrics to keep, comma-separated MLflow names or globs (default: all), "
                        "e.g. 'test_accuracy,uplink_bytes_total,epsilon'")
    e.add_argument("--every", type=int, default=None,
                   help="keep per-round points only every k rounds (and each metric's first and last point)")
    e.add_argument("--allow-dirty", action="store_true",
                   help="export runs made from a working tree with uncommitted changes too (refused by default)")
    e.add_argument("--append", action="store_true",
                   help="keep the export's runs that this store lacks (e.g. seeds run earlier on another machine)")
    i = sub.add_parser("import", help="an export → new runs in an MLflow store (to browse in the UI)")
    i.add_argument("export", help="the export's prefix, e.g. results/kerkouche21/runs/kerkouche21-table3")
    i.add_argument("--uri", default=None,
                   help="target tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    i.add_argument("--experiment", default=None, help="target experiment (default: each run's own)")
    i.add_argument("--clean-only", action="store_true",
                   help="leave out runs made from a working tree with uncommitted changes: a sweep with "
                        "skip_finished=true in that store then re-makes only those")
    s = sub.add_parser("info", help="what an export holds")
    s.add_argument("export")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "export":
            statuses = None if args.status == "all" else tuple(s for s in args.status.split(",") if s)
            metrics = None if args.metrics is None else tuple(m for m in args.metrics.split(",") if m)
            uri = resolve_uri(args.uri)
            runs_file, metrics_file, n = export(uri, args.experiment, args.out, args.name, args.filter,
                                                statuses, metrics, args.every, args.allow_dirty, args.append)
            sizes = [f"{f} ({f.stat().st_size / 1e3:.1f} kB)" for f in (runs_file, metrics_file)]
            print(f"fedrun export: {n} runs of {', '.join(args.experiment)} ({uri}) → {', '.join(sizes)}")
        elif args.cmd == "import":
            uri = resolve_uri(args.uri)
            new = import_runs(args.export, uri, args.experiment, args.clean_only)
            print(f"fedrun import: {len(new)} new runs in {uri} (runs imported before are skipped); "
                  f"browse: mlflow ui --backend-store-uri {uri}")
        else:
            print(info(args.export))
    except ExportError as exc:
        print(f"fedrun export: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
