"""Build a simulation from the resolved config and drive its rounds: ``run(cfg) -> summary``.

This is the orchestration shell around the pure parts: it loads data, partitions it, builds the model,
scheme, sampler and privacy settings, runs the rounds, evaluates, and reports every round to the
tracker, the metrics CSV and the progress display.
"""

from __future__ import annotations

import csv
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from fedrun.comm import paper_cost_bits
from fedrun.config import ConfigError, RunConfig, typed, validate, validate_types
from fedrun.data import partition as partitioners
from fedrun.data.sources import load_dataset
from fedrun.models.flat import FlatParams
from fedrun.models.nets import IMAGE_MODELS, build_model
from fedrun.resolve import check_partition, check_secagg_codec, resolve_defaults, resolve_rounds
from fedrun.rng import numpy_rng
from fedrun.sampling import over_select
from fedrun.schemes.transfer import FbFTL
from fedrun.privacy.client_dp import epsilon_report, make_client_dp
from fedrun.simulation import AuditSettings, RunDiverged, Simulation
from fedrun.training import ClientData, LocalSpec

log = logging.getLogger("fedrun")


# ------------------------------------------------------------------------------------------ building
def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} was asked for but torch sees no CUDA device "
                          f"(torch {torch.__version__}, cuda build: {torch.version.cuda}); use device=cpu")
    return torch.device(name)


def resolve_workers(value: Any, device: torch.device) -> int:
    """``auto`` = one training thread per CPU core torch uses (1 on a GPU)."""
    if device.type != "cpu":
        return 1
    if value == "auto":
        return max(1, torch.get_num_threads())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"workers={value!r} must be an integer >= 1 or auto")
    return int(value)


def _instantiate(node: Any, **kwargs: Any) -> Any:
    """hydra.utils.instantiate that reports the constructor's own ValueError as a ConfigError."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(node, **kwargs)
    except InstantiationException as exc:
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, ValueError) and cause.__cause__ is not None:
            cause = cause.__cause__
        if isinstance(cause, ValueError):
            raise ConfigError(str(cause)) from None
        raise


def make_partition(cfg: RunConfig, y_train: np.ndarray, groups: np.ndarray | None) -> tuple[list[np.ndarray], str]:
    p, num_clients = cfg.partition, cfg.num_clients
    name = p.name
    check_partition(cfg.dataset, name)
    rng = numpy_rng(cfg.seed, "partition")
    try:
        if name in ("writers", "state"):
            return partitioners.by_group(groups, num_clients, rng, copies=int(p.copies)), name
        if num_clients is None:
            raise ConfigError(f"partition={name} needs num_clients")
        if name == "iid":
            return partitioners.iid(len(y_train), num_clients, rng), name
        if name == "shards":
            return partitioners.shards(y_train, num_clients, int(p.classes_per_client), rng,
                                       distinct_classes=bool(p.distinct_classes)), name
        return partitioners.dirichlet(y_train, num_clients, float(p.alpha), rng, min_size=int(p.min_size)), name
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"partition={name}: {exc}") from None


def make_model(name: str, dataset) -> tuple[torch.nn.Module, str]:
    if dataset.task == "regression":
        if name != "lr":
            raise ConfigError(f"model={name} does not fit dataset={dataset.name} (a regression on tabular "
                              f"features); allowed: lr")
        return build_model("lr", in_features=dataset.x_train.shape[1]), name
    if name not in IMAGE_MODELS:
        raise ConfigError(f"model={name} does not fit dataset={dataset.name} (28×28 images); allowed: "
                          f"{', '.join(IMAGE_MODELS)}")
    return build_model(name, num_classes=int(dataset.num_classes)), name


def privacy_report(c: dict) -> str:
    """What ``fedrun --cfg job`` prints below the config: the ε this config would spend under its cohort sampling,
    with the other sampling's ε beside it (:func:`epsilon_report`), computed before any data is loaded."""
    cfg = load(c)
    if cfg.dp != "client":
        return f"dp: {cfg.dp} (no client-level accountant)"
    if cfg.num_clients is None:
        return "dp: ε is reported when the run starts (num_clients=null: the dataset's own clients, known once loaded)"
    _, sampler, factor, goal = make_sampler(cfg, cfg.num_clients)
    return epsilon_report(make_client_dp(cfg, sampler, factor, goal), cfg.rounds, compare=True)


