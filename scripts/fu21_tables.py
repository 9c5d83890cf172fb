#!/usr/bin/env python
"""Paper 001 (Fu et al.) tables and curves from MLflow: final test metric against E, per budget ε.

Reads the finished runs of one MLflow experiment (a ``fedrun -m experiment=fu21_<dataset> ...`` sweep), groups
them by (ε, E) at each fixed total T = ``total_iterations`` (or each fixed T_g = ``rounds`` when
``total_iterations`` is null), and writes a markdown file with

* the final test MSE (regression) or accuracy (classification), mean ± std over seeds, best E per ε in bold;
* T_g, the clients' participations T_l and the per-client ε composed from the noise actually added
  (Laplace: basic composition; Gaussian: PLD and RDP), beside the target ε of the paper's formula;
* the measured per-coordinate variance of the aggregated noise item Σ_l a_l·w_l (mean over rounds) against
  the formula Σ_l a_l²·Var(w_l), and its growth with E;

and one PNG per fixed T / T_g (metric against E, one line per ε, error bars = std over seeds, best E starred).
The file's title and first paragraph say which local-DP sensitivity (``local_dp_sensitivity``) the runs used
and whether their ε is conditional on an unchecked assumption (:func:`sensitivity_statement`); runs with
different sensitivities are never mixed in one file (select them with ``--filter``).

    python scripts/fu21_tables.py --experiment fu21-lending-club --out /tmp/lending_club.md \\
        --command "fedrun -m experiment=fu21_lending_club ..."

results/fu21/lending_club.md is no longer written by this script: it is generated from the committed export by
``python -m fedrun.report fu21_lending_club`` (conf/report/fu21_lending_club.yaml). The script stays for what
the report does not do: MSE/accuracy against E as a PNG with the best E starred, the mean of the noise item
over every round (from MLflow's full metric history), the sensitivity paragraph computed from the runs, and
the FEMNIST / paper_unchecked tables (whose runs were not kept); tests/repro/test_fu21*.py and
tests/unit/test_local_dp_sensitivity.py use it.

Reruns of the same (ε, E, seed, T) keep only the newest run. The pure part (:func:`aggregate`,
:func:`sweep_tables`) takes records as :func:`fedrun.report.mlflow_records` returns them.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from fedrun.report import Column, markdown_table, mlflow_records, with_command
from fedrun.tracking import resolve_uri

INF_FLOAT = 1e300  # MLflow stores inf as the largest float


# ------------------------------------------------------------------------------------------------ pure part
def _float(value: Any) -> float:
    if value is None or value == "None":
        return math.nan
    v = float(value)
    return math.inf if v >= INF_FLOAT else v


def metric_key(records: list[dict[str, Any]]) -> str:
    """``test_mse`` for regression runs, ``test_accuracy`` for classification runs."""
    return "test_mse" if any("metrics.test_mse" in r for r in records) else "test_accuracy"


def dedupe(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep the newest finished run per (ε, E, seed, T, T_g)."""
    latest: dict[tuple, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: r.get("start_time", 0)):
        key = tuple(r.get(f"params.{k}") for k in ("epsilon", "local_steps", "seed", "total_iterations", "rounds",
                                                   "dp", "lr", "clients_per_round", "local_dp_sensitivity"))
        latest[key] = r
    return list(latest.values())


SENSITIVITY_FORMULA = {"proven": "Δ = 2ζη/n_l + 2ζη(E−1)", "paper": "Δ = 2ζηE/n_l", "paper_unchecked": "Δ = 2ζηE/n_l"}


