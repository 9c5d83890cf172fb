"""What a deployment pays: simulated time to a target accuracy under three network profiles, with and without
SecAgg+, in paper 000's setting (FL-STD, FL-RND, FL-CS; client-level DP ε = 1) and paper 002's (FedSGD, FedSKETCH).
The claims about where compression pays were written down before the paper-000 sweep had finished."""

from __future__ import annotations

import math
from pathlib import Path

from fedrun.reports.common import Cell, Report, column, dims, export, load, series_value

K, F = export("results/deploy", "deploy-kerkouche21"), export("results/deploy", "deploy-fedsketch")
#: target test accuracy per setting: paper 000's in 50 rounds at ε = 1, paper 002's in 80 rounds (τ = 1)
TARGETS = {"000": 0.5, "002": 0.75}
SCHEMES = {"fl_std": "FL-STD", "fl_rnd@0.05": "FL-RND r = 0.05", "fl_rnd@0.1": "FL-RND r = 0.1",
           "fl_cs@0.05": "FL-CS r = 0.05", "fl_cs@0.1": "FL-CS r = 0.1", "fedsgd": "FedSGD",
           "fedsketch": "FedSKETCH (50, 100)"}
NETWORKS = {"mobile": "mobile", "broadband": "broadband", "datacenter": "datacenter"}
SECAGG = {"none": "no SecAgg", "secagg_plus": "SecAgg+"}


def time_to_target(row) -> float:
    """The simulated clock at the first evaluated round reaching the target, else the whole run's (a lower bound)."""
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
    m, avg = (lambda k: df[f"metrics.{k}"]), (lambda p: sum(v for _, v in p) / max(1, len(p)))
    df = df.assign(ttt=[time_to_target(row) for row in df.to_dict("records")], best=m("best_test_accuracy"),
                   ttt_reached=m("best_test_accuracy") >= df["setting"].map(TARGETS),
                   round_s=m("sim_time_s_final") / m("rounds_completed"), up_mb=m("uplink_bytes_total") / 1e6,
                   server_s=series_value(df, "clock_server_s", avg), upload_s=series_value(df, "clock_upload_s", avg),
                   secagg_mb=(m("secagg_uplink_bytes_total").fillna(0) + m("secagg_downlink_bytes_total").fillna(0))
                   / 1e6, eps=m("epsilon_final"))
    rep = Report("deploy", root, "results/deploy/time_to_accuracy.md", [K, F], df, dims(
        setting=dict(values={"000": "paper 000's setting, target 0.5", "002": "paper 002's setting, target 0.75"}),
        scheme=dict(values=SCHEMES), network=dict(values=NETWORKS), secagg=dict(values=SECAGG), seed={}))
    cols, reached = ["network", "secagg"], Cell("", "ttt_reached", how="mean", spec="{:.2f}")
    blocks = {"table": rep.table(["scheme"], [Cell("", "ttt", spec="{:.3g}")], cols, split="setting"),
              "reached": rep.table(["scheme"], [reached], cols, split="setting"),
              "breakdown": rep.table(["scheme", "network"], [
                  Cell("best accuracy", "best"), Cell("s per round", "round_s", spec="{:.3g}"),
                  Cell("server s per round", "server_s", spec="{:.3g}"), Cell("slowest upload s", "upload_s",
                                                                              spec="{:.3g}"),
                  Cell("uplink MB", "up_mb", spec="{:.1f}"), Cell("SecAgg MB", "secagg_mb", spec="{:.1f}"),
                  Cell("ε", "eps", spec="{:.3f}")], ["secagg"], split="setting")}
    return rep.files(blocks, claims=True, expect=[
        dict(setting="000", scheme=["fl_std", "fl_rnd@0.05", "fl_rnd@0.1", "fl_cs@0.05", "fl_cs@0.1"],
             network=list(NETWORKS), secagg=list(SECAGG)),
        dict(setting="002", scheme=["fedsgd", "fedsketch"], network=list(NETWORKS), secagg=list(SECAGG))])
