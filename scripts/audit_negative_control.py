"""The privacy audit's negative control at a real run's scale: the run the overrides give, with the test double of
tests/integration/test_audit.py (the DP sum adds no noise while the accountant still claims its ε), logged like a
run but with the param ``audit.negative_control = True`` and its own config hash, so that no sweep takes it for the
real run (``skip_finished``) and the audit's table shows it as the control. No ``fedrun`` run can ask for this
(``audit.negative_control=true`` is refused): its ε is false by construction; it exists to show that the audit
catches missing noise. Paper 000's setting (results/kerkouche21/audit.md):

    python scripts/audit_negative_control.py experiment=kerkouche21_table3 scheme=fl_std r=0.05 seed=0 \\
        server_opts=off clipping_norm=null dp=true audit.canaries=1000 tracking.experiment=kerkouche21-audit
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

from hydra import compose, initialize_config_dir

from fedrun.cli import CONF_DIR, _tracker
from fedrun.run import run
from fedrun.simulation import Privatizer


def main(overrides: list[str]) -> dict[str, float]:
    """Run the control; its summary (``audit_epsilon_lower`` against ``epsilon_final``)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides + ["skip_finished=false"])
    tracker = _tracker(cfg)
    start = tracker.start

    def start_control(params: dict, tags: dict, **kw) -> None:
        start({**params, "audit.negative_control": "True"},
              {**tags, "fedrun.config_hash": tags["fedrun.config_hash"] + "-negative-control"}, **kw)

    tracker.start = start_control
    # named to the microsecond, as conf/config.yaml names runs: two controls started in one second get their own folders
    out = Path("outputs/audit_negative_control") / datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")
    noise = Privatizer.noise_multiplier
    Privatizer.noise_multiplier = property(lambda self: 0.0)  # the test double: no noise, the same ε claimed
    try:
        summary = run(cfg, tracker=tracker, out_dir=out)
    finally:
        Privatizer.noise_multiplier = noise
    print(f"negative control: audit ε lower bound {summary['audit_epsilon_lower']:.3f} vs claimed "
          f"{summary['epsilon_final']:.3f}")
    return summary


if __name__ == "__main__":
    from hydra.errors import HydraException

    from fedrun.config import ConfigError

    try:
        main(sys.argv[1:])
    except (ConfigError, HydraException) as exc:   # bad overrides: one line (the first of Hydra's message)
        sys.exit(f"audit_negative_control: error: {str(exc).splitlines()[0]}")
