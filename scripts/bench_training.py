#!/usr/bin/env python
"""Rounds per second of FL-STD local training: vectorized (vmap over clients) vs sequential, same run.

Default setting (issue #2): LeNet-5 on Fashion-MNIST, 100 clients per round, 10 local SGD steps of
batch 10. Both paths run the same rounds (same clients, same batches) alternately, and the table reports
the median seconds per round of each and their ratio, measured in this one process.

    python scripts/bench_training.py                      # CPU, the issue's setting
    python scripts/bench_training.py --device cuda        # one GPU figure
    python scripts/bench_training.py --chunk-size 25 --rounds 5
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch
from omegaconf import OmegaConf


def build_sim(args, vectorized: bool):
    from fedrun.run import build

    cfg = {
        "rounds": args.rounds, "seed": 0, "device": args.device, "data_root": args.data_root,
        "num_clients": args.num_clients, "sample_rate": 0.1, "clients_per_round": args.clients_per_round,
        "local_mode": "sgd", "local_steps": args.local_steps, "batch_size": args.batch_size, "lr": 0.05,
        "local_clip": None, "local_clip_mode": "batch", "r": 1.0, "dp": False, "epsilon": None, "delta": 1e-5, "noise_multiplier": None,
        "clipping_norm": 1.0, "accountant": "rdp", "eval_every": 1, "patience": 0, "validation_fraction": 0.1,
        "vectorized": vectorized, "chunk_size": args.chunk_size, "workers": args.workers, "progress": "off",
        "dataset": OmegaConf.to_container(OmegaConf.load(f"conf/dataset/{args.dataset}.yaml")),
        "model": {"name": args.model}, "partition": {"name": "iid"},
        "sampler": {"_target_": "fedrun.sampling.UniformSampler", "clients_per_round": args.clients_per_round},
        "scheme": {"_target_": "fedrun.schemes.fedavg.FedAvg", "server_lr": 1.0},
        "tracking": {"kind": "none"},
    }
    return build(cfg).sim


def time_round(sim, rnd: int) -> float:
    clients = sim.select(rnd)
    sim.ledger.start_round()
    if sim.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    sim.scheme.round(sim, rnd, clients)
    if sim.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="fashion_mnist")
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--num-clients", type=int, default=600)
    ap.add_argument("--clients-per-round", type=int, default=100)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--chunk-size", type=int, default=100)
    ap.add_argument("--workers", default="auto", help="training threads of the vectorized path (auto = cores)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per path (after one warm-up round each)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = ap.parse_args(argv)
    args.workers = args.workers if args.workers == "auto" else int(args.workers)
    if args.threads:
        torch.set_num_threads(args.threads)
    vec, seq = build_sim(args, True), build_sim(args, False)
    base_threads = torch.get_num_threads()
    seq_threads = sorted({1, base_threads})
    time_round(vec, 0), time_round(seq, 0)  # warm-up (allocations, vmap tracing)
    tv, ts = [], {n: [] for n in seq_threads}
    for rnd in range(1, args.rounds + 1):  # alternate so all paths see the same machine load
        tv.append(time_round(vec, rnd))
        for n in seq_threads:  # the sequential baseline at each thread count; the best one counts
            torch.set_num_threads(n)
            ts[n].append(time_round(seq, rnd))
        torch.set_num_threads(base_threads)
    mv = statistics.median(tv)
    seq_median = {n: statistics.median(v) for n, v in ts.items()}
    best_n = min(seq_median, key=seq_median.get)
    ms = seq_median[best_n]
    dev = torch.cuda.get_device_name() if vec.device.type == "cuda" else f"{platform.processor() or 'cpu'}, " \
        f"{torch.get_num_threads()} threads"
    print(f"setting: {args.model} on {args.dataset}, {args.clients_per_round} clients/round, {args.local_steps} "
          f"local steps of batch {args.batch_size}, chunk {args.chunk_size}; device {args.device} ({dev}); "
          f"torch {torch.__version__}; median of {args.rounds} rounds\n")
    print("| path | s/round | rounds/s |\n|---|---|---|")
    for n, m in seq_median.items():
        print(f"| sequential (per-client nn.Module + autograd), {n} torch thread(s) | {m:.3f} | {1 / m:.2f} |")
    print(f"| vectorized (torch.func vmap over clients, {vec.trainer.workers} worker thread(s)) | {mv:.3f} | "
          f"{1 / mv:.2f} |")
    print(f"\nspeed-up vectorized / best sequential ({best_n} thread(s)): {ms / mv:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
