"""Paper 001's Lending Club tables as two Hydra sweeps (experiment=fu21_lending_club, fixed T = 100, and
experiment=fu21_lending_club_tg10, fixed T_g = 10) plus the report conf/report/fu21_lending_club.yaml: the sweeps
fill exactly the cells the report expects, skip finished runs, and a T_g = 10 job is the same configuration (the
same fedrun.config_hash) as the command line the committed runs were made with. Composes configs only (no data,
no training)."""

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
    from fedrun.reports.spec import load_spec

    spec = load_spec(REPO / "conf" / "report" / "fu21_lending_club.yaml")
    expect = {e["sweep"][0]: e for e in spec.expect}
    for experiment, sweep in (("fu21_lending_club", "T100"), ("fu21_lending_club_tg10", "Tg10")):
        params = _sweep(experiment)
        assert [int(e) for e in params["local_steps"]] == list(expect[sweep]["E"])
        assert [float(e) for e in params["epsilon"]] == list(expect[sweep]["eps"])
        assert params["seed"] == ["0", "1", "2", "3", "4"]
    assert math.prod(len(v) for v in _sweep("fu21_lending_club").values()) == 140
    assert math.prod(len(v) for v in _sweep("fu21_lending_club_tg10").values()) == 90


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
