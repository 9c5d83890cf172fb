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
    out["hashes"] = r.get("params.scheme.hashes", "–") if size else "–"
    return out


def latest(records: list[dict], by_lr: bool = False) -> list[dict]:
    """One record per (method, size, τ, sampler[, η, γ, hashes]): the most recent run."""
    best: dict[tuple, dict] = {}
    for r in sorted(records, key=lambda r: r["start_time"]):
        lrs = (r["lr"], r["server_lr"], r["hashes"]) if by_lr else None
        best[(r["method"], r["size"], r["tau"], r.get("params.sampler._target_"), lrs)] = r
    return list(best.values())


def load(uri: str, experiment: str, by_lr: bool = False) -> list[dict]:
    try:
        recs = mlflow_records(uri, experiment)
    except ValueError:
        return []
    recs = [r for r in recs if r["status"] in ("FINISHED", "FAILED")]
    return latest([annotate(r) for r in recs], by_lr)


def order_key(r: dict) -> tuple:
    rank = METHOD_ORDER.index(r["method"]) if r["method"] in METHOD_ORDER else 9
    return (r["tau"], r["size"] != "–", r["size"], rank, r["lr"], r["server_lr"], r["hashes"])


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
    Column("γ", "server_lr", "{:g}"),
    Column("hashes", "hashes"),
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


def _runs(rs: list[dict], method: str, size: str, tau: int) -> list[dict]:
    return [r for r in rs if r["method"] == method and r["size"] == size and r["tau"] == tau]


def _acc(rs: list[dict], method: str, size: str, tau: int) -> dict | None:
    """The setting's best run (a diverged run only when nothing else exists)."""
    runs = _runs(rs, method, size, tau)
    if not runs:
        return None
    return max(runs, key=lambda r: (not r["diverged"], 0 if math.isnan(r["final_accuracy"]) else r["final_accuracy"]))


def _pp(a: float, b: float) -> str:
    return f"{100 * (a - b):+.1f} pp"


def acc_at(r: dict | None, rnd: float) -> float:
    """Test accuracy of run r at its last evaluation <= round rnd (0 for a missing or diverged run)."""
    if r is None or r["diverged"]:
        return 0.0
    pts = [v for step, v in r.get("history", {}).get("test_accuracy", []) if step <= rnd]
    return pts[-1] if pts else r["final_accuracy"]


def compare(a: dict | None, others: list[dict | None]) -> tuple[float, list[float], int]:
    """Accuracies of a and of the others at their common last round (runs may have different lengths)."""
    runs = [r for r in [a, *others] if r is not None]
    rnd = int(min(r["rounds"] for r in runs)) if runs else 0
    return acc_at(a, rnd), [acc_at(o, rnd) for o in others], rnd


