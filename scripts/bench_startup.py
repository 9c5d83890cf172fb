#!/usr/bin/env python
"""Start-up of the default experiment: seconds from launching ``fedrun`` to its ``round 1/50`` log line.

    .venv/bin/python scripts/bench_startup.py --runs 5 --out results/bench/startup.md
    .venv/bin/python scripts/bench_startup.py --runs 5 --baseline /tmp/base --out results/bench/startup.md

Each run starts ``.venv/bin/fedrun progress=log`` (the default experiment, ``--args`` appended) in a temporary
folder, reads its output, takes the time of the first line with ``round 1/``, then kills it (SIGKILL; the folder
is deleted). Two cases: ``fresh`` (no ``./mlflow.db``: MLflow creates its tables and runs its migrations, as on a
first ``make run``) and ``existing`` (the folder of an earlier run: a second ``make run``). One warm-up run of each,
then the cases alternate run by run (and with ``--baseline DIR``, another checkout of fedrun such as a ``git
worktree`` of an older commit, the two checkouts alternate too, on ``PYTHONPATH``), so the machine's drift hits every
row alike. Reported: min, median and max of the counted runs. With ``--importtime``, one more fresh run per checkout
under ``python -X importtime`` gives the seconds spent importing before round 1, by package (those figures
include importtime's own overhead).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FEDRUN = Path(sys.executable).parent / "fedrun"
ROUND1 = re.compile(r"round 1/\d+")
IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)")


def time_to_round1(checkout: Path, cwd: Path, args: list[str], importtime: bool = False,
                   timeout: float = 300.0) -> tuple[float, str]:
    """Seconds from launching fedrun (of ``checkout``) in ``cwd`` to its round-1 line, and its output so far."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    cmd = [str(FEDRUN), "progress=log", *args]
    if importtime:
        cmd = [sys.executable, "-X", "importtime", *cmd]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    try:
        for line in proc.stdout:
            out.append(line)
            if ROUND1.search(line):
                return time.perf_counter() - t0, "".join(out)
            if time.perf_counter() - t0 > timeout:
                break
        raise RuntimeError(f"fedrun ({checkout}) ended or timed out before round 1:\n{''.join(out)[-3000:]}")
    finally:
        proc.kill()
        proc.wait()


def imports_by_package(output: str) -> dict[str, float]:
    """Seconds of import by package, from ``-X importtime`` lines: each import of another package made by fedrun
    (or at top level) counts with its cumulative time under that package's name; fedrun's own modules count with
    their own time (``fedrun``)."""
    rows = [(int(m.group(1)), int(m.group(2)), len(m.group(3)) // 2, m.group(4).split(".")[0])
            for m in map(IMPORT_LINE.match, output.splitlines()) if m]
    out: dict[str, float] = {}
    chain: list[str] = []  # importtime prints a module after the modules it imports: walk backwards
    for own, cumulative, depth, pkg in reversed(rows):
        chain[depth:] = [pkg]
        if all(p == "fedrun" for p in chain[:-1]):
            out[pkg] = out.get(pkg, 0.0) + (own if pkg == "fedrun" else cumulative) / 1e6
    return out


def git_rev(checkout: Path) -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "fedrun"], cwd=checkout,
                           capture_output=True, text=True).stdout.strip()
    return (r.stdout.strip() or "?") + (" + uncommitted changes in fedrun/" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="counted runs of each case (after one warm-up each)")
    ap.add_argument("--baseline", type=Path, default=None, help="another fedrun checkout to run alternately")
    ap.add_argument("--args", default="", help="fedrun overrides, space-separated (default: none)")
    ap.add_argument("--importtime", action="store_true", help="also one fresh run under python -X importtime")
    ap.add_argument("--out", type=Path, default=None, help="markdown file to write (else print)")
    a = ap.parse_args(argv)
    args = a.args.split()
    checkouts = {"this checkout": REPO} | ({"baseline": a.baseline.resolve()} if a.baseline else {})
    cases = ("fresh", "existing")
    times: dict[tuple[str, str], list[float]] = {(c, k): [] for c in checkouts for k in cases}
    imports: dict[str, dict[str, float]] = {}
    load = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="fedrun-startup-"))
    try:
        existing = {c: root / f"existing-{i}" for i, c in enumerate(checkouts)}
        for i in range(a.runs + 1):  # run 0: the warm-ups (it also makes each checkout's existing mlflow.db)
            for c, checkout in checkouts.items():
                fresh = root / f"fresh-{i}-{c.replace(' ', '_')}"
                for case, cwd in (("fresh", fresh), ("existing", existing[c])):
                    cwd.mkdir(exist_ok=True)
                    t, _ = time_to_round1(checkout, cwd, args)
                    print(f"{'warm-up' if i == 0 else f'run {i}'}: {c}, {case}: {t:.2f} s", file=sys.stderr)
                    if i:
                        times[(c, case)].append(t)
                shutil.rmtree(fresh)
        if a.importtime:
            for c, checkout in checkouts.items():
                cwd = root / f"importtime-{c.replace(' ', '_')}"
                cwd.mkdir()
                imports[c] = imports_by_package(time_to_round1(checkout, cwd, args, importtime=True)[1])
    finally:
        shutil.rmtree(root, ignore_errors=True)

    import mlflow
    import torch

    cmd = "`.venv/bin/python scripts/bench_startup.py --runs {}{}{}{}{}`".format(
        a.runs, f" --baseline {a.baseline}" if a.baseline else "", f" --args '{a.args}'" if a.args else "",
        " --importtime" if a.importtime else "", f" --out {a.out}" if a.out else "")
    lines = ["# Start-up: launching `fedrun` to its round-1 line", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch "
             f"{torch.__version__}, mlflow {mlflow.__version__}. Command: {cmd}. Each run: "
             f"`fedrun progress=log{' ' + a.args if a.args else ''}` (the default experiment) in a temporary folder, "
             "timed from launch to its `round 1/…` line, then killed. fresh = no `./mlflow.db` yet (MLflow creates "
             "its tables: a first `make run`); existing = the folder of an earlier run. Cases and checkouts "
             f"alternate run by run; {a.runs} counted runs each after one warm-up. Load average when it started: "
             f"{load:.2f}.", "",
             "| checkout | case | runs | min (s) | median (s) | max (s) |", "|---|---|---|---|---|---|"]
    for (c, case), ts in times.items():
        lines.append(f"| {c} ({git_rev(checkouts[c])}) | {case} | {len(ts)} | {min(ts):.2f} | "
                     f"{statistics.median(ts):.2f} | {max(ts):.2f} |")
    if imports:
        most = {p: max(d.get(p, 0.0) for d in imports.values()) for d in imports.values() for p in d}
        shown = sorted((p for p in most if most[p] >= 0.05), key=lambda p: -most[p])
        lines += ["", "Imports before round 1, one fresh run under `python -X importtime` (s, packages of ≥ 0.05 s; "
                  "importtime's overhead included):", "",
                  "| package | " + " | ".join(imports) + " |", "|---|" + "---|" * len(imports)]
        lines += [f"| {p} | " + " | ".join(f"{d.get(p, 0):.2f}" for d in imports.values()) + " |" for p in shown]
        lines.append("| all imports | " + " | ".join(f"{sum(d.values()):.2f}" for d in imports.values()) + " |")
    text = "\n".join(lines) + "\n"
    if a.out:
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
