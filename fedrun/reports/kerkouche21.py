"""Paper 000 (Kerkouche, Ács, Castelluccia, Genevès: "Compression Boosts Differentially Private Federated Learning",
EuroS&P 2021): Table III on Fashion-MNIST, the model-size check, the server-lr tuning, FL-STD-DP read the paper's way
(early stopping) and the privacy audit. "line N": that line of the stored text ../shared/papers/000_f465fe9b8ada4e59.txt
(it lacks Table III's grid): every number is stated in the text on Table III except FL-STD's without DP (inferred)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from fedrun.reports.common import Cell, Report, column, dims, export, load, numbers

OUT = "results/kerkouche21"
T3, SIZE, LR, LOCAL = (export(OUT, f"kerkouche21-{n}", every=10) for n in ("table3", "model-size", "server-lr",
                                                                            "local-lr"))
AUDIT = export(OUT, "kerkouche21-audit", every=10)
SCHEMES = {"fl_std": "FL-STD", "fl_rnd": "FL-RND", "fl_freq": "FL-FREQ", "fl_cs": "FL-CS"}
OPTS = {"paper": "paper's setup", "off": "server options off", "on": "server options on",
        "momentum": "server momentum, no error feedback"}


def _frame(root: Path, exports: list) -> pd.DataFrame:
    df = load(root, exports)
    df["scheme"] = column(df, "tags.scheme", "params.scheme.name")
    df["r"] = column(df, "params.r", kind=float).where(df.scheme != "fl_std", 1.0)  # FL-STD does not compress: r = 1
    df["dp"] = column(df, "tags.dp", map={"client": "on"})
    df["server_opts"] = column(df, "params.server_opts", missing="paper",   # runs from before the switch
                               map={"True": "on", "False": "off", "true": "on", "false": "off"})
    df["server_lr"] = column(df, "params.scheme.server_lr", kind=float)
    return df.assign(acc=df["metrics.best_test_accuracy"], round=df["metrics.best_round"])


def design_server_lr(root: Path, scheme: str, opts: str) -> float:
    """η_g of Table III's design for (scheme, server options): conf/experiment/kerkouche21_table3.yaml's ``server_lr``
    table (tuned on seed 100, which no cell uses: ``server_lr.md``), 1 where it has none."""
    import yaml

    table = yaml.safe_load((Path(root) / "conf/experiment/kerkouche21_table3.yaml").read_text())["server_lr"]
    return float((table.get(opts) or {}).get(scheme, 1.0))


def table3(root: Path) -> dict[Path, bytes]:
    df = _frame(root, [T3])
    # η_g: the design's (server_lr.md's tuning on seed 100; 1 with server options off), or what an earlier run used
    # (FL-RND "on" ran at η_g = 1 before the tuning): its own cells, shown, never pooled with the design's
    df["eta"] = ["design" if lr == design_server_lr(root, s, o) else f"η_g = {lr:g}"
                 for s, o, lr in zip(df["scheme"], df["server_opts"], df["server_lr"])]
    m, dp = (lambda k: df[f"metrics.{k}"]), df.dp == "on"
    df = df.assign(cost_mb=m("cost_bits_at_best") / 8e6, uplink_mb=m("uplink_bytes_at_best") / 1e6,
                   uplink_client_mb=m("uplink_bytes_at_best") / df["params.num_clients"].astype(float) / 1e6,
                   uplink_round_mb=m("uplink_bytes_final") / m("rounds_completed") / 1e6,
                   eps=m("epsilon_at_best").where(dp), eps_final=m("epsilon_final").where(dp),
                   sigma=m("dp_noise_multiplier").where(dp), clip=m("dp_clipping_norm").where(dp))
    rep = Report("kerkouche21_table3", root, f"{OUT}/table3.md", [T3], df, dims(
        scheme=dict(values=SCHEMES), r=dict(values=[1.0, 0.01, 0.05, 0.1, 0.2]),
        dp=dict(values=["off", "on"], labels={"off": "without DP", "on": "with client-level DP"}, header="DP"),
        server_opts=dict(values=OPTS, header="server options"),
        eta=dict(values=None, labels={"design": "the design's η_g"}, header="server lr"), seed={}),
        paper=numbers(root, OUT, "kerkouche21_table3"),
        quantities={"acc": ("best test accuracy", "{:.2f}"), "round": ("round of the best accuracy", "{:g}"),
                    "eps": ("ε at the best round", "{:g}"), "cost_mb": ("Cost r·n·32·Round·C to the best round, MB",
                                                                         "{:g}")})
    figure = rep.curves("table3_accuracy.svg", ["dp", "server_opts"], ["scheme", "r"], "Fashion-MNIST, fashion_cnn "
                        "(n = 114,314): test accuracy per round, mean over seeds (band: ± std)",
                        color=("scheme", {"fl_std": "black", "fl_rnd": "tab:blue", "fl_freq": "tab:green",
                                          "fl_cs": "tab:red"}), style=("r", {1.0: "-", 0.05: "-", 0.1: "--", 0.2: ":"}),
                        where={"eta": "design"})
    per_cell = [Cell("best accuracy", "acc"), Cell("round", "round", spec="{:.0f}"),
                Cell("round (paper)", paper="round", spec="{:g}"), Cell("Cost r·n·32·Round·C, MB", "cost_mb", "mean",
                "{:.3g}"), Cell("Cost (paper)", paper="cost_mb", spec="{:g}"),
                Cell("uplink to best round, MB", "uplink_mb", "mean", "{:.4g}"),
                Cell("… per client, MB", "uplink_client_mb", "mean", "{:.3g}"),
                Cell("ε at best round", "eps", "mean", "{:.2f}"), Cell("ε (paper)", paper="eps", spec="{:g}"),
                Cell("ε after all rounds", "eps_final", "same", "{:.2f}"), Cell("σ", "sigma", "same", "{:.3g}"),
                Cell("S", "clip", "same", "{:g}")]
    return rep.files({"main": rep.table(["scheme", "r"], [Cell("paper", paper="acc", spec="{:.2f}", level=1),
                                                          Cell(value="acc")], ["dp", "server_opts"],
                                        where={"eta": "design"}),
                      "per_cell": rep.table(["scheme", "r", "server_opts", "eta"], per_cell, split="dp",
                                            drop_empty=True)},
                     figure, [dict(scheme="fl_std", r=1.0, dp=["off", "on"], server_opts=["off", "on"], eta="design"),
                              dict(scheme=["fl_rnd", "fl_freq", "fl_cs"], r=[0.05, 0.1, 0.2], dp=["off", "on"],
                                   server_opts=["off", "on"], eta="design"),
                              dict(scheme="fl_cs", r=[0.05, 0.1, 0.2], dp=["off", "on"], server_opts="momentum",
                                   eta="design")], claims=True)


def model_size(root: Path) -> dict[Path, bytes]:
    df = _frame(root, [SIZE, T3])
    df["model"] = column(df, "params.model.name")
    rep = Report("kerkouche21_model_size", root, f"{OUT}/model_size.md", [SIZE, T3], df, dims(
        scheme=dict(values={"fl_std": "FL-STD-DP", "fl_cs": "FL-CS-DP"}), r=dict(values=[1.0, 0.05, 0.1]),
        model=dict(values={"fashion_cnn": "n = 114,314 (fashion_cnn)",
                           "fashion_cnn_1m": "n = 1,023,818 (fashion_cnn_1m)"}),
        server_opts=dict(values={o: OPTS[o] for o in ("off", "on")}, header="server options"), seed={}),
        where={"status": ("FINISHED",), "params.server_opts": ("off", "on"), "tags.dp": ("client",)},
        paper=numbers(root, OUT, "kerkouche21_model_size"),
        quantities={"acc": ("best test accuracy over 200 rounds", "{:.2f}")})
    figure = rep.curves("model_size_accuracy.svg", ["server_opts", "model"], ["scheme", "r"], "Client-level DP "
                        "(ε ≤ 1): test accuracy per round by model size", color=("scheme", {
                            "fl_std": "black", "fl_cs": "tab:red"}), style=("r", {1.0: "-", 0.05: "-", 0.1: "--"}))
    return rep.files({"main": rep.table(["scheme", "r"], [Cell("paper", paper="acc", spec="{:.2f}", level=0),
                                                          Cell(value="acc"), Cell("round", "round", "mean", "{:.0f}")],
                                        ["server_opts", "model"])}, figure, claims=True)


def server_lr(root: Path) -> dict[Path, bytes]:
    """The server lr of the server options, per scheme, and the local lr of every scheme (FL-STD without DP), both
    tuned on seed 100, which no table reports."""
    df = _frame(root, [LR])
    df["final"] = df["metrics.test_accuracy"]
    lrs = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
    rep = Report("kerkouche21_server_lr", root, f"{OUT}/server_lr.md", [LR], df, dims(
        scheme=dict(values=SCHEMES, labels={**SCHEMES, "fl_std": "FL-STD (r = 1)"}),
        server_lr=dict(values={v: f"η_g = {v:g}" for v in lrs}, header="server lr"), seed=dict(values=[100])))
    local = _frame(root, [LOCAL])
    local["lr"] = column(local, "params.lr", kind=float)
    lrep = Report("kerkouche21_local_lr", root, f"{OUT}/server_lr.md", [LOCAL], local, dims(
        scheme=dict(values=SCHEMES, labels={"fl_std": "FL-STD without DP, 40 rounds"}),
        lr=dict(values={v: f"lr = {v:g}" for v in (0.05, 0.1, 0.2, 0.4, 0.8)}), seed=dict(values=[100])))
    figure = rep.curves("server_lr_accuracy.svg", ["scheme"], ["server_lr"], "Server momentum ρ = 0.9 with DP (ε ≤ 1), "
                        "r = 0.05: test accuracy per round by server learning rate", color=("server_lr", dict(zip(
                            lrs, ("tab:purple", "tab:blue", "tab:green", "black", "tab:orange", "tab:brown")))))
    return rep.files({"best": rep.table(["scheme"], [Cell(value="acc", how="mean", best="max")], ["server_lr"]),
                      "rounds": rep.table(["scheme"], [Cell("round", "round", "mean", "{:.0f}"),
                                                       Cell("final", "final", "mean")], ["server_lr"]),
                      "local_runs": lrep.runs_line(),
                      "local": lrep.table(["scheme"], [Cell(value="acc", how="mean", best="max")], ["lr"])}, figure)


SMALL, LARGE = "fashion_cnn", "fashion_cnn_1m"     # n = 114,314 and 1,023,818


def stopping(root: Path, df: pd.DataFrame | None = None) -> dict[Path, bytes]:
    """FL-STD-DP as published (server options off, or from before the switch) of Table III and the model-size sweep:
    the best test accuracy up to round 30 against the best over 200 rounds, per model; the paper's 0.61 in claims."""
    df = load(root, [T3, SIZE]) if df is None else df.assign(seed=column(df, "params.seed", kind=int))
    df["model"] = column(df, "params.model.name", missing=SMALL)
    acc = df["series"].map(lambda s: dict((s or {}).get("test_accuracy", [])))
    df = df.assign(r20=acc.map(lambda a: a.get(20, math.nan)), r30=acc.map(lambda a: a.get(30, math.nan)),
                   best30=acc.map(lambda a: max([v for k, v in a.items() if k <= 30], default=math.nan)),
                   best=df["metrics.best_test_accuracy"].astype(float), round=df["metrics.best_round"])
    df["gain"] = df["best"] - df["best30"]
    rep = Report("kerkouche21_stopping", root, f"{OUT}/fl_std_dp_stopping.md", [T3, SIZE], df,
                 dims(model=dict(values=[SMALL, LARGE]), seed={}),
                 where={"status": ("FINISHED",), "tags.scheme": ("fl_std",), "tags.dp": ("client",),
                        "params.server_opts": ("off", "")})
    table = rep.table(["model", "seed"], [Cell(h, v, "same") for h, v in (
        ("accuracy at round 20", "r20"), ("at round 30", "r30"), ("best up to round 30", "best30"),
        ("best over 200 rounds", "best"))] + [Cell("its round", "round", "same", "{:.0f}")])
    return rep.files({"per_run": table, "means": rep.table(["model"], [
        Cell("best up to round 30", "best30"), Cell("best over 200 rounds", "best")])}, claims=True, readme=False)


