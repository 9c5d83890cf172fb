"""``python -m fedrun.report [NAME …] [--check] [--export]``: build the results tables (markdown, figures, README.md's
claims blocks) from the run exports committed in ``results/`` (:mod:`fedrun.export`), with no MLflow; every report
when no NAME is given. ``--check`` writes nothing and exits 1 if a committed file differs from what the exports give;
``--export`` first exports the reports' MLflow experiments again. The reports: :mod:`fedrun.reports`.

:func:`mlflow_records` turns finished MLflow runs into flat records (``params.*``, ``metrics.*``, ``tags.*``) with
fedrun's own metric names (``metrics.best_test_accuracy``, not ``summary/best_test_accuracy``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence


def save(text: str, path: str | Path) -> Path:
    """Write a generated table to ``path``, creating its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def mlflow_records(tracking_uri: str, experiment: str, filter_string: str = "") -> list[dict[str, Any]]:
    """Runs of an MLflow experiment (sweep parents left out) as flat records: params.*, metrics.* (fedrun's names,
    :func:`fedrun.tracking.internal_name`), tags.*, run_id, status, start_time."""
    from mlflow.tracking import MlflowClient

    from fedrun.tracking import internal_name

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"experiment {experiment!r} not found at {tracking_uri}")
    records = []
    for run in client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=50_000):
        if run.data.tags.get("fedrun.kind") == "sweep":
            continue
        rec: dict[str, Any] = {"run_id": run.info.run_id, "status": run.info.status, "start_time": run.info.start_time}
        rec.update({f"params.{k}": v for k, v in run.data.params.items()})
        rec.update({f"metrics.{internal_name(k)}": v for k, v in run.data.metrics.items()})
        rec.update({f"tags.{k}": v for k, v in run.data.tags.items()})
        records.append(rec)
    return records


def default_root() -> Path:
    """The repository: the current directory if it has results/, else this checkout."""
    return Path.cwd() if (Path.cwd() / "results").is_dir() else Path(__file__).resolve().parents[1]


def report_files(name: str, root: str | Path | None = None) -> dict[Path, bytes]:
    """Every file of report ``name`` (paths relative to ``root``), built from the committed exports alone."""
    from fedrun.reports import REPORTS

    if name not in REPORTS:
        raise ValueError(f"no report {name!r}; reports: {', '.join(REPORTS)}")
    return REPORTS[name][0](Path(root or default_root()))


def refresh_exports(name: str, root: Path, uri: str | None = None, allow_dirty: bool = False) -> list[str]:
    """Export the report's MLflow experiments again (``--export``; runs from a dirty tree only with
    ``allow_dirty``); one line per export."""
    from fedrun.export import export
    from fedrun.reports import REPORTS
    from fedrun.tracking import resolve_uri

    lines = []
    for e in REPORTS[name][1]:
        out = root / e.path
        files = export(resolve_uri(uri), [e.experiment], out.parent, out.name, metrics=e.metrics, every=e.every,
                       allow_dirty=allow_dirty)
        lines.append(f"{files[2]} runs of {e.experiment} → " + ", ".join(
            f"{f.relative_to(root)} ({f.stat().st_size / 1e3:.1f} kB)" for f in files[:2]))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from fedrun.export import ExportError
    from fedrun.reports import REPORTS

    ap = argparse.ArgumentParser(prog="python -m fedrun.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"reports (default: all): {', '.join(REPORTS)}")
    ap.add_argument("--root", default=None, help="the repository (default: . if it has results/, else this checkout)")
    ap.add_argument("--out", default=None, help="write the files into this folder instead of their places")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed file differs")
    ap.add_argument("--export", action="store_true", help="first export the reports' MLflow experiments again")
    ap.add_argument("--uri", default=None, help="with --export: tracking URI (default: $MLFLOW_TRACKING_URI, else "
                                                "sqlite:///mlflow.db)")
    ap.add_argument("--allow-dirty", action="store_true", help="with --export: export runs made from a working tree "
                                                               "with uncommitted changes too")
    args = ap.parse_args(argv)
    root = Path(args.root) if args.root else default_root()
    stale = []
    for name in args.names or list(REPORTS):
        try:
            if args.export:
                for line in refresh_exports(name, root, args.uri, args.allow_dirty):
                    print(f"fedrun report: exported {line}")
            files = report_files(name, root)
        except (ExportError, ValueError, OSError) as exc:
            print(f"fedrun report: error: {name}: {exc}", file=sys.stderr)
            return 2
        for p, data in files.items():
            if args.check:
                if not (root / p).exists() or (root / p).read_bytes() != data:
                    stale.append(p)
                    print(f"fedrun report: {p} differs from what the export gives ({name})", file=sys.stderr)
                continue
            dest = Path(args.out) / p.name if args.out else root / p
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            print(f"fedrun report: wrote {dest} ({len(data) / 1e3:.1f} kB)")
    if args.check and not stale:
        print(f"fedrun report: {len(args.names or REPORTS)} report(s) up to date")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
