"""FieldSum (fedrun/aggregation.py): the SecAgg sum in Z_2^bits equals the real sum within the field's bound, on
both of its paths (one int64 reduction when k·2^bits cannot overflow, row by row when it could)."""

import pytest
import torch

from fedrun.aggregation import FieldSum, WeightedSum
from fedrun.privacy.privatizer import ClientLevelDPSum
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
    ref = ClientLevelDPSum(64, dp.row_clip, 0.0, 5.0, g, "cpu")  # the field's DP sum clips to S − √m·0.5/scale
    ref.add(x)
    assert 0 < (dp.finish() - ref.finish()).abs().max().item() <= dp.quantization()["secagg_quantization_bound"] / 5 + 1e-6


@pytest.mark.parametrize("bits,dim", [(8, 1000), (12, 64), (32, 5000)])
def test_a_rows_contribution_in_the_field_stays_within_s_after_rounding(bits, dim):
    """Under client-level DP with SecAgg the released sum moves by what one row adds in the field: that row rounded
    to the grid. Rounding adds up to 0.5/scale per coordinate (√m·0.5/scale in norm), so the row is clipped below S
    by that much first; the decoded contribution's norm is ≤ S (up to the float32 cast, 2⁻²⁴ relative). Fails if
    rows are clipped to S itself."""
    g = torch.Generator().manual_seed(1)
    field = FieldQuantizer(bits, 1.0, 1)
    worst = 0.0
    for _ in range(20):
        x = torch.randn(1, dim, generator=g) * 10
        one = ClientLevelDPSum(dim, 1.0, 0.0, 1.0, g, "cpu", field=field)
        one.add(x)
        worst = max(worst, one.sum().double().norm().item())
    assert worst <= 1.0 * (1 + 2.0 ** -23)
