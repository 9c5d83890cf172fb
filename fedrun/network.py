"""Network and device model: how long a federated round takes, in seconds (pure math, numpy only).

A profile (conf/network/<name>.yaml) gives per-client distributions of uplink and downlink bandwidth (bit/s),
latency (s) and compute speed (FLOP/s), the probability that a selected client completes the round
(``availability``), an optional round ``deadline_s`` and an ``over_selection`` factor, which the caller applies
(select ⌈over_selection·K⌉ clients, keep the first K that complete); ``round_timing`` does not read it.

Latency is a round-trip time (RTT, what Ookla's Speedtest reports as latency), charged ``rtt_per_exchange`` times
per message exchange (default 1): the model download is one exchange (request → model), the upload another
(update → acknowledgement); a protocol with more exchanges pays (exchanges − 2) more, and a caller may add RTTs of
its own (``extra_rtt``: secure aggregation's rounds, ``secagg_rtt_per_round`` each). ``connect_rtt`` RTTs open each
selected client's connection before its download (default 0: the device checked in, over an open stream, before it
was selected). The server is one machine of ``server_flops_per_s`` (a number, not a distribution); the caller
charges it the scheme's modelled server FLOPs (:meth:`fedrun.schemes.base.Scheme.server_flops`).
``secagg_agreement_flops`` and ``secagg_prg_flops`` price SecAgg's cryptography in FLOP-equivalents (the work of
that many FLOPs at the device's rated speed) per key agreement and per mask coordinate (:mod:`fedrun.deployment`).

Randomness comes only from ``fedrun.rng.numpy_rng`` streams keyed by (seed, purpose[, field | round]); values are
read off a stream in client-id order, so client i's draws depend on (seed, i) alone — not on how many clients
exist beyond it, nor on the order of a round's cohort.

Trace files (``trace: /path`` in a profile) use FedScale's device-capacity format (Lai et al., ICML 2022;
FedScale benchmark/dataset/data/device_info/README.md, fedscale/cloud/internal/client_metadata.py): a pickle of
``{client_id: {'computation': ms per sample, 'communication': kbit/s}}``. FedScale times a client's training as
3 · batch · steps · computation / 1000 s and its transfer as kbit / communication, with kbit = bytes / 1024 · 8
and one bandwidth for both directions. Mapped here as up_bps = down_bps = communication · 1024, and
flops_per_s = median(profile's flops_per_s) · median(computation) / computation: the trace fixes each device's
speed relative to the trace's median device, the profile's cited FLOP/s the scale (FedScale's ms/sample belongs
to an unstated reference model, so it carries no FLOP count). Latency still comes from the profile. Entries are
sorted by key and shuffled with numpy_rng(seed, "network_trace"); client i gets shuffled entry (i mod len).
Loading unpickles the file, and unpickling can run code: point ``trace`` only at your own files.
"""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedrun.rng import numpy_rng

_FIELDS = ("uplink_bps", "downlink_bps", "latency_s", "flops_per_s")
#: the run summary's targets (time_to_accuracy_s, time_to_epsilon_s) ride in the same config group; not the profile's
TARGETS = ("target_accuracy", "target_epsilon")
#: the conventions and costs beside the distributions: scalars, with their defaults where a profile leaves them out
#: (server_flops_per_s has none: a profile must state its server's speed)
_SCALARS = {"server_flops_per_s": None, "rtt_per_exchange": 1.0, "connect_rtt": 0.0, "secagg_rtt_per_round": 2.0,
            "secagg_agreement_flops": 0.0, "secagg_prg_flops": 0.0}
_KEYS = ("name", *_FIELDS, "availability", "deadline_s", "over_selection", "trace", *_SCALARS, *TARGETS)
_DISTS = {"lognormal": ("median", "sigma"), "uniform": ("low", "high"), "constant": ("value",)}


def _num(where: str, v: object, low: float | None = None, strict: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"network.{where} = {v!r}: expected a finite number")
    if low is not None and (v <= low if strict else v < low):
        raise ValueError(f"network.{where} = {v!r}: must be {'>' if strict else '>='} {low}")
    return float(v)


def _spec(key: str, spec: object) -> dict:
    """Validate one distribution spec; return it as a plain dict (values > 0, or >= 0 for latency)."""
    if not isinstance(spec, Mapping) or spec.get("dist") not in _DISTS:
        raise ValueError(f"network.{key} = {spec!r}: expected a mapping with dist: lognormal | uniform | constant")
    kind, strict = spec["dist"], key != "latency_s"
    allowed = ("dist", *_DISTS[kind], "min", "max")
    for k in spec:
        if k not in allowed:
            raise ValueError(f"network.{key}.{k}: unknown key for dist {kind}; allowed: {', '.join(allowed)}")
    for k in _DISTS[kind]:
        if k not in spec:
            raise ValueError(f"network.{key}: dist {kind} needs {', '.join(_DISTS[kind])} (missing {k})")
    out = {"dist": kind}
    for k in allowed[1:]:
        if k in spec:  # sigma >= 0; a lognormal median > 0; other values > 0 (bandwidth, FLOP/s) or >= 0 (latency)
            out[k] = _num(f"{key}.{k}", spec[k], 0.0, strict=k == "median" or (strict and k != "sigma"))
    if kind == "uniform" and out["high"] < out["low"]:
        raise ValueError(f"network.{key}: high = {out['high']} < low = {out['low']}")
    if out.get("min", -math.inf) > out.get("max", math.inf):
        raise ValueError(f"network.{key}: min = {out['min']} > max = {out['max']}")
    return out


