"""Validation of the resolved config: every bad value gets one clear line naming it and what is allowed.

Checks are plain functions over a dict (no Hydra needed), so tests and other entry points reuse them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


class ConfigError(ValueError):
    """A user error in the configuration (reported as one line, no traceback)."""


DP_MODES = {False: "off", True: "client", "false": "off", "true": "client", "client": "client",
            "off": "off", "none": "off", "local_laplace": "local_laplace", "local_gaussian": "local_gaussian",
            "auto": "auto"}
#: the value written back into the config for each resolved mode (what a user would type)
DP_VALUES = {"off": False, "client": True, "local_laplace": "local_laplace", "local_gaussian": "local_gaussian"}
DEFAULT_EPSILON = 1.0  # paper 000's budget: the ε used when DP is on and neither epsilon nor noise_multiplier is given
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
        raise ConfigError(f"dp={value!r} is not allowed; use auto, false, true (client-level), local_laplace or "
                          f"local_gaussian")
    return DP_MODES[key]


#: knobs that must be numbers (or null), checked before anything reads them
NUMBERS = ("r", "lr", "delta", "epsilon", "noise_multiplier", "clipping_norm", "sample_rate", "validation_fraction",
           "local_clip", "server_momentum")
INTEGERS = {"seed": 0, "rounds": 1, "total_iterations": 1, "local_steps": 1, "batch_size": 1, "eval_every": 1,
            "patience": 0, "chunk_size": 1, "clients_per_round": 1, "num_clients": 1}


def validate_types(cfg: Mapping[str, Any]) -> None:
    """Each top-level number is a number (or null) before any default is derived from it: one line otherwise."""
    for key in NUMBERS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ConfigError(f"{key}={v!r} must be a number")
    for key, low in INTEGERS.items():
        if cfg.get(key) is not None:
            _int(cfg, key, low)


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


def _check_r(cfg: Mapping[str, Any]) -> None:
    r = _num(cfg, "r")
    if not 0 < r <= 1:
        raise ConfigError(f"r={cfg['r']} is outside (0, 1]: r is the compression ratio m/n")


def validate(cfg: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for the first bad value found."""
    _int(cfg, "rounds", 1)
    _int(cfg, "seed", 0)
    _check_r(cfg)
    lr = _num(cfg, "lr")
    if not lr > 0 or math.isinf(lr):
        raise ConfigError(f"lr={cfg['lr']} must be > 0")
    _int(cfg, "local_steps", 1)
    _int(cfg, "batch_size", 1)
    _int(cfg, "eval_every", 1)
    _int(cfg, "patience", 0)
    _int(cfg, "chunk_size", 1)
    every = cfg.get("checkpoint_every")
    if every is not None and every != "auto" and (isinstance(every, bool) or not isinstance(every, int) or every < 0):
        raise ConfigError(f"checkpoint_every={every!r} is not allowed; use auto (save when it costs <= 5 % of the "
                          f"run's time) or an integer >= 0 (every k rounds; 0 = never)")
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
    if not isinstance(diag := cfg.get("tracking", {}).get("diagnostics", False), bool):
        raise ConfigError(f"tracking.diagnostics={diag!r} is not allowed; use true or false")
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
    if cfg.get("clipping_norm") is not None and not _num(cfg, "clipping_norm") > 0:
        raise ConfigError(f"clipping_norm={cfg['clipping_norm']} must be > 0")
    if cfg.get("local_clip_ord") not in (1, 2):
        raise ConfigError(f"local_clip_ord={cfg.get('local_clip_ord')!r} is not allowed; use 1 or 2")
    if cfg.get("accountant") not in ACCOUNTANTS:
        raise ConfigError(f"accountant={cfg.get('accountant')!r} is not allowed; use rdp or pld")
    if mode == "client" and cfg.get("epsilon") is None and cfg.get("noise_multiplier") is None:
        raise ConfigError("dp=true needs a budget: give epsilon=... (σ is calibrated) or noise_multiplier=...")
    if mode == "client" and cfg.get("clipping_norm") is None:
        raise ConfigError("dp=true needs clipping_norm=S (the L2 clip of each client's transmitted vector)")
    if mode == "client":
        check_dp_sampler(cfg)
    check_noise(cfg, mode)
    part = cfg.get("partition", {}).get("name")
    if part not in PARTITIONS + ("auto",):
        raise ConfigError(f"partition={part!r} is unknown; allowed: {', '.join(PARTITIONS)}")
    audit = cfg.get("audit") or {}
    canaries = audit.get("canaries", 0)
    if isinstance(canaries, bool) or not isinstance(canaries, int) or canaries < 0:
        raise ConfigError(f"audit.canaries={canaries!r} must be an integer >= 0 (0 = no audit)")
    if canaries and mode != "client":
        raise ConfigError(f"audit.canaries={canaries} audits client-level DP; dp={cfg.get('dp')} has none; allowed: "
                          f"dp=true, or audit.canaries=0")
    if canaries == 1:
        raise ConfigError("audit.canaries=1: an audit needs at least 2 canaries (some included, some not)")
    conf = audit.get("confidence", 0.95)
    if not isinstance(conf, (int, float)) or not 0 < conf < 1:
        raise ConfigError(f"audit.confidence={conf!r} is outside (0, 1)")
    if audit.get("negative_control"):
        raise ConfigError("audit.negative_control=true is not a run option: the audit's negative control (no noise, "
                          "ε still claimed) is a test double of the privatizer, tests/integration/test_audit.py")
    copies = cfg.get("partition", {}).get("copies", 1)
    if mode not in ("off", "auto") and copies not in (None, 1):
        raise ConfigError(f"partition.copies={copies} with dp={cfg.get('dp')}: one person's data would be in "
                          f"{copies} clients, so the per-client ε would understate the per-person ε; allowed "
                          f"with DP: partition.copies=1")


