"""scripts/bench_training.py (what `make bench` runs): the speed table's arithmetic on fixed times, one small
setting run end to end (both paths run the same rounds and the table has their ratio), and unknown settings are a
clear error. No assertion depends on how fast the machine is."""

from __future__ import annotations


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def test_speed_table_arithmetic_on_fixed_times(load_script):
    """Fixed medians in, the printed figures out: rounds/s = 1/s, speed-up = sequential ÷ vectorized (the best
    sequential thread count), vectorized ÷ one model = local training ÷ one-model time."""
    bench = load_script("bench_training")
    row = {"name": "s", "what": "a setting", "n": 12_345, "seq": {1: 0.5, 4: 0.25}, "best": 4, "vec": 0.05,
           "vmap": 0.125, "floor": 0.032, "batched": True, "cuda_peak": 3 * 2**30,
           "phases": {"total": 0.05, "select": 0.0005, "train": 0.04, "scheme": 0.008, "accounting": 0.0015,
                      "outside": 0.01, "share": 20.0}}
    header, rule, line = bench.speed_table([row], cuda=True)
    cells = _cells(line)
    assert len(cells) == len(_cells(header)) == len(_cells(rule))
    assert cells == ["`s`: a setting", "12,345", "0.250 (4)", "0.050", "4.00 → 20.00", "5.00×", "0.125", "0.032",
                     "1.25", "0.040", "0.010", "20.0", "0.0005", "0.008", "0.0015", "3.00"]
    # a round below the printed resolution: the speed-up comes from the medians, not from the rounded cells
    slow = dict(row, seq={1: 0.0974}, best=1, vec=0.0876, batched=False, vmap=None, floor=None)
    cells = _cells(bench.speed_table([slow], cuda=False)[2])
    assert cells[2:9] == ["0.097 (1)", "0.088 (vmap)", "10.27 → 11.42", "1.11×", "–", "–", "–"]


def test_speed_table_for_one_setting(shared_data, tmp_path, capsys, load_script, monkeypatch):
    bench = load_script("bench_training")
    # the setting cut to 5 clients × 1 local step: the script's rounds and table are under test, not the timing
    what, overrides = bench.SETTINGS["fedsketch"]
    small = [o for o in overrides if not o.startswith("local_steps=")] + ["local_steps=1", "clients_per_round=5"]
    monkeypatch.setitem(bench.SETTINGS, "fedsketch", (what, small))
    out = tmp_path / "speed.md"
    assert bench.main(["speed", "--settings", "fedsketch", "--rounds", "1", "--data-root", str(shared_data),
                       "--out", str(out)]) == 0
    text = out.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `fedsketch`"))
    cells = _cells(row)
    seq, vec, ratio = float(cells[2].split()[0]), float(cells[3]), float(cells[5].rstrip("×"))
    # the cells are the times rounded to 0.001 s and the ratio of the unrounded ones rounded to 0.01: the ratio
    # must lie in the range the rounded times allow, whatever the times were
    half = 0.0005
    assert vec > half and (seq - half) / (vec + half) - 0.0051 <= ratio <= (seq + half) / (vec - half) + 0.0051
    assert "experiment=fedsketch_homogeneous" in text and "Command: `python scripts/bench_training.py speed" in text


def test_unknown_setting_is_named(capsys, load_script):
    assert load_script("bench_training").main(["speed", "--settings", "nope"]) == 2
    assert "unknown setting 'nope'" in capsys.readouterr().err
