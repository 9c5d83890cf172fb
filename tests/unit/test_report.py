import math

from fedrun.report import Column, fmt, markdown_table, with_command


def test_markdown_table_formats_sorts_and_marks_missing():
    records = [{"s": "fl_cs", "acc": 0.81234, "cost": 1.5e6},
               {"s": "fl_std", "acc": 0.9, "cost": None},
               {"s": "fl_rnd", "acc": math.nan}]
    cols = [Column("scheme", "s"), Column("acc", "acc", "{:.3f}"),
            Column("cost Mbit", lambda r: None if r.get("cost") is None else r["cost"] / 1e6, "{:.1f}")]
    out = markdown_table(records, cols, sort_by=lambda r: r["s"])
    assert out == ("| scheme | acc | cost Mbit |\n|---|---|---|\n"
                   "| fl_cs | 0.812 | 1.5 |\n| fl_rnd | – | – |\n| fl_std | 0.900 | – |\n")


def test_fmt_falls_back_to_str_and_section_has_command():
    assert fmt("abc", "{:.2f}") == "abc"
    text = with_command("T", "fedrun -m x=1,2", "| a |\n|---|\n| 1 |\n", notes="note")
    assert text.startswith("## T") and "```\nfedrun -m x=1,2\n```" in text and text.rstrip().endswith("note")
