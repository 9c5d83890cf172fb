#!/usr/bin/env python
"""``make gpu-check``: everything that needs a CUDA GPU, in one prepared run of at most 8 minutes.

1. CUDA must be there: without it the check stops at once with a one-line error and a non-zero exit status,
   and writes nothing — it never falls back to the CPU.
2. The CUDA-only tests (the tests under ``tests/`` whose name contains ``cuda``; they are skipped where CUDA is
   missing): at least one must run, none may be skipped, all must pass.
3. The speed benchmark (``scripts/bench_training.py speed --device cuda``) at 100 clients per round
   (``fl_std_lenet``) and at 1,000 (``fl_std_lenet_1000``): LeNet-5 / Fashion-MNIST, 10 local SGD steps of batch
   10. Targets: a round of 1,000 clients in ≤ 0.2 s, ≥ 40× the sequential path on the same GPU, and
   ≤ 15 % of a round outside local training.
4. The memory benchmark (``bench_training.py memory --device cuda``: peak device memory of one 350-client
   FEMNIST round per chunk size).
5. The default experiment (``fedrun device=cuda tracking=none``), timed, with its final test accuracy.

Each step runs in its own process group with a time limit (``STEPS``), and a step that would pass the overall
deadline is not started. ``--out`` (default ``results/bench/gpu.md``) gets every figure, the commands, the
device and met / NOT met for each target. Exit status: 0 when every step ran and every target is met, 1
otherwise (the file is still written), 2 without CUDA (nothing written).

    python scripts/gpu_check.py                     # what `make gpu-check` runs
    python scripts/gpu_check.py --out /tmp/gpu.md
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = "results/bench/gpu.md"

#: the whole check must stay under 8 minutes; the step limits below add up to this less a margin
DEADLINE_S = 470
#: step → time limit (s)
STEPS = {"tests": 60, "speed_100": 75, "speed_1000": 150, "memory": 75, "default_run": 110}

ROUND_1000_MAX_S = 0.2
SPEEDUP_1000_MIN = 40.0
OUTSIDE_SHARE_MAX = 15.0  # FL-STD's target on the share of a round outside local training (percent)


def fail_without_cuda() -> str | None:
    """None when CUDA works; else the one-line reason."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the venv has torch
        return f"cannot import torch ({exc})"
    where = (f"torch {torch.__version__}, built with CUDA {torch.version.cuda or 'none (a CPU-only build)'}, "
             f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}")
    if not torch.cuda.is_available():
        return f"CUDA is not available ({where})"
    try:
        torch.ones(1, device="cuda").add_(1).item()
    except Exception as exc:  # noqa: BLE001 - any failure of the device is the message
        return f"CUDA is available but unusable: {type(exc).__name__}: {str(exc).splitlines()[0]} ({where})"
    return None


@dataclass
class Step:
    name: str
    argv: list[str]
    limit: float
    rc: int | None = None
    wall: float = 0.0
    status: str = "not run"
    log: str = ""
    notes: list[str] = field(default_factory=list)
    tmp: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def command(self) -> str:
        """The command as typed in the repository root (``python`` for this interpreter, ``$TMP`` for the check's
        temporary folder)."""
        parts = ["python" if a == sys.executable else os.path.relpath(a, REPO) if a.startswith(str(REPO)) else a
                 for a in self.argv]
        text = shlex.join(parts)
        return text.replace(self.tmp, "$TMP") if self.tmp else text


def run_step(step: Step, deadline: float, logdir: Path) -> None:
    """Run ``step`` in its own process group; kill the group when its limit (or the deadline) is reached."""
    limit = min(step.limit, deadline - time.monotonic())
    if limit < 15:
        step.status = "not run: the check's 8-minute deadline was reached"
        return
    log_path = logdir / f"{step.name}.log"
    print(f"gpu-check: {step.name} (limit {limit:.0f} s): {step.command()}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(step.argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            step.rc = proc.wait(timeout=limit)
            step.status = "ok" if step.rc == 0 else f"failed (exit status {step.rc})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            step.rc = None
            step.status = f"timed out after {limit:.0f} s"
    step.wall = time.monotonic() - t0
    step.log = log_path.read_text(errors="replace")
    print(f"gpu-check: {step.name}: {step.status} ({step.wall:.0f} s)", file=sys.stderr, flush=True)


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def parse_table(md: str) -> list[dict[str, str]]:
    """The rows of the first markdown table in ``md`` (a header row, a rule, rows), keyed by header."""
    rows, header = [], None
    for line in md.splitlines():
        if not line.startswith("|"):
            if header is not None and rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            rows.append(dict(zip(header, cells)))
    return rows


def number(cell: str | None) -> float | None:
    m = re.search(r"-?\d[\d,]*\.?\d*", cell or "")
    return float(m.group().replace(",", "")) if m else None


def cuda_test_files() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
                  if "torch.cuda.is_available()" in p.read_text(errors="replace"))


