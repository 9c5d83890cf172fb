"""Client-batched layers (fedrun.models.batched): which models qualify, equality with the sequential
reference for every layer path, and per-sample clipped gradients against brute force.

Compared in float64 like tests/unit/test_training.py: the tolerance is tests/tolerance.py's round-off bound in
float64 with as terms the products summed into one gradient element (batch × output positions of the widest
convolution) times the steps.
"""

import numpy as np
import pytest
import torch
from torch import nn

from fedrun.models import FlatParams, build_model
from fedrun.models.batched import compile_sequential
from fedrun.training import ClientData, LocalSpec, Trainer
from tolerance import assert_f32_close

F64 = torch.float64


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 16), nn.Tanh(), nn.Linear(16, 10))


MODELS = {"lenet5": lambda: build_model("lenet5"), "fashion_cnn": lambda: build_model("fashion_cnn"),
          "femnist_cnn": lambda: build_model("femnist_cnn", num_classes=10), "mlp": _mlp}


def _data(n: int, clients: int, seed: int = 0) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 28, 28, generator=g, dtype=F64)
    y = torch.randint(0, 10, (n,), generator=g)
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, n), clients - 1, replace=False))
    return ClientData(x, y, [np.sort(p) for p in np.split(rng.permutation(n), cuts)])


def test_the_papers_conv_nets_and_plain_sequentials_qualify() -> None:
    for name, make in MODELS.items():
        m = make()
        assert compile_sequential(m, FlatParams(m).names) is not None, name


@pytest.mark.parametrize("make", [
    lambda: build_model("lr"),  # Flatten(0) at the end
    lambda: build_model("vgg16"),  # grey → RGB resize layer
    lambda: nn.Sequential(nn.Conv2d(2, 4, 3, groups=2), nn.Flatten(), nn.Linear(4 * 26 * 26, 10)),
    lambda: nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 8), nn.ReLU(inplace=True), nn.Linear(8, 10)),
    lambda: nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 8), nn.Dropout(0.5), nn.Linear(8, 10)),
    lambda: nn.Sequential(nn.Conv2d(1, 4, 3), nn.Linear(26, 10)),  # a linear layer on images
], ids=["lr", "vgg16", "grouped_conv", "inplace_relu", "dropout", "linear_on_images"])
def test_other_models_fall_back_to_vmap(make) -> None:
    m = make()
    assert compile_sequential(m, FlatParams(m).names) is None


def test_frozen_layers_fall_back_to_vmap() -> None:
    m = build_model("lenet5")
    head = FlatParams(m, trainable={"body.11.weight", "body.11.bias"})
    assert compile_sequential(m, head.names) is None
    assert Trainer(m, head, _data(20, 2), LocalSpec(), seed=0).batched is None


SPECS = {
    "sgd_l1_batch_clip": LocalSpec("sgd", steps=2, batch_size=4, lr=0.1, clip_norm=0.05, clip_ord=1),
    "sgd_per_sample": LocalSpec("sgd", steps=2, batch_size=4, lr=0.1, clip_norm=0.2, clip_mode="per_sample"),
    "gd_per_sample_l1": LocalSpec("gd", steps=2, lr=0.1, clip_norm=0.5, clip_mode="per_sample", clip_ord=1),
}


@pytest.mark.parametrize("spec", list(SPECS.values()), ids=list(SPECS))
@pytest.mark.parametrize("name", list(MODELS))
def test_batched_layers_equal_the_sequential_reference(name: str, spec: LocalSpec) -> None:
    torch.manual_seed(0)
    model = MODELS[name]().to(F64)
    lay = FlatParams(model)
    data = _data(n=10, clients=3)
    tr = Trainer(model, lay, data, spec, seed=3, chunk_size=2)
    assert tr.batched is not None
    p0 = lay.flatten(model)
    ids = np.arange(3)
    corr = 0.01 * torch.randn(3, lay.numel, dtype=F64)
    chunks = list(tr.train(p0, ids, 1, correction=corr))
    vec, vec_loss = torch.cat([c[1] for c in chunks]), torch.cat([c[2] for c in chunks])
    seq, seq_loss = tr.train_sequential(p0, ids, 1, correction=corr)
    fan = int(data.sizes.max()) * 28 * 28 * 2 * spec.steps
    assert_f32_close(vec, seq, p0, (seq - p0).abs(), terms=fan, probabilistic=True, dtype=F64, msg=name)
    assert_f32_close(vec_loss, seq_loss, seq_loss, terms=fan, probabilistic=True, dtype=F64)
    assert not torch.allclose(vec, p0.expand_as(vec))


def _brute_force(model, lay, p, x, y, weights, clip, ord):
    """Σ_i w_i · clip(∇ℓ_i) for one client, one sample at a time with autograd."""
    from torch.func import functional_call

    total = torch.zeros_like(p)
    norms = []
    for i in range(len(x)):
        q = p.clone().requires_grad_(True)
        out = functional_call(model, lay.unflatten(q), (x[i:i + 1],))
        (g,) = torch.autograd.grad(torch.nn.functional.cross_entropy(out, y[i:i + 1]), q)
        norm = g.norm(p=ord)
        norms.append(float(norm))
        total += weights[i] * g * min(1.0, clip / float(norm))
    return total, np.array(norms)


@pytest.mark.parametrize("ord", [2, 1])
@pytest.mark.parametrize("name", ["lenet5", "mlp"])
def test_per_sample_clipped_grad_matches_brute_force(name: str, ord: int) -> None:
    torch.manual_seed(1)
    model = MODELS[name]().to(F64)
    lay = FlatParams(model)
    engine = compile_sequential(model, lay.names)
    k, b = 2, 6
    p = lay.flatten(model).unsqueeze(0) + 0.05 * torch.randn(k, lay.numel, dtype=F64)
    x = torch.randn(k, b, 1, 28, 28, dtype=F64)
    y = torch.randint(0, 10, (k, b))
    w = torch.rand(k, b, dtype=F64)
    refs, norms = zip(*[_brute_force(model, lay, p[j], x[j], y[j], w[j], 1.0, ord) for j in range(k)])
    clip = float(np.median(np.concatenate(norms)))  # some samples clipped, some not
    refs = [_brute_force(model, lay, p[j], x[j], y[j], w[j], clip, ord)[0] for j in range(k)]

    def losses(out):
        return torch.nn.functional.cross_entropy(out.reshape(k * b, -1), y.reshape(-1), reduction="none").view(k, b)

    grads, per = engine.per_sample_clipped_grad(lay.unflatten(p), x, losses, w, clip, ord)
    got = torch.cat([grads[n].reshape(k, -1) for n in lay.names], 1)
    ref = torch.stack(refs)
    assert_f32_close(got, ref, ref.abs().max(), terms=b * 28 * 28 * 4, probabilistic=True, dtype=F64)
    assert per.shape == (k, b)