def audit(root: Path) -> dict[Path, bytes]:
    """The privacy audit's runs: FL-STD-DP and FL-CS-DP r = 0.05, each also as the negative control without noise."""
    df = load(root, [AUDIT])
    df["scheme"] = column(df, "params.scheme.name")
    df["noise"] = column(df, "params.audit.negative_control", map={"True": "removed", "False": "on"}, missing="on")
    m = lambda k: df[f"metrics.{k}"]  # noqa: E731
    df = df.assign(sigma=column(df, "tags.dp.noise_multiplier", kind=float), clip=column(df, "params.clipping_norm",
                   kind=float), eps=m("epsilon_final"), eps_pld=m("epsilon_pld"), low=m("audit_epsilon_lower"),
                   correct=m("audit_correct"), guesses=m("audit_guesses"), included=m("audit_included"),
                   rounds=m("audit_participations_mean"), acc=m("best_test_accuracy"))
    rep = Report("kerkouche21_audit", root, f"{OUT}/audit.md", [AUDIT], df, dims(
        scheme=dict(values=SCHEMES), noise=dict(values={"on": "σ for ε = 1", "removed": "removed (negative control)"}),
        seed={}))
    table = rep.table(["scheme", "noise", "seed"], [Cell(h, v, "same", f) for h, v, f in (
        ("σ (accountant's)", "sigma", "{:g}"), ("S", "clip", "{:g}"), ("ε claimed (RDP)", "eps", "{:.3f}"),
        ("ε (PLD)", "eps_pld", "{:.3f}"), ("audit ε lower bound (95 %)", "low", "{:.3f}"),
        ("correct guesses", "correct", "{:.0f}"), ("guesses", "guesses", "{:.0f}"), ("canaries in", "included", "{:.0f}"),
        ("rounds per included canary", "rounds", "{:.2f}"), ("best test acc.", "acc", "{:.3f}"))])
    reading = []
    for r in rep.runs.sort_values(["scheme", "noise", "seed"]).itertuples():
        control = r.noise == "removed"
        verdict = ("the audit refutes the claimed ε (it catches the missing noise)" if r.low > r.eps else
                   "consistent with the claimed ε" + (" — the control was NOT caught" if control else ""))
        reading.append(f"- {SCHEMES[r.scheme]}{' without noise' if control else ''}, seed {r.seed}: lower bound "
                       f"{r.low:.3f} vs claimed {r.eps:.3f}: {verdict}.")
    return rep.files({"table": table, "reading": "\n".join(reading)})
