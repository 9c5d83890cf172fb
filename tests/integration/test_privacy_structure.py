"""Privacy by structure (issue 50): a codec written with a realistic bug or with hostile intent, and a sampler that
misdeclares its law, cannot move the released quantity beyond what the accountant was charged for, or spend an ε
that does not hold. Each test fails with its rule removed (tried):

* a fresh client codec per client, built from the config (``fedrun.schemes.base.fresh_codec``), never a deepcopy:
  state on ``self``, closures made at set-up and a ``__deepcopy__`` returning ``self`` reach no other client and not
  the server side;
* the update handed to ``encode`` is an owned copy (no ``_base`` holding the chunk), the client's state comes as
  copies of its own rows (``ClientView``: never the store), ``feedback`` gets only the client's own row;
* the privatizer owns what it sums (``Privatizer.accept``): a non-finite payload is refused in one line, an autograd
  graph does not cross, and client-side metrics are prefixed ``client_`` (never covered by ε);
* the participation ledger stops a run whose sampler breaks its declared law, canaries included.

Neighbouring federations: D (the sampler's round-1 clients) and D′ = D plus one client encoded first, all
randomness coupled (same seed, so the same noise); the released aggregate × qN then moves by at most S (+ float32
round-off of a sum of at most K + 1 rows of norm ≤ S).
"""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fedrun.metric_names import covered_by_epsilon
from fedrun.privacy.canaries import Canaries
from fedrun.privacy.cohort import CohortContractError, FixedSize, ParticipationLedger, Poisson, Schema
from fedrun.rng import numpy_rng
from fedrun.run import build, run
from fedrun.sampling import CyclicSampler
from fedrun.schemes.fedavg import FedAvg
from fedrun.simulation import SchemeContractError

S, N, Q = 0.05, 40, 0.25
DP = ["dataset=mnist", "model=lenet5", "dp=true", "noise_multiplier=1.0", "delta=1e-5", f"num_clients={N}",
      f"sample_rate={Q}", f"clipping_norm={S}"]


def _sim(fast_cfg, target: str, *extra: str):
    c = OmegaConf.to_container(fast_cfg(*DP, *extra), resolve=True)
    c["scheme"] = {"_target_": f"{__name__}.{target}"}
    return build(c).sim


def _release_change(fast_cfg, target: str) -> tuple[float, int]:
    """max over two rounds of ‖release(D′) − release(D)‖·qN / S, D′ = D + one client (lowest id: encoded first);
    and K = |D|. The same seed couples the noise, so the difference is that of the pre-noise sums."""
    a, b = _sim(fast_cfg, target), _sim(fast_cfg, target)
    worst, k = 0.0, 0
    for rnd in (1, 2):
        d = a.select(rnd)
        extra = min(set(range(N)) - set(d.tolist()))
        out = []
        for sim, clients in ((a, d), (b, np.sort(np.append(d, extra)))):
            w0 = sim.params.clone()
            sim.run_round(rnd, clients)
            out.append((sim.params - w0).double())
            sim.params.copy_(w0)  # both federations start the next round from the same model
        change = float((out[1] - out[0]).norm()) * Q * N / S
        assert math.isfinite(change)
        worst, k = max(worst, change), max(k, len(d))
    return worst, k


def _within_one_s(change: float, k: int) -> bool:
    return change <= 1 + 4 * (k + 1) * 2.0 ** -23 * 64  # S, plus float32 round-off of the sums (and the ÷ qN)


# ------------------------------------------------------------------------------ 1. state across clients
class SelfResidual(FedAvg):
    """Error feedback written the textbook way: the residual on ``self`` (here: everything not yet "sent")."""

    def encode(self, rnd, updates, state):
        x = updates + getattr(self, "residual", torch.zeros_like(updates))
        self.residual = x  # with one codec for every client, the next client's row carries this one's update
        return x


