"""What every report module shares: load an export, place runs in cells, mean ± sd, tables, claims, the document.

A report module (one per paper) loads its exports with :func:`load` (a DataFrame, one row per run), adds its dims
and values as plain pandas columns, and hands the frame to a :class:`Report`, which keeps one run per (cell, seed),
formats the tables, the claims and the paper's numbers, and gives the files (:meth:`Report.files`).
"""

from __future__ import annotations

import itertools
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import pandas as pd

MARKS = ("†", "‡", "§", "¶", "‖", "#")
MET, NOT_MET, NOISE, FEW, NOT_CHECKABLE = ("met", "not met", "inconclusive (within noise)",
                                           "inconclusive (fewer than {n} seeds)", "not checkable")


class Export(NamedTuple):
    """A committed export (``<path>.runs.csv.gz`` + ``.metrics.csv.gz``) and how ``--export`` makes it again."""
    path: str
    experiment: str
    every: int | None = None
    metrics: tuple[str, ...] | None = None


# ------------------------------------------------------------------------------------------------ numbers
def number(x: Any) -> float:
    """A record value as a float (NaN when missing or not a number; MLflow's ±max float is ±∞)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return math.nan
    return math.copysign(math.inf, x) if abs(x) == sys.float_info.max else x


def fmt(x: Any, spec: str = "{:.3f}") -> str:
    """A number for a table: ``–`` when missing, ``∞`` for infinity."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    try:
        return spec.format(x)
    except (ValueError, TypeError):
        return str(x)


def finite(values: Iterable[Any]) -> list[float]:
    """The values that are not missing (NaN), as floats."""
    return [float(v) for v in values if not pd.isna(v)]


def mean(v: Sequence[float]) -> float:
    return math.fsum(v) / len(v) if v else math.nan


def sd(v: Sequence[float]) -> float:
    """Sample standard deviation (n − 1); NaN for fewer than 2 values or an infinite mean."""
    m = mean(v)
    if len(v) < 2 or math.isinf(m):
        return math.nan
    return math.sqrt(math.fsum((x - m) ** 2 for x in v) / (len(v) - 1))


def show(v: Sequence[float], how: str = "mean_std", spec: str = "{:.3f}") -> str:
    """One table cell over a cell's runs: ``mean_std`` (0.812 ± 0.010 (3)), ``mean``, ``min``, ``max``, ``n``,
    ``same`` (the value, or its range when the runs differ)."""
    if how == "n":
        return str(len(v))
    if not v:
        return "–"
    if how == "mean_std":
        return f"{fmt(mean(v), spec)} (1)" if len(v) == 1 else f"{fmt(mean(v), spec)} ± {fmt(sd(v), spec)} ({len(v)})"
    if how == "same":
        a, b = fmt(min(v), spec), fmt(max(v), spec)
        return a if a == b else f"{a}–{b}"
    return fmt(agg(v, how), spec)


def agg(v: Sequence[float], how: str) -> float:
    if how in ("mean", "mean_std", "same"):
        return mean(v)
    if how == "n":
        return float(len(v))
    return {"min": min, "max": max}[how](v) if v else math.nan


def brief(v: Sequence[float], spec: str = "{:.3f}") -> str:
    """``0.814 ± 0.010 (n=3)`` for claim lines."""
    if not v:
        return "no runs"
    return f"{fmt(mean(v), spec)} (n=1)" if len(v) == 1 else f"{fmt(mean(v), spec)} ± {fmt(sd(v), spec)} (n={len(v)})"


