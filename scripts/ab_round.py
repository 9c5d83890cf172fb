#!/usr/bin/env python
"""Median seconds per round of a simulation built from the checkout given (no evaluation): an A/B of two commits.

    python scripts/ab_round.py <checkout> <rounds> <hydra overrides...>    # e.g. a git worktree of the older commit
"""
import statistics, sys, time
repo = sys.argv[1]; sys.path.insert(0, repo)
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
import fedrun
assert fedrun.__file__.startswith(repo), fedrun.__file__
from fedrun.run import build
with initialize_config_dir(config_dir=repo + "/conf", version_base="1.3"):
    cfg = compose(config_name="config", overrides=sys.argv[3:] + ["tracking=none", "progress=off"])
sim = build(OmegaConf.to_container(cfg, resolve=True)).sim
sim.run_round(1)
times = []
for r in range(2, 2 + int(sys.argv[2])):
    t0 = time.perf_counter(); sim.run_round(r); times.append(time.perf_counter() - t0)
print(f"{statistics.median(times):.4f}")
