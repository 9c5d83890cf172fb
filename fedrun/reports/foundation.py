"""The foundation check: FL-STD (FedAvg) on MNIST and Fashion-MNIST. Not a paper's table: the plain FedAvg every
compressing or private scheme is measured against, at the datasets' own defaults."""

from __future__ import annotations

from pathlib import Path

from fedrun.reports.common import Cell, Report, column, dims, export, load

EXPORT = export("results/foundation", "foundation-fl-std")


def fl_std(root: Path) -> dict[Path, bytes]:
    df = load(root, [EXPORT])
    df["dataset"] = column(df, "tags.dataset")
    df = df.assign(best=df["metrics.best_test_accuracy"], final=df["metrics.test_accuracy"],
                   best_round=df["metrics.best_round"], up_mb=df["metrics.uplink_bytes_at_best"] / 1e6,
                   cost=df["metrics.cost_bits_at_best"] / 1e6)
    rep = Report("foundation_fl_std", root, "results/foundation/fl_std_two_datasets.md", [EXPORT], df,
                 dims(dataset=dict(values={"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}), seed={}))
    figure = rep.curves("fl_std_two_datasets.svg", [], ["dataset"], "FL-STD, LeNet-5, 100 clients: test accuracy per "
                        "round, mean over seeds (band: ± std)", color=("dataset", {"mnist": "black",
                                                                                 "fashion_mnist": "tab:blue"}))
    return rep.files({"table": rep.table(["dataset"], [
        Cell("best test accuracy", "best", spec="{:.4f}"), Cell("round of the best", "best_round", spec="{:.0f}"),
        Cell("final test accuracy", "final", spec="{:.4f}"),
        Cell("uplink to the best round, MB", "up_mb", spec="{:.2f}"), Cell("cost to the best round, Mbit", "cost",
                                                                           spec="{:.2f}")])}, figure,
        expect=[dict(dataset=["mnist", "fashion_mnist"])])
