"""The config edge: typed and validated once (:class:`RunConfig`, a pydantic model whose types and ranges give the
one-line refusals, an unknown key included), the relations between values checked (:func:`validate`); what follows
from the dataset, model and scheme: :mod:`fedrun.resolve`. Every bad value: one line naming it and what is allowed."""

from __future__ import annotations

import difflib
from types import UnionType
from typing import Annotated, Any, Literal, Mapping, Union, get_args, get_origin

from pydantic import AliasPath, BaseModel, ConfigDict, Field, ValidationError, field_validator


class ConfigError(ValueError):
    """A user error in the configuration (reported as one line, no traceback)."""


DP_MODES = {False: "off", True: "client", "false": "off", "true": "client", "client": "client",
            "off": "off", "none": "off", "local_laplace": "local_laplace", "local_gaussian": "local_gaussian",
            "auto": "auto"}
#: the value written back into the config for each resolved mode (what a user would type)
DP_VALUES = {"off": False, "client": True, "local_laplace": "local_laplace", "local_gaussian": "local_gaussian"}
DEFAULT_EPSILON = 1.0  # paper 000's budget: the ε used when DP is on and neither epsilon nor noise_multiplier is given
SERVER_OPTS = ("paper", "on", "momentum", "off")


def dp_mode(value: Any) -> str:
    key = value.lower() if isinstance(value, str) else value
    if key not in DP_MODES:
        raise ConfigError(f"dp={value!r} is not allowed; use auto, false, true (client-level), local_laplace or "
                          f"local_gaussian")
    return DP_MODES[key]


