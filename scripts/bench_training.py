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

Each round of the vectorized path is also split into local training (the time spent inside the trainer: inside
each ``next()`` of ``sim.trainer.train``'s generator, or inside ``train_sequential``) and everything outside it:
client selection, encoding, aggregation with DP clipping and noise, decoding (FL-CS's L1 reconstruction), the
model update and the privacy accounting (``sim.epsilon()``). ``OVERHEAD_TARGETS`` holds the ceilings on that
outside share. On CUDA the clock synchronizes the device at each boundary, so asynchronous kernels are
charged to the phase that launched them; the vectorized path's peak CUDA memory of a timed round is reported too.

``memory``: peak resident memory (RSS) of one round of FEMNIST-CNN training with 350 clients per round and
E = 5 full-batch local iterations (paper 001's FEMNIST setting; the 212-writer sample is doubled with
``partition.copies=2``) for each client-chunk size, each in its own process (``os.wait4`` reports the child's
peak RSS).

    python scripts/bench_training.py speed                         # all settings, CPU
    python scripts/bench_training.py speed --settings fl_std_lenet --rounds 5
    python scripts/bench_training.py speed --device cuda           # the GPU figure
    python scripts/bench_training.py speed --device cuda --settings fl_std_lenet_1000   # 1,000 clients per round
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
    "fl_std_lenet_1000": (
        "FL-STD, LeNet-5 / Fashion-MNIST, 1,000 of 6,000 clients per round, 10 local SGD steps of batch 10 "
        "(the GPU target; not in the default CPU list)",
        ["dataset=fashion_mnist", "model=lenet5", "scheme=fl_std", "partition=iid", "dp=false",
         "num_clients=6000", "sampler=uniform", "clients_per_round=1000", "local_mode=sgd", "local_steps=10",
         "batch_size=10", "lr=0.05", "chunk_size=1000"]),
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

#: settings ``speed`` runs by default (``--settings all``): the 1,000-clients-per-round one is for GPUs
DEFAULT_SETTINGS = [name for name in SETTINGS if name != "fl_std_lenet_1000"]

#: the targets: ceilings on the share of a vectorized round spent outside local training, in percent
OVERHEAD_TARGETS: dict[str, float] = {"fl_std_lenet": 15.0, "fl_std_lenet_1000": 15.0, "fl_std_dp": 15.0,
                                      "fl_cs_dp": 30.0}


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


class TrainingClock:
    """Counts the seconds spent inside ``sim``'s trainer (local training) by wrapping the trainer instance's
    ``train`` (a generator: only the time inside each ``next()`` counts, not what the scheme does with a chunk
    between two of them) and ``train_sequential``. fedrun's code is not changed: the wrappers are instance
    attributes that shadow the methods."""

    def __init__(self, sim) -> None:
        self.seconds = 0.0
        trainer = sim.trainer
        train, train_sequential = trainer.train, trainer.train_sequential
        cuda = sim.device.type == "cuda"

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize(sim.device)

        def timed_train(*a, **kw):
            gen = train(*a, **kw)
            try:
                while True:
                    sync()
                    t0 = time.perf_counter()
                    try:
                        item = next(gen)
                    except StopIteration:
                        return
                    finally:
                        sync()
                        self.seconds += time.perf_counter() - t0
                    yield item
            finally:
                gen.close()

        def timed_train_sequential(*a, **kw):
            sync()
            t0 = time.perf_counter()
            try:
                return train_sequential(*a, **kw)
            finally:
                sync()
                self.seconds += time.perf_counter() - t0

        trainer.train, trainer.train_sequential = timed_train, timed_train_sequential


def time_round(sim, rnd: int) -> dict[str, float]:
    """One whole round (no evaluation): total seconds and its phases — ``select`` (client selection),
    ``train`` (inside the trainer), ``scheme`` (the rest of ``Simulation.run_round``: encode, aggregate with DP, decode,
    model update), ``accounting`` (``sim.epsilon()``) — and ``cuda_peak`` (bytes; 0 on the CPU)."""
    clock = getattr(sim, "_bench_clock", None)
    if clock is None:
        clock = sim._bench_clock = TrainingClock(sim)
    cuda = sim.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(sim.device)
        torch.cuda.reset_peak_memory_stats(sim.device)
    trained = clock.seconds
    t0 = time.perf_counter()
    clients = sim.select(rnd)
    t1 = time.perf_counter()
    sim.run_round(rnd, clients)
    if cuda:
        torch.cuda.synchronize(sim.device)
    t2 = time.perf_counter()
    sim.epsilon()
    t3 = time.perf_counter()
    train = clock.seconds - trained
    return {"total": t3 - t0, "select": t1 - t0, "train": train, "scheme": t2 - t1 - train, "accounting": t3 - t2,
            "cuda_peak": torch.cuda.max_memory_allocated(sim.device) if cuda else 0}


def floor_round(sim, rnd: int) -> float:
    """Seconds of round ``rnd``'s local steps run as ONE model on all selected clients' samples at once (per step,
    one plain ``nn.Module`` forward + backward of the concatenated batches, the masked mean loss; no clipping, no
    per-client anything) with torch's default threads: what the same samples cost without the split into
    clients, the reference the vectorized path's local-training time is compared with."""
    from fedrun.training import _masked_loss, batch_plan

    clients = sim.select(rnd)
    tr = sim.trainer
    idx, mask = batch_plan(tr.data, clients, tr.spec, tr.seed, rnd)
    module = sim.model
    params = [p for p in module.parameters() if p.requires_grad]
    x, y = tr.data.x, tr.data.y
    mask = mask.to(x.device, x.dtype)
    if sim.device.type == "cuda":
        torch.cuda.synchronize(sim.device)
    t0 = time.perf_counter()
    for t in range(tr.spec.steps):
        s = 0 if idx.shape[1] == 1 else t
        flat = idx[:, s].reshape(-1).to(x.device)
        loss = _masked_loss(module(x[flat]), y[flat], mask[:, s].reshape(-1), tr.spec.loss)
        torch.autograd.grad(loss, params)
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
    vmap = build_sim(overrides, args, True, ["batched_layers=false"])  # every model through torch.func vmap
    threads = [1, base] if (base > 1 and args.device == "cpu") else [base]
    time_round(vec, 1), time_round(seq, 1), time_round(vmap, 1)  # warm-up: allocations, vmap tracing, solver set-up
    tv, ts, tm = [], {n: [] for n in threads}, []
    for rnd in range(2, args.rounds + 2):
        tv.append(time_round(vec, rnd))
        tm.append(time_round(vmap, rnd)["total"])
        for n in threads:
            torch.set_num_threads(n)
            ts[n].append(time_round(seq, rnd)["total"])
        torch.set_num_threads(base)
    seq_med = {n: statistics.median(v) for n, v in ts.items()}
    best = min(seq_med, key=seq_med.get)
    floor_round(vec, 1)
    floor = statistics.median(floor_round(vec, rnd) for rnd in range(2, args.rounds + 2))  # one model
    phases = {k: statistics.median(r[k] for r in tv) for k in ("total", "select", "train", "scheme", "accounting")}
    phases["outside"] = statistics.median(r["total"] - r["train"] for r in tv)
    phases["share"] = 100 * statistics.median((r["total"] - r["train"]) / r["total"] for r in tv)
    return {"name": name, "what": what, "overrides": overrides, "vec": phases["total"], "seq": seq_med,
            "best": best, "workers": vec.trainer.workers, "chunk": vec.trainer.chunk_size, "n": vec.n,
            "phases": phases, "cuda_peak": max(r["cuda_peak"] for r in tv), "floor": floor,
            "vmap": statistics.median(tm), "batched": vec.trainer.batched is not None}


def overhead_line(rows: list[dict]) -> str:
    """The targets on the outside-training share (``OVERHEAD_TARGETS``), and whether each benchmarked one is met."""
    parts = []
    for r in rows:
        target = OVERHEAD_TARGETS.get(r["name"])
        if target is not None:
            share = r["phases"]["share"]
            parts.append(f"`{r['name']}` {share:.1f} % ≤ {target:.0f} %: {'met' if share <= target else 'NOT met'}")
    if not parts:
        return "Overhead targets (issue 14): none of these settings has one."
    return ("Overhead targets (issue 14; share of a vectorized round outside local training, ≤ 15 % for FL-STD, "
            "≤ 30 % for FL-CS with its L1 decoder): " + "; ".join(parts) + ".")


def speed_table(rows: list[dict], cuda: bool) -> list[str]:
    """The speed table's markdown lines (header, rule, one row per setting)."""
    lines = [
        "| setting | n params | sequential s/round (threads) | vectorized s/round | rounds/s seq → vec | speed-up "
        "| vmap-only s/round | one model, same samples s/round | vectorized ÷ one model "
        "| local training s | outside training s | outside share % | selection s | encode+aggregate+decode s "
        "| accounting s |" + (" peak CUDA memory GiB |" if cuda else ""),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if cuda else ""),
    ]
    for r in rows:
        ms, ph = r["seq"][r["best"]], r["phases"]
        vec = f"{r['vec']:.3f}" + ("" if r.get("batched", True) else " (vmap)")
        vmap, floor = r.get("vmap"), r.get("floor")
        extra = (f"{vmap:.3f} | " if vmap else "– | ") + (f"{floor:.3f} | {ph['train'] / floor:.2f} | " if floor
                                                         else "– | – | ")
        lines.append(f"| `{r['name']}`: {r['what']} | {r['n']:,} | {ms:.3f} ({r['best']}) | {vec} | "
                     f"{1 / ms:.2f} → {1 / r['vec']:.2f} | {ms / r['vec']:.2f}× | {extra}{ph['train']:.3f} | "
                     f"{ph['outside']:.3f} | {ph['share']:.1f} | {ph['select']:.4f} | {ph['scheme']:.3f} | "
                     f"{ph['accounting']:.4f} |" + (f" {r['cuda_peak'] / 2**30:.2f} |" if cuda else ""))
    return lines


def emit(lines: list[str], args) -> int:
    """Print the table with the command that made it; also write it to ``args.out``."""
    out = args.out
    cmd = "python scripts/bench_training.py " + " ".join(shlex.quote(a) for a in args.argv)
    text = "\n".join([*lines, "", f"Command: `{cmd}`"])
    print(text)
    if out:
        from fedrun.reports import save

        save(text + "\n", out)
    return 0


def cmd_speed(args) -> int:
    names = list(DEFAULT_SETTINGS) if args.settings == ["all"] else args.settings
    for name in names:
        if name not in SETTINGS:
            print(f"bench: unknown setting {name!r}; choose from {', '.join(SETTINGS)} or all", file=sys.stderr)
            return 2
    cuda = args.device.startswith("cuda")
    t0 = time.perf_counter()
    rows = []
    for name in names:
        print(f"[{time.perf_counter() - t0:6.0f}s] {name} ...", file=sys.stderr, flush=True)
        rows.append(bench_setting(name, args))
    lines = [
        f"Device: {args.device} — {device_line(args.device)}. Median of {args.rounds} timed rounds per path after "
        f"one warm-up round; whole rounds without evaluation. Vectorized: every client of a chunk at once — "
        f"client-batched layers (grouped channels-last convolutions, batched matmuls, per-sample norms from "
        f"activations; `fedrun/models/batched.py`) for the papers' conv nets, else `torch.func` vmap — in "
        f"{rows[0]['workers']} worker thread(s). Sequential: one client after another, best of "
        f"{' and '.join(str(n) for n in sorted(rows[0]['seq']))} torch thread(s). Total {time.perf_counter() - t0:.0f} s.",
        "",
        "vmap-only: the vectorized path with `batched_layers=false` (every model through `torch.func` vmap, as "
        "before the client-batched layers), timed in the same run.",
        "",
        "One model, same samples: the round's local steps run as ONE model on all selected clients' samples at "
        "once (per step one plain `nn.Module` forward + backward of the concatenated batches, torch's default "
        "threads; no clipping, no per-client parameters); `vectorized ÷ one model` compares the vectorized "
        "path's local-training time with it. At ≤ 1 the split into clients costs nothing more than one big "
        "batch would; a faster round then needs faster convolution kernels, not better batching.",
        "",
        *speed_table(rows, cuda),
    ]
    lines += ["", overhead_line(rows)]
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
    sim.run_round(1, clients)
    samples = int(sim.data.sizes[clients].sum())
    cuda = ""
    if sim.device.type == "cuda":
        torch.cuda.synchronize(sim.device)
        cuda = f" cuda_peak_allocated_gib={torch.cuda.max_memory_allocated(sim.device) / 2**30:.2f}"
    print(f"clients={len(clients)} samples={samples} seconds={time.perf_counter() - t0:.1f} "
          f"workers={sim.trainer.workers}{cuda}")
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
        f"holds the dataset and the Python/torch runtime. Device: {args.device} — {device_line(args.device)}."
        + (" On CUDA, `cuda_peak_allocated_gib` is the round's `torch.cuda.max_memory_allocated` (device memory; "
           "the RSS is host memory)." if args.device.startswith("cuda") else ""),
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
    s.add_argument("--settings", nargs="+", default=["all"],
                   help=f"any of {', '.join(SETTINGS)}, or all (= {', '.join(DEFAULT_SETTINGS)})")
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
