#!/usr/bin/env python
"""Cost per round of the client-level DP stage (clip + sum + noise + the accountant's event): correlated noise beside
today's independent noise, in paper 000's setting (60 clients a round, 50 rounds, ε = 1), measured in one process.

For each noise mechanism the privatizer of a run (fedrun's own ``make_client_dp`` and ``Privatizer``) takes 60 rows
of the payload's length (FL-STD's n = 114,314 parameters of fashion_cnn, FL-CS's m = 5,716 at r = 0.05) through
``open`` / ``add`` / ``close`` for every round 1..50; the mechanisms are timed in turns, round by round, so all see
the same machine load. Correlated noise draws, in round t, the Z rows that row t of M = A⁻¹B weights (regenerated
from the run's seed: the mechanism keeps no tensor between rounds, so its checkpoint holds none), so its cost grows
with t for the dense strategies; the table gives the mean over the 50 rounds and round 50's, each as a ratio to
independent noise with Poisson sampling timed in the same run.

    python scripts/bench_privatizer.py --out results/bench/privatizer.md
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedrun.reports import save  # noqa: E402
from fedrun.run import load, make_client_dp, make_sampler, prepare  # noqa: E402
from fedrun.simulation import Privatizer  # noqa: E402

#: (label, overrides on top of experiment=correlated_kerkouche21 with scheme=fl_std)
MECHANISMS = [("independent · Poisson (today)", []),
              ("independent · cyclic", ["sampler=cyclic", "noise=independent"]),
              ("tree · cyclic", ["sampler=cyclic", "noise=tree"]),
              ("sqrt_toeplitz · cyclic", ["sampler=cyclic", "noise=sqrt_toeplitz"]),
              ("banded (8) · cyclic", ["sampler=cyclic", "noise=banded"]),
              ("blt (3) · cyclic", ["sampler=cyclic", "noise=blt"])]
DIMS = {"FL-STD (n = 114,314)": 114_314, "FL-CS r = 0.05 (m = 5,716)": 5_716}
ROWS = 60


def client_dp(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=correlated_kerkouche21", "scheme=fl_std",
                                                       "tracking=none", *overrides])
    c = OmegaConf.to_container(cfg, resolve=True)
    prepare(c)
    cfg = load(c)
    _, sampler, factor, goal = make_sampler(cfg, cfg.num_clients)
    return make_client_dp(cfg, sampler, factor, goal), cfg.rounds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="also write the markdown table to this file")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    built = [(label, *client_dp(o)) for label, o in MECHANISMS]
    lines = [f"# Client-level DP stage per round: correlated beside independent noise ({torch.get_num_threads()} "
             f"torch threads, CPU)", "",
             "| payload | mechanism | σ | Z rows drawn per round (mean / round 50) | ms per round, mean over 50 "
             "| ratio | ms at round 50 | ratio |", "|---|---|---|---|---|---|---|---|"]
    for dim_label, dim in DIMS.items():
        rows = torch.randn(ROWS, dim, generator=torch.Generator().manual_seed(0))
        times = {label: [] for label, _, _ in built}
        privs = {label: Privatizer(dp, None, None, seed=0, device=torch.device("cpu")) for label, dp, _ in built}
        rounds = built[0][2]
        for t in range(1, rounds + 1):
            for label, dp, _ in built:  # in turns: the same load for every mechanism
                pv = privs[label]
                t0 = time.perf_counter()
                agg = pv.open(t, np.arange(ROWS), np.ones(ROWS), dim)
                agg.add(rows)
                pv.close(t, agg)
                times[label].append(time.perf_counter() - t0)
        base = times[built[0][0]]
        for label, dp, _ in built:
            ts = times[label]
            drawn = [len(dp.round_noise(t)) for t in range(1, rounds + 1)]
            lines.append(f"| {dim_label} | {label} | {dp.noise_multiplier:.3f} | {statistics.mean(drawn):.1f} / "
                         f"{drawn[-1]} | {1e3 * statistics.mean(ts):.2f} | {statistics.mean(ts) / statistics.mean(base):.2f} "
                         f"| {1e3 * ts[-1]:.2f} | {ts[-1] / base[-1]:.2f} |")
    cmd = "python scripts/bench_privatizer.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    text = "\n".join([*lines, "", "Ratios: against independent noise with Poisson sampling, timed in the same run, "
                      "round by round in turns. Each mechanism's state between rounds: none (Z rows regenerated from "
                      "the run's seed).", "", f"Command: `{cmd}`"])
    print(text)
    if args.out:
        save(text + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