def sensitivity_statement(records: list[dict[str, Any]]) -> tuple[str, str]:
    """(title suffix, paragraph): the local-DP sensitivity the runs used and whether their ε is conditional.

    Read from each run's ``local_dp_sensitivity`` param and its summary metrics ``ldp_sensitivity_conditional``
    and ``ldp_two_over_beta_min`` (+ ``_client``). Runs logged before fedrun checked the paper's condition have
    ``paper`` and no ``ldp_sensitivity_conditional``: they used the paper's Δ unchecked (today's
    ``paper_unchecked``). Raises ValueError when the runs used different sensitivities.
    """
    local = [r for r in records if str(r.get("params.dp", "")).startswith("local_")]
    if not local:
        return "", ""
    names = {r.get("params.local_dp_sensitivity") or "paper" for r in local}  # older runs: the then default
    if len(names) > 1:
        raise ValueError(f"the runs used different local_dp_sensitivity values {sorted(names)}: one file per value "
                         f"(--filter \"params.local_dp_sensitivity = '...'\")")
    name = names.pop()
    flags = [_float(r["metrics.ldp_sensitivity_conditional"]) for r in local
             if "metrics.ldp_sensitivity_conditional" in r]
    legacy = name == "paper" and not flags
    conditional = legacy or any(f > 0 for f in flags)
    mech = {str(r.get("params.dp")).removeprefix("local_") for r in local}
    betas = [(_float(r["metrics.ldp_two_over_beta_min"]), int(_float(r.get("metrics.ldp_two_over_beta_min_client"))),
              _float(r.get("params.lr"))) for r in local if "metrics.ldp_two_over_beta_min" in r]
    beta_text = ""
    if betas:
        b, client, lr = min(betas)
        lrs = sorted({x[2] for x in betas})
        beta_text = (f" The paper's condition for the linear model, η ≤ 2/β_l for every client, computed on the runs' "
                     f"data: min 2/β_l = {b:.4g} (client {client}) against η = {', '.join(f'{x:g}' for x in lrs)} — "
                     f"it {'holds (in L2)' if max(lrs) <= b else 'fails'}.")
    shown = "paper (logged before fedrun checked it: today's paper_unchecked)" if legacy else name
    formula = SENSITIVITY_FORMULA.get(name, "?")
    if not conditional:
        why = ("no assumption on the loss or the norm" if name == "proven" else
               "its condition checked on the runs' data" if name == "paper" else "equal to the proven one here")
        text = (f"**Local-DP sensitivity: `{shown}`** — {formula} per upload ({why}): the ε in this file holds "
                f"without further assumption.{beta_text}")
        return f" — sensitivity {name}", text
    text = (f"**Local-DP sensitivity: `{shown}`** — the paper's {formula}, used without checking its condition "
            f"(E non-expansive gradient steps, an L2 argument): **every ε in this file is conditional on that "
            f"unchecked assumption.**")
    if "laplace" in mech:
        text += (" With the Laplace mechanism it is not proven even where the steps are non-expansive: L2 "
                 "non-expansiveness does not bound the L1 sensitivity Laplace needs.")
    text += beta_text if betas else (" These runs predate the check and logged no 2/β_l." if legacy else
                                     " For this model the condition cannot be checked (not the linear model).")
    text += (" The proven sensitivity is 2ζη/n_l + 2ζη(E−1) (`local_dp_sensitivity=proven`, the default), "
             "the same at E = 1 and ~n_l(E−1)/E times larger above.")
    return f" — sensitivity {shown.split(' ')[0]}, ε conditional", text


def aggregate(records: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """One row per (setting, ε, E): mean/std of the final ``key`` over seeds and the DP diagnostics.

    ``setting`` is ("T", total_iterations) for fixed-T sweeps or ("T_g", rounds) for fixed-T_g sweeps. A
    fixed-T run whose rounds equal a fixed-T_g sweep's T_g is the same computation, so it also fills that
    sweep's table (for the sweep's ε values) when the sweep has no run of its own for that (ε, E, seed).
    """
    def eps_of(r: dict[str, Any]) -> float:
        return _float(r.get("params.epsilon")) if r.get("params.dp") not in ("False", "false") else math.inf

    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    seen: set[tuple] = set()
    fixed_t = []
    for r in records:
        if f"metrics.{key}" not in r:
            continue
        total, rounds = _float(r.get("params.total_iterations")), int(_float(r["params.rounds"]))
        e = int(_float(r["params.local_steps"]))
        if not math.isnan(total):
            groups[(("T", int(total)), eps_of(r), e)].append(r)
            fixed_t.append(r)
        else:
            groups[(("T_g", rounds), eps_of(r), e)].append(r)
            seen.add((rounds, eps_of(r), e, r.get("params.seed")))
    tg_cells = {(k[0][1], k[1]) for k in groups if k[0][0] == "T_g"}  # (T_g, ε) of the fixed-T_g sweeps
    for r in fixed_t:
        rounds, e = int(_float(r["params.rounds"])), int(_float(r["params.local_steps"]))
        if (rounds, eps_of(r)) in tg_cells and (rounds, eps_of(r), e, r.get("params.seed")) not in seen:
            groups[(("T_g", rounds), eps_of(r), e)].append(r)
    rows = []
    for (setting, eps, e), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1], kv[0][2])):
        vals = np.array([_float(r[f"metrics.{key}"]) for r in rs])
        row: dict[str, Any] = {
            "setting": setting, "epsilon": eps, "E": e, "n": len(vals), "mean": float(vals.mean()),
            "std": float(vals.std(ddof=1)) if len(vals) > 1 else math.nan,
            "rounds": int(_float(rs[0]["params.rounds"])), "seeds": sorted(int(_float(r["params.seed"])) for r in rs),
        }
        for name in ("ldp_participations_max", "ldp_participations_min", "ldp_epsilon_max", "ldp_epsilon_pld_max",
                     "ldp_epsilon_rdp_max", "ldp_noise_item_var_mean", "ldp_noise_item_var_formula_mean",
                     "ldp_scale_median"):
            got = [_float(r[f"metrics.{name}"]) for r in rs if f"metrics.{name}" in r]
            row[name] = max(got) if got and name.startswith("ldp_epsilon") else (float(np.mean(got)) if got else None)
        rows.append(row)
    return rows