def junit_counts(path: Path) -> dict[str, int] | None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "skipped", "failures", "errors")}


def device_lines() -> list[str]:
    import torch

    props = torch.cuda.get_device_properties(0)
    lines = [f"{torch.cuda.get_device_name(0)}, {props.total_memory / 2**30:.0f} GiB, compute capability "
             f"{props.major}.{props.minor}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
             f"cuDNN {torch.backends.cudnn.version()}"]
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15)
        if smi.returncode == 0 and smi.stdout.strip():
            lines.append(f"nvidia-smi: {smi.stdout.strip().splitlines()[0]}")
    except (OSError, subprocess.TimeoutExpired):
        pass
    lines.append(f"host: {os.cpu_count()} CPU cores; CUDA_VISIBLE_DEVICES="
                 f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}")
    return lines


def git_line() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return f"{head}{' (with uncommitted changes)' if dirty else ''}" if head else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def fedrun_argv(run_dir: Path) -> list[str]:
    exe = Path(sys.executable).parent / "fedrun"
    head = [str(exe)] if exe.exists() else [sys.executable, "-m", "fedrun.cli"]
    return [*head, "device=cuda", "tracking=none", "progress=log", f"hydra.run.dir={run_dir}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"markdown report (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    start = time.monotonic()
    deadline = start + DEADLINE_S

    reason = fail_without_cuda()
    if reason is not None:
        print(f"gpu-check: error: {reason}; this check needs a CUDA GPU and never falls back to the CPU",
              file=sys.stderr)
        return 2

    py, bench = sys.executable, str(REPO / "scripts" / "bench_training.py")
    with tempfile.TemporaryDirectory(prefix="fedrun-gpu-check-") as tmp_name:
        tmp = Path(tmp_name)
        test_files = cuda_test_files()
        junit = tmp / "junit.xml"
        speed_md = {k: tmp / f"speed_{k}.md" for k in ("100", "1000")}
        memory_md, run_dir = tmp / "memory.md", tmp / "default_run"
        steps = {
            "tests": Step("tests", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "cuda", "-rs",
                                    f"--junitxml={junit}", *test_files], STEPS["tests"]),
            "speed_100": Step("speed_100", [py, bench, "speed", "--device", "cuda", "--settings", "fl_std_lenet",
                                            "--rounds", "3", "--out", str(speed_md["100"])], STEPS["speed_100"]),
            "speed_1000": Step("speed_1000", [py, bench, "speed", "--device", "cuda", "--settings",
                                              "fl_std_lenet_1000", "--rounds", "2", "--out", str(speed_md["1000"])],
                               STEPS["speed_1000"]),
            "memory": Step("memory", [py, bench, "memory", "--device", "cuda", "--chunk-sizes", "10", "50",
                                      "--out", str(memory_md)], STEPS["memory"]),
            "default_run": Step("default_run", fedrun_argv(run_dir), STEPS["default_run"]),
        }
        for step in steps.values():
            step.tmp = str(tmp)
            run_step(step, deadline, tmp)

        targets: list[tuple[str, str, bool]] = []  # (target, figure, met)

        # -- the CUDA-only tests
        t = steps["tests"]
        counts = junit_counts(junit) if t.rc is not None else None
        if counts:
            ran = counts["tests"] - counts["skipped"]
            bad = counts["failures"] + counts["errors"]
            t.notes.append(f"{len(test_files)} files ({', '.join(test_files)}), `-k cuda`: {counts['tests']} "
                           f"selected, {ran} ran, {counts['skipped']} skipped, {bad} failed or errored")
            fig = f"{ran - bad} passed, {counts['skipped']} skipped, {bad} failed"
            met = t.ok and ran >= 1 and counts["skipped"] == 0 and bad == 0
        else:
            fig, met = f"no results ({t.status})", False
        if t.ok and not met:
            t.status = "failed: no CUDA test ran, or one was skipped"
        targets.append(("CUDA-only tests: ≥ 1 runs, none skipped, all pass", fig, met))

        # -- speed
        rows: dict[str, dict[str, str]] = {}
        for key, md in speed_md.items():
            step = steps[f"speed_{key}"]
            if step.ok and md.exists():
                for row in parse_table(md.read_text()):
                    m = re.match(r"`([^`]+)`", row.get("setting", ""))
                    if m:
                        rows[m.group(1)] = row
            elif step.ok:
                step.status = "failed: wrote no table"
        r1000 = rows.get("fl_std_lenet_1000")
        vec = number(r1000.get("vectorized s/round")) if r1000 else None
        ratio = number(r1000.get("speed-up")) if r1000 else None
        targets.append((f"1,000 clients × 10 steps × batch 10: a vectorized round ≤ {ROUND_1000_MAX_S} s",
                        f"{vec:.3f} s" if vec is not None else "no figure",
                        vec is not None and vec <= ROUND_1000_MAX_S))
        targets.append((f"1,000 clients: ≥ {SPEEDUP_1000_MIN:.0f}× the sequential path on the same GPU",
                        f"{ratio:.1f}× (sequential {r1000.get('sequential s/round (threads)')} s/round (threads))"
                        if ratio is not None else "no figure", ratio is not None and ratio >= SPEEDUP_1000_MIN))
        for name in ("fl_std_lenet", "fl_std_lenet_1000"):
            share = number(rows[name].get("outside share %")) if name in rows else None
            targets.append((f"`{name}`: ≤ {OUTSIDE_SHARE_MAX:.0f} % of a vectorized round outside local training",
                            f"{share:.1f} %" if share is not None else "no figure",
                            share is not None and share <= OUTSIDE_SHARE_MAX))

        # -- the default experiment
        d = steps["default_run"]
        final = best = None
        metrics = run_dir / "metrics.csv"
        if metrics.exists():
            evaluated = [r for r in csv.DictReader(metrics.read_text().splitlines()) if r.get("test_accuracy")]
            if evaluated:
                final = (int(float(evaluated[-1]["round"])), float(evaluated[-1]["test_accuracy"]))
        m = re.search(r"best_test_accuracy:\s*([\d.eE+-]+)", d.log)
        best = float(m.group(1)) if m else None
        if d.ok:
            d.notes.append(f"final test accuracy {final[1]:.4f} at round {final[0]}" if final else
                           "no test accuracy in metrics.csv")
            if best is not None:
                d.notes.append(f"best test accuracy {best:.4f}")
            eps = re.search(r"epsilon_final:\s*([\d.eE+-]+)", d.log)
            if eps:
                d.notes.append(f"ε = {float(eps.group(1)):.3g}")
            if final is None:
                d.status = "failed: no final test accuracy"
        targets.append(("default experiment (`fedrun device=cuda`) completes", d.status if not d.ok else
                        f"{d.wall:.0f} s, final test accuracy {final[1]:.4f}", d.ok))

        total = time.monotonic() - start
        text = report(steps, targets, speed_md, memory_md, total, args)
        out = Path(args.out)  # written only now, once every step has run
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)

    failed = [s.name for s in steps.values() if not s.ok]
    missed = [t for t, _, met in targets if not met]
    print(text)
    if failed or missed:
        print(f"gpu-check: {len(failed)} step(s) failed ({', '.join(failed) or 'none'}), {len(missed)} target(s) "
              f"not met; see {args.out}", file=sys.stderr)
        return 1
    print(f"gpu-check: all steps ran and all targets are met in {total:.0f} s; see {args.out}", file=sys.stderr)
    return 0


