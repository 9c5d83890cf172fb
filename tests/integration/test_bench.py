"""scripts/bench_training.py (what `make bench` runs) on one small setting: both paths run the same rounds and the
table reports their ratio; unknown settings are a clear error."""

from __future__ import annotations


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
    cells = [c.strip() for c in row.strip("|").split("|")]
    seq, vec, ratio = float(cells[2].split()[0]), float(cells[3]), float(cells[5].rstrip("×"))
    assert seq > 0 and vec > 0 and abs(ratio - seq / vec) < 0.01
    assert "experiment=fedsketch_homogeneous" in text and "Command: `python scripts/bench_training.py speed" in text


def test_unknown_setting_is_named(capsys, load_script):
    assert load_script("bench_training").main(["speed", "--settings", "nope"]) == 2
    assert "unknown setting 'nope'" in capsys.readouterr().err