def _sampler_class(cfg: Mapping[str, Any]) -> type | None:
    """The sampler's class from its ``_target_`` (None when it cannot be imported: instantiation reports that)."""
    import importlib

    module, _, name = str((cfg.get("sampler") or {}).get("_target_", "")).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def samplers_with_law() -> list[str]:
    """The sampler options (conf/sampler/*.yaml) whose class declares a participation law."""
    import importlib

    import yaml

    names = []
    for path in sorted((Path(__file__).resolve().parent.parent / "conf" / "sampler").glob("*.yaml")):
        module, _, cls = str((yaml.safe_load(path.read_text()) or {}).get("_target_", "")).rpartition(".")
        try:
            if getattr(getattr(importlib.import_module(module), cls), "law", None) is not None:
                names.append(path.stem)
        except (ImportError, AttributeError, ValueError):
            continue
    return names


def check_dp_sampler(cfg: Mapping[str, Any]) -> None:
    """Client-level DP needs an accountant for how the cohort is drawn (the sampler class's participation ``law``), and
    the configured accountant must be one that can do it (``SAMPLING_ACCOUNTANTS``); the audit's canaries take
    part like Poisson-sampled clients. Refused in one line, before any data is loaded."""
    cls = _sampler_class(cfg)
    if cls is None:
        return
    from fedrun.privacy.accounting import SAMPLING_ACCOUNTANTS, UNSUPPORTED_PAIRS

    name, law = getattr(cls, "name", cls.__name__), getattr(cls, "law", None)
    sampling = getattr(law, "kind", None)
    if sampling not in SAMPLING_ACCOUNTANTS:
        raise ConfigError(f"dp=true needs a sampler that declares a participation law (the cohorts an accountant "
                          f"knows): sampler={'|'.join(samplers_with_law())}; got sampler={name}")
    accountant, allowed = cfg.get("accountant"), SAMPLING_ACCOUNTANTS[sampling]
    if accountant not in allowed:
        raise ConfigError(f"accountant={accountant} is not available with sampler={name} ({sampling} cohorts): "
                          f"{UNSUPPORTED_PAIRS[sampling, accountant]}; allowed: accountant={'|'.join(allowed)}")
    canaries = (cfg.get("audit") or {}).get("canaries", 0)
    if canaries and sampling not in ("poisson", "schema"):
        raise ConfigError(f"audit.canaries={canaries} needs sampler=poisson or cyclic (each canary takes part like a "
                          f"client of those cohorts); got sampler={name}; allowed: sampler=poisson|cyclic or "
                          f"audit.canaries=0")


