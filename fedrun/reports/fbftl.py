"""Paper 003 (Wang, Gursoy, Velipasalar: "Communication-Efficient and Privacy-Preserving Feature-based Federated
Transfer Learning", Globecom 2022): FL, FTL-full, FTL-c and FbFTL per source → target pair, and FbFTL with its server
lr tuned on the uploads. "line N": that line of the stored text ../shared/papers/003_3acfbf28b8b59d35.txt, which lost
the comparison table: its numbers are in the notes ../shared/papers/README.md, lines 60–61, for scale only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedrun.reports.common import Cell, Export, Report, at, column, dims, export, load, numbers, reach, series_value

OUT = "results/fbftl"
FM, MF, TUNED = (export(OUT, f"fbftl-{n}", every=5) for n in ("femnist-mnist", "mnist-fashion", "tuned"))
SCHEMES = {"fl": "FL", "ftl_full": "FTL-full", "ftl_c": "FTL-c", "fbftl": "FbFTL",
           "ftl_c_matched": "FTL-c at FbFTL's budget (1,200 rounds)"}
#: FTL-c's rounds at FbFTL's training budget, × the sweep's: FbFTL's 100 server epochs over the 60,000 samples are
#: 6.0 M sample-gradients, an FTL-c round ≈ 100 clients × 10 samples × 5 GD steps = 5,000 (rows ftl_c_matched)
MATCHED = 12
#: a common target accuracy per pair, fixed before these runs: just below the lowest best accuracy of the four schemes
#: in the first, single-seed comparison (git show 979bf0a:results/fbftl/comparison.md)
TARGETS = {"mnist": ("m", 0.78), "fashion_mnist": ("f", 0.68)}
#: params.scheme.tune_lrs as logged → the row of fbftl_tuned.md (experiment=fbftl_tuned_*: the server searches the lr)
LR_CHOICE = {"None": "fixed", "": "fixed", "[0.01, 0.03, 0.1, 0.3]": "tuned"}


def _frame(root: Path, exports: list[Export]) -> pd.DataFrame:
    df = load(root, exports)
    df["target"] = column(df, "tags.dataset")
    df["scheme"] = column(df, "tags.scheme", "params.scheme.name")
    df["rounds"] = column(df, "params.rounds", kind=int)   # the experiments' 100: a shorter trial run is left out
    # a transfer scheme's run counts when it trained its own source model (source_seed = seed): the runs before
    # debe7f5 shared one (source_seed 0), a shift common to every seed (fedrun/transfer/source.py says why)
    own = column(df, "params.scheme.source_seed", kind=int) == df["seed"]
    df["source_model"] = (own | (df.scheme == "fl")).map({True: "per seed", False: "shared"})
    return df.assign(acc=df["metrics.test_accuracy"], best=df["metrics.best_test_accuracy"])


def table(root: Path, exports: tuple[Export, ...] = (FM, MF), rounds: int = 100) -> dict[Path, bytes]:
    """table.md from the two sweeps' exports (``exports``, ``rounds``: other runs, e.g. a CI-sized sweep)."""
    df = _frame(root, list(exports))
    df["source"] = column(df, "params.scheme.source_dataset")
    df.loc[(df.scheme == "ftl_c") & (df.rounds == MATCHED * rounds), "scheme"] = "ftl_c_matched"
    m = lambda k: df[f"metrics.{k}"]  # noqa: E731
    df = df.assign(batches=m("upload_batches_total"), per_batch=m("params_per_batch"),
                   batch_kb=m("uplink_bytes_per_batch") * 8 / 1e3, up_gb=m("uplink_bytes_final") * 8 / 1e9,
                   up_formula_gb=m("paper_uplink_bits") / 1e9, down_formula_mb=m("paper_downlink_bits") / 1e6,
                   down_bcast_mb=m("downlink_broadcast_bytes_total") * 8 / 1e6, best_round=m("best_round"),
                   down_client_gb=m("downlink_bytes_final") * 8 / 1e9, up_best_gb=m("uplink_bytes_at_best") * 8 / 1e9,
                   source_acc=m("source_test_accuracy"))
    for k, v in (("server_lr", "server_lr"), ("leak", "label_leakage_bits"),
                 ("leak_expected", "label_leakage_expected_bits"), ("prior_bits", "label_prior_bits")):
        df[k] = m(v).where(df.scheme == "fbftl")
    df["leak_frac"] = df["leak"] / df["prior_bits"]
    for target, (k, acc) in TARGETS.items():
        hit = df.target == target
        df[f"rounds_{k}"] = series_value(df, "test_accuracy", lambda p, acc=acc: reach(p, acc)).where(hit)
        # to the target: censored (``_c``, with ``_c_reached``) at the run's last round and its total uplink where
        # the run never reached it (a time-to-event outcome: the claims' log-rank test)
        df[f"rounds_{k}_c"] = df[f"rounds_{k}"].fillna(m("rounds_completed")).where(hit)
        df[f"up_{k}_gb"] = pd.Series([at((s or {}).get("uplink_bytes_total", []), r) * 8 / 1e9 for s, r in zip(
            df["series"], df[f"rounds_{k}"])], index=df.index, dtype=float).where(hit)
        df[f"up_{k}_gb_c"] = df[f"up_{k}_gb"].fillna(df["up_gb"]).where(hit)
        df[f"rounds_{k}_c_reached"] = df[f"up_{k}_gb_c_reached"] = df[f"rounds_{k}"].notna()
    rep = Report("fbftl", root, f"{OUT}/table.md", list(exports), df, dims(
        target=dict(values={"mnist": "target MNIST", "fashion_mnist": "target Fashion-MNIST"}),
        source=dict(values={"femnist": "FEMNIST", "mnist": "MNIST"}), scheme=dict(values=SCHEMES),
        rounds=dict(values=[rounds, MATCHED * rounds]), seed={}),
        where={"status": ("FINISHED",), "params.scheme.tune_lrs": ("None", ""),   # fbftl_tuned.md's runs search the lr
               "source_model": ("per seed",),
               "params.scheme.clients_hold_source": ("False", "")}, paper=numbers(root, OUT, "fbftl"),
        quantities={"up_gb": ("total uplink, Gb", "{:,.0f}"), "acc": ("final test accuracy", "{:.4f}"),
                    "batches": ("upload batches", "{:,.0f}"), "per_batch": ("parameters per upload batch", "{:,.0f}")})
    pairs, paper_schemes = (("mnist", "femnist"), ("fashion_mnist", "mnist")), list(SCHEMES)[:4]
    expect = [dict(target=t, source=src, scheme=paper_schemes, rounds=rounds) for t, src in pairs] + [
        dict(target=t, source=src, scheme="ftl_c_matched", rounds=MATCHED * rounds) for t, src in pairs]
    rows = ["source", "scheme"]
    figure = rep.curves("table_accuracy.svg", ["target"], ["scheme"], "LeNet-5, 6000 clients: test accuracy per round "
                        "(FbFTL: per server epoch), mean over seeds (band: ± std)", {"scheme": tuple(paper_schemes)},
                        ("scheme", {
                            "fl": "black", "ftl_full": "tab:blue", "ftl_c": "tab:green", "fbftl": "tab:red"}))
    return rep.files({
        "bytes": rep.table(rows, [
            Cell("upload batches", "batches", spec="{:,.0f}"), Cell("(paper)", paper="batches", spec="{:,.0f}"),
            Cell("parameters per batch", "per_batch", "same", "{:,.0f}"),
            Cell("(paper)", paper="per_batch", spec="{:,.0f}"),
            Cell("uplink per batch, kb", "batch_kb", "same", "{:.4g}"), Cell("total uplink, Gb", "up_gb", spec="{:.4g}"),
            Cell("… paper's formula, Gb", "up_formula_gb", "mean", "{:.4g}"),
            Cell("(paper), Gb", paper="up_gb", spec="{:,.0f}"),
            Cell("downlink broadcast, Mb", "down_bcast_mb", "same", "{:.4g}"),
            Cell("… paper's formula, Mb", "down_formula_mb", "same", "{:.4g}"),
            Cell("downlink per receiving client, Gb", "down_client_gb", spec="{:.4g}")], split="target"),
        "accuracy": rep.table(rows, [
            Cell("final", "acc", spec="{:.4f}"), Cell("best", "best", spec="{:.4f}"),
            Cell("(paper)", paper="acc", spec="{:.4f}"), Cell("round of best", "best_round", spec="{:.0f}"),
            Cell("uplink to best, Gb", "up_best_gb", "mean", "{:.4g}"),
            Cell("source model accuracy", "source_acc", "same", "{:.4f}"),
            Cell("FbFTL server lr", "server_lr", "same", "{:g}")], split="target"),
        "target": rep.table(rows, [
            Cell("first round ≥ 0.78", "rounds_m", spec="{:.0f}"), Cell("uplink to 0.78, Gb", "up_m_gb", spec="{:.4g}"),
            Cell("first round ≥ 0.68", "rounds_f", spec="{:.0f}"), Cell("uplink to 0.68, Gb", "up_f_gb", spec="{:.4g}")],
            split="target", drop_empty=True),
        "leakage": rep.table(["source", "target"], [Cell("observed", "leak"), Cell("expected", "leak_expected", "same"),
                                                    Cell("prior uncertainty", "prior_bits", "same")],
                             where={"scheme": "fbftl"})}, figure, expect, claims=True)


