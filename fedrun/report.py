"""Tables are code: records (one dict per run) → a markdown table, plus reading records from MLflow.

``python -m fedrun.report <table>`` (:func:`main`) builds a results file from its declarative spec
``conf/report/<table>.yaml`` and the run exports committed in ``results/`` (:mod:`fedrun.export`), with no
MLflow: :func:`report_files` gives the markdown and figures' bytes (the same for the same export),
``--check`` compares them with the committed files, ``--export`` refreshes the exports from MLflow first.
The spec format and the pure parts: :mod:`fedrun.reports`.

The pure part (:func:`markdown_table`, :func:`fmt`) knows nothing about MLflow; :func:`mlflow_records`
turns finished MLflow runs into flat records (``params.*``, ``metrics.*``, ``tags.*``) for it. Metrics keep
fedrun's own names there (``metrics.dp_clipped_fraction``, ``metrics.best_test_accuracy``: the summary's
keys), not their grouped MLflow names (``dp/clipped_fraction``, ``summary/best_test_accuracy``).
"""

from __future__ import annotations

import math
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence


@dataclass(frozen=True)
class Column:
    """One table column: header text, the record key (or a function of the record), and a format."""

    header: str
    key: str | Callable[[dict[str, Any]], Any]
    fmt: str = "{}"

    def cell(self, record: dict[str, Any]) -> str:
        value = self.key(record) if callable(self.key) else record.get(self.key)
        return fmt(value, self.fmt)


def save(text: str, path: str | Path) -> Path:
    """Write a generated table to ``path``, creating its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def fmt(value: Any, spec: str = "{}") -> str:
    """Format a cell; missing/NaN values print as an en dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def markdown_table(records: Iterable[dict[str, Any]], columns: Sequence[Column],
                   sort_by: Callable[[dict[str, Any]], Any] | None = None) -> str:
    """A GitHub-flavoured markdown table with one row per record."""
    rows = list(records)
    if sort_by is not None:
        rows.sort(key=sort_by)
    head = "| " + " | ".join(c.header for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(c.cell(r) for c in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body]) + "\n"


def with_command(title: str, command: str, table: str, notes: str = "") -> str:
    """A results section: heading, the exact command that produced it, the table, notes."""
    parts = [f"## {title}\n", "Command:\n", f"```\n{command}\n```\n", table]
    if notes:
        parts.append("\n" + notes.strip() + "\n")
    return "\n".join(parts)


def mlflow_records(tracking_uri: str, experiment: str, filter_string: str = "",
                   include_sweep_parents: bool = False) -> list[dict[str, Any]]:
    """Finished runs of an MLflow experiment as flat records (params.*, metrics.*, tags.*, run_id); metric names
    as fedrun names them (:func:`fedrun.tracking.internal_name`)."""
    from mlflow.tracking import MlflowClient

    from fedrun.tracking import internal_name

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"experiment {experiment!r} not found at {tracking_uri}")
    records = []
    for run in client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=50_000):
        if not include_sweep_parents and run.data.tags.get("fedrun.kind") == "sweep":
            continue
        rec: dict[str, Any] = {"run_id": run.info.run_id, "status": run.info.status,
                               "start_time": run.info.start_time}
        rec.update({f"params.{k}": v for k, v in run.data.params.items()})
        rec.update({f"metrics.{internal_name(k)}": v for k, v in run.data.metrics.items()})
        rec.update({f"tags.{k}": v for k, v in run.data.tags.items()})
        records.append(rec)
    return records


# ------------------------------------------------------------------------ python -m fedrun.report <table>
REPORT_DIR = Path("conf") / "report"


def default_root() -> Path:
    """Where ``conf/report/`` and ``results/`` are: the current directory if it has them, else this checkout."""
    here = Path.cwd()
    return here if (here / REPORT_DIR).is_dir() else Path(__file__).resolve().parents[1]


def spec_path(table: str, root: str | Path | None = None) -> Path:
    """``kerkouche21_table3`` → ``<root>/conf/report/kerkouche21_table3.yaml`` (a path to a .yaml passes)."""
    if table.endswith((".yaml", ".yml")):
        return Path(table)
    return Path(root or default_root()) / REPORT_DIR / f"{table}.yaml"


