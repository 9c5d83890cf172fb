"""Experiment tracking: MLflow (a real database) or nothing.

* Tracking URI: config ``tracking.uri``, else env ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` here.
* One MLflow run per fedrun run: the flattened config as params, tags (scheme, dataset, model, git commit, sweep),
  one metrics batch per round (``step = round``), summary metrics, artifacts. Metric names: :mod:`fedrun.metric_names`;
  diagnostics only with ``tracking.diagnostics=true``; under DP (:meth:`MlflowTracker.set_dp`) each metric ε does
  not cover is logged as ``nonprivate/<name>`` and listed in the tag ``dp.not_covered_by_epsilon``.
* Sweeps (``fedrun -m``): :class:`SweepCallback` creates the store, the experiment and a parent run before any job
  starts (MLflow's SQLite store races when several processes create it); each job's run carries the parent's id
  and the tag ``fedrun.sweep``, its name the swept values (``fl_cs-fashion_mnist r=0.05``). A failed job fails the
  sweep through Hydra (:class:`fedrun.cli.JobFailed`): the other jobs run, then exit 1.
* The UI (:func:`runs_table_url`, ``python -m fedrun.tracking ui-url``), written against MLflow 3.17's UI: URLs of
  the "Model training" runs table in a saved view (experiment tag ``mlflow.sharedViewState.fedrun``); run
  descriptions in MLflow's ``mlflow.note.content`` tag.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from hydra.experimental.callback import Callback

from fedrun.metric_names import NOT_COVERED, NOT_COVERED_TAG, covered_by_epsilon, is_diagnostic, metric_name

log = logging.getLogger("fedrun")

DEFAULT_URI = "sqlite:///mlflow.db"
PARENT_FILE = "mlflow_parent_run.txt"
SWEPT_FILE = "mlflow_swept_keys.txt"  # the sweep's swept override keys, one a line (for the jobs' run names)


# ------------------------------------------------------------------------------------------ the UI
VIEW_KEY = "fedrun"
VIEW_TAG = "mlflow.sharedViewState." + VIEW_KEY  # a saved runs-table view (MLflow UI's "Views" menu)
VIEW_NAME = "fedrun: runs and key metrics"
#: Columns of the saved view: the key numbers of a run (its run name, which carries the swept values, is always
#: shown). Columns of metrics no run has are not shown.
VIEW_METRICS = ("summary/best_test_accuracy", "summary/best_test_mse", "epsilon", "uplink_bytes_total",
                NOT_COVERED + "uplink_bytes_total", "test_accuracy", "test_mse")  # a DP run's bytes: marked
VIEW_TAGS = ("scheme", "dataset", "dp")
#: Hydra config groups that fedrun also logs as run tags (a sweep over them shows the tag as a column).
TAGGED_GROUPS = ("scheme", "dataset", "model", "partition")
#: Every fedrun run has this tag; the view filters on it, which also lists a sweep's runs flat (MLflow folds
#: child runs under their parent only in its default, unfiltered, date-sorted table).
RUN_KIND_TAG, RUN_KIND = "fedrun.kind", "run"
DEFAULT_UI_HOST, DEFAULT_UI_PORT = "127.0.0.1", 5000


def ui_base(uri: str | None = None, host: str = DEFAULT_UI_HOST, port: int | str | None = None) -> str:
    """Where the UI of a tracking store is: the server itself for an http(s) URI, else ``make ui``'s
    ``http://127.0.0.1:$PORT`` (5000)."""
    uri = resolve_uri(uri)
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    port = port or os.environ.get("PORT") or DEFAULT_UI_PORT
    return f"http://{host}:{port}"


def runs_table_url(base: str, experiment_id: str, view: bool = True) -> str:
    """The runs table of an experiment in MLflow 3's UI (``#/experiments/<id>/runs``), opened as "Model
    training" (``workflowType=machine_learning``: MLflow 3.17's UI otherwise opens the GenAI overview) and,
    with ``view``, with fedrun's saved view (key metrics as columns, sweeps unfolded)."""
    url = f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
    return url + (f"&viewStateShareKey={VIEW_KEY}" if view else "")


def run_url(base: str, experiment_id: str, run_id: str, tab: str = "") -> str:
    """One run's page: its overview (metric values, parameters, description), or a tab (``model-metrics``: the
    metric charts)."""
    tab = f"/{tab}" if tab else ""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}{tab}?workflowType=machine_learning"


