"""The papers' models.

* :class:`LeNet5` — classic LeNet-5 for 28×28 inputs (paper 002's MNIST model): 61,706 parameters.
* :class:`FemnistCNN` — paper 001's FEMNIST CNN: conv 7×7/32 pad 3 → ReLU → maxpool 2 → conv 3×3/64
  pad 1 → ReLU → maxpool 2 → FC 62: exactly 214,590 parameters.
* :class:`FashionCNN` — fedrun's CNN for paper 000's Fashion-MNIST experiments (the paper does not give its
  architecture): conv 5×5/16 pad 2 → ReLU → maxpool 2 → conv 5×5/32 pad 2 → ReLU → maxpool 2 → FC 64 →
  ReLU → FC 10: 114,314 parameters, i.e. n ≈ 100k, the size the compression benchmark targets.
* :class:`LinearRegression` — paper 001's Lending Club model: 10 features + bias = 11 parameters.
* :class:`VGG16` — torchvision's VGG-16 layout for 28×28 grey inputs (paper 003's ImageNet source).

Every model exposes ``split_index``: the number of leading modules that form the feature extractor
f¹ for feature-based transfer learning (paper 003); ``features(x)`` runs f¹ and ``head(z)`` runs f².
"""

from __future__ import annotations

import torch
from torch import nn


class _Sequential(nn.Module):
    """A model written as an ``nn.Sequential`` body with a configurable cut point."""

    body: nn.Sequential
    default_cut: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def features(self, x: torch.Tensor, cut: int | None = None) -> torch.Tensor:
        """f¹: the layers before the cut layer (paper 003, Fig. 2)."""
        return self.body[: self.default_cut if cut is None else cut](x)

    def head(self, z: torch.Tensor, cut: int | None = None) -> torch.Tensor:
        """f²: the task-specific layers from the cut layer on."""
        return self.body[self.default_cut if cut is None else cut :](z)


class LeNet5(_Sequential):
    """LeNet-5 (LeCun et al. 1998) for 1×28×28 inputs; 61,706 parameters."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes),
        )
        self.default_cut = 9  # cut at the first fully connected layer after the convolutions' flatten + fc1


class FemnistCNN(_Sequential):
    """Paper 001's FEMNIST CNN (two conv layers + one FC layer); 214,590 parameters."""

    def __init__(self, num_classes: int = 62, in_channels: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 32, 7, padding=3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, num_classes),
        )
        self.default_cut = 7


class FashionCNN(_Sequential):
    """fedrun's Fashion-MNIST CNN for paper 000 (its architecture is not published); 114,314 parameters with
    ``hidden`` = 64 units in the dense layer."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, hidden: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * 7 * 7, hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )
        self.default_cut = 7


class FashionCNN1M(FashionCNN):
    """The same CNN with a 640-unit dense layer: 1,023,818 parameters, the order (n ≈ 10⁶) of paper 000's
    unpublished model, to test whether FL-STD-DP's accuracy depends on the model's size."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__(num_classes, in_channels, hidden=640)


class LinearRegression(_Sequential):
    """y = wᵀx + b; paper 001's Lending Club model (10 features + bias = 11 parameters)."""

    def __init__(self, in_features: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_features, 1), nn.Flatten(0))
        self.default_cut = 0


class _GreyToRGB(nn.Module):
    """1×28×28 grey images → 3×size×size (bilinear resize, channel copy) for ImageNet architectures."""

    def __init__(self, size: int = 32) -> None:
        super().__init__()
        self.size = int(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x


class VGG16(_Sequential):
    """torchvision's VGG-16 layout (paper 003's source model) for 28×28 grey inputs, without dropout.

    body: [0] grey→RGB 32×32, [1..31] VGG-16 ``features``, [32] adaptive avg-pool 7×7, [33] flatten,
    [34] FC 25088→4096, [36] FC 4096→4096, [38] FC 4096→classes (ReLUs between). ``default_cut`` = 38: f¹
    outputs the 4096 features of the paper's FbFTL upload. Built from scratch (random weights); ImageNet
    weights, if present locally, are loaded by paper 003's transfer schemes (``source_dataset=imagenet``).
    """

    _CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = [_GreyToRGB(32)]
        c = 3
        for v in self._CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(c, int(v), 3, padding=1), nn.ReLU()]
                c = int(v)
        layers += [nn.AdaptiveAvgPool2d((7, 7)), nn.Flatten(),
                   nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                   nn.Linear(4096, num_classes)]
        self.body = nn.Sequential(*layers)
        self.default_cut = 38

    @staticmethod
    def torchvision_name_map() -> dict[str, str]:
        """torchvision ``vgg16`` state-dict names → this body's names."""
        pairs = [(f"features.{i}", i + 1) for i in range(31)] + [("classifier.0", 34), ("classifier.3", 36),
                                                                  ("classifier.6", 38)]
        return {f"{tv}.{kind}": f"body.{ours}.{kind}" for tv, ours in pairs for kind in ("weight", "bias")}


_MODELS = {"lenet5": LeNet5, "femnist_cnn": FemnistCNN, "fashion_cnn": FashionCNN,
           "fashion_cnn_1m": FashionCNN1M, "lr": LinearRegression,
           "vgg16": VGG16}
# the models that take 28×28 images (every one but the tabular regression); fedrun.run checks a dataset's
# model against this, so a model added to _MODELS is allowed for image datasets with no second list to edit
IMAGE_MODELS = tuple(name for name, cls in _MODELS.items() if cls is not LinearRegression)


def build_model(name: str, **kwargs) -> nn.Module:
    """Build a model by its config name (``lenet5``, ``femnist_cnn``, ``fashion_cnn``, ``fashion_cnn_1m``, ``lr``, ``vgg16``)."""
    try:
        cls = _MODELS[name]
    except KeyError:
        raise ValueError(f"model={name!r} is unknown; allowed: {', '.join(sorted(_MODELS))}") from None
    return cls(**kwargs)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