def make_sampler(cfg: RunConfig, num_clients: int):
    """(``network=``'s profile or None, the sampler that draws the cohorts, its over-selection factor f, the report
    goal): with f > 1 the sampler draws f times the target cohort, and a round closes once ⌈target⌉ have reported."""
    sampler = _instantiate(cfg.sampler, num_clients=num_clients)
    if cfg.network["name"] == "none":
        return None, sampler, 1.0, None
    from fedrun.network import Profile

    profile = Profile.from_config(dict(cfg.network))
    f = profile.over_selection
    if f == 1:
        return profile, sampler, 1.0, None
    return profile, over_select(sampler, f), f, math.ceil(sampler.expected_clients)


def make_deployment(cfg: RunConfig, profile, model, x_train, y_train, parts, spec: LocalSpec, loss: str,
                    report_goal: int | None = None, sampler=None):
    """The clock and secure aggregation of the round (:mod:`fedrun.deployment`); None when both are off. SecAgg's
    field is sized once for the run, for the most summands a round can have: the largest cohort ``sampler`` (the one
    that draws, over-selected if it is) can select, at most the report goal, plus the audit's canaries."""
    sec = cfg.secagg
    if profile is None and sec.name == "none":
        return None
    from fedrun.deployment import Deployment, SecAggSettings, train_flops_per_sample

    cohort = sampler.max_cohort if sampler is not None else len(parts)
    cohort = min(cohort, report_goal) if report_goal is not None else cohort
    max_clients = cohort + cfg.audit_canaries
    if sec.name != "none" and sec.bits < max_clients.bit_length() + 1:
        raise ConfigError(f"secagg.bits={sec.bits} is too few for up to {cohort} clients a round (sampler="
                          f"{sampler.name if sampler is not None else '?'}) and {cfg.audit_canaries} canaries in "
                          f"the field: need at least {max_clients.bit_length() + 1}")

    settings = (SecAggSettings(sec.name, sec.bits, sec.clip, sec.dropout, sec.corrupt) if sec.name != "none"
                else None)
    sizes = np.array([len(p) for p in parts], dtype=np.float64)
    samples = spec.steps * (sizes if spec.mode == "gd" else np.minimum(spec.batch_size, sizes))
    flops = train_flops_per_sample(model, x_train[:1], y_train[:1], loss) if profile is not None else 0.0
    return Deployment(profile, settings, num_clients=len(parts), seed=cfg.seed, flops_per_sample=flops,
                      samples=samples, report_goal=report_goal, max_clients=max_clients)


def make_audit(cfg: RunConfig) -> AuditSettings | None:
    """The audit's settings (``audit.canaries`` > 0; validated with client-level DP), else None."""
    return AuditSettings(cfg.audit_canaries, cfg.audit_confidence) if cfg.audit_canaries else None


@dataclass
class Built:
    sim: Simulation
    names: dict[str, str]
    partition_stats: dict[str, float]
    info: dict[str, Any] = field(default_factory=dict)
    cfg: RunConfig | None = None
    #: the protocol's state and round: the simulation's FedAvg round, or FbFTL's runner
    runner: Any = None
    extra_metrics: Any = None

    def __post_init__(self) -> None:
        self.runner = self.runner or self.sim

    def run_round(self, rnd: int) -> dict[str, float]:
        metrics = self.runner.run_round(rnd)
        return {**metrics, **self.extra_metrics(rnd)} if self.extra_metrics else metrics


CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def prepare(c: dict) -> list[str]:
    """Resolve, in place and before any data is loaded, what follows from the dataset, model and scheme (DP
    mode, clipping norms, rounds from total_iterations), then validate; returns notes for the user.

    Idempotent: a prepared config comes out unchanged, so the params logged and the config a checkpoint
    stores are the resolved ones.
    """
    from hydra.utils import get_class

    target = c.get("scheme", {}).get("_target_")
    try:
        scheme_cls = get_class(str(target))
    except Exception:  # noqa: BLE001 - hydra raises ImportError or its own error types
        raise ConfigError(f"scheme._target_={target!r} is not an importable scheme class") from None
    validate_types(c)
    notes = resolve_defaults(c, scheme_cls, c.get("model", {}))
    resolve_rounds(c)  # total_iterations → rounds (in place, so the logged params show the rounds run)
    validate(c)
    return notes