def md(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


# ------------------------------------------------------------------------------------------------ runs
def load(root: Path, exports: Sequence[Export]) -> pd.DataFrame:
    """The runs of the exports, one row each: ``params.*``, ``tags.*`` (text), ``metrics.*`` (fedrun's names,
    floats), ``run_id``, ``status``, ``start_time``, ``end_time``, and ``series`` ({metric: [(step, value)]})."""
    from fedrun.export import load as load_records

    df = pd.DataFrame(load_records([root / e.path for e in exports]), dtype=object)
    for c in df.columns:
        if c.startswith("metrics."):
            df[c] = df[c].map(number).astype(float)
    return df


def column(df: pd.DataFrame, *sources: str, kind: Callable[[Any], Any] = str, map: Mapping[str, Any] | None = None,
           missing: Any = None) -> pd.Series:
    """A dim from the first of ``sources`` that a run has: mapped (``map``, on the text), converted by ``kind``;
    ``missing`` where no source has a value, None where the value does not convert."""
    def one(row: Mapping[str, Any]) -> Any:
        raw = next((row[s] for s in sources if s in row and not pd.isna(row[s]) and row[s] != ""), None)
        if raw is None:
            return missing
        if map and str(raw) in map:
            return map[str(raw)]
        try:
            return kind(float(raw)) if kind is int else kind(raw)
        except (TypeError, ValueError):
            return None
    return pd.Series([one(r) for r in df.to_dict("records")], index=df.index, dtype=object)


def series_value(df: pd.DataFrame, metric: str, fn: Callable[[list], float]) -> pd.Series:
    """A number from each run's per-round history of ``metric`` (``fn`` of its (step, value) points)."""
    return df["series"].map(lambda s: fn((s or {}).get(metric, [])) if isinstance(s, dict) else math.nan)


def reach(points: list, target: float) -> float:
    """The first step whose value is ≥ target (NaN if none)."""
    return next((float(s) for s, v in points if number(v) >= target), math.nan)


def at(points: list, step: float) -> float:
    """The value recorded at exactly this step (NaN if not recorded)."""
    return next((number(v) for s, v in points if s == step), math.nan)


@dataclass(frozen=True)
class Dim:
    """How a dim's values read: ``values`` (the order, and the values kept; None: any), ``labels``, ``header``."""
    name: str
    values: tuple | None = None
    labels: Mapping[Any, str] = field(default_factory=dict)
    header: str = ""

    def label(self, v: Any) -> str:
        return self.labels[v] if v in self.labels else (f"{v:g}" if isinstance(v, float) else str(v))

    def tag(self, v: Any) -> str:
        """The value with its name, for text that lists cells: the label, or ``r = 0.05``."""
        return self.labels[v] if v in self.labels else f"{self.name} = {self.label(v)}"

    def order(self, v: Any) -> tuple:
        return (0, self.values.index(v), "") if self.values is not None and v in self.values else (1, 0, str(v))


def dims(**kw: dict) -> dict[str, Dim]:
    """``dims(scheme=dict(values=…, labels=…), …)`` → {name: Dim}, in order (the last is the seed)."""
    return {k: Dim(k, tuple(v["values"]) if v.get("values") is not None else None, v.get("labels", {}),
                   v.get("header", k)) for k, v in kw.items()}


class Cell(NamedTuple):
    """A table column: a measured value (``value``, shown by ``how``) or the paper's number (``paper``);
    ``level``: how many of the column dims it is split by (default all); ``best``: min/max in a row is bold."""
    header: str = ""
    value: str | None = None
    how: str = "mean_std"
    spec: str = "{:.3f}"
    level: int | None = None
    best: str | None = None
    paper: str | None = None


class P(NamedTuple):
    """A number of the paper: where it is for (dims), the quantity, where it stands, how it was inferred if it was."""
    at: dict
    quantity: str
    number: float
    where: str
    how: str = ""
    spec: str | None = None


class Claim(NamedTuple):
    """``comps``: (left cell, op, right cell, tolerance) each; ``any``: one met comparison is enough;
    ``at_least``: a saving claim (1 − mean(left)/mean(right) ≥ at_least over counted bytes)."""
    text: str
    value: str
    comps: tuple
    paper: str = ""
    where: str = ""
    any: bool = False
    at_least: float | None = None


def saving(text: str, value: str, left: dict, right: dict, at_least: float, paper: str = "", where: str = "") -> Claim:
    return Claim(text, value, ((left, "saving", right, 0.0),), paper, where, at_least=at_least)


# ------------------------------------------------------------------------------------------------ a report
class Report:
    """One results file: its runs (a frame with the dims as columns, ``dims`` in order, the last the seed) and
    what it says. ``where``: {column: allowed texts} filters, stated in the runs line."""

    def __init__(self, name: str, root: Path, output: str, exports: Sequence[Export], df: pd.DataFrame,
                 dims: dict[str, Dim], where: Mapping[str, Sequence[str]] = {"status": ("FINISHED",)},
                 paper: Sequence[P] = (), quantities: Mapping[str, tuple[str, str]] = {}) -> None:
        self.name, self.root, self.output, self.exports, self.dims = name, Path(root), output, exports, dims
        self.paper, self.quantities = list(paper), quantities
        self.seed = list(dims)[-1]
        self.cell_dims = list(dims)[:-1]
        self.read = len(df)
        ok = pd.Series(True, index=df.index)
        for k, allowed in where.items():
            ok &= (df[k].fillna("").astype(str) if k in df else pd.Series("", index=df.index)).isin(allowed)
        self.left = [f"{(~ok).sum()} not matching " + ", ".join(f"{k} = {'/'.join(v)}" for k, v in where.items())
                     ] if (~ok).sum() else []
        df = df[ok]
        outside = {}
        for d, dim in dims.items():
            bad = df[d].map(lambda v: (pd.isna(v) and d != self.seed) or (dim.values is not None and v not in
                                                                           dim.values))
            if bad.sum():
                outside[d] = int(bad.sum())
            df = df[~bad]
        self.left += [f"{n} outside the spec's {d} values" for d, n in sorted(outside.items())]
        df = df.assign(_order=[(int(s or 0), str(r)) for s, r in zip(df["start_time"].fillna(0), df["run_id"])])
        df = df.sort_values("_order", kind="stable")
        kept = df.drop_duplicates(self.cell_dims + [self.seed], keep="last")
        if len(kept) < len(df):
            self.left.append(f"{len(df) - len(kept)} older repeats of a (cell, {self.seed})")
        self.runs = kept
        self.marks = {i: MARKS[j % 6] * (1 + j // 6) for j, i in enumerate(i for i, p in enumerate(paper) if p.how)}

    # ---------------------------------------------------------------------------------------- cells
    def match(self, at: Mapping[str, Any], runs: pd.DataFrame | None = None) -> pd.DataFrame:
        """The runs of every cell matching ``at`` (a partial assignment; a tuple: any of its values)."""
        runs = self.runs if runs is None else runs
        for d, v in at.items():
            runs = runs[runs[d].isin(v if isinstance(v, tuple) else (v,))]
        return runs

    def values(self, at: Mapping[str, Any], value: str) -> list[float]:
        return finite(self.match(at)[value])

    def sort(self, names: Sequence[str], keys: Iterable[tuple]) -> list[tuple]:
        return sorted(set(keys), key=lambda k: tuple(self.dims[n].order(v) for n, v in zip(names, k)))

    def present(self, d: str, at: Mapping[str, Any] = {}) -> list:
        """The values of ``d`` that have runs (among the cells matching ``at``), in the dim's order."""
        return [k[0] for k in self.sort([d], ((v,) for v in self.match(at)[d]))]

    def describe(self, at: Mapping[str, Any]) -> str:
        return " ".join(self.dims[d].tag(v) for d, v in at.items() if d in self.dims)

    # ---------------------------------------------------------------------------------------- text
    def runs_line(self) -> str:
        names = [f"`{e.path}.runs.csv.gz`" for e in self.exports]
        text = (f"Runs: {self.read} in the export{'s' if len(names) > 1 else ''} {', '.join(names)}; "
                f"{len(self.runs)} in the tables")
        if self.left:
            text += " (left out: " + "; ".join(self.left) + ")"
        times = [(int(s), int(e)) for s, e in zip(self.runs["start_time"], self.runs["end_time"])
                 if not pd.isna(s) and not pd.isna(e) and s and e and e >= s]
        if times:
            text += (f"; first start to last end {(max(e for _, e in times) - min(s for s, _ in times)) / 3.6e6:.2f} h,"
                     f" the runs' own durations sum to {sum(e - s for s, e in times) / 3.6e6:.2f} h")
        return text + "."

    def coverage(self, expect: Sequence[Mapping[str, Any]], min_seeds: int = 3) -> str:
        """How many of the expected cells have ≥ min_seeds / fewer / no runs (with the short list)."""
        cells: list[dict] = []
        for e in expect:
            names = [d for d in self.cell_dims if d in e]
            for combo in itertools.product(*(e[d] if isinstance(e[d], list) else [e[d]] for d in names)):
                if dict(zip(names, combo)) not in cells:
                    cells.append(dict(zip(names, combo)))
        n = [(at, len(self.match(at))) for at in cells]
        few = [x for x in n if 0 < x[1] < min_seeds] + [x for x in n if not x[1]]
        text = (f"Cells: {len(cells)} expected; {sum(k >= min_seeds for _, k in n)} with ≥ {min_seeds} seeds, "
                f"{sum(0 < k < min_seeds for _, k in n)} with 1–{min_seeds - 1}, {sum(not k for _, k in n)} without runs.")
        if few:
            text += (f"\n\n<details><summary>cells with fewer than {min_seeds} seeds (number of runs)</summary>\n\n"
                     + "; ".join(f"{self.describe(at)} ({k})" for at, k in few) + "\n\n</details>")
        return text

    def paper_entry(self, quantity: str, at: Mapping[str, Any]) -> int | None:
        found = [i for i, p in enumerate(self.paper)
                 if p.quantity == quantity and all(d in at and at[d] == v for d, v in p.at.items())]
        return found[0] if found else None

    def paper_text(self, i: int, spec: str = "{:g}") -> str:
        p = self.paper[i]
        return fmt(p.number, p.spec or spec) + self.marks.get(i, "")

    def table(self, rows: Sequence[str], cells: Sequence[Cell], columns: Sequence[str] = (), split: str | None = None,
              where: Mapping[str, Any] = {}, drop_empty: bool = False) -> str:
        """Markdown: one section per value of ``split`` (a ### heading), rows: the ``rows`` dims' combinations
        with runs, columns: ``cells`` under every combination of the ``columns`` dims with runs."""
        out = []
        for sv in (self.present(split, where) if split else [None]):
            at = {**where, **({split: sv} if split else {})}
            cols: list[tuple[Cell, dict]] = []

            def walk(depth: int, fixed: dict) -> None:
                cols.extend((c, dict(fixed)) for c in cells if (len(columns) if c.level is None else c.level) == depth)
                if depth < len(columns):
                    for v in self.present(columns[depth], {**at, **fixed}):
                        walk(depth + 1, {**fixed, columns[depth]: v})

            walk(0, {})
            keys = self.sort(rows, (tuple(r) for r in self.match(at)[list(rows)].itertuples(index=False)))
            used: list[int] = []
            body = []
            for key in keys:
                ctx = {**at, **dict(zip(rows, key))}
                texts = [self.dims[d].label(v) for d, v in zip(rows, key)]
                best: dict[int, tuple] = {}
                for c, fixed in cols:
                    if c.paper is not None:
                        i = self.paper_entry(c.paper, {**ctx, **fixed})
                        texts.append("" if i is None else self.paper_text(i, c.spec))
                        if i is not None and i not in used:
                            used.append(i)
                        continue
                    v = self.values({**ctx, **fixed}, c.value)
                    texts.append(show(v, c.how, c.spec))
                    x = agg(v, c.how) if v else math.nan
                    if c.best and not math.isnan(x):
                        k = (x if c.best == "min" else -x, len(texts) - 1)
                        best[cells.index(c)] = min(best.get(cells.index(c), k), k)
                for _, j in best.values():
                    texts[j] = f"**{texts[j]}**"
                body.append(texts)
            head = [self.dims[d].header for d in rows] + [
                " · ".join([self.dims[d].label(v) for d, v in f.items()] + ([c.header] if c.header else []))
                or (c.value or c.paper or "") for c, f in cols]
            keep = [j for j in range(len(head))
                    if not drop_empty or j < len(rows) or any(r[j] not in ("", "–") for r in body)]
            text = md([head[j] for j in keep], ([r[j] for j in keep] for r in body))
            notes = "\n".join(f"{self.marks[i]} inferred, not stated in the paper: {self.paper[i].how} "
                              f"({self.paper[i].where})" for i in sorted(set(used)) if i in self.marks)
            out.append((f"### {self.dims[split].label(sv)}\n\n" if split else "") + text + (f"\n{notes}\n" if notes else ""))
        return "\n".join(out)

    def paper_numbers(self) -> str:
        """Every number of the paper, where it stands, read or inferred (marked)."""
        rows = []
        for i, p in enumerate(self.paper):
            how = f"**inferred**{self.marks[i]}: {p.how}" if p.how else "read (stated)"
            label, spec = self.quantities.get(p.quantity, (p.quantity, "{:g}"))
            rows.append([self.describe(p.at), label, self.paper_text(i, spec), p.where, how])
        return ("## The paper's numbers\n\nEvery number of the paper in this report, where it stands, and whether the "
                "paper states it (read) or it was worked out from what the paper states (inferred, marked).\n\n"
                + md(["cell", "quantity", "paper", "where in the paper", "read or inferred"], rows))

    # ---------------------------------------------------------------------------------------- claims
    def names(self, cells: Sequence[Mapping[str, Any]]) -> list[str]:
        """Short names of claim cells: the dims that differ between them (all their dims if none differ)."""
        ds = [d for d in self.cell_dims if len({repr(c.get(d)) for c in cells}) > 1] or \
             [d for d in self.cell_dims if any(d in c for c in cells)]
        return [" ".join(self.dims[d].tag(c[d]) for d in ds if d in c) for c in cells]

    def verdict(self, claim: Claim, k: float = 2.0, min_seeds: int = 3) -> tuple[str, str]:
        """(verdict, the numbers behind it) of one claim: the rule of :func:`rule_text`."""
        cells = [c for comp in claim.comps for c in (comp[0], comp[2])]
        for c in cells:
            n = len(self.match(c).groupby(self.cell_dims, dropna=False))
            if n > 1:
                free = [d for d in self.cell_dims if d not in c]
                return NOT_CHECKABLE, f"{self.describe(c)} matches {n} cells (name {', '.join(free)})"
        name = dict(zip((repr(c) for c in cells), self.names(cells)))
        nm = lambda c: name[repr(c)]  # noqa: E731
        if claim.at_least is not None:
            (left, _, right, _), = claim.comps
            a, b = self.values(left, claim.value), self.values(right, claim.value)
            if not a or not b:
                return NOT_CHECKABLE, "no runs: " + ", ".join(nm(c) for c, v in ((left, a), (right, b)) if not v)
            s = 1 - mean(a) / mean(b) if mean(b) else math.nan
            return (MET if s >= claim.at_least else NOT_MET), (
                f"saving {s * 100:.1f} % (threshold {claim.at_least * 100:.1f} %): {nm(left)} {brief(a, '{:.4g}')} vs "
                f"{nm(right)} {brief(b, '{:.4g}')}")
        verdicts, parts = [], []
        for left, op, right, tol in claim.comps:
            a, b = self.values(left, claim.value), self.values(right, claim.value)
            sym = {">=": "≥", "<=": "≤"}.get(op, op)
            if not a or not b:
                verdicts.append(NOT_CHECKABLE)
                parts.append(f"{nm(left)} {sym} {nm(right)}: no runs of "
                             + " and ".join(nm(c) for c, v in ((left, a), (right, b)) if not v))
                continue
            d = (mean(a) - mean(b) if op in (">", ">=") else mean(b) - mean(a)) + tol
            band = k * math.sqrt(sd(a) ** 2 / len(a) + sd(b) ** 2 / len(b))
            if min(len(a), len(b)) < min_seeds:
                v, band = FEW.format(n=min_seeds), math.nan
            else:
                v = MET if d > band else NOT_MET if d < -band else NOISE
            verdicts.append(v)
            text = f"{nm(left)} {brief(a)} {sym} {nm(right)} {brief(b)}: difference {d:+.3f}"
            text += f" (tolerance {tol:+g} included)" if tol else ""
            parts.append(text + ("" if math.isnan(band) else f", {k:g}·SE = {band:.3f}"))
        return combine(verdicts, claim.any), ("any of: " if claim.any else "") + "; ".join(parts)

    def claims(self, claims: Sequence[Claim]) -> str:
        lines = []
        for c in claims:
            v, detail = self.verdict(c)
            paper = f" Paper: {c.paper}" + (f" ({c.where})" if c.where else "") + "." if c.paper else ""
            lines.append(f"- {c.text}: **{v}** — {detail}.{paper}")
        return "## The paper's claims\n\n" + rule_text(any(c.any for c in claims)) + "\n\n" + "\n".join(lines) + "\n"

    def readme_block(self, claims: Sequence[Claim]) -> str:
        lines = [f"Claims checked by [{PurePosixPath(self.output).name}]({self.output}) (rule: met / not met beyond "
                 f"2·SE over ≥ 3 seeds, else inconclusive; the numbers are there):"]
        return "\n".join(lines + [f"- {c.text}: **{self.verdict(c)[0]}**" for c in claims])

    # ---------------------------------------------------------------------------------------- files
    def files(self, blocks: Mapping[str, str], figures: Mapping[str, bytes] = {}, claims: Sequence[Claim] = (),
              expect: Sequence[Mapping[str, Any]] = ()) -> dict[Path, bytes]:
        """The report's files (paths relative to the root): its figures, its markdown (the template
        ``<output>.template.md`` filled with ``blocks`` and the runs line, coverage, claims and paper's numbers),
        and with claims README.md with its claims block regenerated."""
        blocks = {"runs": self.runs_line(), **({"cells": self.coverage(expect)} if expect else {}),
                  **({"claims": self.claims(claims)} if claims else {}),
                  **({"paper": self.paper_numbers()} if self.paper else {}), **blocks}
        out = {Path(self.output).parent / f: b for f, b in figures.items()}
        out[Path(self.output)] = fill(self.root / Path(self.output).with_suffix(".template.md"), blocks).encode()
        if claims:
            readme = self.root / README
            if not readme.exists():
                raise ValueError(f"{readme} not found: the claims of {self.name} go into its claims block")
            out[Path(README)] = splice(readme.read_text(), self.name, self.readme_block(claims)).encode("utf-8")
        return out

    def curves(self, file: str, series: str, panels: Sequence[str], lines: Sequence[str], title: str, ylabel: str,
               where: Mapping[str, Any] = {}, color: tuple | None = None, style: tuple | None = None,
               xlabel: str = "round", yscale: str = "linear") -> bytes:
        """A figure: per panel (every combination of the ``panels`` dims with runs), one line per combination of
        the ``lines`` dims: the mean (± std) of ``series`` per step over its runs. ``color``/``style``: (dim, map)."""
        from fedrun.reports.figure import Curve, draw

        values = [self.present(d, where) for d in panels]
        out = []
        for combo in itertools.product(*values):
            at = {**where, **dict(zip(panels, combo))}
            curves = []
            for lk in self.sort(lines, (tuple(r) for r in self.match(at)[list(lines)].itertuples(index=False))):
                lat = {**at, **dict(zip(lines, lk))}
                by_step: dict[int, list[float]] = {}
                for s in self.match(lat)["series"]:
                    for step, v in (s or {}).get(series, []):
                        by_step.setdefault(int(step), []).append(float(v))
                if by_step:
                    steps = sorted(by_step)
                    st = [finite(by_step[s]) for s in steps]
                    curves.append(Curve(" ".join(self.dims[d].tag(v) for d, v in zip(lines, lk)), tuple(steps),
                                        tuple(mean(v) for v in st), tuple(sd(v) for v in st), max(len(v) for v in st),
                                        color and color[1].get(lat.get(color[0])),
                                        style and style[1].get(lat.get(style[0]))))
            out.append((", ".join(self.dims[d].label(v) for d, v in zip(panels, combo)), curves))
        ncols = len(values[-1]) if len(panels) >= 2 else min(2, max(1, len(out)))
        return draw(out, file, title, xlabel, ylabel, max(1, ncols), yscale)


def combine(verdicts: Sequence[str], any_: bool = False) -> str:
    """Several comparisons: all must be met (``any_``: one is enough); else the first inconclusive reason."""
    if (MET in verdicts) if any_ else all(v == MET for v in verdicts):
        return MET
    if all(v == NOT_MET for v in verdicts) if any_ else NOT_MET in verdicts:
        return NOT_MET
    if NOT_CHECKABLE in verdicts:
        return NOT_CHECKABLE
    return next((v for v in verdicts if v.startswith("inconclusive (fewer")), NOISE)


def rule_text(any_: bool) -> str:
    return ("Rule: each comparison of two cells takes the difference of their means over seeds in the claimed "
            "direction (plus the claim's tolerance, if any): **met** when it is above 2·SE, **not met** when below "
            "−2·SE, **inconclusive (within noise)** in between, with SE = √(s₁²/n₁ + s₂²/n₂) (s: sample std over "
            "seeds); **inconclusive (fewer than 3 seeds)** when either cell has fewer than 3 runs. A claim of several "
            "comparisons is met when all are met and not met when any is not met"
            + ("; a claim whose comparisons are listed as *any of* is met when any is met and not met when all are "
               "not met" if any_ else "")
            + ". A bandwidth saving counts bytes (no noise): met when 1 − mean(left)/mean(right) reaches the "
              "threshold.")


def fill(template: Path, blocks: Mapping[str, str]) -> str:
    """The hand-written ``template`` (the report's text) with every line ``{{name}}`` replaced by ``blocks[name]``."""
    def block(m: re.Match) -> str:
        if m.group(1) not in blocks:
            raise ValueError(f"{template}: {{{{{m.group(1)}}}}} is not a block of this report: {', '.join(blocks)}")
        return blocks[m.group(1)].rstrip("\n") + "\n"
    if not template.exists():
        raise ValueError(f"{template} not found (the report's text, with a line {{{{name}}}} per generated block)")
    return re.sub(r"^\{\{(\w+)\}\}\n", block, template.read_text(), flags=re.M)


README = "README.md"


def markers(name: str) -> tuple[str, str]:
    return (f"<!-- claims: {name} (generated by python -m fedrun.report {name}; do not edit) -->",
            f"<!-- /claims: {name} -->")


def splice(readme: str, name: str, body: str) -> str:
    """``readme`` with the claims block of ``name`` replaced by ``body``; a missing or doubled block is a
    ValueError (one line saying what to add)."""
    start, end = markers(name)
    pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.S)
    found = pattern.findall(readme)
    if len(found) != 1:
        raise ValueError(f"{README} {'has no' if not found else f'has {len(found)}'} claims block for {name}: add "
                         f"the two lines {start!r} and {end!r} where its verdicts belong")
    return pattern.sub(lambda _m: f"{start}\n{body}\n{end}", readme)
