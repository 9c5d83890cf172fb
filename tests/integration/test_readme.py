"""The first commands README shows a new user (between its ``first-commands`` markers) all work: every run of
every command composes and prepares (fast); with ``-m grid`` each also runs one round."""

from __future__ import annotations

import itertools
import shlex

import pytest
from omegaconf import OmegaConf

from conftest import REPO, compose
from fedrun.run import prepare, run


def first_commands() -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- first-commands -->", 1)[1].split("<!-- /first-commands -->", 1)[0]
    commands = []
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("fedrun"):
            commands.append(shlex.split(line)[1:])
    return commands


def expand(args: list[str]) -> list[list[str]]:
    """A command's runs: ``-m a=1,2 b=x`` → [[a=1, b=x], [a=2, b=x]] (Hydra's basic sweeper)."""
    if "-m" not in args:
        return [args]
    args = [a for a in args if a != "-m"]
    choices = [[f"{a.split('=', 1)[0]}={v}" for v in a.split("=", 1)[1].split(",")] for a in args]
    return [list(c) for c in itertools.product(*choices)]


COMMANDS = first_commands()


def test_readme_has_the_five_first_commands():
    assert len(COMMANDS) == 5 and [] in COMMANDS and any("-m" in c for c in COMMANDS)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a) or "(none)")
def test_first_command_composes_and_prepares(args, shared_data, monkeypatch):
    monkeypatch.setenv("FEDRUN_DATA", str(shared_data))
    for overrides in expand(args):
        c = OmegaConf.to_container(compose(overrides), resolve=True)
        prepare(c)  # raises ConfigError for a command that would be refused


@pytest.mark.slow
@pytest.mark.grid
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a) or "(none)")
def test_first_command_runs_one_round(args, shared_data, monkeypatch, tmp_path):
    monkeypatch.setenv("FEDRUN_DATA", str(shared_data))
    overrides = expand(args)[0] + ["rounds=1", "tracking=none", "progress=off", "checkpoint_every=0"]
    summary = run(compose(overrides), out_dir=tmp_path)
    assert summary["rounds_completed"] == 1