def best_per_epsilon(rows: list[dict[str, Any]], key: str) -> dict[tuple, int]:
    """(setting, ε) → the E with the best mean (lowest MSE / highest accuracy)."""
    sign = 1.0 if key == "test_mse" else -1.0
    best: dict[tuple, tuple[float, int]] = {}
    for r in rows:
        k = (r["setting"], r["epsilon"])
        if not math.isfinite(r["mean"]):
            continue
        if k not in best or sign * r["mean"] < sign * best[k][0]:
            best[k] = (r["mean"], r["E"])
    return {k: e for k, (_, e) in best.items()}


def _eps_label(eps: float) -> str:
    return "∞" if math.isinf(eps) else f"{eps:g}"


def sweep_tables(rows: list[dict[str, Any]], key: str) -> str:
    """Markdown: per setting, a metric table (ε rows × E columns) and a details table (one row per cell)."""
    digits = "{:.2f}" if key == "test_mse" else "{:.4f}"
    best = best_per_epsilon(rows, key)
    out = []
    for setting in sorted({r["setting"] for r in rows}):
        sub = [r for r in rows if r["setting"] == setting]
        es = sorted({r["E"] for r in sub})
        name, value = setting
        title = f"fixed T = E·T_g = {value}" if name == "T" else f"fixed T_g = {value} rounds"
        metric = "final test MSE (lower is better)" if key == "test_mse" else "final test accuracy (higher is better)"
        out.append(f"### {metric}, {title}; mean ± std over seeds, **best E per ε** in bold\n")
        by = {(r["epsilon"], r["E"]): r for r in sub}
        recs = []
        for eps in sorted({r["epsilon"] for r in sub}, reverse=True):
            rec: dict[str, Any] = {"ε (target)": _eps_label(eps)}
            for e in es:
                r = by.get((eps, e))
                if r is None:
                    rec[e] = "–"
                    continue
                cell = digits.format(r["mean"]) + ("" if math.isnan(r["std"]) else " ± " + digits.format(r["std"]))
                rec[e] = f"**{cell}**" if best.get((setting, eps)) == e else cell
            rec["best E"] = best.get((setting, eps), "–")
            recs.append(rec)
        cols = [Column("ε (target)", "ε (target)")]
        for e in es:
            r0 = next(r for r in sub if r["E"] == e)
            cols.append(Column(f"E={e} (T_g={r0['rounds']})", (lambda ee: (lambda rec: rec[ee]))(e)))
        cols.append(Column("best E", "best E"))
        out.append(markdown_table(recs, cols))
        detail_cols = [
            Column("ε (target)", lambda r: _eps_label(r["epsilon"])),
            Column("E", "E"), Column("T_g", "rounds"),
            Column("T_l (max)", "ldp_participations_max", "{:.0f}"),
            Column("seeds", lambda r: len(r["seeds"])),
            Column("mean", "mean", digits), Column("std", "std", digits),
            Column("ε composed, worst client (Laplace: basic)", "ldp_epsilon_max", "{:.3g}"),
            Column("ε composed (Gaussian: PLD)", "ldp_epsilon_pld_max", "{:.3g}"),
            Column("ε composed (Gaussian: RDP)", "ldp_epsilon_rdp_max", "{:.3g}"),
            Column("noise item var/coord, measured", "ldp_noise_item_var_mean", "{:.3g}"),
            Column("noise item var/coord, formula", "ldp_noise_item_var_formula_mean", "{:.3g}"),
        ]
        detail_cols = [c for c in detail_cols if any(c.cell(r) != "–" for r in sub)]
        out.append("\nPer cell (T_l = most participations of any client; ε composed from the noise actually added; "
                   "noise item = Σ a_l·w_l per coordinate, mean over rounds and seeds):\n")
        out.append(markdown_table(sub, detail_cols))
        out.append("")
    return "\n".join(out)


