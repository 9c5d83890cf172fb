#!/usr/bin/env python
"""Evaluation speed: fedrun's ``Simulation.evaluate`` path vs a plain ``nn.Module`` forward of the same
architecture under ``torch.inference_mode`` (the best of several batch sizes and memory formats), measured in
the same run on the 10,000 Fashion-MNIST test images (fashion_cnn) and MNIST (lenet5). Best of 7 interleaved
repeats each.

    .venv/bin/python scripts/bench_eval.py --out results/bench/eval.md
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fedrun.data.sources import load_dataset  # noqa: E402
from fedrun.models.flat import FlatParams  # noqa: E402
from fedrun.models.nets import build_model  # noqa: E402
from fedrun.training import EVAL_BATCH_SIZE, eval_copy, evaluate  # noqa: E402


def interleaved(variants: dict, repeats: int) -> dict:
    """Best time of each variant over ``repeats`` rounds, each round running every variant once (after one
    warm-up round), so that the machine's drift hits every variant alike."""
    for f in variants.values():
        f()
    best = {k: float("inf") for k in variants}
    for _ in range(repeats):
        for k, f in variants.items():
            t0 = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def plain_forward(model: torch.nn.Module, x: torch.Tensor, batch: int, channels_last: bool):
    m = build_model_copy(model, channels_last)

    def f():
        with torch.inference_mode():
            for s in range(0, len(x), batch):
                xb = x[s:s + batch]
                if channels_last:
                    xb = xb.contiguous(memory_format=torch.channels_last)
                m(xb).argmax(-1)
    return f


def build_model_copy(model: torch.nn.Module, channels_last: bool) -> torch.nn.Module:
    import copy

    m = copy.deepcopy(model)
    return m.to(memory_format=torch.channels_last) if channels_last else m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for dataset, model_name in (("fashion_mnist", "fashion_cnn"), ("mnist", "lenet5")):
        ds = load_dataset(dataset, None)
        x, y = ds.x_test, ds.y_test
        torch.manual_seed(0)
        model = build_model(model_name, num_classes=10)
        layout = FlatParams(model)
        params = layout.flatten(model)
        ev = eval_copy(model, "cpu")  # what Simulation.evaluate runs
        variants = {"fedrun": lambda: evaluate(ev, layout, params, x, y, "cross_entropy")}
        variants.update({(b, cl): plain_forward(model, x, b, cl) for b in (250, 500, 1000) for cl in (False, True)})
        times = interleaved(variants, args.repeats)  # each repeat runs every variant once: drift hits all alike
        fedrun_s = times.pop("fedrun")
        plain = times
        (b, cl), best = min(plain.items(), key=lambda kv: kv[1])
        rows.append((dataset, model_name, len(x), fedrun_s, best, b, cl, plain))
        print(f"{model_name}: fedrun {fedrun_s:.3f} s, best plain {best:.3f} s (batch {b}, channels_last={cl}), "
              f"ratio {fedrun_s / best:.2f}", flush=True)
    lines = ["# Evaluation: fedrun vs a plain forward, same run", "",
             f"Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
             f"{torch.__version__}. Command: `.venv/bin/python scripts/bench_eval.py --out results/bench/eval.md`. "
             f"fedrun's `Simulation.evaluate` path (batch {EVAL_BATCH_SIZE}, channels-last copy of a conv net, params copied in, inference_mode) vs "
             "the best plain `nn.Module` forward under inference_mode over batch 250/500/1000 × contiguous/"
             "channels-last; best of 7 interleaved repeats each. Target (issue 14): ratio ≤ 1.2.", "",
             "| model | test images | fedrun evaluate (s) | best plain forward (s) | its batch, memory format | ratio |",
             "|---|---|---|---|---|---|"]
    for dataset, model_name, n, f_s, best, b, cl, _ in rows:
        lines.append(f"| {model_name} ({dataset}) | {n} | {f_s:.3f} | {best:.3f} | {b}, "
                     f"{'channels-last' if cl else 'contiguous'} | {f_s / best:.2f} |")
    lines += ["", "All plain settings (s):", ""]
    for dataset, model_name, *_, plain in rows:
        lines.append(f"- {model_name}: " + ", ".join(f"b{b}{' cl' if cl else ''} {t:.3f}" for (b, cl), t in plain.items()))
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