def claims(homo: list[dict], hetero: list[dict]) -> str:
    """The paper's claims checked on the test accuracy (computed, with the numbers)."""
    lines = ["## The paper's claims, checked on these runs", "",
             f"Test accuracy at the last round both compared runs reached (FedSKETCHGATE ran fewer rounds); "
             f"\"close\" / \"little loss\" = within {CLOSE_PP:g} percentage points (pp) of FedSGD (τ = 1, same "
             f"split); ✓ = the claim holds in that setting. A diverged run counts as accuracy 0; where a diverged "
             f"run was repeated with a smaller η the better of the two is used (both are in the tables).", ""]
    tick = {True: " ✓", False: " ✗"}
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
                ah, ao, rnd = compare(h, others)
                win = all(ah >= a for a in ao)
                wins += win
                cells.append(f"{size} τ={tau} (round {rnd}): HEAPRIX {ah:.4f} vs " +
                             ", ".join(f"{NAMES[o['method']]} {a:.4f}" for o, a in zip(others, ao)) + tick[win])
        if cells:
            lines += [f"1. **HEAPRIX best among sketches ({title})**: {wins} of {len(cells)} settings — "
                      + "; ".join(cells) + ".", ""]
    # 2. PRIVIX at (20, 40), τ = 5
    for title, rs in (("homogeneous", homo), ("heterogeneous", hetero)):
        p, f, h = (_acc(rs, "fs-privix", "20x40", 5), _acc(rs, "fedsgd", "–", 1), _acc(rs, "fs-heaprix", "20x40", 5))
        if p is None or f is None:
            continue
        parts = [f"η = {r['lr']:g}: {status(r)}" for r in _runs(rs, "fs-privix", "20x40", 5) if r["diverged"]]
        if not p["diverged"]:
            ap, (af, ah), rnd = compare(p, [f, h])
            parts.append(f"η = {p['lr']:g}: accuracy {ap:.4f} at round {rnd} (FedSGD {af:.4f}, FS-HEAPRIX {ah:.4f})")
        lines += [f"2. **PRIVIX poor or diverging at (20, 40) with τ = 5 ({title})**: " + "; ".join(parts) + ".", ""]
    # 3. (50, 100) close to FedSGD
    for title, rs, fam in (("homogeneous", homo, "fs"), ("heterogeneous", hetero, "fs")):
        f = _acc(rs, "fedsgd", "–", 1)
        cells = []
        for tau in (1, 2, 5):
            for u in ("heaprix", "privix"):
                r = _acc(rs, f"{fam}-{u}", "50x100", tau)
                if r is not None and f is not None:
                    a, (af,), rnd = compare(r, [f])
                    ok = a >= af - CLOSE_PP / 100
                    cells.append(f"{NAMES[r['method']]} τ={tau}: {a:.4f} ({_pp(a, af)}){tick[ok]}")
        if cells:
            lines += [f"3. **(50, 100) close to FedSGD ({title}; FedSGD {acc_at(f, 1e9):.4f})**: "
                      + "; ".join(cells) + ".", ""]
    # 4. >= 12x compression with little accuracy loss
    for title, rs in (("homogeneous", homo), ("heterogeneous", hetero)):
        f = _acc(rs, "fedsgd", "–", 1)
        if f is None:
            continue
        ok = []
        for r in rs:
            if r["method"] in ("fedsgd",) or r["diverged"] or not r["compression"] >= 12:
                continue
            a, (af,), rnd = compare(r, [f])
            if a >= af - CLOSE_PP / 100:
                ok.append(f"{r['name']} τ={r['tau']} ({r['compression']:.1f}×, {_pp(a, af)} at round {rnd})")
        lines += [f"4. **≥ 12× uplink compression with little accuracy loss ({title})**: "
                  + ("holds for " + "; ".join(ok) if ok else "no sketch run is within "
                     f"{CLOSE_PP:g} pp of FedSGD") + ".", ""]
    # 5. the heterogeneous-only statements
    f = _acc(hetero, "fedsgd", "–", 1)
    if f is not None:
        cells = []
        for key in ("sketchedsgd", "gate-privix", "gate-heaprix"):
            for size in ("20x40", "50x100"):
                r = _acc(hetero, key, size, 1)
                if r is not None:
                    a, (af,), rnd = compare(r, [f])
                    cells.append(f"{r['name']}: {a:.4f} vs FedSGD {af:.4f} at round {rnd} ({_pp(a, af)})")
        if cells:
            lines += ["5. **Heterogeneous, τ = 1: SketchedSGD very poor, both FedSKETCHGATE variants similar to FedSGD "
                      "even at (20, 40)**: " + "; ".join(cells) + ".", ""]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ figures
