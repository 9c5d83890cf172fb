"""FieldSum (fedrun/aggregation.py): the SecAgg sum in Z_2^bits equals the real sum within the field's bound, on
both of its paths (one int64 reduction when k·2^bits cannot overflow, row by row when it could)."""

import pytest
import torch

from fedrun.aggregation import ClientLevelDPSum, FieldSum, WeightedSum
from fedrun.secagg import FieldQuantizer


@pytest.mark.parametrize("bits,rows", [(30, 7), (62, 3)])  # 7·2^30 fits int64: one reduction; 3·2^62 does not
def test_field_sum_within_bound(bits, rows):
    g = torch.Generator().manual_seed(bits)
    x = (torch.rand(rows, 1000, generator=g) * 2 - 1) * 0.9  # inside the range [-1, 1]: nothing clipped
    s = FieldSum(1000, "cpu", FieldQuantizer(bits, 1.0, rows))
    s.add_rows(x[: rows // 2 + 1])
    s.add_rows(x[rows // 2 + 1:])
    exact = x.double().sum(0)
    q = s.quantization()
    assert (s.sum().double() - exact).abs().max() <= q["secagg_quantization_bound"]
    assert q["secagg_quantization_error"] <= q["secagg_quantization_bound"] and q["secagg_clipped_values"] == 0
    if bits == 30:
        assert q["secagg_quantization_error"] > 0  # 30 bits for 7 summands do quantise


def test_weighted_and_dp_sums_go_through_the_field():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=g)
    w = torch.full((5,), 0.2).numpy()
    plain, field = WeightedSum(w, 64, "cpu"), WeightedSum(w, 64, "cpu", FieldQuantizer(12, 4.0, 5))
    for agg in (plain, field):
        agg.add(x)
    diff = (field.finish() - plain.finish()).abs().max().item()
    assert 0 < diff <= field.quantization()["secagg_quantization_bound"] + 1e-6  # 12 bits: visibly quantised
    dp = ClientLevelDPSum(64, 1.0, 0.0, 5.0, g, "cpu", field=FieldQuantizer(12, 1.0, 5))
    dp.add(x)
    ref = ClientLevelDPSum(64, 1.0, 0.0, 5.0, g, "cpu")
    ref.add(x)
    assert 0 < (dp.finish() - ref.finish()).abs().max().item() <= dp.quantization()["secagg_quantization_bound"] / 5 + 1e-6
