"""Experiment tracking: MLflow (a real database) or nothing.

* Tracking URI: config ``tracking.uri``, else env ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in
  the directory fedrun runs from (MLflow 3's own default).
* One MLflow run per fedrun run: flattened resolved config as params, tags (scheme, dataset, model, git
  commit, sweep), one metrics batch per round (``step = round``), summary metrics, and artifacts.
* Sweeps (``fedrun -m``): :class:`SweepCallback` creates the store, the experiment and a parent run before
  any job starts (MLflow's SQLite store races when several processes create it at once); every job's
  run carries the parent's id (``mlflow.parentRunId``) and the tag ``fedrun.sweep``.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

DEFAULT_URI = "sqlite:///mlflow.db"
PARENT_FILE = "mlflow_parent_run.txt"


def resolve_uri(uri: str | None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def git_commit(path: Path | None = None) -> str:
    """The checkout's commit (with ``+dirty`` when the tree has changes), or ``unknown``."""
    here = path or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha + ("+dirty" if dirty else "")) if sha else "unknown"


def flatten(d: Any, prefix: str = "") -> dict[str, str]:
    """Nested dict/list → {"a.b.c": "value"} for MLflow params."""
    out: dict[str, str] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(d, (list, tuple)):
        out[prefix[:-1]] = str(list(d))
    else:
        out[prefix[:-1]] = str(d)
    return out


class NullTracker:
    """Tracks nothing (``tracking=none``, tests)."""

    run_id: str | None = None
    where = "not tracked"

    def start(self, params: dict[str, str], tags: dict[str, str], run_name: str | None = None,
              run_id: str | None = None) -> None:
        pass

    def check(self) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: Path) -> None:
        pass

    def last_step(self, metric: str) -> int:
        return 0

    def set_tags(self, tags: dict[str, str]) -> None:
        pass

    def end(self, status: str = "FINISHED") -> None:
        pass


def check_server(uri: str, timeout: float = 5.0) -> None:
    """Fail fast (seconds, not MLflow's minutes of retries) when an HTTP tracking server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - the user's own server
            if resp.status != 200:
                raise ConnectionError(f"MLflow tracking server {uri} answered {resp.status} on /health")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConnectionError(f"MLflow tracking server {uri} is not reachable ({reason}); start it, or unset "
                              f"MLFLOW_TRACKING_URI / tracking.uri to log to sqlite:///mlflow.db here") from None


def _check_reachable(client, uri: str) -> None:
    try:
        client.search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any failure here means the store is unusable
        raise ConnectionError(f"MLflow tracking store {uri} is not reachable: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200]}") from None


def prepare_store(uri: str, experiment: str) -> str:
    """Create the store (tables) and the experiment if missing; return the experiment id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    _check_reachable(client, uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(experiment)
    except Exception:  # noqa: BLE001 - created meanwhile by another process
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            raise
        return exp.experiment_id


class MlflowTracker:
    """Logs one fedrun run to MLflow through ``MlflowClient`` (no global fluent state)."""

    def __init__(self, uri: str | None, experiment: str, parent_run_id: str | None = None,
                 sweep: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = resolve_uri(uri)
        self.experiment = experiment
        self.client = MlflowClient(tracking_uri=self.uri)
        self.parent_run_id = parent_run_id
        self.sweep = sweep
        self.run_id: str | None = None
        self.experiment_id: str | None = None

    @property
    def where(self) -> str:
        return f"MLflow run {self.run_id} in experiment '{self.experiment}' at {self.uri}"

    def check(self) -> None:
        """Is the tracking store usable? Called before any data is loaded or training starts."""
        check_server(self.uri)

    def start(self, params: dict[str, str], tags: dict[str, str], run_name: str | None = None,
              run_id: str | None = None) -> None:
        from mlflow.entities import Param

        self.experiment_id = prepare_store(self.uri, self.experiment)
        if run_id is not None:  # resume an existing run
            self.client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            return
        all_tags = dict(tags)
        if self.parent_run_id:
            all_tags["mlflow.parentRunId"] = self.parent_run_id
        if self.sweep:
            all_tags["fedrun.sweep"] = self.sweep
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=run_name)
        self.run_id = run.info.run_id
        items = [Param(k, v[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, int(step)) for k, v in metrics.items() if v is not None]
        for i in range(0, len(batch), 500):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 500])

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def last_step(self, metric: str) -> int:
        """Highest step logged for ``metric`` (0 if none): where a resumed run's logging continues."""
        history = self.client.get_metric_history(self.run_id, metric)
        return max((m.step for m in history), default=0)

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def end(self, status: str = "FINISHED") -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status=status)


# -------------------------------------------------------------------------------------- Hydra sweeps
try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object  # type: ignore[misc,assignment]


class SweepCallback(Callback):
    """Prepare MLflow before a multirun's jobs start and group them under one parent run."""

    def on_multirun_start(self, config, **kwargs) -> None:
        tracking = config.get("tracking", {})
        if tracking.get("kind") != "mlflow":
            return
        from mlflow.tracking import MlflowClient

        uri = resolve_uri(tracking.get("uri"))
        try:
            check_server(uri)
            exp_id = prepare_store(uri, tracking.get("experiment", "fedrun"))
        except ConnectionError as exc:
            import sys

            print(f"fedrun: error: {exc}", file=sys.stderr)
            sys.exit(2)
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=uri)
        parent = client.create_run(exp_id, run_name=f"sweep {sweep_dir.name}",
                                   tags={"fedrun.sweep": str(sweep_dir), "fedrun.kind": "sweep"})
        (sweep_dir / PARENT_FILE).write_text(parent.info.run_id)

    def on_multirun_end(self, config, **kwargs) -> None:
        tracking = config.get("tracking", {})
        if tracking.get("kind") != "mlflow":
            return
        parent_file = Path(config.hydra.sweep.dir) / PARENT_FILE
        if parent_file.exists():
            from mlflow.tracking import MlflowClient

            MlflowClient(tracking_uri=resolve_uri(tracking.get("uri"))).set_terminated(
                parent_file.read_text().strip(), status="FINISHED")