def load(c: dict | RunConfig) -> RunConfig:
    """The edge: a config dict (Hydra's, resolved) prepared, validated and typed; a RunConfig as it is."""
    if isinstance(c, RunConfig):
        return c
    for note in prepare(c):
        log.info(note)
    return typed(c)


def build(c: dict | RunConfig) -> Built:
    """The config (a resolved dict, or typed) → a ready :class:`Simulation` and descriptive names."""
    cfg = load(c)
    device = resolve_device(cfg.device)
    dataset = load_dataset(cfg.dataset.name, cfg.data_root, femnist_leaf_dir=cfg.dataset.leaf_dir,
                           lending_club_csv=cfg.dataset.csv)
    seed = cfg.seed
    x_train, y_train, groups = dataset.x_train, dataset.y_train, dataset.groups_train
    x_val = y_val = None
    if cfg.patience > 0:  # hold out a validation split for early stopping (before partitioning)
        perm = numpy_rng(seed, "validation").permutation(len(y_train))
        n_val = max(1, int(round(len(y_train) * cfg.validation_fraction)))
        val, keep = np.sort(perm[:n_val]), np.sort(perm[n_val:])
        x_val, y_val = x_train[val].to(device), y_train[val].to(device)
        x_train, y_train = x_train[keep], y_train[keep]
        groups = groups[keep] if groups is not None else None
    y_np = y_train.numpy()
    parts, part_name = make_partition(cfg, y_np, groups)
    stats = partitioners.partition_stats(parts, y_np if dataset.task == "classification" else None)
    with torch.random.fork_rng(devices=[]):  # model initialisation from the run's seed, global RNG untouched
        torch.manual_seed(seed)
        model, model_name = make_model(cfg.model, dataset)
    loss = "cross_entropy" if dataset.task == "classification" else "mse"
    spec = LocalSpec(mode=cfg.local_mode, steps=cfg.local_steps, batch_size=cfg.batch_size, lr=cfg.lr,
                     clip_norm=cfg.local_clip, loss=loss, clip_mode=cfg.local_clip_mode, clip_ord=cfg.local_clip_ord)
    profile, sampler, factor, goal = make_sampler(cfg, len(parts))
    scheme = _instantiate({k: v for k, v in cfg.scheme.items() if k != "name"})
    if cfg.secagg.name != "none":  # prepare() checked it; a typed config may not have been prepared
        check_secagg_codec(cfg.secagg.name, cfg.scheme_name, scheme)
    mode = cfg.dp
    client_dp = make_client_dp(cfg, sampler, factor, goal) if mode == "client" else None
    local_dp = None
    trainable, facts = None, None
    try:  # the modules below raise ValueError for a setting they refuse: here, at the edge, a config error
        if mode in ("local_laplace", "local_gaussian"):
            from fedrun.privacy.local_dp import make_local_dp

            local_dp = make_local_dp(cfg, sampler, parts, spec, x_train=x_train)
        if scheme.needs_image_source:
            from fedrun.transfer import fbftl

            trainable, facts = fbftl.prepare_model(scheme, model, model_name, dataset, cfg.data_root, device)
        layout = FlatParams(model, trainable) if trainable is not None else None
        frozen = facts["frozen_numel"] if facts and scheme.train_head_only and not scheme.clients_hold_source else 0
        data = ClientData(x_train.to(device), y_train.to(device), parts)
        sim = Simulation(model=model, data=data, x_test=dataset.x_test.to(device), y_test=dataset.y_test.to(device),
                         sampler=sampler, scheme=scheme, spec=spec, seed=seed, device=device,
                         chunk_size=cfg.chunk_size, workers=resolve_workers(cfg.workers, device),
                         vectorized=cfg.vectorized, batched_layers=cfg.batched_layers,
                         client_dp=client_dp, local_dp=local_dp, x_val=x_val, y_val=y_val, layout=layout,
                         audit=make_audit(cfg), frozen_numel=0 if isinstance(scheme, FbFTL) else frozen,
                         deployment=make_deployment(cfg, profile, model, x_train, y_train, parts, spec, loss,
                                                    report_goal=goal, sampler=sampler))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    names = {"dataset": dataset.name, "model": model_name, "partition": part_name,
             "scheme": cfg.scheme_name, "dp": mode, "device": str(device)}
    built = Built(sim, names, stats, {"task": dataset.task, "source": dataset.source}, cfg=cfg)
    if isinstance(scheme, FbFTL):
        built.runner = fbftl.FbFTLRunner(scheme, facts, sim, cfg.lr, dataset.num_classes)
    elif facts is not None:
        built.extra_metrics = lambda rnd: fbftl.round_metrics(scheme, facts, sim, rnd)
    return built


