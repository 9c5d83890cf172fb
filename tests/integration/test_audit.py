"""The empirical privacy audit (audit.canaries > 0): a lower bound on ε measured from the run, beside the
accountant's upper bound. CI size: 40 clients of MNIST (LeNet-5), q = 0.25, 4 rounds, 400 canaries."""

from __future__ import annotations

import pytest

from fedrun.config import ConfigError
from fedrun.run import build, run

BASE = ["dataset=mnist", "model=lenet5", "dp=true", "epsilon=1", "delta=1e-5", "num_clients=40",
        "sample_rate=0.25", "clipping_norm=0.05", "rounds=4", "eval_every=4", "audit.canaries=400"]
SCHEMES = {
    "fl_std": ["scheme=fl_std"],
    "fl_cs": ["scheme=fl_cs", "r=0.05", "scheme.max_iter=5"],
    "fedsketch": ["scheme=fedsketch", "scheme.unsketch=privix", "clipping_norm=0.5"],
}


def _plain(cfg):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_audit_lower_bound_is_below_the_accountants_epsilon(fast_cfg, tmp_path, scheme):
    summary = run(fast_cfg(*BASE, *SCHEMES[scheme]), out_dir=tmp_path)
    assert summary["audit_canaries"] == 400 and 0 < summary["audit_included"] < 400
    assert summary["audit_participations_mean"] > 0  # the included canaries did take part
    assert 0 <= summary["audit_epsilon_lower"] <= summary["epsilon_final"] <= 1.0


@pytest.mark.parametrize("scheme", ["fl_std", "fl_cs"])
def test_negative_control_without_noise_is_caught(fast_cfg, tmp_path, scheme, monkeypatch):
    """The same run with a privatizer that adds no noise while ε = 1 is still claimed (a test double: no run can
    ask for it): the audit's lower bound (95 % confidence) is above the claimed ε, i.e. it detects the missing
    noise."""
    from fedrun.simulation import Privatizer

    monkeypatch.setattr(Privatizer, "noise_multiplier", property(lambda self: 0.0))
    summary = run(fast_cfg(*BASE, *SCHEMES[scheme]), out_dir=tmp_path)
    assert summary["epsilon_final"] <= 1.0 < summary["audit_epsilon_lower"]


def test_the_negative_control_script_logs_a_marked_run_that_the_audit_catches(load_script, shared_data, tmp_path,
                                                                              monkeypatch):
    """scripts/audit_negative_control.py (the control at a real run's scale, for results/kerkouche21/audit.md): the
    same test double, a run marked as the control (param, and a config hash no real run has), the noise put back."""
    from mlflow.tracking import MlflowClient

    from fedrun.simulation import Privatizer

    monkeypatch.chdir(tmp_path)
    noise = Privatizer.noise_multiplier
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    summary = load_script("audit_negative_control").main(
        [*BASE, "scheme=fl_std", "local_steps=2", "batch_size=10", "local_mode=sgd", "lr=0.05", f"data_root={shared_data}",
         "progress=off", f"tracking.uri={uri}", "tracking.experiment=control"])
    assert summary["epsilon_final"] <= 1.0 < summary["audit_epsilon_lower"]
    client = MlflowClient(uri)
    (r,) = client.search_runs([client.get_experiment_by_name("control").experiment_id])
    assert r.data.params["audit.negative_control"] == "True" and r.info.status == "FINISHED"
    assert r.data.tags["fedrun.config_hash"].endswith("-negative-control")
    assert Privatizer.noise_multiplier is noise


def test_canaries_go_through_the_dp_sum_and_are_not_counted_as_uploads(fast_cfg):
    """Canary rows are clipped in the same DP sum as the clients' uploads; the ledger counts the clients' only."""
    sim = build(_plain(fast_cfg(*BASE, "scheme=fl_std"))).sim
    sim.run_round(1)
    k = int(sim.canaries.participations.sum())
    assert k > 0 and sim.privatizer.diagnostics["dp_clients"] == len(sim.select(1)) + k
    assert sim.ledger.uplink_messages_round == len(sim.select(1))
    assert not sim.canaries.participations[~sim.canaries.included].any()  # only included canaries take part


@pytest.mark.parametrize("extra,message", [
    (["dp=false"], "audit.canaries=400 audits client-level DP"),
    (["audit.canaries=-1"], "audit.canaries=-1 is not allowed; use 0 or an integer >= 2"),
    (["audit.canaries=1"], "audit.canaries=1 is not allowed; use 0 or an integer >= 2"),
    (["audit.negative_control=true"], "audit.negative_control=true is not allowed; use false: the audit's negative control"),
    (["audit.confidence=1.5"], "audit.confidence=1.5 is not allowed; use a number in (0, 1)"),
])
def test_bad_audit_settings_are_one_line_errors(fast_cfg, extra, message):
    from fedrun.run import prepare

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        prepare(_plain(fast_cfg(*BASE, "scheme=fl_std", *extra)))


def test_the_negative_control_script_refuses_bad_overrides_in_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "audit_negative_control.py"
    for bad, says in ((["nosuchkey=3"], "Could not override 'nosuchkey'"),
                      (["dp=false", "audit.canaries=400", "tracking=none"], "audits client-level DP")):
        out = subprocess.run([sys.executable, str(script), *bad], cwd=tmp_path, capture_output=True, text=True)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1 and lines[0].startswith("audit_negative_control: error: ")
        assert says in lines[0]