def check_noise(cfg: Mapping[str, Any], mode: str) -> None:
    """``noise=``: a known mechanism with its own knob (banded: ``bands``, blt: ``buffers``); correlated noise only
    with client-level DP and a sampler that enforces a participation schema (``sampler=cyclic``): its ε assumes no
    amplification by sampling, and a Poisson cohort's one would be that of another mechanism."""
    from fedrun.privacy.factorization import STRATEGIES

    noise = cfg.get("noise") or {"name": "independent"}
    name = noise.get("name")
    if name not in STRATEGIES:
        raise ConfigError(f"noise={name!r} is not allowed; use {'|'.join(STRATEGIES)}")
    knob = {"banded": ("bands", 1, None), "blt": ("buffers", 1, 8)}.get(name)
    if knob is not None:
        key, low, high = knob
        v = noise.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low or (high is not None and v > high):
            raise ConfigError(f"noise.{key}={v!r} is not allowed; use an integer in [{low}, {high or 'rounds'}]")
    extra = set(noise) - {"name"} - ({knob[0]} if knob else set())
    if extra:
        raise ConfigError(f"noise={name} takes no {', '.join(sorted(extra))}")
    if name == "independent":
        return
    if mode != "client":
        raise ConfigError(f"noise={name} is client-level DP noise; dp={cfg.get('dp')} has none; allowed: dp=true, or "
                          f"noise=independent")
    cls = _sampler_class(cfg)
    if cls is not None and getattr(getattr(cls, "law", None), "kind", None) != "schema":
        raise ConfigError(f"noise={name} needs sampler=cyclic (a participation schema: correlated noise assumes no "
                          f"amplification by sampling); got sampler={getattr(cls, 'name', cls.__name__)}")


def check_partition(dataset: "DatasetConfig", partition: str) -> None:
    """Natural splits exist only for their dataset: writers → femnist, state → lending_club."""
    natural = {"writers": "femnist", "state": "lending_club"}
    name = dataset.name
    if partition in natural and natural[partition] != name:
        allowed = ["iid", "shards", "dirichlet"] + ([dataset.natural_partition] if dataset.natural_partition else [])
        if name == "lending_club":
            allowed = ["iid", "state"]
        raise ConfigError(f"partition={partition} is not available for dataset={name}; allowed: {', '.join(allowed)}")
    if name == "lending_club" and partition in ("shards", "dirichlet"):
        raise ConfigError(f"partition={partition} needs class labels; dataset=lending_club is a regression task; "
                          f"allowed: iid, state")


# ------------------------------------------------------------------------------------------ defaults
def tuned_clipping_norm(table: Mapping[str, Any] | None, scheme: str, r: float) -> float | None:
    """S from a model's table (conf/model/*.yaml ``clipping_norm``): ``{scheme: S}`` for any r, or
    ``{scheme: {"r": S}}`` per compression ratio. None where the table has no entry for (scheme, r)."""
    entry = (table or {}).get(scheme)
    if entry is None or isinstance(entry, (int, float)):
        return None if entry is None else float(entry)
    for key, value in entry.items():
        if math.isclose(float(key), float(r), rel_tol=1e-9):
            return float(value)
    return None


def _scheme_name(c: Mapping[str, Any]) -> str:
    return str(c["scheme"].get("name") or str(c["scheme"].get("_target_", "?")).rsplit(".", 1)[-1])


def _model_name(c: Mapping[str, Any]) -> str:
    return str(c["model"]["name"])


def check_pair(c: Mapping[str, Any], scheme_cls: type) -> None:
    """Refuse a dataset × scheme pair that does not make sense, in one line naming the pair."""
    ds, scheme = c["dataset"]["name"], _scheme_name(c)
    task = c["dataset"].get("task", "classification")
    if getattr(scheme_cls, "needs_image_source", False) and task == "regression":
        raise ConfigError(f"scheme={scheme} does not apply to dataset={ds}: it transfers layers of a model "
                          f"pre-trained on an image dataset, and dataset={ds} is a {task} on tabular features")
    if getattr(scheme_cls, "compresses", False) and task == "regression":
        raise ConfigError(f"scheme={scheme} does not apply to dataset={ds}: its model ({_model_name(c)}, one "
                          f"weight per feature) is too small to compress; use scheme=fl_std or ldp_fedavg")


