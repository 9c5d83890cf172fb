"""Checkpoints that cost little: sparse per-client state and the checkpoint schedule.

* ``ClientState`` keeps rows only for the clients that have been set: absent clients read as zeros, its
  ``state_dict`` holds those clients' ids and rows (so a checkpoint grows with the clients touched, not with
  num_clients), and it gives exactly what the former dense [num_clients, dim] store gave, round after round.
* ``CheckpointSchedule``: ``checkpoint_every=auto`` saves after round 1, then as often as keeps the time spent
  saving (a final save included, each predicted from the last, scaled by the state's growth) within 5 % of the
  run's: about one save per 20 save durations (an injected clock here); ``k`` every k rounds, 0 never.
* The runner with ``auto``: saves (and flushes metrics) at round 1 and the last round, and a run interrupted after
  a round resumes from its checkpoint to the uninterrupted run's exact state.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import itertools

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import fedrun.checkpoint as checkpoint_module
from fedrun.checkpoint import AUTO_SHARE, CHECKPOINT, CheckpointSchedule, load_into
from fedrun.config import ConfigError
from fedrun.run import LoopState, RunInterrupted, build, prepare, run_rounds
from fedrun.schemes.sketchedsgd import ERROR, MOMENTUM
from fedrun.simulation import ClientState
from fedrun.tracking import NullTracker

from conftest import FAST, compose


class DenseClientState:
    """The former store (one dense [num_clients, dim] tensor per name): the reference the sparse one must equal."""

    def __init__(self, num_clients, device):
        self.num_clients, self.device, self._store = int(num_clients), device, {}

    _rows = property(lambda self: self._store)  # what ClientState's view and commit read, through get and set
    _ids, view, commit = ClientState._ids, ClientState.view, ClientState.commit

    def get(self, name, ids, dim):
        if name not in self._store:
            self._store[name] = torch.zeros(self.num_clients, int(dim), device=self.device)
        return self._store[name][torch.as_tensor(ids, device=self.device)]

    def set(self, name, ids, values):
        if name not in self._store:
            self._store[name] = torch.zeros(self.num_clients, values.shape[1], device=self.device)
        self._store[name][torch.as_tensor(ids, device=self.device)] = values


def _saved_bytes(obj) -> int:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.tell()


# ------------------------------------------------------------------------------------------ ClientState
def test_absent_clients_read_as_zeros_and_set_rows_read_back():
    cs = ClientState(10, torch.device("cpu"))
    assert torch.equal(cs.get("e", np.array([3, 7]), 4), torch.zeros(2, 4))  # nothing stored yet
    rows = torch.arange(8, dtype=torch.float32).reshape(2, 4) + 1
    cs.set("e", np.array([7, 2]), rows)
    got = cs.get("e", np.array([2, 5, 7]), 4)
    assert torch.equal(got, torch.stack([rows[1], torch.zeros(4), rows[0]]))
    got.add_(100.0)  # a caller changes what get returned (the schemes do): the store is unchanged until set
    assert torch.equal(cs.get("e", np.array([7]), 4), rows[:1])
    assert list(cs.clients("e")) == [7, 2] and len(cs.clients("other")) == 0


def test_memory_holds_the_touched_clients_only():
    # a dense [num_clients, dim] allocation would be 4 TB here
    cs = ClientState(1_000_000, torch.device("cpu"))
    dim = 1_000_000
    ids = np.array([5, 999_999, 123_456])
    cs.set("m", ids, torch.ones(3, dim))
    assert torch.equal(cs.get("m", np.array([999_999, 6]), dim), torch.stack([torch.ones(dim), torch.zeros(dim)]))
    assert cs.nbytes() == 3 * dim * 4
    assert cs._rows["m"].numel() <= 16 * dim  # grown by doubling from 16 rows: never num_clients rows


def test_random_gets_and_sets_equal_the_dense_store_and_round_trip_through_state_dict():
    rng = np.random.default_rng(0)
    n_clients, dim = 50, 7
    sparse, dense = ClientState(n_clients, torch.device("cpu")), DenseClientState(n_clients, torch.device("cpu"))
    for step in range(60):
        name = ("u", "v")[step % 2]
        ids = rng.choice(40, size=int(rng.integers(1, 12)), replace=False)  # clients 40–49 are never set
        a, b = sparse.get(name, ids, dim), dense.get(name, ids, dim)
        assert torch.equal(a, b)
        delta = torch.from_numpy(rng.standard_normal((len(ids), dim)).astype(np.float32))
        sparse.set(name, ids, a.mul_(0.9).add_(delta))
        dense.set(name, ids, b.mul_(0.9).add_(delta))
    everyone = np.arange(n_clients)
    state = copy.deepcopy(sparse.state_dict())
    for name in ("u", "v"):
        held = state[name]["ids"].numpy()
        assert len(held) < n_clients  # some clients were never drawn: not saved
        assert torch.equal(state[name]["rows"], dense.get(name, held, dim))
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    restored = ClientState(n_clients, torch.device("cpu"))
    restored.load_state_dict(torch.load(buf, weights_only=False))
    for name in ("u", "v"):
        assert torch.equal(restored.get(name, everyone, dim), dense.get(name, everyone, dim))
    # a restored store keeps working: new clients get rows, old ones keep theirs
    restored.set("u", np.array([0, 1]), torch.full((2, dim), 3.0))
    dense.set("u", np.array([0, 1]), torch.full((2, dim), 3.0))
    assert torch.equal(restored.get("u", everyone, dim), dense.get("u", everyone, dim))


def test_checkpoint_size_grows_with_touched_clients_not_num_clients():
    dim = 1000

    def size(num_clients: int, touched: int) -> int:
        cs = ClientState(num_clients, torch.device("cpu"))
        for name in ("u", "v"):
            cs.get(name, np.arange(touched), dim)  # reading alone stores nothing
            cs.set(name, np.arange(touched), torch.ones(touched, dim))
        return _saved_bytes(cs.state_dict())

    rows = 2 * 10 * dim * 4
    small, huge = size(100, 10), size(100_000, 10)
    assert rows <= small < rows + 4096 and huge == small
    assert size(100_000, 20) >= small + rows  # 10 more clients: 10 more rows per name


def test_saved_rows_are_only_the_rows_in_use():
    # torch.save writes a view's whole storage: the spare capacity of the doubled buffer must not go with it
    cs = ClientState(1000, torch.device("cpu"))
    cs.set("u", np.arange(17), torch.ones(17, 100))  # capacity 34 rows after growth
    assert _saved_bytes(cs.state_dict()) < 17 * 100 * 4 + 2048


# ------------------------------------------------------------------------------------------ schedule
class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_auto_saves_after_round_one_then_within_five_percent_of_the_time():
    clock = FakeClock()
    s = CheckpointSchedule("auto", clock=clock)
    assert s.enabled and s.auto and AUTO_SHARE == 0.05
    clock.now += 1.0  # round 1
    assert s.due(1)  # no save measured yet: save after the first round
    with s.timed():
        clock.now += 2.0  # the save takes 2 s
    assert s.last_cost == 2.0 and s.seconds == 2.0
    # next: saved 2 s + this 2 s + the final 2 s <= 5 % of (elapsed + 2 s), i.e. elapsed >= 118 s
    clock.now = 117.9
    assert not s.due(2)
    clock.now = 118.0
    assert s.due(3)


def test_auto_predicts_a_save_from_the_state_growth_since_the_last():
    clock = FakeClock()
    s = CheckpointSchedule("auto", clock=clock)
    with s.timed(100):  # 100 bytes of state: 1 s
        clock.now += 1.0
    # the same size: due once 1 + 2 × 1 <= 5 % of (elapsed + 1), at elapsed 59 s
    clock.now = 59.0
    assert s.due(2, 100)
    # 10× the state since (more clients took part): a save now would take ~10 s, not 1 s
    assert s.predicted(1000) == 10.0
    assert not s.due(2, 1000)
    clock.now = 410.0  # 1 + 2 × 10 <= 5 % of (410 + 10)
    assert s.due(3, 1000)


def _simulate(rounds: int, round_s, save_s, nbytes=lambda r: None, check_each: bool = True) -> CheckpointSchedule:
    """A run of ``rounds`` rounds under auto (the runner's rule: a save when due and at the last round)."""
    clock = FakeClock()
    s = CheckpointSchedule("auto", clock=clock)
    for rnd in range(1, rounds + 1):
        clock.now += round_s(rnd)
        if s.due(rnd, nbytes(rnd)) or rnd == rounds:
            with s.timed(nbytes(rnd)):
                clock.now += save_s(rnd)
            if check_each and s.saves > 1 and rnd < rounds:  # each save after the first leaves room for the last
                assert s.seconds + s.last_cost <= AUTO_SHARE * (clock.now - s.start) + 1e-9
    return s


def _share(s: CheckpointSchedule) -> float:
    return s.seconds / (s.clock() - s.start)


def test_auto_keeps_saving_within_five_percent_of_the_run():
    # 1.5 GB of dense client state: 7 s a save, 0.5 s a round (saving every round: 93 % of the run)
    s = _simulate(2000, lambda r: 0.5, lambda r: 7.0)
    assert s.saves >= 5 and _share(s) <= AUTO_SHARE
    # cheap saves: every round, as checkpoint_every=1
    s = _simulate(50, lambda r: 1.0, lambda r: 0.01)
    assert s.saves == 50
    # saves that take longer or shorter than the one before them (a busy disk)
    s = _simulate(3000, lambda r: 0.2 + 0.1 * (r % 3), lambda r: 1.0 + r % 2, check_each=False)
    assert s.saves >= 5 and _share(s) <= AUTO_SHARE
    # a state that grows as clients take part (1 % new a round, 3 s a save when all have state): the sizes given
    # keep each save within the budget
    size = lambda r: 1 - 0.99 ** r  # noqa: E731
    s = _simulate(5000, lambda r: 0.3, lambda r: 0.05 + 3.0 * size(r), nbytes=lambda r: int(1e9 * size(r)))
    assert s.saves >= 5 and _share(s) <= AUTO_SHARE


def test_integer_and_zero_schedules_ignore_the_clock():
    clock = FakeClock()
    every3 = CheckpointSchedule(3, clock=clock)
    assert [r for r in range(1, 10) if every3.due(r)] == [3, 6, 9]
    with every3.timed():
        clock.now += 100.0  # a slow save changes nothing
    assert every3.due(12) and not every3.due(13)
    for off in (0, None):
        s = CheckpointSchedule(off, clock=clock)
        assert not s.enabled and not any(s.due(r) for r in range(1, 5))


def _resolved(overrides: list[str]) -> dict:
    return OmegaConf.to_container(compose(overrides), resolve=True)


def test_the_default_is_auto():
    assert _resolved([])["checkpoint_every"] == "auto"


@pytest.mark.parametrize("value", ["auto", 0, 1, 7, None])
def test_checkpoint_every_accepts_auto_and_integers(value):
    c = _resolved(["tracking=none"])
    c["checkpoint_every"] = value
    prepare(c)  # resolves the defaults, then validates


@pytest.mark.parametrize("value", ["sometimes", -1, 2.5, True])
def test_checkpoint_every_rejects_other_values_in_one_line(value):
    c = _resolved(["tracking=none"])
    c["checkpoint_every"] = value
    with pytest.raises(ConfigError) as exc:
        prepare(c)
    msg = str(exc.value)
    shown = "true" if value is True else repr(value)  # as typed on the command line
    assert f"checkpoint_every={shown}" in msg and "auto" in msg and ">= 0" in msg and "\n" not in msg


# ------------------------------------------------------------------------------------------ the runner
#: SketchedSGD (momentum and error per worker) on 4 of 20 clients a round: most clients never hold state
RUN = ["dataset=mnist", "model=lenet5", "scheme=sketchedsgd", "local_steps=1", "sampler=uniform", "num_clients=20",
       "clients_per_round=4", "rounds=3", "eval_every=3", "batch_size=10", "workers=1", "checkpoint_every=auto"]


class RecordingTracker(NullTracker):
    """What reached the tracker, and when (the saves seen so far at each log)."""

    def __init__(self, saves: list[int]) -> None:
        self.steps: list[int] = []
        self.saves_seen: list[int] = []
        self._saves = saves

    def log_metrics(self, metrics, step):
        self.steps.append(int(step))
        self.saves_seen.append(len(self._saves))

    def last_step(self, metric):
        return max(self.steps, default=0)


def _overrides(*extra: str) -> list[str]:
    """FAST, then RUN, then ``extra``: one value per key (the last given), as Hydra wants."""
    out: dict[str, str] = {}
    for o in [*FAST, *RUN, *extra]:
        out[o.split("=")[0]] = o
    return list(out.values())


@pytest.fixture
def one_thread(_few_threads):
    """Rounds of a 4-client LeNet-5 are too small for two threads: one is ~9x faster on a busy 2-core machine."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(2)


@pytest.fixture
def tiny_mnist(one_thread, _datasets_loaded_once, monkeypatch):
    """run.build loads the first 400 / 100 MNIST samples (views of the session's Dataset): builds and evaluations
    take milliseconds, the federation is still 20 clients."""
    import fedrun.run as run_module

    loaded = run_module.load_dataset

    def cut(name, *args, **kwargs):
        d = loaded(name, *args, **kwargs)
        return dataclasses.replace(d, x_train=d.x_train[:400], y_train=d.y_train[:400], x_test=d.x_test[:100],
                                   y_test=d.y_test[:100], groups_train=None, groups_test=None)

    monkeypatch.setattr(run_module, "load_dataset", cut)


@pytest.fixture
def run_cfg(shared_data, tiny_mnist):
    c = _resolved(_overrides(f"data_root={shared_data}"))
    prepare(c)
    return c


def _spy_saves(monkeypatch, saves: list[int], clock=None, sizes: list | None = None):
    """Record the rounds saved; with ``clock``, the runner's schedule runs on it (and ``sizes`` gets the state
    sizes the runner gives it)."""
    original = checkpoint_module.save_checkpoint

    def spy(out_dir, built, loop, run_id, finished=False):
        saves.append(loop.round)
        return original(out_dir, built, loop, run_id, finished)

    monkeypatch.setattr(checkpoint_module, "save_checkpoint", spy)

    class Recorded(CheckpointSchedule):
        def due(self, rnd, nbytes=None):
            sizes.append(nbytes)
            return super().due(rnd, nbytes)

    if clock is not None:
        monkeypatch.setattr(checkpoint_module, "CheckpointSchedule", lambda every: Recorded(every, clock=clock))


def _rows(loop):
    return [{k: v for k, v in r.items() if k != "round_seconds"} for r in loop.rows]


def test_auto_saves_at_round_one_and_the_last_round_with_metrics_first(run_cfg, tmp_path, monkeypatch):
    saves: list[int] = []
    ticks = itertools.count()
    sizes: list = []
    _spy_saves(monkeypatch, saves, clock=lambda: float(next(ticks)), sizes=sizes)  # a save and a round: 1 tick
    tracker = RecordingTracker(saves)
    built = build(run_cfg)
    run_rounds(built, tracker, tmp_path, LoopState())
    assert saves == [1, 3]
    assert tracker.steps == [1, 2, 3]
    assert tracker.saves_seen == [0, 1, 1]  # each round's metrics reached the tracker before its checkpoint
    # the schedule sees the state grow as new clients get momentum and error rows (its save-time prediction)
    row = 2 * built.sim.n * 4
    assert sizes[0] == built.sim.n * 4 + 4 * row and sizes[-1] > sizes[0] and sizes == sorted(sizes)


def test_interrupted_run_resumes_to_the_uninterrupted_state(run_cfg, tmp_path, monkeypatch):
    saves: list[int] = []
    _spy_saves(monkeypatch, saves)
    everyone = np.arange(20)
    whole_dir, cut_dir = tmp_path / "whole", tmp_path / "cut"
    whole_dir.mkdir(), cut_dir.mkdir()

    whole = build(run_cfg)
    whole_loop = LoopState()
    run_rounds(whole, NullTracker(), whole_dir, whole_loop)

    first = build(run_cfg)
    loop = LoopState()

    class StopAfterRound2:  # what StopFlag holds after a SIGTERM during round 2
        @property
        def requested(self):
            return loop.round >= 2

    saves.clear()
    with pytest.raises(RunInterrupted):
        run_rounds(first, RecordingTracker(saves), cut_dir, loop, stop=StopAfterRound2())
    assert saves[-1] == 2
    state = torch.load(cut_dir / CHECKPOINT, weights_only=False)
    for name in (MOMENTUM, ERROR):
        ids = state["client_state"][name]["ids"]
        assert 4 <= len(ids) <= 8 < 20  # the clients of rounds 1–2 only
        assert state["client_state"][name]["rows"].shape == (len(ids), first.sim.n)

    resumed = build(run_cfg)
    loop2 = LoopState()
    load_into(cut_dir / CHECKPOINT, resumed, loop2)
    assert loop2.round == 2
    tracker = RecordingTracker(saves)
    tracker.steps = [1, 2]  # what the interrupted run had logged
    run_rounds(resumed, tracker, cut_dir, loop2)
    assert tracker.steps == [1, 2, 3]
    assert torch.equal(resumed.sim.params, whole.sim.params)
    for name in (MOMENTUM, ERROR):
        assert torch.equal(resumed.sim.client_state.get(name, everyone, whole.sim.n),
                           whole.sim.client_state.get(name, everyone, whole.sim.n))
    assert _rows(loop2) == _rows(whole_loop)


@pytest.mark.parametrize("scheme", ["sketchedsgd", "fedsketchgate"])
def test_sparse_state_gives_the_dense_stores_rounds_bit_for_bit(scheme, shared_data, tiny_mnist):
    over = [f"data_root={shared_data}", f"scheme={scheme}", "num_clients=6", "clients_per_round=3"]
    if scheme == "fedsketchgate":
        over += ["sampler=all", "local_steps=2"]
    c = compose(_overrides(*over))
    sparse, dense = build(c).sim, build(c).sim
    dense.client_state = DenseClientState(dense.num_clients, dense.device)
    for rnd in range(1, 4):
        for sim in (sparse, dense):
            sim.run_round(rnd)
        assert torch.equal(sparse.params, dense.params), rnd
    assert sparse.client_state._rows  # the scheme did keep client state
