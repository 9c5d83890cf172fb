import pytest
import torch

from fedrun.models import FlatParams, build_model
from fedrun.models.nets import num_parameters


@pytest.mark.parametrize("name,count", [("lenet5", 61_706), ("femnist_cnn", 214_590), ("fashion_cnn", 114_314),
                                        ("fashion_cnn_1m", 1_023_818), ("lr", 11)])
def test_parameter_counts(name, count):
    kwargs = {"num_classes": 62} if name == "femnist_cnn" else {}
    assert num_parameters(build_model(name, **kwargs)) == count


@pytest.mark.parametrize("name", ["lenet5", "femnist_cnn", "fashion_cnn", "fashion_cnn_1m", "lr"])
def test_features_then_head_is_forward(name):
    torch.manual_seed(0)
    m = build_model(name)
    x = torch.randn(4, 10) if name == "lr" else torch.randn(4, 1, 28, 28)
    torch.testing.assert_close(m.head(m.features(x)), m(x), rtol=0, atol=0)  # the same layers in order: bit for bit


def test_flat_roundtrip_and_layout():
    m = build_model("lenet5")
    lay = FlatParams(m)
    flat = lay.flatten(m)
    assert flat.shape == (61_706,)
    other = build_model("lenet5")
    lay.load_into(other, flat)
    for (n1, p1), (n2, p2) in zip(m.named_parameters(), other.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    # unflatten gives views in the module's shapes, batched too
    batch = torch.stack([flat, 2 * flat])
    parts = lay.unflatten(batch)
    assert parts["body.0.weight"].shape == (2, 6, 1, 5, 5)
    torch.testing.assert_close(parts["body.0.weight"][1], 2 * m.body[0].weight, rtol=0, atol=0)  # ×2 is exact


def test_unknown_model_names_the_allowed():
    with pytest.raises(ValueError, match="model='vgg'.*fashion_cnn.*lenet5"):
        build_model("vgg")
