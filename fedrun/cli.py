"""The ``fedrun`` command: a Hydra app around :func:`fedrun.run.run`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("fedrun")


class JobFailed(CompactHydraException):
    """A sweep's job failed: Hydra runs the sweep's other jobs, then prints the first failed job's message (one
    line, no traceback: a compact Hydra error) and exits with status 1."""


def _tracker(cfg: DictConfig):
    from fedrun.tracking import PARENT_FILE, SWEPT_FILE, MlflowTracker, NullTracker, sweep_suffix

    if cfg.tracking.kind == "none":
        return NullTracker()
    parent = sweep = None
    suffix = ""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            sweep = str(Path(hc.sweep.dir))
            pf = Path(hc.sweep.dir) / PARENT_FILE
            parent = pf.read_text().strip() if pf.exists() else None
            sf = Path(hc.sweep.dir) / SWEPT_FILE
            suffix = sweep_suffix(hc.overrides.task, sf.read_text().split()) if sf.exists() else ""
    except ValueError:
        pass
    return MlflowTracker(cfg.tracking.get("uri"), cfg.tracking.experiment, parent_run_id=parent, sweep=sweep,
                         name_suffix=suffix, diagnostics=cfg.tracking.get("diagnostics", False))


def _overrides() -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        return " ".join(o for o in HydraConfig.get().overrides.task if not o.startswith("resume="))
    except ValueError:
        return ""


def _multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


def _output_dir() -> Path:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return Path.cwd()


CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def check_overrides(overrides: list[str]) -> None:
    """The command line's keys, before Hydra composes the config: a key that is no setting (``+key`` or not) and an
    ``experiment=`` that is no preset (its group is optional: Hydra would run the defaults) are refused in one line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from fedrun.config import KNOBS, ConfigError, unknown_key

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - Hydra reports its own syntax errors
        return
    groups = {p.name for p in Path(CONF_DIR).iterdir() if p.is_dir()} | {"hydra"}
    presets = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))
    for o in parsed:
        key = o.key_or_group.split("/")[0].split(".")[0]
        if key not in KNOBS and key not in groups:
            raise unknown_key(key, o.input_line.partition("=")[2])
        values = [] if o.key_or_group != "experiment" or o.is_delete() else (
            list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()])
        bad = [v for v in values if v is not None and v not in presets]
        if bad:
            raise ConfigError(f"experiment={bad[0]} is not a preset; allowed: {', '.join(presets)} (conf/experiment/)")


def check_given(cfg: DictConfig, given: set[str]) -> None:
    """A budget given on the command line (``given``: the job's keys) for a run without DP is a contradiction that
    dp=false would drop without a word; a preset's own ε (a table sweeping dp=true,false) is not given."""
    from fedrun.config import ConfigError, _typed, dp_mode

    if dp_mode(cfg.get("dp")) == "off":
        for key in ("epsilon", "noise_multiplier"):
            if key in given and cfg.get(key) is not None:
                raise ConfigError(f"{key}={_typed(cfg[key])} with dp={_typed(cfg['dp'])}: a run without DP has no "
                                  f"privacy budget; allowed: dp=true|local_laplace|local_gaussian with {key}, or "
                                  f"dp=false without it")


def _given() -> set[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return {o.split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task}
    except ValueError:
        return set()


def main() -> None:
    """The ``fedrun`` Hydra app (:func:`app`), its command line's keys checked first (:func:`check_overrides`)."""
    from hydra._internal.utils import get_args_parser

    from fedrun.config import ConfigError

    try:
        check_overrides(get_args_parser().parse_known_args(sys.argv[1:])[0].overrides)
    except ConfigError as exc:
        print(f"fedrun: error: {exc}", file=sys.stderr)
        sys.exit(2)
    app()


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def app(cfg: DictConfig) -> float | None:
    from fedrun.config import ConfigError
    from fedrun.data.dataset import DataIntegrityError, DataNotFoundError
    from fedrun.run import RunDiverged, RunInterrupted, run
    from fedrun.privacy.cohort import CohortContractError
    from fedrun.simulation import SchemeContractError

    try:
        check_given(cfg, _given())
        tracker = _tracker(cfg)
        summary = run(cfg, tracker=tracker, out_dir=_output_dir())
    except (ConfigError, DataNotFoundError, DataIntegrityError, ConnectionError, RunDiverged,
            SchemeContractError, CohortContractError) as exc:
        print(f"fedrun: error: {exc}", file=sys.stderr)
        if _multirun():  # Hydra marks the job failed, runs the sweep's other jobs, then exits with status 1
            raise JobFailed(f"fedrun: error: {exc}") from None
        sys.exit(1 if isinstance(exc, RunDiverged) else 2)
    except RunInterrupted as exc:
        print(f"fedrun: interrupted after round {exc.round}; the run is saved in {exc.out_dir}.\n"
              f"fedrun: resume it with: fedrun {_overrides()} resume=true", file=sys.stderr)
        sys.exit(130)
    lines = [f"  {k}: {v:.6g}" for k, v in summary.items()]
    print("fedrun: done\n" + "\n".join(lines))
    if getattr(tracker, "run_id", None):
        urls = tracker.urls() if hasattr(tracker, "urls") else {}
        print(f"fedrun: {tracker.where}\nfedrun: browse it with `make ui` "
              f"(mlflow ui --backend-store-uri {tracker.uri}), then open\n"
              f"fedrun:   this run:   {urls.get('run', '?')}\n"
              f"fedrun:   all runs:   {urls.get('runs', '?')}")
    key = next((k for k in summary if k.startswith("best_test_")), None)
    return summary[key] if key else None


def entry() -> None:
    """The ``fedrun`` command: Hydra's app; after ``--cfg job`` (or ``all``) prints the config, the ε that config
    would spend under its cohort sampling, beside the other sampling's (:func:`fedrun.run.privacy_report`)."""
    from hydra._internal.utils import get_args_parser

    args, _ = get_args_parser().parse_known_args(sys.argv[1:])
    main()
    if args.cfg in ("job", "all") and not args.multirun:
        from hydra import compose, initialize_config_dir

        from fedrun.config import ConfigError
        from fedrun.run import privacy_report

        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", overrides=list(args.overrides))
        try:
            print("# " + privacy_report(OmegaConf.to_container(cfg, resolve=True)))
        except ConfigError as exc:
            print(f"fedrun: error: {exc}", file=sys.stderr)
            sys.exit(2)


if __name__ == "__main__":
    entry()
