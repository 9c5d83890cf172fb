"""scripts/gpu_check.py (`make gpu-check`): without CUDA it stops at once with a one-line error, a non-zero exit
status and no report; with CUDA its report is read from the steps' outputs (here canned, in the formats the real
steps write: bench_training's own speed table, pytest's JUnit XML, fedrun's metrics.csv)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REPORT = REPO / "results" / "bench" / "gpu.md"


def _state(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def test_without_cuda_fails_with_one_line_and_writes_nothing(tmp_path):
    before = _state(REPORT)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for extra in ([], ["--out", str(tmp_path / "gpu.md")]):
        proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), *extra], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0
        assert proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("gpu-check: error: CUDA is not available")
        assert "never falls back to the CPU" in lines[0]
    assert _state(REPORT) == before  # the default report is neither written nor removed
    assert not (tmp_path / "gpu.md").exists()


def _speed_row(bench, name: str, vec: float, seq: float, share: float) -> dict:
    outside = vec * share / 100
    return {"name": name, "what": bench.SETTINGS[name][0], "n": 61706, "seq": {8: seq}, "best": 8, "vec": vec,
            "phases": {"train": vec - outside, "outside": outside, "share": share, "select": 0.0001,
                       "scheme": outside - 0.0002, "accounting": 0.0001}, "cuda_peak": 3 * 2**30}


def _fake_steps(bench, vec_1000: float, skipped: int):
    """A stand-in for run_step: writes what each real step would write, from the step's own command line."""

    def run_step(step, deadline, logdir):
        arg = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in step.argv if "=" in a}
        out = Path(step.argv[step.argv.index("--out") + 1]) if "--out" in step.argv else None
        log = ""
        if step.name == "tests":
            Path(arg["--junitxml"]).write_text(
                f'<testsuites><testsuite name="pytest" errors="0" failures="0" skipped="{skipped}" tests="3">'
                "</testsuite></testsuites>")
        elif step.name.startswith("speed"):
            name = step.argv[step.argv.index("--settings") + 1]
            row = _speed_row(bench, name, vec_1000 if name.endswith("1000") else 0.02, 12.0, 10.0)
            table = bench.speed_table([row], cuda=True)
            out.write_text("\n".join(["Device: cuda — Fake GPU.", "", *table, "", "Command: `python x`"]) + "\n")
        elif step.name == "memory":
            out.write_text("| chunk_size | peak RSS (GiB) | process wall (s) | round |\n|---:|---:|---:|---|\n"
                           "| 10 | 2.00 | 9 | clients=350 cuda_peak_allocated_gib=1.50 |\n")
        elif step.name == "default_run":
            run_dir = Path(arg["hydra.run.dir"])
            run_dir.mkdir(parents=True)
            (run_dir / "metrics.csv").write_text("round,test_accuracy\n45,0.70\n49,\n50,0.7312\n")
            log = "fedrun: done\n  best_test_accuracy: 0.7312\n  epsilon_final: 0.999\n"
        step.rc, step.status, step.wall, step.log = 0, "ok", 1.0, log

    return run_step


@pytest.mark.parametrize("vec_1000, skipped, code", [(0.15, 0, 0), (0.3, 0, 1), (0.15, 1, 1)])
def test_report_from_the_steps_outputs(tmp_path, monkeypatch, load_script, vec_1000, skipped, code):
    gpu, bench = load_script("gpu_check"), load_script("bench_training")
    monkeypatch.setattr(gpu, "fail_without_cuda", lambda: None)
    monkeypatch.setattr(gpu, "device_lines", lambda: ["Fake GPU, 141 GiB"])
    monkeypatch.setattr(gpu, "run_step", _fake_steps(bench, vec_1000, skipped))
    out = tmp_path / "gpu.md"
    assert gpu.main(["--out", str(out)]) == code
    text = out.read_text()
    targets = {r["target"]: r for r in gpu.parse_table(text.split("## Targets", 1)[1])}
    assert len(targets) == 6
    speed = next(r for t, r in targets.items() if "round ≤ 0.2 s" in t)
    assert speed["figure"] == f"{vec_1000:.3f} s" and speed["met"] == ("met" if vec_1000 <= 0.2 else "**NOT met**")
    ratio = next(r for t, r in targets.items() if "≥ 40×" in t)
    assert ratio["figure"].startswith(f"{12.0 / vec_1000:.1f}×")
    tests = next(r for t, r in targets.items() if t.startswith("CUDA-only tests"))
    assert tests["met"] == ("met" if skipped == 0 else "**NOT met**")
    assert "final test accuracy 0.7312 at round 50" in text and "Device: Fake GPU" in text
    assert "| `fl_std_lenet_1000`:" in text and "cuda_peak_allocated_gib=1.50" in text
    assert "python scripts/bench_training.py speed --device cuda --settings fl_std_lenet_1000" in text
    assert "device=cuda tracking=none" in text