def tuned(root: Path) -> dict[Path, bytes]:
    df = _frame(root, [TUNED, FM, MF])
    df["lr_choice"] = column(df, "params.scheme.tune_lrs", map=LR_CHOICE)
    df = df.assign(lr=df["metrics.server_lr"], up_mb=df["metrics.uplink_bytes_final"] * 8 / 1e6,
                   val=df["metrics.tune_best_val_accuracy"].where(df.lr_choice == "tuned"))
    rep = Report("fbftl_tuned", root, f"{OUT}/fbftl_tuned.md", [TUNED, FM, MF], df, dims(
        target=dict(values={"mnist": "FEMNIST → MNIST", "fashion_mnist": "MNIST → Fashion-MNIST"}),
        scheme=dict(values=["fbftl"]), lr_choice=dict(values={"fixed": "fixed lr 0.1 (table.md)", "tuned": "lr tuned "
                                                              "on held-out uploads"}, header="server lr"),
        rounds=dict(values=[100]), seed={}), where={"status": ("FINISHED",), "params.scheme.clients_hold_source": (
            "False", ""), "source_model": ("per seed",)})
    return rep.files({"table": rep.table(["lr_choice"], [
        Cell("server lr (min)", "lr", "min", "{:g}"), Cell("server lr (max)", "lr", "max", "{:g}"),
        Cell("held-out accuracy", "val", spec="{:.4f}"), Cell("total uplink, Mb", "up_mb", spec="{:.4g}"),
        Cell("final test accuracy", "acc", spec="{:.4f}"), Cell("best test accuracy", "best", spec="{:.4f}")],
        split="target")}, {}, [dict(target=["mnist", "fashion_mnist"], scheme="fbftl", lr_choice=["fixed", "tuned"],
                                    rounds=100)], claims=True)
