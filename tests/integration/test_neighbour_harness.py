"""Neighbouring federations: for every DP configuration fedrun accepts, the released pre-noise quantity moves by at
most the sensitivity the accountant was charged for.

The configurations are enumerated from the validator: every option of the config groups sampler × network (each
profile, plus a deadline with and without over-selection) × secagg × scheme × accountant × noise, under dp=true
(σ = 1) and the local modes at their defaults, is put through fedrun's own edge (``prepare``, then the pre-data
builders of ``fedrun.run``: sampler, over-selection, client/local DP, the scheme and its SecAgg check, the
deployment). What they refuse is refused; every other combination is run here, so a newly accepted one is covered
without anyone adding it. That product fixes a few things, which further enumerations (``GROUPS``, the same edge) vary:

* the federation: every configuration runs on N24T5 (24 clients, 5 rounds, q = 0.25, cohorts of 6); the client-level
  ones of FL-STD (the dense codec: the federation's shape is the sampler's and the schema's business, not the
  codec's; every codec runs on N24T5) also on N40T7 (40 clients, 7 rounds, q = 0.15, cohorts of 6: other cyclic
  groups, a cap that binds more often);
* σ: ``epsilon=2, noise_multiplier=null`` (σ calibrated, at the sensitivity of the relation and report goal) for
  FL-STD with every sampler and noise, each accountant, without and with over-selection's report goal, without SecAgg,
  on both federations; besides the neighbour check, the events of the run's T rounds must compose (the config's
  accountant) to at most the target ε;
* local DP's Δ and clip mode: ``local_dp_sensitivity=proven|paper|paper_unchecked`` × ``local_clip_mode=per_sample|
  batch`` on the linear model (``model=lr``, the one whose condition η ≤ 2/β_l fedrun checks; lr = 0.02 meets it
  here, so ``paper`` is accepted for the Gaussian mechanism), with FL-STD and LDP-FedAvg (the update is measured
  before any codec) and every sampler, without network or SecAgg.

Client-level DP: the round's pipeline (``Simulation.run_round``: sampling, the clock and its report goal, SecAgg's
admission and field, the codec, the privatizer) runs on a federation D and its neighbour D′ under the accountant's
relation — D′ = D plus one client for Poisson-type sampling (add/remove-one), D′ = D with one client replaced for
fixed-size cohorts — with all randomness coupled (every stream is read at client ids, so the extra client changes
nothing else) and an adversarial neighbour: its update far beyond the clip norm, in a chosen direction, on the
fastest device, never dropping out. The adversary is the added client (add/remove-one), else the client of D whose
realised participation is worst (``worst_participant``: the most rounds of D's cohorts, then the closest together).
The released pre-noise quantity is the DP sum before its noise (in SecAgg's field: the decoded field sum). The
charged sensitivity comes from the event the accountant recorded for that round: noise std σS over the event's noise
multiplier (× 2 for a replace-one event, and for the truncated-Poisson event's replace branch when the cap binds
in D′).

Correlated noise under a participation schema (``sampler=cyclic``, ``noise=``): the release is the whole run's
C·G + Z, one Gaussian mechanism, so the run's T rounds are compared at once: D′ is D with one client's contributions
zeroed (zero-out, the schema's relation: the client keeps its group), the measured quantity is ‖C·(G′ − G)‖_F over
the T rounds' DP sums before noise, and the charged sensitivity is σS·√(Σ_t σ_t⁻²) over the events of those rounds.
The zeroed client is D's worst participant over the T rounds, where ‖C·u‖ is largest: a sampler whose participations
break the separation its schema claims is caught there (``test_the_adversary_is_the_worst_participant``).

Local DP: the released pre-noise quantity is each client's update (noise is added to it, coupled); the neighbour
replaces one sample of one client — by one far outside the data, and by its own features with a label 100 from the
model's prediction on the other side (the linear model's 2/β_l, which ``paper`` checks on the run's data, is then
D's: ``paper`` refuses the far sample's D′, counted and printed); the charged sensitivity is that client's Δ_l (L1
for Laplace, L2 for Gaussian).

Every measured change must be finite (``fold``: Python's max drops a NaN, which would read as no change).

Not covered: resuming a run from a checkpoint (the accountant's events and the sampler's state across a restart),
and codecs other than ``conf/scheme``'s (a scheme's own options, plug-in codecs).

Tolerances: float32 round-off of a sum of at most K + 1 rows of norm ≤ the clip, 2⁻²³ relative per term.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import math
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fedrun.config import ConfigError
from fedrun.models.nets import build_model
from fedrun.privacy.mechanisms import FixedSizeGaussianEvent, PoissonGaussianEvent, TruncatedPoissonGaussianEvent
from fedrun.simulation import Simulation
from fedrun.training import ClientData, LocalSpec

CONF = Path(__file__).resolve().parents[2] / "conf"
DIM_IN = 63  # the linear model: 64 parameters
CLIP = 1.0
DRAWS = 12  # rounds (coupled draws) per configuration and neighbour


@dataclass(frozen=True)
class Shape:
    """A federation's shape: N clients, T rounds, Poisson's q (``sample_rate``), the cohort k (``clients_per_round``:
    fixed-size cohorts, the cap, the cyclic groups' size)."""

    clients: int
    rounds: int
    sample_rate: float
    clients_per_round: int

    @property
    def overrides(self) -> list[str]:
        return [f"num_clients={self.clients}", f"rounds={self.rounds}", f"sample_rate={self.sample_rate}",
                f"clients_per_round={self.clients_per_round}"]


#: N24T5: every configuration (cyclic: 4 groups of 6, k = 2 participations 4 rounds apart). N40T7: the client-level
#: ones of SECOND_SHAPE_SCHEMES (cyclic: 6 groups of 7, 7, 7, 7, 6, 6, k = 2 participations 6 rounds apart; the capped
#: Poisson's cap of 6 binds in ~40 % of rounds at q = 0.15)
SHAPES = {"N24T5": Shape(24, 5, 0.25, 6), "N40T7": Shape(40, 7, 0.15, 6)}
SECOND_SHAPE_SCHEMES = ("fl_std",)  # the dense codec: the shape is the sampler's and the schema's business
BASE = ["~experiment", "dataset=mnist", "model=lenet5", "delta=1e-5", "tracking=none", "progress=off", "r=0.25",
        "eval_every=1", "local_mode=gd", "local_steps=2", "lr=0.05", "batch_size=10"]
CLIENT_DP = ["dp=true", "noise_multiplier=1.0", f"clipping_norm={CLIP}"]
#: σ calibrated from an ε target (``noise_multiplier=null``): for every sampler, on the dense codec (FL-STD)
CALIBRATED = ("epsilon=2", "noise_multiplier=null")
LOCAL_DP = {"local_laplace": ["dp=local_laplace", "epsilon=4", "local_clip=1.0", "local_clip_ord=1",
                              "local_clip_mode=per_sample"],
            "local_gaussian": ["dp=local_gaussian", "epsilon=4", "local_clip=1.0", "local_clip_ord=2",
                               "local_clip_mode=per_sample"]}
#: local DP's sensitivity options (``fedrun.dp``): each Δ × each clip mode, on the linear model (model=lr, the one
#: fedrun can check the paper's condition η ≤ 2/β_l for) at lr = 0.02 (≤ 2/β_l = 0.0375 of every client here, so
#: ``paper`` can be accepted; Laplace's is refused)
LOCAL_VARIANTS = [("model=lr", "lr=0.02", f"local_dp_sensitivity={s}", f"local_clip_mode={m}")
                  for s in ("proven", "paper", "paper_unchecked") for m in ("per_sample", "batch")]
#: network options: each profile, and a deadline with and without over-selection (on the mobile profile)
NETWORK_VARIANTS = {"deadline": {"over_selection": 1.0, "deadline_s": 0.1},
                    "over_selection_deadline": {"over_selection": 1.3, "deadline_s": 0.1}}


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@dataclass(frozen=True)
class Case:
    scheme: str
    dp: str
    sampler: str
    network: str
    secagg: str
    accountant: str
    noise: str = "independent"
    shape: str = "N24T5"
    extra: tuple[str, ...] = ()  # overrides beyond the dp mode's (CALIBRATED, LOCAL_VARIANTS)

    @property
    def id(self) -> str:
        tail = (f"-{self.shape}" if self.shape != "N24T5" else "") + "".join(f"-{e}" for e in self.extra)
        return (f"{self.scheme}-{self.dp}-{self.sampler}-{self.network}-{self.secagg}-{self.accountant}-{self.noise}"
                f"{tail}")


def _merged(*overrides) -> list[str]:
    """The overrides in order, a later one replacing an earlier one of the same key (Hydra refuses duplicates)."""
    out: dict[str, str] = {}
    for o in itertools.chain(*overrides):
        out[o.split("=", 1)[0]] = o
    return list(out.values())


_BASES: dict = {}


def _config(case: Case, data_root: str | None = None) -> dict:
    """The resolved config dict of ``case``, composed as the CLI composes it (Hydra, then the group files)."""
    c = _resolved(case)
    c["noise"] = dict(_noise_file(case.noise))
    if case.noise == "banded":
        c["noise"]["bands"] = 2  # ≤ the schema's separation here (4 or 6 groups): its closed-form sensitivity applies
    return c


@functools.lru_cache(maxsize=None)
def _noise_file(name: str) -> tuple:
    return tuple(OmegaConf.to_container(OmegaConf.load(CONF / "noise" / f"{name}.yaml")).items())


@functools.lru_cache(maxsize=None)
def _group_file(group: str, name: str) -> dict:
    """A group file as a plain dict (read once; callers copy it)."""
    return OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml"))


def _interpolated(node: dict, top: dict) -> dict:
    """``node`` with its ``${key}`` values (the group files' only interpolations, of top-level keys) from ``top``."""
    out = {}
    for k, v in node.items():
        if isinstance(v, str) and "${" in v:
            m = re.fullmatch(r"\$\{(\w+)\}", v)
            assert m, f"an interpolation this harness cannot resolve: {k}: {v}"
            v = top[m.group(1)]
        out[k] = v
    return out


def _base(case: Case) -> tuple[bytes, object]:
    """The Hydra composition of the case's scheme, dp mode, accountant, shape and extras, resolved (pickled), and
    its ``dp`` value."""
    from conftest import compose

    key = (case.scheme, case.dp, case.accountant, case.shape, case.extra)
    if key not in _BASES:
        extra = CLIENT_DP if case.dp == "true" else LOCAL_DP[case.dp]
        overrides = _merged(BASE, SHAPES[case.shape].overrides, [f"scheme={case.scheme}",
                                                                 f"accountant={case.accountant}"], extra, case.extra)
        c = OmegaConf.to_container(compose(overrides), resolve=True)
        _BASES[key] = pickle.dumps(c), c["dp"]
    return _BASES[key]


def _noise_refused(case: Case) -> bool:
    """The validator's noise rule (``check_noise``, which ``prepare`` runs too) on what it reads of the case's config
    (dp, noise, sampler): most noise × sampler pairs stop here, before the whole config is copied."""
    from fedrun.config import check_noise, dp_mode

    dp = _base(case)[1]
    light = {"dp": dp, "noise": dict(_noise_file(case.noise)), "sampler": _group_file("sampler", case.sampler)}
    if case.noise == "banded":
        light["noise"]["bands"] = 2
    try:
        check_noise(light, dp_mode(dp))
    except ConfigError:
        return True
    return False


def _resolved(case: Case) -> dict:
    """The Hydra composition of the case's scheme, dp mode, accountant, shape and extras (once per such key), with
    the sampler, network and secagg group files set in it as ``sampler=…`` etc. would (a fresh dict per call)."""
    import copy

    c = pickle.loads(_base(case)[0])  # a deep copy (of plain data), faster than copy.deepcopy
    c["sampler"] = _interpolated(_group_file("sampler", case.sampler), c)
    net = case.network.split("+")
    c["network"] = copy.deepcopy(_group_file("network", net[0]))
    if len(net) > 1:
        c["network"].update(NETWORK_VARIANTS[net[1]])
    c["secagg"] = copy.deepcopy(_group_file("secagg", case.secagg))
    if case.secagg != "none" and case.dp != "true":
        c["secagg"]["clip"] = 10.0  # without client-level DP the field's range is given
    return c


def _networks() -> list[str]:
    return _options("network") + [f"mobile+{v}" for v in NETWORK_VARIANTS]


def _all_cases() -> list[Case]:
    """Every option of every group, under dp=true and the local modes at their defaults, on the N24T5 federation."""
    dps = ["true", *LOCAL_DP]
    return [Case(*c) for c in itertools.product(_options("scheme"), dps, _options("sampler"), _networks(),
                                                 _options("secagg"), ("rdp", "pld"), _options("noise"))]


def _second_shape_cases() -> list[Case]:
    """The client-level configurations of SECOND_SHAPE_SCHEMES (every sampler, network, secagg, accountant and
    noise) on the N40T7 federation."""
    return [Case(*c, shape="N40T7") for c in itertools.product(
        SECOND_SHAPE_SCHEMES, ["true"], _options("sampler"), _networks(), _options("secagg"), ("rdp", "pld"),
        _options("noise"))]


def _calibrated_cases() -> list[Case]:
    """σ calibrated from ε (CALIBRATED) on both federations: every sampler and noise, each accountant, without and
    with a report goal (over-selection: the calibration at sensitivity 2S), FL-STD without SecAgg."""
    return [Case(*c, shape=shape, extra=CALIBRATED) for shape in SHAPES for c in itertools.product(
        ["fl_std"], ["true"], _options("sampler"), ["none", "mobile+over_selection_deadline"], ["none"],
        ("rdp", "pld"), _options("noise"))]


def _local_variant_cases() -> list[Case]:
    """Local DP's sensitivity options and clip modes (LOCAL_VARIANTS): FL-STD and LDP-FedAvg (the update is measured
    before any codec: the defaults' group runs every scheme), every sampler, without a network or SecAgg (they decide
    who uploads, not what one client's update is)."""
    return [Case(*c, extra=v) for v in LOCAL_VARIANTS for c in itertools.product(
        ["fl_std", "ldp_fedavg"], list(LOCAL_DP), _options("sampler"), ["none"], ["none"], ["rdp"], ["independent"])]


#: the enumerations: name → cases (the first is the whole product at the defaults; the others add what it fixes)
GROUPS = {"every option (N24T5)": _all_cases, "second federation (N40T7)": _second_shape_cases,
          "σ calibrated from ε": _calibrated_cases, "local DP's Δ and clip options": _local_variant_cases}


# ----------------------------------------------------------------------------------------- the pipeline
@dataclass
class Pipeline:
    """What fedrun's builders make of a config, before any data: the pieces a Simulation is built from."""

    cfg: object
    profile: object
    sampler_factory: object
    factor: float
    goal: int | None
    scheme_node: dict
    client_dp: object


def accept(c: dict) -> Pipeline:
    """fedrun's edge on ``c``: raises ConfigError (or the builders' ValueError) where fedrun refuses it."""
    from fedrun.resolve import check_secagg_codec
    from fedrun.run import _instantiate, load, make_client_dp, make_sampler, prepare

    prepare(c)
    cfg = load(c)
    profile, sampler, factor, goal = make_sampler(cfg, cfg.num_clients)
    node = {k: v for k, v in cfg.scheme.items() if k != "name"}
    scheme = _instantiate(node)
    if cfg.secagg.name != "none":
        check_secagg_codec(cfg.secagg.name, cfg.scheme_name, scheme)
    client_dp = make_client_dp(cfg, sampler, factor, goal) if cfg.dp == "client" else None
    if cfg.dp != "client":
        from fedrun.privacy.local_dp import _participations

        _participations(sampler, cfg.rounds, cfg.seed, cfg.dp)
    # the scheme's own set-up refusals (e.g. full participation) on a throwaway federation
    pipe = Pipeline(cfg, profile, lambda n: make_sampler(cfg, n)[1], factor, goal, node, client_dp)
    simulation(pipe, _federation(np.random.default_rng(0), cfg.num_clients))
    return pipe


def _federation(rng: np.random.Generator, clients: int, samples: int = 4):
    x = torch.as_tensor(rng.standard_normal((clients * samples, DIM_IN)), dtype=torch.float32)
    y = torch.as_tensor(rng.standard_normal(clients * samples), dtype=torch.float32)
    parts = [np.arange(i * samples, (i + 1) * samples) for i in range(clients)]
    return x, y, parts


def simulation(pipe: Pipeline, federation, max_clients: int | None = None, fastest: int | None = None) -> Simulation:
    """A Simulation of the linear model on ``federation`` with the config's sampler, scheme, DP and deployment."""
    from fedrun.privacy.local_dp import make_local_dp
    from fedrun.run import _instantiate, make_audit, make_deployment

    cfg = pipe.cfg
    x, y, parts = federation
    n = len(parts)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_model("lr", in_features=DIM_IN)
    spec = LocalSpec(mode="gd", steps=cfg.local_steps, batch_size=cfg.batch_size, lr=cfg.lr, clip_norm=cfg.local_clip,
                     loss="mse", clip_mode=cfg.local_clip_mode, clip_ord=cfg.local_clip_ord)
    sampler = pipe.sampler_factory(n)
    local_dp = make_local_dp(cfg, sampler, parts, spec, x_train=x) if cfg.dp.startswith("local") else None
    dep = make_deployment(cfg, pipe.profile, model, x, y, parts, spec, "mse", report_goal=pipe.goal, sampler=sampler)
    if dep is not None and max_clients is not None:  # the field's bound is the run's public constant (D's)
        dep.max_clients = max_clients
    if dep is not None and dep.devices is not None and fastest is not None:  # the adversary's device
        d = dep.devices
        d.up_bps[fastest], d.down_bps[fastest] = d.up_bps.max() * 10, d.down_bps.max() * 10
        d.latency_s[fastest], d.flops_per_s[fastest] = d.latency_s.min() / 10, d.flops_per_s.max() * 10
    return Simulation(model=model, data=ClientData(x, y, parts), x_test=x[:4], y_test=y[:4], sampler=sampler,
                      scheme=_instantiate(pipe.scheme_node), spec=spec, seed=cfg.seed, client_dp=pipe.client_dp,
                      local_dp=local_dp, audit=make_audit(cfg), deployment=dep)


# ----------------------------------------------------------------------------------------- client-level DP
def _updates(sim: Simulation, rnd: int, clients: np.ndarray, adversary: int | None, direction: torch.Tensor):
    """Each client's update for round ``rnd``: a direction and a norm from 0.2 to 3 clips read at its id; the
    adversary's is 10 clips along ``direction``."""
    rows = []
    for c in clients:
        if c == adversary:
            rows.append(10 * CLIP * direction)
            continue
        g = torch.Generator().manual_seed(int(c) * 1_000_003 + rnd)
        v = torch.randn(sim.n, generator=g)
        rows.append(v / v.norm() * CLIP * (0.2 + 2.8 * torch.rand(1, generator=g)))
    return torch.stack(rows) if rows else torch.zeros(0, sim.n)


def _released(sim: Simulation, adversary: int | None, direction: torch.Tensor, rounds: range):
    """Per round: (the DP sum before noise (float64), its rows, the event the accountant recorded, the cohort)."""
    out, box = [], {}
    close = sim.privatizer.close

    def capture(rnd, agg):
        box["sum"], box["rows"] = agg.sum().double(), agg.seen
        return close(rnd, agg)

    sim.privatizer.close = capture
    for rnd in rounds:
        def train(clients, r, correction=None, rnd=rnd):
            if len(clients):
                yield np.asarray(clients), sim.params + _updates(sim, rnd, clients, adversary, direction), \
                    torch.zeros(len(clients))
        sim.train = train
        box.clear()
        sim.run_round(rnd)
        event = sim.accountant.events[-1] if sim.accountant.events and "sum" in box else None
        out.append((box.get("sum"), box.get("rows", 0), event))
    return out


def charged(event, noise_std: float, cap_binds: bool) -> float:
    """The sensitivity the accountant was charged for by ``event``, the noise std being ``noise_std``."""
    if isinstance(event, PoissonGaussianEvent):
        return noise_std / event.noise_multiplier
    if isinstance(event, FixedSizeGaussianEvent):  # replace-one: the event charges 2 units
        return 2 * noise_std / event.noise_multiplier
    if isinstance(event, TruncatedPoissonGaussianEvent):  # add/remove; its replace branch where the cap binds
        return (2 if cap_binds else 1) * noise_std / event.noise_multiplier
    raise AssertionError(f"no sensitivity known for {event!r}")


def fold(worst: float, value: float, what: str) -> float:
    """max(worst, value), failing on a non-finite ``value``: Python's max drops a NaN (max(0.0, nan) is 0.0, so a
    release gone NaN would read as no change at all)."""
    if not math.isfinite(value):
        raise AssertionError(f"{what}: the measured change is {value} (a non-finite release cannot be bounded)")
    return max(worst, value)


def worst_participant(cohorts: list[np.ndarray]) -> int:
    """The client whose realised participation in ``cohorts`` (one per round) is worst for it: the most rounds, then
    the participations closest together (the smallest gap between two of them), then the smallest id."""
    rounds: dict[int, list[int]] = {}
    for t, cohort in enumerate(cohorts):
        for c in np.asarray(cohort).tolist():
            rounds.setdefault(int(c), []).append(t)

    def key(c: int):
        r = rounds[c]
        return -len(r), min((b - a for a, b in zip(r, r[1:])), default=math.inf), c

    return min(rounds, key=key)


def schema_changes(pipe: Pipeline, adversary: int | None = None) -> tuple[float, float]:
    """(‖C·(G′ − G)‖_F / the run's charged sensitivity, ‖C·(G′ − G)‖_F / S) over the run's rounds, for each
    direction: D′ = D with the adversary contributing 10 clips, D with it contributing nothing. The adversary (unless
    given) is D's worst participant over the T rounds' realised cohorts (:func:`worst_participant`): the most
    participations, then the closest ones, where the strategy matrix's ‖C·u‖ is largest."""
    from fedrun.privacy.factorization import strategy

    dp, cfg = pipe.client_dp, pipe.cfg
    (k, b), T = dp.schema, cfg.rounds
    _, C, _ = strategy(dp.noise, T, k, b, bands=cfg.noise.get("bands"), buffers=cfg.noise.get("buffers"))
    fed = _federation(np.random.default_rng(1), cfg.num_clients)
    base = simulation(pipe, fed)
    if adversary is None:
        adversary = worst_participant([base.select(t) for t in range(1, T + 1)])
    worst_ratio = worst = 0.0
    for direction in _directions(base.scheme.payload_dim, base.n):
        d, d2 = simulation(pipe, fed), simulation(pipe, fed, fastest=adversary)
        released = _released(d, adversary, 0 * direction, range(1, T + 1))
        with _always_available(adversary):
            released2 = _released(d2, adversary, direction, range(1, T + 1))
        deltas, rows, events = [], 0, []
        for (s, r, event), (s2, r2, event2) in zip(released, released2):
            if s is None or s2 is None:  # SecAgg aborted on either side: nothing released that round
                ABORTS[cfg.secagg.name] = ABORTS.get(cfg.secagg.name, 0) + (s is None) + (s2 is None)
                deltas.append(None)
                continue
            deltas.append(s2 - s)
            rows = max(rows, r, r2)
        dim = next((x.numel() for x in deltas if x is not None), 0)
        if not dim:
            continue
        G = torch.stack([x if x is not None else torch.zeros(dim, dtype=torch.float64) for x in deltas])
        change = float(torch.linalg.matrix_norm(torch.as_tensor(C) @ G))
        events = [e for e in d2.accountant.events]
        assert events == list(d.accountant.events)
        COMPARED[id(pipe)] = COMPARED.get(id(pipe), 0) + 1
        bound = dp.noise_multiplier * dp.clipping_norm * math.sqrt(sum(e.noise_multiplier ** -2 for e in events))
        tol = 2.0 ** -23 * (rows + 1) ** 2 * CLIP * float(np.abs(C).sum())
        worst = fold(worst, change / dp.clipping_norm, f"the run's release (adversary {adversary})")
        worst_ratio = fold(worst_ratio, (change - tol) / bound, "change / charged")
    return worst_ratio, worst


def client_level_changes(pipe: Pipeline, draws: int = DRAWS) -> tuple[float, float]:
    """(largest measured change / charged sensitivity over draws and directions, largest measured change in units
    of S) for the neighbour relation of the config's sampling. Add/remove-one: the adversary is the added client
    (id N, read at its own streams); replace-one: the client of D in the most of the direction's rounds
    (:func:`worst_participant`), so that the most draws carry it."""
    dp, n = pipe.client_dp, pipe.cfg.num_clients
    if dp.sampling == "schema":
        return schema_changes(pipe)
    replace = dp.sampling == "fixed_size"
    fed = _federation(np.random.default_rng(1), n)
    big = _federation(np.random.default_rng(1), n + (0 if replace else 1))  # D′: the same clients, + one
    base = simulation(pipe, fed)
    max_clients = base.deployment.max_clients if base.deployment is not None else None
    worst_ratio = worst = 0.0
    for k, direction in enumerate(_directions(base.scheme.payload_dim, base.n)):
        rounds = range(1 + k * draws, 1 + (k + 1) * draws)
        adversary = worst_participant([base.select(r) for r in rounds]) if replace else n
        d = simulation(pipe, fed, max_clients)
        d2 = simulation(pipe, big, max_clients, fastest=adversary)
        released = _released(d, None, direction, rounds)
        with _always_available(adversary):
            released2 = _released(d2, adversary, direction, rounds)
        for rnd, (s, rows, event), (s2, rows2, event2) in zip(rounds, released, released2):
            if s is None or s2 is None:  # SecAgg aborted on either side: nothing released there (see the module doc)
                ABORTS[pipe.cfg.secagg.name] = ABORTS.get(pipe.cfg.secagg.name, 0) + (s is None) + (s2 is None)
                continue
            assert event == event2
            COMPARED[id(pipe)] = COMPARED.get(id(pipe), 0) + 1
            binds = dp.sampling == "capped_poisson" and _drawn(d2, rnd) > dp.cohort_size
            bound = charged(event2, dp.noise_multiplier * dp.clipping_norm, binds)
            change = (s2 - s).norm().item()
            tol = 2.0 ** -23 * (max(rows, rows2) + 1) ** 2 * CLIP
            worst = fold(worst, change / dp.clipping_norm, f"round {rnd}'s release")
            worst_ratio = fold(worst_ratio, (change - tol) / bound, f"round {rnd}: change / charged")
    return worst_ratio, worst


def calibrated_epsilon(pipe: Pipeline) -> float:
    """The ε the accountant composes (the config's accountant) from the events of the run's T rounds, every round
    releasing: with σ calibrated from ``epsilon``, it must be within the target."""
    from fedrun.privacy.accounting import PrivacyAccountant

    dp = pipe.client_dp
    acc = PrivacyAccountant(dp.delta)
    for t in range(1, pipe.cfg.rounds + 1):
        if (event := dp.event(t)) is not None:
            acc.record(event)
    return acc.epsilon(dp.accountant)


@contextlib.contextmanager
def _always_available(client: int):
    """The adversary never drops out: the clock's availability draw is overridden for ``client`` (the deadline still
    applies; on the fastest device it meets it whenever anyone does)."""
    import dataclasses

    import fedrun.deployment as deployment

    draw = deployment.round_timing

    def timing(devices, profile, clients, rnd, seed, **kw):
        t = draw(devices, profile, clients, rnd, seed, **kw)
        mine = np.asarray(clients) == client
        on_time = profile.deadline_s is None or bool((t.total_s[mine] <= profile.deadline_s).all())
        if not mine.any() or t.completed[mine].all() or not on_time:
            return t
        completed = t.completed | mine
        late = profile.deadline_s is not None and t.duration_s == profile.deadline_s
        duration = t.duration_s if late else float(t.total_s[completed].max())
        return dataclasses.replace(t, completed=completed, duration_s=duration)

    deployment.round_timing = timing
    try:
        yield
    finally:
        deployment.round_timing = draw


ABORTS: dict[str, int] = {}  # rounds SecAgg aborted on one side of a pair, per protocol
COMPARED: dict[int, int] = {}  # round pairs compared, per pipeline


def _drawn(sim: Simulation, rnd: int) -> int:
    """How many clients the capped sampler's Poisson draw took in round ``rnd`` (before its cap)."""
    from fedrun.rng import numpy_rng

    return int((numpy_rng(sim.seed, "sampler", rnd).random(sim.num_clients) < sim.sampler.probability).sum())


def _directions(payload_dim: int, n: int) -> list[torch.Tensor]:
    """Two adversarial directions in the update space: a basis vector and the all-ones direction."""
    e = torch.zeros(n)
    e[0] = 1.0
    return [e, torch.ones(n) / math.sqrt(n)]


# ----------------------------------------------------------------------------------------- the tests
_ACCEPTED: dict = {}


def accepted_cases(group: str = "every option (N24T5)") -> dict[Case, Pipeline]:
    """Every case of ``group`` (GROUPS) fedrun accepts, with its pipeline (computed once per session)."""
    if group not in _ACCEPTED:
        from fedrun.config import check_noise, dp_mode

        _ACCEPTED[group] = accepted = {}
        for case in GROUPS[group]():
            if _noise_refused(case):
                continue
            try:
                c = _config(case)
                check_noise(c, dp_mode(c["dp"]))
                accepted[case] = accept(c)
            except (ConfigError, ValueError):
                continue
    return _ACCEPTED[group]


# ----------------------------------------------------------------------------------------- local DP
#: the replaced sample of the local-DP neighbour: (features, label); features None keeps the client's own, label None
#: puts it 100 away from the model's prediction on the other side (the clipped gradient turns round)
LOCAL_NEIGHBOURS = {"far sample": (100.0, -100.0), "far label": (None, None)}
REFUSED_NEIGHBOURS: dict[str, int] = {}  # local-DP neighbours D′ fedrun refuses (``paper``'s check on D′'s data)


def _turned_label(sim: Simulation, features: torch.Tensor, label: float) -> float:
    """A label 100 from the global model's prediction on ``features``, on the other side of it from ``label``."""
    with torch.no_grad():
        pred = float(sim.model(features[None]).squeeze())
    return pred + 100.0 if pred > label else pred - 100.0


def local_changes(pipe: Pipeline) -> float:
    """max over LOCAL_NEIGHBOURS of ‖u′_l − u_l‖ / Δ_l in the first round that uploads (the same global model on both
    sides; full-batch steps draw nothing): one client of the round's cohort has its first sample replaced by an
    adversarial one (far outside the data, or its label only: the linear model's 2/β_l, which ``paper`` checks on the
    run's data, is then D's), so its clipped per-sample gradient is at ζ in every step; u is each client's update
    before its noise. Every other client's update must not move at all. A D′ fedrun refuses is counted in
    REFUSED_NEIGHBOURS (it runs nothing to compare)."""
    fed = _federation(np.random.default_rng(1), pipe.cfg.num_clients)
    x, y, parts = fed
    worst = 0.0
    for name, (feature, label) in LOCAL_NEIGHBOURS.items():
        refused = False
        for rnd in range(1, 9):  # the first round that uploads anything (SecAgg may abort a round)
            sim = simulation(pipe, fed)
            target = int(sim.select(rnd)[0])
            i = parts[target][0]
            x2, y2 = x.clone(), y.clone()
            if feature is not None:
                x2[i] = feature
            y2[i] = label if label is not None else _turned_label(sim, x[i], float(y[i]))
            try:
                sims = [simulation(pipe, f) for f in (fed, (x2, y2, parts))]
            except ValueError:
                REFUSED_NEIGHBOURS[name] = REFUSED_NEIGHBOURS.get(name, 0) + 1
                refused = True
                break
            ups: list[dict] = [{}, {}]
            for sim, box in zip(sims, ups):
                upload = sim.privatizer.upload

                def capture(r, ids, payload, box=box, upload=upload):
                    for i, c in enumerate(np.asarray(ids)):
                        box[int(c)] = payload[i].double().clone()
                    return upload(r, ids, payload)

                sim.privatizer.upload = capture
                sim.run_round(rnd)
            assert ups[0].keys() == ups[1].keys()
            if target in ups[0]:
                break
        else:  # SecAgg aborted every round: nothing was released
            ABORTS[pipe.cfg.secagg.name] = ABORTS.get(pipe.cfg.secagg.name, 0) + 8
            continue
        if refused:
            continue
        ord_ = 1 if pipe.cfg.dp == "local_laplace" else 2
        for c, u in ups[0].items():
            if c != target:
                assert torch.equal(ups[1][c], u), f"client {c} changed with client {target}'s data"
        change = torch.linalg.vector_norm(ups[1][target] - ups[0][target], ord=ord_).item()
        # float32 round-off of E steps of η·(mean of clipped gradients), each coordinate at most ηζ, over DIM_IN + 1
        tol = 2.0 ** -22 * pipe.cfg.local_steps * pipe.cfg.lr * pipe.cfg.local_clip * (DIM_IN + 1)
        COMPARED[id(pipe)] = COMPARED.get(id(pipe), 0) + 1
        worst = fold(worst, (change - tol) / float(sims[0].local_dp.sens[target]), f"client {target}'s update ({name})")
    return worst


def _sample(cases: list[Case]) -> list[Case]:
    """One case per (dp, sampler, network, secagg) family: FL-STD where it is accepted, else the first accepted."""
    seen, out = set(), []
    for case in sorted(cases, key=lambda c: (c.scheme != "fl_std", c.id)):
        family = (case.dp, case.sampler, case.network, case.secagg)
        if family not in seen:
            seen.add(family)
            out.append(case)
    return out


def _check(case: Case, pipe: Pipeline) -> float:
    if pipe.cfg.dp == "client":
        ratio, _ = client_level_changes(pipe)
        if pipe.cfg.noise_multiplier is None:  # σ calibrated from ε: the events it makes compose to at most ε
            eps, target = calibrated_epsilon(pipe), float(pipe.cfg.epsilon)
            assert eps <= target * (1 + 1e-9), f"{case.id}: σ calibrated for ε = {target} composes to ε = {eps:.6g}"
    else:
        ratio = local_changes(pipe)
    assert ratio <= 1.0, f"{case.id}: the released quantity moved {ratio:.4f} × the charged sensitivity"
    return ratio


# the fast suite: the pipeline on a handful of families (every family and codec: pytest -m neighbour)
FAST_CASES = [Case("fl_std", "true", "uniform", "datacenter", "secagg_plus", "rdp"),  # (Poisson + SecAgg at N = 24,
              Case("fl_cs", "true", "poisson", "broadband", "none", "pld"),  # q = 0.25: its abort bit is refused)
              Case("topk_ef", "true", "uniform", "mobile", "none", "rdp"),
              Case("fl_std", "true", "poisson_capped", "mobile+over_selection_deadline", "none", "pld"),
              Case("fl_std", "true", "poisson", "mobile+deadline", "none", "rdp"),
              Case("ldp_fedavg", "local_laplace", "round_robin", "mobile+deadline", "secagg", "rdp"),
              Case("fl_std", "local_gaussian", "all", "datacenter", "none", "rdp"),
              Case("fl_cs", "true", "cyclic", "mobile+deadline", "none", "pld", "sqrt_toeplitz"),
              Case("fl_std", "true", "cyclic", "none", "none", "rdp", "banded"),
              Case("fl_rnd", "true", "cyclic", "datacenter", "secagg", "rdp", "tree"),
              Case("fl_std", "true", "cyclic", "mobile+deadline", "none", "pld", "blt")]


@pytest.mark.parametrize("case", FAST_CASES, ids=lambda c: c.id)
def test_neighbour_change_within_the_charged_sensitivity(case):
    _check(case, accept(_config(case)))


# ----------------------------------------------------------------------------------------- the harness's own guards
def test_fold_refuses_a_non_finite_change():
    """max() drops a NaN (max(0.0, nan) is 0.0): the harness folds its changes through ``fold``, which fails on it."""
    assert max(0.0, math.nan) == 0.0
    for bad in (math.nan, math.inf):
        with pytest.raises(AssertionError, match="non-finite"):
            fold(0.0, bad, "a change")
    assert fold(0.5, 0.25, "a change") == 0.5


@pytest.mark.parametrize("case", [Case("fl_std", "true", "poisson", "none", "none", "rdp"),
                                  Case("fl_std", "true", "cyclic", "none", "none", "rdp", "sqrt_toeplitz")],
                         ids=lambda c: c.sampler)
def test_a_nan_codec_fails_the_harness(case, monkeypatch):
    """A codec whose payload carries a NaN (here: for the adversary's rows only, so D's release stays finite) never
    reaches the release: the privatizer refuses it in one line (its boundary); were it summed, the harness's fold
    fails on the NaN instead of reading no change (:func:`test_fold_refuses_a_non_finite_change`)."""
    from fedrun.simulation import SchemeContractError

    pipe = accept(_config(case))
    encode = Simulation.encode

    def nan_encode(self, rnd, ids, updates):
        parts, start = [], 0
        for payload, rows in encode(self, rnd, ids, updates):  # (codec output, clients) parts, in the order of ids
            payload = payload.clone()
            payload[torch.as_tensor(np.isin(np.asarray(ids[start:start + rows]), _NAN_CLIENTS)), 0] = math.nan
            parts.append((payload, rows))
            start += rows
        return parts

    n = pipe.cfg.num_clients
    _NAN_CLIENTS[:] = [n] if case.sampler == "poisson" else list(range(n))  # D′'s added client; under the
    monkeypatch.setattr(Simulation, "encode", nan_encode)  # schema, every client (whichever is the adversary)
    with pytest.raises(SchemeContractError, match="non-finite"):
        client_level_changes(pipe)


_NAN_CLIENTS: list[int] = []


class _FalseSeparation:
    """A cyclic sampler (the config's) that lies about its separation: round 4 also takes the first client of round
    3's group, which so takes part in two rounds in a row while ``schema()`` still claims b = G rounds apart."""

    def __init__(self, sampler):
        self.inner = sampler

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def select(self, rnd: int, seed: int) -> np.ndarray:
        out = self.inner.select(rnd, seed)
        return np.union1d(out, self.inner.select(3, seed)[:1]) if rnd == 4 else out


def test_the_adversary_is_the_worst_participant(monkeypatch):
    """Under a participation schema the adversary is the client whose realised participation is worst (most rounds,
    then closest together): with a sampler whose schema claims a false separation, that client moves the run's release
    beyond the charge, and the harness fails; a client of round 1 (4 rounds apart, as claimed) would not show it.
    (A run stops such a sampler at its first breach: the participation ledger, off here to test the harness alone.)"""
    from fedrun.privacy.cohort import ParticipationLedger

    monkeypatch.setattr(ParticipationLedger, "record", lambda self, rnd, clients, canaries=None: None)
    case = Case("fl_std", "true", "cyclic", "none", "none", "rdp", "sqrt_toeplitz")
    pipe = accept(_config(case))
    honest = pipe.sampler_factory
    pipe.sampler_factory = lambda n: _FalseSeparation(honest(n))
    sim = simulation(pipe, _federation(np.random.default_rng(1), pipe.cfg.num_clients))
    cohorts = [sim.select(t) for t in range(1, pipe.cfg.rounds + 1)]
    liar = int(cohorts[2][0])
    assert worst_participant(cohorts) == liar
    ratio, _ = schema_changes(pipe)
    assert ratio > 1.0, f"the false separation went unseen: change / charged = {ratio:.4f}"
    naive, _ = schema_changes(pipe, adversary=int(cohorts[0][0]))
    assert naive <= 1.0  # why a client of round 1 is not the adversary


@pytest.mark.neighbour
def test_neighbour_every_accepted_dp_configuration(capsys):
    """Every accepted configuration, enumerated from the validator (GROUPS); prints the per-family figures."""
    lines = []
    for group, enumerate_ in GROUPS.items():
        cases = accepted_cases(group)
        if group == "every option (N24T5)":
            assert len(cases) > 400 and {c.dp for c in cases} == {"true", "local_laplace", "local_gaussian"}
        else:
            assert cases, f"{group}: fedrun accepts none of them"
        families: dict = {}
        for case, pipe in cases.items():
            ratio = _check(case, pipe)
            fam = (case.dp, case.sampler, "report goal" if pipe.goal else "no report goal", case.secagg, case.noise,
                   *case.extra[2:])
            worst, configs, compared = families.get(fam, (0.0, 0, 0))
            families[fam] = (fold(worst, ratio, case.id), configs + 1,
                             compared + COMPARED.get(id(pipe), 0))
        lines.append(f"{group}: {len(enumerate_())} enumerated, {len(cases)} accepted")
        lines += [f"  {' · '.join(fam)}: {configs} configurations, {compared} releases compared, largest change / "
                  f"charged = {ratio:.4f}" for fam, (ratio, configs, compared) in sorted(families.items())]
    with capsys.disabled():
        print(f"\nneighbour harness: {sum(len(accepted_cases(g)) for g in GROUPS)} accepted configurations; {DRAWS} "
              f"draws × 2 directions per client-level configuration, one round per local one and neighbour; SecAgg "
              f"aborts on one side (skipped): {ABORTS}; local-DP neighbours fedrun refuses: {REFUSED_NEIGHBOURS}")
        print("\n".join(lines))
