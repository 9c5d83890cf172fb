"""Benchmark of fedrun.compress: per-round cost and quality of FL-CS / FL-FREQ compression (paper 000).

One round = K clients compress their updates (batched ``[K, n] -> [K, m]``), the server averages the K
messages, then decodes the average: zero-filled inverse DCT (FL-FREQ) or BPDN reconstruction (FL-CS) with
FISTA or OWL-QN, unchunked (P = 1) or chunked (P > 1, shuffled). Rows compare the FFT-based DCT with the
explicit Φ matrix (only where Φ fits in ``--matrix-max-mb``), and the solvers and chunkings. One extra
P = 1 row zero-pads the update to a 5-smooth length ``c`` (``pad_to_fast_len=True``): same first-m
low-frequency idea, a much faster FFT when n has a large prime factor (61,706 = 2·30,853).

Update vectors are real FL client updates, not synthetic: a model is first trained centrally for
``--warmup-steps`` SGD steps, then each of the K clients runs ``--local-steps`` SGD steps from it on its
own shard and sends Δw_k = w_k − w. Inputs are Fashion-MNIST (read from ``--data-root``, the IDX .gz
files) when present, else random N(0, 1) images with random labels (the table says which). Models:
``lenet5`` (LeNet-5, n = 61,706), ``cnn100k`` (fedrun's Fashion-MNIST CNN, n = 114,314, the n ≈ 100k of
the 1 s target) and ``mlp1m`` (MLP 784-1024-192-10, n = 1,002,570).

Quality columns: ``rel_err = ‖ŝ − x‖/‖x‖`` and ``cos = cos(ŝ, x)`` for the true average update x; the
``best m-term`` row is the best any decoder with m numbers could do (keep x's m largest entries).

``--sweep-lambda`` instead prints reconstruction error against ``lam_rel = λ/λ_max`` (the data behind
``fedrun.compress.cs.DEFAULT_LAM_REL``).

Example::

    .venv/bin/python scripts/bench_compress.py --models lenet5 cnn100k mlp1m --r 0.05 --clients 10
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedrun.compress.cs import DEFAULT_LAM_REL, DCTCompressor
from fedrun.compress.dct import dct_matrix
from fedrun.compress.l1 import bpdn

MODELS: dict[str, Callable[[], nn.Module]] = {
    "lenet5": lambda: nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
    ),
    "cnn100k": lambda: nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10),
    ),
    "mlp1m": lambda: nn.Sequential(
        nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 192), nn.ReLU(), nn.Linear(192, 10),
    ),
}


# -- realistic update vectors --------------------------------------------------------------------------
def load_fashion_mnist(root: Path, limit: int = 20000) -> tuple[torch.Tensor, torch.Tensor] | None:
    """First ``limit`` Fashion-MNIST training images (standardised) and labels, or None if absent."""
    images, labels = root / "FashionMNIST/raw/train-images-idx3-ubyte.gz", root / "FashionMNIST/raw/train-labels-idx1-ubyte.gz"
    if not (images.is_file() and labels.is_file()):
        return None
    with gzip.open(images) as f:
        x = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)[:limit]
    with gzip.open(labels) as f:
        y = np.frombuffer(f.read(), dtype=np.uint8, offset=8)[:limit]
    x = torch.from_numpy(x.astype(np.float32) / 255.0)
    return (x - 0.286) / 0.353, torch.from_numpy(y.astype(np.int64))


def client_updates(
    model_name: str, clients: int, data: tuple[torch.Tensor, torch.Tensor], warmup_steps: int, local_steps: int, seed: int
) -> torch.Tensor:
    """``[K, n]`` FL client updates Δw_k = w_k − w of ``model_name`` (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # model initialisation only: this is a script, not library code
    model = MODELS[model_name]()
    x, y = data
    loss_fn = nn.CrossEntropyLoss()

    def sgd(net: nn.Module, steps: int, idx: torch.Tensor) -> None:
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        for _ in range(steps):
            batch = idx[torch.randint(len(idx), (32,), generator=gen)]
            opt.zero_grad()
            loss_fn(net(x[batch]), y[batch]).backward()
            opt.step()

    sgd(model, warmup_steps, torch.arange(len(x)))
    w = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    shards = torch.randperm(len(x), generator=gen).chunk(clients)
    updates = []
    for shard in shards:
        nn.utils.vector_to_parameters(w.clone(), model.parameters())  # clone: parameters become views of it
        sgd(model, local_steps, shard)
        updates.append(nn.utils.parameters_to_vector(model.parameters()).detach() - w)
    return torch.stack(updates)


# -- measurement helpers -------------------------------------------------------------------------------
def timed(fn: Callable[[], object], repeat: int) -> tuple[tuple[float, float], object]:
    """Median (wall, CPU) seconds of ``fn()`` over ``repeat`` runs after one warm-up run (``repeat=0``: the
    single run itself is timed), and its result. CPU time (``time.process_time``) is what the wall time would
    be on an idle machine when torch runs one thread; on a loaded shared machine the wall time is inflated."""
    out = fn() if repeat else None
    walls, cpus = [], []
    for _ in range(max(1, repeat)):
        wall, cpu = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return (statistics.median(walls), statistics.median(cpus)), out


def quality(s: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    """(‖s − x‖/‖x‖, cos(s, x))."""
    rel = float((s - x).norm() / x.norm())
    cos = float(torch.dot(s, x) / (s.norm() * x.norm())) if float(s.norm()) > 0 else 0.0
    return rel, cos


def best_m_term(x: torch.Tensor, m: int) -> torch.Tensor:
    out = torch.zeros_like(x)
    idx = x.abs().topk(m).indices
    out[idx] = x[idx]
    return out


# -- the benchmark ---------------------------------------------------------------------------------------
def bench_model(name: str, updates: torch.Tensor, args: argparse.Namespace) -> list[list[str]]:
    """Rows ``[model, n, P, operator, decoder, compress ms, decode ms, round ms, round CPU ms, rel_err, cos, iters]``."""
    clients, n = updates.shape
    x = updates.mean(0)
    rows: list[list[str]] = []

    def row(chunks: int | str, operator: str, decoder: str, t_comp: tuple[float, float] | None,
            t_dec: tuple[float, float] | None, s: torch.Tensor | None, it: int | str = "") -> None:
        ms = lambda t: "" if t is None else f"{t * 1e3:,.1f}"  # noqa: E731
        wall = None if t_comp is None or t_dec is None else t_comp[0] + t_dec[0]
        cpu = None if t_comp is None or t_dec is None else t_comp[1] + t_dec[1]
        rel, cos = quality(s, x) if s is not None else ("", "")
        rows.append([name, f"{n:,}", str(chunks), operator, decoder, ms(t_comp and t_comp[0]), ms(t_dec and t_dec[0]),
                     ms(wall), ms(cpu), rel if rel == "" else f"{rel:.3f}", cos if cos == "" else f"{cos:.3f}", str(it)])

    m = DCTCompressor(n, args.r).m
    row("", "", f"oracle: best {m}-term approximation of x", None, None, best_m_term(x, m))
    layouts = [(chunks, None) for chunks in args.chunks]
    if 1 in args.chunks and not args.no_padded_p1:
        layouts.insert(args.chunks.index(1) + 1, (1, True))  # P = 1 with the update zero-padded to a fast FFT length
    for chunks, pad in layouts:
        comp = DCTCompressor(n, args.r, chunks=chunks, seed=args.seed, pad_to_fast_len=pad)
        operator = f"FFT DCT, c={comp.chunk_len}" + (", shuffled" if comp.shuffle else "")
        t_comp, y = timed(lambda comp=comp: comp.compress(updates).mean(0), args.repeat)
        if chunks == 1 and not pad:
            t_dec, s = timed(lambda: comp.zero_fill(y), args.repeat)
            row(chunks, operator, "zero-fill Φᵀy (FL-FREQ)", t_comp, t_dec, s)
        for solver in args.solvers if not pad else ["fista"]:
            if solver == "owlqn" and comp.chunk_len > args.owlqn_max_chunk:
                row(chunks, operator, f"BPDN owlqn: skipped (chunk > --owlqn-max-chunk)", t_comp, None, None)
                continue

            def run(comp: DCTCompressor = comp, y: torch.Tensor = y, solver: str = solver):
                return comp.reconstruct_with_info(y, args.lam_rel, solver, args.max_iter, args.tol)

            t_dec, sol = timed(run, 0 if solver == "owlqn" or n > 500_000 else 1)
            row(chunks, operator, f"BPDN {solver}", t_comp, t_dec, sol.s, sol.iterations)
    mib = m * n * 4 / 2**20
    if mib > args.matrix_max_mb:
        row(1, f"explicit Φ: skipped ({mib:,.0f} MiB > --matrix-max-mb)", "", None, None, None)
        return rows
    phi = dct_matrix(n, m, dtype=torch.float32)
    t_comp, y = timed(lambda: (updates @ phi.T).mean(0), args.repeat)
    t_dec, s = timed(lambda: y @ phi, args.repeat)
    row(1, f"explicit Φ matmul ({mib:,.0f} MiB)", "zero-fill Φᵀy (FL-FREQ)", t_comp, t_dec, s)
    if "fista" in args.solvers:
        lam = args.lam_rel * float((y @ phi).abs().max())
        t_dec, sol = timed(lambda: bpdn(lambda v: v @ phi.T, lambda v: v @ phi, y, lam, "fista", None, args.max_iter, args.tol), 0)
        row(1, f"explicit Φ matmul ({mib:,.0f} MiB)", "BPDN fista", t_comp, t_dec, sol.s, sol.iterations)
    return rows


def sweep_lambda(name: str, updates: torch.Tensor, args: argparse.Namespace) -> list[list[str]]:
    """Rows ``[model, r, layout, lam_rel, rel_err, cos, iterations]``: BPDN error against λ/λ_max."""
    x = updates.mean(0)
    n = x.numel()
    rows = []
    for r in args.sweep_r:
        for chunks in args.chunks:
            comp = DCTCompressor(n, r, chunks=chunks, seed=args.seed)
            y = comp.compress(updates).mean(0)
            layout = f"P={chunks}" + (" shuffled" if comp.shuffle else "")
            rel, cos = quality(comp.zero_fill(y), x)
            rows.append([name, str(r), layout, "zero-fill", f"{rel:.3f}", f"{cos:.3f}", ""])
            for lam_rel in args.sweep_lam:
                sol = comp.reconstruct_with_info(y, lam_rel, "fista", args.max_iter, args.tol)
                rel, cos = quality(sol.s, x)
                rows.append([name, str(r), layout, str(lam_rel), f"{rel:.3f}", f"{cos:.3f}", str(sol.iterations)])
    return rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["lenet5", "cnn100k", "mlp1m"], choices=sorted(MODELS))
    parser.add_argument("--r", type=float, default=0.05, help="compression ratio m/n")
    parser.add_argument("--clients", type=int, default=10, help="K clients compressing per round")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--no-padded-p1", action="store_true", help="skip the P = 1 row padded to a fast FFT length")
    parser.add_argument("--solvers", nargs="+", default=["fista", "owlqn"], choices=["fista", "owlqn"])
    parser.add_argument("--lam-rel", type=float, default=DEFAULT_LAM_REL)
    parser.add_argument("--max-iter", type=int, default=300)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions (median) of compress and zero-fill; BPDN: 1")
    parser.add_argument("--matrix-max-mb", type=float, default=1024, help="largest explicit Φ (float32) to build")
    parser.add_argument("--owlqn-max-chunk", type=int, default=200_000, help="skip OWL-QN for longer chunks (slow)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1: a shared 2-core machine oversubscribes with 2)")
    parser.add_argument("--warmup-steps", type=int, default=300)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-root", type=Path, default=Path(os.environ.get("FEDRUN_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")))
    parser.add_argument("--sweep-lambda", action="store_true", help="print error vs lam_rel instead of timings")
    parser.add_argument("--sweep-r", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    parser.add_argument("--sweep-lam", type=float, nargs="+", default=[0.5, 0.2, 0.1, 0.05, 0.02, 0.01])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    data = load_fashion_mnist(args.data_root)
    source = f"Fashion-MNIST from {args.data_root}"
    if data is None:
        gen = torch.Generator().manual_seed(args.seed)
        data = torch.randn(20000, 1, 28, 28, generator=gen), torch.randint(10, (20000,), generator=gen)
        source = "random N(0,1) images, random labels (no Fashion-MNIST under --data-root)"
    print(f"updates: K={args.clients} FL client updates ({args.warmup_steps} central warm-up SGD steps, then "
          f"{args.local_steps} local SGD steps each, batch 32, lr 0.05) on {source}; torch threads={args.threads}\n")
    rows = []
    for name in args.models:
        updates = client_updates(name, args.clients, data, args.warmup_steps, args.local_steps, args.seed)
        rows += sweep_lambda(name, updates, args) if args.sweep_lambda else bench_model(name, updates, args)
    if args.sweep_lambda:
        print(markdown(["model", "r", "layout", "lam_rel", "rel_err", "cos", "iters"], rows))
    else:
        print(f"r = {args.r}, lam_rel = {args.lam_rel}, max_iter = {args.max_iter}, tol = {args.tol}. compress = K clients "
              f"compress [K, n] -> [K, m] + server mean; round = compress + decode; ms = median wall time, CPU ms = process time.\n")
        print(markdown(["model", "n", "P", "operator", "decoder", "compress ms", "decode ms", "round ms", "round CPU ms",
                        "rel_err", "cos", "iters"], rows))


if __name__ == "__main__":
    main()