def view_columns(swept: Iterable[str] = (), groups: Iterable[str] = ()) -> list[str]:
    """The saved view's columns (MLflow's column ids), in order: the swept parameters, :data:`VIEW_METRICS`,
    :data:`VIEW_TAGS` (MLflow's table shows them grouped: parameters, metrics, tags).

    ``swept`` are Hydra override keys; ``groups`` the config groups among them (``scheme``, ``model``, …):
    a group fedrun tags a run with shows as that tag, another group only in the run name.
    """
    groups = set(groups)
    keys = [k.lstrip("+~") for k in swept]
    cols = list(dict.fromkeys(f"tags.`{k}`" if k in groups else f"params.`{k}`" for k in keys
                              if k not in groups or k in TAGGED_GROUPS))
    cols += [f"metrics.`{m}`" for m in VIEW_METRICS]
    cols += [f"tags.`{t}`" for t in VIEW_TAGS if f"tags.`{t}`" not in cols]
    return cols


def view_state(columns: Sequence[str]) -> dict[str, Any]:
    """The runs table's state in fedrun's saved view: its filter (fedrun's runs, not the sweeps' parent runs), its
    order (by run name, which carries the swept values; MLflow folds child runs under their parent only when
    sorted by creation time), and the columns (in this order, wide enough for their names)."""
    return {"searchFilter": f"tags.`{RUN_KIND_TAG}` = '{RUN_KIND}'", "orderByKey": "tags.`mlflow.runName`",
            "orderByAsc": True, "selectedColumns": list(columns), "columnOrder": list(columns),
            "columnWidths": {c: min(240, max(100, 30 + 7 * (len(c) - len(c.split(".", 1)[0]) - 3)))
                             for c in columns}}


def view_tag_value(columns: Sequence[str], now_ms: int | None = None, created_ms: int | None = None) -> str:
    """The experiment tag that holds the saved view: MLflow UI's envelope {name, createdAt, updatedAt, state}."""
    now = int(now_ms if now_ms is not None else time.time() * 1000)
    return json.dumps({"name": VIEW_NAME, "createdAt": int(created_ms or now), "updatedAt": now,
                       "state": json.dumps(view_state(columns))})


def setup_experiment(client, experiment_id: str, tags: dict[str, str], swept: Sequence[str] = (),
                     groups: Sequence[str] = ()) -> None:
    """Add ``swept`` to the experiment's saved view (create it if missing)."""
    try:  # the saved view's state and createdAt, if there is one
        env = json.loads(tags.get(VIEW_TAG))
        state, created = json.loads(env["state"]), env.get("createdAt")
    except (TypeError, ValueError, KeyError, AttributeError):
        state, created = {}, None
    have = list(state.get("selectedColumns", []))
    fixed = view_columns()
    # swept parameters of earlier sweeps stay, the new sweep's are added, then the fixed columns
    cols = list(dict.fromkeys(c for c in have + view_columns(swept, groups) if c not in fixed)) + fixed
    if state == view_state(cols):
        return
    client.set_experiment_tag(experiment_id, VIEW_TAG, view_tag_value(cols, created_ms=created))


def run_note(latest: dict[str, float]) -> str:
    """A finished run's description (markdown): its key numbers, from the last value of each metric (fedrun's
    names); "" before the run summary was logged."""
    key = "best_test_accuracy" if "best_test_accuracy" in latest else "best_test_mse"
    if key not in latest:
        return ""
    head = ["best test " + key.rsplit("_", 1)[1].replace("mse", "MSE"), "at round", "final ε", "uplink MB",
            "downlink MB", "rounds"]
    row = [_num(latest[key]), _num(latest.get("best_round"), spec="{:.0f}"), _num(latest.get("epsilon_final")),
           _num(latest.get("uplink_bytes_final"), 1e6, "{:.2f}"),
           _num(latest.get("downlink_bytes_final"), 1e6, "{:.2f}"), _num(latest.get("rounds_completed"), spec="{:.0f}")]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head), "| " + " | ".join(row) + " |"])


def _num(value: float | None, scale: float = 1.0, spec: str = "{:.4g}") -> str:
    """A number in a run's or a sweep's description ("–" if missing)."""
    return "–" if value is None else spec.format(value / scale)


def sweep_suffix(job_overrides: Iterable[str], swept: Iterable[str]) -> str:
    """The swept values of one job of a sweep, for its run name: ``r=0.05`` (scheme and dataset are already in
    the name: ``fl_cs-fashion_mnist r=0.05``)."""
    swept = {k.lstrip("+~") for k in swept}
    parts = []
    for o in job_overrides:
        key, sep, value = o.partition("=")
        key = key.lstrip("+~")
        if sep and key in swept and key not in ("scheme", "dataset"):
            parts.append(f"{key}={value}")
    return " ".join(parts)


