"""Benchmark the count sketch (fedrun.compress.sketch): sketch and unsketch times, printed as markdown.

Cases: ``--clients`` clients × ``--dim`` parameters sketched in ONE batched op (and, in the same run, a Python
loop over the clients for comparison), and one ``--big-dim`` vector; for each ``(t, k)`` in ``--configs``.
The unsketch columns decode one (averaged) sketch ``[t, k] → [d]`` as a FedSKETCH round does.

    .venv/bin/python scripts/bench_sketch.py                      # defaults: 25 × 60,000 and 1,000,000
    .venv/bin/python scripts/bench_sketch.py --accuracy           # plus relative errors vs m
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch

from fedrun.compress.sketch import CountSketch


def timed(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median wall time in ms over ``repeats`` calls, after one warm-up call."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def heavy_tailed(shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
    u = torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.tan(math.pi * (u - 0.5)).float().to(device)


def bench_row(
    label: str, clients: int, dim: int, t: int, k: int, args: argparse.Namespace, cache: bool | None = None
) -> str:
    device = torch.device(args.device)
    start = time.perf_counter()
    cs = CountSketch(dim, t, k, seed=0, device=device, cache_hashes=cache)
    build_ms = 1e3 * (time.perf_counter() - start)
    cached = cs._flat_cache is not None  # noqa: SLF001 — reported, not used
    X = heavy_tailed((clients, dim), seed=1, device=device) if clients > 1 else heavy_tailed((dim,), 1, device)
    sketch_ms = timed(lambda: cs.sketch(X), args.repeats, device)
    if clients > 1:
        loop_ms = timed(lambda: torch.stack([cs.sketch(x) for x in X]), args.repeats, device)
        loop = f"{loop_ms:.1f}"
        ratio = f"{loop_ms / sketch_ms:.2f}×"
        S = cs.sketch(X).mean(dim=0)
        x_bar = X.mean(dim=0)
    else:
        loop = ratio = "—"
        S = cs.sketch(X)
        x_bar = X
    privix_ms = timed(lambda: cs.privix(S), args.repeats, device)
    heaprix_ms = timed(lambda: cs.heaprix(S), args.repeats, device)
    H = cs.heavy_hitters(S)
    values = x_bar[H]
    exact_ms = timed(lambda: cs.heaprix(S, exact_heavy_values=values, indices=H), args.repeats, device)
    return (
        f"| {label} | {t}×{k} | {cs.compression_ratio:.1f}× | {'yes' if cached else 'no'} | {build_ms:.0f} | "
        f"{sketch_ms:.1f} | {loop} | {ratio} | {privix_ms:.1f} | {heaprix_ms:.1f} | {exact_ms:.1f} |"
    )


def accuracy_table(dim: int, configs: list[tuple[int, int]], seeds: int) -> list[str]:
    """Mean relative L2 error ‖x̂ − x‖/‖x‖ on Cauchy vectors: PRIVIX, and HEAPRIX vs the number of heavy m."""
    lines = [
        "",
        f"Relative error ‖x̂ − x‖/‖x‖ on standard-Cauchy vectors, d = {dim:,}, mean of {seeds} seeds "
        "(HEAPRIX: sketch-only / with exact heavy values):",
        "",
        "| t×k | PRIVIX | m = k/4 | m = k/2 | m = k |",
        "|---|---|---|---|---|",
    ]
    for t, k in configs:
        errs: dict[str, float] = {}
        ms = [max(1, k // 4), max(1, k // 2), k]
        for seed in range(seeds):
            x = heavy_tailed((dim,), seed=100 + seed, device=torch.device("cpu"))
            cs = CountSketch(dim, t, k, seed=seed)
            S = cs.sketch(x)
            norm = float(x.norm())
            errs["p"] = errs.get("p", 0.0) + float((cs.privix(S) - x).norm()) / norm / seeds
            for m in ms:
                H = cs.heavy_hitters(S, m)
                for mode, values in (("s", None), ("x", x[H])):
                    est = cs.heaprix(S, m, values, indices=H)
                    key = f"{mode}{m}"
                    errs[key] = errs.get(key, 0.0) + float((est - x).norm()) / norm / seeds
        cells = " | ".join(f"{errs[f's{m}']:.3f} / {errs[f'x{m}']:.3f}" for m in ms)
        lines.append(f"| {t}×{k} | {errs['p']:.3f} | {cells} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=25, help="clients sketched in one batched op")
    parser.add_argument("--dim", type=int, default=60_000, help="parameters per client (LeNet-5 ≈ 60k)")
    parser.add_argument("--big-dim", type=int, default=1_000_000, help="length of the single large vector")
    parser.add_argument("--configs", default="20x40,50x100", help="comma-separated t×k sketch sizes")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per cell (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--big-cache", choices=["auto", "both"], default="both",
                        help="big vector: default caching rule only, or both on-the-fly and cached hashes")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--accuracy", action="store_true", help="also print relative errors vs m")
    parser.add_argument("--accuracy-seeds", type=int, default=5)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = [tuple(int(v) for v in c.lower().split("x")) for c in args.configs.split(",")]

    print(f"device={args.device}, torch {torch.__version__}, threads={torch.get_num_threads()}, "
          f"median of {args.repeats} calls; times in ms")
    print()
    print("| case | t×k | d/(t·k) | hashes cached | build | sketch (batched) | sketch (loop over clients) | "
          "loop / batched | PRIVIX [t,k]→[d] | HEAPRIX sketch-only | HEAPRIX exact heavy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for t, k in configs:
        print(bench_row(f"{args.clients} × {args.dim:,}", args.clients, args.dim, t, k, args))
    caches = {"auto": [None], "both": [False, True]}[args.big_cache]
    for cache in caches:
        for t, k in configs:
            print(bench_row(f"1 × {args.big_dim:,}", 1, args.big_dim, t, k, args, cache))
    if args.accuracy:
        print("\n".join(accuracy_table(args.dim, configs, args.accuracy_seeds)))


if __name__ == "__main__":
    main()
