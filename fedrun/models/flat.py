"""One flat parameter vector ↔ a module's named parameters."""

from __future__ import annotations

import torch
from torch import nn


class FlatParams:
    """Layout of a module's trainable parameters inside one flat vector.

    ``unflatten(flat)`` returns a ``{name: view}`` dict usable with ``torch.func.functional_call``;
    it works on a single vector [n] and (inside ``vmap``) on each row of a batch [K, n].
    """

    def __init__(self, module: nn.Module, trainable: set[str] | None = None) -> None:
        named = [(n, p) for n, p in module.named_parameters() if trainable is None or n in trainable]
        self.names = [n for n, _ in named]
        self.shapes = [tuple(p.shape) for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.numel = sum(self.sizes)

    def flatten(self, module: nn.Module) -> torch.Tensor:
        params = dict(module.named_parameters())
        return torch.cat([params[n].detach().reshape(-1) for n in self.names]).clone()

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = torch.split(flat, self.sizes, dim=-1)
        lead = flat.shape[:-1]
        return {n: t.reshape(*lead, *s) for n, t, s in zip(self.names, parts, self.shapes)}

    def load_into(self, module: nn.Module, flat: torch.Tensor) -> None:
        """Copy ``flat`` into the module's parameters (in place, no aliasing)."""
        params = dict(module.named_parameters())
        with torch.no_grad():
            for n, t in self.unflatten(flat).items():
                params[n].copy_(t)
