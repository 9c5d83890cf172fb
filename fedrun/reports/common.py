"""What the report modules share: load an export (a DataFrame, one row per run), place runs in cells, mean ± sd,
tables, claims, figures, and the report's files (:meth:`Report.files`)."""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import re
import sys
from collections import namedtuple
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd

from fedrun.reports import stats

MARKS = ("†", "‡", "§", "¶", "‖", "#")
#: while fedrun.reports builds a report: {other report of its family: the raw p-values of its tested claims}; None:
#: only collect this report's own (:meth:`Report.verdicts` raises :class:`Collected`, :meth:`Report.curves` draws none)
FAMILY: dict[str, list[float]] | None = {}
MET, NOT_MET, OPEN = "met", "not met", "inconclusive"
#: the verdicts of a claim decided without a test (counted bytes): listed, never counted as met
TRUE_BY_CONSTRUCTION, FALSE_BY_CONSTRUCTION = "true by construction", "false by construction"
#: the file holding every report's claims block (its links are relative to its folder)
README = "docs/results.md"


#: a committed export (``<path>.runs.csv.gz`` + ``.metrics.csv.gz``) and how ``--export`` makes it again
Export = namedtuple("Export", "path experiment every metrics", defaults=(None, None))


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
    return spec.format(x)


def finite(values: Iterable[Any]) -> list[float]:
    """The values that are not missing (NaN), as floats."""
    return [float(v) for v in values if not pd.isna(v)]


def mean(v: Sequence[float]) -> float:
    return math.fsum(v) / len(v) if v else math.nan


def sd(v: Sequence[float]) -> float:
    """Sample standard deviation (n − 1); NaN for fewer than 2 values or an infinite mean."""
    m = mean(v)
    return math.nan if len(v) < 2 or math.isinf(m) else math.sqrt(math.fsum((x - m) ** 2 for x in v) / (len(v) - 1))


def agg(v: Sequence[float], how: str) -> float:
    """``min``, ``max``, ``n`` of a non-empty cell's values, else their mean."""
    return float({"min": min, "max": max, "n": len}[how](v)) if how in ("min", "max", "n") else mean(v)


def show(v: Sequence[float], how: str = "mean_std", spec: str = "{:.3f}", n: str = "") -> str:
    """One table cell over a cell's runs: ``mean_std`` (0.812 ± 0.010 (3), or (n=3) with ``n="n="``), ``mean``,
    ``min``, ``max``, ``n``, ``same`` (the value, or its range when the runs differ)."""
    if how == "n" or not v:
        return str(len(v)) if how == "n" else "–"
    if how == "mean_std":
        return fmt(mean(v), spec) + (f" ± {fmt(sd(v), spec)}" if len(v) > 1 else "") + f" ({n}{len(v)})"
    if how != "same":
        return fmt(agg(v, how), spec)
    a, b = fmt(min(v), spec), fmt(max(v), spec)
    return a if a == b else f"{a}–{b}"