def findings(rows: list[dict[str, Any]], key: str) -> str:
    """Plain statements computed from the rows: best E per ε and whether it is interior to the E grid."""
    best = best_per_epsilon(rows, key)
    lines = []
    for (setting, eps), e in sorted(best.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        es = sorted({r["E"] for r in rows if r["setting"] == setting and r["epsilon"] == eps})
        where = "interior (neither the smallest nor the largest E)" if es[0] < e < es[-1] else \
            ("the smallest E" if e == es[0] else "the largest E")
        lines.append(f"- {setting[0]} = {setting[1]}, ε = {_eps_label(eps)}: best E = {e} of {es} — {where}.")
    ratios = [r["ldp_noise_item_var_mean"] / r["ldp_noise_item_var_formula_mean"] for r in rows
              if r.get("ldp_noise_item_var_mean") and r.get("ldp_noise_item_var_formula_mean")]
    if ratios:
        lines.append(f"- Aggregated noise: measured / formula variance over {len(ratios)} (ε, E) cells: "
                     f"median {np.median(ratios):.3f}, range {min(ratios):.3f}–{max(ratios):.3f}.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ plots
def plot(rows: list[dict[str, Any]], key: str, path_prefix: Path, title: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    best = best_per_epsilon(rows, key)
    paths = []
    for setting in sorted({r["setting"] for r in rows}):
        sub = [r for r in rows if r["setting"] == setting]
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for eps in sorted({r["epsilon"] for r in sub}, reverse=True):
            pts = sorted((r["E"], r["mean"], 0.0 if math.isnan(r["std"]) else r["std"]) for r in sub
                         if r["epsilon"] == eps)
            e, m, s = map(np.array, zip(*pts))
            line = ax.errorbar(e, m, yerr=s, marker="o", capsize=3, label=f"ε = {_eps_label(eps)}")
            b = best.get((setting, eps))
            if b is not None:
                ax.plot([b], [m[list(e).index(b)]], marker="*", markersize=16, color=line[0].get_color(),
                        markeredgecolor="k")
        ax.set_xscale("log")
        es = sorted({r["E"] for r in sub})
        ax.set_xticks(es, [str(e) for e in es])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("E (local iterations per global iteration)")
        ax.set_ylabel("final test MSE" if key == "test_mse" else "final test accuracy")
        if key == "test_mse":
            ax.set_yscale("log")
        name, value = setting
        ax.set_title(f"{title}: {'T' if name == 'T' else 'T_g'} = {value} (★ = best E per ε)", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = path_prefix.with_name(f"{path_prefix.name}_{'T' if name == 'T' else 'Tg'}{value}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------------------------ MLflow
def add_noise_history(records: list[dict[str, Any]], tracking_uri: str) -> None:
    """Per run: mean over rounds of the measured and the formula noise-item variance (from metric history)."""
    from mlflow.tracking import MlflowClient
    from fedrun.tracking import metric_name

    client = MlflowClient(tracking_uri=tracking_uri)
    for r in records:
        if "metrics.ldp_noise_item_var" not in r:
            continue
        for name in ("ldp_noise_item_var", "ldp_noise_item_var_formula"):
            hist = client.get_metric_history(r["run_id"], metric_name(name))
            if hist:
                r[f"metrics.{name}_mean"] = float(np.mean([m.value for m in hist]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    ap.add_argument("--experiment", required=True, help="MLflow experiment, e.g. fu21-lending-club")
    ap.add_argument("--filter", default="", help="extra MLflow search filter")
    ap.add_argument("--title", default=None)
    ap.add_argument("--command", action="append", default=[], help="command(s) that produced the runs")
    ap.add_argument("--notes", type=Path, default=None, help="markdown file appended below the tables")
    ap.add_argument("--out", type=Path, required=True, help="markdown output; PNGs are written beside it")
    args = ap.parse_args(argv)
    uri = resolve_uri(args.tracking_uri)
    records = dedupe([r for r in mlflow_records(uri, args.experiment, args.filter) if r["status"] == "FINISHED"])
    if not records:
        print(f"no finished runs in experiment {args.experiment!r}", file=sys.stderr)
        return 1
    try:
        suffix, statement = sensitivity_statement(records)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    add_noise_history(records, uri)
    key = metric_key(records)
    rows = aggregate(records, key)
    title = args.title or f"Paper 001 (Fu et al.): {records[0].get('tags.dataset', '?')}, final {key} against E"
    title += suffix
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pngs = plot(rows, key, args.out.with_suffix(""), records[0].get("tags.dataset", "?"))
    body = (statement + "\n\n" if statement else "") + sweep_tables(rows, key)
    body += "\nFindings (computed from the table):\n\n" + findings(rows, key) + "\n"
    body += "\nFigures: " + ", ".join(f"[{p.name}]({p.name})" for p in pngs) + "\n"
    notes = args.notes.read_text() if args.notes else ""
    text = with_command(title, "\n".join(args.command) or "(not given)", body, notes)
    args.out.write_text(text)
    print(f"wrote {args.out} and {', '.join(str(p) for p in pngs)} from {len(records)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
