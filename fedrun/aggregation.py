"""Server-side aggregation of the transmitted vectors, streamed chunk by chunk.

* :class:`WeightedSum` — Σ_k w_k · x_k with the scheme's weights (FedAvg: |D_k| / Σ_j |D_j|).
* :class:`FieldSum` — the plain sum of rows, which the client-level DP sum
  (:class:`fedrun.privacy.privatizer.ClientLevelDPSum`) builds on.

Both take an optional ``field`` (:class:`fedrun.secagg.FieldQuantizer`, secure aggregation): each row that would
be added (weighted; clipped under DP) is quantised to Z_{2^bits} and summed there, and the sum is decoded before
the noise and the division; :meth:`quantization` reports the largest deviation from the real sum beside its bound.

Both are pure tensor math; they know nothing about schemes or tracking.
"""

from __future__ import annotations

import numpy as np
import torch


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