def md(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def load(root: Path, exports: Sequence[Export]) -> pd.DataFrame:
    """The runs of the exports, one row each: ``params.*``, ``tags.*`` (text), ``metrics.*`` (floats), ``run_id``,
    ``status``, ``start_time``, ``end_time``, ``series`` ({metric: [(step, value)]}) and ``seed`` (params.seed)."""
    from fedrun.export import load as load_records

    df = pd.DataFrame(load_records([root / e.path for e in exports]), dtype=object)
    for c in df.columns:
        if c.startswith("metrics."):
            df[c] = df[c].map(number).astype(float)
    return df.assign(seed=column(df, "params.seed", kind=int))


def export(out: str, name: str, every: int | None = None, metrics: tuple | None = None) -> Export:
    """The export ``<out>/runs/<name>`` of the MLflow experiment ``name``."""
    return Export(f"{out}/runs/{name}", name, every, metrics)


def column(df: pd.DataFrame, *sources: str, kind: Callable[[Any], Any] = str, map: Mapping[str, Any] | None = None,
           missing: Any = None) -> pd.Series:
    """A dim from the first of ``sources`` that a run has: mapped (``map``, on the text), converted by ``kind``;
    ``missing`` where no source has a value, None where the value does not convert."""
    def one(row: Mapping[str, Any]) -> Any:
        raw = next((row[s] for s in sources if s in row and not pd.isna(row[s]) and row[s] != ""), None)
        if raw is None or (map and str(raw) in map):
            return missing if raw is None else map[str(raw)]
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


class Dim(namedtuple("Dim", "name values labels header default", defaults=(None,))):
    """How a dim's values read: ``values`` (the order, and the values kept; None: any), ``labels``, ``header``;
    ``default``: the value a claim's cell means when it does not name the dim (a dim added after the claim)."""

    def label(self, v: Any) -> str:
        return self.labels[v] if v in self.labels else (f"{v:g}" if isinstance(v, float) else str(v))

    def tag(self, v: Any) -> str:
        """The value with its name, for text that lists cells: the label, or ``r = 0.05``."""
        return self.labels[v] if v in self.labels else f"{self.name} = {self.label(v)}"

    def order(self, v: Any) -> tuple:
        return (0, self.values.index(v), "") if self.values is not None and v in self.values else (1, 0, str(v))


def dims(**kw: dict) -> dict[str, Dim]:
    """``dims(scheme=dict(values=…, labels=…, header=…), …)`` → {name: Dim}, in order (the last is the seed); values
    given as a dict are labelled by it unless labels are given."""
    return {k: Dim(k, None if v.get("values") is None else tuple(v["values"]),
                   v.get("labels", v["values"] if isinstance(v.get("values"), dict) else {}), v.get("header", k),
                   v.get("default")) for k, v in kw.items()}


#: a table column: a measured value (``value``, shown by ``how``) or the paper's number (``paper``); ``level``: how
#: many of the column dims it is split by (default all); ``best``: min/max in a row is bold
Cell = namedtuple("Cell", "header value how spec level best paper", defaults=("", None, "mean_std", "{:.3f}", None,
                                                                              None, None))
#: a number of the paper: where it is for (dims), the quantity, where it stands, how it was inferred if it was
P = namedtuple("P", "at quantity number where how spec", defaults=("", None))
#: a claim: ``comps`` must all hold (``any``: one), each (terms, kind, bound, center): d = Σ coef·mean(cell) over
#: ``terms`` ((cell, coef), …), ``>`` / ``<`` the claim d > bound / d < bound, ``≈`` |d − center| < bound (a margin);
#: ``fixed``: instead a verdict stated without a test (``by construction``, ``not attempted``, ``exploratory``) and
#: why. From a registry (:func:`registry`): its ``id``, ``family`` (primary, secondary), the ``seeds`` that judge it
#: (None: every run), ``looks`` (its p is multiplied by them: Bonferroni over the looks taken before seeds were added)
#: and the registry ``row``
Claim = namedtuple("Claim", "text value comps paper where any fixed id family seeds looks row",
                   defaults=("", "", False, None, "", "secondary", None, 1, None))
FAMILY_ORDER = ("primary", "secondary")
#: a registry's test shapes → (the comparison's kind, its bound from (bound, margin), its centre)
SHAPES = {"superiority": lambda b, m: (">", b, 0.0), "inferiority": lambda b, m: ("<", b, 0.0),
          "non-inferiority": lambda b, m: (">", b - m, 0.0), "equivalence": lambda b, m: ("≈", m, b),
          "magnitude": lambda b, m: ("≈", m, b), "sooner": lambda b, m: ("sooner", 0.0, 0.0),
          "saving": lambda b, m: ("saving", b, 0.0)}
REGISTRY_COLUMNS = ("id", "family", "report", "claim", "source", "where", "config", "comparisons", "value", "test",
                    "bound", "margin", "margin_source", "seeds", "looks", "paper_number", "registered", "amendment",
                    "note")


def _seeds(text: str) -> tuple[int, ...] | None:
    """``0;1;2``, ``0-3`` or a mix; ``all`` (or empty): None, every run."""
    if text.strip() in ("", "all"):
        return None
    out: list[int] = []
    for part in text.split(";"):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def _cells(text: str, shared: dict) -> tuple:
    """``[a=1;b=x] - [a=2]`` → (({shared…, a: '1', b: 'x'}, 1.0), ({…}, -1.0)): the signed cells of one comparison."""
    terms = re.findall(r"([+-]?)\s*\[([^\]]*)\]", text)
    if not terms or re.sub(r"[+-]?\s*\[[^\]]*\]", "", text).strip():
        raise ValueError(f"comparison {text!r}: expected signed cells like [dim=value;dim=value] - [dim=value]")
    return tuple(({**shared, **dict(kv.split("=", 1) for kv in body.split(";") if kv)}, -1.0 if sign == "-" else 1.0)
                 for sign, body in terms)


def registry(root: Path, path: str, report: str) -> list[Claim]:
    """The claims of ``report`` in the registry ``path`` (``results/<paper>/claims.csv``, columns
    :data:`REGISTRY_COLUMNS`; results/README.md says what each means), in the registry's order."""
    with open(Path(root) / path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if rows and set(REGISTRY_COLUMNS) - set(rows[0]):
        raise ValueError(f"{path}: missing columns {', '.join(sorted(set(REGISTRY_COLUMNS) - set(rows[0])))}")
    out = []
    for r in (r for r in rows if r["report"] == report):
        text, fam = f"{r['id']}. {r['claim']}", r["family"]
        if fam not in FAMILY_ORDER + ("by construction", "not attempted"):
            raise ValueError(f"{path}: claim {r['id']}: family={fam!r} is not primary, secondary, by construction or "
                             "not attempted")
        common = dict(text=text, value=r["value"], paper=r["source"], where=r["where"], id=r["id"], family=fam,
                      seeds=_seeds(r["seeds"]), looks=int(r["looks"] or 1), row=r)
        if fam == "not attempted" or r["test"] in ("not attempted", "exploratory", "check"):
            # a check (a proof or counterexample in a named test, not runs) states its outcome in ``bound``
            verdict = {"exploratory": "exploratory", "check": f"{r['bound']} by a check"}.get(r["test"], "not attempted")
            out.append(Claim(comps=(), fixed=(verdict, r["note"]), **common))
            continue
        if r["test"] not in SHAPES:
            raise ValueError(f"{path}: claim {r['id']}: test={r['test']!r} is not one of {', '.join(SHAPES)}")
        shared = dict(kv.split("=", 1) for kv in r["config"].split(";") if kv)
        kind, bound, center = SHAPES[r["test"]](float(r["bound"] or 0), float(r["margin"] or 0))
        joined = " | " if " | " in r["comparisons"] else " & "
        comps = tuple((_cells(c, shared), kind, bound, center) for c in r["comparisons"].split(joined))
        out.append(Claim(comps=comps, any=joined == " | ", **common))
    return out


def numbers(root: Path, out: str, report: str) -> list[P]:
    """The paper's numbers that ``report`` shows, from ``<out>/paper_numbers.csv`` (``at``: the cell, in JSON)."""
    with open(Path(root) / out / "paper_numbers.csv", newline="", encoding="utf-8") as f:
        return [P(json.loads(r["at"]), r["quantity"], float(r["number"]), r["where"], r["how"], r["spec"] or None)
                for r in csv.DictReader(f) if r["report"] == report]


def gt(a: dict, b: dict, shift: float = 0.0) -> tuple:
    """The comparison mean(a) − mean(b) > shift, as a claim's ``comps`` hold them (see :data:`Claim`)."""
    return ((a, 1.0), (b, -1.0)), ">", shift, 0.0


#: every :class:`Report` made in this process (tests read their :attr:`Report.mixed`)
BUILT: list = []
#: logged params that do not change a run's result (where it ran from, how it was tracked, checkpointed or resumed;
#: ``server_lr``'s table is resolved into ``scheme.server_lr``, which is kept)
NOT_CONFIG = ("params.seed", "params.data_root", "params.resume", "params.progress", "params.workers",
              "params.checkpoint_every", "params.chunk_size", "params.tracking.", "params.skip_finished",
              "params.hydra.", "params.server_lr")


def configs(df: pd.DataFrame, cells: Sequence[str]) -> pd.Series:
    """Each run's resolved config, minus its seed and what does not change results (:data:`NOT_CONFIG`), as one
    string: a param that equals the seed in every run of its cell (e.g. a source model per seed) is the seed's, and a
    config group missing from runs older than the group (``network``, ``secagg``, ``noise``) is its default."""
    from fedrun.config import OPTIONAL_GROUPS

    out = pd.Series("", index=df.index, dtype=object)
    if df.empty:
        return out
    params = [c for c in df.columns if c.startswith("params.") and not c.startswith(NOT_CONFIG)]
    text = df[params].astype(object).where(df[params].notna(), "nan").astype(str)
    for group, off in OPTIONAL_GROUPS.items():
        if f"params.{group}.name" in text:
            text[f"params.{group}.name"] = text[f"params.{group}.name"].replace("nan", off)
    seed = df.get("params.seed", pd.Series("", index=df.index)).astype(str)
    for pos in df.groupby(list(cells), dropna=False).indices.values():
        idx = df.index[pos]
        keys = [c for c in params if not (text.loc[idx, c] == seed.loc[idx]).all()]
        out.loc[idx] = ["|".join(f"{k}={v}" for k, v in zip(keys, row))
                        for row in text.loc[idx, keys].itertuples(index=False)]
    return out


class Report:
    """One results file: its runs (a frame with the dims as columns, ``dims`` in order, the last the seed) and
    what it says. ``where``: {column: allowed texts} filters, stated in the runs line."""

    def __init__(self, name: str, root: Path, output: str, exports: Sequence[Export], df: pd.DataFrame,
                 dims: dict[str, Dim], where: Mapping[str, Sequence[str]] = {"status": ("FINISHED",)},
                 paper: Sequence[P] = (), quantities: Mapping[str, tuple[str, str]] = {}) -> None:
        self.name, self.root, self.output, self.exports, self.dims = name, Path(root), output, exports, dims
        self.paper, self.quantities, self.read = list(paper), quantities, len(df)
        *self.cell_dims, self.seed = dims
        ok = pd.Series(True, index=df.index)
        for k, allowed in where.items():
            ok &= df.get(k, pd.Series("", index=df.index)).fillna("").astype(str).isin(allowed)
        self.left = [f"{(~ok).sum()} not matching " + ", ".join(f"{k} = {'/'.join(v)}" for k, v in where.items())
                     ] if (~ok).sum() else []
        df, outside = df[ok], {}
        for d, dim in dims.items():
            bad = df[d].map(lambda v: (pd.isna(v) and d != self.seed) or (dim.values is not None
                                                                           and v not in dim.values))
            outside[d] = int(bad.sum())
            df = df[~bad]
        self.left += [f"{n} outside the spec's {d} values" for d, n in sorted(outside.items()) if n]
        df = df.assign(_order=[(int(s or 0), str(r)) for s, r in zip(df["start_time"].fillna(0), df["run_id"])],
                       _config=configs(df, self.cell_dims))
        df = df.sort_values("_order", kind="stable")
        # a repeat is the same resolved config in the same (cell, seed): the newer run stands for it
        self.runs = df.drop_duplicates(self.cell_dims + [self.seed, "_config"], keep="last")
        if len(self.runs) < len(df):
            self.left.append(f"{len(df) - len(self.runs)} older repeats of a (cell, {self.seed}) with the same config")
        #: cells whose runs ran more than one resolved config (tests build every report and require none)
        self.mixed = {k: n for k, n in self.runs.groupby(self.cell_dims, dropna=False)["_config"].nunique().items()
                      if n > 1}
        BUILT.append(self)
        self.marks = {i: MARKS[j % 6] * (1 + j // 6) for j, i in enumerate(i for i, p in enumerate(paper) if p.how)}

    def match(self, at: Mapping[str, Any]) -> pd.DataFrame:
        """The runs of every cell matching ``at`` (a partial assignment; a tuple: any of its values)."""
        runs = self.runs
        for d, v in at.items():
            runs = runs[runs[d].isin(v if isinstance(v, tuple) else (v,))]
        return runs

    def values(self, at: Mapping[str, Any], value: str) -> list[float]:
        return finite(self.match(at)[value])

    def censored(self, at: Mapping[str, Any], value: str) -> tuple:
        """(times, reached) of a cell's runs: ``value`` the time to a target (the run's whole time where it never got
        there), the frame's ``<value>_reached`` whether it did (a time-to-event outcome, right-censored)."""
        import numpy as np

        runs = self.match(at)
        ok = ~runs[value].isna()
        return (np.asarray(runs[value][ok], dtype=float), np.asarray(runs[f"{value}_reached"][ok], dtype=bool))

    def combos(self, names: Sequence[str], at: Mapping[str, Any] = {}) -> list[tuple]:
        """The combinations of the ``names`` dims that have runs (among the cells matching ``at``), in order."""
        return sorted(set(self.match(at)[list(names)].itertuples(index=False, name=None)),
                      key=lambda k: tuple(self.dims[n].order(v) for n, v in zip(names, k)))

    def present(self, d: str, at: Mapping[str, Any] = {}) -> list:
        """The values of ``d`` that have runs (among the cells matching ``at``), in the dim's order."""
        return [k[0] for k in self.combos([d], at)]

    def describe(self, at: Mapping[str, Any]) -> str:
        return " ".join(self.dims[d].tag(v) for d, v in at.items() if d in self.dims)

    def runs_line(self) -> str:
        names = [f"`{e.path}.runs.csv.gz`" for e in self.exports]
        text = (f"Runs: {self.read} in the export{'s' if len(names) > 1 else ''} {', '.join(names)}; "
                f"{len(self.runs)} in the tables" + (" (left out: " + "; ".join(self.left) + ")" if self.left else ""))
        times = [(int(s), int(e)) for s, e in zip(self.runs["start_time"], self.runs["end_time"])
                 if not pd.isna(s) and not pd.isna(e) and s and e and e >= s]
        if times:
            text += (f"; first start to last end {(max(e for _, e in times) - min(s for s, _ in times)) / 3.6e6:.2f} h,"
                     f" the runs' own durations sum to {sum(e - s for s, e in times) / 3.6e6:.2f} h")
        dirty = self.runs.get("tags.git_dirty", pd.Series("", index=self.runs.index)).fillna("").astype(str).str.lower()
        unknown = (~dirty.isin(["true", "false"])).sum()
        commits = self.runs.get("tags.git_commit", pd.Series(dtype=str)).dropna().astype(str).str[:40].nunique()
        return text + (f". Code: {(dirty == 'true').sum()} of these {len(self.runs)} runs were made from a working "
                       f"tree with uncommitted changes (tag git_dirty; the export does not hold their diff)"
                       + (f", {unknown} do not record it" if unknown else "")
                       + f"; they come from {commits} commit{'' if commits == 1 else 's'} (tag git_commit).")

    def coverage(self, expect: Sequence[Mapping[str, Any]]) -> str:
        """How many of the expected cells have ≥ k seeds / fewer / no runs (with the short list); k: the most seeds
        any of them has (at least 3), so a cell short of the sweep's seeds is listed."""
        cells: list[dict] = []
        for e in expect:
            names = [d for d in self.cell_dims if d in e]
            for combo in itertools.product(*(e[d] if isinstance(e[d], list) else [e[d]] for d in names)):
                if dict(zip(names, combo)) not in cells:
                    cells.append(dict(zip(names, combo)))
        n = [(at, len(self.match(at))) for at in cells]
        min_seeds = max([3] + [k for _, k in n])
        few = [x for x in n if 0 < x[1] < min_seeds] + [x for x in n if not x[1]]
        none = sum(not k for _, k in n)
        text = (f"Cells: {len(cells)} expected; {sum(k >= min_seeds for _, k in n)} with ≥ {min_seeds} seeds, "
                f"{len(few) - none} with 1–{min_seeds - 1}, {none} without runs.")
        return text + (f"\n\n<details><summary>cells with fewer than {min_seeds} seeds (number of runs)</summary>\n\n"
                       + "; ".join(f"{self.describe(at)} ({k})" for at, k in few) + "\n\n</details>" if few else "")

    def paper_text(self, i: int, spec: str = "{:g}") -> str:
        return fmt(self.paper[i].number, self.paper[i].spec or spec) + self.marks.get(i, "")

    def table(self, rows: Sequence[str], cells: Sequence[Cell], columns: Sequence[str] = (), split: str | None = None,
              where: Mapping[str, Any] = {}, drop_empty: bool = False) -> str:
        """Markdown: one section per value of ``split`` (a ### heading), rows: the ``rows`` dims' combinations
        with runs, columns: ``cells`` under every combination of the ``columns`` dims with runs."""
        out = []
        for sv in (self.present(split, where) if split else [None]):
            at = {**where, **({split: sv} if split else {})}
            # a cell of level l under every combination of the first l column dims with runs, each before its children
            keys = sorted({()} | {k[:n] for k in self.combos(columns, at) for n in range(1, len(columns) + 1)},
                          key=lambda k: tuple(self.dims[d].order(v) for d, v in zip(columns, k)))
            cols = [(c, dict(zip(columns, k))) for k in keys for c in cells
                    if (len(columns) if c.level is None else c.level) == len(k)]
            used, body = set(), []
            for key in self.combos(rows, at):
                ctx = {**at, **dict(zip(rows, key))}
                texts = [self.dims[d].label(v) for d, v in zip(rows, key)]
                best: dict[int, tuple] = {}
                for c, fixed in cols:
                    here = {**ctx, **fixed}
                    if c.paper is not None:
                        i = next((i for i, p in enumerate(self.paper) if p.quantity == c.paper
                                  and all(d in here and here[d] == v for d, v in p.at.items())), None)
                        texts.append("" if i is None else self.paper_text(i, c.spec))
                        used.add(i)
                        continue
                    v = self.values(here, c.value)
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
                              f"({self.paper[i].where})" for i in sorted(self.marks) if i in used)
            out.append((f"### {self.dims[split].label(sv)}\n\n" if split else "") + text
                       + (f"\n{notes}\n" if notes else ""))
        return "\n".join(out)

    def paper_numbers(self) -> str:
        """Every number of the paper, where it stands, read or inferred (marked)."""
        rows = []
        for i, p in enumerate(self.paper):
            label, spec = self.quantities.get(p.quantity, (p.quantity, "{:g}"))
            rows.append([self.describe(p.at), label, self.paper_text(i, spec), p.where,
                         f"**inferred**{self.marks[i]}: {p.how}" if p.how else "read (stated)"])
        return ("## The paper's numbers\n\nEvery number of the paper in this report, where it stands, and whether the "
                "paper states it (read) or it was worked out from what the paper states (inferred, marked).\n\n"
                + md(["cell", "quantity", "paper", "where in the paper", "read or inferred"], rows))

    def typed(self, cell: Mapping[str, Any]) -> dict:
        """A claim's cell with a registry's texts turned into the dims' values (``r=0.05`` → 0.05)."""
        out = {}
        for d, v in cell.items():
            if d not in self.dims:
                raise ValueError(f"{self.name}: a claim's cell names {d!r}, not a dim of this report: "
                                 f"{', '.join(self.cell_dims)}")
            have = list(self.dims[d].values or []) + list(self.runs[d].dropna().unique())
            out[d] = next((x for x in have if _same(x, v)), v) if isinstance(v, str) else v
        return {**{d: self.dims[d].default for d in self.cell_dims if self.dims[d].default is not None}, **out}

    def test(self, claim: Claim) -> dict[str, Any]:
        """One claim before the family's correction, on its seeds: {verdict} when it is decided without a test, else
        {p (× its looks), met, text (the numbers per comparison), estimate, needed ((Welch, distance) per comparison,
        to size an undecided claim)}; a primary claim's text adds the other seeds' numbers (exploratory)."""
        if claim.fixed:
            return {"verdict": claim.fixed[0], "text": claim.fixed[1], "estimate": ""}
        comps = [(tuple((self.typed(c), k) for c, k in terms), *rest) for terms, *rest in claim.comps]
        cells = [c for terms, *_ in comps for c, _ in terms]
        for c in cells:
            if len(self.match(c).groupby(self.cell_dims, dropna=False)) > 1:
                free = [d for d in self.cell_dims if d not in c]
                return {"verdict": "not checkable", "estimate": "",
                        "text": f"{self.describe(c)} matches several cells (name {', '.join(free)})"}
        pin = {} if claim.seeds is None else {self.seed: tuple(claim.seeds)}
        # a cell's short name: the dims that differ between the claim's cells (all their dims if none differ)
        ds = [d for d in self.cell_dims if len({repr(c.get(d)) for c in cells}) > 1] or \
             [d for d in self.cell_dims if any(d in c for c in cells)]
        name = {repr(c): " ".join(self.dims[d].tag(c[d]) for d in ds if d in c) for c in cells}
        ps, parts, need, est = [], [], [], []
        for terms, kind, bound, center in comps:
            vals = [self.values({**c, **pin}, claim.value) for c, _ in terms]
            brief = [f"{name[repr(c)]} " + (show(v, spec="{:.4g}" if kind == "saving" else "{:.3f}", n="n=") if v else
                                           "no runs") for (c, _), v in zip(terms, vals)]
            if kind == "saving":
                a, b = (mean(v) for v in vals)
                s = 1 - a / b if b and vals[0] and vals[1] else math.nan
                return {"verdict": (TRUE_BY_CONSTRUCTION if s >= bound else FALSE_BY_CONSTRUCTION)
                        if not math.isnan(s) else "not checkable", "estimate": fmt(s * 100, "{:.1f} %"),
                        "text": f"saving {s * 100:.1f} % (threshold {bound * 100:.1f} %): " + " vs ".join(brief)}
            if kind == "sooner":  # time to a target, censored where it was never reached: log-rank
                (fast, _), (slow, _) = terms
                got = [self.censored({**c, **pin}, claim.value) for c in (fast, slow)]
                if any(len(t) < 2 for t, _ in got):
                    return {"verdict": "not attempted" if any(not len(t) for t, _ in got) else OPEN, "estimate": "",
                            "text": " vs ".join(brief) + ": fewer than 2 runs in a cell"}
                ps.append(stats.logrank_p(*got))
                medians = [fmt(stats.km_median(*g), '{:.4g}') for g in got]
                parts.append(" vs ".join(f"{name[repr(c)]}: Kaplan–Meier median {m}, reached {int(g[1].sum())} of "
                                         f"{len(g[1])}" for c, g, m in zip((fast, slow), got, medians))
                             + f": log-rank one-sided p = {ps[-1][0]:.2g} for the claim, {ps[-1][1]:.2g} against")
                est.append(f"median {medians[0]} vs {medians[1]}")
                need.append(None)
                continue
            desc = " ".join(("" if i == 0 and k > 0 else "− " if k < 0 else "+ ") + b
                            for i, ((_, k), b) in enumerate(zip(terms, brief)))
            w = stats.welch(vals, [k for _, k in terms])
            if w is None:
                missing = [name[repr(c)] for (c, _), v in zip(terms, vals) if not v]
                return {"verdict": "not attempted", "estimate": "", "text": f"no runs of {', '.join(missing)}"} \
                    if missing else {"verdict": OPEN, "estimate": "",
                                     "text": desc + ": one seed in a cell, no spread to test with"}
            lo, hi = w.ci()
            ps.append(stats.p_values(w, kind, bound, center))
            goal = f"{kind} {bound:+.3g}" if kind != "≈" else f"in {center:+.3g} ± {bound:.3g}"
            parts.append(f"{desc}: {'difference' if len(terms) > 1 else 'mean'} {w.d:+.3f} (95 % CI {lo:+.3f} to "
                         f"{hi:+.3f}; claimed {goal}), Welch df = {w.df:g}, one-sided p = {ps[-1][0]:.2g} for the "
                         f"claim, {ps[-1][1]:.2g} against")
            est.append(f"{w.d:+.3f} ({lo:+.3f} to {hi:+.3f}), n = {'/'.join(str(len(v)) for v in vals)}")
            need.append((w, stats.distance(w, kind, bound, center)))
        p, met = stats.decide(*stats.combine(ps, claim.any))
        text = ("any of: " if claim.any else "") + "; ".join(parts)
        if claim.looks > 1:
            text += f"; p = {p:.2g} × {claim.looks} looks"
            p = min(1.0, p * claim.looks)
        out = {"p": p, "met": met, "needed": need, "text": text, "estimate": "; ".join(est)}
        if claim.family == "primary" and claim.seeds is not None:   # the runs before the registry, shown, not judged
            seen = sorted({int(x) for c in cells for x in self.match(c)[self.seed].dropna()} - set(claim.seeds))
            if seen:
                old = self.test(claim._replace(seeds=tuple(seen), family="exploratory"))
                out["exploratory"] = f"{old['estimate']} (seeds {_ranges(seen)})" if old.get("estimate") else ""
                out["after"] = f". Exploratory seeds {_ranges(seen)} (run before the registry, not judged): " + \
                    old["text"]
        return out

    def verdicts(self, claims: Sequence[Claim]) -> list[tuple[str, str]]:
        """(verdict, the numbers behind it) per claim, the tested ones decided at α after Holm over their family
        (primary or secondary): these claims and those of the other reports of the paper in :data:`FAMILY`. Sets
        :attr:`decided` (every test, with id, family, claim, verdict) and :attr:`primary` (the paper's primary claims
        in all its reports)."""
        self.claimed = list(claims)
        tests, others = [self.test(c) for c in claims], FAMILY
        for t, c in zip(tests, claims):
            t.update(id=c.id, family=c.family, claim=c.text, number=(c.row or {}).get("paper_number", ""),
                     report=self.name)
        if others is None:
            raise Collected(tests)
        theirs = [t for ts in others.values() for t in ts]
        self.family = {}
        for fam in FAMILY_ORDER:
            ours = [t for t in tests if "p" in t and t["family"] == fam]
            rest = [dict(t) for t in theirs if "p" in t and t["family"] == fam]
            adjusted = stats.holm([t["p"] for t in ours + rest])
            for i, (t, adj) in enumerate(zip(ours + rest, adjusted)):
                decided = adj <= stats.ALPHA
                t["verdict"] = (MET if t["met"] else NOT_MET) if decided else OPEN
                if i >= len(ours):
                    continue
                t["text"] += f"; Holm-adjusted p = {adj:.2g} (the {fam} family of {len(adjusted)})"
                if not decided and all(t["needed"]):  # (none for a log-rank comparison: no closed-form power here)
                    need = (stats.seeds_needed(w, m, stats.ALPHA / len(adjusted)) for w, m in t["needed"])
                    t["text"] += (f"; seeds per cell for 80 % power at the observed difference and spread, at "
                                  f"α/{len(adjusted)}: " + ", ".join(str(n or "over 1,000") for n in need))
                t["text"] += t.get("after", "")   # a primary claim's exploratory seeds, after its verdict's numbers
            self.family[fam] = f"{len(ours)} here" + "".join(
                f", {n} in {r}" for r, n in ((r, sum(t["family"] == fam and "p" in t for t in ts)) for r, ts in others.items())
                if n)
            if fam == "primary":   # with the other reports' primary claims not tested (not attempted)
                rest += [t for t in theirs if "p" not in t and t["family"] == fam]
                self.primary = sorted(((t["id"], t) for t in [t for t in tests if t["family"] == fam] + rest),
                                      key=lambda kv: _natural(kv[0]))
        self.decided = tests
        return [(t["verdict"], t["text"]) for t in tests]

    def claims(self, claims: Sequence[Claim], verdicts: Sequence[tuple[str, str]]) -> str:
        heads = {"primary": "Primary claims: the paper's headline claims in its configuration, on the confirmatory seeds",
                 "secondary": "Secondary claims: other configurations, ablations, fedrun's own hypotheses",
                 "by construction": "By construction: counted bytes, listed apart, never counted as met",
                 "not attempted": "Not attempted"}
        out = [f"## The claims\n\n{RULE}"]
        for fam, head in heads.items():
            rows = [(c, v, d) for c, (v, d) in zip(claims, verdicts) if c.family == fam]
            if not rows:
                continue
            if fam in self.family:
                head += f" (Holm over the paper's {fam} family: {self.family[fam]})"
            out.append(f"### {head}\n\n" + "\n".join(
                f"- {c.text}: **{v}** — {detail}." + (f" Paper: {c.paper}" + (f" ({c.where})" if c.where else "") + "."
                                                      if c.paper else "") + _registered(c) for c, v, detail in rows))
        return "\n\n".join(out) + "\n"

    def summary(self) -> str:
        """The paper's primary claims (all its reports): verdict, the paper's number beside fedrun's estimate."""
        rows = [(t["claim"] + ("" if t["report"] == self.name else f" ({t['report']})"), f"**{t['verdict']}**",
                 t["number"], t.get("estimate", ""), t.get("exploratory", "") or "–") for _, t in self.primary]
        head = ["claim", "verdict", "paper", "fedrun (confirmatory seeds: estimate, 95 % CI, seeds per cell)",
                "exploratory seeds (not judged)"]
        return "## Primary claims (every report of the registry)\n\n" + md(head, rows) if rows else ""

    def files(self, blocks: Mapping[str, str], figures: Mapping[str, bytes] = {},
              expect: Sequence[Mapping[str, Any]] = (), claims: bool = False, readme: bool = True) -> dict[Path, bytes]:
        """The report's files (paths relative to the root): its figures, its markdown (the template
        ``<output>.template.md`` filled with ``blocks`` and the runs line, coverage, claims, the paper's primary
        claims and numbers); with ``claims`` (its rows of the registry ``claims.csv`` beside ``output``),
        ``<output>.verdicts.csv`` and README.md with its claims block regenerated."""
        claims = registry(self.root, str(Path(self.output).parent / "claims.csv"), self.name) if claims else []
        verdicts = self.verdicts(claims) if claims else []
        blocks = {"runs": self.runs_line(), **({"cells": self.coverage(expect)} if expect else {}),
                  **({"claims": self.claims(claims, verdicts), "summary": self.summary()} if claims else {}),
                  **({"paper": self.paper_numbers()} if self.paper else {}), **blocks}
        out = {Path(self.output).parent / f: b for f, b in figures.items()}
        out[Path(self.output)] = fill(self.root / Path(self.output).with_suffix(".template.md"), blocks).encode()
        if claims:
            out[Path(self.output).with_suffix(".verdicts.csv")] = pd.DataFrame(
                [(self.name, c.id, c.family, v, c.text) for c, (v, _) in zip(claims, verdicts)],
                columns=["report", "id", "family", "verdict", "claim"]).to_csv(index=False).encode("utf-8")
        if claims and readme:
            path = self.root / README
            if not path.exists():
                raise ValueError(f"{path} not found: the claims of {self.name} go into its claims block")
            link = os.path.relpath(self.output, os.path.dirname(README) or ".").replace(os.sep, "/")
            head = (f"Claims checked by [{Path(self.output).name}]({link}) (registered in its folder's "
                    f"claims.csv; Welch t per comparison, each direction at α/2, Holm within the paper's primary and "
                    f"secondary families at α = {stats.ALPHA:g}; the numbers are there):")
            body = "\n".join([head] + [f"- {c.text} [{c.family}]: **{v}**" for c, (v, _) in zip(claims, verdicts)])
            out[Path(README)] = splice(path.read_text(), self.name, body).encode("utf-8")
        return out

    def curves(self, file: str, panels: Sequence[str], lines: Sequence[str], title: str, where: Mapping = {},
               color: tuple | None = None, style: tuple | None = None, series: str = "test_accuracy",
               ylabel: str = "test accuracy", xlabel: str = "round", yscale: str = "linear") -> dict[str, bytes]:
        """{file: a figure}: per panel (every combination of the ``panels`` dims with runs), one line per
        combination of the ``lines`` dims: the mean (± std) of ``series`` per step. ``color``/``style``: (dim, map)."""
        if FAMILY is None:
            return {}
        values = [self.present(d, where) for d in panels]
        out = []
        for combo in itertools.product(*values):
            at = {**where, **dict(zip(panels, combo))}
            curves = []
            for lk in self.combos(lines, at):
                lat = {**at, **dict(zip(lines, lk))}
                by_step: dict[int, list[float]] = {}
                for s in self.match(lat)["series"]:
                    for step, v in (s or {}).get(series, []):
                        by_step.setdefault(int(step), []).append(float(v))
                if by_step:
                    steps = sorted(by_step)
                    st = [finite(by_step[s]) for s in steps]
                    curves.append(Curve(" ".join(self.dims[d].tag(v) for d, v in zip(lines, lk)), tuple(steps),
                                        tuple(map(mean, st)), tuple(map(sd, st)), max(map(len, st)),
                                        color and color[1].get(lat.get(color[0])),
                                        style and style[1].get(lat.get(style[0]))))
            out.append((", ".join(self.dims[d].label(v) for d, v in zip(panels, combo)), curves))
        ncols = len(values[-1]) if len(panels) >= 2 else min(2, max(1, len(out)))
        return {file: draw(out, file, title, xlabel, ylabel, max(1, ncols), yscale)}


def _same(x: Any, text: str) -> bool:
    """A dim's value ``x`` is the registry's ``text`` (``0.05`` is 0.05, ``1`` is 1.0)."""
    if str(x) == text:
        return True
    try:
        return not isinstance(x, (bool, str)) and float(text) == float(x)
    except (TypeError, ValueError):
        return False


def _ranges(seeds: Sequence[int]) -> str:
    """0, 1, 2, 3, 5 → 0–3, 5."""
    runs = [[x for _, x in g] for _, g in itertools.groupby(enumerate(seeds), lambda ix: ix[1] - ix[0])]
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _natural(key: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key))


def _registered(c: Claim) -> str:
    """A registry row's design, for the claim's line."""
    r = c.row
    if not r:
        return ""
    return (f" Registered {r['registered']}: test {r['test']}" + (f", margin {r['margin']} ({r['margin_source']})"
                                                                   if r["margin"] not in ("", "0") else "")
            + (f", seeds {_ranges(list(c.seeds))}" if c.seeds else "") + (f", {c.looks} looks" if c.looks > 1 else "")
            + "." + (f" Amended: {r['amendment']}." if r["amendment"] else "") + (f" Note: {r['note']}."
                                                                                  if r["note"] and not c.fixed else ""))


RULE = (f"Rule (results/README.md, fixed before the confirmatory runs): each comparison is a difference of cell "
        f"means over seeds (or a difference of such differences), tested by Welch's t with the conservative degrees "
        f"of freedom min(nᵢ) − 1 (no equal-variance assumption), in the direction of the claim and in the opposite "
        f"one, each one-sided at α/2 = {stats.ALPHA / 2:g}; an equivalence or magnitude claim by two one-sided tests "
        f"(TOST) against its margin, a non-inferiority claim one-sided against −margin. A claim of several "
        f"comparisons is met when all are (the largest p), an *any of* claim when one is (Holm within the claim); a "
        f"claim whose runs were looked at before seeds were added has its p multiplied by the number of looks. A "
        f"paper's primary claims (in all its reports) are one family and its secondary claims another: Holm's "
        f"step-down within each, and a claim is **met** or **not met** when its adjusted p is at most α = "
        f"{stats.ALPHA:g}, else **inconclusive**, with the seeds per cell that would give 80 % power at the observed "
        f"difference and spread at α/m (Holm's strictest step, an upper bound). Primary claims are judged on their "
        f"registered confirmatory seeds only. The 95 % CI is Welch's, before the family's correction. A time to a "
        f"target is a censored outcome (a run that never reached it is censored at its whole time): compared by the "
        f"log-rank test in each direction (one-sided, at α/2), with each cell's Kaplan–Meier median and how many runs "
        f"reached the target. A saving of counted bytes (no noise) is decided without a test: *true by construction* "
        f"when 1 − mean(left)/mean(right) reaches its threshold (else *false by construction*), and never counted as "
        f"met.")


class Collected(Exception):
    """What :meth:`Report.verdicts` raises when :data:`FAMILY` is None: the raw p-values of the tested claims."""


def fill(template: Path, blocks: Mapping[str, str]) -> str:
    """The hand-written ``template`` (the report's text) with every line ``{{name}}`` replaced by ``blocks[name]``."""
    def block(m: re.Match) -> str:
        if m.group(1) not in blocks:
            raise ValueError(f"{template}: {{{{{m.group(1)}}}}} is not a block of this report: {', '.join(blocks)}")
        return blocks[m.group(1)].rstrip("\n") + "\n"
    if not template.exists():
        raise ValueError(f"{template} not found (the report's text, with a line {{{{name}}}} per generated block)")
    return re.sub(r"^\{\{(\w+)\}\}\n", block, template.read_text(), flags=re.M)


def markers(name: str) -> tuple[str, str]:
    return (f"<!-- claims: {name} (generated by python -m fedrun.report {name}; do not edit) -->",
            f"<!-- /claims: {name} -->")


def splice(readme: str, name: str, body: str) -> str:
    """``readme`` with the claims block of ``name`` replaced by ``body``; a missing or doubled block is a ValueError
    (one line saying what to add)."""
    start, end = markers(name)
    pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.S)
    found = pattern.findall(readme)
    if len(found) != 1:
        raise ValueError(f"{README} {'has no' if not found else f'has {len(found)}'} claims block for {name}: add "
                         f"the two lines {start!r} and {end!r} where its verdicts belong")
    return pattern.sub(lambda _m: f"{start}\n{body}\n{end}", readme)


#: one line of a panel: the mean and std over runs per step, the most runs at a step, its colour and line style
Curve = namedtuple("Curve", "label steps mean std n color linestyle")
#: the same matplotlib gives the same bytes: SVG ids from a fixed salt, glyphs as paths, matplotlib's DejaVu Sans
RC = {"svg.hashsalt": "fedrun-report", "svg.fonttype": "path", "font.family": "DejaVu Sans", "path.simplify": False,
      "figure.dpi": 100}


def draw(panels: Sequence[tuple[str, Sequence[Curve]]], file: str, title: str = "", xlabel: str = "round",
         ylabel: str = "", ncols: int = 2, yscale: str = "linear") -> bytes:
    """The figure's bytes (SVG or PNG by ``file``'s extension, no date or software metadata): one panel per (title,
    curves), ``ncols`` a row, y shared (``yscale``: linear or log; on a log scale no band reaching 0)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    kind = "svg" if file.endswith(".svg") else "png"
    with matplotlib.rc_context(RC):
        cols = max(1, min(len(panels), ncols))
        rows = math.ceil(max(1, len(panels)) / cols)
        height = 3.4 * rows + 0.9
        fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, height), sharey=True, squeeze=False)
        handles: dict[str, object] = {}  # one legend for the figure: a line's label → its first handle
        for ax, (ptitle, lines) in zip(axes.flat, panels):
            for c in lines:
                (h,) = ax.plot(c.steps, c.mean, color=c.color, linestyle=c.linestyle or "-", marker=".",
                               markersize=3, linewidth=1.2, label=c.label)
                handles.setdefault(c.label, h)
                lo = [m - s for m, s in zip(c.mean, c.std) if not math.isnan(s)]
                if len(lo) == len(c.mean) and (yscale == "linear" or min(lo, default=1) > 0):  # log: no band to ≤ 0
                    ax.fill_between(c.steps, lo, [m + s for m, s in zip(c.mean, c.std)], color=c.color, alpha=0.12,
                                    linewidth=0)
            seeds = sorted({c.n for c in lines})
            ax.set_title(ptitle + ("" if not seeds else f" (n = {seeds[0]}" + (f"–{seeds[-1]})" if len(seeds) > 1
                                                                                 else ")")), fontsize=9)
            if yscale != "linear":
                ax.set_yscale(yscale)
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if not lines:
                ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center", va="center", color="gray")
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        for ax in axes[-1]:
            ax.set_xlabel(xlabel)
        for row in axes:
            row[0].set_ylabel(ylabel)
        if handles:
            fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(5, len(handles)),
                       fontsize=7, frameon=False)
        if title:
            fig.suptitle(title, fontsize=10)
        # fixed margins (no tight_layout: seconds per figure, and the same bytes either way)
        fig.subplots_adjust(left=0.6 / (4.6 * cols), right=1 - 0.15 / (4.6 * cols), top=1 - 0.55 / height,
                            bottom=(0.5 + 0.18 * math.ceil(len(handles) / 5)) / height, wspace=0.08, hspace=0.35)
        buf = io.BytesIO()
        fig.savefig(buf, format=kind, metadata={"Date": None} if kind == "svg" else {"Software": None}, dpi=100)
        plt.close(fig)
    return buf.getvalue()