def _draw(spec: dict, rng: np.random.Generator, n: int) -> np.ndarray:
    if spec["dist"] == "lognormal":
        x = spec["median"] * np.exp(spec["sigma"] * rng.standard_normal(n))
    elif spec["dist"] == "uniform":
        x = spec["low"] + (spec["high"] - spec["low"]) * rng.random(n)
    else:
        x = np.full(n, spec["value"])
    return np.clip(x, spec.get("min", -np.inf), spec.get("max", np.inf))


def _median(spec: dict) -> float:
    m = {"lognormal": "median", "constant": "value"}.get(spec["dist"])
    x = spec[m] if m else (spec["low"] + spec["high"]) / 2
    return float(np.clip(x, spec.get("min", -np.inf), spec.get("max", np.inf)))


@dataclass(frozen=True)
class Profile:
    """One network profile; distribution specs are dicts like {dist: lognormal, median: 4.2e7, sigma: 1.0}."""

    name: str
    uplink_bps: dict | None  # with a trace: unused (the trace gives bandwidth), may be None
    downlink_bps: dict | None
    latency_s: dict  # RTT, seconds
    flops_per_s: dict
    availability: float = 1.0
    deadline_s: float | None = None
    over_selection: float = 1.0
    trace: str | None = None
    server_flops_per_s: float = 1e12  # from_config requires it; this default serves direct construction only
    rtt_per_exchange: float = 1.0  # RTTs per message exchange (request → response)
    connect_rtt: float = 0.0  # RTTs to open a selected client's connection, once per round
    secagg_rtt_per_round: float = 2.0  # RTTs per SecAgg protocol round (AdvertiseKeys, ShareKeys, Unmasking)
    secagg_agreement_flops: float = 0.0  # FLOP-equivalents of one key agreement (ECDH)
    secagg_prg_flops: float = 0.0  # FLOP-equivalents of one PRG-expanded mask coordinate

    @classmethod
    def from_config(cls, cfg: Mapping) -> Profile | None:
        """The profile of a config mapping (e.g. cfg.network); None for name: none (the model is off)."""
        if not isinstance(cfg, Mapping) or not isinstance(cfg.get("name"), str) or not cfg["name"]:
            raise ValueError(f"network = {cfg!r}: expected a mapping with a name (none, mobile, broadband, ...)")
        unknown = [k for k in cfg if k not in (("name",) if cfg["name"] == "none" else _KEYS)]
        if unknown:
            allowed = "only name" if cfg["name"] == "none" else ", ".join(_KEYS)
            raise ValueError(f"network.{unknown[0]}: unknown key for profile {cfg['name']}; allowed: {allowed}")
        if cfg["name"] == "none":
            return None
        trace = cfg.get("trace")
        if trace is not None and (not isinstance(trace, str) or not os.path.isfile(trace)):
            raise ValueError(f"network.trace = {trace!r}: expected the path of a FedScale device-capacity pickle")
        for k in _FIELDS:
            if cfg.get(k) is None and (trace is None or k in ("latency_s", "flops_per_s")):
                raise ValueError(f"network.{k}: missing; a profile needs {', '.join(_FIELDS)}"
                                 " (uplink/downlink may be left out with a trace)")
        availability = _num("availability", cfg.get("availability", 1.0), 0.0, strict=True)
        if availability > 1:
            raise ValueError(f"network.availability = {availability}: a probability in (0, 1]")
        deadline, over = cfg.get("deadline_s"), _num("over_selection", cfg.get("over_selection", 1.0), 1.0)
        deadline = None if deadline is None else _num("deadline_s", deadline, 0.0, strict=True)
        specs = {k: None if cfg.get(k) is None else _spec(k, cfg[k]) for k in _FIELDS}
        if cfg.get("server_flops_per_s") is None:
            raise ValueError("network.server_flops_per_s: missing; a profile needs its server's speed in FLOP/s (> 0)")
        scalars = {k: _num(k, cfg.get(k, default), 0.0, strict=k == "server_flops_per_s")
                   for k, default in _SCALARS.items()}  # speeds > 0; RTT counts and crypto costs >= 0 (0: none)
        return cls(cfg["name"], **specs, availability=availability, deadline_s=deadline, over_selection=over,
                   trace=trace, **scalars)