def resolve_defaults(c: dict[str, Any], scheme_cls: type, model_table: Mapping[str, Any] | None = None) -> list[str]:
    """Fill, in place, the values that follow from the dataset, model and scheme; return notes for the user.

    Runs before any data is loaded. ``scheme_cls`` declares ``dp_modes`` (a subset of off/client/local),
    ``compresses`` and ``needs_image_source``; ``model_table`` is the chosen model's config (its tuned
    ``clipping_norm`` table and ``local_clip``). ``dp=auto`` becomes client-level DP where the scheme takes it,
    the sampler is Poisson and the model has a tuned S for (scheme, r), else off (with a note saying why). An
    explicit DP mode the scheme does not take is refused in one line naming the scheme and its modes.
    """
    check_pair(c, scheme_cls)
    notes: list[str] = []
    resolve_server_opts(c, scheme_cls)
    if not getattr(scheme_cls, "compresses", False) and "r" in c:
        _check_r(c)  # a bad r is refused even where the scheme ignores r
        c["r"] = 1.0  # r only means something to a compressing scheme; one value keeps sweeps from repeating runs
    scheme, model = _scheme_name(c), _model_name(c)
    model_table = model_table if model_table is not None else c.get("model", {})
    modes = tuple(getattr(scheme_cls, "dp_modes", ("off", "client", "local")))
    mode = dp_mode(c.get("dp"))
    r = float(c.get("r") or 1.0)
    tuned = tuned_clipping_norm(model_table.get("clipping_norm"), scheme, r)
    poisson = str(c.get("sampler", {}).get("_target_", "")).rsplit(".", 1)[-1] == "PoissonSampler"
    if mode == "auto":
        if "client" not in modes:
            reason = f"scheme={scheme} takes {_modes_text(modes)}"
        elif not poisson:
            reason = ("dp=auto turns client-level DP on with sampler=poisson only (give dp=true for sampler=uniform "
                      "or poisson_capped)")
        elif c.get("clipping_norm") is None and tuned is None:
            reason = (f"model={model} has no clipping norm S tuned for scheme={scheme} at r={r:g} "
                      f"(conf/model/{model}.yaml); give clipping_norm=S dp=true for client-level DP")
        else:
            reason = None
        mode = "off" if reason else "client"
        if reason:
            notes.append(f"dp=auto: no DP — {reason}")
    elif mode != "off" and mode.split("_")[0] not in modes:
        raise ConfigError(f"dp={_typed(c.get('dp'))} is not available with scheme={scheme}: it takes "
                          f"{_modes_text(modes)}")
    c["dp"] = DP_VALUES[mode]
    if mode != "off" and c.get("epsilon") is None and c.get("noise_multiplier") is None:
        c["epsilon"] = DEFAULT_EPSILON
    if mode == "client":
        if c.get("clipping_norm") is None and tuned is not None:
            c["clipping_norm"] = tuned
            notes.append(f"clipping_norm={tuned:g}: S tuned for model={model}, scheme={scheme}, r={r:g} "
                         f"(conf/model/{model}.yaml)")
        elif c.get("clipping_norm") is None:
            raise ConfigError(f"dp=true needs clipping_norm=S: model={model} has no S tuned for scheme={scheme} at "
                              f"r={r:g} (conf/model/{model}.yaml)")
        budget = (f"ε={c['epsilon']:g}" if c.get("epsilon") is not None
                  else f"noise_multiplier={c['noise_multiplier']:g}")
        notes.append(f"dp: client-level ({budget}, δ={c['delta']:g}, S={c['clipping_norm']:g})")
    if mode.startswith("local"):
        if c.get("local_clip") is None:
            zeta = model_table.get("local_clip")
            if zeta is None:
                raise ConfigError(f"dp={_typed(c['dp'])} needs local_clip=ζ (the per-sample gradient clip): model={model} "
                                  f"has no tuned ζ (conf/model/{model}.yaml)")
            c["local_clip"] = float(zeta)
            notes.append(f"local_clip={float(zeta):g}: ζ tuned for model={model} (conf/model/{model}.yaml)")
    if c.get("local_clip_ord") is None:
        c["local_clip_ord"] = 1 if mode == "local_laplace" else 2
    resolve_deployment(c, scheme_cls)
    return notes


SECAGG = ("none", "secagg", "secagg_plus")


