"""Checkpoints of a run's full state, and finding the one to resume.

A checkpoint (``<run dir>/checkpoint.pt``) holds everything needed to continue a run exactly: the global
model, the scheme's server state (momentum, error, sketches…), per-client state, the privacy accountant's
history, the byte ledger, the loop bookkeeping (metrics so far, best round, early-stopping counters),
the round number and the MLflow run id. RNG states need no saving: every draw comes from a stream keyed
by (seed, round, purpose) (:mod:`fedrun.rng`). A small sidecar ``checkpoint.json`` (config, round, run id,
finished) lets ``resume=true`` find the run without loading tensors. Both files are written to a temp file
and renamed, so a kill mid-write leaves the previous checkpoint intact. Per-client state holds only the clients
that have a row (their ids and rows: :class:`fedrun.simulation.ClientState`).

When to save is :class:`CheckpointSchedule`'s: every k rounds, or (``checkpoint_every=auto``) after round 1
and then as often as keeps the time spent saving within :data:`AUTO_SHARE` (5 %) of the run's (about one save
per 20 save durations); the runner also saves at the last round and on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from fedrun.config import OPTIONAL_GROUPS, VOLATILE, ConfigError, deployment_keys

CHECKPOINT = "checkpoint.pt"
SIDECAR = "checkpoint.json"
FORMAT = 4  # 4: the codec's seed derived one way from the run's (a format-3 run would change its sketch hashes,
#            FL-RND coordinates and DCT shuffle mid-run); 3: the server state apart from the codec's
READABLE = (4,)
#: checkpoint_every=auto keeps the time spent saving (the final save included) within this share of the run's
AUTO_SHARE = 0.05
#: keys outside the hash that names a run's configuration (where it is logged, how it is driven)
#: ``server_lr`` is an input that :func:`fedrun.config.resolve_server_opts` resolves into ``scheme.server_lr``,
#: which is hashed: two runs at the same η_g are the same run however the table around it reads.
UNHASHED = (*VOLATILE, "tracking", "skip_finished", "server_lr")


def config_hash(c: dict) -> str:
    """A short hash of the resolved config's result-relevant keys (tag ``fedrun.config_hash``): two runs with
    the same hash ran the same experiment, so a sweep with ``skip_finished=true`` need not run it twice."""
    import hashlib

    return hashlib.sha256(json.dumps(_result_keys(c), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _result_keys(c: dict) -> dict:
    keep = {k: v for k, v in c.items() if k not in UNHASHED and k not in OPTIONAL_GROUPS}
    keep.update(deployment_keys(c))
    return keep


def check_resumable(stored: dict, built) -> None:
    """Refuse, in one line, to resume a run whose checkpointed config (``stored``) differs from this one in a key
    that changes results (:func:`config_hash`'s). The one difference allowed is more ``rounds`` (and the
    ``total_iterations`` they come from) where ε stays the composition of the events the rounds record: no DP, or
    client-level DP with independent noise and a given σ (``noise_multiplier``: a σ calibrated to ``epsilon`` was
    calibrated to spend it in the run's rounds; another σ for more rounds would spend more). Not under local DP (each
    client's noise is calibrated to its participations in the run's rounds) nor under a participation schema
    (``sampler=cyclic``: the schema, the noise's strategy matrix and its sensitivities are planned for the rounds)."""
    from fedrun.tracking import flatten

    old, new = flatten(_result_keys(stored)), flatten(_result_keys(dict(built.cfg.record)))
    diff = {k: (old.get(k, "unset"), new.get(k, "unset")) for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k)}
    rounds = diff.get("rounds", ("0", "0"))
    if diff and not (set(diff) <= {"rounds", "total_iterations"} and int(rounds[1]) > int(rounds[0])):
        raise ConfigError("resume: this config differs from the run's in " +
                          ", ".join(f"{k} ({a} → {b})" for k, (a, b) in diff.items()) +
                          "; resume with the run's config, or start a new run")
    if not diff:
        return
    sim, cfg = built.sim, built.cfg
    why = ("local DP calibrated each client's noise to its participations in them" if sim.local_dp is not None else
           "the participation schema (sampler=cyclic) and its noise were planned for them"
           if sim.client_dp is not None and sim.client_dp.schema is not None else
           f"σ was calibrated to spend epsilon={cfg.epsilon:g} in them"
           if sim.client_dp is not None and cfg.noise_multiplier is None else None)
    if why is not None:
        raise ConfigError(f"resume: rounds={rounds[1]} extends the run's {rounds[0]} rounds, but {why}; resume with "
                          f"rounds={rounds[0]}, or start a new run")


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(out_dir: Path, built, loop, run_id: str | None, finished: bool = False) -> Path:
    """Write the run's state after round ``loop.round`` (checkpoint.pt, then its sidecar)."""
    sim = built.sim
    state: dict[str, Any] = {
        "format": FORMAT,
        "round": loop.round,
        "run_id": run_id,
        "config": dict(built.cfg.record),
        "params": sim.params.detach().cpu(),
        "scheme": built.runner.state_dict() if built.runner is not sim else sim.scheme.state_dict(),
        "server": {"velocity": sim.velocity, "holds_frozen": torch.from_numpy(sim.holds_frozen)},
        "client_state": sim.client_state.state_dict(),
        "accountant": sim.accountant.state_dict() if sim.accountant is not None else None,
        "local_dp": sim.local_dp.state_dict() if sim.local_dp is not None else None,
        "canaries": sim.canaries.state_dict() if sim.canaries is not None else None,
        "participation": sim.privatizer.ledger.state_dict() if sim.privatizer.ledger is not None else None,
        "ledger": sim.ledger.state_dict(),
        "deployment": sim.deployment.state_dict() if sim.deployment is not None else None,
        "loop": {"rows": loop.rows, "best": loop.best, "best_val": loop.best_val,
                 "since_best": loop.since_best, "stopped": loop.stopped, "round": loop.round},
    }
    path = out_dir / CHECKPOINT
    _atomic_write(path, lambda f: torch.save(state, f))
    side = {"round": loop.round, "run_id": run_id, "finished": finished, "config": dict(built.cfg.record)}
    _atomic_write(out_dir / SIDECAR, lambda f: f.write(json.dumps(side, default=str).encode()))
    return path


