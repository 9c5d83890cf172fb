"""The split f = f² ∘ f¹ at a cut layer, and paper 003's analytic payloads (pure: no I/O, no Hydra/MLflow).

fedrun's models are ``nn.Sequential`` bodies (``fedrun.models.nets``); the cut layer m_c is a body index
whose module is fully connected (the paper: "one fully connected layer m_c without paralleling path").
f¹ = ``body[:cut]`` (copied from the source model, frozen), f² = ``body[cut:]`` (randomly initialised,
trained). Parameter names are ``body.<index>.<weight|bias>``.

Payload formulas (paper 003, Sections II–III; d bits per float, Σ T_m over trainable layers; U·C the
clients per iteration; I the iterations; K_u client u's samples; N⁻_{m_c} the cut layer's input size).
Equation numbers count the displays of the paper's text, as in :mod:`fedrun.transfer.leakage` (its
in-text references "(4)" and "(5)" agree with that count):

- (2) FL uplink         P^FL      = I^FL · U·C · d · Σ_{m=1}^{M} T_m
- (3) FTL-full uplink   P^FTL_f   = I^FTL_f · U·C · d · Σ_{m=1}^{M} T_m
- (4) FTL-c uplink      P^FTL_c   = I^FTL_c · U·C · d · Σ_{m=m_c}^{M} T_m
- (6) FbFTL uplink      P^FbFTL   = d · N⁻_{m_c} · Σ_u K_u       (labels neglected, as in the paper)
- (7) ratio of one FTL-c upload to one FbFTL sample: Σ_{m≥m_c} T_m / N⁻_{m_c} (≈ N⁺_{m_c} for one FC layer)
- (10) downlink broadcasts [inferred: the display is missing from the text; these follow its description]:
  FL  I^FL·d·Σ T_m;  FTL-full  I^FTL_f·d·Σ T_m;  FTL-c  d·Σ_{m<m_c} T_m + I^FTL_c·d·Σ_{m≥m_c} T_m;
  FbFTL  d·Σ_{m<m_c} T_m (the frozen extractor, once). A broadcast counts once, whatever the audience.
"""

from __future__ import annotations

import re

import torch
from torch import nn


D_BITS = 32  # d: float32

_NAME = re.compile(r"^body\.(\d+)\.")


def linear_cut_choices(model: nn.Module) -> list[int]:
    """Body indices of fully connected layers that can be the cut (something trainable must precede them)."""
    body = getattr(model, "body", None)
    if not isinstance(body, nn.Sequential):
        return []
    return [i for i, m in enumerate(body) if isinstance(m, nn.Linear) and any(p.numel() for p in body[:i].parameters())]


def check_cut(model: nn.Module, model_name: str, cut_layer: int | None) -> int:
    """The cut index to use (``cut_layer``, or the model's ``default_cut``); one-line ValueError if invalid."""
    choices = linear_cut_choices(model)
    if not choices:
        raise ValueError(f"model={model_name} has no cut layer (no fully connected layer after a trainable "
                          f"one); transfer schemes need lenet5, femnist_cnn, fashion_cnn or vgg16")
    cut = getattr(model, "default_cut", None) if cut_layer is None else cut_layer
    if isinstance(cut, bool) or not isinstance(cut, int) or cut not in choices:
        allowed = ", ".join(str(c) for c in choices)
        raise ValueError(f"cut_layer={cut_layer} is not a fully connected layer of model={model_name} that can "
                          f"be cut; allowed: {allowed} (body indices; default {getattr(model, 'default_cut', None)})")
    return int(cut)


def layer_index(name: str) -> int:
    m = _NAME.match(name)
    if m is None:
        raise ValueError(f"parameter {name!r} is not in a Sequential body (expected body.<index>.<name>)")
    return int(m.group(1))


def split_names(model: nn.Module, cut: int) -> tuple[list[str], list[str]]:
    """(f¹ parameter names, f² parameter names) in the module's order."""
    names = [n for n, _ in model.named_parameters()]
    return [n for n in names if layer_index(n) < cut], [n for n in names if layer_index(n) >= cut]


def numel_of(model: nn.Module, names: list[str]) -> int:
    params = dict(model.named_parameters())
    return int(sum(params[n].numel() for n in names))