def histories(uri: str, run_id: str, keys: tuple[str, ...]) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient
    from fedrun.tracking import metric_name

    client = MlflowClient(tracking_uri=uri)
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, metric_name(k))) for k in keys}


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
            h = r.get("history") or histories(uri, r["run_id"], ("train_loss", "test_accuracy"))
            style = "--" if r["size"] == "20x40" else "-"
            label = r["name"] + (" [τ=1]" if r["method"] in ("fedsgd", "sketchedsgd") and tau != 1 else "")
            label += f" η={r['lr']:g}" + (f" γ={r['server_lr']:g}" if r["server_lr"] != 1 else "")
            label += ", per-round hashes" if r["hashes"] == "per_round" else ""
            if r["diverged"]:
                label += " (diverged)"
            for row, key in enumerate(("train_loss", "test_accuracy")):
                pts = h[key]
                if pts:
                    axes[row][col].plot(*zip(*pts), style, color=colors.get(r["method"], "gray"), label=label,
                                        marker="." if key == "test_accuracy" else None,
                                        linewidth=0.8 if r["diverged"] else 1.4, alpha=0.35 if r["diverged"] else 1)
        axes[0][col].set_title(f"τ = {tau}")
        axes[0][col].set_ylabel("training loss (clients' local batches)")
        axes[1][col].set_ylabel("test accuracy")
        axes[1][col].set_xlabel("round")
        axes[0][col].set_yscale("log")
        axes[0][col].set_ylim(top=10)  # diverging runs leave the plot (faint lines, "(diverged)" in the legend)
        for row in (0, 1):
            axes[row][col].grid(alpha=0.3)
    handles, labels = axes[1][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(title + "  (dashed: sketch 20×40, solid: 50×100; faint: diverged)", fontsize=10)
    fig.tight_layout(rect=(0, 0.03 + 0.022 * math.ceil(len(labels) / 3), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def gate_diagnostics(uri: str) -> str | None:
    """FedSKETCHGATE's tracking terms per round (experiment fedsketch-gate-diagnostics), as markdown."""
    try:
        recs = [r for r in mlflow_records(uri, "fedsketch-gate-diagnostics") if r["status"] in ("FINISHED", "FAILED")]
    except ValueError:
        return None
    if not recs:
        return None
    shown = (1, 2, 3, 4, 5, 10, 15, 20)
    lines = ["# FedSKETCHGATE diagnostics (generated by scripts/fedsketch_report.py)", "",
             "Heterogeneous split (1–2 classes per worker), 10 workers all active, τ = 1, γ = 1, 20 rounds "
             "(`experiment=fedsketch_gate_diag`, commands in README.md). Per round: ‖mean_j c_j‖ / RMS_j ‖c_j‖ "
             "(metrics `gate_c_mean_norm`, `gate_c_rms_norm`); with an exact decoder c_j tracks the drift "
             "g_j − ḡ and its mean stays 0.", "",
             "| decoder | hashes | η | status | " + " | ".join(f"round {k}" for k in shown) + " |",
             "|" + "---|" * (4 + len(shown))]
    for r in sorted(recs, key=lambda r: r["start_time"]):
        h = histories(uri, r["run_id"], ("gate_c_mean_norm", "gate_c_rms_norm"))
        mean, rms = dict(h["gate_c_mean_norm"]), dict(h["gate_c_rms_norm"])
        unsketch = r.get("params.scheme.unsketch")
        heavy = r.get("params.scheme.num_heavy")
        dec = f"{unsketch.upper()} {r['params.scheme.rows']}×{r['params.scheme.cols']}"
        if unsketch == "heaprix" and heavy not in (None, "None") and int(heavy) >= int(r["tags.fedrun.num_parameters"]):
            dec += f", m = {heavy} = d (exact)"
        reason = "ok" if r["status"] == "FINISHED" else "diverged" if "diverged" in \
            r.get("tags.fedrun.failure_reason", "") else r["status"]
        cells = [f"{mean[k]:.2g} / {rms[k]:.2g}" if k in mean else "–" for k in shown]
        lines.append(f"| {dec} | {r.get('params.scheme.hashes', 'fixed')} | {r['params.lr']} | {reason} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


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
    tune = load(uri, "fedsketch-tune", by_lr=True)
    figs = {k: load(uri, exp, by_lr=True) for k, (exp, _) in FIGURES.items()}
    parts = ["# Paper 002 (FedSKETCH) — tables generated from MLflow", "",
             f"Generated by `.venv/bin/python scripts/fedsketch_report.py` from `{uri}`; see README.md in this folder "
             f"for the setting, the commands, their run times and every reduction against the paper.", ""]
    if tune:
        parts += ["## Learning-rate tuning (τ = 1, homogeneous, 30 rounds; final test accuracy; γ = 1)", "",
                  tuning_table(tune)]
    for rs in figs.values():
        for r in rs:
            r["history"] = histories(uri, r["run_id"], ("train_loss", "test_accuracy"))
    for key, (exp, title) in FIGURES.items():
        rs = sorted(figs[key], key=order_key)
        if not rs:
            continue
        parts += [f"## {title}", "", f"MLflow experiment `{exp}`; curves: `{key}_{exp.split('-')[1]}.png`.", "",
                  markdown_table(rs, RESULT_COLUMNS)]
        groups: dict[str, list[str]] = {}
        for r in rs:
            if r["eps_status"]:
                val = r.get("metrics.sketch_epsilon")
                shown = f"ε = {val:.4g} (valid)" if val is not None else r["eps_status"]
                if r["name"] not in groups.setdefault(shown, []):
                    groups[shown].append(r["name"])
        if groups:
            parts += ["`sketch_epsilon` (Theorem 1, tag `sketch_epsilon_status` of the runs):", ""]
            parts += [f"- {', '.join(names)}: {shown}" for shown, names in groups.items()]
            parts.append("")
        if not args.no_plots:
            plot_figure(uri, rs, title, args.out_dir / f"{key}_{exp.split('-')[1]}.png")
    parts.append(claims(figs["figure1"], figs["figure2"]))
    diag = gate_diagnostics(uri)
    if diag:
        (args.out_dir / "gate_diagnostics.md").write_text(diag)
    text = "\n".join(parts)
    (args.out_dir / "fedsketch.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
