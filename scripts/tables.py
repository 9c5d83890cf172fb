#!/usr/bin/env python
"""Markdown table of finished fedrun runs read from MLflow (thin CLI over fedrun.report).

Example (the FL-STD sweep in results/foundation/fl_std.md):
    python scripts/tables.py --experiment foundation-fl-std --out results/foundation/fl_std.md \
        --command "fedrun -m dataset=mnist,fashion_mnist ..."
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedrun.report import Column, markdown_table, mlflow_records, save, with_command
from fedrun.tracking import resolve_uri

DEFAULT_COLUMNS = [
    Column("scheme", "tags.scheme"),
    Column("dataset", "tags.dataset"),
    Column("model", "tags.model"),
    Column("partition", "tags.partition"),
    Column("seed", "params.seed"),
    Column("rounds", "metrics.rounds_completed", "{:.0f}"),
    Column("best accuracy", "metrics.best_test_accuracy", "{:.4f}"),
    Column("best MSE", "metrics.best_test_mse", "{:.4f}"),
    Column("best round", "metrics.best_round", "{:.0f}"),
    Column("uplink MB at best", lambda r: r.get("metrics.uplink_bytes_at_best", float("nan")) / 1e6, "{:.2f}"),
    Column("cost (Mbit, paper formula)", lambda r: r.get("metrics.cost_bits_at_best", float("nan")) / 1e6, "{:.2f}"),
    Column("ε", "metrics.epsilon_final", "{:.3f}"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    ap.add_argument("--experiment", default="fedrun")
    ap.add_argument("--filter", default="", help="MLflow search filter, e.g. \"tags.scheme = 'fl_std'\"")
    ap.add_argument("--title", default="Runs")
    ap.add_argument("--command", default="", help="the command that produced the runs (printed above the table)")
    ap.add_argument("--out", type=Path, default=None, help="write markdown here (default: stdout)")
    args = ap.parse_args(argv)
    records = [r for r in mlflow_records(resolve_uri(args.tracking_uri), args.experiment, args.filter)
               if r["status"] == "FINISHED"]
    if not records:
        print(f"no finished runs in experiment {args.experiment!r}", file=sys.stderr)
        return 1
    cols = [c for c in DEFAULT_COLUMNS if any(c.cell(r) != "–" for r in records)]
    table = markdown_table(records, cols, sort_by=lambda r: (r.get("tags.dataset", ""), r.get("params.seed", "")))
    text = with_command(args.title, args.command, table) if args.command else table
    if args.out:
        save(text, args.out)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