def copy_extractor(model: nn.Module, source_state: dict[str, torch.Tensor], cut: int) -> list[str]:
    """Copy f¹ (every parameter and buffer of ``body[:cut]``) from ``source_state`` into ``model``, in place."""
    own = model.state_dict()
    copied = []
    with torch.no_grad():
        for name, tensor in own.items():
            if layer_index(name) >= cut:
                continue
            if name not in source_state:
                raise ValueError(f"the source model has no {name}; it does not match the target's architecture")
            src = source_state[name]
            if tuple(src.shape) != tuple(tensor.shape):
                raise ValueError(f"source model {name} has shape {tuple(src.shape)}, the target needs "
                                  f"{tuple(tensor.shape)}: the architectures differ before the cut")
            tensor.copy_(src.to(tensor.dtype))
            copied.append(name)
    return copied


def feature_dim(model: nn.Module, cut: int, sample: torch.Tensor) -> int:
    """N⁻_{m_c}: the number of features f¹ outputs for one sample (= the cut layer's input size)."""
    with torch.no_grad():
        return int(model.features(sample[:1], cut).reshape(1, -1).shape[1])


# ------------------------------------------------------------------------------------ paper payloads (bits)
def fedavg_uplink_bits(iterations: int, clients_per_iteration: float, trained_params: int, d: int = D_BITS) -> float:
    """Eqs. (2), (3), (4): I · U·C · d · (number of trained parameters)."""
    return float(iterations) * float(clients_per_iteration) * d * int(trained_params)


def fbftl_uplink_bits(num_samples: int, features: int, d: int = D_BITS) -> float:
    """Eq. (6): d · N⁻_{m_c} · Σ_u K_u."""
    return float(d) * int(features) * int(num_samples)


def fedavg_downlink_bits(iterations: int, trained_params: int, frozen_params: int = 0, d: int = D_BITS) -> float:
    """Broadcast downlink of FL / FTL-full (frozen 0) and FTL-c: d·Σ_{m<m_c}T_m + I·d·Σ_{m≥m_c}T_m [inferred]."""
    return float(d) * (int(frozen_params) + float(iterations) * int(trained_params))


def fbftl_downlink_bits(frozen_params: int, d: int = D_BITS) -> float:
    """FbFTL broadcasts only the frozen extractor, once: d · Σ_{m<m_c} T_m [inferred]."""
    return float(d) * int(frozen_params)


def upload_ratio(head_params: int, features: int) -> float:
    """Ratio of one FTL-c upload to one FbFTL sample upload: Σ_{m≥m_c} T_m / N⁻_{m_c} (paper 003, eq. (7))."""
    return int(head_params) / int(features)


def round_metrics(scheme, facts: dict, sim, rnd: int) -> dict[str, float]:
    """Paper 003's per-round figures for FL, FTL-full and FTL-c, cumulative: ``paper_uplink_bits`` /
    ``paper_downlink_bits`` (eqs. (2)–(4), (10), U·C the sampler's expected clients per round, I the rounds so far),
    ``upload_batches_total`` (client updates), ``params_per_batch`` (trained parameters), ``uplink_bytes_per_batch``,
    ``downlink_broadcast_bytes_total`` (each broadcast once, as the paper's (10) counts); round 1 also the source
    model's test accuracy. ``sim`` is the :class:`fedrun.simulation.Simulation`, ``facts`` from ``prepare_model``."""
    frozen = facts["frozen_numel"] if scheme.train_head_only else 0
    out = {"paper_uplink_bits": fedavg_uplink_bits(rnd, sim.sampler.expected_clients, sim.n),
           "paper_downlink_bits": fedavg_downlink_bits(rnd, sim.n, frozen),
           "upload_batches_total": float(sim.ledger.uplink_messages_total), "params_per_batch": float(sim.n),
           "uplink_bytes_per_batch": float(4 * sim.n), "downlink_broadcast_bytes_total": float(sim.ledger.broadcast_total),
           "frozen_params": float(facts["frozen_numel"] if scheme.init_from_source else 0),
           "feature_dim": float(facts["features"]), "cut_layer": float(facts["cut"])}
    return {**out, **(facts["source_info"] if rnd == 1 else {})}
