#!/usr/bin/env python
"""Paper 000 (Kerkouche et al., EuroS&P 2021), Table III on Fashion-MNIST: run the sweep, build the table.

    nice -n 5 .venv/bin/python scripts/kerkouche21_table3.py run       # the 20 runs (fedrun commands, 2 at a time)
    .venv/bin/python scripts/kerkouche21_table3.py table               # MLflow → results/kerkouche21/table3.md + PNG
    .venv/bin/python scripts/kerkouche21_table3.py run --dry-run       # print the fedrun commands only
    .venv/bin/python scripts/kerkouche21_table3.py run --ci            # CI-sized (experiment=kerkouche21_ci)

The runs: FL-STD (r = 1) and FL-RND, FL-FREQ, FL-CS × r ∈ {0.05, 0.1, 0.2}, each without and with client-level DP
(ε ≤ 1 after the experiment's rounds). Each run is one plain ``fedrun experiment=kerkouche21_table3 scheme=… r=…
dp=… clipping_norm=S`` command (printed before it starts); S per (scheme, r) comes from the experiment file's
``kerkouche21.clipping_norm`` table. Runs already FINISHED in the tracking experiment are skipped; a run with an
unfinished checkpoint in its folder (``outputs/kerkouche21/<experiment>/<label>``, see ``--outputs``) is resumed, so a killed sweep
continues where it stopped.

The table (the pure part: :func:`table_rows`, :func:`claims`, :func:`render`) uses the newest finished run per
(scheme, r, dp) of the tracking experiment: best test accuracy and its round, the paper's cost formula
r·n·32·Round·C at that round, the measured uplink bytes up to that round, and ε, with the paper's number beside
each number it reports.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fedrun.report import Column, fmt, markdown_table, mlflow_records, with_command  # noqa: E402

EXPERIMENTS = {False: "kerkouche21_table3", True: "kerkouche21_ci"}
RATIOS = (0.05, 0.1, 0.2)
SCHEMES = ("fl_std", "fl_rnd", "fl_freq", "fl_cs")
LABELS = {"fl_std": "FL-STD", "fl_rnd": "FL-RND", "fl_freq": "FL-FREQ", "fl_cs": "FL-CS"}
RUN_COMMAND = "nice -n 5 .venv/bin/python scripts/kerkouche21_table3.py run"
TABLE_COMMAND = ".venv/bin/python scripts/kerkouche21_table3.py table"

#: The paper's Fashion-MNIST numbers that survive in the text (/work/shared/papers/README.md, section 000):
#: (scheme, r, dp) → {"acc": best accuracy, "round": its round, "eps": ε, "cost_mb": Cost in MB}.
PAPER: dict[tuple[str, float, bool], dict[str, float]] = {
    ("fl_std", 1.0, False): {"acc": 0.91},  # [inferred] "about 30 %" above FL-STD-DP's 0.61
    ("fl_std", 1.0, True): {"acc": 0.61, "round": 25, "eps": 0.69, "cost_mb": 22.18},
    ("fl_cs", 0.05, True): {"acc": 0.78},
    ("fl_cs", 0.1, True): {"acc": 0.73},
    ("fl_cs", 0.2, True): {"acc": 0.66},
    ("fl_rnd", 0.1, True): {"acc": 0.77},
    ("fl_rnd", 0.2, True): {"acc": 0.80},
}


def runs() -> list[tuple[str, float, bool]]:
    """(scheme, r, dp) of every run: FL-STD at r = 1, the compressing schemes at each r; without, then with DP."""
    out = []
    for dp in (False, True):
        out.append(("fl_std", 1.0, dp))
        out += [(s, r, dp) for s in SCHEMES[1:] for r in RATIOS]
    return out


def label(scheme: str, r: float, dp: bool) -> str:
    return f"{scheme}-r{r:g}" + ("-dp" if dp else "")


def clipping_norms(experiment: str) -> dict[tuple[str, float], float]:
    """S per (scheme, r) from the experiment file's ``kerkouche21.clipping_norm`` table (and its parents)."""
    from omegaconf import OmegaConf

    conf = OmegaConf.load(REPO / "conf" / "experiment" / f"{experiment}.yaml")
    table = OmegaConf.select(conf, "kerkouche21.clipping_norm")
    if table is None:
        parents = [d for d in conf.get("defaults", []) if isinstance(d, str) and not d.startswith("override")]
        if not parents:
            raise SystemExit(f"conf/experiment/{experiment}.yaml has no kerkouche21.clipping_norm table")
        return clipping_norms(parents[0])
    return {(scheme, float(r)): float(s) for scheme, per in table.items() for r, s in per.items()}


