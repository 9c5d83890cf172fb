"""Metric names in MLflow: the key metrics keep fedrun's names, every other metric goes into a group.

MLflow's run page groups a run's charts by the part of a metric's name before "/"; the key metrics (no "/") are
its "Model metrics" group. The summary dict, metrics.csv and :func:`fedrun.export.mlflow_records` keep fedrun's
own names (:func:`internal_name` maps an MLflow name back).

Under DP (client-level or local) every metric is either covered by ε (:data:`COVERED_BY_EPSILON`: computed only
from what the DP mechanism released) or not (:data:`NOT_COVERED_BY_EPSILON`): a run with DP logs each metric that ε
does not cover under :data:`NOT_COVERED` (``nonprivate/train_loss``, ``nonprivate/dp/clipped_fraction``: the mark,
then the name it has without DP) and lists them in the run tag :data:`NOT_COVERED_TAG`; ``metric_name(name, dp=True)``
gives that name, :func:`internal_name` maps it back. Without DP nothing is marked.
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
    "client_gate_c_mean_norm": "client/sketch/gate_c_mean_norm", "client_gate_c_rms_norm": "client/sketch/gate_c_rms_norm",
    # as runs logged them before client-side metrics were prefixed (the committed exports)
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
                ("paper_", "comm/paper_"), ("clock_", "clock/"), ("secagg_", "secagg/"), ("client_", "client/"))
OTHER = "other/"  # a metric nobody placed yet (tests/unit/test_tracking.py fails on it)
_UNRENAMED = {v: k for k, v in RENAMED.items()}

# ------------------------------------------------------------------------------ what ε covers (runs with DP)
#: The mark of a metric that ε does not cover, in front of its MLflow name under DP (its own group in MLflow).
NOT_COVERED = "nonprivate/"
#: The run tag (DP runs) listing the run's metrics that ε does not cover, fedrun's names, comma-separated.
NOT_COVERED_TAG = "dp.not_covered_by_epsilon"
#: (a) Covered by ε: computed only from what the DP mechanism released (the noised aggregate, the model after the
#: server step; under local DP each client's noised upload), from the server's own data, from ε, or from config
#: constants. {reason: names}.
COVERED_BY_EPSILON: dict[str, tuple[str, ...]] = {
    # the released model evaluated on the server's data: the test split, and the validation split that is held out
    # of the training data before it is partitioned (no client holds it); early stopping and the best round follow
    "evaluation of the released model on the server's test/validation data": (
        "test_accuracy", "test_mse", "test_loss", "val_accuracy", "val_mse", "best_test_accuracy", "best_test_mse",
        "best_round", "stopped_round", "rounds_completed"),
    # ε and the accountant's inputs: σ, q, S, δ, the number of releases (client-level); local DP's configured budget
    # and clip, and the worst client's composed ε (the run's ε, as `epsilon`)
    "ε itself, or a constant of the DP mechanism": (
        "epsilon", "epsilon_rdp", "epsilon_pld", "epsilon_final", "epsilon_at_best", "dp_noise_std", "dp_delta",
        "dp_noise_multiplier", "dp_sampling_probability", "dp_clipping_norm", "dp_rounds", "ldp_epsilon_target",
        "ldp_delta", "ldp_clip_norm", "ldp_lr", "ldp_local_iters", "ldp_epsilon_max", "ldp_epsilon_rdp_max",
        "ldp_epsilon_pld_max"),
    # formulas of the config (paper 000's r·n·32·Round·C, at the covered best round), sizes of the model
    "a config constant or a formula of the config": (
        "cost_bits", "cost_bits_at_best", "sketch_epsilon", "paper_downlink_bits", "params_per_batch",
        "frozen_params", "feature_dim", "cut_layer", "server_epochs", "server_lr", "partition_clients"),
    # the server's own work on the released (noised) aggregate, measured on this machine: post-processing
    "the server's decoding of the released aggregate": (
        "cs_iterations", "cs_lam_rel", "cs_residual_ratio", "cs_error_norm", "cs_sparsity", "cs_decode_seconds",
        "clock_host_server_s"),
    # the auditor's own synthetic canaries scored against the released aggregates (no real client's data)
    "the privacy audit: its canaries against the released aggregates": (
        "audit_canaries", "audit_included", "audit_participations_mean", "audit_epsilon_lower", "audit_guesses",
        "audit_correct", "audit_confidence"),
    # the transfer source model, trained on a public source dataset
    "the source model, trained on public data": ("source_test_accuracy", "source_train_seconds", "source_cached"),
}
#: (b) Not covered by ε: computed from the clients' raw data or updates, from the noise actually drawn, or from who
#: took part (the realized cohort: client-level DP's subsampling amplification assumes it stays hidden, and local DP
#: protects an update's values, not its sender's participation). {reason: names}. Static per name: a metric that is
#: a constant under some settings (bytes with a deterministic sampler and no clock) is still marked.
NOT_COVERED_BY_EPSILON: dict[str, tuple[str, ...]] = {
    # the mean of the clients' own training losses on their private data
    "the clients' own training losses": ("train_loss",),
    # the number of clients selected / uploading: bytes are message size × that number (uplink: each upload;
    # downlink: the model to each selected client, the extractor to first-time clients; a broadcast is counted only
    # in rounds with someone selected); SecAgg's cost, its survivors and failures follow the cohort too
    "the realized cohort (who took part)": (
        "clients", "dp_clients", "uplink_bytes", "uplink_bytes_total", "downlink_bytes", "downlink_bytes_total",
        "uplink_bytes_final", "downlink_bytes_final", "uplink_bytes_at_best", "secagg_uplink_bytes",
        "secagg_downlink_bytes", "secagg_uplink_bytes_total", "secagg_downlink_bytes_total", "secagg_survivors",
        "secagg_min_survivors", "secagg_failed", "secagg_failed_rounds", "upload_batches_total",
        "downlink_broadcast_bytes_total", "uploading_clients", "ldp_clients_noised", "ldp_participations_max",
        "ldp_participations_min"),
    # norms and clipping of the un-noised updates, the field sum vs the real sum of the clients' rows (client-side codec
    # metrics, `client_…`, are never covered: see covered_by_epsilon)
    "the clients' raw (un-noised) updates": (
        "dp_mean_norm", "dp_clipped_fraction", "secagg_quantization_error", "secagg_quantization_bound",
        "secagg_clipped_values", "gate_c_mean_norm", "gate_c_rms_norm"),
    # the noise realization (its measured variance) and per-client scales, sensitivities and ε spread, which follow
    # the participants' n_l and the data-dependent sensitivity check (2/β_l, the worst client's id)
    "local DP's noise draws and per-client sensitivities (the clients' n_l, data)": (
        "ldp_noise_item_var", "ldp_noise_item_var_formula", "ldp_noise_std_mean", "ldp_sensitivity_median",
        "ldp_scale_median", "ldp_scale_max", "ldp_scale_min", "ldp_scale_formula_median", "ldp_epsilon_median",
        "ldp_epsilon_rdp_median", "ldp_epsilon_pld_median", "ldp_sensitivity_nonexpansive",
        "ldp_sensitivity_conditional", "ldp_two_over_beta_min", "ldp_two_over_beta_min_client"),
    # samples and classes per client
    "the clients' datasets (partition statistics)": (
        "partition_samples", "partition_samples_min", "partition_samples_median", "partition_samples_max",
        "partition_samples_mean", "partition_classes_min", "partition_classes_median", "partition_classes_max"),
    # wall time includes the cohort's local training; the simulated clock is the slowest completing client's
    # download/compute/upload (its device draw and sample count), its dropouts and discarded late reports; the
    # server's modelled work includes SecAgg's unmasking, which follows the survivors
    "time that depends on which clients were sampled": (
        "round_seconds", "sim_time_s", "sim_time_s_final", "time_to_accuracy_s", "time_to_epsilon_s",
        "clock_round_s", "clock_download_s", "clock_compute_s", "clock_upload_s", "clock_dropped", "clock_discarded",
        "clock_server_s", "clock_server_flops"),
    # FbFTL (no DP mode): what the clients uploaded once (features, labels), their sample counts
    "the clients' uploaded features and labels (FbFTL)": (
        "uploaded_samples", "uplink_bytes_per_batch", "paper_uplink_bits", "tune_best_val_accuracy",
        "label_leakage_bits", "label_leakage_expected_bits", "label_prior_bits"),
}
_COVERED = {n: why for why, names in COVERED_BY_EPSILON.items() for n in names}
_NOT_COVERED = {n: why for why, names in NOT_COVERED_BY_EPSILON.items() for n in names}


def covered_by_epsilon(name: str) -> bool | None:
    """Is fedrun's metric ``name`` covered by ε (True), not (False), or not classified yet (None: treated as not
    covered under DP; tests/unit/test_metric_privacy.py fails on it)."""
    if name.startswith("client_"):  # a client-side codec's own metric: computed from what a client holds
        return False
    return True if name in _COVERED else False if name in _NOT_COVERED else None


def privacy_reason(name: str) -> str:
    """Why ``name`` is (not) covered by ε: its group in :data:`COVERED_BY_EPSILON` / :data:`NOT_COVERED_BY_EPSILON`."""
    return _COVERED.get(name) or _NOT_COVERED.get(name) or "not classified (treated as not covered)"


def metric_name(name: str, dp: bool = False) -> str:
    """fedrun's metric name (summary key, metrics.csv column) → its MLflow name; with ``dp`` (a run with DP), a metric
    ε does not cover gets the mark :data:`NOT_COVERED` in front."""
    if dp and not covered_by_epsilon(name):
        return NOT_COVERED + _grouped(name)
    return _grouped(name)


def _grouped(name: str) -> str:
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
    if name.startswith(NOT_COVERED):
        return internal_name(name[len(NOT_COVERED):])
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
    """A diagnostic: a metric in a group other than the run summary's (``dp/…``, ``decoder/…``, ``sampling/…``),
    marked or not (``nonprivate/train_loss`` is a key metric, ``nonprivate/dp/clipped_fraction`` a diagnostic)."""
    mlflow_name = mlflow_name.removeprefix(NOT_COVERED)
    return "/" in mlflow_name and not mlflow_name.startswith(SUMMARY)

