"""Vectorized local training equals the sequential reference; batch plans are sound.

The two training paths are compared in float64 (model, data and parameters), where their round-off is far
below any difference in the math, so the tolerance holds on any CPU kernel: the probabilistic round-off bound
of tests/tolerance.py in float64, with as terms the products summed into one gradient element (batch × output
positions of LeNet-5's first convolution (padded: 28² outputs), 8 × 28² = 6272 at most) times the steps, for
both paths.
"""

import numpy as np
import pytest
import torch

from fedrun.models import FlatParams, build_model
from fedrun.training import ClientData, LocalSpec, Trainer, batch_plan
from tolerance import assert_f32_close, f32_tol

F64 = torch.float64
LENET_FAN = 8 * 28 * 28  # products in a gradient element of LeNet-5's first convolution: batch 8 × 28² positions


def _data(n=400, clients=12, regression=False, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    if regression:
        x = torch.randn(n, 10, generator=g)
        y = x @ torch.randn(10, generator=g) + 0.1 * torch.randn(n, generator=g)
        y = y.to(dtype)
    else:
        x = torch.randn(n, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (n,), generator=g)
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, n), clients - 1, replace=False))
    parts = np.split(rng.permutation(n), cuts)
    parts[0] = parts[0][:3]  # a client smaller than the batch size
    return ClientData(x.to(dtype), y, [np.sort(p) for p in parts])


def _assert_paths_agree(vec, seq, p0, steps: int, fan: int, msg: str = "") -> None:
    """float64 vectorized vs sequential local models: both paths' round-off, at the scale of p0 and the update."""
    assert vec.dtype == seq.dtype == F64
    assert_f32_close(vec, seq, p0, (seq - p0).abs(), terms=2 * steps * fan, probabilistic=True, dtype=F64, msg=msg)


# small on purpose: float64 LeNet-5 is slow on a CPU, and 6 clients × 2–3 steps exercise every path (chunks,
# a client smaller than the batch, batch clipping, full batch) as well as more would
@pytest.mark.parametrize("spec", [
    LocalSpec("sgd", steps=3, batch_size=8, lr=0.05),
    LocalSpec("sgd", steps=3, batch_size=16, lr=0.05, clip_norm=0.5),
    LocalSpec("gd", steps=2, batch_size=1, lr=0.05, clip_norm=1.0),
])
@pytest.mark.parametrize("batched", [True, False], ids=["batched_layers", "vmap"])
def test_vectorized_equals_sequential(spec, batched):
    torch.manual_seed(0)
    model = build_model("lenet5").to(F64)
    lay = FlatParams(model)
    data = _data(n=120, clients=6, dtype=F64)
    tr = Trainer(model, lay, data, spec, seed=11, chunk_size=4, batched=batched)
    assert (tr.batched is not None) == batched  # LeNet-5 qualifies for the client-batched layers
    p0 = lay.flatten(model)
    ids = np.arange(data.num_clients)
    chunks = list(tr.train(p0, ids, rnd=3))
    assert [len(c[0]) for c in chunks] == [3, 3]  # balanced chunks of at most chunk_size
    vec = torch.cat([c[1] for c in chunks])
    vec_loss = torch.cat([c[2] for c in chunks])
    seq, seq_loss = tr.train_sequential(p0, ids, rnd=3)
    _assert_paths_agree(vec, seq, p0, spec.steps, LENET_FAN)
    # the mean loss over the steps: a sum of 10 logits' worth of the same products per sample
    assert_f32_close(vec_loss, seq_loss, seq_loss, terms=2 * spec.steps * LENET_FAN, probabilistic=True, dtype=F64)
    assert not torch.allclose(vec, p0.expand_as(vec))  # training moved the models


def test_correction_is_subtracted_from_gradients():
    model = build_model("lr").to(F64)
    lay = FlatParams(model)
    data = _data(regression=True, dtype=F64)
    spec = LocalSpec("gd", steps=2, batch_size=1, lr=0.1, loss="mse")
    tr = Trainer(model, lay, data, spec, seed=0, chunk_size=4)
    p0 = lay.flatten(model)
    ids = np.arange(6)
    corr = torch.randn(6, lay.numel, dtype=F64)
    vec = torch.cat([c[1] for c in tr.train(p0, ids, 0, corr)])
    seq, _ = tr.train_sequential(p0, ids, 0, corr)
    # full batch: a gradient element sums a client's samples × 10 features
    _assert_paths_agree(vec, seq, p0 + 0.1 * 2 * corr.abs(), spec.steps, int(data.sizes.max()) * 10)
    plain, _ = tr.train_sequential(p0, ids, 0)
    # with a linear model, x ← x − η(g − c) shifts by at least the first step's η·c
    assert (vec - plain).abs().max() > 0.05


def test_batch_plan_draws_within_client_without_replacement():
    data = _data()
    spec = LocalSpec("sgd", steps=6, batch_size=10, lr=0.1)
    ids = np.array([0, 4, 7])
    idx, mask = batch_plan(data, ids, spec, seed=1, rnd=2)
    assert idx.shape == (3, 6, 10)
    for row, cid in enumerate(ids):
        part = set(data.parts[cid].tolist())
        used = idx[row][mask[row] > 0].tolist()
        assert set(used) <= part
        n_k = len(part)
        b = min(10, n_k)
        assert int(mask[row].sum()) == 6 * b
        flat = idx[row, :, :b].reshape(-1).tolist()
        # within each epoch (n_k consecutive draws) no sample repeats
        for s in range(0, len(flat) - n_k + 1, n_k):
            assert len(set(flat[s:s + n_k])) == n_k
    again, _ = batch_plan(data, ids[::-1], spec, seed=1, rnd=2)
    assert torch.equal(again.flip(0), idx)  # a client's batches do not depend on who else is selected
    other, _ = batch_plan(data, ids, spec, seed=1, rnd=3)
    assert not torch.equal(other, idx)


