"""Validation of the resolved config: every bad value gets one clear line naming it and what is allowed.

Checks are plain functions over a dict (no Hydra needed), so tests and other entry points reuse them.
"""

from __future__ import annotations

import math
from typing import Any, Mapping


class ConfigError(ValueError):
    """A user error in the configuration (reported as one line, no traceback)."""


DP_MODES = {False: "off", True: "client", "false": "off", "true": "client", "client": "client",
            "off": "off", "none": "off", "local_laplace": "local_laplace", "local_gaussian": "local_gaussian"}
PARTITIONS = ("iid", "shards", "dirichlet", "writers", "state")
DEVICES = ("cpu", "cuda", "auto")
PROGRESS = ("auto", "bar", "log", "off")
LOCAL_MODES = ("sgd", "gd")
ACCOUNTANTS = ("rdp", "pld")


def _num(cfg: Mapping[str, Any], key: str) -> float:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{key}={v!r} must be a number")
    return float(v)


def _int(cfg: Mapping[str, Any], key: str, minimum: int) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"{key}={v!r} must be an integer >= {minimum}")
    return int(v)


def dp_mode(value: Any) -> str:
    key = value.lower() if isinstance(value, str) else value
    if key not in DP_MODES:
        raise ConfigError(f"dp={value!r} is not allowed; use false, true (client-level), local_laplace or "
                          f"local_gaussian")
    return DP_MODES[key]


def resolve_rounds(cfg: dict[str, Any]) -> None:
    """``total_iterations`` T (paper 001: T = E·T_g) → ``rounds`` = T / local_steps, in place.

    rounds=null derives the rounds from T (T must be a multiple of local_steps); a given rounds must agree
    with T (rounds · local_steps = T); total_iterations=null leaves rounds as given (fixed T_g).
    """
    total, rounds = cfg.get("total_iterations"), cfg.get("rounds")
    if total is None:
        if rounds is None:
            raise ConfigError("rounds=null needs total_iterations=T (then rounds = T / local_steps)")
        return
    t = _int(cfg, "total_iterations", 1)
    e = _int(cfg, "local_steps", 1)
    if rounds is None:
        if t % e:
            divisors = [d for d in range(1, t + 1) if t % d == 0]
            shown = ", ".join(map(str, divisors[:12])) + (", …" if len(divisors) > 12 else "")
            raise ConfigError(f"total_iterations={t} is not a multiple of local_steps={e} (T = E·T_g needs a whole "
                              f"number of rounds); allowed local_steps: {shown}")
        cfg["rounds"] = t // e
        return
    r = _int(cfg, "rounds", 1)
    if r * e != t:
        raise ConfigError(f"rounds={r} × local_steps={e} = {r * e} disagrees with total_iterations={t}; set "
                          f"rounds=null (derived: T / E) or total_iterations=null (fixed rounds)")


def validate(cfg: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for the first bad value found."""
    _int(cfg, "rounds", 1)
    _int(cfg, "seed", 0)
    r = _num(cfg, "r")
    if not 0 < r <= 1:
        raise ConfigError(f"r={cfg['r']} is outside (0, 1]: r is the compression ratio m/n")
    lr = _num(cfg, "lr")
    if not lr > 0 or math.isinf(lr):
        raise ConfigError(f"lr={cfg['lr']} must be > 0")
    _int(cfg, "local_steps", 1)
    _int(cfg, "batch_size", 1)
    _int(cfg, "eval_every", 1)
    _int(cfg, "patience", 0)
    _int(cfg, "chunk_size", 1)
    if cfg.get("checkpoint_every") is not None:
        _int(cfg, "checkpoint_every", 0)
    if cfg.get("local_mode") not in LOCAL_MODES:
        raise ConfigError(f"local_mode={cfg.get('local_mode')!r} is not allowed; use {' or '.join(LOCAL_MODES)}")
    if cfg.get("local_clip") is not None and not _num(cfg, "local_clip") > 0:
        raise ConfigError(f"local_clip={cfg['local_clip']} must be > 0 (or null)")
    if cfg.get("local_clip_mode", "batch") not in ("batch", "per_sample"):
        raise ConfigError(f"local_clip_mode={cfg.get('local_clip_mode')!r} is not allowed; use per_sample or batch")
    q = _num(cfg, "sample_rate")
    if not 0 < q <= 1:
        raise ConfigError(f"sample_rate={cfg['sample_rate']} is outside (0, 1]: it is the probability C that a "
                          f"client takes part in a round")
    _int(cfg, "clients_per_round", 1)
    if cfg.get("num_clients") is not None:
        _int(cfg, "num_clients", 1)
    vf = _num(cfg, "validation_fraction")
    if not 0 < vf < 1:
        raise ConfigError(f"validation_fraction={cfg['validation_fraction']} is outside (0, 1)")
    device = str(cfg.get("device"))
    if device.split(":")[0] not in DEVICES:
        raise ConfigError(f"device={device!r} is not allowed; use cpu, cuda, cuda:N or auto")
    if cfg.get("progress") not in PROGRESS:
        raise ConfigError(f"progress={cfg.get('progress')!r} is not allowed; use {', '.join(PROGRESS)}")
    mode = dp_mode(cfg.get("dp"))
    delta = _num(cfg, "delta")
    if not 0 < delta < 1:
        raise ConfigError(f"delta={cfg['delta']} is outside (0, 1)")
    if cfg.get("epsilon") is not None:
        eps = _num(cfg, "epsilon")
        if not eps > 0:
            raise ConfigError(f"epsilon={cfg['epsilon']} must be > 0 (epsilon=inf for no noise)")
    if cfg.get("noise_multiplier") is not None and not _num(cfg, "noise_multiplier") >= 0:
        raise ConfigError(f"noise_multiplier={cfg['noise_multiplier']} must be >= 0")
    if not _num(cfg, "clipping_norm") > 0:
        raise ConfigError(f"clipping_norm={cfg['clipping_norm']} must be > 0")
    if cfg.get("accountant") not in ACCOUNTANTS:
        raise ConfigError(f"accountant={cfg.get('accountant')!r} is not allowed; use rdp or pld")
    if mode == "client" and cfg.get("epsilon") is None and cfg.get("noise_multiplier") is None:
        raise ConfigError("dp=true needs a budget: give epsilon=... (σ is calibrated) or noise_multiplier=...")
    part = cfg.get("partition", {}).get("name")
    if part not in PARTITIONS + ("auto",):
        raise ConfigError(f"partition={part!r} is unknown; allowed: {', '.join(PARTITIONS)}")


def check_partition(dataset: Mapping[str, Any], partition: str) -> None:
    """Natural splits exist only for their dataset: writers → femnist, state → lending_club."""
    natural = {"writers": "femnist", "state": "lending_club"}
    name = dataset["name"]
    if partition in natural and natural[partition] != name:
        allowed = ["iid", "shards", "dirichlet"] + ([dataset["natural_partition"]] if dataset.get("natural_partition") else [])
        if name == "lending_club":
            allowed = ["iid", "state"]
        raise ConfigError(f"partition={partition} is not available for dataset={name}; allowed: {', '.join(allowed)}")
    if name == "lending_club" and partition in ("shards", "dirichlet"):
        raise ConfigError(f"partition={partition} needs class labels; dataset=lending_club is a regression task; "
                          f"allowed: iid, state")