def resolve_uri(uri: str | None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def git_state(path: Path | None = None, max_file_bytes: int = 1 << 20) -> tuple[str, bool, str]:
    """(commit, dirty, diff) of the checkout fedrun runs from: ``dirty`` counts changes to tracked files and
    untracked files that git does not ignore; ``diff`` is ``git diff HEAD`` plus each such untracked text file as
    a new-file diff (files over ``max_file_bytes`` are named, not included), so an exported run can be traced to
    the exact code. ("unknown", False, "") outside a git checkout."""
    here = path or Path(__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=20).stdout

    try:
        sha = git("rev-parse", "HEAD").strip()
        if not sha:
            return "unknown", False, ""
        diff = git("diff", "HEAD", "--no-color")
        root = Path(git("rev-parse", "--show-toplevel").strip())
        untracked = [f for f in git("ls-files", "--others", "--exclude-standard", "--full-name", str(root)).splitlines()
                     if f]   # the whole checkout's, not only those under the package's folder
        for name in untracked:
            f = root / name
            if f.is_file() and f.stat().st_size <= max_file_bytes:
                diff += subprocess.run(["git", "diff", "--no-index", "--no-color", "/dev/null", name], cwd=root,
                                       capture_output=True, text=True, timeout=20).stdout
            else:
                diff += f"# untracked file not included (over {max_file_bytes} bytes or not a file): {name}\n"
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        return "unknown", False, ""
    return sha, bool(diff), diff


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
              run_id: str | None = None) -> None: pass
    def check(self) -> None: pass
    def urls(self) -> dict[str, str]: return {}
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: pass
    def set_dp(self, dp: bool) -> None: pass
    def find_finished(self, config_hash: str) -> str | None: return None
    def log_artifact(self, path: Path) -> None: pass
    def last_step(self, metric: str) -> int: return 0
    def set_tags(self, tags: dict[str, str]) -> None: pass
    def end(self, status: str = "FINISHED") -> None: pass


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


