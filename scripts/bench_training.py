#!/usr/bin/env python
"""Round throughput and peak memory of fedrun's simulation: vectorized (vmap over clients) vs sequential.

``speed``: seconds per round (and rounds/s) of whole rounds — client selection, local training, encoding,
aggregation (with client-level DP: clipping + noise), decoding, the model update and the privacy accounting;
no evaluation — for the papers' schemes at paper-like settings. Each setting builds two simulations from the same
Hydra config, one with ``vectorized=true`` and one with ``vectorized=false`` (the sequential reference path: one
``nn.Module`` + autograd per client), runs one warm-up round on each, then alternates the timed rounds (same
clients, same batches) so both paths see the same machine load. The sequential path is timed with 1 torch thread
and with torch's default thread count; the better one is the baseline of the speed-up. The ratio is measured
in the same process and run, not against a number from elsewhere.

``memory``: peak resident memory (RSS) of one round of FEMNIST-CNN training with 350 clients per round and
E = 5 full-batch local iterations (paper 001's FEMNIST setting; the 212-writer sample is doubled with
``partition.copies=2``) for each client-chunk size, each in its own process (``os.wait4`` reports the child's
peak RSS).

    python scripts/bench_training.py speed                         # all settings, CPU
    python scripts/bench_training.py speed --settings fl_std_lenet --rounds 5
    python scripts/bench_training.py speed --device cuda           # the GPU figure
    python scripts/bench_training.py memory --chunk-sizes 10 50
    python scripts/bench_training.py speed --out results/bench/speed.md    # also write the markdown table

The settings (Hydra overrides on top of ``conf/config.yaml``; see ``SETTINGS``) are printed with the table.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: name → (what it is, Hydra overrides). Each is the setting of a paper's experiment file where there is one.
SETTINGS: dict[str, tuple[str, list[str]]] = {
    "fl_std_lenet": (
        "FL-STD, LeNet-5 / Fashion-MNIST, 100 of 600 clients per round, 10 local SGD steps of batch 10",
        ["dataset=fashion_mnist", "model=lenet5", "scheme=fl_std", "partition=iid", "dp=false",
         "num_clients=600", "sampler=uniform", "clients_per_round=100", "local_mode=sgd", "local_steps=10",
         "batch_size=10", "lr=0.05", "chunk_size=100"]),
    "fl_std_dp": (
        "FL-STD + client-level DP (paper 000 Table III): fashion_cnn, N = 6000, C = 0.01 (~60 clients), 2 steps",
        ["experiment=kerkouche21_table3", "scheme=fl_std", "dp=true", "clipping_norm=0.4"]),
    "fl_cs_dp": (
        "FL-CS r = 0.05 + client-level DP (paper 000 Table III): as above, FISTA decoder, P = 4",
        ["experiment=kerkouche21_table3", "scheme=fl_cs", "r=0.05", "dp=true", "clipping_norm=0.11"]),
    "fedsketch": (
        "FedSKETCH-PRIVIX (50, 100) (paper 002): LeNet-5 / MNIST, 25 of 50 clients, τ = 5 SGD steps of batch 32",
        ["experiment=fedsketch_homogeneous", "scheme=fedsketch", "scheme.rows=50", "scheme.cols=100",
         "local_steps=5"]),
    "ldp_fedavg": (
        "DP-FedAvg, local Gaussian (paper 001 FEMNIST): FEMNIST CNN, 4 writers per round, E = 4 full-batch "
        "iterations, per-sample clipping",
        ["experiment=fu21_femnist"]),
}


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def build_sim(overrides: list[str], args, vectorized: bool, extra: list[str] = ()):
    from fedrun.run import build

    common = ["tracking=none", "progress=off", f"device={args.device}", f"vectorized={str(vectorized).lower()}",
              f"workers={args.workers}", *([f"data_root={args.data_root}"] if args.data_root else [])]
    return build(compose([*overrides, *common, *extra])).sim


def time_round(sim, rnd: int) -> float:
    t0 = time.perf_counter()
    clients = sim.select(rnd)
    sim.ledger.start_round()
    sim.scheme.round(sim, rnd, clients)
    sim.epsilon()
    if sim.device.type == "cuda":
        torch.cuda.synchronize(sim.device)
    return time.perf_counter() - t0


def device_line(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"


def bench_setting(name: str, args) -> dict:
    what, overrides = SETTINGS[name]
    base = torch.get_num_threads()
    vec, seq = build_sim(overrides, args, True), build_sim(overrides, args, False)
    threads = [1, base] if (base > 1 and args.device == "cpu") else [base]
    time_round(vec, 1), time_round(seq, 1)  # warm-up: allocations, vmap tracing, solver set-up
    tv, ts = [], {n: [] for n in threads}
    for rnd in range(2, args.rounds + 2):
        tv.append(time_round(vec, rnd))
        for n in threads:
            torch.set_num_threads(n)
            ts[n].append(time_round(seq, rnd))
        torch.set_num_threads(base)
    seq_med = {n: statistics.median(v) for n, v in ts.items()}
    best = min(seq_med, key=seq_med.get)
    return {"name": name, "what": what, "overrides": overrides, "vec": statistics.median(tv), "seq": seq_med,
            "best": best, "workers": vec.trainer.workers, "chunk": vec.trainer.chunk_size, "n": vec.n}


def emit(lines: list[str], args) -> int:
    """Print the table with the command that made it; also write it to ``args.out``."""
    out = args.out
    cmd = "python scripts/bench_training.py " + " ".join(shlex.quote(a) for a in args.argv)
    text = "\n".join([*lines, "", f"Command: `{cmd}`"])
    print(text)
    if out:
        from fedrun.report import save

        save(text + "\n", out)
    return 0


def cmd_speed(args) -> int:
    names = list(SETTINGS) if args.settings == ["all"] else args.settings
    for name in names:
        if name not in SETTINGS:
            print(f"bench: unknown setting {name!r}; choose from {', '.join(SETTINGS)} or all", file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    rows = []
    for name in names:
        print(f"[{time.perf_counter() - t0:6.0f}s] {name} ...", file=sys.stderr, flush=True)
        rows.append(bench_setting(name, args))
    lines = [
        f"Device: {args.device} — {device_line(args.device)}. Median of {args.rounds} timed rounds per path after "
        f"one warm-up round; whole rounds without evaluation. Vectorized: `torch.func` vmap over clients in chunks, "
        f"{rows[0]['workers']} worker thread(s). Sequential: one client after another, best of "
        f"{' and '.join(str(n) for n in sorted(rows[0]['seq']))} torch thread(s). Total {time.perf_counter() - t0:.0f} s.",
        "",
        "| setting | n params | sequential s/round (threads) | vectorized s/round | rounds/s seq → vec | speed-up |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ms = r["seq"][r["best"]]
        lines.append(f"| `{r['name']}`: {r['what']} | {r['n']:,} | {ms:.3f} ({r['best']}) | {r['vec']:.3f} | "
                     f"{1 / ms:.2f} → {1 / r['vec']:.2f} | {ms / r['vec']:.2f}× |")
    lines += ["", "Settings (Hydra overrides; each also gets `tracking=none vectorized=true|false`):", ""]
    lines += [f"- `{r['name']}`: `{' '.join(r['overrides'])}`" for r in rows]
    return emit(lines, args)


MEMORY_OVERRIDES = ["experiment=fu21_femnist", "dp=false", "scheme=fl_std", "partition.copies=2",
                    "sampler=uniform", "clients_per_round=350", "local_mode=gd", "local_steps=5",
                    "local_clip=null", "total_iterations=null", "rounds=1"]


def _memory_child(args) -> int:
    """One round in this process (the parent reads its peak RSS)."""
    sim = build_sim(MEMORY_OVERRIDES, args, True, [f"chunk_size={args.chunk_size}"])
    t0 = time.perf_counter()
    clients = sim.select(1)
    sim.ledger.start_round()
    sim.scheme.round(sim, 1, clients)
    samples = int(sim.data.sizes[clients].sum())
    print(f"clients={len(clients)} samples={samples} seconds={time.perf_counter() - t0:.1f} workers={sim.trainer.workers}")
    return 0


def cmd_memory(args) -> int:
    rows = []
    for chunk in args.chunk_sizes:
        cmd = [sys.executable, __file__, "memory-child", "--chunk-size", str(chunk), "--device", args.device,
               "--workers", str(args.workers), *(["--data-root", args.data_root] if args.data_root else [])]
        print(f"chunk_size={chunk}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        out = proc.stdout.read().strip()
        if os.waitstatus_to_exitcode(status) != 0:
            print(f"bench: chunk_size={chunk} failed: {out}", file=sys.stderr)
            return 1
        rows.append((chunk, usage.ru_maxrss / 2**20, time.perf_counter() - t0, out))  # ru_maxrss is KiB on Linux
    lines = [
        "Peak RSS of one round: FEMNIST CNN (214,590 parameters), 350 clients per round (212 writers × "
        "`partition.copies=2`), E = 5 full-batch GD iterations per client, vectorized path; the process also "
        f"holds the dataset and the Python/torch runtime. Device: {args.device} — {device_line(args.device)}.",
        "",
        "| chunk_size (clients per vmap block) | peak RSS (GiB) | process wall (s) | round |",
        "|---:|---:|---:|---|",
    ]
    lines += [f"| {c} | {rss:.2f} | {wall:.0f} | {out} |" for c, rss, wall, out in rows]
    lines += ["", "Overrides: `" + " ".join(MEMORY_OVERRIDES) + " chunk_size=<c>`"]
    return emit(lines, args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--device", default="cpu")
    common.add_argument("--data-root", default=None, help="default: the config's data_root / $FEDRUN_DATA")
    common.add_argument("--workers", default="auto", help="training threads of the vectorized path (auto = cores)")
    common.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    common.add_argument("--out", default=None, help="also write the markdown table to this file")
    s = sub.add_parser("speed", parents=[common], help="rounds/s, vectorized vs sequential")
    s.add_argument("--settings", nargs="+", default=["all"], help=f"any of {', '.join(SETTINGS)}, or all")
    s.add_argument("--rounds", type=int, default=3, help="timed rounds per path (after one warm-up round each)")
    m = sub.add_parser("memory", parents=[common], help="peak RSS of a 350-client FEMNIST round per chunk size")
    m.add_argument("--chunk-sizes", type=int, nargs="+", default=[10, 50])
    c = sub.add_parser("memory-child", parents=[common])
    c.add_argument("--chunk-size", type=int, required=True)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    return {"speed": cmd_speed, "memory": cmd_memory, "memory-child": _memory_child}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
