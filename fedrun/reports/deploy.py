"""What a deployment pays: simulated time to a target accuracy under three network profiles, with and without
SecAgg+, in paper 000's setting (FL-STD, FL-RND, FL-CS; client-level DP ε = 1) and paper 002's (FedSGD, FedSKETCH).

A run's time to target is the simulated clock (``sim_time_s``) at the first evaluated round whose test accuracy
reaches the target; a run that never reaches it counts its whole simulated time, a lower bound (the table says how
many). The claims about where compression pays were written down before the paper-000 sweep had finished.
"""

from __future__ import annotations

import math
from pathlib import Path

from fedrun.reports.common import Cell, Claim, Export, Report, column, dims, gt, load, series_value

K = Export("results/deploy/runs/deploy-kerkouche21", "deploy-kerkouche21")
F = Export("results/deploy/runs/deploy-fedsketch", "deploy-fedsketch")
#: target test accuracy per setting: paper 000's in 50 rounds at ε = 1, paper 002's in 80 rounds (τ = 1)
TARGETS = {"000": 0.5, "002": 0.75}
SCHEMES = {"fl_std": "FL-STD", "fl_rnd@0.05": "FL-RND r = 0.05", "fl_rnd@0.1": "FL-RND r = 0.1",
           "fl_cs@0.05": "FL-CS r = 0.05", "fl_cs@0.1": "FL-CS r = 0.1", "fedsgd": "FedSGD",
           "fedsketch": "FedSKETCH (50, 100)"}
NETWORKS = {"mobile": "mobile", "broadband": "broadband", "datacenter": "datacenter"}
SECAGG = {"none": "no SecAgg", "secagg_plus": "SecAgg+"}


def time_to_target(row) -> float:
    target = TARGETS[row["setting"]]
    times = dict((int(s), float(v)) for s, v in (row["series"] or {}).get("sim_time_s", []))
    hit = next((int(s) for s, v in (row["series"] or {}).get("test_accuracy", []) if float(v) >= target), None)
    return times.get(hit, math.nan) if hit is not None else row["metrics.sim_time_s_final"]


def deploy(root: Path) -> dict[Path, bytes]:
    df = load(root, [K, F])
    df["setting"] = column(df, "experiment", map={"deploy-kerkouche21": "000", "deploy-fedsketch": "002"})
    name = column(df, "params.scheme.name")
    r = column(df, "params.r", kind=float)
    df["scheme"] = [n if n in ("fl_std", "fedsgd", "fedsketch") else f"{n}@{x:g}" for n, x in zip(name, r)]
    df["network"] = column(df, "params.network.name")
    df["secagg"] = column(df, "params.secagg.name")
    df["seed"] = column(df, "params.seed", kind=int)
    df["ttt"] = [time_to_target(row) for row in df.to_dict("records")]
    df["reached"] = df["metrics.best_test_accuracy"] >= df["setting"].map(TARGETS)
    rounds = df["metrics.rounds_completed"]
    df = df.assign(best=df["metrics.best_test_accuracy"], total=df["metrics.sim_time_s_final"],
                   round_s=df["metrics.sim_time_s_final"] / rounds,
                   server_s=series_value(df, "clock_server_s", lambda p: sum(v for _, v in p) / max(1, len(p))),
                   upload_s=series_value(df, "clock_upload_s", lambda p: sum(v for _, v in p) / max(1, len(p))),
                   up_mb=df["metrics.uplink_bytes_total"] / 1e6,
                   secagg_mb=(df["metrics.secagg_uplink_bytes_total"].fillna(0)
                              + df["metrics.secagg_downlink_bytes_total"].fillna(0)) / 1e6,
                   eps=df["metrics.epsilon_final"])
    rep = Report("deploy", root, "results/deploy/time_to_accuracy.md", [K, F], df, dims(
        setting=dict(values=["000", "002"], labels={"000": "paper 000's setting, target 0.5",
                                                    "002": "paper 002's setting, target 0.75"}),
        scheme=dict(values=list(SCHEMES), labels=SCHEMES), network=dict(values=list(NETWORKS), labels=NETWORKS),
        secagg=dict(values=list(SECAGG), labels=SECAGG), seed={}))
    mob, dc, bb = {"network": "mobile"}, {"network": "datacenter"}, {"network": "broadband"}
    none, sa = {"secagg": "none"}, {"secagg": "secagg_plus"}
    p0, p2 = {"setting": "000"}, {"setting": "002"}
    std, cs, rnd = {**p0, "scheme": "fl_std"}, {**p0, "scheme": "fl_cs@0.05"}, {**p0, "scheme": "fl_rnd@0.05"}
    sgd, sk = {**p2, "scheme": "fedsgd"}, {**p2, "scheme": "fedsketch"}
    faster = "reaches the target sooner (simulated seconds)"
    claims = [
        Claim(f"On mobile, FL-CS (r = 0.05) {faster} than FL-STD", "ttt", (gt({**std, **mob, **none}, {**cs, **mob, **none}),)),
        Claim(f"On mobile, FL-RND (r = 0.05) {faster} than FL-STD", "ttt", (gt({**std, **mob, **none}, {**rnd, **mob, **none}),)),
        Claim(f"In the datacenter, FL-STD {faster} than FL-CS (r = 0.05): the server's L1 decoder dominates", "ttt",
              (gt({**cs, **dc, **none}, {**std, **dc, **none}),)),
        Claim(f"On mobile, FL-CS (r = 0.05) under SecAgg+ still {faster} than FL-STD without it", "ttt",
              (gt({**std, **mob, **none}, {**cs, **mob, **sa}),)),
        Claim(f"On mobile, FedSKETCH {faster} than FedSGD", "ttt", (gt({**sgd, **mob, **none}, {**sk, **mob, **none}),)),
        Claim(f"On broadband, FedSKETCH {faster} than FedSGD", "ttt", (gt({**sgd, **bb, **none}, {**sk, **bb, **none}),)),
        Claim(f"In the datacenter, FedSGD {faster} than FedSKETCH: decoding the sketch dominates", "ttt",
              (gt({**sk, **dc, **none}, {**sgd, **dc, **none}),)),
        Claim(f"On mobile, SecAgg+ makes FedSGD slower to the target", "ttt",
              (gt({**sgd, **mob, **sa}, {**sgd, **mob, **none}),)),
    ]
    cols = ["network", "secagg"]
    blocks = {
        "table": rep.table(["scheme"], [Cell("", "ttt", spec="{:.3g}")], cols, split="setting"),
        "reached": rep.table(["scheme"], [Cell("", "reached", how="mean", spec="{:.2f}")], cols, split="setting"),
        "breakdown": rep.table(["scheme", "network"], [
            Cell("best accuracy", "best"), Cell("s per round", "round_s", spec="{:.3g}"),
            Cell("server s per round", "server_s", spec="{:.3g}"), Cell("slowest upload s", "upload_s", spec="{:.3g}"),
            Cell("uplink MB", "up_mb", spec="{:.1f}"), Cell("SecAgg MB", "secagg_mb", spec="{:.1f}"),
            Cell("ε", "eps", spec="{:.3f}")], ["secagg"], split="setting"),
    }
    expect = [dict(setting="000", scheme=["fl_std", "fl_rnd@0.05", "fl_rnd@0.1", "fl_cs@0.05", "fl_cs@0.1"],
                   network=list(NETWORKS), secagg=list(SECAGG)),
              dict(setting="002", scheme=["fedsgd", "fedsketch"], network=list(NETWORKS), secagg=list(SECAGG))]
    return rep.files(blocks, claims=claims, expect=expect)
