"""Unit tests for paper 003's transfer-learning parts: the split, the payload formulas, the FbFTL server
trainer, and the cached source models. References are written out here (hand counts, the paper's own
numbers, a plain autograd loop through the whole model), not taken from the code under test."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedrun.data.dataset import Dataset
from fedrun.models.nets import build_model
from fedrun.schemes.transfer import FbFTL, FTLc, label_dtype
from fedrun.transfer import server as srv
from fedrun.transfer import source as src
from fedrun.transfer import split
from tolerance import assert_f32_close


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread is much faster than two on the busy 2-core machine
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------------ split
@pytest.mark.parametrize("name,choices,default", [("lenet5", [7, 9, 11], 9), ("femnist_cnn", [7], 7),
                                                   ("fashion_cnn", [7, 9], 7)])
def test_cut_choices_are_the_fully_connected_layers(name, choices, default):
    model = build_model(name, num_classes=10)
    assert split.linear_cut_choices(model) == choices
    assert split.check_cut(model, name, None) == default
    for c in choices:
        assert split.check_cut(model, name, c) == c


@pytest.mark.parametrize("cut", [0, 3, 8, 12, 99, -1, True, "9"])
def test_bad_cut_is_one_line_naming_value_and_allowed(cut):
    with pytest.raises(ValueError) as e:
        split.check_cut(build_model("lenet5", num_classes=10), "lenet5", cut)
    msg = str(e.value)
    assert "\n" not in msg and f"cut_layer={cut}" in msg and "allowed: 7, 9, 11" in msg


def test_model_without_cut_layer():
    with pytest.raises(ValueError, match="model=lr has no cut layer"):
        split.check_cut(build_model("lr", in_features=10), "lr", None)


def test_lenet5_split_sizes_by_hand():
    model = build_model("lenet5", num_classes=10)
    f1, f2 = split.split_names(model, 9)
    # f1: conv 1→6 (5x5), conv 6→16 (5x5), fc 400→120; f2: fc 120→84, fc 84→10
    assert split.numel_of(model, f1) == (6 * 25 + 6) + (16 * 6 * 25 + 16) + (400 * 120 + 120) == 50_692
    assert split.numel_of(model, f2) == (120 * 84 + 84) + (84 * 10 + 10) == 11_014
    assert set(f1) | set(f2) == {n for n, _ in model.named_parameters()} and not set(f1) & set(f2)
    x = torch.zeros(1, 1, 28, 28)
    assert split.feature_dim(model, 9, x) == 120 and split.feature_dim(model, 7, x) == 400
    assert split.feature_dim(build_model("femnist_cnn", num_classes=10), 7, x) == 64 * 7 * 7


def test_copy_extractor_copies_f1_only_and_checks_shapes():
    torch.manual_seed(0)
    source, target = build_model("lenet5", num_classes=62), build_model("lenet5", num_classes=10)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    copied = split.copy_extractor(target, source.state_dict(), 9)
    assert sorted(copied) == sorted(k for k in before if int(k.split(".")[1]) < 9)
    for k, v in target.state_dict().items():
        ref = source.state_dict()[k] if int(k.split(".")[1]) < 9 else before[k]
        assert torch.equal(v, ref), k
    wrong = {**source.state_dict(), "body.3.weight": torch.zeros(16, 6, 3, 3)}
    with pytest.raises(ValueError, match=r"body.3.weight has shape \(16, 6, 3, 3\)"):
        split.copy_extractor(target, wrong, 9)


def test_payload_formulas_against_hand_values_and_the_papers_fbftl_number():
    # The paper's FbFTL upload: 50,000 CIFAR-10 samples × 4096 VGG-16 features × 32 bits ≈ 6.6 Gb.
    assert split.fbftl_uplink_bits(50_000, 4096) == 50_000 * 4096 * 32
    assert round(split.fbftl_uplink_bits(50_000, 4096) / 1e9, 1) == 6.6
    assert split.fedavg_uplink_bits(100, 100.0, 61_706) == 100 * 100 * 32 * 61_706
    assert split.fedavg_downlink_bits(100, 11_014, 50_692) == 32 * (50_692 + 100 * 11_014)
    assert split.fbftl_downlink_bits(50_692) == 32 * 50_692
    assert split.upload_ratio(120 * 84 + 84 + 84 * 10 + 10, 120) == pytest.approx(91.78, abs=0.01)


@pytest.mark.parametrize("classes,dtype", [(2, torch.uint8), (10, torch.uint8), (62, torch.uint8),
                                           (256, torch.uint8), (257, torch.int16), (40_000, torch.int32)])
def test_label_dtype(classes, dtype):
    assert label_dtype(classes) == dtype


# ------------------------------------------------------------------------------------------- the server
def test_epoch_batches_is_a_permutation_in_batches():
    g = torch.Generator().manual_seed(3)
    b = srv.epoch_batches(10, 4, g)
    assert [len(x) for x in b] == [4, 4, 2]
    assert sorted(torch.cat(b).tolist()) == list(range(10))
    with pytest.raises(ValueError):
        srv.epoch_batches(10, 0, g)


def test_server_training_on_features_equals_centralised_ftl_c_for_same_batches():
    """Paper 003: FbFTL and FTL-c differ in the communication structure only, not the numerical process.
    Reference: plain autograd through the *whole* model on raw x with f¹ frozen (requires_grad off)."""
    torch.manual_seed(1)
    cut = 9
    model = build_model("lenet5", num_classes=10).double()  # in float64: round-off far below the math
    x, y = torch.randn(96, 1, 28, 28, dtype=torch.float64), torch.randint(0, 10, (96,))
    batches = srv.epoch_batches(96, 16, torch.Generator().manual_seed(0)) * 2  # two epochs, same order
    start = {name: p.detach().clone() for name, p in model.named_parameters()}

    ref = build_model("lenet5", num_classes=10).double()
    ref.load_state_dict(model.state_dict())
    for name, p in ref.named_parameters():
        p.requires_grad_(int(name.split(".")[1]) >= cut)
    opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.1, momentum=0.5)
    for idx in batches:
        loss = nn.functional.cross_entropy(ref(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()

    with torch.no_grad():
        z = model.features(x, cut)
    head = model.body[cut:]
    params = list(head.parameters())
    srv.sgd_epoch(head, params, z, y, batches, srv.make_optimizer(params, 0.1, momentum=0.5))
    # both paths' float64 round-off over 12 steps with momentum 0.5 (≤ 2× per step): a step sums a batch of 16
    # through the head (120 → 84 → 10) and back
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        assert_f32_close(a, b, start[name], (b - start[name]).abs(), terms=2 * 2 * 12 * (16 + 120 + 84 + 10),
                         probabilistic=True, dtype=torch.float64, msg=name)
    assert not torch.equal(model.body[9].weight, build_model("lenet5", num_classes=10).body[9].weight)


def test_tuning_picks_the_learning_rate_that_learns_and_leaves_the_head_alone():
    torch.manual_seed(0)
    z = torch.randn(400, 5)
    y = (z[:, 0] > 0).long()  # linearly separable on one feature
    head = nn.Sequential(nn.Linear(5, 2))
    before = [p.clone() for p in head.parameters()]
    best, scores = srv.tune_learning_rate(head, z, y, [1e-6, 0.5], epochs=3, batch_size=20,
                                          validation_fraction=0.25, momentum=0.0, weight_decay=0.0,
                                          generator=torch.Generator().manual_seed(0))
    assert best == 0.5 and scores[0.5] > 0.9 and scores[1e-6] < scores[0.5]
    assert all(torch.equal(a, b) for a, b in zip(before, head.parameters()))
    with pytest.raises(ValueError):
        srv.tune_learning_rate(head, z, y, [], epochs=1, batch_size=8, validation_fraction=0.1, momentum=0.0,
                               weight_decay=0.0, generator=torch.Generator())


def test_intra_op_threads_restores():
    before = torch.get_num_threads()
    with srv.intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


# ------------------------------------------------------------------------------------- source models
def _toy_dataset(n: int = 160, classes: int = 4, seed: int = 0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.randn(n, 1, 28, 28, generator=g) * 0.1
    for i, c in enumerate(y.tolist()):  # a bright 8x8 block in one quadrant per class
        r, q = 2 + (c // 2) * 14, 2 + (c % 2) * 14
        x[i, 0, r:r + 8, q:q + 8] += 2.0
    return Dataset(name="mnist", x_train=x, y_train=y, x_test=x[:40], y_test=y[:40], task="classification",
                   num_classes=classes, source="toy")


@pytest.mark.parametrize("kwargs,message", [
    ({"dataset": "cifar10"}, "source_dataset='cifar10' is unknown; allowed: femnist, mnist, fashion_mnist, imagenet"),
    ({"dataset": "imagenet"}, "source_dataset=imagenet needs model=vgg16"),
    ({"epochs": 0}, "source_epochs=0"),
    ({"lr": 0.0}, "source_lr=0.0"),
    ({"momentum": 1.0}, "source_momentum=1.0"),
    ({"max_samples": 0}, "source_max_samples=0"),
])
def test_source_spec_errors_are_one_line(kwargs, message):
    args = {"dataset": "femnist", "model": "lenet5", **kwargs}
    with pytest.raises(ValueError) as e:
        src.SourceSpec(**args)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_source_key_depends_on_everything_that_sets_the_weights():
    base = src.SourceSpec("mnist", "lenet5")
    k = src.source_key(base, 10, "abc")
    assert k == src.source_key(src.SourceSpec("mnist", "lenet5"), 10, "abc")
    variants = [src.source_key(base, 10, "abd"), src.source_key(base, 62, "abc")]
    for field, value in [("epochs", 4), ("batch_size", 32), ("lr", 0.01), ("momentum", 0.5), ("weight_decay", 1e-4),
                         ("seed", 1), ("max_samples", 100), ("model", "femnist_cnn"), ("dataset", "femnist")]:
        variants.append(src.source_key(src.SourceSpec(**{**base.__dict__, field: value}), 10, "abc"))
    assert len(set(variants + [k])) == len(variants) + 1


def test_data_fingerprint_sees_labels_and_inputs():
    d = _toy_dataset()
    f = src.data_fingerprint(d.y_train, d.x_train)
    y2 = d.y_train.clone()
    y2[0] = (y2[0] + 1) % 4
    x2 = d.x_train.clone()
    x2[0] += 1
    assert f != src.data_fingerprint(y2, d.x_train) and f != src.data_fingerprint(d.y_train, x2)


def test_source_is_trained_once_cached_atomically_and_retrained_on_new_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDRUN_CACHE", str(tmp_path))
    data = _toy_dataset()
    spec = src.SourceSpec("mnist", "lenet5", epochs=4, batch_size=16, lr=0.05)
    make = lambda k: build_model("lenet5", num_classes=k)  # noqa: E731
    first = src.load_or_train(spec, make, dataset=data)
    assert not first.cached and first.path.is_file() and first.path.parent == tmp_path / "source_models"
    assert first.info["test_accuracy"] > 0.5  # 4 classes: chance is 0.25
    assert not [p for p in first.path.parent.iterdir() if p.suffix == ".tmp"]
    again = src.load_or_train(spec, make, dataset=data)
    assert again.cached and again.key == first.key
    assert all(torch.equal(again.state_dict[k], first.state_dict[k]) for k in first.state_dict)
    other = src.load_or_train(src.SourceSpec("mnist", "lenet5", epochs=1, batch_size=16), make, dataset=data)
    assert not other.cached and other.path != first.path
    # a corrupt file, or one whose stored key differs, is retrained (not trusted)
    first.path.write_bytes(b"not a checkpoint")
    assert not src.load_or_train(spec, make, dataset=data).cached
    blob = torch.load(first.path, weights_only=True)
    torch.save({**blob, "key": "something else"}, first.path)
    assert not src.load_or_train(spec, make, dataset=data).cached


def test_source_training_is_deterministic_from_its_seed(tmp_path):
    data = _toy_dataset()
    states = []
    for _ in range(2):
        torch.manual_seed(123)
        m = build_model("lenet5", num_classes=4)
        src.train_source(m, data.x_train, data.y_train, src.SourceSpec("mnist", "lenet5", epochs=1, batch_size=32))
        states.append(m.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_missing_imagenet_weights_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(ValueError) as e:
        src.imagenet_weights_file("vgg16")
    msg = str(e.value)
    assert "\n" not in msg and "vgg16-397923af.pth" in msg and "does not download" in msg
    with pytest.raises(ValueError, match="vgg16-397923af.pth"):
        FTLc(source_dataset="imagenet")  # fails at construction, before any data or model work


def test_imagenet_weights_are_renamed_into_the_vgg16_body(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    ckpt = Path(tmp_path / "torch" / "hub" / "checkpoints")
    ckpt.mkdir(parents=True)
    fake = {"features.0.weight": torch.ones(2), "features.28.bias": torch.zeros(3), "classifier.3.weight": torch.ones(1)}
    torch.save(fake, ckpt / "vgg16-397923af.pth")
    loaded = src.load_or_train(src.SourceSpec("imagenet", "vgg16"), make_model=None)
    assert set(loaded.state_dict) == {"body.1.weight", "body.29.bias", "body.36.weight"}
    assert loaded.cached and loaded.info["num_classes"] == 1000


def test_scheme_constructor_errors():
    # a scheme's constructor raises ValueError for a bad setting (fedrun.run reports it as a ConfigError); the
    # source dataset is checked by fedrun.transfer.source, which raises ValueError too
    with pytest.raises(ValueError, match="source_dataset='svhn' is unknown"):
        FTLc(source_dataset="svhn")
    with pytest.raises(ValueError, match="cut_layer='x'"):
        FTLc(cut_layer="x")
    with pytest.raises(ValueError, match="server_batch_size=0"):
        FbFTL(server_batch_size=0)
    with pytest.raises(ValueError, match="tune_lrs"):
        FbFTL(tune_lrs=[])
    with pytest.raises(ValueError, match="epochs_per_round=0"):
        FbFTL(epochs_per_round=0)
    assert math.isclose(FbFTL(server_lr=0.3).head_lr, 0.3)
    # FbFTL's server_lr / server_momentum are its head optimizer's (head_lr, head_momentum), not the FedAvg server's
    assert np.isfinite(FbFTL().head_momentum)
    assert FbFTL(server_momentum=0.5).head_momentum == 0.5
