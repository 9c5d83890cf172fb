"""Tables are code: records (one dict per run) → a markdown table, plus reading records from MLflow.

The pure part (:func:`markdown_table`, :func:`fmt`) knows nothing about MLflow; :func:`mlflow_records`
turns finished MLflow runs into flat records (``params.*``, ``metrics.*``, ``tags.*``) for it. Metrics keep
fedrun's own names there (``metrics.dp_clipped_fraction``, ``metrics.best_test_accuracy``: the summary's
keys), not their grouped MLflow names (``dp/clipped_fraction``, ``summary/best_test_accuracy``).
"""

from __future__ import annotations

import math
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence


@dataclass(frozen=True)
class Column:
    """One table column: header text, the record key (or a function of the record), and a format."""

    header: str
    key: str | Callable[[dict[str, Any]], Any]
    fmt: str = "{}"

    def cell(self, record: dict[str, Any]) -> str:
        value = self.key(record) if callable(self.key) else record.get(self.key)
        return fmt(value, self.fmt)


def save(text: str, path: str | Path) -> Path:
    """Write a generated table to ``path``, creating its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def fmt(value: Any, spec: str = "{}") -> str:
    """Format a cell; missing/NaN values print as an en dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def markdown_table(records: Iterable[dict[str, Any]], columns: Sequence[Column],
                   sort_by: Callable[[dict[str, Any]], Any] | None = None) -> str:
    """A GitHub-flavoured markdown table with one row per record."""
    rows = list(records)
    if sort_by is not None:
        rows.sort(key=sort_by)
    head = "| " + " | ".join(c.header for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(c.cell(r) for c in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body]) + "\n"


def with_command(title: str, command: str, table: str, notes: str = "") -> str:
    """A results section: heading, the exact command that produced it, the table, notes."""
    parts = [f"## {title}\n", "Command:\n", f"```\n{command}\n```\n", table]
    if notes:
        parts.append("\n" + notes.strip() + "\n")
    return "\n".join(parts)


def mlflow_records(tracking_uri: str, experiment: str, filter_string: str = "",
                   include_sweep_parents: bool = False) -> list[dict[str, Any]]:
    """Finished runs of an MLflow experiment as flat records (params.*, metrics.*, tags.*, run_id); metric names
    as fedrun names them (:func:`fedrun.tracking.internal_name`)."""
    from mlflow.tracking import MlflowClient

    from fedrun.tracking import internal_name

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"experiment {experiment!r} not found at {tracking_uri}")
    records = []
    for run in client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=50_000):
        if not include_sweep_parents and run.data.tags.get("fedrun.kind") == "sweep":
            continue
        rec: dict[str, Any] = {"run_id": run.info.run_id, "status": run.info.status,
                               "start_time": run.info.start_time}
        rec.update({f"params.{k}": v for k, v in run.data.params.items()})
        rec.update({f"metrics.{internal_name(k)}": v for k, v in run.data.metrics.items()})
        rec.update({f"tags.{k}": v for k, v in run.data.tags.items()})
        records.append(rec)
    return records