def _typed(value: Any) -> str:
    """A config value as it is typed on the command line (true/false, not Python's True/False)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


# ------------------------------------------------------------------------------------------ the typed config
Int0, Int1 = Annotated[int, Field(ge=0)], Annotated[int, Field(ge=1)]
Pos, Unit = Annotated[float, Field(gt=0)], Annotated[float, Field(gt=0, le=1)]  # > 0, (0, 1]
Open, Rate = Annotated[float, Field(gt=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]  # (0, 1), [0, 1)


class _Typed(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")


class DatasetConfig(_Typed):  # conf/dataset/<name>.yaml's dataset: table
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")
    name: str
    task: Literal["classification", "regression"] = "classification"
    default_partition: str = "iid"
    natural_partition: str | None = None
    leaf_dir: str | None = None
    csv: str | None = None


class PartitionConfig(_Typed):  # conf/partition/<name>.yaml (auto: the dataset's default split, by typed())
    name: Literal["auto", "iid", "shards", "dirichlet", "writers", "state"]
    copies: Int1 = 1
    classes_per_client: Int1 = 2
    distinct_classes: bool = True
    alpha: Pos = 0.5
    min_size: Int1 = 1


class SecAggConfig(_Typed):  # conf/secagg/<name>.yaml (fedrun.secagg); clip null: S with dp=true (resolve_deployment)
    name: Literal["none", "secagg", "secagg_plus"] = "none"
    bits: Annotated[int, Field(ge=8, le=62)] | None = None
    clip: Pos | None = None
    dropout: Rate | None = None
    corrupt: Rate | None = None


class RunConfig(_Typed):
    """The keys of conf/config.yaml and its groups with their types and ranges (:func:`validate_types`); resolved, what
    every module below the CLI receives (:func:`typed`). ``sampler`` and ``scheme`` are Hydra instantiation nodes
    (their constructors check them); ``record`` is the resolved config as a checkpoint stores it."""

    dataset: DatasetConfig
    model: str = Field(validation_alias=AliasPath("model", "name"))
    partition: PartitionConfig
    sampler: dict[str, Any]
    scheme: dict[str, Any]
    rounds: Int1 | None  # null: total_iterations / local_steps (:func:`resolve_rounds`)
    total_iterations: Int1 | None = None
    seed: Int0
    device: str = Field(pattern=r"^(cpu|cuda(:\d+)?|auto)$", description="cpu, cuda, cuda:N or auto")
    data_root: str | None
    num_clients: Int1 | None
    sample_rate: Unit
    clients_per_round: Int1
    local_mode: Literal["sgd", "gd"]
    local_steps: Int1
    batch_size: Int1
    lr: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    local_clip: Pos | None
    local_clip_mode: Literal["per_sample", "batch"]
    local_clip_ord: Literal[1, 2] | None
    r: Unit
    server_opts: Literal[SERVER_OPTS]
    server_momentum: Open
    server_lr: Pos | dict[Literal[SERVER_OPTS], dict[str, Pos]] | None = None
    dp: str  # off | client | local_laplace | local_gaussian (auto before resolve_defaults)
    epsilon: Pos | None
    delta: Open
    noise_multiplier: Annotated[float, Field(ge=0)] | None
    clipping_norm: Pos | None
    accountant: Literal["rdp", "pld"]
    audit_canaries: Literal[0] | Annotated[int, Field(ge=2)] = Field(0, validation_alias=AliasPath("audit", "canaries"))
    audit_confidence: Open = Field(0.95, validation_alias=AliasPath("audit", "confidence"))
    audit_negative_control: Literal[False] = Field(False, validation_alias=AliasPath("audit", "negative_control"),
                                                   description="false: the audit's negative control (no noise, ε "
                                                   "still claimed) is a test double, tests/integration/test_audit.py")
    local_dp_calibration: Literal["classic", "analytic"]
    local_dp_sensitivity: Literal["proven", "paper", "paper_unchecked"]
    eval_every: Int1
    patience: Int0
    validation_fraction: Open
    vectorized: bool
    batched_layers: bool
    chunk_size: Int1
    workers: Literal["auto"] | Int1
    progress: Literal["auto", "bar", "log", "off"]
    checkpoint_every: Literal["auto"] | Int0 | None
    skip_finished: bool
    resume: Any  # false, true (the newest unfinished run of this config), a run folder or an MLflow run id
    tracking_kind: Literal["mlflow", "none"] = Field("none", validation_alias=AliasPath("tracking", "kind"))
    tracking_uri: str | None = Field(None, validation_alias=AliasPath("tracking", "uri"))
    run_name: str | None = Field(None, validation_alias=AliasPath("tracking", "run_name"))
    diagnostics: bool = Field(False, validation_alias=AliasPath("tracking", "diagnostics"))
    network: dict[str, Any] = Field(default_factory=lambda: {"name": "none"})  # fedrun.network.Profile checks it
    secagg: SecAggConfig = SecAggConfig()
    noise: dict[str, Any] = Field(default_factory=lambda: {"name": "independent"})  # check_noise
    fedsketch_lr: dict[str, float] | None = None  # the presets' tables (conf/experiment/): read by interpolation,
    kerkouche21: dict[str, Any] | None = None  # or kept as the record of a paper's values
    hydra: Any = None  # Hydra's own node, where a caller passes it (not a setting of the run)
    record: dict[str, Any] = Field(default_factory=dict, repr=False)

    _dp = field_validator("dp", mode="before")(lambda v: dp_mode(v))

    @property
    def scheme_name(self) -> str:
        return _scheme_name({"scheme": self.scheme})


def _allowed(tp: Any, meta: list | tuple = ()) -> str:
    """What a type admits, in words: ``a number in (0, 1]``, ``an integer >= 1``, ``sgd|gd``, ``... or null``."""
    if get_origin(tp) is Annotated:
        tp, *extra = get_args(tp)
        meta = [*meta, *(m for e in extra for m in getattr(e, "metadata", [e]))]
    if get_origin(tp) in (Union, UnionType):
        args = get_args(tp)
        text = " or ".join(_allowed(a) for a in args if a is not type(None))
        return text + (" or null" if type(None) in args else "")
    if get_origin(tp) is Literal:
        return "|".join(_typed(a) for a in get_args(tp))
    if tp is bool:
        return "true or false"
    if get_origin(tp) is dict:
        return f"a table {{{_allowed(get_args(tp)[0])}: {_allowed(get_args(tp)[1])}}}"
    b = {k: getattr(m, k) for m in meta for k in ("gt", "ge", "lt", "le") if getattr(m, k, None) is not None}
    noun = {int: "an integer", float: "a number", str: "a string"}.get(tp, getattr(tp, "__name__", str(tp)))
    if ("gt" in b or "ge" in b) and ("lt" in b or "le" in b):
        return (f"{noun} in {'(' if 'gt' in b else '['}{b.get('gt', b.get('ge')):g}, "
                f"{b.get('lt', b.get('le')):g}{')' if 'lt' in b else ']'}")
    ops = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    return " ".join([noun, *(f"{ops[k]} {v:g}" for k, v in b.items())])


def _paths(model: type[BaseModel], at: tuple = ()) -> dict[tuple, Any]:
    """Each field of ``model`` (and of its typed tables) by its key path in the config."""
    out = {}
    for name, f in model.model_fields.items():
        path = at + tuple(f.validation_alias.path if isinstance(f.validation_alias, AliasPath) else [name])
        sub = f.annotation
        out.update(_paths(sub, path) if isinstance(sub, type) and issubclass(sub, BaseModel) else {path: f})
    return out


KNOBS = sorted({path[0] for path in _paths(RunConfig)} - {"record"})  # a config's top keys: what a bad one is matched to


def unknown_key(key: str, value: Any) -> ConfigError:
    """``noise_multiplyer=1 is not a setting; did you mean noise_multiplier?``"""
    close = difflib.get_close_matches(key, KNOBS, n=1)
    hint = f"did you mean {close[0]}?" if close else "allowed: the keys of conf/config.yaml (fedrun --help)"
    return ConfigError(f"{key}={_typed(value)} is not a setting; {hint}")


def _one_line(exc: ValidationError, cfg: Mapping[str, Any]) -> ConfigError:
    """The first error of a pydantic validation as ``key=value is not allowed; use <what the type admits>``."""
    errors = exc.errors(include_url=False)  # the first key's; of a union's members' errors the deepest
    err = max((e for e in errors if e["loc"][:1] == errors[0]["loc"][:1]), key=lambda e: len(e["loc"]))
    loc, fields, value = tuple(err["loc"]), _paths(RunConfig), err["input"]
    if err["type"] == "extra_forbidden" and len(loc) == 1:
        return unknown_key(str(loc[0]), value)
    if err["type"] == "value_error":  # a validator's own line (dp)
        return ConfigError(str(err["ctx"]["error"]))
    n = next((i for i in range(len(loc), 0, -1) if loc[:i] in fields), 0)
    if not n or err["type"] in ("missing", "extra_forbidden"):
        return ConfigError(f"{'.'.join(map(str, loc))}: {err['msg'].lower()}")
    field, node, where = fields[loc[:n]], cfg, list(loc[:n])
    tp, meta = field.annotation, field.metadata
    for i, part in enumerate(loc):  # into a table: its keys (a union's member tags are none), what they admit
        if isinstance(node, Mapping) and part in node:
            node = node[part]
            if i >= n:
                members = get_args(tp) if get_origin(tp) in (Union, UnionType) else (tp,)
                (key, tp), meta = next((get_args(m) for m in members if get_origin(m) is dict), (tp, tp)), ()
                if loc[-1] == "[key]":
                    return ConfigError(f"{'.'.join(where)} has key {value!r}; allowed: {_allowed(key)}")
                where.append(part)
    shown = repr(value) if isinstance(value, str) else _typed(value)
    return ConfigError(f"{'.'.join(where)}={shown} is not allowed; use {field.description or _allowed(tp, meta)}")


def _plain(cfg: Mapping[str, Any]) -> dict[str, Any]:  # an OmegaConf config resolved to plain containers
    from omegaconf import OmegaConf
    return OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)


def validate_types(cfg: Mapping[str, Any]) -> RunConfig:
    """Each key known and of its type and range, before any default is derived from it: one line otherwise."""
    c = _plain(cfg)
    try:
        return RunConfig.model_validate(c)
    except ValidationError as exc:
        raise _one_line(exc, c) from None


def validate(cfg: Mapping[str, Any]) -> None:
    """The relations between values of the resolved config (each value's own type and range: :func:`validate_types`),
    refused in one line."""
    mode, dp, audit = dp_mode(cfg["dp"]), _typed(cfg["dp"]), cfg.get("audit") or {}
    if mode == "client":
        check_dp_sampler(cfg)
    check_noise(cfg, mode)
    canaries = audit.get("canaries", 0)
    if canaries and mode != "client":
        raise ConfigError(f"audit.canaries={canaries} audits client-level DP; dp={dp} has none; allowed: dp=true, "
                          f"or audit.canaries=0")
    copies = cfg["partition"].get("copies", 1)
    if mode not in ("off", "auto") and copies != 1:
        raise ConfigError(f"partition.copies={copies} with dp={dp}: one person's data would be in {copies} clients, "
                          f"so the per-client ε would understate the per-person ε; allowed with DP: partition.copies=1")


def _sampler_class(cfg: Mapping[str, Any]) -> type | None:
    """The sampler's class from its ``_target_`` (None when it cannot be imported: instantiation reports that)."""
    import importlib

    module, _, name = str((cfg.get("sampler") or {}).get("_target_", "")).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _sampling(cls: type) -> str | None:
    """How the sampler class draws its cohorts, as the accountants know it: the kind of its participation law."""
    return getattr(getattr(cls, "law", None), "kind", None)


def check_dp_sampler(cfg: Mapping[str, Any]) -> None:
    """Client-level DP needs an accountant for how the cohort is drawn (:func:`_sampling`), and the configured
    accountant must be one that can do it (``SAMPLING_ACCOUNTANTS``); the audit's canaries take part like
    Poisson-sampled clients. Refused in one line, before any data is loaded."""
    cls = _sampler_class(cfg)
    if cls is None:
        return
    from fedrun.privacy.accounting import SAMPLING_ACCOUNTANTS, UNSUPPORTED_PAIRS
    from fedrun.resolve import samplers_with_law
    name, sampling = getattr(cls, "name", cls.__name__), _sampling(cls)
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
        raise ConfigError(f"noise={name} is client-level DP noise; dp={_typed(cfg.get('dp'))} has none; allowed: "
                          f"dp=true, or noise=independent")
    cls = _sampler_class(cfg)
    if cls is not None and _sampling(cls) != "schema":
        raise ConfigError(f"noise={name} needs sampler=cyclic (a participation schema: correlated noise assumes no "
                          f"amplification by sampling); got sampler={getattr(cls, 'name', cls.__name__)}")


def _scheme_name(c: Mapping[str, Any]) -> str:
    return str(c["scheme"].get("name") or str(c["scheme"].get("_target_", "?")).rsplit(".", 1)[-1])


#: groups hashed only where they differ from their default (a config without them hashes as before they existed)
OPTIONAL_GROUPS = {"network": "none", "secagg": "none", "noise": "independent"}


def deployment_keys(c: Mapping[str, Any]) -> dict[str, Any]:
    """``network``, ``secagg`` and ``noise`` where they are not their default (:data:`OPTIONAL_GROUPS`)."""
    return {k: c[k] for k, off in OPTIONAL_GROUPS.items() if (c.get(k) or {}).get("name", off) != off}


#: config keys that may differ between an interrupted run and its resumption (outside RunConfig.record)
VOLATILE = ("resume", "progress", "hydra", "workers", "checkpoint_every", "chunk_size")


def comparable(c: Mapping[str, Any]) -> dict[str, Any]:
    """The config without keys that do not change the run's results."""
    return {k: v for k, v in c.items() if k not in VOLATILE}


def typed(c: Mapping[str, Any]) -> RunConfig:
    """The resolved and validated config dict (after :func:`resolve_defaults` and :func:`validate`) as a
    :class:`RunConfig`, its partition ``auto`` resolved to the dataset's default split."""
    cfg = validate_types(c)
    partition = cfg.partition
    if partition.name == "auto":
        partition = partition.model_copy(update={"name": cfg.dataset.default_partition})
    return cfg.model_copy(update={"partition": partition, "record": comparable(_plain(c))})
