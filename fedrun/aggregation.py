"""Server-side aggregation of the transmitted vectors, streamed chunk by chunk.

* :class:`WeightedSum` — Σ_k w_k · x_k with the scheme's weights (FedAvg: |D_k| / Σ_j |D_j|).
* :class:`ClientLevelDPSum` — client-level DP (DP-FedAvg: McMahan, Ramage, Talwar, Zhang, "Learning
  Differentially Private Recurrent Language Models", ICLR 2018, Alg. 1 with the fixed-denominator estimator
  f̃_f): each row is clipped to L2 norm S, the clipped rows are summed, Gaussian noise N(0, σ²S² I) is added
  once, and the result is divided by the *expected* number of clients q·N, never by the realized count, so
  the sensitivity of the estimate stays S/(qN) under add/remove-one-client. It runs in whatever domain the
  scheme transmits (full update, m DCT coefficients as in paper 000 Sec. III-B2, a flattened sketch). This is
  fedrun's only implementation of the client-level DP sum; the simulation's DP path builds it.

Both take an optional ``field`` (:class:`fedrun.secagg.FieldQuantizer`, secure aggregation): each row that would
be added (weighted; clipped under DP) is quantised to Z_{2^bits} and summed there, and the sum is decoded before
the noise and the division; :meth:`quantization` reports the largest deviation from the real sum beside its bound.

Both are pure tensor math; they know nothing about schemes or tracking.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from fedrun.privacy.mechanisms import clip_rows, gaussian_noise


class FieldSum:
    """Σ of rows, in float32 or, with a ``field``, in Z_{2^bits} (then decoded); the real sum is kept beside the
    field's for the quantisation report."""

    def __init__(self, dim: int, device: torch.device | str, field=None, dtype: torch.dtype = torch.float32) -> None:
        self.field = field
        # with a field, the real sum is kept in float64 for the quantisation report only
        self.total = torch.zeros(int(dim), device=device, dtype=dtype if field is None else torch.float64)
        self.acc = torch.zeros(int(dim), device=device, dtype=torch.int64) if field is not None else None
        self.rows = 0
        self.field_clipped = 0  # coordinates the field's range clipped

    def add_rows(self, rows: torch.Tensor) -> None:
        self.total += rows.sum(0, dtype=self.total.dtype)
        self.rows += rows.shape[0]
        if self.field is not None:  # the clients' masked vectors added into the field (exact integer arithmetic)
            encoded = self.field.encode(rows)
            if rows.shape[0] < 2 ** (63 - self.field.bits):  # their int64 sum cannot overflow: one reduction
                self.acc = self.field.add(self.acc, encoded.sum(0) % self.field.modulus)
            else:
                for row in encoded:
                    self.acc = self.field.add(self.acc, row)
            self.field_clipped += self.field.clipped

    def sum(self) -> torch.Tensor:
        return self.total if self.field is None else self.field.decode(self.acc)

    def quantization(self) -> dict[str, float]:
        """max |field sum − real sum| and the field's bound for the rows summed (empty without a field)."""
        if self.field is None:
            return {}
        # the field's bound plus the float32 rounding of the decoded sum (half an ulp at its largest value)
        bound = self.field.bound(self.rows) + float(self.total.abs().max()) * 2.0 ** -24 if self.rows else 0.0
        return {"secagg_quantization_error": float((self.sum() - self.total).abs().max()) if self.rows else 0.0,
                "secagg_quantization_bound": float(bound),
                "secagg_clipped_values": float(self.field_clipped)}


class WeightedSum(FieldSum):
    """Σ_k w_k x_k over rows added in order; ``weights`` is aligned with the order of the rows."""

    def __init__(self, weights: np.ndarray, dim: int, device: torch.device | str, field=None) -> None:
        super().__init__(dim, device, field)
        self.weights = torch.as_tensor(np.asarray(weights, dtype=np.float32), device=device)
        self.seen = 0

    def add(self, rows: torch.Tensor) -> None:
        k = rows.shape[0]
        w = self.weights[self.seen:self.seen + k]
        if w.shape[0] != k:
            raise ValueError(f"more rows ({self.seen + k}) than weights ({len(self.weights)})")
        if self.field is None:
            self.total += w @ rows
        else:
            self.add_rows(w[:, None] * rows)
        self.seen += k

    def finish(self) -> torch.Tensor:
        if self.seen != len(self.weights):
            raise ValueError(f"expected {len(self.weights)} rows, got {self.seen}")
        return self.sum()


class ClientLevelDPSum(FieldSum):
    """Clip each row to ``clipping_norm``, sum, add N(0, σ²S²), divide by ``expected_clients``. In a ``field`` each row
    is clipped to S − √dim·0.5/scale instead, so that after rounding to the field's grid its norm is still ≤ S."""

    def __init__(self, dim: int, clipping_norm: float, noise_multiplier: float, expected_clients: float,
                 generator: torch.Generator | Sequence[tuple[float, torch.Generator]], device: torch.device | str,
                 dtype: torch.dtype = torch.float32, field=None) -> None:
        if not clipping_norm > 0:
            raise ValueError(f"clipping_norm={clipping_norm} must be > 0")
        if noise_multiplier < 0:
            raise ValueError(f"noise_multiplier={noise_multiplier} must be >= 0")
        if not expected_clients > 0:
            raise ValueError(f"expected_clients={expected_clients} must be > 0")
        self.clipping_norm = float(clipping_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.expected_clients = float(expected_clients)
        # the noise: Σ wᵢ·Zᵢ over (weight, generator) pairs, Zᵢ i.i.d. N(0, σ²S²) (one generator: weight 1)
        self.noise_rows = [(1.0, generator)] if isinstance(generator, torch.Generator) else list(generator)
        super().__init__(dim, device, field, dtype)
        # in a field each coordinate is rounded to the grid (≤ 0.5/scale): clip so the rounded row's norm is ≤ S too
        self.row_clip = self.clipping_norm - (0.5 * math.sqrt(dim) / field.scale if field is not None else 0.0)
        if not self.row_clip > 0:
            raise ValueError(f"secagg's field rounds each of {dim} coordinates by up to {0.5 / field.scale:.3g}, "
                             f"more than clipping_norm={clipping_norm} in norm: give secagg.bits more bits")
        self.dtype = dtype
        self.clipped = 0
        self.seen = 0
        self.norm_sum = 0.0

    def add(self, rows: torch.Tensor) -> None:
        clipped, norms = clip_rows(rows, self.row_clip)
        self.add_rows(clipped)
        self.seen += rows.shape[0]
        self.clipped += int((norms > self.row_clip).sum())
        self.norm_sum += float(norms.sum())

    def finish(self) -> torch.Tensor:
        std = self.noise_multiplier * self.clipping_norm
        out = self.sum()
        for weight, generator in self.noise_rows:
            out = out + weight * gaussian_noise(self.total.shape, std, generator, device=self.total.device,
                                                dtype=self.dtype)
        return out / self.expected_clients

    def diagnostics(self) -> dict[str, float]:
        return {
            "dp_clipped_fraction": self.clipped / self.seen if self.seen else 0.0,
            "dp_mean_norm": self.norm_sum / self.seen if self.seen else 0.0,
            "dp_clients": float(self.seen),
            "dp_noise_std": self.noise_multiplier * self.clipping_norm / self.expected_clients
            * math.sqrt(sum(w * w for w, _ in self.noise_rows)),
        }