def overrides(experiment: str, scheme: str, r: float, dp: bool, clip: dict[tuple[str, float], float],
              extra: list[str], run_dir: str | None = None) -> list[str]:
    name = label(scheme, r, dp)
    return [f"experiment={experiment}", f"scheme={scheme}", f"r={r:g}", f"dp={str(dp).lower()}",
            f"clipping_norm={clip[(scheme, r)]:g}", f"tracking.run_name={name}",
            f"hydra.run.dir={run_dir or f'outputs/kerkouche21/{experiment}/{name}'}", "progress=log", *extra]


def finished_labels(uri: str, tracking_experiment: str) -> set[str]:
    try:
        records = mlflow_records(uri, tracking_experiment)
    except ValueError:  # the experiment does not exist yet
        return set()
    return {r.get("tags.mlflow.runName", "") for r in records if r["status"] == "FINISHED"}


def unfinished_checkpoint(run_dir: Path) -> bool:
    import json

    side = run_dir / "checkpoint.json"
    if not (side.exists() and (run_dir / "checkpoint.pt").exists()):
        return False
    try:
        return not json.loads(side.read_text()).get("finished", False)
    except ValueError:
        return False


def tracking_experiment(experiment: str) -> str:
    from omegaconf import OmegaConf

    conf = OmegaConf.load(REPO / "conf" / "experiment" / f"{experiment}.yaml")
    return str(OmegaConf.select(conf, "tracking.experiment"))


def cmd_run(args: argparse.Namespace) -> int:
    from fedrun.tracking import prepare_store, resolve_uri

    experiment = EXPERIMENTS[args.ci]
    clip = clipping_norms(experiment)
    uri = resolve_uri(args.tracking_uri)
    texp = tracking_experiment(experiment)
    extra = list(args.overrides)
    if args.tracking_uri:
        extra.append(f"tracking.uri={args.tracking_uri}")
    todo = [run for run in runs() if args.only in label(*run)]
    done = set() if args.dry_run else finished_labels(uri, texp)
    fedrun = str(Path(sys.executable).parent / "fedrun")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.setdefault("FEDRUN_DATA", str(REPO.parent / "shared" / "data"))
    if not args.dry_run:
        prepare_store(uri, texp)  # before parallel runs race to create it
    queue = []
    for run in todo:
        name = label(*run)
        if name in done:
            print(f"skip {name}: finished in MLflow experiment {texp}", flush=True)
            continue
        run_dir = Path(args.outputs).resolve() / "kerkouche21" / experiment / name
        ov = overrides(experiment, *run, clip, extra, str(run_dir))
        if unfinished_checkpoint(run_dir):
            ov.append(f"resume={run_dir}")
        queue.append((name, [fedrun, *ov], run_dir))
    # the DCT schemes at large r and FL-STD train the same; FL-CS decodes: start the slowest first
    queue.sort(key=lambda q: (not q[0].startswith("fl_cs"), q[0]))
    running: list[tuple[str, subprocess.Popen, float]] = []
    failed: list[str] = []
    start = time.time()
    while queue or running:
        while queue and len(running) < max(1, args.jobs):
            name, cmd, run_dir = queue.pop(0)
            print(f"[{time.time() - start:7.0f}s] start {name}: fedrun {shlex.join(cmd[1:])}", flush=True)
            if args.dry_run:
                continue
            run_dir.mkdir(parents=True, exist_ok=True)
            log = open(run_dir.parent / f"{name}.log", "a")
            running.append((name, subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT),
                            time.time()))
        for item in list(running):
            name, proc, t0 = item
            if proc.poll() is None:
                continue
            running.remove(item)
            if proc.returncode != 0:
                failed.append(name)
            status = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            print(f"[{time.time() - start:7.0f}s] {status} {name} in {time.time() - t0:.0f}s", flush=True)
        time.sleep(0.5 if running else 0)
    print(f"sweep: {time.time() - start:.0f}s wall; failed: {', '.join(failed) or 'none'}", flush=True)
    return 1 if failed else 0


# ------------------------------------------------------------------------------------------ the table (pure)
def key_of(rec: dict[str, Any]) -> tuple[str, float, bool]:
    scheme = rec.get("tags.scheme") or rec.get("params.scheme.name")
    r = 1.0 if scheme == "fl_std" else float(rec.get("params.r", 1.0))
    return scheme, r, rec.get("tags.dp", "off") == "client"