def prepare_store(uri: str, experiment: str, swept: Sequence[str] = (), groups: Sequence[str] = ()) -> str:
    """Create the store (tables) and the experiment if missing, set it up for the UI (:func:`setup_experiment`);
    return the experiment id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    try:
        client.search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any failure here means the store is unusable
        raise ConnectionError(f"MLflow tracking store {uri} is not reachable: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200]}") from None
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        try:
            client.create_experiment(experiment)
        except Exception:  # noqa: BLE001 - created meanwhile by another process
            pass
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            raise RuntimeError(f"MLflow experiment {experiment!r} could not be created at {uri}")
    try:
        setup_experiment(client, exp.experiment_id, dict(exp.tags), swept, groups)
    except Exception as exc:  # noqa: BLE001 - the UI's conveniences never stop a run
        log.warning("could not set up experiment %r for the MLflow UI: %s", experiment, exc)
    return exp.experiment_id


class MlflowTracker:
    """Logs one fedrun run to MLflow through ``MlflowClient`` (no global fluent state). With ``diagnostics=False``
    the diagnostics (metrics in a group other than ``summary/``: ``dp/…``, ``decoder/…``, …) are not logged:
    MLflow's run page lists every group before the key metrics' "Model metrics" (they stay in metrics.csv)."""

    def __init__(self, uri: str | None, experiment: str, parent_run_id: str | None = None,
                 sweep: str | None = None, name_suffix: str = "", diagnostics: bool = True) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = resolve_uri(uri)
        self.experiment = experiment
        self.client = MlflowClient(tracking_uri=self.uri)
        self.parent_run_id = parent_run_id
        self.sweep = sweep
        self.name_suffix = name_suffix  # a sweep job's swept values, appended to the run name
        self.diagnostics = diagnostics
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.latest: dict[str, float] = {}  # the last value of each metric logged (fedrun's names)
        self.dp = False  # a run with DP: the metrics ε does not cover are marked (set_dp)
        self.not_covered: set[str] = set()  # those logged so far (fedrun's names; the run tag lists them)

    @property
    def where(self) -> str:
        return f"MLflow run {self.run_id} in experiment '{self.experiment}' at {self.uri}"

    def urls(self) -> dict[str, str]:
        """Where to look in the UI: this run's charts and the experiment's runs table."""
        if self.run_id is None or self.experiment_id is None:
            return {}
        base = ui_base(self.uri)
        return {"run": run_url(base, self.experiment_id, self.run_id),
                "runs": runs_table_url(base, self.experiment_id)}

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
            if self.dp:  # the tag keeps listing what the run logged before it was interrupted
                listed = self.client.get_run(run_id).data.tags.get(NOT_COVERED_TAG, "")
                self.not_covered |= {n for n in listed.split(",") if n}
            return
        all_tags = {**tags, RUN_KIND_TAG: RUN_KIND}
        if self.name_suffix:
            run_name = f"{run_name or ''} {self.name_suffix}".strip()
        if self.parent_run_id:
            all_tags["mlflow.parentRunId"] = self.parent_run_id
        if self.sweep:
            all_tags["fedrun.sweep"] = self.sweep
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=run_name)
        self.run_id = run.info.run_id
        self.client.log_batch(self.run_id, params=[Param(k, v[:6000]) for k, v in params.items()])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        values = {k: float(v) for k, v in metrics.items() if v is not None}
        batch = [Metric(metric_name(k, self.dp), v, now, int(step)) for k, v in values.items()]
        new = {k for k in values if self.dp and not covered_by_epsilon(k)} - self.not_covered
        self.not_covered |= new  # the tag lists every such metric, logged to MLflow or only to metrics.csv
        tags = [RunTag(NOT_COVERED_TAG, ",".join(sorted(self.not_covered)))] if new else []
        self.client.log_batch(self.run_id, metrics=[m for m in batch if self.diagnostics or not is_diagnostic(m.key)],
                              tags=tags)  # MLflow splits it into requests it accepts
        self.latest.update(values)

    def set_dp(self, dp: bool) -> None:
        """A run with DP (client-level or local): from now on the metrics ε does not cover are logged as
        ``nonprivate/<name>`` and listed in the run tag ``dp.not_covered_by_epsilon`` (:mod:`fedrun.metric_names`).
        Called before :meth:`start`."""
        self.dp = bool(dp)

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def last_step(self, metric: str) -> int:
        """Highest step logged for ``metric`` (0 if none): where a resumed run's logging continues."""
        history = self.client.get_metric_history(self.run_id, metric_name(metric, self.dp))
        return max((m.step for m in history), default=0)

    def find_finished(self, config_hash: str) -> str | None:
        """The id of a FINISHED run of this experiment with tag ``fedrun.config_hash`` = ``config_hash``, if any."""
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is None:
            return None
        runs = self.client.search_runs([exp.experiment_id],
                                       filter_string=f"tags.`fedrun.config_hash` = '{config_hash}' "
                                                     f"and attributes.status = 'FINISHED'", max_results=1)
        return runs[0].info.run_id if runs else None

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def end(self, status: str = "FINISHED") -> None:
        if self.run_id is None:
            return
        note = run_note(self.latest) if status == "FINISHED" else ""
        if note:  # the run page's Overview opens on it
            try:
                self.client.set_tag(self.run_id, "mlflow.note.content", note)
            except Exception as exc:  # noqa: BLE001 - a description is not worth failing the run over
                log.warning("could not describe the MLflow run: %s", exc)
        self.client.set_terminated(self.run_id, status=status)


# -------------------------------------------------------------------------------------- Hydra sweeps

