#!/usr/bin/env python
"""What the deployment stages cost a round (fedrun/deployment.py): the simulated clock and SecAgg's field sum.

For each setting three simulations are built from the same config: ``off`` (network=none secagg=none: the round as
before these stages existed), ``clock`` (network=mobile with availability 1 and no over-selection, so the same
clients train as in ``off``) and ``clock+secagg`` (the same plus secagg=secagg_plus). After one warm-up round each,
the timed rounds alternate between them (same round, same clients), so all three see the same machine load. The
clock's own cost is the time spent inside ``Deployment.admit`` and ``Deployment.close`` (the per-client draws, the
timing formulas, the report goal, SecAgg's cost model), measured inside the ``clock`` simulation's rounds and given
as a share of its round (target ≤ 2 %); the whole-round ratios clock ÷ off and clock+secagg ÷ off are beside it.

    python scripts/bench_deploy.py --rounds 5 --out results/bench/deploy.md
"""

from __future__ import annotations

import argparse
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SETTINGS: dict[str, tuple[str, list[str], list[str]]] = {
    "fl_std_dp": ("FL-STD + client-level DP, paper 000's setting (fashion_cnn, N = 6000, C = 0.01)",
                  ["experiment=kerkouche21_default", "scheme=fl_std", "clipping_norm=0.4"], []),
    "fl_cs_dp": ("FL-CS r = 0.05 + client-level DP, paper 000's setting", ["experiment=kerkouche21_default"], []),
    "fedsketch": ("FedSKETCH-PRIVIX (50, 100), paper 002's setting (LeNet-5 / MNIST, 25 of 50 clients)",
                  ["experiment=fedsketch_homogeneous", "+fedsketch_run=[fs_privix,sketch50x100,tau1]"],
                  ["secagg.clip=0.01"]),
}
CLOCK = ["network=mobile", "network.availability=1.0", "network.over_selection=1.0"]
CLOCK_SHARE_TARGET = 2.0  # % of a round


def build(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from fedrun.run import build as build_run

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, "tracking=none", "progress=off"])
    return build_run(OmegaConf.to_container(cfg, resolve=True)).sim


class StageTimer:
    """Seconds spent inside a deployment's admit and close."""

    def __init__(self, dep) -> None:
        self.seconds = 0.0
        for name in ("admit", "close"):
            setattr(dep, name, self._timed(getattr(dep, name)))

    def _timed(self, fn):
        def call(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
        return call


def bench(name: str, rounds: int) -> dict:
    what, base, secagg_extra = SETTINGS[name]
    sims = {"off": build(base), "clock": build(base + CLOCK),
            "clock+secagg": build(base + CLOCK + ["secagg=secagg_plus", *secagg_extra])}
    timer = StageTimer(sims["clock"].deployment)
    for sim in sims.values():  # warm-up
        sim.run_round(1, sims["off"].select(1))
    timer.seconds = 0.0
    times: dict[str, list[float]] = {k: [] for k in sims}
    stage: list[float] = []
    for rnd in range(2, rounds + 2):
        clients = sims["off"].select(rnd)
        for key, sim in sims.items():
            before = timer.seconds
            t0 = time.perf_counter()
            sim.run_round(rnd, clients)
            times[key].append(time.perf_counter() - t0)
            if key == "clock":
                stage.append(timer.seconds - before)
    med = {k: statistics.median(v) for k, v in times.items()}
    share = 100 * statistics.median(s / t for s, t in zip(stage, times["clock"]))
    return {"name": name, "what": what, **med, "stage": statistics.median(stage), "share": share}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--settings", nargs="*", default=list(SETTINGS))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    t0 = time.time()
    rows = [bench(name, args.rounds) for name in args.settings]
    lines = [f"Device: cpu — {platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}. "
             f"Median of {args.rounds} timed rounds per simulation after one warm-up round, the three simulations "
             f"alternating round by round on the same clients. Total {time.time() - t0:.0f} s.", "",
             "| setting | off s/round | clock s/round | clock+SecAgg+ s/round | clock ÷ off | clock+SecAgg+ ÷ off | "
             "in the clock's stages s | clock share % (target ≤ 2 %) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| `{r['name']}`: {r['what']} | {r['off']:.3f} | {r['clock']:.3f} | {r['clock+secagg']:.3f} | "
                     f"{r['clock'] / r['off']:.3f} | {r['clock+secagg'] / r['off']:.3f} | {r['stage']:.5f} | "
                     f"{r['share']:.2f}: {'met' if r['share'] <= CLOCK_SHARE_TARGET else 'NOT met'} |")
    lines += ["", "Settings: " + "; ".join(f"`{r['name']}`: `{' '.join(SETTINGS[r['name']][1])}`" for r in rows)
              + f"; clock: `{' '.join(CLOCK)}`; SecAgg+: `secagg=secagg_plus` (fedsketch: `secagg.clip=0.01`).", "",
              "Command: `python scripts/bench_deploy.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])) + "`"]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