class ChunkBase(FedAvg):
    """Uploads the mean of the tensor its update is a view of (the whole chunk, were it handed a view)."""

    def encode(self, rnd, updates, state):
        base = updates._base if updates._base is not None else updates
        return base.mean(0, keepdim=True).expand_as(updates).contiguous() * len(base)


class ClosureBag(FedAvg):
    """A bag made at construction, in a closure: shared by every deepcopy; the server side applies what the client
    side put in it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        bag = []
        self.push, self.peek = bag.append, lambda: list(bag)

    def encode(self, rnd, updates, state):
        self.push(updates.clone())
        return torch.zeros_like(updates)

    def decode(self, rnd, aggregate, exact=None):
        kept = self.peek()
        return torch.cat(kept).mean(0) if kept else aggregate


class SelfCopy(ClosureBag):
    """Its copies are itself."""

    def __deepcopy__(self, memo):
        return self


@pytest.mark.parametrize("codec", ["SelfResidual", "ChunkBase"])
def test_a_codec_that_mixes_clients_moves_the_release_by_at_most_s(fast_cfg, codec):
    change, k = _release_change(fast_cfg, codec)
    assert k >= 5 and _within_one_s(change, k), f"{codec}: the release moved {change:.3f} S (K = {k})"


@pytest.mark.parametrize("codec", ["ClosureBag", "SelfCopy"])
def test_the_server_side_shares_nothing_with_the_clients_codecs(fast_cfg, codec):
    sim = _sim(fast_cfg, codec)
    clients = sim.select(1)
    w0 = sim.params.clone()
    sim.run_round(1, clients)
    applied = (sim.params - w0).double()
    std = 1.0 * S / (Q * N)  # σS/(qN): the noise alone, nothing of the updates
    assert len(clients) and abs(applied.std().item() / std - 1) < 5 / math.sqrt(2 * applied.numel())


class StoreReader(FedAvg):
    """Looks for other clients' state through its view and for more than its own row in feedback."""

    seen: list = []

    def encode(self, rnd, updates, state):
        StoreReader.seen.append(("view", sorted({tuple(v.shape) for v in vars(state).values()
                                                if isinstance(v, torch.Tensor)}
                                               | {tuple(t.shape) for d in vars(state).values() if isinstance(d, dict)
                                                  for t in d.values()}), [type(v).__name__ for v in vars(state).values()]))
        state.set("mine", updates)
        return updates

    def feedback(self, rnd, state, sent, values, received):
        StoreReader.seen.append(("feedback", sent.shape[0], state.get("mine", sent.shape[1]).shape[0]))


def test_a_codec_sees_its_own_rows_only(fast_cfg):
    StoreReader.seen = []
    sim = _sim(fast_cfg, "StoreReader")
    sim.run_round(1)
    sim.run_round(2)
    views = [s for s in StoreReader.seen if s[0] == "view"]
    feedback = [s for s in StoreReader.seen if s[0] == "feedback"]
    assert views and feedback
    for _, shapes, kinds in views:  # copies of one row each, and no reference to the store
        assert all(shape[0] == 1 for shape in shapes) and "ClientState" not in kinds
    assert all(rows == 1 and own == 1 for _, rows, own in feedback)


# ------------------------------------------------------------------------------ 2. the payload as a number
class NaNSpare(FedAvg):
    """A NaN in one coordinate (never clipped: NaN > S is false), decoded away by the server."""

    def encode(self, rnd, updates, state):
        out = updates.clone()
        out[:, -1] = float("nan")
        return out

    def decode(self, rnd, aggregate, exact=None):
        return torch.nan_to_num(aggregate)


def test_a_non_finite_payload_is_refused_in_one_line(fast_cfg):
    sim = _sim(fast_cfg, "NaNSpare")
    with pytest.raises(SchemeContractError, match=r"^scheme=NaNSpare: encode returned a non-finite value \(nan\)") \
            as err:
        sim.run_round(1)
    assert "\n" not in str(err.value)