def test_full_batch_plan_covers_all_samples():
    data = _data()
    idx, mask = batch_plan(data, [0, 1], LocalSpec("gd", steps=3), seed=0, rnd=1)
    assert idx.shape[1] == 1
    for row, cid in enumerate([0, 1]):
        assert sorted(idx[row, 0][mask[row, 0] > 0].tolist()) == sorted(data.parts[cid].tolist())


def test_spec_validation():
    with pytest.raises(ValueError, match="lr=0"):
        LocalSpec(lr=0)
    with pytest.raises(ValueError, match="mode='adam'"):
        LocalSpec(mode="adam")
    with pytest.raises(ValueError, match="clip_norm=-1"):
        LocalSpec(clip_norm=-1)


@pytest.mark.parametrize("mode", ["sgd", "gd"])
@pytest.mark.parametrize("batched", [True, False], ids=["batched_layers", "vmap"])
def test_per_sample_clipping_vectorized_equals_sequential(mode, batched):
    torch.manual_seed(0)
    model = build_model("lenet5").to(F64)
    lay = FlatParams(model)
    data = _data(n=60, clients=5, dtype=F64)
    spec = LocalSpec(mode, steps=2, batch_size=8, lr=0.1, clip_norm=0.3, clip_mode="per_sample")
    tr = Trainer(model, lay, data, spec, seed=2, chunk_size=3, batched=batched)
    assert (tr.batched is not None) == batched
    p0 = lay.flatten(model)
    ids = np.arange(5)
    vec = torch.cat([c[1] for c in tr.train(p0, ids, 1)])
    seq, _ = tr.train_sequential(p0, ids, 1)
    # gd: a client's whole data in one batch (≤ 60 samples × 28² positions)
    _assert_paths_agree(vec, seq, p0, 2, (LENET_FAN if mode == "sgd" else int(data.sizes.max()) * 28 * 28))
    # each step moves a client by at most lr · clip (mean of vectors of norm ≤ clip), up to the round-off of
    # 2 steps of p − lr·g (≤ |p| each, in L2 ≤ ‖p0‖ + the bound), vec − p0, and the norm over n coordinates
    bound = 2 * 0.1 * 0.3
    tol = f32_tol(p0.norm() + bound, terms=2 + 1 + int(np.log2(lay.numel)) + 2, dtype=F64)
    assert ((vec - p0).norm(dim=1) <= bound + tol).all()
    batch = Trainer(model, lay, data, LocalSpec(mode, steps=2, batch_size=8, lr=0.1, clip_norm=0.3), seed=2)
    assert not torch.allclose(torch.cat([c[1] for c in batch.train(p0, ids, 1)]), vec)


def test_l1_per_sample_clipping_matches_sequential():
    model = build_model("lr").to(F64)
    lay = FlatParams(model)
    data = _data(n=120, clients=4, regression=True, dtype=F64)
    spec = LocalSpec("gd", steps=3, lr=0.1, clip_norm=0.5, clip_mode="per_sample", clip_ord=1, loss="mse")
    tr = Trainer(model, lay, data, spec, seed=0)
    p0 = lay.flatten(model)
    vec = torch.cat([c[1] for c in tr.train(p0, np.arange(4), 1)])
    seq, _ = tr.train_sequential(p0, np.arange(4), 1)
    _assert_paths_agree(vec, seq, p0, spec.steps, int(data.sizes.max()) * 10)
    # each of the 3 steps moves the model by at most lr · clip in L1, up to the round-off of 3 steps of
    # p − lr·g, vec − p0 and a sum of n = 11 terms
    bound = 3 * 0.1 * 0.5
    tol = f32_tol(p0.abs().sum() + bound, terms=3 + 1 + lay.numel, dtype=F64)
    assert ((vec - p0).abs().sum(1) <= bound + tol).all()


def test_worker_threads_give_identical_results():
    torch.manual_seed(0)
    model = build_model("lenet5").to(F64)
    lay = FlatParams(model)
    data = _data(dtype=F64)
    spec = LocalSpec("sgd", steps=3, batch_size=8, lr=0.05)
    p0 = lay.flatten(model)
    ids = np.arange(data.num_clients)
    one = Trainer(model, lay, data, spec, seed=5, chunk_size=64, workers=1)
    two = Trainer(model, lay, data, spec, seed=5, chunk_size=64, workers=2)
    a = list(one.train(p0, ids, 2))
    b = list(two.train(p0, ids, 2))
    assert len(a) == 1 and [len(c[0]) for c in b] == [6, 6]
    # the same math; chunks of 12 on 2 threads vs 6 + 6 on 1 thread each may sum in other orders
    _assert_paths_agree(torch.cat([c[1] for c in a]), torch.cat([c[1] for c in b]), p0, spec.steps, LENET_FAN)
    assert np.array_equal(np.concatenate([c[0] for c in b]), ids)
    assert torch.get_num_threads() == 2  # restored after the parallel section
