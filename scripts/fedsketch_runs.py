#!/usr/bin/env python
"""Run paper 002's experiments (FedSKETCH): the learning-rate tuning, then Figure 1 and Figure 2.

Every run is one plain ``fedrun`` command (printed before it starts, and listed in the results file);
this script only queues them, ``--jobs`` at a time (each with one torch thread), and picks learning rates
from the tuning runs in MLflow. Tables and plots: ``scripts/fedsketch_report.py``.

    nice -n 5 .venv/bin/python scripts/fedsketch_runs.py tune        # τ = 1, homogeneous, 30 rounds, η grid
    nice -n 5 .venv/bin/python scripts/fedsketch_runs.py tune --extend   # repeat while the best η is the top one
    nice -n 5 .venv/bin/python scripts/fedsketch_runs.py figure1     # homogeneous, best η per method
    nice -n 5 .venv/bin/python scripts/fedsketch_runs.py figure2     # heterogeneous (FedSKETCHGATE: sampler=all)
    .venv/bin/python scripts/fedsketch_runs.py figure1 --dry-run     # print the commands only

Methods are keyed ``fedsgd``, ``sketchedsgd``, ``fs-privix``, ``fs-heaprix``, ``gate-privix``, ``gate-heaprix``
with a sketch size ``20x40`` / ``50x100``. Learning rate: the η with the highest test accuracy after the tuning
runs (γ = 1); FedSKETCHGATE reuses the FedSKETCH η of the same unsketch and size.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = ((20, 40), (50, 100))
LR_GRID = (0.01, 0.03, 0.1, 0.3, 1.0)
TAUS = (1, 2, 5)
MAX_RETRIES = 2  # a diverged figure run is repeated with the next smaller η at most this often
GATE_ROUNDS = 40  # FedSKETCHGATE in figure 2 (full participation + one own decode per worker and round)


@dataclass(frozen=True)
class Method:
    key: str  # fedsgd | sketchedsgd | fs-privix | fs-heaprix | gate-privix | gate-heaprix
    size: tuple[int, int] | None = None

    @property
    def label(self) -> str:
        return self.key if self.size is None else f"{self.key} {self.size[0]}x{self.size[1]}"

    @property
    def tune_key(self) -> str:
        """The tuned method whose η this one uses (GATE reuses FedSKETCH's)."""
        key = self.key.replace("gate-", "fs-")
        return key if self.size is None else f"{key} {self.size[0]}x{self.size[1]}"

    def overrides(self) -> list[str]:
        if self.key == "fedsgd":
            return ["scheme=fedsgd"]
        t, k = self.size
        size = [f"scheme.rows={t}", f"scheme.cols={k}"]
        if self.key == "sketchedsgd":
            return ["scheme=sketchedsgd", *size]
        family, unsketch = self.key.split("-")
        scheme = {"fs": "fedsketch", "gate": "fedsketchgate"}[family]
        extra = ["sampler=all"] if family == "gate" else []
        return [f"scheme={scheme}", f"scheme.unsketch={unsketch}", *size, *extra]


def method_of(record: dict) -> str:
    """The method label of an MLflow record (params of the resolved config)."""
    name = record.get("params.scheme.name", "")
    if name == "fedsgd":
        return "fedsgd"
    size = f"{record.get('params.scheme.rows')}x{record.get('params.scheme.cols')}"
    if name == "sketchedsgd":
        return f"sketchedsgd {size}"
    family = {"fedsketch": "fs", "fedsketchgate": "gate"}.get(name, name)
    return f"{family}-{record.get('params.scheme.unsketch')} {size}"


def tuned_methods() -> list[Method]:
    out = [Method("fedsgd")]
    for size in SIZES:
        out += [Method("sketchedsgd", size), Method("fs-privix", size), Method("fs-heaprix", size)]
    return out


def best_lrs(tracking_uri: str) -> dict[str, float]:
    """η with the highest final test accuracy per tuned method (finished runs of fedsketch-tune)."""
    from fedrun.report import mlflow_records

    best: dict[str, tuple[float, float]] = {}
    for r in mlflow_records(tracking_uri, "fedsketch-tune"):
        acc = r.get("metrics.test_accuracy")
        if r["status"] != "FINISHED" or acc is None:
            continue
        lr = float(r["params.lr"])
        key = method_of(r)
        if key not in best or (acc, -lr) > (best[key][0], -best[key][1]):
            best[key] = (acc, lr)
    return {k: v[1] for k, v in best.items()}


def tuning_state(tracking_uri: str) -> dict[str, dict[float, float | None]]:
    """Per tuned method: η → final test accuracy (None = diverged or failed) of the finished tuning runs."""
    from fedrun.report import mlflow_records

    out: dict[str, dict[float, float | None]] = {}
    for r in mlflow_records(tracking_uri, "fedsketch-tune"):
        if r["status"] in ("FINISHED", "FAILED"):
            ok = r["status"] == "FINISHED" and r.get("metrics.test_accuracy") is not None
            out.setdefault(method_of(r), {})[float(r["params.lr"])] = r["metrics.test_accuracy"] if ok else None
    return out


def extension(state: dict[str, dict[float, float | None]]) -> dict[str, float]:
    """The next log-grid η (×√10 ≈ 3.16, rounded as the grid) for methods whose best η is the largest tried."""
    nxt = {}
    for key, per in state.items():
        done = {lr: acc for lr, acc in per.items() if acc is not None}
        if not done:
            continue
        top = max(per)
        best = max(done, key=lambda lr: (done[lr], -lr))
        if best == top:
            nxt[key] = float(f"{top * (3.0 if str(top).startswith('1') else 10 / 3):.3g}")
    return nxt


def commands(stage: str, lrs: dict[str, float], rounds: int | None,
             extend: dict[str, float] | None = None) -> list[tuple[str, list[str]]]:
    """(label, fedrun overrides) of every run of a stage."""
    extra = [f"rounds={rounds}"] if rounds else []
    runs: list[tuple[str, list[str]]] = []
    if stage == "tune":
        for m in tuned_methods():
            grid = LR_GRID if extend is None else ((extend[m.label],) if m.label in extend else ())
            for lr in grid:
                runs.append((f"{m.label} lr={lr:g}", ["experiment=fedsketch_tune", *m.overrides(), "local_steps=1",
                                                     f"lr={lr:g}", *extra]))
        return runs
    exp = {"figure1": "fedsketch_homogeneous", "figure2": "fedsketch_heterogeneous"}[stage]
    methods = [Method("fedsgd")] + [Method("sketchedsgd", s) for s in SIZES]
    sketches = [Method(f"fs-{u}", s) for s in SIZES for u in ("privix", "heaprix")]
    fs_taus = TAUS
    if stage == "figure2":
        # Reduced for CPU time: FedSKETCH (half participation) at τ ∈ {1, 5}; FedSKETCHGATE (all 50 workers, each
        # decoding its own sketch every round: 10–25 s per round here) at τ = 1, GATE_ROUNDS rounds.
        fs_taus = (1, 5)
        sketches += [Method("gate-privix", SIZES[0]), Method("gate-heaprix", SIZES[0]),
                     Method("gate-heaprix", SIZES[1])]
    for m in methods + sketches:
        if m.tune_key not in lrs:
            raise SystemExit(f"no tuned learning rate for {m.tune_key}: run `scripts/fedsketch_runs.py tune` first")
        lr = lrs[m.tune_key]
        if m.key in ("fedsgd", "sketchedsgd") or m.key.startswith("gate"):
            taus = (1,)
        else:
            taus = fs_taus
        more = [f"rounds={GATE_ROUNDS}"] if m.key.startswith("gate") and not rounds else []
        for tau in taus:
            runs.append((f"{m.label} tau={tau}", [f"experiment={exp}", *m.overrides(), f"local_steps={tau}",
                                                  f"lr={lr:g}", *extra, *more]))
    # longest first (FedSKETCHGATE, then large τ), so that the parallel jobs end together
    return sorted(runs, key=lambda r: (r[0].startswith("gate"), int(r[0].rsplit("=", 1)[1])), reverse=True)


def lower_lr_retry(label: str, cmd: list[str], log: Path) -> tuple[str, list[str]] | None:
    """A diverged figure run is repeated with the next smaller η of the grid, at most twice (all runs are kept)."""
    done = 2 if "retry2" in label else 1 if "retry" in label else 0
    if done >= MAX_RETRIES or "diverged" not in log.read_text(errors="replace"):
        return None
    lr = next(float(a.split("=", 1)[1]) for a in cmd if a.startswith("lr="))
    smaller = [g for g in LR_GRID if g < lr * 0.99]
    if not smaller:
        return None
    new = f"{label.split(' retry')[0]} retry{'' if 'retry' not in label else '2'} lr={smaller[-1]:g}"
    run_name = new.replace(" ", "_").replace("=", "-")
    out = [f"lr={smaller[-1]:g}" if a.startswith("lr=") else
           f"tracking.run_name={run_name}" if a.startswith("tracking.run_name=") else a for a in cmd]
    return new, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=("tune", "figure1", "figure2"))
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (each with one torch thread)")
    ap.add_argument("--rounds", type=int, default=None, help="override the experiment's rounds")
    ap.add_argument("--only", default="", help="run only labels containing this text")
    ap.add_argument("--skip", default=None, help="skip labels containing any of these comma-separated texts")
    ap.add_argument("--lr", type=float, default=None,
                    help="use this η instead of the tuned one (e.g. to continue below η values that diverged)")
    ap.add_argument("--server-lr", type=float, default=None, help="global learning rate γ (default: the scheme's 1)")
    ap.add_argument("--extra", nargs="*", default=[], help="more fedrun overrides, e.g. scheme.hashes=per_round")
    ap.add_argument("--extend", action="store_true",
                    help="tune: run only the next larger η for methods whose best η is the largest tried")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--tracking-uri", default=None)
    args = ap.parse_args(argv)
    from fedrun.tracking import prepare_store, resolve_uri

    uri = resolve_uri(args.tracking_uri)
    lrs = {} if args.stage == "tune" else best_lrs(uri)
    if lrs:
        print("tuned η:", ", ".join(f"{k}: {v:g}" for k, v in sorted(lrs.items())), flush=True)
    extend = extension(tuning_state(uri)) if args.stage == "tune" and args.extend else None
    if extend is not None:
        print("extending the η grid upwards:", extend or "nothing to extend", flush=True)
    runs = [r for r in commands(args.stage, lrs, args.rounds, extend) if args.only in r[0]
            and not any(part and part in r[0] for part in (args.skip or "").split(","))]
    fedrun = str(REPO / ".venv" / "bin" / "fedrun")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.setdefault("FEDRUN_DATA", str(REPO.parent / "shared" / "data"))
    if not args.dry_run:
        name = {"tune": "fedsketch-tune", "figure1": "fedsketch-homogeneous", "figure2": "fedsketch-heterogeneous"}
        prepare_store(uri, name[args.stage])  # before parallel runs race to create it
    if args.lr is not None:
        runs = [(f"{label} lr={args.lr:g}", [f"lr={args.lr:g}" if a.startswith("lr=") else a for a in ov])
                for label, ov in runs]
    if args.extra:
        tag = " ".join(o.split(".")[-1] for o in args.extra)
        runs = [(f"{label} {tag}", [*ov, *args.extra]) for label, ov in runs]
    if args.server_lr is not None:
        runs = [(f"{label} gamma={args.server_lr:g}", [*ov, f"scheme.server_lr={args.server_lr:g}"])
                for label, ov in runs]
    queue = [(label, [fedrun, *ov, "progress=log", f"tracking.run_name={label.replace(' ', '_').replace('=', '-')}"])
             for label, ov in runs]
    running: list[tuple[str, subprocess.Popen, float]] = []
    logs: dict[str, Path] = {}
    failed = []
    start = time.time()
    while queue or running:
        while queue and len(running) < max(1, args.jobs):
            label, cmd = queue.pop(0)
            print(f"[{time.time() - start:7.0f}s] start {label}: {shlex.join(cmd[1:])}", flush=True)
            if args.dry_run:
                continue
            (REPO / "outputs").mkdir(exist_ok=True)
            logs[label] = REPO / "outputs" / f"fedsketch_{label.replace(' ', '_').replace('=', '')}.log"
            log = open(logs[label], "w")
            running.append((label, subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT),
                            time.time()))
        for item in list(running):
            label, proc, t0 = item
            if proc.poll() is not None:
                running.remove(item)
                status = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
                if proc.returncode != 0:
                    failed.append(label)
                print(f"[{time.time() - start:7.0f}s] {status} {label} in {time.time() - t0:.0f}s", flush=True)
                retry = lower_lr_retry(label, proc.args, logs[label]) if args.stage != "tune" else None
                if retry is not None:
                    print(f"[{time.time() - start:7.0f}s] diverged: queued {retry[0]}", flush=True)
                    queue.insert(0, retry)
        time.sleep(0.5 if running else 0)
    print(f"total {time.time() - start:.0f}s; failed or diverged: {failed or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