# ------------------------------------------------------------------------------------------ progress
class Progress:
    """A tqdm bar on a terminal, plain log lines otherwise."""

    def __init__(self, total: int, mode: str, start: int = 0) -> None:
        self.mode = mode
        if mode == "auto":
            self.mode = "bar" if sys.stderr.isatty() else "log"
        self.bar = None
        if self.mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="round", dynamic_ncols=True)

    def update(self, rnd: int, total: int, metrics: dict[str, float]) -> None:
        shown = {k: metrics[k] for k in ("test_accuracy", "test_mse", "train_loss", "epsilon") if k in metrics}
        shown["up_MB"] = metrics["uplink_bytes_total"] / 1e6
        text = " ".join(f"{k}={v:.4g}" for k, v in shown.items())
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
        elif self.mode == "log":
            log.info("round %d/%d %s (%.2fs)", rnd, total, text, metrics["round_seconds"])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ------------------------------------------------------------------------------------------ the loop
class MetricsCSV:
    """Per-round metrics written as they are flushed, so an interrupted run keeps them. With ``dp`` (a run with DP)
    also ``metrics_privacy.csv`` beside it: each column, whether ε covers it, its MLflow name (``nonprivate/…`` when
    not) and why (:mod:`fedrun.metric_names`); the columns of metrics.csv keep their names."""

    PRIVACY = "metrics_privacy.csv"

    def __init__(self, path: Path, dp: bool = False) -> None:
        self.path = path
        self.dp = dp
        self.rows: list[dict[str, float]] = []

    def append(self, rnd: int, metrics: dict[str, float]) -> None:
        self.rows.append({"round": rnd, **metrics})
        self.write()

    def write(self) -> None:
        """Rewrite the file (columns may grow: evaluation rounds add some) through a temp file + rename."""
        columns: list[str] = []
        for row in self.rows:
            columns += [k for k in row if k not in columns]
        tmp = self.path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns)
            w.writeheader()
            w.writerows(self.rows)
        tmp.replace(self.path)
        if self.dp:
            from fedrun.metric_names import covered_by_epsilon, metric_name, privacy_reason

            rows = [{"metric": k, "covered_by_epsilon": str(bool(covered_by_epsilon(k))).lower(),
                     "mlflow_name": metric_name(k, dp=True), "reason": privacy_reason(k)}
                    for k in columns if k != "round"]
            with tmp.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=["metric", "covered_by_epsilon", "mlflow_name", "reason"])
                w.writeheader()
                w.writerows(rows)
            tmp.replace(self.path.with_name(self.PRIVACY))


def plot_curve(rows: list[dict[str, float]], key: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(r["round"], r[key]) for r in rows if key in r]
    if not pts:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(*zip(*pts), marker=".")
    ax.set_xlabel("round")
    ax.set_ylabel(key)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclass
