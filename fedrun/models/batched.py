"""Client-batched forward of a sequential model, with per-sample gradient norms from activations.

K clients each hold their own copy of a model's parameters; local training needs every client's gradient on
its own mini-batch. ``torch.func.vmap`` turns each convolution into a grouped convolution whose memory layout
it permutes in and out of at every layer, and its backward dominated the vectorized round
(results/bench/speed.md). :class:`ClientBatchedSequential` runs the same layers directly in the layout a grouped
convolution wants and keeps it from layer to layer:

* image activations are ``[B, K·C, H, W]`` in channels-last memory (client k's channels are the k-th block),
  so a convolution is one ``conv2d(groups=K)`` with the clients' weights stacked ``[K·O, C, kh, kw]``, and
  ReLU / pooling apply unchanged (they act per channel);
* after the flatten, activations are ``[K, B, F]`` and a linear layer is one ``baddbmm`` with the clients'
  weights ``[K, O, F]``.

Parameters are per-layer leaves ``[K, *shape]`` (a layout's order), so the local steps update them in place
without re-slicing one flat ``[K, n]`` vector at every step.

:func:`per_sample_clipped_grad` clips each sample's gradient without materialising ``[K, B, n]`` per-sample
gradients (the "book-keeping" form of ghost clipping, Bu et al. 2022 / Opacus's fast gradient clipping): one
backward pass gives each parametrised layer's output gradient ``∂ℓ_i/∂z``; with the layer's input ``a``:

* linear, ``g_i = b_i a_iᵀ`` → ``‖g_i‖² = ‖a_i‖²‖b_i‖²`` (plus ``‖b_i‖²`` for the bias), and the clipped sum
  ``Σ c_i b_i a_iᵀ`` is one batched matrix product;
* convolution: the per-sample weight gradient ``Σ_l b_{i,l} col_{i,l}ᵀ`` is ``O × C·kh·kw`` — small for the
  papers' nets — so it is formed per sample (one grouped convolution weight-gradient with a group per
  (sample, client)) and reduced with the clipping factors.

Neither ``[K, B, n]`` per-sample gradients nor a second backward pass are needed.

Only models whose trainable parameters all sit in ``nn.Linear`` / ``nn.Conv2d`` (groups 1, zero padding) of an
``nn.Sequential`` body, between parameter-free per-channel layers, qualify (:func:`compile_sequential`); others
use the vmap path. Both are tested equal to the sequential ``nn.Module`` + autograd reference within float32
round-off (tests/unit/test_batched.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

#: parameter-free layers that act elementwise or per channel, in either layout
ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.Identity, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Softplus)
#: parameter-free layers that act per channel on images
POOLS = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)


@dataclass(frozen=True)
class _Layer:
    module: nn.Module
    kind: str  # "conv", "linear", "elementwise", "pool", "flatten"
    weight: str | None = None  # layout names of this layer's parameters
    bias: str | None = None


class ClientBatchedSequential:
    """Runs a sequential body for K clients at once (see the module docstring for the layouts)."""

    def __init__(self, layers: list[_Layer]) -> None:
        self.layers = layers

    # -- forward ----------------------------------------------------------------------------------
    def forward(self, params: dict[str, torch.Tensor], x: torch.Tensor, record: list | None = None) -> torch.Tensor:
        """Outputs ``[K, B, *out]`` of every client's model on its inputs ``x`` ``[K, B, *in]``.

        ``params[name]`` is ``[K, *shape]``. With ``record`` (a list), each parametrised layer appends
        ``(layer, input, output)`` so a caller can take gradients with respect to the outputs. Image activations
        are kept in channels-last memory, where grouped convolutions run fastest on the CPU."""
        k, b = x.shape[0], x.shape[1]
        image = x.dim() == 5
        if image:  # [K, B, C, H, W] → [B, K·C, H, W], channels-last
            h = x.transpose(0, 1).reshape(b, k * x.shape[2], x.shape[3], x.shape[4])
            h = h.contiguous(memory_format=torch.channels_last)
        else:
            h = x
        for layer in self.layers:
            m = layer.module
            if layer.kind == "conv":
                w = params[layer.weight]
                bias = params[layer.bias].reshape(-1) if layer.bias else None
                out = F.conv2d(h, w.reshape(k * w.shape[1], *w.shape[2:]), bias, m.stride, m.padding, m.dilation,
                               groups=k)
            elif layer.kind == "linear":
                w = params[layer.weight]
                if layer.bias:
                    out = torch.baddbmm(params[layer.bias].unsqueeze(1), h, w.transpose(1, 2))
                else:
                    out = torch.bmm(h, w.transpose(1, 2))
            elif layer.kind == "flatten":
                if image:
                    c = h.shape[1] // k
                    out = h.reshape(b, k, c * h.shape[2] * h.shape[3]).transpose(0, 1)
                    image = False
                else:
                    out = h.reshape(k, b, -1)
            else:  # elementwise / per-channel pooling
                out = m(h)
            if record is not None and layer.kind in ("conv", "linear"):
                record.append((layer, h, out))
            h = out
        if image:  # a body that ends on images: back to [K, B, C, H, W]
            c = h.shape[1] // k
            h = h.reshape(b, k, c, h.shape[2], h.shape[3]).transpose(0, 1)
        return h

    # -- per-sample gradients ---------------------------------------------------------------------
    def per_sample_clipped_grad(self, params: dict[str, torch.Tensor], x: torch.Tensor, per_sample_loss,
                                weights: torch.Tensor, clip_norm: float,
                                clip_ord: int = 2) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Σ_i w_i · clip(∇ℓ_i) for every client, per parameter, and the per-sample losses ``[K, B]``.

        ``per_sample_loss(out)`` maps the outputs ``[K, B, …]`` to the per-sample losses ``[K, B]``; ``weights``
        ``[K, B]`` (the 0/1 mask divided by the client's sample count gives the clipped mean). Clipping is to
        L2 norm ``clip_norm`` (``clip_ord`` 1: to L1 norm, where the L1 norm is taken from the per-sample
        gradients, which are then formed for linear layers too)."""
        record: list = []
        leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}  # outputs in the graph
        out = self.forward(leaves, x, record)
        losses = per_sample_loss(out)
        outs = [z for _, _, z in record]
        grads = torch.autograd.grad(losses.sum(), outs)
        k, b = x.shape[0], x.shape[1]
        norms = torch.zeros(k, b, dtype=out.dtype, device=out.device)
        parts = []  # (layer, per-sample weight grads or None, input, output grad)
        for (layer, a, _), g in zip(record, grads):
            if layer.kind == "linear" and clip_ord == 2:
                # a [K, B, I], g [K, B, O]: ‖b aᵀ‖² = ‖a‖²‖b‖²
                gsq = g.pow(2).sum(-1)
                norms += a.pow(2).sum(-1) * gsq
                if layer.bias:
                    norms += gsq
                parts.append((layer, None, a, g))
            else:
                ps_w, ps_b = self._per_sample(layer, a, g, k, b)  # [B, K, …], [B, K, O]
                if clip_ord == 2:
                    norms += ps_w.pow(2).flatten(2).sum(-1).T
                    if ps_b is not None:
                        norms += ps_b.pow(2).sum(-1).T
                else:
                    norms += ps_w.abs().flatten(2).sum(-1).T
                    if ps_b is not None:
                        norms += ps_b.abs().sum(-1).T
                parts.append((layer, (ps_w, ps_b), a, g))
        norms = norms.sqrt() if clip_ord == 2 else norms
        coef = weights * torch.clamp(clip_norm / norms.clamp_min(1e-12), max=1.0)  # [K, B]
        result: dict[str, torch.Tensor] = {}
        for layer, ps, a, g in parts:
            if ps is None:  # linear: Σ_i c_i b_i a_iᵀ
                cg = g * coef.unsqueeze(-1)
                result[layer.weight] = torch.bmm(cg.transpose(1, 2), a)
                if layer.bias:
                    result[layer.bias] = cg.sum(1)
            else:
                ps_w, ps_b = ps
                c = coef.T.reshape(b, k, *[1] * (ps_w.dim() - 2))
                result[layer.weight] = (ps_w * c).sum(0)
                if ps_b is not None:
                    result[layer.bias] = (ps_b * coef.T.unsqueeze(-1)).sum(0)
        return result, losses.detach()

    @staticmethod
    def _per_sample(layer: _Layer, a: torch.Tensor, g: torch.Tensor, k: int,
                    b: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-sample weight (and bias) gradients of one layer, sample-major: ``[B, K, *w.shape]``, ``[B, K, O]``."""
        m = layer.module
        if layer.kind == "linear":  # a [K, B, I], g [K, B, O]
            w = torch.einsum("kbo,kbi->bkoi", g, a)
            return w, (g.transpose(0, 1) if layer.bias else None)
        # conv: a [B, K·C, H, W], g [B, K·O, Ho, Wo]. Every (sample, client) pair is one group of a grouped
        # convolution's weight gradient: about 1.6× faster here than unfold + bmm (its im2col is kh·kw times the
        # input), in the default memory format
        c, o = a.shape[1] // k, g.shape[1] // k
        ai = a.reshape(1, b * k * c, a.shape[2], a.shape[3]).contiguous()
        gi = g.reshape(1, b * k * o, g.shape[2], g.shape[3]).contiguous()
        shape = a.new_empty(1).expand(b * k * o, c, *m.kernel_size)  # only its shape is read
        w = torch.ops.aten.convolution_backward(
            gi, ai, shape, None, m.stride, m.padding, m.dilation, False, (0, 0), b * k, (False, True, False))[1]
        bias = g.sum((2, 3)).view(b, k, o) if layer.bias else None
        return w.view(b, k, o, c, *m.kernel_size), bias


def _body(model: nn.Module) -> tuple[nn.Sequential, str] | None:
    """The model's sequential body and its parameter-name prefix, when its forward is just that body."""
    if isinstance(model, nn.Sequential):
        return model, ""
    from fedrun.models.nets import _Sequential

    body = getattr(model, "body", None)
    if isinstance(model, _Sequential) and isinstance(body, nn.Sequential) \
            and type(model).forward is _Sequential.forward:
        return body, "body."
    return None


def compile_sequential(model: nn.Module, names: list[str]) -> ClientBatchedSequential | None:
    """A :class:`ClientBatchedSequential` for ``model`` whose trainable parameters are ``names`` (a layout's
    order), or None when the model has a layer this path does not cover (the caller then uses vmap)."""
    found = _body(model)
    if found is None:
        return None
    body, prefix = found
    layers: list[_Layer] = []
    covered: list[str] = []
    image = None  # unknown until the first layer that needs a layout
    for idx, m in enumerate(body):
        own = [n for n, _ in m.named_parameters()]
        w = f"{prefix}{idx}.weight"
        bias = f"{prefix}{idx}.bias" if "bias" in own else None
        if isinstance(m, nn.Conv2d):
            if m.groups != 1 or m.padding_mode != "zeros" or isinstance(m.padding, str) or image is False:
                return None
            layers.append(_Layer(m, "conv", w, bias))
            image = True
        elif isinstance(m, nn.Linear):
            if image:
                return None
            layers.append(_Layer(m, "linear", w, bias))
            image = False
        elif own:
            return None
        elif isinstance(m, nn.Flatten):
            if m.start_dim != 1 or m.end_dim != -1:
                return None
            layers.append(_Layer(m, "flatten"))
            image = False
        elif getattr(m, "inplace", False):
            return None  # an in-place activation would overwrite a recorded layer output
        elif isinstance(m, ELEMENTWISE):
            layers.append(_Layer(m, "elementwise"))
        elif isinstance(m, POOLS):
            if image is False:
                return None
            layers.append(_Layer(m, "pool"))
            image = True
        else:
            return None
        covered += [w] + ([bias] if bias else []) if own else []
    if sorted(covered) != sorted(names) or not layers:
        return None  # frozen layers, or trainable parameters outside the body
    return ClientBatchedSequential(layers)
