#!/usr/bin/env python
"""What checkpoints cost: size and save time of ``checkpoint.pt`` with per-client state, the former dense format
(one [num_clients, n] tensor per state name) vs the sparse one (ids + rows of the clients that have state), and
the share of a run's time spent saving under ``checkpoint_every=1`` (the former default) and ``auto`` (the default).

The setting: SketchedSGD (momentum and error per worker: two state names) on LeNet-5 / MNIST (n = 61,706) with
6000 clients, 60 a round (uniform), one local step; evaluation at the last round only. Two runs through the
runner's loop (``fedrun.run.run_rounds``, tracking=none): a short one with ``checkpoint_every=1`` and a longer
one with ``checkpoint_every=auto``; every save is timed (``save_checkpoint``: torch.save, fsync, rename) and its
file measured. The dense checkpoint is the first run's last state with the client state written the former way
(a dense tensor per name, zeros for the clients without a row), saved once through the same ``save_checkpoint``;
"every round, dense" is that save's time × the rounds (not run). A last table replays the schedule's code on the
measured round time and the fitted save time for runs of 100 to 10,000 rounds (projected, not run).

    .venv/bin/python scripts/bench_checkpoint.py --out results/bench/checkpoint.md    # ~2 min on 2 cores
    .venv/bin/python scripts/bench_checkpoint.py --rounds 40 --every1-rounds 5
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

def overrides(args, rounds: int | None = None) -> list[str]:
    rounds = rounds or args.rounds
    return ["experiment=fedsketch_homogeneous", "scheme=sketchedsgd", "local_steps=1", "batch_size=10",
            f"num_clients={args.num_clients}", "sampler=uniform", f"clients_per_round={args.clients_per_round}",
            f"rounds={rounds}", f"eval_every={rounds}", "tracking=none", "progress=off",
            f"device={args.device}", *([f"data_root={args.data_root}"] if args.data_root else [])]


def config(over: list[str]) -> dict:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from fedrun.run import prepare

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        c = OmegaConf.to_container(compose(config_name="config", overrides=over), resolve=True)
    prepare(c)
    return c


def timed_run(c: dict, every, out_dir: Path) -> dict:
    """One run through the runner's loop; every save timed and its file measured."""
    import fedrun.checkpoint as ckpt
    from fedrun.run import LoopState, build, run_rounds
    from fedrun.tracking import NullTracker

    c = {**c, "checkpoint_every": every}
    built = build(c)
    saves: list[dict] = []
    original = ckpt.save_checkpoint

    def measured(out, b, cc, loop, run_id, finished=False):
        t0 = time.perf_counter()
        path = original(out, b, cc, loop, run_id, finished)
        saves.append({"round": loop.round, "seconds": time.perf_counter() - t0, "bytes": path.stat().st_size,
                      "clients": len(b.sim.client_state.clients("sketchedsgd_momentum"))})
        return path

    ckpt.save_checkpoint = measured
    loop = LoopState()
    try:
        t0 = time.perf_counter()
        run_rounds(built, NullTracker(), out_dir, loop)
        wall = time.perf_counter() - t0
    finally:
        ckpt.save_checkpoint = original
    return {"built": built, "loop": loop, "saves": saves, "wall": wall,
            "rounds": [r["round_seconds"] for r in loop.rows]}


def dense_save(run: dict, c: dict, out_dir: Path) -> dict:
    """The same state saved with the client state in the former format (dense [num_clients, n] per name)."""
    from fedrun.checkpoint import save_checkpoint

    sim = run["built"].sim
    cs = sim.client_state
    names = list(cs.state_dict())
    everyone = torch.arange(sim.num_clients).numpy()
    dense = {name: cs.get(name, everyone, sim.n).cpu() for name in names}
    sparse_state_dict = cs.state_dict
    cs.state_dict = lambda: dense
    try:
        t0 = time.perf_counter()
        path = save_checkpoint(out_dir, run["built"], run["loop"], None, finished=True)
        seconds = time.perf_counter() - t0
    finally:
        cs.state_dict = sparse_state_dict
    size = path.stat().st_size
    del dense
    return {"seconds": seconds, "bytes": size, "names": len(names), "formula": len(names) * sim.num_clients * sim.n * 4}


def mb(b: float) -> str:
    return f"{b / 1e6:,.1f} MB" if b < 1e9 else f"{b / 1e9:,.2f} GB"