def report_files(table: str, root: str | Path | None = None) -> dict[Path, bytes]:
    """Every file of a report (its markdown and figures, paths relative to ``root``) built from the
    committed exports alone (no MLflow); a spec with claims also gives README.md with its claims block
    regenerated (:mod:`fedrun.reports.readme`)."""
    from fedrun.export import RUNS_SUFFIX, load
    from fedrun.reports.build import collect, curves, render
    from fedrun.reports.figure import draw
    from fedrun.reports.spec import SpecError, load_spec

    root = Path(root or default_root())
    spec = load_spec(spec_path(table, root))
    records = load([root / e.path for e in spec.exports])
    output = Path(spec.output)
    files: dict[Path, bytes] = {}
    placed = collect(spec, records)
    for fig in spec.figures:
        panels, ncols = curves(spec, fig, placed)
        files[output.parent / fig.file] = draw(panels, fig.file, fig.title, fig.xlabel, fig.ylabel, ncols,
                                               fig.yscale)
    notes = ""
    if spec.notes:
        path = root / spec.notes
        if not path.exists():
            raise SpecError(f"{spec_path(table, root)}: notes: {spec.notes} not found")
        notes = path.read_text()
    text = render(spec, records, [e.path + RUNS_SUFFIX for e in spec.exports], [f.file for f in spec.figures], notes)
    files[output] = text.encode("utf-8")
    if spec.claims:  # the README's verdicts come from the same claims (fedrun.reports.readme)
        from fedrun.reports import readme

        path = root / readme.README
        if not path.exists():
            raise SpecError(f"{path} not found: the claims of {table} go into its claims block")
        body = readme.block(spec, placed)
        files[Path(readme.README)] = readme.splice(path.read_text(), spec.name, body).encode("utf-8")
    return files


def refresh_exports(table: str, root: str | Path | None = None, uri: str | None = None) -> list[str]:
    """Export the spec's MLflow experiments again (``--export``); returns one line per export."""
    from fedrun.export import export
    from fedrun.reports.spec import SpecError, load_spec
    from fedrun.tracking import resolve_uri

    root = Path(root or default_root())
    spec = load_spec(spec_path(table, root))
    uri = resolve_uri(uri)
    lines = []
    for e in spec.exports:
        if not e.experiment:
            raise SpecError(f"{spec_path(table, root)}: exports: {e.path} has no 'experiment' to export from")
        out = root / e.path
        runs_file, metrics_file, n = export(uri, [e.experiment], out.parent, out.name, metrics=e.metrics,
                                            every=e.every)
        sizes = [f"{f.relative_to(root)} ({f.stat().st_size / 1e3:.1f} kB)" for f in (runs_file, metrics_file)]
        lines.append(f"{n} runs of {e.experiment} → {', '.join(sizes)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedrun.report <table> [--export] [--check] [--out DIR]``."""
    import argparse
    import sys

    from fedrun.export import ExportError
    from fedrun.reports.spec import SpecError

    ap = argparse.ArgumentParser(prog="python -m fedrun.report",
                                 description="Build a results table (markdown + figures) from its spec "
                                             "conf/report/<table>.yaml and the committed run exports.")
    ap.add_argument("table", nargs="?", help="the spec's name (conf/report/<table>.yaml) or a .yaml path; "
                                              "none: list the specs")
    ap.add_argument("--root", default=None,
                    help="the repository (default: . if it has conf/report, else this checkout)")
    ap.add_argument("--out", default=None, help="write the files into this folder instead of their places in results/")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed file differs")
    ap.add_argument("--export", action="store_true",
                    help="first export the spec's MLflow experiments again, into the spec's export paths under "
                         "results/ (also with --out)")
    ap.add_argument("--uri", default=None, help="with --export: tracking URI (default: $MLFLOW_TRACKING_URI, else "
                                                "sqlite:///mlflow.db)")
    args = ap.parse_args(argv)
    root = Path(args.root) if args.root else default_root()
    if not args.table:
        for p in sorted((root / REPORT_DIR).glob("*.yaml")):
            print(p.stem)
        return 0
    try:
        if args.export:
            for line in refresh_exports(args.table, root, args.uri):
                print(f"fedrun report: exported {line}")
        files = report_files(args.table, root)
    except (SpecError, ExportError) as exc:
        print(f"fedrun report: error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        stale = [str(p) for p, data in files.items() if not (root / p).exists() or (root / p).read_bytes() != data]
        for p in stale:
            print(f"fedrun report: {p} differs from what the export gives", file=sys.stderr)
        if not stale:
            print(f"fedrun report: {', '.join(map(str, files))} up to date")
        return 1 if stale else 0
    for p, data in files.items():
        dest = Path(args.out) / p.name if args.out else root / p
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        print(f"fedrun report: wrote {dest} ({len(data) / 1e3:.1f} kB)")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