def report(steps: dict[str, Step], targets, speed_md: dict[str, Path], memory_md: Path, total: float, args) -> str:
    out = [
        "# GPU check (`make gpu-check`)",
        "",
        f"Generated by `python scripts/gpu_check.py{' --out ' + args.out if args.out != DEFAULT_OUT else ''}` "
        f"on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, commit {git_line()}, in {total:.0f} s "
        f"(limit {DEADLINE_S} s).",
        "",
        *[f"- Device: {line}" if i == 0 else f"- {line}" for i, line in enumerate(device_lines())],
        "",
        "## Targets",
        "",
        "| target | figure | met |",
        "|---|---|---|",
        *[f"| {t} | {fig} | {'met' if met else '**NOT met**'} |" for t, fig, met in targets],
        "",
        "## Steps",
        "",
        "Each in its own process group, killed at its limit; `$TMP` is the check's temporary folder.",
        "",
        "| step | command | limit s | wall s | status |",
        "|---|---|---:|---:|---|",
        *[f"| {s.name} | `{s.command()}` | {s.limit:.0f} | {s.wall:.0f} | {s.status} |" for s in steps.values()],
        "",
    ]
    for s in steps.values():
        out += [f"- {s.name}: {note}" for note in s.notes]
    sections = [("Speed: 100 clients per round", steps["speed_100"], speed_md["100"]),
                ("Speed: 1,000 clients per round", steps["speed_1000"], speed_md["1000"]),
                ("Memory", steps["memory"], memory_md)]
    for title, step, md in sections:
        out += ["", f"## {title}", ""]
        if step.ok and md.exists():
            out.append(re.sub(r"\nCommand: `.*`\s*$", "", md.read_text().rstrip()).rstrip())
        else:
            out += [f"{step.status}. Last lines of its output:", "", "```", tail(step.log), "```"]
    d = steps["default_run"]
    out += ["", "## Default experiment", "", f"`{d.command()}` (conf/config.yaml's defaults on the GPU; the run "
            f"folder is temporary): {d.status}, {d.wall:.0f} s."]
    out += [f"- {note}" for note in d.notes]
    if not d.ok:
        out += ["", "```", tail(d.log), "```"]
    t = steps["tests"]
    if not t.ok:
        out += ["", "## CUDA-only tests: output", "", "```", tail(t.log), "```"]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
