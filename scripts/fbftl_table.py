#!/usr/bin/env python
"""Paper 003's comparison table (FL, FTL-full, FTL-c, FbFTL) from finished fedrun runs in MLflow.

One table per source → target pair, in the layout of the paper's comparison: upload batches, parameters
per batch, uplink per batch, total uplink, total downlink, test accuracy; measured bytes beside the paper's
formulas (fedrun.transfer.split), plus the rounds and uplink each scheme needed to first reach a common
target accuracy (the paper's I^FL vs I^FTL argument). The newest finished run per (pair, scheme) is used.

    python scripts/fbftl_table.py --experiment fbftl --out results/fbftl/comparison.md \\
        --command "OMP_NUM_THREADS=1 fedrun -m experiment=fbftl_femnist_mnist scheme=fl,ftl_full,ftl_c,fbftl"

The pure part (:func:`build_rows`, :func:`render`) takes records (fedrun.report.mlflow_records) and metric
histories; :func:`main` is the thin MLflow reader.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from fedrun.report import Column, markdown_table, mlflow_records, save
from fedrun.tracking import resolve_uri

SCHEMES = ("fl", "ftl_full", "ftl_c", "fbftl")
LABELS = {"fl": "FL", "ftl_full": "FTL-full", "ftl_c": "FTL-c", "fbftl": "FbFTL"}
HISTORY_KEYS = ("test_accuracy", "uplink_bytes_total")
DATASET_NAMES = {"femnist": "FEMNIST", "mnist": "MNIST", "fashion_mnist": "Fashion-MNIST", "imagenet": "ImageNet"}


def bits(value: float | None) -> str:
    """A bit count with an SI prefix, as the paper writes payloads (6.6 Gb, 599 Tb)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}b"
    return f"{value:.0f} b"


def pair_of(rec: dict[str, Any]) -> str:
    src = rec.get("params.scheme.source_dataset", "?")
    return f"{DATASET_NAMES.get(src, src)} → {DATASET_NAMES.get(rec.get('tags.dataset', '?'), rec.get('tags.dataset'))}"


