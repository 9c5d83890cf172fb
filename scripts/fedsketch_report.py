#!/usr/bin/env python
"""Paper 002 (FedSKETCH) results from MLflow: tables, claim checks and the Figure 1 / Figure 2 curves.

Reads the runs of ``scripts/fedsketch_runs.py`` (experiments ``fedsketch-tune``, ``fedsketch-homogeneous``,
``fedsketch-heterogeneous``) and writes ``results/fedsketch/fedsketch.md`` plus ``figure1_homogeneous.png`` and
``figure2_heterogeneous.png``. Every number comes from the tracking store; nothing is typed in.

    .venv/bin/python scripts/fedsketch_report.py                  # default store: sqlite:///mlflow.db
    .venv/bin/python scripts/fedsketch_report.py --out-dir results/fedsketch --tracking-uri sqlite:///mlflow.db
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fedsketch_runs import LR_GRID, method_of  # noqa: E402

from fedrun.report import Column, fmt, markdown_table, mlflow_records  # noqa: E402

FIGURES = {"figure1": ("fedsketch-homogeneous", "Figure 1 — homogeneous (i.i.d.) split"),
           "figure2": ("fedsketch-heterogeneous", "Figure 2 — heterogeneous split (1–2 classes per worker)")}
METHOD_ORDER = ["fedsgd", "sketchedsgd", "fs-privix", "fs-heaprix", "gate-privix", "gate-heaprix"]
NAMES = {"fedsgd": "FedSGD", "sketchedsgd": "SketchedSGD", "fs-privix": "FS-PRIVIX", "fs-heaprix": "FS-HEAPRIX",
         "gate-privix": "FSGATE-PRIVIX", "gate-heaprix": "FSGATE-HEAPRIX"}
CLOSE_PP = 2.0  # "close to FedSGD" / "little accuracy loss": within this many percentage points


# ------------------------------------------------------------------------------------------ records
def _f(r: dict, key: str) -> float:
    v = r.get(key)
    return float(v) if v is not None else math.nan


def annotate(r: dict[str, Any]) -> dict[str, Any]:
    """Derived fields of one run record (pure)."""
    label = method_of(r)
    key, _, size = label.partition(" ")
    out = dict(r)
    out["method"] = key
    out["size"] = size or "–"
    out["name"] = NAMES.get(key, key) + (f" ({size.replace('x', ', ')})" if size else "")
    out["tau"] = int(r.get("params.local_steps", 0))
    out["lr"] = float(r.get("params.lr", "nan"))
    out["server_lr"] = float(r.get("params.scheme.server_lr", "nan"))
    out["clients"] = _f(r, "metrics.clients")
    rounds = _f(r, "metrics.rounds_completed")
    if math.isnan(rounds):  # a diverged run has no summary: rounds logged = total bytes / bytes per round
        rounds = round(_f(r, "metrics.uplink_bytes_total") / _f(r, "metrics.uplink_bytes"))
    out["rounds"] = rounds
    out["final_accuracy"] = _f(r, "metrics.test_accuracy")
    out["best_accuracy"] = _f(r, "metrics.best_test_accuracy")
    up, down = _f(r, "metrics.uplink_bytes"), _f(r, "metrics.downlink_bytes")
    out["uplink_total"] = _f(r, "metrics.uplink_bytes_total")
    out["downlink_total"] = _f(r, "metrics.downlink_bytes_total")
    out["uplink_per_client_round"] = up / out["clients"] if out["clients"] else math.nan
    out["downlink_round"] = down
    n = float(r.get("tags.fedrun.num_parameters", "nan"))
    out["num_parameters"] = n
    out["compression"] = 4 * n / out["uplink_per_client_round"] if out["uplink_per_client_round"] else math.nan
    if size:
        t, k = (int(v) for v in size.split("x"))
        out["paper_ratio"] = n / (t * k)
    else:
        out["paper_ratio"] = 1.0
    out["diverged"] = r.get("status") == "FAILED" and "diverged" in r.get("tags.fedrun.failure_reason", "")
    out["eps_status"] = r.get("tags.sketch_epsilon_status", "")
    return out


def latest(records: list[dict]) -> list[dict]:
    """One record per (method, size, τ, sampler): the most recent run."""
    best: dict[tuple, dict] = {}
    for r in sorted(records, key=lambda r: r["start_time"]):
        best[(r["method"], r["size"], r["tau"], r.get("params.sampler._target_"))] = r
    return list(best.values())


def load(uri: str, experiment: str) -> list[dict]:
    try:
        recs = mlflow_records(uri, experiment)
    except ValueError:
        return []
    recs = [r for r in recs if r["status"] in ("FINISHED", "FAILED")]
    return latest([annotate(r) for r in recs])


def order_key(r: dict) -> tuple:
    return (r["tau"], r["size"] != "–", r["size"], METHOD_ORDER.index(r["method"]) if r["method"] in METHOD_ORDER else 9)


# ------------------------------------------------------------------------------------------ tables
def status(r: dict) -> str:
    if r["diverged"]:
        return f"diverged (NaN) after round {r['rounds']:.0f}"
    return "ok" if r["status"] == "FINISHED" else r["status"]


RESULT_COLUMNS = [
    Column("method", "name"),
    Column("τ", "tau"),
    Column("clients/round", "clients", "{:.0f}"),
    Column("η", "lr", "{:g}"),
    Column("final acc.", "final_accuracy", "{:.4f}"),
    Column("best acc.", "best_accuracy", "{:.4f}"),
    Column("rounds", "rounds", "{:.0f}"),
    Column("uplink MB (total)", lambda r: r["uplink_total"] / 1e6, "{:.2f}"),
    Column("downlink MB (total)", lambda r: r["downlink_total"] / 1e6, "{:.2f}"),
    Column("uplink B/client/round", "uplink_per_client_round", "{:,.0f}"),
    Column("uplink compression (measured)", "compression", "{:.1f}×"),
    Column("d/(t·k)", "paper_ratio", "{:.1f}×"),
    Column("status", status),
]


def tuning_table(records: list[dict]) -> str:
    """Method × η grid of final test accuracy after the tuning runs."""
    by: dict[str, dict[float, dict]] = {}
    for r in records:
        by.setdefault(r["name"], {})[r["lr"]] = r
    cols = [Column("method", "method")] + [Column(f"η = {lr:g}", f"lr_{lr:g}") for lr in LR_GRID] + \
        [Column("chosen η", "chosen", "{:g}")]
    rows = []
    for name, per in by.items():
        row: dict[str, Any] = {"method": name}
        best = None
        for lr in LR_GRID:
            r = per.get(lr)
            if r is None:
                continue
            row[f"lr_{lr:g}"] = "diverged" if r["diverged"] else fmt(r["final_accuracy"], "{:.4f}")
            if not r["diverged"] and not math.isnan(r["final_accuracy"]) and \
                    (best is None or r["final_accuracy"] > best[0]):
                best = (r["final_accuracy"], lr)
        row["chosen"] = best[1] if best else None
        row["order"] = min((order_key(r) for r in per.values()), default=(9,))
        rows.append(row)
    return markdown_table(rows, cols, sort_by=lambda r: r["order"])


def _acc(rs: list[dict], method: str, size: str, tau: int) -> dict | None:
    for r in rs:
        if r["method"] == method and r["size"] == size and r["tau"] == tau:
            return r
    return None


def _pp(a: float, b: float) -> str:
    return f"{100 * (a - b):+.1f} pp"


def claims(homo: list[dict], hetero: list[dict]) -> str:
    """The paper's claims checked on the final-round test accuracy (computed, with the numbers)."""
    lines = ["## The paper's claims, checked on these runs", "",
             f"Measured on the final-round test accuracy; \"close\" / \"little loss\" = within {CLOSE_PP:g} percentage "
             f"points (pp) of FedSGD (τ = 1, same split). A diverged run counts as accuracy 0.", ""]

    def acc(r):
        return 0.0 if r is None or r["diverged"] else r["final_accuracy"]

    # 1. HEAPRIX best among sketches
    for title, rs, fam in (("homogeneous", homo, "fs"), ("heterogeneous", hetero, "fs"),
                           ("heterogeneous, FedSKETCHGATE", hetero, "gate")):
        cells, wins = [], 0
        for size in ("20x40", "50x100"):
            for tau in (1, 2, 5):
                h, p = _acc(rs, f"{fam}-heaprix", size, tau), _acc(rs, f"{fam}-privix", size, tau)
                if h is None or p is None:
                    continue
                others = [p] + ([_acc(rs, "sketchedsgd", size, 1)] if tau == 1 else [])
                others = [o for o in others if o is not None]
                win = all(acc(h) >= acc(o) for o in others)
                wins += win
                cells.append(f"{size} τ={tau}: HEAPRIX {acc(h):.4f} vs " +
                             ", ".join(f"{NAMES[o['method']]} {acc(o):.4f}" for o in others) +
                             (" ✓" if win else " ✗"))
        if cells:
            lines += [f"1. **HEAPRIX best among sketches ({title})**: {wins} of {len(cells)} settings — "
                      + "; ".join(cells) + ".", ""]
    # 2. PRIVIX at (20, 40), τ = 5
    for title, rs in (("homogeneous", homo), ("heterogeneous", hetero)):
        p, f = _acc(rs, "fs-privix", "20x40", 5), _acc(rs, "fedsgd", "–", 1)
        if p is not None and f is not None:
            what = status(p) if p["diverged"] else f"final accuracy {acc(p):.4f} ({_pp(acc(p), acc(f))} vs FedSGD)"
            h = _acc(rs, "fs-heaprix", "20x40", 5)
            extra = f", HEAPRIX at the same setting {acc(h):.4f}" if h is not None else ""
            lines += [f"2. **PRIVIX poor or diverging at (20, 40) with τ = 5 ({title})**: {what}{extra}.", ""]
    # 3. (50, 100) close to FedSGD, and 4. compression
    for title, rs, fam in (("homogeneous", homo, "fs"), ("heterogeneous", hetero, "fs"),
                           ("heterogeneous, FedSKETCHGATE", hetero, "gate")):
        f = _acc(rs, "fedsgd", "–", 1)
        if f is None:
            continue
        cells = []
        for tau in (1, 2, 5):
            h = _acc(rs, f"{fam}-heaprix", "50x100", tau)
            if h is not None:
                gap = acc(h) - acc(f)
                cells.append(f"τ={tau}: {acc(h):.4f} ({_pp(acc(h), acc(f))}, uplink {h['compression']:.1f}× "
                             f"smaller per client and round){' ✓' if gap >= -CLOSE_PP / 100 else ' ✗'}")
        if cells:
            lines += [f"3. **HEAPRIX (50, 100) close to FedSGD ({title}; FedSGD {acc(f):.4f})**: " + "; ".join(cells)
                      + ".", ""]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ figures