def check_secagg_codec(secagg: str, scheme: str, codec: Any) -> None:
    """SecAgg sums the uploads in a finite field: the codec must be linear and ask for no second exchange (its exact
    values would be summed outside the field). ``codec`` is the scheme's instance where one can be made (a scheme
    may set these facts in its constructor: HEAPRIX-exact sets ``queries``), else its class."""
    linear, queries = getattr(codec, "linear", True), getattr(codec, "queries", False)
    if linear and not queries:
        return
    why = ("its encoding is not linear" if not linear else "it asks for a second exchange, whose exact values "
           "would be summed outside the field")
    hint = " (or scheme.heavy_values=sketch)" if getattr(codec, "heavy_values", None) == "exact" else ""
    raise ConfigError(f"secagg={secagg} sums uploads in a finite field, so the encoding must be linear with no "
                      f"second exchange; scheme={scheme}: {why}; use secagg=none{hint}")


def _scheme_instance(c: Mapping[str, Any]) -> Any:
    """The scheme node instantiated (a constructor only: cheap, no data), or None when it cannot be (the run's own
    instantiation reports why)."""
    from hydra.utils import instantiate

    try:
        return instantiate({k: v for k, v in c.get("scheme", {}).items() if k != "name"})
    except Exception:  # noqa: BLE001 - hydra wraps the constructor's errors in its own types
        return None
OVER_SELECTING_SAMPLERS = ("PoissonSampler", "UniformSampler", "CappedPoissonSampler")


def resolve_deployment(c: dict[str, Any], scheme_cls: type) -> None:
    """``network=`` and ``secagg=`` (:mod:`fedrun.deployment`), checked in one line each, in place: SecAgg's range
    defaults to S under client-level DP. Runs after the DP mode is resolved."""
    from fedrun.schemes.transfer import FbFTL

    scheme = _scheme_name(c)
    sec = c.setdefault("secagg", {"name": "none"})
    net = c.setdefault("network", {"name": "none"})
    if sec.get("name") not in SECAGG:
        raise ConfigError(f"secagg={sec.get('name')!r} is not allowed; use {', '.join(SECAGG)}")
    own = issubclass(scheme_cls, FbFTL)
    for group, value in (("network", net.get("name")), ("secagg", sec.get("name"))):
        if own and value != "none":
            raise ConfigError(f"{group}={value} is not available with scheme={scheme}: FbFTL's protocol (features "
                              f"uploaded once, then server training) is not the federated round; use {group}=none")
    if sec.get("name") != "none":
        name = sec["name"]
        codec = _scheme_instance(c)
        check_secagg_codec(name, scheme, scheme_cls if codec is None else codec)
        bits = sec.get("bits")
        if isinstance(bits, bool) or not isinstance(bits, int) or not 8 <= bits <= 62:
            raise ConfigError(f"secagg.bits={bits!r} is not allowed; use an integer in [8, 62]")
        clip = sec.get("clip")
        if clip is None and dp_mode(c.get("dp")) == "client":
            sec["clip"] = float(c["clipping_norm"])
        elif isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0:
            raise ConfigError(f"secagg.clip={clip!r}: the field's quantisation range [-clip, clip] must be a number "
                              f"> 0 (null means S, with dp=true only)")
        from fedrun.secagg import secagg_cost

        for key in ("dropout", "corrupt"):
            v = sec.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"secagg.{key}={v!r} must be a number in [0, 1)")
        try:  # the protocol's own checks of (dropout, corrupt) on a probe cohort
            secagg_cost(name, 100, 1, bits, float(sec["dropout"]), float(sec["corrupt"]))
        except ValueError as exc:
            raise ConfigError(f"secagg={name}: {exc}") from None
    if net.get("name") != "none":
        from fedrun.network import Profile

        try:
            profile = Profile.from_config(net)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        sampler = str(c.get("sampler", {}).get("_target_", "")).rsplit(".", 1)[-1]
        if profile.over_selection != 1 and sampler not in OVER_SELECTING_SAMPLERS:
            name = getattr(_sampler_class(c), "name", sampler)
            raise ConfigError(f"network.over_selection={profile.over_selection:g} needs a sampler that can draw more "
                              f"clients (poisson, uniform, poisson_capped); got sampler={name}; allowed: one of those, "
                              f"or network.over_selection=1")


#: groups hashed only where they differ from their default (a config without them hashes as before they existed)
OPTIONAL_GROUPS = {"network": "none", "secagg": "none", "noise": "independent"}