def load_into(path: Path, built, loop) -> dict:
    """Restore a checkpoint into a freshly built simulation and loop state, if :func:`check_resumable` allows it;
    returns the raw state."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("format") not in READABLE:
        raise ConfigError(f"checkpoint {path} has format {state.get('format')}; this fedrun reads formats "
                          f"{', '.join(map(str, READABLE))}")
    check_resumable(state["config"], built)  # before anything is restored
    sim = built.sim
    sim.params.copy_(state["params"].to(sim.device))
    (built.runner if built.runner is not sim else sim.scheme).load_state_dict(state["scheme"])
    server = state.get("server") or {}
    if server.get("velocity") is not None:
        sim.velocity = server["velocity"].to(sim.device)
    if server.get("holds_frozen") is not None:
        sim.holds_frozen = server["holds_frozen"].numpy().astype(bool).copy()
    sim.client_state.load_state_dict(state["client_state"])
    if state["accountant"] is not None:
        sim.accountant.load_state_dict(state["accountant"])
    if state["local_dp"] is not None:
        sim.local_dp.load_state_dict(state["local_dp"])
    if state.get("canaries") is not None:  # made now (their length is the payload's), then restored
        sim.privatizer.make_canaries(int(state["canaries"]["dim"])).load_state_dict(state["canaries"])
    if state.get("participation") is not None:  # the participation ledger: who took part when, canaries included
        sim.privatizer.ledger.load_state_dict(state["participation"])
    sim.ledger.load_state_dict(state["ledger"])
    if state.get("deployment") is not None:
        sim.deployment.load_state_dict(state["deployment"])
    for k, v in state["loop"].items():
        setattr(loop, k, v)
    return state


class CheckpointSchedule:
    """Which rounds end with a checkpoint (and a metrics flush), from ``checkpoint_every``.

    * an integer k > 0: every k-th round;
    * 0 or null: never (the runner then flushes metrics every round);
    * ``auto``: after the first round (which measures what a save costs), then at the first round end where the
      time spent saving so far, plus this save and a final one (each predicted from the last save's duration,
      scaled by how much the state has grown since: ``nbytes``), is at most ``share`` (5 %) of the time since
      the schedule started. Between saves that is about 19 save durations of rounds; a run longer than ~40 saves'
      worth spends at most ~5 % of its time saving, whatever the state's size or the disk's speed (a slow save
      pushes the next one further out).

    The runner also saves at the last round, at early stopping and on Ctrl-C / SIGTERM, whatever this says.
    Only the checkpoint write is timed (:meth:`timed`), not the metrics flush, whose cost is per round logged.
    ``clock`` (seconds, monotonic) is injectable for tests.
    """

    def __init__(self, every: Any, share: float = AUTO_SHARE,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.auto = isinstance(every, str) and every.lower() == "auto"
        self.every = 0 if self.auto else int(every or 0)
        self.share = float(share)
        self.clock = clock
        self.start = clock()
        self.last_cost: float | None = None  # seconds the last save took
        self.last_bytes: int | None = None  # the state's size then (as the caller measures it)
        self.saves = 0
        self.seconds = 0.0  # spent saving, all saves together

    @property
    def enabled(self) -> bool:
        return self.auto or self.every > 0

    def predicted(self, nbytes: int | None = None) -> float:
        """A save's duration now: the last one's, scaled by the state's growth since (when sizes are given)."""
        if nbytes is None or not self.last_bytes:
            return self.last_cost
        return self.last_cost * nbytes / self.last_bytes

    def due(self, rnd: int, nbytes: int | None = None) -> bool:
        """Whether round ``rnd`` (just completed) should end with a save; ``nbytes``: the state's size now."""
        if not self.auto:
            return self.every > 0 and rnd % self.every == 0
        if self.last_cost is None:
            return True
        cost = self.predicted(nbytes)
        elapsed = self.clock() - self.start
        return self.seconds + 2 * cost <= self.share * (elapsed + cost)

    def timed(self, nbytes: int | None = None) -> "_Timed":
        """``with schedule.timed(nbytes): save()`` records the save's duration (and the state's size) for
        :meth:`due`."""
        return _Timed(self, nbytes)


