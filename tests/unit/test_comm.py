import torch

from fedrun.comm import Ledger, Message, paper_cost_bits


def test_message_bytes_from_what_is_sent():
    assert Message.of(torch.zeros(100)).nbytes == 400
    assert Message.of(torch.zeros(10, dtype=torch.float64), torch.zeros(3, dtype=torch.int64)).nbytes == 104
    assert Message.of(torch.zeros(7), extra_bytes=8).nbytes == 36
    assert Message.of_shape(61_706).nbytes == 246_824
    assert Message.of_shape(5, dtype=torch.int32, extra_bytes=1).nbytes == 21


def test_ledger_per_round_and_cumulative():
    led = Ledger()
    led.start_round()
    led.downlink(Message(1000, "model"), count=3)
    led.uplink(Message(250), count=3)
    assert led.metrics() == {"uplink_bytes": 750.0, "uplink_bytes_total": 750.0,
                             "downlink_bytes": 3000.0, "downlink_bytes_total": 3000.0}
    led.start_round()
    led.uplink(Message(10, "extra"))
    m = led.metrics()
    assert (m["uplink_bytes"], m["uplink_bytes_total"], m["downlink_bytes"], m["downlink_bytes_total"]) == \
        (10.0, 760.0, 0.0, 3000.0)
    assert dict(led.by_kind) == {"down:model": 3000, "up:update": 750, "up:extra": 10}
    restored = Ledger()
    restored.load_state_dict(led.state_dict())
    assert restored.uplink_total == 760 and restored.downlink_total == 3000


def test_paper_cost_formula():
    # paper 000: Cost = r · n · 32 · Round · C bits
    assert paper_cost_bits(0.05, 100_000, 200, 0.1) == 0.05 * 100_000 * 32 * 200 * 0.1
    assert paper_cost_bits(1.0, 61_706, 1, 1.0) == 61_706 * 32