class LoopState:
    """Bookkeeping of the round loop (checkpointed with the simulation's state)."""

    rows: list[dict[str, float]] = field(default_factory=list)
    best: dict[str, float] = field(default_factory=dict)
    best_val: float | None = None
    since_best: int = 0
    stopped: int | None = None
    round: int = 0


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C / SIGTERM: the run stopped after a completed round and saved a checkpoint."""

    def __init__(self, rnd: int, out_dir: Path) -> None:
        super().__init__(f"interrupted after round {rnd}; checkpoint in {out_dir}")
        self.round, self.out_dir = rnd, out_dir


def _key_metric(built: Built) -> str:
    return "test_accuracy" if built.info["task"] == "classification" else "test_mse"


def round_metrics(built: Built, rnd: int, loop: LoopState) -> dict[str, float]:
    """Run round ``rnd`` and gather its metrics: the round's own, the ledger's, paper 000's cost, ε, and (every
    ``eval_every`` rounds and at the last) the evaluation, which updates ``loop``'s best and early-stopping state.
    Raises :class:`RunDiverged` on NaN/inf in the global model or the training loss."""
    sim, cfg = built.sim, built.cfg
    classification, key = built.info["task"] == "classification", _key_metric(built)
    better = (lambda a, b: a > b) if classification else (lambda a, b: a < b)
    t0 = time.perf_counter()
    metrics = built.run_round(rnd)
    if sim.device.type == "cuda":
        torch.cuda.synchronize(sim.device)
    loss = metrics.get("train_loss", math.nan)
    if not torch.isfinite(sim.params).all() or (metrics["clients"] and not math.isfinite(loss)):
        raise RunDiverged(f"the run diverged at round {rnd}: NaN/inf in the global model or the training "
                          f"loss (metrics up to round {rnd - 1} are kept); try a smaller lr")
    metrics = {k: v for k, v in metrics.items() if not (isinstance(v, float) and math.isnan(v))}
    metrics.update(sim.ledger.metrics())
    metrics["cost_bits"] = paper_cost_bits(sim.scheme.compression_ratio, sim.n, rnd, sim.sampler.fraction)
    evaluated = rnd % cfg.eval_every == 0 or rnd == cfg.rounds
    metrics.update(sim.privatizer.epsilons(last=rnd == cfg.rounds))
    if "epsilon" in metrics:
        metrics.update(sim.privatizer.diagnostics)
    metrics["round_seconds"] = time.perf_counter() - t0
    if evaluated:
        ev = sim.evaluate("test")
        metrics["test_loss"] = ev["loss"]
        metrics[key] = ev["accuracy"] if classification else ev["mse"]
        if not loop.best or better(metrics[key], loop.best["value"]):
            loop.best = {"value": metrics[key], "round": rnd, "cost": metrics["cost_bits"],
                         "uplink": metrics["uplink_bytes_total"], "epsilon": metrics.get("epsilon", math.nan)}
    if evaluated and cfg.patience > 0:
        ev = sim.evaluate("validation")
        val = ev["accuracy"] if classification else ev["mse"]
        metrics["val_" + key.removeprefix("test_")] = val
        if loop.best_val is None or better(val, loop.best_val):
            loop.best_val, loop.since_best = val, 0
        else:
            loop.since_best += 1
    return metrics


def run_summary(built: Built, loop: LoopState) -> dict[str, float]:
    """The run's summary from its rows: the best evaluation and what it cost, the final bytes and ε, and with the
    simulated clock the time to each target."""
    cfg, key = built.cfg, _key_metric(built)
    last = loop.rows[-1]
    best = loop.best
    summary = {f"best_{key}": best["value"], "best_round": float(best["round"]),
               "cost_bits_at_best": best["cost"], "uplink_bytes_at_best": best["uplink"],
               "rounds_completed": float(last["round"]),
               "uplink_bytes_final": last["uplink_bytes_total"], "downlink_bytes_final": last["downlink_bytes_total"]}
    if "epsilon" in last:
        summary["epsilon_final"] = last["epsilon"]
        summary["epsilon_at_best"] = best["epsilon"]
    if loop.stopped is not None:
        summary["stopped_round"] = float(loop.stopped)
    if "sim_time_s" in last:  # the simulated clock (network=…): when the targets were reached
        from fedrun.network import time_to

        times = [row.get("sim_time_s", math.nan) for row in loop.rows]
        summary["sim_time_s_final"] = last["sim_time_s"]
        targets = {"time_to_accuracy_s": (key, cfg.network.get("target_accuracy")),
                   "time_to_epsilon_s": ("epsilon", cfg.network.get("target_epsilon"))}
        for name, (metric, target) in targets.items():
            if target is not None and metric in last:
                sign = 1.0 if metric == "epsilon" or built.info["task"] == "classification" else -1.0
                values = [sign * row.get(metric, math.nan) for row in loop.rows]
                summary[name] = time_to(sign * float(target), values, times)
    if "secagg_failed" in last:
        summary["secagg_failed_rounds"] = float(sum(row.get("secagg_failed", 0.0) for row in loop.rows))
    return summary


def run_rounds(built: Built, tracker, out_dir: Path, loop: LoopState | None = None,
               stop: "StopFlag | None" = None) -> dict[str, float]:
    """Drive the rounds of a built simulation (from ``loop.round + 1`` when resuming); returns the summary.

    Metrics reach the tracker and ``metrics.csv`` at every checkpoint, metrics first, then the checkpoint. When
    to save is :class:`fedrun.checkpoint.CheckpointSchedule`'s (every ``checkpoint_every`` rounds, or with ``auto``
    as often as keeps saving within 5 % of the run's time), and always at the last round, at early stopping and on
    Ctrl-C / SIGTERM; with checkpoints off, metrics are flushed every round. A resumed run recomputes the rounds
    after its checkpoint and logs only those the tracker does not have yet, so the tracker ends with every round
    exactly once.
    """
    from fedrun.checkpoint import CheckpointSchedule, save_checkpoint, state_bytes

    sim, cfg = built.sim, built.cfg
    rounds = cfg.rounds
    key = _key_metric(built)
    loop = loop or LoopState()
    schedule = CheckpointSchedule(cfg.checkpoint_every)
    logged_up_to = tracker.last_step("uplink_bytes_total") if loop.round else 0
    csv_log = MetricsCSV(out_dir / "metrics.csv", dp=sim.privatizer.mode != "off")
    csv_log.rows = list(loop.rows)
    pending: list[dict[str, float]] = []
    progress = Progress(rounds, cfg.progress, start=loop.round)

    def flush() -> None:
        for row in pending:
            if row["round"] > logged_up_to:
                tracker.log_metrics({k: v for k, v in row.items() if k != "round"}, step=int(row["round"]))
        if pending:
            csv_log.write()
        pending.clear()

    try:
        for rnd in range(loop.round + 1, rounds + 1):
            metrics = round_metrics(built, rnd, loop)
            row = {"round": rnd, **metrics}
            loop.rows.append(row)
            csv_log.rows.append(row)
            pending.append(row)
            loop.round = rnd
            progress.update(rnd, rounds, metrics)
            early = cfg.patience > 0 and loop.since_best >= cfg.patience
            if early:
                loop.stopped = rnd
                log.info("early stopping at round %d: no improvement on the held-out split for %d evaluations",
                         rnd, loop.since_best)
            interrupted = stop is not None and stop.requested
            if not schedule.enabled:
                flush()
            elif schedule.due(rnd, state_bytes(sim)) or rnd == rounds or early or interrupted:
                flush()
                with schedule.timed(state_bytes(sim)):
                    save_checkpoint(out_dir, built, loop, tracker.run_id, finished=rnd == rounds or early)
            if interrupted:
                raise RunInterrupted(rnd, out_dir)
            if early:
                break
    finally:
        flush()
        progress.close()
        if csv_log.rows:
            plot_curve(csv_log.rows, key, out_dir / f"{key}.png",
                       f"{built.names['scheme']} on {built.names['dataset']} ({built.names['model']})")
    return run_summary(built, loop)


def run(cfg: DictConfig | dict, tracker=None, out_dir: str | Path | None = None) -> dict[str, float]:
    """Run one experiment from a (Hydra) config; returns the summary metrics.

    With ``resume`` set, the run continues from its checkpoint in its original folder and MLflow run.
    Raises :class:`RunInterrupted` (after saving a checkpoint) on Ctrl-C / SIGTERM and
    :class:`RunDiverged` on NaN/inf; the tracker's run is then marked KILLED / FAILED.
    """
    from fedrun.checkpoint import CHECKPOINT, CheckpointSchedule, StopFlag, config_hash, find_checkpoint, load_into
    from fedrun.provenance import log_source
    from fedrun.tracking import NullTracker, flatten

    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    out = Path(out_dir) if out_dir is not None else Path.cwd()
    tracker = tracker or NullTracker()
    tracker.check()  # an unreachable tracking server fails here, before any data loading or training
    for note in prepare(c):  # resolved before looking for a checkpoint: checkpoints store the resolved config
        log.info(note)
    chash = config_hash(c)
    cfg = typed(c)  # below: the typed config only
    resume = cfg.resume not in (None, False, "false", "False")
    if cfg.skip_finished and not resume:
        done = tracker.find_finished(chash)
        if done is not None:  # a resumable sweep: this job's experiment already ran to the end
            log.info("skip_finished: run %s already finished this configuration (fedrun.config_hash=%s)", done, chash)
            return {"skipped": 1.0}
    ckpt_path = None
    if resume:
        roots = [Path.cwd() / "outputs", Path.cwd() / "multirun", out.parent.parent]
        ckpt_path = find_checkpoint(cfg.resume, dict(cfg.record), roots, cfg.tracking_uri)
        out = ckpt_path.parent
    out.mkdir(parents=True, exist_ok=True)
    built = build(cfg)
    loop = LoopState()
    run_id, extended = None, False
    if ckpt_path is not None:
        state = load_into(ckpt_path, built, loop)  # refuses another config, bar more rounds where ε stays exact
        run_id, planned = state["run_id"], state["config"]["rounds"]
        extended = planned != cfg.rounds
        log.info("resuming %s after round %d%s", out, loop.round,
                 f"; rounds extended from {planned} to {cfg.rounds}" if extended else "")
    names = built.names
    tags = {"scheme": names["scheme"], "dataset": names["dataset"], "model": names["model"],
            "partition": names["partition"], "dp": names["dp"], "fedrun.config_hash": chash,
            "fedrun.num_parameters": str(built.sim.n)}
    tags.update(built.sim.scheme.tags)
    params = flatten({k: v for k, v in c.items() if k not in ("hydra", "resume")})  # the logged params: the dict
    run_name = cfg.run_name or f"{names['scheme']}-{names['dataset']}"
    tracker.set_dp(built.sim.privatizer.mode != "off")  # before any metric: what ε does not cover goes under nonprivate/
    tracker.start(params, tags, run_name=run_name, run_id=run_id)
    log_source(tracker, out)  # the code it runs: commit, and a dirty tree's diff as an artifact (fedrun.provenance)
    if ckpt_path is None or extended:
        (out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(c)))
    if extended:  # MLflow params are write-once: params.rounds stays the rounds first planned
        tracker.set_tags({"fedrun.rounds_extended": cfg.rounds, "fedrun.config_hash": chash})
    if ckpt_path is None:
        tracker.log_metrics({f"partition_{k}": float(v) for k, v in built.partition_stats.items()}, step=0)
        if CheckpointSchedule(cfg.checkpoint_every).enabled:
            tracker.set_tags({"fedrun.checkpoint": str((out / CHECKPOINT).resolve()),
                              "fedrun.run_dir": str(out.resolve())})
    if privacy_tags := built.sim.privatizer.tags():
        tracker.set_tags(privacy_tags)
    log.info("%s: %s | %s", names["scheme"], tracker.where, "outputs in " + str(out))
    status = "FAILED"
    try:
        with StopFlag() as stop:
            summary = run_rounds(built, tracker, out, loop, stop)
        summary.update(built.sim.privatizer.summary())
        tracker.log_metrics(summary, step=int(summary["rounds_completed"]))
        status = "FINISHED"
        return summary
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except RunDiverged as exc:
        tracker.set_tags({"fedrun.failure_reason": str(exc)})
        raise
    finally:
        for name in ("config.yaml", "metrics.csv", MetricsCSV.PRIVACY, "test_accuracy.png", "test_mse.png"):
            if (out / name).exists():
                try:
                    tracker.log_artifact(out / name)
                except Exception as exc:  # noqa: BLE001 - never lose the run over an artifact upload
                    log.warning("could not log artifact %s: %s", name, exc)
        tracker.end(status)