class GraphWalker(FedAvg):
    """A payload with an autograd graph; the server side looks for a way back from the aggregate."""

    found: list = []

    def encode(self, rnd, updates, state):
        return updates.clone().requires_grad_() * 1.0

    def decode(self, rnd, aggregate, exact=None):
        GraphWalker.found.append((aggregate.requires_grad, aggregate.grad_fn))
        return aggregate.detach()


def test_no_autograd_graph_crosses_the_privatizer(fast_cfg):
    GraphWalker.found = []
    _sim(fast_cfg, "GraphWalker").run_round(1)
    assert GraphWalker.found == [(False, None)]


class MetricForger(FedAvg):
    def encode(self, rnd, updates, state):
        self.metrics = {"epsilon": 0.0, "test_accuracy": 1.0}
        return updates


def test_client_side_metrics_are_prefixed_and_not_covered(fast_cfg):
    metrics = _sim(fast_cfg, "MetricForger").run_round(1)
    assert "epsilon" not in metrics and "test_accuracy" not in metrics
    assert metrics["client_epsilon"] == 0.0 and covered_by_epsilon("client_epsilon") is False


def test_the_shipped_error_feedback_codec_keeps_its_residual_per_client(fast_cfg):
    """topk_ef: what a client did not send comes back in its own next upload, and only in its own."""
    c = OmegaConf.to_container(fast_cfg(*DP, "scheme=topk_ef", "scheme.fraction=0.01"), resolve=True)
    sim = build(c).sim
    sim.run_round(1)
    held = sim.client_state.clients("topk_ef_residual")
    assert set(held) == set(sim.select(1).tolist())  # a row per client of round 1, nobody else
    change, k = _release_change(fast_cfg, "TopKEFProbe")
    assert _within_one_s(change, k)


from fedrun.schemes.topk_ef import TopKEF  # noqa: E402


class TopKEFProbe(TopKEF):
    def __init__(self, **kwargs):
        super().__init__(fraction=0.01, **kwargs)


# ------------------------------------------------------------------------------ 3. the cohort contract
def test_the_ledger_holds_each_law():
    poisson = ParticipationLedger(Poisson(0.5, 10), 10, "p")
    poisson.record(1, np.array([1, 3]))
    with pytest.raises(CohortContractError, match="a client selected twice"):
        poisson.record(2, np.array([2, 2]))
    with pytest.raises(CohortContractError, match="outside"):
        poisson.record(3, np.array([10]))
    with pytest.raises(CohortContractError, match="3 clients selected, not k = 2"):
        ParticipationLedger(FixedSize(2, 10), 10, "u").record(1, np.array([1, 2, 3]))
    schema = ParticipationLedger(Schema(2, 3), 10, "s", extra=1)
    schema.record(1, np.array([0]), np.array([0]))
    schema.record(4, np.array([0]), np.array([0]))
    with pytest.raises(CohortContractError, match="client 0 takes part a 3th time, more than k = 2"):
        schema.record(7, np.array([0]))
    with pytest.raises(CohortContractError, match="canary 0 takes part 1 round"):
        schema.record(5, None, np.array([0]))


class ReshufflingCyclic(CyclicSampler):
    """Declares the cyclic schema (b = G) but draws its groups afresh each round: b = 1 in truth."""

    def select(self, rnd, seed):
        order = numpy_rng(seed, "liar", rnd).permutation(self.num_clients)
        return np.sort(order[:self.k])


