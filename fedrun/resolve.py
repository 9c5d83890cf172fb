"""What follows from the dataset, model and scheme, resolved in place before any data is loaded: the DP mode, the
clipping norms, the server options, the rounds from total_iterations, the deployment's settings (:func:`resolve_defaults`;
each value's own type and range: :mod:`fedrun.config`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from fedrun.config import (DEFAULT_EPSILON, DP_VALUES, ConfigError, DatasetConfig, _sampler_class, _sampling,
                           _scheme_name, _typed, dp_mode)


def resolve_rounds(cfg: dict[str, Any]) -> None:
    """``total_iterations`` T (paper 001: T = E·T_g) → ``rounds`` = T / local_steps, in place: rounds=null derives
    them (T must be a multiple of local_steps), a given rounds must agree, total_iterations=null keeps rounds."""
    t, rounds, e = cfg.get("total_iterations"), cfg.get("rounds"), cfg.get("local_steps")
    if t is None:
        if rounds is None:
            raise ConfigError("rounds=null needs total_iterations=T (then rounds = T / local_steps)")
    elif rounds is None and t % e:
        divisors = [d for d in range(1, t + 1) if t % d == 0]
        shown = ", ".join(map(str, divisors[:12])) + (", …" if len(divisors) > 12 else "")
        raise ConfigError(f"total_iterations={t} is not a multiple of local_steps={e} (T = E·T_g needs a whole "
                          f"number of rounds); allowed local_steps: {shown}")
    elif rounds is None:
        cfg["rounds"] = t // e
    elif rounds * e != t:
        raise ConfigError(f"rounds={rounds} × local_steps={e} = {rounds * e} disagrees with total_iterations={t}; set "
                          f"rounds=null (derived: T / E) or total_iterations=null (fixed rounds)")


def tuned_clipping_norm(table: Mapping[str, Any] | None, scheme: str, r: float) -> float | None:
    """S from a model's table (conf/model/*.yaml ``clipping_norm``): ``{scheme: S}`` for any r, or
    ``{scheme: {"r": S}}`` per compression ratio. None where the table has no entry for (scheme, r)."""
    entry = (table or {}).get(scheme)
    if entry is None or isinstance(entry, (int, float)):
        return None if entry is None else float(entry)
    return next((float(v) for k, v in entry.items() if math.isclose(float(k), float(r), rel_tol=1e-9)), None)


def check_pair(c: Mapping[str, Any], scheme_cls: type) -> None:
    """Refuse a dataset × scheme pair that does not make sense, in one line naming the pair."""
    ds, scheme, task = c["dataset"]["name"], _scheme_name(c), c["dataset"].get("task", "classification")
    if getattr(scheme_cls, "needs_image_source", False) and task == "regression":
        raise ConfigError(f"scheme={scheme} does not apply to dataset={ds}: it transfers layers of a model "
                          f"pre-trained on an image dataset, and dataset={ds} is a {task} on tabular features")
    if getattr(scheme_cls, "compresses", False) and task == "regression":
        raise ConfigError(f"scheme={scheme} does not apply to dataset={ds}: its model ({c['model']['name']}, one "
                          f"weight per feature) is too small to compress; use scheme=fl_std or ldp_fedavg")


def check_partition(dataset: DatasetConfig, partition: str) -> None:
    """Natural splits exist only for their dataset: writers → femnist, state → lending_club."""
    natural, name = {"writers": "femnist", "state": "lending_club"}, dataset.name
    if partition in natural and natural[partition] != name:
        allowed = ["iid", "shards", "dirichlet"] + ([dataset.natural_partition] if dataset.natural_partition else [])
        if name == "lending_club":
            allowed = ["iid", "state"]
        raise ConfigError(f"partition={partition} is not available for dataset={name}; allowed: {', '.join(allowed)}")
    if name == "lending_club" and partition in ("shards", "dirichlet"):
        raise ConfigError(f"partition={partition} needs class labels; dataset=lending_club is a regression task; "
                          f"allowed: iid, state")


def resolve_defaults(c: dict[str, Any], scheme_cls: type, model_table: Mapping[str, Any] | None = None) -> list[str]:
    """Fill, in place and before any data is loaded, the values that follow from the dataset, model and scheme;
    return notes for the user. ``scheme_cls`` declares ``dp_modes`` (of off/client/local), ``compresses`` and
    ``needs_image_source``; ``model_table`` is the model's config (its tuned ``clipping_norm`` table, ``local_clip``).
    ``dp=auto`` becomes client-level DP where the scheme takes it, the sampler is Poisson and the model has a tuned S
    for (scheme, r), else off (with a note saying why); a DP mode the scheme does not take is refused in one line."""
    check_pair(c, scheme_cls)
    notes: list[str] = []
    resolve_server_opts(c, scheme_cls)
    if not getattr(scheme_cls, "compresses", False):
        c["r"] = 1.0  # r only means something to a compressing scheme; one value keeps sweeps from repeating runs
    scheme, model, r = _scheme_name(c), c["model"]["name"], float(c["r"])
    model_table = model_table if model_table is not None else c["model"]
    modes = tuple(getattr(scheme_cls, "dp_modes", ("off", "client", "local")))
    words = {"off": "dp=false", "client": "dp=true (client-level)", "local": "dp=local_laplace|local_gaussian"}
    takes = " or ".join(words[m] for m in modes) + " only" if len(modes) == 1 else ", ".join(words[m] for m in modes)
    mode = dp_mode(c["dp"])
    tuned = tuned_clipping_norm(model_table.get("clipping_norm"), scheme, r)
    if mode == "auto":
        cls = _sampler_class(c)
        reason = (f"scheme={scheme} takes {takes}" if "client" not in modes else
                  "dp=auto turns client-level DP on with sampler=poisson only (give dp=true for sampler=uniform or "
                  "poisson_capped)" if cls is None or _sampling(cls) != "poisson" else
                  f"model={model} has no clipping norm S tuned for scheme={scheme} at r={r:g} (conf/model/{model}.yaml);"
                  f" give clipping_norm=S dp=true for client-level DP" if c["clipping_norm"] is None and tuned is None
                  else None)
        mode = "off" if reason else "client"
        notes += [f"dp=auto: no DP — {reason}"] if reason else []
    elif mode != "off" and mode.split("_")[0] not in modes:
        raise ConfigError(f"dp={_typed(c['dp'])} is not available with scheme={scheme}: it takes {takes}")
    c["dp"] = DP_VALUES[mode]
    if mode != "off" and c["epsilon"] is None and c["noise_multiplier"] is None:
        c["epsilon"] = DEFAULT_EPSILON
    if mode == "client" and c["clipping_norm"] is None:
        if tuned is None:
            raise ConfigError(f"dp=true needs clipping_norm=S: model={model} has no S tuned for scheme={scheme} at "
                              f"r={r:g} (conf/model/{model}.yaml)")
        c["clipping_norm"] = tuned
        notes.append(f"clipping_norm={tuned:g}: S tuned for model={model}, scheme={scheme}, r={r:g} "
                     f"(conf/model/{model}.yaml)")
    if mode == "client":
        budget = f"ε={c['epsilon']:g}" if c["epsilon"] is not None else f"noise_multiplier={c['noise_multiplier']:g}"
        notes.append(f"dp: client-level ({budget}, δ={c['delta']:g}, S={c['clipping_norm']:g})")
    if mode.startswith("local") and c["local_clip"] is None:
        zeta = model_table.get("local_clip")
        if zeta is None:
            raise ConfigError(f"dp={mode} needs local_clip=ζ (the per-sample gradient clip): model={model} has no "
                              f"tuned ζ (conf/model/{model}.yaml)")
        c["local_clip"] = float(zeta)
        notes.append(f"local_clip={float(zeta):g}: ζ tuned for model={model} (conf/model/{model}.yaml)")
    if c["local_clip_ord"] is None:
        c["local_clip_ord"] = 1 if mode == "local_laplace" else 2
    resolve_deployment(c, scheme_cls)
    return notes


def resolve_server_opts(c: dict[str, Any], scheme_cls: type) -> None:
    """``server_opts``, set alike for every scheme (in place; idempotent): ``paper`` leaves each scheme as published;
    ``on`` gives FL-CS ρ = ``server_momentum`` with its error feedback in R^m and every other FedAvg-shaped scheme
    server momentum ρ (FedAvgM); ``momentum`` the same without FL-CS's error feedback (for FL-RND and FL-FREQ the two
    are one: their decoders are exact in the compressed domain, C(D(p)) = p); ``off`` none. A scheme without such an
    option is refused for ``on`` in one line. Then ``server_lr`` (null: each scheme's own η_g; a number; or a table
    ``{server_opts mode: {scheme: η_g}}``, the values a tuning sweep chose) sets the scheme's η_g, in every mode."""
    import inspect

    mode, rho, name, table = c["server_opts"], float(c["server_momentum"]), _scheme_name(c), c.get("server_lr")
    scheme = c.setdefault("scheme", {})
    accepts = inspect.signature(scheme_cls.__init__).parameters
    if mode == "paper":
        pass
    elif "error_feedback" in accepts and "momentum" in accepts:  # FL-CS: momentum and error in R^m (Alg. 3)
        scheme["momentum"] = rho if mode != "off" else 0.0
        scheme["error_feedback"] = mode == "on"
    elif "server_momentum" in accepts:
        scheme["server_momentum"] = rho if mode != "off" else 0.0
    elif mode != "off":
        raise ConfigError(f"server_opts={mode} is not available with scheme={name}: it has no server momentum option "
                          f"(use server_opts=paper or off)")
    lr = (table.get(mode) or {}).get(name) if isinstance(table, Mapping) else table
    if lr is not None and "server_lr" not in accepts:
        raise ConfigError(f"server_lr={lr:g} is not available with scheme={name}: it has no server learning rate")
    if lr is not None:
        scheme["server_lr"] = float(lr)


