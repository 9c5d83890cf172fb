"""Correlated noise beside independent noise at equal ε, bytes and simulated time, in paper 000's setting: does
compression still boost DP federated learning when the noise is correlated and no amplification is assumed? The
claims are read from the registry ``results/correlated/claims.csv``, committed before the runs that judge them."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from fedrun.reports.common import (README, Claim, Cell, Report, column, contrast, dims, export, fmt,
                                   load, md, saving, splice)

E = export("results/correlated", "correlated-kerkouche21")
REGISTRY = "results/correlated/claims.csv"
TARGET = 0.5  # test accuracy for the time to target (results/deploy's paper-000 target)
CONDITIONS = {"poisson": "independent · Poisson q = 0.01 (amplified)",
              "mobile_goal": "independent · Poisson 1.3q, report goal (2S)",
              "cyclic": "independent · cyclic (no amplification)",
              "sqrt_toeplitz": "square-root Toeplitz · cyclic", "banded": "banded (8) · cyclic",
              "tree": "tree · cyclic", "blt": "BLT · cyclic"}
SCHEMES = {"fl_std": "FL-STD", "fl_cs@0.05": "FL-CS r = 0.05", "fl_cs@0.1": "FL-CS r = 0.1"}
VALUES = {"final_accuracy": "final", "uplink_mb": "up_mb"}  # the registry's value names → the frame's columns


def registry(root: Path, path: str = REGISTRY) -> list[dict]:
    """The registered claims, each row with its ``claim`` (a :class:`Claim`): ``test`` superiority (left − right >
    margin), non-inferiority (left − right > −margin), equivalence (|left − right| < margin) or saving (bytes: 1 −
    left/right ≥ margin, no test); the cells are ``dim=value;dim=value``."""
    def cell(text: str) -> dict:
        return dict(part.split("=", 1) for part in text.split(";"))

    with open(Path(root) / path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        left, right, margin, value = cell(r["left"]), cell(r["right"]), float(r["margin"]), VALUES[r["value"]]
        text = f"{r['id']}. {r['claim']}"
        if r["test"] == "saving":
            r["claim"] = saving(text, value, left, right, margin, paper=r["source"])
            continue
        kind = {"superiority": (">", margin), "non-inferiority": (">", -margin), "equivalence": ("≈", margin)}
        if r["test"] not in kind:
            raise ValueError(f"{path}: claim {r['id']}: test={r['test']!r} is not superiority, non-inferiority, "
                             f"equivalence or saving")
        op, bound = kind[r["test"]]
        r["claim"] = Claim(text, value, (contrast(((left, 1.0), (right, -1.0)), op, bound),), r["source"])
    return rows


def condition(row) -> str:
    """The noise and the accounting a run had, from its resolved config."""
    sampler = str(row["params.sampler._target_"]).rsplit(".", 1)[-1]
    noise = row.get("params.noise.name")
    noise = "independent" if not isinstance(noise, str) else noise
    if sampler == "CyclicSampler":
        return "cyclic" if noise == "independent" else noise
    return "mobile_goal" if float(row["params.network.over_selection"]) > 1 else "poisson"


def kaplan_meier(times: list[float], reached: list[bool]) -> tuple[float, float]:
    """(the Kaplan–Meier median time to the target, the fraction that reached it): a run that never reached it is
    censored at its last simulated second (scipy.stats.ecdf on CensoredData); NaN when fewer than half reached it."""
    from scipy.stats import CensoredData, ecdf

    if not times:
        return math.nan, math.nan
    t, hit = np.asarray(times, dtype=float), np.asarray(reached, dtype=bool)
    sf = ecdf(CensoredData(uncensored=t[hit], right=t[~hit])).sf
    below = sf.quantiles[sf.probabilities <= 0.5]
    return (float(below[0]) if len(below) else math.nan), float(hit.mean())


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
                   ttt=[t for t, _ in timed], reached=[h for _, h in timed])
    rep = Report("correlated", root, "results/correlated/table.md", [E], df,
                 dims(condition=dict(values=CONDITIONS), scheme=dict(values=SCHEMES), seed={}))
    claims = registry(root)
    groups = {f: [c for c in claims if c["family"] == f] for f in ("primary", "secondary", "by construction")}
    lines, decided = [], {}
    for fam, rows in groups.items():
        if fam == "by construction":
            verdicts = [(v["verdict"], v["text"]) for v in (rep.test(c["claim"]) for c in rows)]
            head = "By construction (bytes are counted, not measured with noise: listed apart, never counted as met)"
        else:
            verdicts = rep.verdicts([c["claim"] for c in rows])
            head = (f"{fam.capitalize()} claims (Holm over these {len(rows)} only; registered "
                    f"{', '.join(sorted({c['registered'] for c in rows}))}, seeds {rows[0]['seeds'].replace(';', ', ')}"
                    f" fixed before the runs)")
        decided[fam] = verdicts
        lines.append(f"### {head}\n\n" + "\n".join(
            f"- {c['claim'].text}: **{v}** — {detail}. Source: {c['source']}. Test: {c['test']}, margin "
            f"{c['margin']} ({c['margin_source']})" + (f"; amended: {c['amendment']}" if c["amendment"] else "") + "."
            for c, (v, detail) in zip(rows, verdicts)))
    summary = md(["primary claim", "verdict"], [(c["claim"].text, v) for c, (v, _) in
                                                zip(groups["primary"], decided["primary"])])
    km = []
    for cond in CONDITIONS:
        for scheme in SCHEMES:
            runs = rep.match(dict(condition=cond, scheme=scheme))
            if len(runs):
                med, frac = kaplan_meier(list(runs["ttt"]), list(runs["reached"]))
                km.append((CONDITIONS[cond], SCHEMES[scheme], fmt(med, "{:.0f}"), f"{frac:.2f}", str(len(runs))))
    blocks = {
        "summary": summary,
        "table": rep.table(["condition"], [Cell("final accuracy", "final"), Cell("best accuracy", "best"),
                                           Cell("σ", "sigma", how="mean", spec="{:.3f}"),
                                           Cell("ε", "eps", how="mean", spec="{:.3f}"),
                                           Cell("uplink MB", "up_mb", how="mean", spec="{:.1f}")], ["scheme"]),
        "time": md(["noise · accounting", "scheme", f"median s to {TARGET} (Kaplan–Meier)", "reached", "runs"], km),
        "claims": "\n\n".join(lines)}
    out = rep.files(blocks, expect=[dict(condition=["poisson", "mobile_goal", "cyclic", "sqrt_toeplitz", "banded"],
                                         scheme=list(SCHEMES))])
    body = (f"Primary claims checked by [table.md]({rep.output}) (registered in {REGISTRY}; Welch t, Holm over the "
            f"{len(groups['primary'])} primary claims; secondary claims and the by-construction line are there):\n"
            + "\n".join(f"- {c['claim'].text}: **{v}**" for c, (v, _) in zip(groups["primary"], decided["primary"])))
    out[Path(README)] = splice((Path(root) / README).read_text(), "correlated", body).encode("utf-8")
    return out