def test_a_sampler_that_breaks_its_declared_schema_is_stopped(fast_cfg, tmp_path):
    c = OmegaConf.to_container(fast_cfg(*DP[:2], "dp=true", "epsilon=4", "delta=1e-5", "num_clients=12",
                                        "clipping_norm=0.05", "sampler=cyclic", "clients_per_round=4", "rounds=6"),
                               resolve=True)
    c["sampler"]["_target_"] = f"{__name__}.ReshufflingCyclic"
    with pytest.raises(CohortContractError, match=r"^sampler=cyclic broke its declared participation law "
                                                  r"Schema\(k=2, b=3\) in round \d: client \d+ takes part") as err:
        run(c, out_dir=tmp_path)
    assert "\n" not in str(err.value)


def test_canaries_keep_the_schemas_k():
    """Schema(k = 2, b = 3) over 9 rounds: a canary's phase comes round 3 times, it may take part twice."""
    g = torch.Generator().manual_seed(0)
    can = Canaries(6, 4, 1.0, 1.0, g, np.random.default_rng(0), schema=Schema(2, 3))
    ledger = ParticipationLedger(Schema(2, 3), 1, "s", extra=6)
    for rnd in range(1, 10):
        can.rows(g, rnd)
        ledger.record(rnd, None, can.taken)
    assert can.participations[can.included].max() == 2


def test_the_participation_ledger_resumes_with_the_run(fast_cfg, tmp_path):
    """A resumed run holds its rounds to the law with the participations before the checkpoint (a client of round 1
    taking part again in round 2 of a resumed b = 3 schema is still a breach)."""
    from fedrun.checkpoint import load_into, save_checkpoint
    from fedrun.run import LoopState

    c = OmegaConf.to_container(fast_cfg(*DP[:2], "dp=true", "epsilon=4", "delta=1e-5", "num_clients=12",
                                        "clipping_norm=0.05", "sampler=cyclic", "clients_per_round=4", "rounds=6"),
                               resolve=True)
    built = build(c)
    built.sim.run_round(1)
    loop = LoopState()
    loop.round = 1
    save_checkpoint(tmp_path, built, loop, None)
    again = build(c)
    load_into(tmp_path / "checkpoint.pt", again, LoopState())
    assert np.array_equal(again.sim.privatizer.ledger.count, built.sim.privatizer.ledger.count)
    with pytest.raises(CohortContractError, match="round 2: client"):
        again.sim.run_round(2, built.sim.select(1))  # round 1's group again, one round later


@pytest.mark.parametrize("declared, stopped", [("b=1", False), ("b=self.groups", True)])
def test_a_sampler_added_from_docs_extending_alone_is_held_to_its_law(fast_cfg, tmp_path, monkeypatch, declared,
                                                                     stopped):
    """docs/extending.md's sampler (its one file and one YAML, as printed) runs a DP run under the schema it declares
    (b = 1: epochs reshuffle); the same file declaring the cyclic sampler's tighter b = G is stopped by the ledger."""
    import sys
    import types
    from pathlib import Path

    import yaml

    doc = (Path(__file__).resolve().parents[2] / "docs" / "extending.md").read_text()
    code = doc.split("`fedrun/epoch_sampler.py`:", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    node = yaml.safe_load(doc.split("`conf/sampler/epoch.yaml`", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0])
    assert "b=1)" in code
    module = types.ModuleType("fedrun.epoch_sampler")
    exec(code.replace("b=1)", f"{declared})"), module.__dict__)
    monkeypatch.setitem(sys.modules, "fedrun.epoch_sampler", module)
    c = OmegaConf.to_container(fast_cfg(*DP[:2], "dp=true", "epsilon=4", "delta=1e-5", "num_clients=12",
                                        "clipping_norm=0.05", "sampler=cyclic", "clients_per_round=4", "rounds=6"),
                               resolve=True)
    c["sampler"] = {"_target_": node["_target_"], "clients_per_round": 4}
    if stopped:
        with pytest.raises(CohortContractError, match=r"^sampler=epoch broke its declared participation law "
                                                      r"Schema\(k=2, b=3\)"):
            run(c, out_dir=tmp_path)
    else:
        assert run(c, out_dir=tmp_path)["rounds_completed"] == 6
