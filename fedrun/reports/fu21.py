"""Paper 001 (Fu et al.: "On the Practicality of Differential Privacy in Federated Learning by Tuning Iteration
Times", arXiv 2101.04163): final test error against E (local iterations per global iteration) with local DP, on
Lending Club (LR, Laplace) and FEMNIST (CNN, Gaussian). "line N": that line of the stored text
../shared/papers/001_831166c7be13f0c3.txt, which has no results (no paper column: the claims quote the text)."""

from __future__ import annotations

from pathlib import Path

from fedrun.reports.common import Cell, Report, column, dims, export, load

OUT = "results/fu21"
MECHS = {"laplace": "Laplace (the paper's, L1)", "gaussian": "Gaussian (δ = 1e-4, L2)"}
LC, FEMNIST = export(OUT, "fu21-lending-club", every=10), export(OUT, "fu21-femnist")
INF = float("inf")
#: the cells the sweeps fill (Lending Club: experiment=fu21_lending_club[_tg10], 10 seeds; FEMNIST: fu21_femnist,
#: fu21_femnist_tg6, fu21_femnist_proven, 10 seeds)
LC_EXPECT = [dict(sweep="T100", eps=[INF, 10.0, 5.0, 3.0], E=[1, 2, 5, 10, 20, 50, 100]),
             dict(sweep="Tg10", eps=[INF, 10.0, 3.0], E=[1, 2, 5, 10, 20, 50])]
FEMNIST_EXPECT = [dict(sens="paper_unchecked", sweep="T24", eps=[INF, 30.0, 10.0, 3.0], E=[1, 2, 4, 8]),
                  dict(sens="paper_unchecked", sweep="Tg6", eps=[INF, 3.0], E=[1, 2, 4, 8]),
                  dict(sens="proven", sweep="T24", eps=10.0, E=[1, 2, 4, 8])]


def _per_cell(value: str, header: str, eps: list[Cell], spec: str, ratio: str) -> list[Cell]:
    """The per-cell table's columns: iterations, seeds, the final value, ε composed, the noise item."""
    return [Cell("T_g", "tg", "same", "{:.0f}"), Cell("T_l (max)", "tl", "same", "{:.0f}"), Cell("seeds", value, "n"),
            Cell(header, value, spec=spec), *eps, Cell("noise item var/coord, measured", "noise", "mean", "{:.3g}"),
            Cell("noise item var/coord, formula", "noise_formula", "mean", "{:.3g}"),
            Cell("measured / formula", "noise_ratio", "mean", ratio)]


def _frame(root: Path, exp, total: dict, eps: list, steps: list, tg: int, **more: dict) -> tuple:
    """The runs with the dims sweep (fixed T or fixed T_g = tg), eps, E, seed and the per-cell values."""
    df = load(root, [exp])
    df["sweep"] = column(df, "params.total_iterations", map=total)
    df["eps"] = column(df, "params.epsilon", kind=float)
    df["E"] = column(df, "params.local_steps", kind=int)
    noisy = df["eps"].isin(eps[1:])   # ε = ∞ adds no noise
    df = df.assign(tg=df["params.rounds"].astype(float), tl=df["metrics.ldp_participations_max"],
                   noise=df["metrics.ldp_noise_item_var"].where(noisy),
                   noise_formula=df["metrics.ldp_noise_item_var_formula"].where(noisy))
    df["noise_ratio"] = df["noise"] / df["noise_formula"]
    return df, dims(**more, sweep=dict(values=list(total.values()), labels={
        v: (f"fixed T = E·T_g = {k} (T_g = {k} / E)" if k != "None" else f"fixed T_g = {tg} global iterations "
            f"(T = {tg}·E)") for k, v in total.items()}),
        eps=dict(values=eps, labels={e: f"ε = {e:g}".replace("inf", "∞") for e in eps}, header="ε (target)"),
        E=dict(values=steps, labels={e: f"E = {e}" for e in steps}), seed={})