def deployment_keys(c: Mapping[str, Any]) -> dict[str, Any]:
    """``network``, ``secagg`` and ``noise`` where they are not their default (:data:`OPTIONAL_GROUPS`)."""
    return {k: c[k] for k, off in OPTIONAL_GROUPS.items() if (c.get(k) or {}).get("name", off) != off}


SERVER_OPTS = ("paper", "on", "momentum", "off")


def resolve_server_opts(c: dict[str, Any], scheme_cls: type) -> None:
    """``server_opts``: the server-side options of a comparison, set alike for every scheme (in place).

    ``paper`` leaves each scheme as its config has it (FL-CS with the paper's momentum ρ and error feedback in
    R^m, the others without). ``on``: FL-CS gets ρ = ``server_momentum`` and error feedback, every other
    FedAvg-shaped scheme server momentum ρ on its decoded update (FedAvgM); ``momentum``: the same without FL-CS's
    error feedback (for FL-RND and FL-FREQ the two are one: their decoders are exact in the compressed domain,
    C(D(p)) = p, so FL-CS's error term p − C(D(p)) would be zero); ``off``: none for any scheme. A
    scheme that has no such option (its own protocol) is refused for ``on`` in one line. Then the top-level
    ``server_lr`` (:func:`server_lr_for`; null = each scheme's own) sets the scheme's η_g, in every mode.
    Idempotent.
    """
    import inspect

    mode = c.get("server_opts", "paper")
    if mode not in SERVER_OPTS:
        raise ConfigError(f"server_opts={mode!r} is not allowed; use {', '.join(SERVER_OPTS)}")
    scheme = c.setdefault("scheme", {})
    accepts = inspect.signature(scheme_cls.__init__).parameters
    rho = c.get("server_momentum", 0.9)
    if mode != "paper" and (isinstance(rho, bool) or not isinstance(rho, (int, float)) or not 0.0 < rho < 1.0):
        raise ConfigError(f"server_momentum={rho!r} is not allowed; use 0 < server_momentum < 1")
    if mode == "paper":
        pass
    elif "error_feedback" in accepts and "momentum" in accepts:  # FL-CS: momentum and error in R^m (Alg. 3)
        scheme["momentum"] = float(rho) if mode != "off" else 0.0
        scheme["error_feedback"] = mode == "on"
    elif "server_momentum" in accepts:
        scheme["server_momentum"] = float(rho) if mode != "off" else 0.0
    elif mode != "off":
        raise ConfigError(f"server_opts={mode} is not available with scheme={_scheme_name(c)}: it has no server "
                          f"momentum option (use server_opts=paper or off)")
    lr = server_lr_for(c.get("server_lr"), mode, _scheme_name(c))
    if lr is not None:
        if "server_lr" not in accepts:
            raise ConfigError(f"server_lr={lr:g} is not available with scheme={_scheme_name(c)}: it has no server "
                              f"learning rate")
        scheme["server_lr"] = lr


def server_lr_for(table: Any, mode: str, scheme: str) -> float | None:
    """η_g from the top-level ``server_lr``: null (each scheme's own), one number for every scheme, or a table
    ``{server_opts mode: {scheme: η_g}}`` (the values a tuning sweep chose; a scheme or mode it does not name
    keeps its own). None where the scheme keeps its own. A bad entry raises :class:`ConfigError`, one line."""
    if table is None:
        return None
    if isinstance(table, Mapping):
        bad = [str(k) for k in table if str(k) not in SERVER_OPTS]
        if bad:
            raise ConfigError(f"server_lr has key {bad[0]!r}; a table's keys are server_opts modes: "
                              f"{', '.join(SERVER_OPTS)}")
        row = table.get(mode) or {}
        if not isinstance(row, Mapping):
            raise ConfigError(f"server_lr.{mode}={row!r} is not allowed; use {{scheme: η_g > 0}}")
        if scheme not in row:
            return None
        value, where = row[scheme], f"server_lr.{mode}.{scheme}"
    else:
        value, where = table, "server_lr"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{where}={value!r} is not allowed; use a number > 0, or null for the scheme's own")
    return float(value)


