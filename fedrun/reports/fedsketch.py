"""Paper 002 (Haddadpour et al., "FedSKETCH: Communication-Efficient and Private Federated Learning via Sketching",
arXiv 2008.04975): Figures 1 and 2 on MNIST / LeNet-5, the η tuning, FedSKETCHGATE's diagnostics and SketchedSGD
with more heavy coordinates. "line N": that line of the stored text ../shared/papers/002_74ec579889723eed.txt (no
figures); its only numbers for these figures are the compression ratios 75× and 12× (line 193)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedrun.reports.common import Cell, Report, at, column, dims, export, load, numbers, series_value

OUT = "results/fedsketch"
HOM, HET, TUNE, HEAVY = (export(OUT, f"fedsketch-{n}", every=10)
                         for n in ("homogeneous", "heterogeneous", "tune", "sketchedsgd-heavy"))
GATE = export(OUT, "fedsketch-gate-diagnostics", metrics=("sketch/gate_*", "test_accuracy"))
SCHEMES = {"fedsgd": "FedSGD", "sketchedsgd": "SketchedSGD", "fedsketch": "FS", "fedsketchgate": "FSGATE"}
DECODERS = {"none": "", "topm": "", "privix": "PRIVIX", "heaprix": "HEAPRIX"}
SKETCHES = {"none": "", "20": "(20, 40)", "50": "(50, 100)"}
SPLITS = {"homogeneous": "Figure 1: homogeneous (i.i.d.)",
          "heterogeneous": "Figure 2: heterogeneous (1–2 classes per worker)"}
COLOR = ("unsketch", {"none": "black", "topm": "tab:green", "privix": "tab:blue", "heaprix": "tab:red"})
STYLE = ("sketch", {"none": "-", "20": "--", "50": "-"})


def _frame(root: Path, exports: list) -> pd.DataFrame:
    """Runs with the dims scheme, unsketch (the decoder), sketch (its rows t: (t, k) = (20, 40) or (50, 100)), lr."""
    df = load(root, exports)
    df["scheme"] = column(df, "params.scheme.name")
    df["unsketch"] = column(df, "params.scheme.unsketch", missing="none")
    df["sketch"] = column(df, "params.scheme.rows", missing="none")
    df.loc[df.scheme == "fedsgd", ["unsketch", "sketch"]] = "none"    # FedSGD sends its update uncompressed
    df.loc[df.scheme == "sketchedsgd", "unsketch"] = "topm"           # the top-m heavy hitters, exact values
    df["lr"] = column(df, "params.lr", kind=float)
    return df.assign(acc=df["metrics.test_accuracy"], acc_best=df["metrics.best_test_accuracy"])


def _dims(schemes: list[str], **more: dict) -> dict:
    return dict(scheme=dict(values=schemes, labels=SCHEMES, header="method"),
                unsketch=dict(values=DECODERS, header="decoder"), sketch=dict(values=SKETCHES, header="sketch (t, k)"),
                **more)


def figures(root: Path) -> dict[Path, bytes]:
    df = _frame(root, [HOM, HET])
    df["split"] = column(df, "params.partition.name", map={"iid": "homogeneous", "shards": "heterogeneous"})
    df["tau"] = column(df, "params.local_steps", kind=int)
    up, down, n = df["metrics.uplink_bytes_final"], df["metrics.downlink_bytes_final"], df["metrics.rounds_completed"]
    df = df.assign(rounds=n, clients=df["metrics.clients"], uplink_mb=up / 1e6, downlink_mb=down / 1e6,
                   downlink_round=down / n, uplink_worker_round=up / n / df["metrics.clients"])
    df["compression"] = 4 * df["tags.fedrun.num_parameters"].astype(float) / df["uplink_worker_round"]
    taus = {t: f"τ = {t}" for t in (1, 2, 5)}
    # a run that diverged is a result at its η (scored at its last test accuracy), never a reason to re-tune
    diverged = df.get("tags.fedrun.failure_reason", pd.Series("", index=df.index)).fillna("").astype(str).str.contains(
        "diverged")
    df["outcome"] = ["diverged" if d else str(s).lower() for s, d in zip(df["status"], diverged)]
    df["diverged"] = diverged.astype(float)
    rep = Report("fedsketch", root, f"{OUT}/figures.md", [HOM, HET], df, dims(split=dict(values=SPLITS), **_dims(
        list(SCHEMES), lr=dict(header="η"), tau=dict(values=taus, header="τ"), seed={})),
        where={"outcome": ("finished", "diverged")},
        paper=numbers(root, OUT, "fedsketch"),
        quantities={"compression": ("uplink compression against the float32 update (measured)", "{:g}×")})
    sketches = dict(split="homogeneous", scheme="fedsketch", unsketch=["privix", "heaprix"], sketch=["20", "50"],
                    lr=0.1)
    expect = [dict(split="homogeneous", scheme="fedsgd", unsketch="none", sketch="none", lr=0.1, tau=[1, 2, 5]),
              dict(split="homogeneous", scheme="sketchedsgd", unsketch="topm", sketch="20", lr=1.0, tau=1),
              dict(split="homogeneous", scheme="sketchedsgd", unsketch="topm", sketch="50", lr=[1.0, 0.3], tau=1),
              dict(sketches, tau=[1, 2, 5]),
              dict(sketches, unsketch="heaprix", sketch="20", lr=0.03, tau=1),   # a seed diverged at η = 0.1
              dict(sketches, unsketch="privix", sketch="20", lr=0.03, tau=5),
              dict(split="heterogeneous", scheme="fedsgd", unsketch="none", sketch="none", lr=0.1, tau=[1, 5]),
              dict(split="heterogeneous", scheme="sketchedsgd", unsketch="topm", sketch=["20", "50"], lr=[1.0, 0.3],
                   tau=1),
              dict(sketches, split="heterogeneous", tau=[1, 5]),
              dict(sketches, split="heterogeneous", sketch="20", lr=0.03, tau=1),
              dict(split="heterogeneous", scheme="fedsketchgate", unsketch=["privix", "heaprix"], sketch="20",
                   lr=[0.01, 0.003], tau=1),
              dict(split="heterogeneous", scheme="fedsketchgate", unsketch="heaprix", sketch="50", lr=0.01, tau=1)]
    lines = ["scheme", "unsketch", "sketch"]
    figs = {**rep.curves("figure1_homogeneous.svg", ["tau"], lines, "Figure 1, homogeneous (i.i.d.): test accuracy "
                         "per round, mean over seeds (band: ± std); dashed (20, 40)", {"split": "homogeneous"},
                         COLOR, STYLE),
            **rep.curves("figure2_heterogeneous.svg", ["tau"], lines, "Figure 2, heterogeneous (1–2 classes per "
                         "worker): test accuracy per round, mean over seeds (band: ± std)",
                         {"split": "heterogeneous", "scheme": ("fedsgd", "sketchedsgd", "fedsketch")}, COLOR, STYLE),
            **rep.curves("figure2_gate.svg", ["scheme"], lines, "Figure 2, heterogeneous, τ = 1: FedSKETCHGATE (40 "
                         "rounds, all 50 workers) and FedSGD (80 rounds, 25)",
                         {"split": "heterogeneous", "tau": 1, "scheme": ("fedsgd", "fedsketchgate")}, COLOR, STYLE)}
    return rep.files({
        "accuracy": rep.table(["scheme", "unsketch", "sketch", "lr"], [Cell("final", "acc"), Cell("best", "acc_best"),
                                                                       Cell("diverged", "diverged", "mean", "{:.0%}")],
                              ["tau"], "split"),
        "bytes": rep.table(["scheme", "unsketch", "sketch"], [
            Cell("runs", "acc", "n"), Cell("rounds", "rounds", "same", "{:.0f}"),
            Cell("workers per round", "clients", "same", "{:.0f}"),
            Cell("uplink per worker and round, B", "uplink_worker_round", "same", "{:,.0f}"),
            Cell("compression", "compression", "same", "{:.1f}×"),
            Cell("compression (paper)", paper="compression", spec="{:g}×"),
            Cell("uplink over the run, MB", "uplink_mb", "same", "{:.2f}"),
            Cell("downlink over the run, MB", "downlink_mb", "same", "{:.2f}")], split="split")}, figs, expect,
        claims=True)


def tuning(root: Path) -> dict[Path, bytes]:
    lrs = [0.01, 0.03, 0.1, 0.3, 1.0, 3.0]
    rep = Report("fedsketch_tune", root, f"{OUT}/tuning.md", [TUNE], _frame(root, [TUNE]), dims(**_dims(
        ["fedsgd", "sketchedsgd", "fedsketch"], lr=dict(values={x: f"η = {x:g}" for x in lrs}, header="η"),
        seed=dict(values=[100]))))
    rows = ["scheme", "unsketch", "sketch"]
    return rep.files({v: rep.table(rows, [Cell(value=c, how="mean", best="max")], ["lr"])
                      for v, c in (("final", "acc"), ("best", "acc_best"))},
                     expect=[dict(scheme="fedsgd", unsketch="none", sketch="none", lr=lrs),
                             dict(scheme="sketchedsgd", unsketch="topm", sketch=["20", "50"], lr=lrs),
                             dict(scheme="fedsketch", unsketch=["privix", "heaprix"], sketch=["20", "50"], lr=lrs)])


def gate_diagnostics(root: Path) -> dict[Path, bytes]:
    df = _frame(root, [GATE])
    df["heavy"] = column(df, "params.scheme.num_heavy", map={"None": "k"})
    df["hashes"] = column(df, "params.scheme.hashes")
    steps = (1, 2, 3, 5, 10, 15, 20)
    for k in steps:
        for c, metric in (("m", "gate_c_mean_norm"), ("r", "gate_c_rms_norm")):
            df[f"{c}{k}"] = series_value(df, metric, lambda p, k=k: at(p, k))
    rep = Report("fedsketch_gate_diag", root, f"{OUT}/gate_diagnostics.md", [GATE], df, dims(
        unsketch=dict(values=["privix", "heaprix"], labels=DECODERS, header="decoder"),
        sketch=dict(values={"20": "(20, 40)", "1": "(1, 800)"}, header="sketch (t, k)"),
        heavy=dict(values={"k": "", "61706": "m = d (exact)"}, header="heavy coordinates"),
        hashes=dict(values={"fixed": "fixed", "per_round": "fresh per round"}), lr=dict(header="η"),
        status=dict(values={"FINISHED": "ok", "FAILED": "diverged"}), seed={}),
        where={"status": ("FINISHED", "FAILED")})
    rows = ["unsketch", "sketch", "heavy", "hashes", "lr", "status"]
    return rep.files({b: rep.table(rows, [Cell(f"round {k}", f"{c}{k}", "same", "{:.2g}") for k in steps])
                      for b, c in (("rms", "r"), ("mean", "m"))})


def sketchedsgd_heavy(root: Path) -> dict[Path, bytes]:
    df = _frame(root, [HEAVY])
    df["heavy"] = column(df, "params.scheme.num_heavy", kind=int)
    df["up_worker_round"] = df["metrics.uplink_bytes_final"] / df["metrics.rounds_completed"] / df["metrics.clients"]
    rep = Report("fedsketch_sketchedsgd_heavy", root, f"{OUT}/sketchedsgd_heavy.md", [HEAVY], df, dims(
        heavy=dict(values={40: "m = 40 (= k)", 400: "m = 400", 4000: "m = 4000"}, header="heavy coordinates per round"),
        lr=dict(values={0.1: "η = 0.1", 1.0: "η = 1"}, header="η"), seed={}))
    return rep.files({"table": rep.table(["heavy"], [
        Cell("final", "acc", "mean"), Cell("best", "acc_best", "mean"),
        Cell("uplink per worker and round, B", "up_worker_round", "mean", "{:,.0f}", level=0)], ["lr"])})