def latest(records: list[dict[str, Any]]) -> dict[tuple[str, float, bool], dict[str, Any]]:
    """(scheme, r, dp) → the newest FINISHED record of one of the table's schemes."""
    out: dict[tuple[str, float, bool], dict[str, Any]] = {}
    for rec in sorted(records, key=lambda r: r.get("start_time", 0)):
        if rec.get("status") == "FINISHED" and (rec.get("tags.scheme") in SCHEMES):
            out[key_of(rec)] = rec
    return out


def _m(rec: dict[str, Any], key: str) -> float:
    v = rec.get(f"metrics.{key}")
    return math.nan if v is None else float(v)


def table_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (scheme, r, dp) in the paper's order, with the paper's numbers beside."""
    by_key = latest(records)
    rows = []
    for key in sorted(by_key, key=lambda k: (k[2], SCHEMES.index(k[0]), k[1])):
        rec = by_key[key]
        scheme, r, dp = key
        n = int(rec.get("tags.fedrun.num_parameters", 0) or 0)
        num_clients = float(rec.get("params.num_clients", "nan"))
        paper = PAPER.get(key, {})
        up = _m(rec, "uplink_bytes_at_best")
        rounds = _m(rec, "rounds_completed")
        rows.append({
            "scheme": LABELS[scheme] + ("-DP" if dp else ""), "key": key, "r": r, "dp": dp, "n": n,
            "acc": _m(rec, "best_test_accuracy"), "round": _m(rec, "best_round"),
            "cost_mb": _m(rec, "cost_bits_at_best") / 8e6,
            "uplink_mb": up / 1e6, "uplink_per_client_mb": up / num_clients / 1e6,
            "uplink_per_round_mb": _m(rec, "uplink_bytes_final") / rounds / 1e6 if rounds else math.nan,
            "eps": _m(rec, "epsilon_at_best") if dp else math.nan,
            "eps_final": _m(rec, "epsilon_final") if dp else math.nan,
            "sigma": _m(rec, "dp_noise_multiplier") if dp else math.nan,
            "clip": float(rec.get("params.clipping_norm", "nan")) if dp else math.nan,
            "rounds": rounds, "paper": paper, "run_id": rec.get("run_id"),
        })
    return rows


def _with_paper(value: float, paper: float | None, spec: str) -> str:
    text = fmt(value, spec)
    return text if paper is None else f"{text} ({spec.format(paper)})"


COLUMNS = [
    Column("scheme", "scheme"),
    Column("r", "r", "{:g}"),
    Column("best accuracy (paper)", lambda x: _with_paper(x["acc"], x["paper"].get("acc"), "{:.2f}")),
    Column("round (paper)", lambda x: _with_paper(x["round"], x["paper"].get("round"), "{:.0f}")),
    Column("Cost r·n·32·Round·C, MB (paper)", lambda x: _with_paper(x["cost_mb"], x["paper"].get("cost_mb"), "{:.3g}")),
    Column("measured uplink to best round, MB (all clients)", "uplink_mb", "{:.4g}"),
    Column("… per client (÷N), MB", "uplink_per_client_mb", "{:.3g}"),
    Column("ε at best round (paper)", lambda x: _with_paper(x["eps"], x["paper"].get("eps"), "{:.2f}")),
    Column("ε after all rounds", "eps_final", "{:.2f}"),
    Column("σ", "sigma", "{:.3g}"),
    Column("S", "clip", "{:g}"),
]


def _get(rows: list[dict[str, Any]], scheme: str, r: float, dp: bool) -> dict[str, Any] | None:
    return next((x for x in rows if x["key"] == (scheme, r, dp)), None)


def claims(rows: list[dict[str, Any]], few_points: float = 0.03) -> list[str]:
    """The paper's ordering claims, each stated as met / not met (or not checkable) from the rows."""
    out = []

    def acc(s: str, r: float, dp: bool) -> float | None:
        row = _get(rows, s, r, dp)
        return None if row is None or math.isnan(row["acc"]) else row["acc"]

    for r in RATIOS:
        cs, rnd, freq = acc("fl_cs", r, False), acc("fl_rnd", r, False), acc("fl_freq", r, False)
        if None in (cs, rnd, freq):
            out.append(f"- FL-CS ≥ FL-RND ≥ FL-FREQ without DP at r = {r:g}: not checkable (missing runs)")
            continue
        ok = cs >= rnd >= freq
        out.append(f"- FL-CS ≥ FL-RND ≥ FL-FREQ without DP at r = {r:g}: **{'met' if ok else 'not met'}** "
                   f"({cs:.3f} / {rnd:.3f} / {freq:.3f}; FL-CS is the best of the three: "
                   f"{'yes' if cs >= max(rnd, freq) else 'no'})")
    std = acc("fl_std", 1.0, False)
    for r in (0.1, 0.2):
        cs = acc("fl_cs", r, False)
        if None in (std, cs):
            out.append(f"- FL-CS within a few points of FL-STD at r = {r:g}: not checkable (missing runs)")
            continue
        gap = std - cs
        out.append(f"- FL-CS within a few points (≤ {few_points * 100:.0f}) of FL-STD at r = {r:g}: "
                   f"**{'met' if gap <= few_points else 'not met'}** (FL-STD {std:.3f}, FL-CS {cs:.3f}, "
                   f"gap {gap * 100:+.1f} points)")
    cs05 = acc("fl_cs", 0.05, False)
    if None not in (std, cs05):
        out.append(f"- FL-CS 6 points below FL-STD at r = 0.05 (paper): measured gap {(std - cs05) * 100:+.1f} points")
    cs_dp, std_dp = acc("fl_cs", 0.05, True), acc("fl_std", 1.0, True)
    if None in (cs_dp, std_dp):
        out.append("- with DP, FL-CS at r = 0.05 beats FL-STD-DP: not checkable (missing runs)")
    else:
        out.append(f"- with DP, FL-CS at r = 0.05 beats FL-STD-DP: **{'met' if cs_dp > std_dp else 'not met'}** "
                   f"({cs_dp:.3f} vs {std_dp:.3f}; paper 0.78 vs 0.61)")
    dp_cs = [acc("fl_cs", r, True) for r in RATIOS]
    if None not in dp_cs:
        dec = dp_cs[0] >= dp_cs[1] >= dp_cs[2]
        out.append(f"- FL-CS-DP is best at the smallest r (paper: 0.78 > 0.73 > 0.66 for r = 0.05, 0.1, 0.2): "
                   f"**{'met' if dec else 'not met'}** ({' / '.join(f'{a:.3f}' for a in dp_cs)})")
    rnd_dp = [acc("fl_rnd", r, True) for r in (0.1, 0.2)]
    if None not in (cs_dp, *rnd_dp):
        ok = cs_dp >= rnd_dp[0] - 0.01
        out.append(f"- FL-CS-DP at r = 0.05 does as well as FL-RND-DP at r = 0.1 (paper 0.78 vs 0.77, 0.80 at r = 0.2): "
                   f"**{'met' if ok else 'not met'}** ({cs_dp:.3f} vs {rnd_dp[0]:.3f}; {rnd_dp[1]:.3f} at r = 0.2)")
    cs_row, std_row = _get(rows, "fl_cs", 0.05, False), _get(rows, "fl_std", 1.0, False)
    if cs_row is not None and std_row is not None:
        per_round = 1 - cs_row["uplink_per_round_mb"] / std_row["uplink_per_round_mb"]
        to_best = 1 - cs_row["cost_mb"] / std_row["cost_mb"]
        out.append(f"- bandwidth saving ~95 % at r = 0.05: **{'met' if per_round >= 0.945 else 'not met'}** — measured "
                   f"uplink per round {per_round * 100:.1f} % below FL-STD (4·m vs 4·n bytes per client); the Cost "
                   f"up to each scheme's best round is {to_best * 100:.1f} % below FL-STD's")
    return out