def device_line(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"


def fit_save_seconds(points: list[tuple[float, float]]):
    """Least squares seconds = a + b·bytes over the measured saves."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in points) / max(sum((x - mx) ** 2 for x in xs), 1e-30)
    a = max(my - b * mx, 0.0)
    return lambda nbytes: a + b * nbytes, a, b


def project(rounds: int, round_s: float, save_s, nbytes, every) -> tuple[int, float]:
    """The runner's schedule (``CheckpointSchedule``, a save when due and at the last round) replayed on a clock
    that advances by the measured round time and the fitted save time: (saves, share of the run spent saving)."""
    from fedrun.checkpoint import CheckpointSchedule

    now = [0.0]
    s = CheckpointSchedule(every, clock=lambda: now[0])
    for rnd in range(1, rounds + 1):
        now[0] += round_s
        if s.due(rnd, nbytes(rnd)) or rnd == rounds:
            with s.timed(nbytes(rnd)):
                now[0] += save_s(nbytes(rnd))
    return s.saves, s.seconds / now[0]


def report(args, every1: dict, auto: dict, dense: dict) -> str:
    n = every1["built"].sim.n
    names = dense["names"]
    row_bytes = names * n * 4
    rnd = statistics.median(every1["rounds"][:-1] + auto["rounds"][:-1])  # the last round also evaluates
    s1, sa = every1["saves"], auto["saves"]
    points = [(s["bytes"], s["seconds"]) for s in s1 + sa] + [(dense["bytes"], dense["seconds"])]
    save_s, a, b = fit_save_seconds(points)
    fixed = statistics.fmean(s["bytes"] - s["clients"] * row_bytes for s in s1 + sa)  # model, ledger, metrics
    N, K = args.num_clients, args.clients_per_round
    touched = lambda r: N * (1 - (1 - K / N) ** r)  # noqa: E731 - expected clients drawn at least once
    sparse_bytes = lambda r: fixed + touched(r) * row_bytes  # noqa: E731
    dense_bytes = lambda r: dense["bytes"]  # noqa: E731
    lines = [
        "# Checkpoints: dense vs sparse per-client state, and the share of run time spent saving",
        "",
        f"Machine: {device_line(args.device)}. Command: `{args.command}` (about {args.elapsed / 60:.0f} min).",
        "",
        f"Setting: SketchedSGD (per-worker momentum and error: {names} state names) on LeNet-5 / MNIST "
        f"(n = {n:,}), {N} clients, {K} a round (uniform), 1 local step of batch 10, evaluation at the last round "
        f"only. Overrides: `{' '.join(overrides(args))}` (rounds as below). Two runs through the runner's loop "
        f"(`run_rounds`): {args.every1_rounds} rounds with `checkpoint_every=1`, {args.rounds} rounds with "
        f"`checkpoint_every=auto`, the same seed. A save is `save_checkpoint` (torch.save, fsync, "
        f"rename), timed in the run. The dense row is the state after round {every1['loop'].round} saved once with "
        f"the former format (a dense [{N}, n] float32 tensor per state name: {names} × {N} × {n:,} × 4 B = "
        f"{mb(dense['formula'])} of client state, whatever the round).",
        "",
        "## Size and save time",
        "",
        "| checkpoint | clients with state | checkpoint.pt | save (s) |",
        "|---|---|---|---|",
        f"| dense, former format | {N} (all) | {mb(dense['bytes'])} | {dense['seconds']:.2f} |",
    ]
    shown = {}
    for s in s1 + sa:
        shown.setdefault(s["round"], s)
    for r in sorted(shown):
        s = shown[r]
        lines.append(f"| sparse, after round {r} | {s['clients']} | {mb(s['bytes'])} | {s['seconds']:.3f} |")
    lines += [
        "",
        f"The sparse checkpoint grows with the clients that have taken part, not with the {N} clients; the dense one "
        f"is {mb(dense['bytes'])} from round 1 on. With every client taking part (FedSKETCHGATE's full "
        f"participation, or a long SketchedSGD run: ≈ {touched(args.rounds) / N:.0%} of the clients after "
        f"{args.rounds} rounds here) the sparse one reaches the dense size, and only the schedule keeps the cost "
        f"down. Fitted save time: {a:.3f} s + {b * 1e9:.2f} s/GB.",
        "",
        "## Share of the run spent saving, measured",
        "",
        f"Median round: {rnd:.2f} s (training, sketching, aggregation). Run (s): the wall time of `run_rounds` "
        f"(rounds, the final evaluation, the metrics CSV and plot, the saves).",
        "",
        "| schedule | rounds | saves | saving (s) | run (s) | share |",
        "|---|---|---|---|---|---|",
        f"| every round, dense (the former default; {args.every1_rounds} × the dense save, not run) | "
        f"{args.every1_rounds} | {args.every1_rounds} | {dense['seconds'] * args.every1_rounds:.1f} | "
        f"{sum(every1['rounds']) + dense['seconds'] * args.every1_rounds:.1f} | "
        f"{dense['seconds'] * args.every1_rounds / (sum(every1['rounds']) + dense['seconds'] * args.every1_rounds):.0%} |",
    ]
    for name, run in (("every round, sparse (`checkpoint_every=1`)", every1), ("`auto`, sparse (the default)", auto)):
        secs = sum(s["seconds"] for s in run["saves"])
        where = f" (after rounds {', '.join(str(s['round']) for s in run['saves'])})" if len(run["saves"]) <= 8 else ""
        lines.append(f"| {name} | {run['loop'].round} | {len(run['saves'])}{where} | {secs:.1f} | {run['wall']:.1f} | "
                     f"{secs / run['wall']:.1%} |")
    inner = sa[1:-1]
    inner_s = sum(s["seconds"] for s in inner)
    between = (f"the saves in between took {inner_s:.1f} s, {inner_s / auto['wall']:.1%} of the run" if inner
               else "there was no room for a save in between")
    lines += [
        "",
        f"`auto` saves after round 1 (to measure a save), then as often as keeps the time spent saving, a final save "
        f"included (each predicted from the last save's time, scaled by the state's growth since), within 5 % of "
        f"the run's, and at the last round. A run this short is mostly its first and last saves ({between}); the "
        f"last is the largest, as clients took part since. The longer runs below show where the share goes.",
        "",
        "## Share of the run spent saving, longer runs (projected)",
        "",
        f"The schedule's own code (`CheckpointSchedule`, plus the save at the last round) replayed on a clock that "
        f"advances {rnd:.2f} s a round and the fitted save time of each checkpoint's size; sparse sizes from the "
        f"expected number of clients drawn so far, {N}·(1 − (1 − {K}/{N})^round). Dense is also what "
        f"FedSKETCHGATE's full participation gives, sparse or not.",
        "",
        "| schedule | " + " | ".join(f"{r:,} rounds: saves, share" for r in args.project) + " |",
        "|---|" + "---|" * len(args.project),
    ]
    for name, every, nbytes in (("every round, dense (former default)", 1, dense_bytes),
                                ("every round, sparse", 1, sparse_bytes),
                                ("`auto`, dense", "auto", dense_bytes),
                                ("`auto`, sparse (default)", "auto", sparse_bytes)):
        cells = []
        for r in args.project:
            saves, share = project(r, rnd, save_s, nbytes, every)
            cells.append(f"{saves:,}, {share:.1%}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=80, help="rounds of the checkpoint_every=auto run")
    ap.add_argument("--every1-rounds", type=int, default=10, help="rounds of the checkpoint_every=1 run")
    ap.add_argument("--num-clients", type=int, default=6000)
    ap.add_argument("--clients-per-round", type=int, default=60)
    ap.add_argument("--project", type=int, nargs="+", default=[100, 1000, 10000],
                    help="run lengths of the projected table")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--out", default=None, help="write the markdown report here")
    args = ap.parse_args(argv)
    args.command = " ".join([".venv/bin/python scripts/bench_checkpoint.py",
                             *(argv if argv is not None else sys.argv[1:])])
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench_checkpoint_"))
    try:
        (work / "every1").mkdir()
        (work / "auto").mkdir()
        every1 = timed_run(config(overrides(args, args.every1_rounds)), 1, work / "every1")
        print(f"checkpoint_every=1: {len(every1['saves'])} saves, {every1['wall']:.1f} s", flush=True)
        c = config(overrides(args, args.rounds))
        auto = timed_run(c, "auto", work / "auto")
        print(f"checkpoint_every=auto: {len(auto['saves'])} saves, {auto['wall']:.1f} s", flush=True)
        del auto["built"]
        dense = dense_save(every1, c, work / "every1")
        print(f"dense: {mb(dense['bytes'])} in {dense['seconds']:.2f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.elapsed = time.perf_counter() - t0
    text = report(args, every1, auto, dense)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