def lending_club(root: Path, sensitivity: str = "proven") -> dict[Path, bytes]:
    proven = sensitivity == "proven"
    df, d = _frame(root, LC, {"100": "T100", "None": "Tg10"}, [INF, 10.0, 5.0, 3.0], [1, 2, 5, 10, 20, 50, 100], 10,
                   mech=dict(values=MECHS, header="noise", default="laplace"))
    df = df.assign(mse=df["metrics.test_mse"], eps_composed=df["metrics.ldp_epsilon_max"],
                   mech=column(df, "params.dp", map={"local_laplace": "laplace", "local_gaussian": "gaussian"}))
    stem = "lending_club" + ("" if proven else "_paper_unchecked")
    rep = Report(f"fu21_{stem}", root, f"{OUT}/{stem}.md", [LC], df, d,
                 where={"status": ("FINISHED",), "params.local_dp_sensitivity": (sensitivity,)})
    figures, colors = {}, ("E", {1: "black", 2: "tab:blue", 5: "tab:green", 10: "tab:red", 20: "tab:purple",
                                 50: "tab:orange", 100: "tab:brown"})
    for s, t in (("T100", "fixed T = E·T_g = 100"), ("Tg10", "fixed T_g = 10")):
        figures |= rep.curves(f"{stem}_{s}.svg", ["eps"], ["E"], f"{t}: test MSE per global iteration, mean over "
                              "seeds (band: ± std where above 0)", {"sweep": s}, colors, series="test_mse",
                              ylabel="test MSE (log)", xlabel="global iteration", yscale="log")
    eps = [Cell("ε composed, worst client (Laplace: basic)", "eps_composed", "max", "{:.3g}")]
    laplace = {"mech": "laplace"}
    return rep.files({"mse": rep.table(["eps"], [Cell(value="mse", spec="{:.2f}", best="min")], ["E"], "sweep",
                                       laplace),
                      "per_cell": rep.table(["eps", "E"], _per_cell("mse", "final test MSE", eps, "{:.2f}", "{:.2f}"),
                                            split="sweep", where=laplace),
                      "mechanisms": rep.table(["mech"], [Cell("final test MSE", "mse", spec="{:.2f}")],
                                              where=dict(sweep="T100", eps=5.0, E=10, seed=tuple(range(1000, 1010))))},
                     figures, [{**e, **laplace} for e in LC_EXPECT], claims=True)


def femnist(root: Path) -> dict[Path, bytes]:
    df, d = _frame(root, FEMNIST, {"24": "T24", "None": "Tg6"}, [INF, 30.0, 10.0, 3.0], [1, 2, 4, 8], 6, sens=dict(
        values={"paper_unchecked": "the paper's Δ = 2ζηE/n_l, unchecked",
                "proven": "the proven Δ = 2ζη/n_l + 2ζη(E−1)"}, header="sensitivity"))
    df["sens"] = column(df, "params.local_dp_sensitivity")
    df = df.assign(acc=df["metrics.test_accuracy"], eps_pld=df["metrics.ldp_epsilon_pld_max"],
                   eps_rdp=df["metrics.ldp_epsilon_rdp_max"])
    rep = Report("fu21_femnist", root, f"{OUT}/femnist.md", [FEMNIST], df, d)
    unchecked = {"sens": "paper_unchecked"}
    eps = [Cell("ε composed (PLD)", "eps_pld", "max", "{:.3g}"), Cell("ε composed (RDP)", "eps_rdp", "max", "{:.3g}")]
    return rep.files({"acc": rep.table(["eps"], [Cell(value="acc", best="max")], ["E"], "sweep", unchecked),
                      "per_cell": rep.table(["eps", "E"], _per_cell("acc", "final test accuracy", eps, "{:.3f}",
                                                                    "{:.3f}"), split="sweep", where=unchecked),
                      "sensitivities": rep.table(["sens"], [Cell(value="acc", best="max")], ["E"],
                                                 where=dict(sweep="T24", eps=10.0))}, {}, FEMNIST_EXPECT, claims=True)