class _Timed:
    def __init__(self, schedule: CheckpointSchedule, nbytes: int | None) -> None:
        self.schedule, self.nbytes = schedule, nbytes

    def __enter__(self) -> None:
        self.t0 = self.schedule.clock()

    def __exit__(self, *exc) -> None:
        s = self.schedule
        s.last_cost = s.clock() - self.t0
        s.last_bytes = self.nbytes
        s.saves += 1
        s.seconds += s.last_cost


def state_bytes(sim) -> int:
    """What a checkpoint's size grows with: the global model and the per-client rows (the rest is about fixed)."""
    return sim.params.numel() * sim.params.element_size() + sim.client_state.nbytes()


def find_checkpoint(resume: Any, record: dict, search_roots: list[Path], tracking_uri: str | None = None) -> Path:
    """The checkpoint file ``resume`` designates.

    ``resume`` is ``true`` (the newest unfinished checkpoint under ``search_roots`` whose config equals
    this one), a run folder or checkpoint file, or an MLflow run id (its ``fedrun.checkpoint`` tag).
    """
    if resume is True or str(resume).lower() == "true":
        want = json.loads(json.dumps(record, default=str))
        candidates = sorted((p for root in search_roots if root.is_dir() for p in root.rglob(SIDECAR)),
                            key=lambda p: p.stat().st_mtime, reverse=True)
        finished = None
        for side in candidates:
            try:
                meta = json.loads(side.read_text())
            except (OSError, ValueError):
                continue
            if meta.get("config") != want or not (side.parent / CHECKPOINT).exists():
                continue
            if meta.get("finished"):
                finished = finished or side.parent
                continue
            return side.parent / CHECKPOINT
        where = ", ".join(str(r) for r in search_roots)
        if finished is not None:
            raise ConfigError(f"resume=true: the newest run with this configuration already finished ({finished}); "
                              f"nothing to resume")
        raise ConfigError(f"resume=true: no unfinished checkpoint of this configuration under {where}; "
                          f"run without resume, or pass resume=<run folder>")
    text = str(resume)
    path = Path(text)
    if path.is_dir() and (path / CHECKPOINT).exists():
        return path / CHECKPOINT
    if path.is_file():
        return path
    if re.fullmatch(r"[0-9a-f]{32}", text):
        from mlflow.tracking import MlflowClient

        from fedrun.tracking import resolve_uri

        tag = MlflowClient(tracking_uri=resolve_uri(tracking_uri)).get_run(text).data.tags.get("fedrun.checkpoint")
        if tag and Path(tag).exists():
            return Path(tag)
        raise ConfigError(f"resume={text}: that MLflow run has no checkpoint on this machine (tag fedrun.checkpoint={tag})")
    raise ConfigError(f"resume={text!r} is not a checkpoint, a run folder holding {CHECKPOINT}, an MLflow run id, "
                      f"true or false")


class StopFlag:
    """Turns the first Ctrl-C / SIGTERM into a request to stop after the current round.

    A second Ctrl-C aborts at once (the previous checkpoint stays intact). Installed only in the main
    thread (signal handlers cannot be set elsewhere); a no-op otherwise.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        name = signal.Signals(signum).name
        print(f"\nfedrun: {name} received: stopping after this round and saving a checkpoint "
              f"(Ctrl-C again to abort now)", flush=True)

    def __enter__(self) -> "StopFlag":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