def _load_trace(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(computation ms/sample, communication kbit/s) per entry, entries sorted by key."""
    with open(path, "rb") as f:
        table = pickle.load(f)  # the user's own file (see the module docstring)
    if not isinstance(table, Mapping) or not table:
        raise ValueError(f"network.trace {path}: expected a non-empty dict {{id: {{computation, communication}}}}")
    rows = []
    for key in sorted(table, key=repr):
        entry = table[key]
        if not isinstance(entry, Mapping):
            raise ValueError(f"network.trace {path}: entry {key!r} is not a mapping")
        rows.append([_num(f"trace[{key!r}].{k}", entry.get(k), 0.0, True) for k in ("computation", "communication")])
    comp, comm = np.asarray(rows).T
    return comp, comm


class Devices:
    """Per-client draws: up_bps, down_bps, latency_s (RTT), flops_per_s, each an array of num_clients."""

    def __init__(self, profile: Profile, num_clients: int, seed: int):
        n = int(num_clients)

        def draw(field: str) -> np.ndarray:
            return _draw(getattr(profile, field), numpy_rng(seed, "network_device", field), n)

        self.num_clients = n
        self.latency_s = draw("latency_s")
        if profile.trace is None:
            self.up_bps, self.down_bps, self.flops_per_s = draw("uplink_bps"), draw("downlink_bps"), draw("flops_per_s")
        else:
            comp, comm = _load_trace(profile.trace)
            entry = numpy_rng(seed, "network_trace").permutation(len(comp))[np.arange(n) % len(comp)]
            self.up_bps = comm[entry] * 1024.0
            self.down_bps = self.up_bps.copy()
            self.flops_per_s = _median(profile.flops_per_s) * np.median(comp) / comp[entry]


@dataclass(frozen=True)
class RoundTiming:
    download_s: np.ndarray  # per selected client, in the order given
    compute_s: np.ndarray
    upload_s: np.ndarray
    total_s: np.ndarray
    completed: np.ndarray  # available and (no deadline or total_s <= deadline_s)
    duration_s: float  # slowest completed client; the deadline if an available client missed it; 0 if none completed


def round_timing(devices: Devices, profile: Profile, clients: np.ndarray, rnd: int, seed: int, *, down_bytes: float,
                 up_bytes: float, flops: np.ndarray | float, exchanges: int = 2, extra_up_bytes: float = 0.0,
                 extra_down_bytes: float = 0.0, extra_rtt: float = 0.0) -> RoundTiming:
    """Per-client times of one round, for the selected client ids ``clients``. With L the client's RTT, e the
    profile's ``rtt_per_exchange`` and c its ``connect_rtt``:

        download_s = (c + e)·L + 8·(down_bytes + extra_down_bytes) / down_bps
        compute_s  = flops / flops_per_s          (flops: this client's training FLOPs this round, and any more work)
        upload_s   = e·L + 8·(up_bytes + extra_up_bytes) / up_bps
        total_s    = download_s + compute_s + upload_s + ((exchanges − 2)·e + extra_rtt)·L

    A client drops out (is not available) when u ≥ availability, u ~ U[0, 1) read at its id from
    numpy_rng(seed, "network_dropout", rnd); its times are still reported but do not set duration_s.
    """
    c = np.asarray(clients, dtype=np.int64).reshape(-1)
    if int(exchanges) != exchanges or exchanges < 2:
        raise ValueError(f"exchanges = {exchanges!r}: an integer >= 2 (download and upload)")
    if c.size and (c.min() < 0 or c.max() >= devices.num_clients):
        raise ValueError(f"client ids must lie in [0, {devices.num_clients}); got {c.min()}..{c.max()}")
    lat, e = devices.latency_s[c], profile.rtt_per_exchange
    download = (profile.connect_rtt + e) * lat + 8.0 * (down_bytes + extra_down_bytes) / devices.down_bps[c]
    compute = np.broadcast_to(np.asarray(flops, dtype=np.float64), c.shape) / devices.flops_per_s[c]
    upload = e * lat + 8.0 * (up_bytes + extra_up_bytes) / devices.up_bps[c]
    total = download + compute + upload + ((exchanges - 2) * e + float(extra_rtt)) * lat
    u = numpy_rng(seed, "network_dropout", int(rnd)).random(int(c.max()) + 1 if c.size else 0)[c]
    completed = u < profile.availability
    late = completed & (total > profile.deadline_s) if profile.deadline_s is not None else np.zeros_like(completed)
    completed &= ~late
    duration = profile.deadline_s if late.any() else float(total[completed].max()) if completed.any() else 0.0
    return RoundTiming(download, compute, upload, total, completed, float(duration))


def time_to(target: float, values, times) -> float:
    """The first time at which a metric series reaches >= target; nan if it never does."""
    hit = np.flatnonzero(np.asarray(values, dtype=np.float64) >= target)
    return float(np.asarray(times, dtype=np.float64)[hit[0]]) if hit.size else math.nan