def latest_runs(records: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(pair, scheme) → the newest finished record of one of paper 003's schemes."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for rec in sorted(records, key=lambda r: r.get("start_time", 0)):
        scheme = rec.get("tags.scheme")
        if rec.get("status") == "FINISHED" and scheme in SCHEMES:
            out[(pair_of(rec), scheme)] = rec
    return out


def first_reaching(history: dict[str, list[tuple[int, float]]], target: float) -> tuple[int, float] | None:
    """(round, cumulative uplink bytes) at the first evaluation with test accuracy ≥ ``target``, or None."""
    uplink = dict(history.get("uplink_bytes_total", []))
    for step, acc in sorted(history.get("test_accuracy", [])):
        if acc >= target - 1e-12:
            return step, uplink.get(step, math.nan)
    return None


def build_rows(records: list[dict[str, Any]], histories: dict[str, dict[str, list[tuple[int, float]]]],
               target: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """pair → table rows (one per scheme, in the paper's order), with the pair's target accuracy attached.

    ``histories[run_id][key]`` = [(step, value), …] for :data:`HISTORY_KEYS`. The target accuracy is
    ``target`` or, if None, the lowest best accuracy among the pair's runs (so every scheme reaches it).
    """
    runs = latest_runs(records)
    pairs: dict[str, list[dict[str, Any]]] = {}
    for pair in sorted({p for p, _ in runs}):
        recs = [runs[(pair, s)] for s in SCHEMES if (pair, s) in runs]
        goal = target if target is not None else min(r.get("metrics.best_test_accuracy", math.nan) for r in recs)
        rows = []
        for rec in recs:
            m = lambda k: rec.get(f"metrics.{k}", math.nan)  # noqa: E731
            reach = first_reaching(histories.get(rec["run_id"], {}), goal)
            rows.append({
                "scheme": LABELS[rec["tags.scheme"]],
                "upload_batches": m("upload_batches_total"),
                "params_per_batch": m("params_per_batch"),
                "uplink_bits_per_batch": 8 * m("uplink_bytes_per_batch"),
                "uplink_bits": 8 * m("uplink_bytes_total"),
                "paper_uplink_bits": m("paper_uplink_bits"),
                "downlink_bits": 8 * m("downlink_bytes_total"),
                "broadcast_bits": 8 * m("downlink_broadcast_bytes_total"),
                "paper_downlink_bits": m("paper_downlink_bits"),
                "test_accuracy": m("test_accuracy"),
                "best_test_accuracy": m("best_test_accuracy"),
                "rounds": m("rounds_completed"),
                "target": goal,
                "target_round": None if reach is None else reach[0],
                "target_uplink_bits": None if reach is None else 8 * reach[1],
                "source_test_accuracy": m("source_test_accuracy"),
                "source_train_seconds": m("source_train_seconds"),
                "label_leakage_bits": m("label_leakage_bits"),
                "label_leakage_expected_bits": m("label_leakage_expected_bits"),
                "label_prior_bits": m("label_prior_bits"),
                "record": rec,
            })
        pairs[pair] = rows
    return pairs


COLUMNS = [
    Column("scheme", "scheme"),
    Column("upload batches", "upload_batches", "{:,.0f}"),
    Column("parameters per batch", "params_per_batch", "{:,.0f}"),
    Column("uplink per batch", lambda r: bits(r["uplink_bits_per_batch"])),
    Column("total uplink (measured)", lambda r: bits(r["uplink_bits"])),
    Column("total uplink (paper formula)", lambda r: bits(r["paper_uplink_bits"])),
    Column("total downlink, per receiving client (measured)", lambda r: bits(r["downlink_bits"])),
    Column("downlink broadcast (measured)", lambda r: bits(r["broadcast_bits"])),
    Column("downlink broadcast (paper formula)", lambda r: bits(r["paper_downlink_bits"])),
    Column("test accuracy (final)", "test_accuracy", "{:.4f}"),
    Column("best test accuracy", "best_test_accuracy", "{:.4f}"),
    Column("rounds", "rounds", "{:.0f}"),
    Column("first round ≥ target", "target_round", "{}"),
    Column("uplink to target", lambda r: bits(r["target_uplink_bits"])),
]


def _setting(rows: list[dict[str, Any]]) -> str:
    rec = rows[0]["record"]
    p = lambda k: rec.get(f"params.{k}", "?")  # noqa: E731
    src = next((r for r in rows if not math.isnan(r["source_test_accuracy"])), None)
    fb = next((r for r in rows if r["scheme"] == "FbFTL"), None)
    parts = [f"model {rec.get('tags.model')} cut at body index {p('scheme.cut_layer')} "
             f"({int(fb['params_per_batch']) if fb else '?'} features per sample)",
             f"{p('num_clients')} clients (iid), C = {p('sample_rate')} (Poisson), "
             f"{p('local_mode')} × {p('local_steps')} local steps, lr {p('lr')}, seed {p('seed')}",
             f"FbFTL server: batch {p('scheme.server_batch_size') if fb is None else fb['record'].get('params.scheme.server_batch_size')}, "
             f"lr {fb['record'].get('metrics.server_lr') if fb else '?'}, 1 epoch per round"]
    if src is not None:
        parts.append(f"source model test accuracy on {src['record'].get('params.scheme.source_dataset')}: "
                     f"{src['source_test_accuracy']:.4f} (trained in {src['source_train_seconds']:.0f} s, "
                     f"{p('scheme.source_epochs')} epochs)")
    parts.append(f"target accuracy for the last two columns: {rows[0]['target']:.4f}")
    if fb is not None and not math.isnan(fb["label_leakage_bits"]):
        parts.append(f"label leakage of this run's shuffled upload (eq. (19), uniform prior): observed "
                     f"{fb['label_leakage_bits']:.3f} bits, expected {fb['label_leakage_expected_bits']:.3f} bits, "
                     f"of a prior uncertainty of {fb['label_prior_bits']:.3f} bits per client")
    return "; ".join(parts) + "."


def render(pairs: dict[str, list[dict[str, Any]]], command: str = "", notes: str = "") -> str:
    out = ["# Paper 003: FL, FTL-full, FTL-c and FbFTL — uplink, downlink and test accuracy", ""]
    if command:
        out += ["Command(s):", "", "```", command.strip(), "```", ""]
    for pair, rows in pairs.items():
        out += [f"## {pair}", "", _setting(rows), "", markdown_table(rows, COLUMNS)]
    if notes:
        out += [notes.strip(), ""]
    return "\n".join(out)


def read_histories(tracking_uri: str, run_ids: list[str]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    from mlflow.tracking import MlflowClient
    from fedrun.tracking import metric_name

    client = MlflowClient(tracking_uri=tracking_uri)
    return {rid: {k: [(m.step, m.value) for m in client.get_metric_history(rid, metric_name(k))]
                  for k in HISTORY_KEYS} for rid in run_ids}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    ap.add_argument("--experiment", default="fbftl")
    ap.add_argument("--target", type=float, default=None,
                    help="target test accuracy (default: per pair, the lowest best accuracy of its runs)")
    ap.add_argument("--command", default="", help="the command(s) that produced the runs")
    ap.add_argument("--notes", type=Path, default=None, help="markdown file appended below the tables")
    ap.add_argument("--out", type=Path, default=None, help="write markdown here (default: stdout)")
    args = ap.parse_args(argv)
    uri = resolve_uri(args.tracking_uri)
    records = mlflow_records(uri, args.experiment)
    runs = latest_runs(records)
    if not runs:
        print(f"no finished fl/ftl_full/ftl_c/fbftl runs in experiment {args.experiment!r} at {uri}", file=sys.stderr)
        return 1
    histories = read_histories(uri, [r["run_id"] for r in runs.values()])
    pairs = build_rows(list(runs.values()), histories, args.target)
    text = render(pairs, args.command, args.notes.read_text() if args.notes else "")
    if args.out:
        save(text, args.out)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["COLUMNS", "bits", "build_rows", "first_reaching", "latest_runs", "pair_of", "render"]