# ------------------------------------------------------------------------------------------ deployment
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


OVER_SELECTING_SAMPLERS = ("PoissonSampler", "UniformSampler", "CappedPoissonSampler")


def resolve_deployment(c: dict[str, Any], scheme_cls: type) -> None:
    """``network=`` and ``secagg=`` (:mod:`fedrun.deployment`), checked in one line each, in place: SecAgg's range
    defaults to S under client-level DP. Runs after the DP mode is resolved."""
    from hydra.utils import instantiate

    from fedrun.schemes.transfer import FbFTL

    scheme, sec, net = _scheme_name(c), c.setdefault("secagg", {"name": "none"}), c.setdefault("network", {"name": "none"})
    for group, value in (("network", net["name"]), ("secagg", sec["name"])):
        if issubclass(scheme_cls, FbFTL) and value != "none":
            raise ConfigError(f"{group}={value} is not available with scheme={scheme}: FbFTL's protocol (features "
                              f"uploaded once, then server training) is not the federated round; use {group}=none")
    if sec["name"] != "none":
        try:  # the scheme's instance (a constructor only: no data); else its class
            codec = instantiate({k: v for k, v in c["scheme"].items() if k != "name"})
        except Exception:  # noqa: BLE001 - hydra wraps the constructor's errors (the run's instantiation reports them)
            codec = scheme_cls
        check_secagg_codec(sec["name"], scheme, codec)
        missing = [k for k in ("bits", "dropout", "corrupt") if sec.get(k) is None]
        if missing:
            raise ConfigError(f"secagg.{missing[0]}=null is not allowed with secagg={sec['name']}; see conf/secagg/")
        if sec.get("clip") is None and dp_mode(c["dp"]) != "client":
            raise ConfigError("secagg.clip=None: the field's quantisation range [-clip, clip] must be a number > 0 "
                              "(null means S, with dp=true only)")
        sec["clip"] = float(sec["clip"] if sec.get("clip") is not None else c["clipping_norm"])
        from fedrun.secagg import secagg_cost

        try:  # the protocol's own checks of (dropout, corrupt) on a probe cohort
            secagg_cost(sec["name"], 100, 1, sec["bits"], float(sec["dropout"]), float(sec["corrupt"]))
        except ValueError as exc:
            raise ConfigError(f"secagg={sec['name']}: {exc}") from None
    if net["name"] != "none":
        from fedrun.network import Profile

        try:
            profile = Profile.from_config(net)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        sampler = str(c["sampler"].get("_target_", "")).rsplit(".", 1)[-1]
        if profile.over_selection != 1 and sampler not in OVER_SELECTING_SAMPLERS:
            raise ConfigError(f"network.over_selection={profile.over_selection:g} needs a sampler that can draw more "
                              f"clients (poisson, uniform, poisson_capped); got sampler="
                              f"{getattr(_sampler_class(c), 'name', sampler)}; allowed: one of those, or "
                              f"network.over_selection=1")




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
