"""Paper 002's figures as Hydra sweeps: `fedrun -m experiment=fedsketch_homogeneous` (Figure 1) and
`fedrun -m experiment=fedsketch_heterogeneous` (Figure 2) expand to exactly the intended runs.

The jobs are built as Hydra's basic sweeper builds them: the experiment's ``hydra.sweeper.params`` parsed with
Hydra's override parser, the Cartesian product of their sweeps, each job composed with the compose API and
validated by ``prepare`` (no data needed, seconds)."""

from __future__ import annotations

import functools
import itertools
from collections import Counter

import pytest

TUNED_LR = {"fedsgd": 0.1, "sketchedsgd": 1.0, "fedsketch": 0.1}  # results/fedsketch/tuning.md


@functools.lru_cache(maxsize=None)
def sweep_jobs(experiment: str) -> tuple[dict, ...]:
    """Every job of ``fedrun -m experiment=<experiment>``: its resolved, validated config, in the sweep's order
    (built once per experiment and test session; do not modify the dicts)."""
    from conftest import CONF_DIR, compose
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from fedrun.run import prepare

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        hc = hydra_compose(config_name="config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    p = hc.hydra.sweeper.params
    params = OmegaConf.to_container(p) if p is not None else {}
    parser = OverridesParser.create()
    axes = []
    for key, value in params.items():
        (ov,) = parser.parse_overrides([f"{key}={value}"])
        values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
        axes.append([f"{key}={v}" for v in values])
    jobs = []
    for combo in itertools.product(*axes):
        c = OmegaConf.to_container(compose([f"experiment={experiment}", *combo]), resolve=True)
        prepare(c)
        jobs.append(c)
    return tuple(jobs)


def describe(c: dict) -> tuple:
    s = c["scheme"]
    size = (s["rows"], s["cols"]) if "rows" in s else None
    return s["name"], s.get("unsketch"), size, c["local_steps"]


SIZES = [(20, 40), (50, 100)]
SEEDS = (0, 1, 2, 3, 4)  # hydra.sweeper.params.seed of both figure experiments


@pytest.mark.parametrize("experiment,taus,gate", [
    ("fedsketch_homogeneous", (1, 2, 5), []),
    ("fedsketch_heterogeneous", (1, 5), [("privix", (20, 40)), ("heaprix", (20, 40)), ("heaprix", (50, 100))]),
])
def test_the_figure_sweep_expands_to_every_intended_run(experiment, taus, gate):
    jobs = sweep_jobs(experiment)
    got = Counter((*describe(c), c["seed"]) for c in jobs)
    expected = Counter(
        [("fedsgd", None, None, t) for t in taus]  # FedSGD at the sketches' τ (uncompressed FedSKETCH for τ > 1)
        + [("sketchedsgd", None, size, 1) for size in SIZES]  # τ = 1 by design
        + [("fedsketch", u, size, t) for u in ("privix", "heaprix") for size in SIZES for t in taus]
        + [("fedsketchgate", u, size, 1) for u, size in gate])
    assert got == Counter({(*job, seed): 1 for job in expected for seed in SEEDS})  # every job once per seed
    assert sum(expected.values()) == {"fedsketch_homogeneous": 17, "fedsketch_heterogeneous": 15}[experiment]
    assert [c["seed"] for c in jobs] == sorted(c["seed"] for c in jobs)  # seeds outermost: whole seeds first
    for c in jobs:
        name = c["scheme"]["name"]
        assert c["skip_finished"] is True and c["dataset"]["name"] == "mnist" and c["num_clients"] == 50
        assert c["tracking"]["experiment"] == experiment.replace("_", "-") and not c["dp"]
        if name == "fedsketchgate":  # the setting under which FedSKETCHGATE ran (README, reduction 5)
            assert (c["lr"], c["scheme"]["server_lr"], c["scheme"]["hashes"]) == (0.01, 10.0, "per_round")
            assert c["sampler"]["_target_"].endswith("AllSampler") and c["rounds"] == 40
        else:
            assert c["lr"] == TUNED_LR[name] and c["scheme"]["server_lr"] == 1.0 and c["rounds"] == 80
            assert c["sampler"]["clients_per_round"] == 25


def test_the_seed_sweep_keeps_the_config_hash_of_the_committed_runs():
    """Every committed run of a figure sweep is one of its jobs by ``fedrun.config_hash``, so ``skip_finished``
    skips it when the sweep runs again: also the seed-0 FedSGD τ = 2, 5 runs made before ``seed: 0,1,2`` was added
    to the sweep (adding it must not change what a seed-0 job hashes to). The jobs as the sweep builds them
    (compose + prepare, no training) against the committed exports (results/fedsketch/runs/)."""
    from fedrun import export as ex
    from fedrun.checkpoint import config_hash

    from conftest import REPO

    for experiment in ("fedsketch_homogeneous", "fedsketch_heterogeneous"):
        jobs = {config_hash(c): (describe(c), c["seed"]) for c in sweep_jobs(experiment)}
        assert len(jobs) == len(sweep_jobs(experiment))   # the seed is hashed: no two jobs alike
        runs, _ = ex.read_export(REPO / "results" / "fedsketch" / "runs" / experiment.replace("_", "-"))
        # the sweep's finished runs (not the re-runs at the next smaller η of a cell with a diverged seed, which
        # are not jobs of the sweep, nor the confirmatory seeds 1000 and up that results/fedsketch/claims.csv
        # registers: the same sweep with seed=1000,… on the command line)
        retries = {("sketchedsgd", "0.3"), ("fedsketch", "0.03"), ("fedsketchgate", "0.003")}
        finished = [r for r in runs if r["status"] == "FINISHED" and int(r["params.seed"]) < 1000
                    and (r["params.scheme.name"], r["params.lr"]) not in retries]
        assert len(finished) >= 30
        found = [jobs.get(r["tags.fedrun.config_hash"]) for r in finished]
        assert None not in found, experiment
        fedsgd_tau5_seed0 = [r for r in finished if r["params.scheme.name"] == "fedsgd" and r["params.seed"] == "0"
                             and r["params.local_steps"] == "5"]
        assert fedsgd_tau5_seed0   # a seed-0 job hashes as the runs made before the seeds were swept did


def test_derived_experiments_do_not_inherit_the_figure_sweep():
    # each extends a figure experiment but declares its own sweep (or none): none runs the figure's jobs or seeds
    assert len(sweep_jobs("fedsketch_ci")) == 1
    tune = sweep_jobs("fedsketch_tune")   # 7 methods × 6 η, seed 100, τ = 1, 30 rounds, homogeneous
    grid = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
    methods = [("fedsgd", None, None, 1), ("sketchedsgd", None, (20, 40), 1), ("sketchedsgd", None, (50, 100), 1)]
    methods += [("fedsketch", u, size, 1) for size in SIZES for u in ("privix", "heaprix")]
    assert Counter((describe(c), c["lr"]) for c in tune) == Counter(itertools.product(methods, grid))
    assert {(c["seed"], c["rounds"], c["partition"]["name"], c["tracking"]["experiment"]) for c in tune} == {
        (100, 30, "iid", "fedsketch-tune")}
    diag = sweep_jobs("fedsketch_gate_diag")   # 5 FedSKETCHGATE runs on 10 workers, all taking part
    assert [(describe(c)[1:3], c["scheme"]["hashes"], c["scheme"]["num_heavy"], c["lr"]) for c in diag] == [
        (("privix", (20, 40)), "fixed", None, 0.1), (("privix", (1, 800)), "fixed", None, 0.1),
        (("heaprix", (1, 800)), "fixed", 61706, 0.1), (("privix", (20, 40)), "per_round", None, 0.1),
        (("privix", (20, 40)), "per_round", None, 0.03)]
    assert {(c["scheme"]["name"], c["num_clients"], c["rounds"], c["seed"]) for c in diag} == {
        ("fedsketchgate", 10, 20, 0)}
    heavy = sweep_jobs("fedsketch_sketchedsgd_heavy")   # SketchedSGD (20, 40) with m = 40, 400, 4000 × η = 0.1, 1
    assert Counter((describe(c), c["scheme"]["num_heavy"], c["lr"]) for c in heavy) == Counter(
        (("sketchedsgd", None, (20, 40), 1), m, lr) for m in (40, 400, 4000) for lr in (0.1, 1.0))
    assert {(c["seed"], c["rounds"]) for c in heavy} == {(0, 80)}


def test_the_lr_table_yields_to_the_command_line():
    from conftest import compose
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(compose(["experiment=fedsketch_homogeneous", "scheme=sketchedsgd", "lr=0.3"]),
                               resolve=True)
    assert c["lr"] == 0.3
    c = OmegaConf.to_container(compose(["experiment=fedsketch_homogeneous", "scheme=sketchedsgd"]), resolve=True)
    assert c["lr"] == 1.0
