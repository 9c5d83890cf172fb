"""``python -m fedrun.report [NAME …] [--check] [--export]``: build the results tables (markdown, figures, README.md's
claims blocks) from the run exports committed in ``results/`` (:mod:`fedrun.export`), with no MLflow; every report
when no NAME is given. ``--check`` writes nothing and exits 1 if a committed file differs from what the exports give;
``--export`` first exports the reports' MLflow experiments again.

One module per paper reads the exports with pandas (:mod:`fedrun.reports.common` holds what they share);
:data:`REPORTS`: every report by name → (the function giving its files from a repository root, its exports).
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Sequence

from fedrun.export import ExportError
from fedrun.reports import common, correlated, deploy, fbftl, fedsketch, foundation, fu21, kerkouche21, tallies

K, F = kerkouche21, fedsketch
REPORTS = {
    "kerkouche21_table3": (K.table3, [K.T3]),
    "kerkouche21_model_size": (K.model_size, [K.SIZE, K.T3]),
    "kerkouche21_server_lr": (K.server_lr, [K.LR, K.LOCAL]),
    "kerkouche21_stopping": (K.stopping, [K.T3, K.SIZE]),
    "kerkouche21_audit": (K.audit, [K.AUDIT]),
    "fu21_lending_club": (fu21.lending_club, [fu21.LC]),
    "fu21_lending_club_paper_unchecked": (partial(fu21.lending_club, sensitivity="paper_unchecked"), [fu21.LC]),
    "fu21_femnist": (fu21.femnist, [fu21.FEMNIST]),
    "fedsketch": (F.figures, [F.HOM, F.HET]),
    "fedsketch_tune": (F.tuning, [F.TUNE]),
    "fedsketch_gate_diag": (F.gate_diagnostics, [F.GATE]),
    "fedsketch_sketchedsgd_heavy": (F.sketchedsgd_heavy, [F.HEAVY]),
    "fbftl": (fbftl.table, [fbftl.FM, fbftl.MF]),
    "fbftl_tuned": (fbftl.tuned, [fbftl.TUNED, fbftl.FM, fbftl.MF]),
    "foundation_fl_std": (foundation.fl_std, [foundation.EXPORT]),
    "deploy": (deploy.deploy, [deploy.K, deploy.F]),
    "correlated": (correlated.correlated, [correlated.E]),
    "tallies": (tallies.tallies, []),   # last: it sums the verdicts the others write
}

#: the reports whose tested claims are one family (Holm over all of them): each paper's; any other report is its own
FAMILIES = (("kerkouche21_table3", "kerkouche21_model_size", "kerkouche21_stopping"),
            ("fu21_lending_club", "fu21_lending_club_paper_unchecked", "fu21_femnist"), ("fbftl", "fbftl_tuned"))


def save(data: str | bytes, path: str | Path) -> Path:
    """Write a generated table (text) or figure (bytes) to ``path``, creating its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
    return path


def default_root() -> Path:
    """The repository: the current directory if it has results/, else this checkout."""
    return Path.cwd() if (Path.cwd() / "results").is_dir() else Path(__file__).resolve().parents[2]


def report_files(name: str, root: str | Path | None = None) -> dict[Path, bytes]:
    """Every file of report ``name`` (paths relative to ``root``), built from the committed exports alone."""
    if name not in REPORTS:
        raise ValueError(f"no report {name!r}; reports: {', '.join(REPORTS)}")
    root = Path(root or default_root())
    common.FAMILY = None                # while the family's other reports give their raw p-values
    try:
        common.FAMILY = {o: raw_p(o, root) for f in FAMILIES if name in f for o in f if o != name}
        return REPORTS[name][0](root)
    finally:
        common.FAMILY = {}


def raw_p(name: str, root: Path) -> list[float]:
    """The p-values of report ``name``'s tested claims before any correction (none when its exports are missing)."""
    try:
        REPORTS[name][0](root)
    except common.Collected as c:
        return c.args[0]
    except ExportError:                 # e.g. a repository with one paper's exports only
        pass
    return []


def refresh_exports(name: str, root: Path, uri: str | None = None, allow_dirty: bool = False,
                    append: bool = False) -> list[str]:
    """Export the report's MLflow experiments again (runs from a dirty tree only with ``allow_dirty``; ``append``:
    keeping the committed runs the store lacks); a line each."""
    from fedrun.export import export
    from fedrun.tracking import resolve_uri

    lines = []
    for e in REPORTS[name][1]:
        out = root / e.path
        files = export(resolve_uri(uri), [e.experiment], out.parent, out.name, metrics=e.metrics, every=e.every,
                       allow_dirty=allow_dirty, append=append)
        lines.append(f"{files[2]} runs of {e.experiment} → " + ", ".join(
            f"{f.relative_to(root)} ({f.stat().st_size / 1e3:.1f} kB)" for f in files[:2]))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedrun.report``: write (or ``--check``) the files of the reports named, every report by default."""
    ap = argparse.ArgumentParser(prog="python -m fedrun.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"reports (default: all): {', '.join(REPORTS)}")
    ap.add_argument("--root", help="the repository (default: . if it has results/, else this checkout)")
    ap.add_argument("--out", help="write the files into this folder instead of their places")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed file differs")
    ap.add_argument("--export", action="store_true", help="first export the reports' MLflow experiments again")
    ap.add_argument("--uri", help="with --export: tracking URI (default: $MLFLOW_TRACKING_URI, else "
                                  "sqlite:///mlflow.db)")
    ap.add_argument("--allow-dirty", action="store_true", help="with --export: export runs made from a working tree "
                                                               "with uncommitted changes too")
    ap.add_argument("--append", action="store_true", help="with --export: keep the committed runs that the store "
                                                          "lacks (runs made earlier on another machine)")
    args = ap.parse_args(argv)
    root, stale = Path(args.root) if args.root else default_root(), []
    for name in args.names or list(REPORTS):
        try:
            for line in refresh_exports(name, root, args.uri, args.allow_dirty, args.append) if args.export else []:
                print(f"fedrun report: exported {line}")
            files = report_files(name, root)
        except (ExportError, ValueError, OSError) as exc:
            print(f"fedrun report: error: {name}: {exc}", file=sys.stderr)
            return 2
        for p, data in files.items():
            if not args.check:
                dest = save(data, Path(args.out) / p.name if args.out else root / p)
                print(f"fedrun report: wrote {dest} ({len(data) / 1e3:.1f} kB)")
            elif not (root / p).exists() or (root / p).read_bytes() != data:
                stale.append(p)
                print(f"fedrun report: {p} differs from what the export gives ({name})", file=sys.stderr)
    if args.check and not stale:
        print(f"fedrun report: {len(args.names or REPORTS)} report(s) up to date")
    return 1 if stale else 0
