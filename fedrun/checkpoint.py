"""Checkpoints of a run's full state, and finding the one to resume.

A checkpoint (``<run dir>/checkpoint.pt``) holds everything needed to continue a run exactly: the global
model, the scheme's server state (momentum, error, sketches…), per-client state, the privacy accountant's
history, the byte ledger, the loop bookkeeping (metrics so far, best round, early-stopping counters),
the round number and the MLflow run id. RNG states need no saving: every draw comes from a stream keyed
by (seed, round, purpose) (:mod:`fedrun.rng`). A small sidecar ``checkpoint.json`` (config, round, run id,
finished) lets ``resume=true`` find the run without loading tensors. Both files are written to a temp file
and renamed, so a kill mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

import torch

from fedrun.config import ConfigError

CHECKPOINT = "checkpoint.pt"
SIDECAR = "checkpoint.json"
FORMAT = 1
#: config keys that may differ between the interrupted run and its resumption
VOLATILE = ("resume", "progress", "hydra", "workers", "checkpoint_every", "chunk_size")


def comparable(c: dict) -> dict:
    """The config without keys that do not change the run's results."""
    return {k: v for k, v in c.items() if k not in VOLATILE}


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(out_dir: Path, built, c: dict, loop, run_id: str | None, finished: bool = False) -> Path:
    """Write the run's state after round ``loop.round`` (checkpoint.pt, then its sidecar)."""
    sim = built.sim
    state: dict[str, Any] = {
        "format": FORMAT,
        "round": loop.round,
        "run_id": run_id,
        "config": comparable(c),
        "params": sim.params.detach().cpu(),
        "scheme": sim.scheme.state_dict(),
        "client_state": sim.client_state.state_dict(),
        "accountant": sim.accountant.state_dict() if sim.accountant is not None else None,
        "local_dp": sim.local_dp.state_dict() if sim.local_dp is not None else None,
        "canaries": sim.canaries.state_dict() if sim.canaries is not None else None,
        "ledger": sim.ledger.state_dict(),
        "loop": {"rows": loop.rows, "best": loop.best, "best_val": loop.best_val,
                 "since_best": loop.since_best, "stopped": loop.stopped, "round": loop.round},
    }
    path = out_dir / CHECKPOINT
    _atomic_write(path, lambda f: torch.save(state, f))
    side = {"round": loop.round, "run_id": run_id, "finished": finished, "config": comparable(c)}
    _atomic_write(out_dir / SIDECAR, lambda f: f.write(json.dumps(side, default=str).encode()))
    return path


def load_into(path: Path, built, loop) -> dict:
    """Restore a checkpoint into a freshly built simulation and loop state; returns the raw state."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("format") != FORMAT:
        raise ConfigError(f"checkpoint {path} has format {state.get('format')}; this fedrun reads format {FORMAT}")
    sim = built.sim
    sim.params.copy_(state["params"].to(sim.device))
    sim.scheme.load_state_dict(state["scheme"])
    sim.client_state.load_state_dict(state["client_state"])
    if state["accountant"] is not None:
        sim.accountant.load_state_dict(state["accountant"])
        # each restored event stands for one noised aggregation of the rounds before the checkpoint
        sim.privacy.noised_aggregations = len(sim.accountant.events)
    if state["local_dp"] is not None:
        sim.local_dp.load_state_dict(state["local_dp"])
    if state.get("canaries") is not None:  # made now (their length is the payload's), then restored
        sim.make_canaries(int(state["canaries"]["dim"])).load_state_dict(state["canaries"])
    sim.ledger.load_state_dict(state["ledger"])
    for k, v in state["loop"].items():
        setattr(loop, k, v)
    return state


def find_checkpoint(resume: Any, c: dict, search_roots: list[Path], tracking_uri: str | None = None) -> Path:
    """The checkpoint file ``resume`` designates.

    ``resume`` is ``true`` (the newest unfinished checkpoint under ``search_roots`` whose config equals
    this one), a run folder or checkpoint file, or an MLflow run id (its ``fedrun.checkpoint`` tag).
    """
    if resume is True or str(resume).lower() == "true":
        want = json.loads(json.dumps(comparable(c), default=str))
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