def _modes_text(modes: tuple[str, ...]) -> str:
    words = {"off": "dp=false", "client": "dp=true (client-level)", "local": "dp=local_laplace|local_gaussian"}
    return " or ".join(words[m] for m in modes) + " only" if len(modes) == 1 else ", ".join(words[m] for m in modes)


def _typed(value: Any) -> str:
    """A config value as it is typed on the command line (true/false, not Python's True/False)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


# ------------------------------------------------------------------------------------------ typed config
#: config keys that may differ between an interrupted run and its resumption (outside RunConfig.record)
VOLATILE = ("resume", "progress", "hydra", "workers", "checkpoint_every", "chunk_size")


def comparable(c: Mapping[str, Any]) -> dict[str, Any]:
    """The config without keys that do not change the run's results."""
    return {k: v for k, v in c.items() if k not in VOLATILE}


@dataclass(frozen=True)
class DatasetConfig:
    """conf/dataset/<name>.yaml's ``dataset:`` table."""

    name: str
    task: str = "classification"
    default_partition: str = "iid"
    natural_partition: str | None = None
    leaf_dir: str | None = None
    csv: str | None = None


@dataclass(frozen=True)
class PartitionConfig:
    """conf/partition/<name>.yaml (``auto`` resolved to the dataset's default split)."""

    name: str
    copies: int = 1
    classes_per_client: int = 2
    distinct_classes: bool = True
    alpha: float = 0.5
    min_size: int = 1


@dataclass(frozen=True)
class RunConfig:
    """The resolved, validated config, typed: what every module below the CLI receives (see :func:`load`).

    ``sampler`` and ``scheme`` are Hydra instantiation nodes (``_target_`` and constructor arguments, which the
    constructors check); ``record`` is the resolved config as a checkpoint stores it (never read below)."""

    dataset: DatasetConfig
    model: str
    partition: PartitionConfig
    sampler: Mapping[str, Any]
    scheme: Mapping[str, Any]
    scheme_name: str
    rounds: int
    seed: int
    device: str
    data_root: str | None
    num_clients: int | None
    local_mode: str
    local_steps: int
    batch_size: int
    lr: float
    local_clip: float | None
    local_clip_mode: str
    local_clip_ord: int
    dp: str  # off | client | local_laplace | local_gaussian
    epsilon: float | None
    delta: float
    noise_multiplier: float | None
    clipping_norm: float | None
    accountant: str
    audit_canaries: int
    audit_confidence: float
    local_dp_calibration: str
    local_dp_sensitivity: str
    eval_every: int
    patience: int
    validation_fraction: float
    vectorized: bool
    batched_layers: bool
    chunk_size: int
    workers: int | str
    progress: str
    checkpoint_every: int | str | None
    skip_finished: bool
    resume: Any  # false, true (the newest unfinished run of this config), a run folder or an MLflow run id
    tracking_uri: str | None
    run_name: str | None
    network: Mapping[str, Any] = field(default_factory=lambda: {"name": "none"})
    secagg: Mapping[str, Any] = field(default_factory=lambda: {"name": "none"})
    noise: Mapping[str, Any] = field(default_factory=lambda: {"name": "independent"})
    record: Mapping[str, Any] = field(repr=False, default_factory=dict)


def typed(c: Mapping[str, Any]) -> RunConfig:
    """The resolved and validated config dict (after :func:`resolve_defaults` and :func:`validate`) as a
    :class:`RunConfig`."""
    ds = {k: v for k, v in c["dataset"].items() if k in DatasetConfig.__dataclass_fields__}
    dataset = DatasetConfig(**ds)
    part = dict(c["partition"])
    if part.get("name") == "auto":
        part["name"] = dataset.default_partition
    partition = PartitionConfig(**{k: v for k, v in part.items() if k in PartitionConfig.__dataclass_fields__})
    audit = c.get("audit") or {}
    plain = {f: c[f] for f in RunConfig.__dataclass_fields__ if f in c and f not in ("dataset", "partition", "dp", "model")}
    track = c.get("tracking") or {}
    return RunConfig(**plain, dataset=dataset, model=str(c["model"]["name"]), partition=partition,
                     tracking_uri=track.get("uri"), run_name=track.get("run_name"),
                     scheme_name=_scheme_name(c), dp=dp_mode(c["dp"]),
                     audit_canaries=int(audit.get("canaries", 0)), audit_confidence=float(audit.get("confidence", 0.95)),
                     record=comparable(c))