def histories(uri: str, run_id: str, keys: tuple[str, ...]) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def plot_figure(uri: str, records: list[dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    taus = sorted({r["tau"] for r in records if r["method"].startswith(("fs-", "gate-"))}) or [1]
    fig, axes = plt.subplots(2, len(taus), figsize=(4.6 * len(taus), 7), squeeze=False)
    colors = {"fedsgd": "black", "sketchedsgd": "tab:green", "fs-privix": "tab:blue", "fs-heaprix": "tab:red",
              "gate-privix": "tab:cyan", "gate-heaprix": "tab:orange"}
    for col, tau in enumerate(taus):
        for r in sorted(records, key=order_key):
            if r["method"] in ("fedsgd", "sketchedsgd"):
                if r["tau"] != 1:
                    continue
            elif r["tau"] != tau:
                continue
            h = histories(uri, r["run_id"], ("train_loss", "test_accuracy"))
            style = "--" if r["size"] == "20x40" else "-"
            label = r["name"] + (" [τ=1]" if r["method"] in ("fedsgd", "sketchedsgd") and tau != 1 else "")
            if r["diverged"]:
                label += " (diverged)"
            for row, key in enumerate(("train_loss", "test_accuracy")):
                pts = h[key]
                if pts:
                    axes[row][col].plot(*zip(*pts), style, color=colors.get(r["method"], "gray"), label=label,
                                        marker="." if key == "test_accuracy" else None, linewidth=1.2)
        axes[0][col].set_title(f"τ = {tau}")
        axes[0][col].set_ylabel("training loss (clients' local batches)")
        axes[1][col].set_ylabel("test accuracy")
        axes[1][col].set_xlabel("round")
        axes[0][col].set_yscale("log")
        for row in (0, 1):
            axes[row][col].grid(alpha=0.3)
    axes[1][0].legend(fontsize=7, loc="lower right")
    fig.suptitle(title + "  (dashed: sketch 20×40, solid: 50×100)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--out-dir", type=Path, default=Path("results/fedsketch"))
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    from fedrun.tracking import resolve_uri

    uri = resolve_uri(args.tracking_uri)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    tune = load(uri, "fedsketch-tune")
    figs = {k: load(uri, exp) for k, (exp, _) in FIGURES.items()}
    parts = ["# Paper 002 (FedSKETCH) — tables generated from MLflow", "",
             f"Generated by `.venv/bin/python scripts/fedsketch_report.py` from `{uri}`; see README.md in this folder "
             f"for the setting, the commands, their run times and every reduction against the paper.", ""]
    if tune:
        parts += ["## Learning-rate tuning (τ = 1, homogeneous, 30 rounds; final test accuracy; γ = 1)", "",
                  tuning_table(tune)]
    for key, (exp, title) in FIGURES.items():
        rs = sorted(figs[key], key=order_key)
        if not rs:
            continue
        parts += [f"## {title}", "", f"MLflow experiment `{exp}`; curves: `{key}_{exp.split('-')[1]}.png`.", "",
                  markdown_table(rs, RESULT_COLUMNS)]
        eps = sorted({r["eps_status"] for r in rs if r["eps_status"]})
        if eps:
            parts += ["`sketch_epsilon` (Theorem 1) per sketch setting, as tagged on the runs:", ""]
            seen = set()
            for r in rs:
                if r["eps_status"] and (r["method"], r["size"]) not in seen:
                    seen.add((r["method"], r["size"]))
                    val = r.get("metrics.sketch_epsilon")
                    shown = f"ε = {val:.4g}" if val is not None else r["eps_status"]
                    parts.append(f"- {r['name']}: {shown}")
            parts.append("")
        if not args.no_plots:
            plot_figure(uri, rs, title, args.out_dir / f"{key}_{exp.split('-')[1]}.png")
    parts.append(claims(figs["figure1"], figs["figure2"]))
    text = "\n".join(parts)
    (args.out_dir / "fedsketch.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
