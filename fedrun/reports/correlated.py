"""Correlated noise beside independent noise at equal ε, bytes and simulated time, in paper 000's setting: does
compression still boost DP federated learning when the noise is correlated and no amplification is assumed? The
claims are read from the registry ``results/correlated/claims.csv``, committed before the runs that judge them."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

from fedrun.reports import stats
from fedrun.reports.common import Cell, Report, column, dims, export, fmt, load, md

E = export("results/correlated", "correlated-kerkouche21")
TARGET = 0.5  # test accuracy for the time to target (results/deploy's paper-000 target)
CONDITIONS = {"poisson": "independent · Poisson q = 0.01 (amplified)",
              "mobile_goal": "independent · Poisson 1.3q, report goal (2S)",
              "cyclic": "independent · cyclic (no amplification)",
              "sqrt_toeplitz": "square-root Toeplitz · cyclic", "banded": "banded (8) · cyclic",
              "tree": "tree · cyclic", "blt": "BLT · cyclic"}
SCHEMES = {"fl_std": "FL-STD", "fl_cs@0.05": "FL-CS r = 0.05", "fl_cs@0.1": "FL-CS r = 0.1"}


def condition(row) -> str:
    """The noise and the accounting a run had, from its resolved config."""
    sampler = str(row["params.sampler._target_"]).rsplit(".", 1)[-1]
    noise = row.get("params.noise.name")
    noise = "independent" if not isinstance(noise, str) else noise
    if sampler == "CyclicSampler":
        return "cyclic" if noise == "independent" else noise
    return "mobile_goal" if float(row["params.network.over_selection"]) > 1 else "poisson"


def _time(row) -> tuple[float, bool]:
    """(the simulated seconds to the target, reached): the run's ``time_to_accuracy_s`` (network.target_accuracy), else
    censored at its last simulated second."""
    t = row["metrics.time_to_accuracy_s"]
    return (float(t), True) if not math.isnan(t) else (float(row["metrics.sim_time_s_final"]), False)


def correlated(root: Path) -> dict[Path, bytes]:
    df = load(root, [E])
    df["condition"] = [condition(r) for r in df.to_dict("records")]
    name, r = column(df, "params.scheme.name"), column(df, "params.r", kind=float)
    df["scheme"] = [n if n == "fl_std" else f"{n}@{x:g}" for n, x in zip(name, r)]
    m = lambda k: df[f"metrics.{k}"]  # noqa: E731
    timed = [_time(row) for row in df.to_dict("records")]
    df = df.assign(final=m("test_accuracy"), best=m("best_test_accuracy"), eps=m("epsilon_final"),
                   sigma=m("dp_noise_multiplier"), up_mb=m("uplink_bytes_total") / 1e6,
                   ttt=[t for t, _ in timed], ttt_reached=[h for _, h in timed])
    rep = Report("correlated", root, "results/correlated/table.md", [E], df,
                 dims(condition=dict(values=CONDITIONS), scheme=dict(values=SCHEMES), seed={}))
    km = []
    for cond, scheme in itertools.product(CONDITIONS, SCHEMES):
        t, hit = rep.censored(dict(condition=cond, scheme=scheme), "ttt")
        if len(t):
            km.append((CONDITIONS[cond], SCHEMES[scheme], fmt(stats.km_median(t, hit), "{:.0f}"), f"{hit.mean():.2f}",
                       str(len(t))))
    blocks = {
        "table": rep.table(["condition"], [Cell("final accuracy", "final"), Cell("best accuracy", "best"),
                                           Cell("σ", "sigma", how="mean", spec="{:.3f}"),
                                           Cell("ε", "eps", how="mean", spec="{:.3f}"),
                                           Cell("uplink MB", "up_mb", how="mean", spec="{:.1f}")], ["scheme"]),
        "time": md(["noise · accounting", "scheme", f"median s to {TARGET} (Kaplan–Meier)", "reached", "runs"], km)}
    return rep.files(blocks, claims=True, expect=[dict(condition=["poisson", "mobile_goal", "cyclic", "sqrt_toeplitz",
                                                                    "banded"], scheme=list(SCHEMES))])
