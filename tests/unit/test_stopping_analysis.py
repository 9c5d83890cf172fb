"""FL-STD-DP read the paper's way (fedrun.reports.kerkouche21.stopping): which runs it reads, and the reading its
rule gives."""

import pandas as pd

from fedrun.reports import kerkouche21 as k


class script:  # the functions under test, by their short names
    rows = staticmethod(lambda records: k.stopping_rows(pd.DataFrame(records)))
    render = staticmethod(k.stopping_text)


def _rec(seed, opts, acc, scheme="fl_std", dp="client"):
    series = {"test_accuracy": [(10, acc[0]), (20, acc[1]), (30, acc[2]), (200, acc[3])]}
    return {"status": "FINISHED", "tags.scheme": scheme, "tags.dp": dp, "params.server_opts": opts,
            "params.seed": str(seed), "series": series, "metrics.best_test_accuracy": max(acc),
            "metrics.best_round": 200.0}


def test_reads_fl_std_dp_as_published_and_applies_its_rule():
    records = [_rec(0, "off", (0.45, 0.58, 0.61, 0.78)), _rec(1, "off", (0.46, 0.59, 0.62, 0.77)),
               _rec(0, "on", (0.47, 0.45, 0.29, 0.1)),  # server momentum: not FL-STD as published
               _rec(0, "off", (0.4, 0.5, 0.6, 0.7), scheme="fl_cs"), _rec(0, "off", (0.5, 0.6, 0.7, 0.8), dp="off")]
    rows = script.rows(records)
    assert [(r["seed"], r["opts"]) for r in rows] == [(0, "off"), (1, "off")]
    assert rows[0]["best30"] == 0.61 and rows[0]["best"] == 0.78
    text = script.render(rows)
    assert "support the early-stopping explanation" in text
    far = script.rows([_rec(0, "off", (0.6, 0.7, 0.75, 0.78))])
    assert "does not explain" in script.render(far)


def test_the_model_size_reading():
    small = [_rec(s, "off", (0.45, 0.58, 0.61, b)) for s, b in ((0, 0.78), (1, 0.79), (2, 0.80))]

    def large(best):
        r = _rec(0, "off", (0.3, 0.4, 0.5, best))
        r["params.model.name"] = "fashion_cnn_1m"
        return r

    assert "not tested" in script.render(script.rows(small))
    same = script.render(script.rows(small + [large(0.785)]))
    assert "does not explain the gap" in same and "| fashion_cnn_1m | 0 | off |" in same
    assert "fewer than 3 seeds" in same
    assert "alone could explain" in script.render(script.rows(small + [large(0.62)]))
    assert "does not by itself give" in script.render(script.rows(small + [large(0.70)]))
