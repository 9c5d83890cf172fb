"""The typed config edge (issue 50): an unknown key, a `+` key that names no knob, an unknown experiment and a DP
budget given with dp=false are refused in one line, before any data is read; a type or range refusal is derived from
the typed config (fedrun.config.RunConfig), its text from the type."""

import pytest
from omegaconf import OmegaConf

from conftest import compose
from fedrun.config import ConfigError, validate_types


@pytest.fixture
def no_data(tmp_path, monkeypatch):
    """A data folder with nothing in it: a run that read any dataset would fail with 'not found'."""
    empty = tmp_path / "no_data_here"
    empty.mkdir()
    monkeypatch.setenv("FEDRUN_DATA", str(empty))
    monkeypatch.setenv("FEDRUN_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("args,message", [
    (["experiment=kerkouche21_tabel3"], "experiment=kerkouche21_tabel3 is not a preset; allowed: "),
    (["-m", "experiment=kerkouche21_table3,kerkouche21_tabel3"], "experiment=kerkouche21_tabel3 is not a preset"),
    (["+noise_multiplyer=1"], "noise_multiplyer=1 is not a setting; did you mean noise_multiplier?"),
    (["noise_multiplyer=1"], "noise_multiplyer=1 is not a setting; did you mean noise_multiplier?"),
    (["+no_such_knob=3"], "no_such_knob=3 is not a setting; allowed: the keys of conf/config.yaml"),
    (["dp=false", "epsilon=1"], "epsilon=1 with dp=false: a run without DP has no privacy budget; allowed: "
                                "dp=true|local_laplace|local_gaussian with epsilon, or dp=false without it"),
    (["dp=false", "noise_multiplier=1.5"], "noise_multiplier=1.5 with dp=false: a run without DP has no privacy"),
    # the preset's dp=false with a budget given on the command line: the same contradiction
    (["experiment=kerkouche21_table3", "epsilon=3"], "epsilon=3 with dp=false"),
    (["lr=-1"], "lr=-1 is not allowed; use a number > 0"),
    (["checkpoint_every=-2"], "checkpoint_every=-2 is not allowed; use auto or an integer >= 0 or null"),
])
def test_refused_in_one_line_before_any_data_is_read(fedrun_in_process, no_data, args, message):
    code, out, err = fedrun_in_process([*args, "tracking=none"])
    assert code == 2 and "Traceback" not in err, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("fedrun: error:")]
    assert message in line, line
    assert "not found" not in err


def test_the_allowed_experiments_are_the_presets(fedrun_in_process, no_data):
    from pathlib import Path

    from fedrun.cli import CONF_DIR

    _, _, err = fedrun_in_process(["experiment=kerkouche21_tabel3", "tracking=none"])
    presets = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))
    assert len(presets) > 20 and f"allowed: {', '.join(presets)} (conf/experiment/)" in err


def test_a_budget_the_preset_sets_is_no_contradiction(fedrun_in_process, no_data):
    """kerkouche21_table3 sets ε = 1 and sweeps dp=true,false: its dp=false cells are not refused (the run goes on
    until it reads the data, which is not there)."""
    code, _, err = fedrun_in_process(["experiment=kerkouche21_table3", "dp=false", "tracking=none"])
    assert code == 2 and "not found" in err and "privacy budget" not in err


def _config(*overrides: str, **values) -> dict:
    return {**OmegaConf.to_container(compose(["~experiment", *overrides]), resolve=True), **values}


@pytest.mark.parametrize("values,message", [
    ({"noise_multiplyer": 1}, "noise_multiplyer=1 is not a setting; did you mean noise_multiplier?"),
    ({"sample_rate": 0}, "sample_rate=0 is not allowed; use a number in (0, 1]"),
    ({"local_steps": 0}, "local_steps=0 is not allowed; use an integer >= 1"),
    ({"batch_size": 2.5}, "batch_size=2.5 is not allowed; use an integer >= 1"),
    ({"local_mode": "adam"}, "local_mode='adam' is not allowed; use sgd|gd"),
    ({"vectorized": "yes"}, "vectorized='yes' is not allowed; use true or false"),
    ({"epsilon": "1"}, "epsilon='1' is not allowed; use a number > 0 or null"),
    ({"server_momentum": 1.0}, "server_momentum=1.0 is not allowed; use a number in (0, 1)"),
    ({"device": "cuda:x"}, "device='cuda:x' is not allowed; use cpu, cuda, cuda:N or auto"),
])
def test_type_and_range_refusals_come_from_the_typed_config(values, message):
    with pytest.raises(ConfigError) as err:
        validate_types(_config(**values))
    assert str(err.value) == message


def test_a_nested_key_is_named_by_its_path():
    with pytest.raises(ConfigError, match=r"^secagg.dropout=1.0 is not allowed; use a number in \[0, 1\) or null$"):
        validate_types(_config("secagg=secagg", "secagg.dropout=1.0"))
    with pytest.raises(ConfigError, match=r"^partition.alpha=0 is not allowed; use a number > 0$"):
        validate_types(_config("partition=dirichlet", "partition.alpha=0"))


def test_every_preset_is_a_valid_config():
    """The presets' own keys are settings (an unknown key is refused): each composes and passes the typed edge."""
    from pathlib import Path

    from fedrun.cli import CONF_DIR

    for preset in sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml")):
        validate_types(OmegaConf.to_container(compose([f"experiment={preset}"]), resolve=True))
