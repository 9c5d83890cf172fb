"""Paper 001's Lending Club tables as two Hydra sweeps (experiment=fu21_lending_club, fixed T = 100, and
experiment=fu21_lending_club_tg10, fixed T_g = 10) plus the report fedrun.reports.fu21 (``python -m fedrun.report
fu21_lending_club``): the sweeps fill exactly the cells the report expects, skip finished runs, and a T_g = 10 job
is the same configuration (the same fedrun.config_hash) as the command line the committed runs were made with.
Composes configs only (no data, no training)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fedrun.checkpoint import config_hash
from fedrun.run import prepare

REPO = Path(__file__).resolve().parents[2]


def _sweep(experiment: str) -> dict[str, list[str]]:
    conf = OmegaConf.load(REPO / "conf" / "experiment" / f"{experiment}.yaml")
    return {k: str(v).split(",") for k, v in OmegaConf.select(conf, "hydra.sweeper.params").items()}


def _resolved(overrides: list[str]) -> dict:
    from conftest import compose

    c = OmegaConf.to_container(compose(overrides), resolve=True)
    prepare(c)
    return c


def test_the_sweeps_fill_the_cells_the_report_expects():
    from fedrun.reports.fu21 import LC_EXPECT

    expect = {e["sweep"]: e for e in LC_EXPECT}
    for experiment, sweep in (("fu21_lending_club", "T100"), ("fu21_lending_club_tg10", "Tg10")):
        params = _sweep(experiment)
        assert [int(e) for e in params["local_steps"]] == list(expect[sweep]["E"])
        assert [float(e) for e in params["epsilon"]] == list(expect[sweep]["eps"])
        assert params["seed"] == [str(s) for s in range(10)]  # ≥ 10 seeds behind paper 001's E claims
    assert math.prod(len(v) for v in _sweep("fu21_lending_club").values()) == 280
    assert math.prod(len(v) for v in _sweep("fu21_lending_club_tg10").values()) == 180


@pytest.mark.parametrize("local_steps,epsilon", [("1", "inf"), ("10", "3")])
def test_sweep_jobs_are_the_configurations_the_runs_were_made_with(local_steps, epsilon):
    job = [f"local_steps={local_steps}", f"epsilon={epsilon}", "seed=0"]
    t100 = _resolved(["experiment=fu21_lending_club", *job])
    assert t100["skip_finished"] is True and t100["total_iterations"] == 100
    assert t100["rounds"] == 100 // int(local_steps) and t100["local_dp_sensitivity"] == "proven"
    tg10 = _resolved(["experiment=fu21_lending_club_tg10", *job])
    assert tg10["skip_finished"] is True and tg10["total_iterations"] is None and tg10["rounds"] == 10
    assert tg10["tracking"]["experiment"] == "fu21-lending-club"
    by_hand = _resolved(["experiment=fu21_lending_club", "total_iterations=null", "rounds=10", *job])
    assert config_hash(tg10) == config_hash(by_hand) != config_hash(t100)
    assert config_hash(t100) == config_hash({**t100, "skip_finished": False})   # skip_finished is not hashed


# ------------------------------------------------------------------------------------------------ FEMNIST
def test_the_femnist_sweeps_fill_the_cells_the_report_expects():
    from fedrun.reports.fu21 import FEMNIST_EXPECT

    expect = {(e["sens"], e["sweep"]): {k: v if isinstance(v, list) else [v] for k, v in e.items()}
              for e in FEMNIST_EXPECT}
    for experiment, cell in (("fu21_femnist", ("paper_unchecked", "T24")), ("fu21_femnist_tg6", ("paper_unchecked", "Tg6")),
                             ("fu21_femnist_proven", ("proven", "T24"))):
        params = _sweep(experiment)
        assert params["local_dp_sensitivity"] == list(expect[cell]["sens"])
        assert [int(e) for e in params["local_steps"]] == list(expect[cell]["E"])
        assert [float(e) for e in params["epsilon"]] == list(expect[cell]["eps"])
        assert params["seed"] == [str(i) for i in range(10)]   # the E claims rest on 10 seeds per cell
    assert len(expect) == 3
    assert math.prod(len(v) for v in _sweep("fu21_femnist").values()) == 160
    assert math.prod(len(v) for v in _sweep("fu21_femnist_tg6").values()) == 80
    assert math.prod(len(v) for v in _sweep("fu21_femnist_proven").values()) == 40


def test_a_femnist_tg6_job_is_the_fixed_t_experiment_with_rounds_fixed():
    job = ["local_steps=2", "epsilon=3", "seed=1", "local_dp_sensitivity=paper_unchecked"]
    t24 = _resolved(["experiment=fu21_femnist", *job])
    assert t24["skip_finished"] is True and t24["total_iterations"] == 24 and t24["rounds"] == 12
    tg6 = _resolved(["experiment=fu21_femnist_tg6", *job])
    assert tg6["total_iterations"] is None and tg6["rounds"] == 6
    assert tg6["tracking"]["experiment"] == t24["tracking"]["experiment"] == "fu21-femnist"
    by_hand = _resolved(["experiment=fu21_femnist", "total_iterations=null", "rounds=6", *job])
    assert config_hash(tg6) == config_hash(by_hand) != config_hash(t24)
    # a single run keeps the proven sensitivity; the paper-noise sweeps ask for the paper's, unchecked; the proven
    # sweep's job is that single run (the same config hash, so skip_finished finds a run made by hand)
    assert _resolved(["experiment=fu21_femnist"])["local_dp_sensitivity"] == "proven"
    one = ["local_steps=4", "epsilon=10", "seed=0"]
    assert config_hash(_resolved(["experiment=fu21_femnist_proven", *one, "local_dp_sensitivity=proven"])) \
        == config_hash(_resolved(["experiment=fu21_femnist", *one]))


@pytest.mark.parametrize("suffix", ["", "_tg10"])
def test_the_paper_noise_experiments_are_the_sweeps_with_the_papers_sensitivity(suffix):
    """experiment=fu21_lending_club_paper_unchecked[_tg10] is fu21_lending_club[_tg10] with
    local_dp_sensitivity=paper_unchecked: the same sweep, and the same config hash as that command line (so a run
    made either way is finished for the other)."""
    conf = OmegaConf.load(REPO / "conf" / "experiment" / f"fu21_lending_club_paper_unchecked{suffix}.yaml")
    assert OmegaConf.select(conf, "hydra") is None   # the parent's sweep, inherited whole
    assert list(conf.defaults) == [f"fu21_lending_club{suffix}", "_self_"]
    job = ["local_steps=5", "epsilon=3", "seed=2"]
    named = _resolved([f"experiment=fu21_lending_club_paper_unchecked{suffix}", *job])
    by_hand = _resolved([f"experiment=fu21_lending_club{suffix}", "local_dp_sensitivity=paper_unchecked", *job])
    assert named["local_dp_sensitivity"] == "paper_unchecked"
    assert config_hash(named) == config_hash(by_hand)