def swept_keys(overrides: Iterable[str]) -> list[str]:
    """The keys a Hydra multirun sweeps (``scheme=fl_cs,fl_rnd r=0.05,0.1 rounds=3`` → scheme, r)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # noqa: BLE001 - Hydra parsed them already; a name is not worth failing the sweep over
        return []
    return [o.key_or_group for o in parsed if o.is_sweep_override()]


def sweep_note(runs: list, experiment_id: str) -> str:
    """The sweep parent run's description: its runs with their key metrics (markdown, links to each run)."""
    def val(run, name: str, scale: float = 1.0, spec: str = "{:.4g}") -> str:
        return _num(run.data.metrics.get(metric_name(name), run.data.metrics.get(metric_name(name, dp=True))),
                    scale, spec)

    lines = ["Runs of this sweep (open the experiment's view \"" + VIEW_NAME + "\" for all columns):", "",
             "| run | status | best test accuracy / MSE | ε | uplink MB | rounds |", "|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: r.info.run_name or ""):
        best = r.data.metrics.get(metric_name("best_test_accuracy"), r.data.metrics.get(metric_name("best_test_mse")))
        lines.append(f"| [{r.info.run_name}](#/experiments/{experiment_id}/runs/{r.info.run_id}) | {r.info.status} | "
                     f"{_num(best)} | {val(r, 'epsilon_final')} | "
                     f"{val(r, 'uplink_bytes_final', 1e6, '{:.2f}')} | {val(r, 'rounds_completed', spec='{:.0f}')} |")
    return "\n".join(lines)


class SweepCallback(Callback):
    """Prepare MLflow before a multirun's jobs start and group them under one parent run."""

    def on_multirun_start(self, config, **kwargs) -> None:
        tracking = config.get("tracking", {})
        if tracking.get("kind") != "mlflow":
            return
        from mlflow.tracking import MlflowClient

        uri = resolve_uri(tracking.get("uri"))
        swept = swept_keys(config.hydra.overrides.task)
        groups = [k for k in swept if k in config.hydra.runtime.get("choices", {})]
        try:
            check_server(uri)
            exp_id = prepare_store(uri, tracking.get("experiment", "fedrun"), swept, groups)
        except ConnectionError:  # each job fails on it in one line, then Hydra ends the sweep (a callback cannot)
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=uri)
        parent = client.create_run(exp_id, run_name=f"sweep {sweep_dir.name}",
                                   tags={"fedrun.sweep": str(sweep_dir), "fedrun.kind": "sweep",
                                         "fedrun.swept": " ".join(swept)})
        (sweep_dir / PARENT_FILE).write_text(parent.info.run_id)
        (sweep_dir / SWEPT_FILE).write_text("".join(k + "\n" for k in swept))

    def on_job_end(self, config, job_return, **kwargs) -> None:
        """A failed job marks the sweep's parent run FAILED (Hydra then skips :meth:`on_multirun_end`)."""
        from hydra.core.utils import JobStatus

        parent_file = Path(config.hydra.sweep.dir) / PARENT_FILE
        if job_return.status == JobStatus.FAILED and parent_file.exists():
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=resolve_uri(config.tracking.get("uri")))
            client.set_terminated(parent_file.read_text().strip(), status="FAILED")

    def on_multirun_end(self, config, **kwargs) -> None:
        tracking = config.get("tracking", {})
        parent_file = Path(config.hydra.sweep.dir) / PARENT_FILE
        if tracking.get("kind") != "mlflow" or not parent_file.exists():
            return
        from mlflow.tracking import MlflowClient

        uri = resolve_uri(tracking.get("uri"))
        client = MlflowClient(tracking_uri=uri)
        parent_id = parent_file.read_text().strip()
        client.set_terminated(parent_id, status="FINISHED")
        try:
            exp_id = client.get_run(parent_id).info.experiment_id
            runs = client.search_runs([exp_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'",
                                      max_results=5000)
            client.set_tag(parent_id, "mlflow.note.content", sweep_note(runs, exp_id))
            print(f"fedrun: the sweep's {len(runs)} runs: {runs_table_url(ui_base(uri), exp_id)} (after `make ui`)")
        except Exception as exc:  # noqa: BLE001 - a summary note is not worth failing the sweep over
            print(f"fedrun: could not describe the sweep in MLflow: {exc}", file=sys.stderr)


# ------------------------------------------------------------------------------- python -m fedrun.tracking
def store_urls(uri: str | None = None, base: str | None = None) -> list[tuple[str, str, int]]:
    """(experiment name, runs-table URL, number of runs, counted up to 1000) for each experiment of a store that has
    runs. A SQLite store that does not exist is not created (empty list)."""
    from mlflow.tracking import MlflowClient

    uri = resolve_uri(uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        return []
    base = base or ui_base(uri)
    client = MlflowClient(tracking_uri=uri)
    out = []
    for exp in client.search_experiments():
        n = len(client.search_runs([exp.experiment_id], max_results=1000))  # 1000 = "1000 or more"
        if n:
            out.append((exp.name, runs_table_url(base, exp.experiment_id, view=VIEW_TAG in exp.tags), n))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedrun.tracking ui-url [--uri URI] [--port N]``: print where ``make ui`` shows the runs."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m fedrun.tracking")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ui = sub.add_parser("ui-url", help="print the URLs of the runs tables of the store's experiments")
    ui.add_argument("--uri", default=None,
                    help="tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    ui.add_argument("--host", default=DEFAULT_UI_HOST)
    ui.add_argument("--port", default=None, help="the UI's port (default: $PORT, else 5000)")
    args = ap.parse_args(argv)
    uri = resolve_uri(args.uri)
    base = ui_base(uri, args.host, args.port)
    try:
        found = store_urls(uri, base)
    except Exception as exc:  # noqa: BLE001 - the UI can still start
        print(f"fedrun: could not read {uri}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        found = []
    print(f"fedrun: MLflow UI of {uri} at {base} (Ctrl-C stops it)")
    if not found:
        print("fedrun: no runs in this store yet: `make run` (or `fedrun ...`) logs one here")
    for name, url, n in found:
        print(f"fedrun: runs table of experiment '{name}' ({n}{'+' if n >= 1000 else ''} runs): {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