def render(rows: list[dict[str, Any]], command: str, notes: str = "", figure: str | None = None) -> str:
    parts = ["# Paper 000 (Kerkouche et al. 2021), Table III on Fashion-MNIST — rebuilt by fedrun\n"]
    for dp in (False, True):
        group = [x for x in rows if x["dp"] == dp]
        if not group:
            continue
        title = "With client-level DP" if dp else "Without DP"
        parts.append(with_command(title, command, markdown_table(group, COLUMNS)))
    if figure:
        parts.append(f"\n![test accuracy per round]({figure})\n")
    parts.append("\n## The paper's claims\n")
    parts.append("\n".join(claims(rows)) + "\n")
    if notes:
        parts.append("\n" + notes.strip() + "\n")
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------ MLflow + figure
def histories(uri: str, run_ids: list[str], key: str = "test_accuracy") -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient
    from fedrun.tracking import metric_name

    client = MlflowClient(tracking_uri=uri)
    return {rid: sorted((m.step, m.value) for m in client.get_metric_history(rid, metric_name(key)))
            for rid in run_ids}


def run_times(uri: str, run_ids: list[str]) -> dict[str, tuple[int, int]]:
    """run id → (start, end) in ms since the epoch."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    out = {}
    for rid in run_ids:
        info = client.get_run(rid).info
        out[rid] = (info.start_time, info.end_time or info.start_time)
    return out


def plot(rows: list[dict[str, Any]], hist: dict[str, list[tuple[int, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    colors = {"fl_std": "black", "fl_rnd": "tab:blue", "fl_freq": "tab:green", "fl_cs": "tab:red"}
    styles = {0.05: "-", 0.1: "--", 0.2: ":", 1.0: "-"}
    for ax, dp in zip(axes, (False, True)):
        for x in (x for x in rows if x["dp"] == dp):
            pts = hist.get(x["run_id"], [])
            if pts:
                scheme, r, _ = x["key"]
                ax.plot(*zip(*pts), color=colors[scheme], linestyle=styles[r], marker=".", markersize=3,
                        label=f"{x['scheme']} r={r:g}")
        ax.set_title("with client-level DP" if dp else "without DP")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    axes[0].set_ylabel("test accuracy")
    fig.suptitle("Fashion-MNIST, fashion_cnn (n = 114,314): test accuracy per round", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}"


def cmd_table(args: argparse.Namespace) -> int:
    from fedrun.tracking import resolve_uri

    uri = resolve_uri(args.tracking_uri)
    experiment = EXPERIMENTS[args.ci]
    texp = args.experiment or tracking_experiment(experiment)
    records = mlflow_records(uri, texp)
    rows = table_rows(records)
    if not rows:
        print(f"no finished runs of {', '.join(SCHEMES)} in experiment {texp!r} at {uri}", file=sys.stderr)
        return 1
    out = Path(args.out)
    figure = out.with_name(out.stem + "_accuracy.png")
    plot(rows, histories(uri, [x["run_id"] for x in rows]), figure)
    times = run_times(uri, [x["run_id"] for x in rows])
    run_seconds = sum(end - start for start, end in times.values()) / 1e3
    span = (max(end for _, end in times.values()) - min(start for start, _ in times.values())) / 1e3
    notes_file = args.notes or (None if args.ci else REPO / "results" / "kerkouche21" / "table3_notes.md")
    notes = notes_file.read_text() if notes_file is not None and notes_file.exists() else ""
    timing = (f"Runs: {len(rows)} finished runs in MLflow experiment `{texp}` ({uri}). Wall time from the first "
              f"run's start to the last run's end: {span / 3600:.2f} h; the runs' own durations sum to "
              f"{run_seconds / 3600:.2f} h (runs went in parallel). Machine: {machine()}.")
    command = f"{RUN_COMMAND}{' --ci' if args.ci else ''}\n{TABLE_COMMAND}{' --ci' if args.ci else ''}"
    text = render(rows, command, timing + ("\n\n" + notes if notes else ""), figure.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the sweep (skips finished runs, resumes interrupted ones)")
    r.add_argument("--ci", action="store_true", help="CI-sized: experiment=kerkouche21_ci")
    r.add_argument("--jobs", type=int, default=2, help="runs at a time (each with one torch thread)")
    r.add_argument("--only", default="", help="run only labels containing this text (e.g. fl_cs, -dp)")
    r.add_argument("--dry-run", action="store_true")
    r.add_argument("--outputs", default=str(REPO / "outputs"), help="run folders go to OUTPUTS/kerkouche21/<experiment>/")
    r.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    r.add_argument("overrides", nargs="*", help="extra fedrun overrides for every run, e.g. rounds=100")
    t = sub.add_parser("table", help="build the markdown table and the figure from MLflow")
    t.add_argument("--ci", action="store_true")
    t.add_argument("--experiment", default=None, help="MLflow experiment (default: the config's tracking.experiment)")
    t.add_argument("--tracking-uri", default=None)
    t.add_argument("--out", default=str(REPO / "results" / "kerkouche21" / "table3.md"))
    t.add_argument("--notes", type=Path, default=None,
                   help="markdown appended below the claims (default: results/kerkouche21/table3_notes.md, "
                        "not with --ci)")
    args = ap.parse_args(argv)
    return cmd_run(args) if args.cmd == "run" else cmd_table(args)


if __name__ == "__main__":
    sys.exit(main())
