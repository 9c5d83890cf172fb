"""Metric names in MLflow: the key metrics keep fedrun's names, every other metric goes into a group.

MLflow's run page groups a run's charts by the part of a metric's name before "/"; the key metrics (no "/") are
its "Model metrics" group. The summary dict, metrics.csv and :func:`fedrun.export.mlflow_records` keep fedrun's
own names (:func:`internal_name` maps an MLflow name back).
"""

from __future__ import annotations

#: Per-round metrics a researcher comes for: logged under their own names (MLflow's "Model metrics" section and
#: plain column names in the runs table); every other metric goes under a prefix, into a group of its own.
KEY_METRICS = ("test_accuracy", "test_mse", "test_loss", "train_loss", "val_accuracy", "val_mse", "epsilon",
               "audit_epsilon_lower",
               "uplink_bytes_total", "uplink_bytes", "downlink_bytes_total", "downlink_bytes", "cost_bits",
               "round_seconds", "sim_time_s", "secagg_uplink_bytes_total", "secagg_downlink_bytes_total")
#: The run summary's own numbers (one value at the last round): ``summary/…``.
SUMMARY = "summary/"
SUMMARY_METRICS = ("best_test_accuracy", "best_test_mse", "best_round", "cost_bits_at_best", "uplink_bytes_at_best",
                   "rounds_completed", "uplink_bytes_final", "downlink_bytes_final", "epsilon_final",
                   "epsilon_at_best", "stopped_round", "sim_time_s_final", "time_to_accuracy_s", "time_to_epsilon_s",
                   "secagg_failed_rounds")
#: Diagnostics with a name of their own (the rest follow :data:`PREFIX_RULES`).
RENAMED = {
    "clients": "sampling/clients",
    "epsilon_rdp": "dp/epsilon_rdp", "epsilon_pld": "dp/epsilon_pld",
    "sketch_epsilon": "sketch/epsilon",
    "gate_c_mean_norm": "sketch/gate_c_mean_norm", "gate_c_rms_norm": "sketch/gate_c_rms_norm",
    "tune_best_val_accuracy": "server/tune_best_val_accuracy",
    "upload_batches_total": "comm/upload_batches_total", "params_per_batch": "comm/params_per_batch",
    "uplink_bytes_per_batch": "comm/uplink_bytes_per_batch",
    "downlink_broadcast_bytes_total": "comm/downlink_broadcast_bytes_total",
    "uploading_clients": "comm/uploading_clients", "uploaded_samples": "comm/uploaded_samples",
    "frozen_params": "transfer/frozen_params", "feature_dim": "transfer/feature_dim", "cut_layer": "transfer/cut_layer",
}
#: fedrun name prefix → MLflow group (client-level DP, local DP, the FL-CS decoder, …).
PREFIX_RULES = (("audit_", "audit/"), ("partition_", "partition/"), ("ldp_", "local_dp/"), ("dp_", "dp/"), ("cs_", "decoder/"),
                ("server_", "server/"), ("source_", "transfer/source_"), ("label_", "leakage/label_"),
                ("paper_", "comm/paper_"), ("clock_", "clock/"), ("secagg_", "secagg/"))
OTHER = "other/"  # a metric nobody placed yet (tests/unit/test_tracking.py fails on it)
_UNRENAMED = {v: k for k, v in RENAMED.items()}


def metric_name(name: str) -> str:
    """fedrun's metric name (summary key, metrics.csv column) → its MLflow name."""
    if name in KEY_METRICS or "/" in name:
        return name
    if name in SUMMARY_METRICS:
        return SUMMARY + name
    if name in RENAMED:
        return RENAMED[name]
    for prefix, group in PREFIX_RULES:
        if name.startswith(prefix):
            return group + name[len(prefix):]
    return OTHER + name


def internal_name(name: str) -> str:
    """MLflow metric name → fedrun's name (the inverse of :func:`metric_name`; other names pass unchanged)."""
    if name in _UNRENAMED:
        return _UNRENAMED[name]
    if name.startswith(SUMMARY):
        return name[len(SUMMARY):]
    if name.startswith(OTHER):
        return name[len(OTHER):]
    for prefix, group in sorted(PREFIX_RULES, key=lambda rule: -len(rule[1])):
        if name.startswith(group):
            return prefix + name[len(group):]
    return name


def is_diagnostic(mlflow_name: str) -> bool:
    """A diagnostic: a metric in a group other than the run summary's (``dp/…``, ``decoder/…``, ``sampling/…``)."""
    return "/" in mlflow_name and not mlflow_name.startswith(SUMMARY)
