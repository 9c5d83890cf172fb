"""``python -m fedrun.report [NAME …] [--check] [--export]``: build the results tables (markdown, figures, README.md's
claims blocks) from the run exports committed in ``results/`` (:mod:`fedrun.export`), with no MLflow; every report
when no NAME is given. ``--check`` writes nothing and exits 1 if a committed file differs from what the exports give;
``--export`` first exports the reports' MLflow experiments again. The reports: :mod:`fedrun.reports`.

:func:`fedrun.export.mlflow_records` (importable from here too) reads MLflow runs as flat records.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from fedrun.export import mlflow_records  # noqa: F401 - its former place here; the MLflow reader is fedrun.export's


def save(text: str, path: str | Path) -> Path:
    """Write a generated table to ``path``, creating its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


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
