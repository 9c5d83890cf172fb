"""Records + a :class:`~fedrun.reports.spec.Spec` → cells, tables, claims, the markdown. Pure: no MLflow, no files.

A run (a record: ``params.*``, ``metrics.*``, ``tags.*``, ``series``; :func:`fedrun.export.load`) is placed by
the spec's dims (:func:`place`); runs with the same dims but the replicate (the seed) make a cell, one run per
seed (the newest when a seed ran twice). Each value of a cell is aggregated over its runs (:class:`Stat`:
n, mean, sample std).

The claim rule (:func:`compare`), stated in every report: the difference of two cells' means, taken in the
claimed direction and plus the claim's tolerance, is **met** when it exceeds k·SE (SE = √(s₁²/n₁ + s₂²/n₂),
k = 2 by default), **not met** when it is below −k·SE, and **inconclusive (within noise)** in between; a cell
with fewer than ``min_seeds`` (3) runs makes it **inconclusive (fewer than 3 seeds)**. A claim of several
comparisons is met when every one is met, not met when any one is not met; a claim with ``combine: any`` is met
when some comparison is met, not met when every one is not met. A ``saving`` claim reads counted bytes: met when
1 − mean(left)/mean(right) ≥ its threshold.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from fedrun.reports.spec import Cell, Claim, Dim, Figure, Spec, SpecError, Table

MARKS = ("†", "‡", "§", "¶", "‖", "#")
MET, NOT_MET, NOISE, FEW, NOT_CHECKABLE = ("met", "not met", "inconclusive (within noise)",
                                           "inconclusive (fewer than {n} seeds)", "not checkable")


# --------------------------------------------------------------------------------------------- numbers
def fmt_number(x: float, spec: str = "{:.3f}") -> str:
    """A number for a table: ``–`` when missing, ``∞`` for infinity."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    try:
        return spec.format(x)
    except (ValueError, TypeError):
        return str(x)


@dataclass(frozen=True)
class Stat:
    """One value of a cell over its runs: the finite-or-infinite values (NaN = missing left out)."""

    values: tuple[float, ...] = ()

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return math.fsum(self.values) / self.n if self.n else math.nan

    @property
    def std(self) -> float:
        """Sample standard deviation (n − 1); NaN for n < 2."""
        if self.n < 2:
            return math.nan
        m = self.mean
        if math.isinf(m):
            return math.nan
        return math.sqrt(math.fsum((v - m) ** 2 for v in self.values) / (self.n - 1))

    @property
    def se(self) -> float:
        return self.std / math.sqrt(self.n) if self.n >= 2 else math.nan

    def agg(self, how: str) -> float:
        if how in ("mean", "mean_std"):
            return self.mean
        if not self.values:
            return math.nan
        if how == "median":
            s = sorted(self.values)
            mid = len(s) // 2
            return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
        if how == "min":
            return min(self.values)
        if how == "max":
            return max(self.values)
        if how == "n":
            return float(self.n)
        raise ValueError(how)

    def render(self, how: str, spec: str) -> str:
        if how == "n":
            return str(self.n)
        if not self.values:
            return "–"
        if how == "mean_std":
            if self.n == 1:
                return f"{fmt_number(self.mean, spec)} (1)"
            return f"{fmt_number(self.mean, spec)} ± {fmt_number(self.std, spec)} ({self.n})"
        if how == "same":
            lo, hi = min(self.values), max(self.values)
            a, b = fmt_number(lo, spec), fmt_number(hi, spec)
            return a if a == b else f"{a}–{b}"
        return fmt_number(self.agg(how), spec)

    def brief(self, spec: str = "{:.3f}") -> str:
        """``0.814 ± 0.010 (n=3)`` for claim lines."""
        if not self.values:
            return "no runs"
        if self.n == 1:
            return f"{fmt_number(self.mean, spec)} (n=1)"
        return f"{fmt_number(self.mean, spec)} ± {fmt_number(self.std, spec)} (n={self.n})"


def stat(values: Sequence[float]) -> Stat:
    return Stat(tuple(float(v) for v in values if not (isinstance(v, float) and math.isnan(v))))


# --------------------------------------------------------------------------------------------- placing runs
@dataclass(frozen=True)
class Run:
    """A record placed in the table: its dims (cell dims and replicate), its values, the record."""

    dims: Mapping[str, Any]
    values: Mapping[str, float]
    record: Mapping[str, Any] = field(compare=False, hash=False)


@dataclass
class Placed:
    """All runs of a report by cell (key: the cell dims' values in spec order), and what was left out."""

    cells: dict[tuple, list[Run]]
    read: int = 0
    filtered: int = 0          # by the spec's ``where``
    outside: dict[str, int] = field(default_factory=dict)   # dim → runs whose value is not in its values / missing
    duplicates: int = 0        # older runs of a (cell, seed) that ran again

    @property
    def runs(self) -> list[Run]:
        return [r for key in sorted(self.cells, key=str) for r in self.cells[key]]


def _raw(record: Mapping[str, Any], dim: Dim) -> Any:
    for key in dim.sources:
        v = record.get(key)
        if v is not None and v != "":
            return v
    return None


def place(spec: Spec, record: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The dims of a run, or (None, the dim that leaves it out)."""
    dims: dict[str, Any] = {}
    for name, dim in spec.dims.items():
        raw = _raw(record, dim)
        if raw is None:
            if dim.missing is None:
                dims[name] = None
                continue
            dims[name] = dim.missing
            continue
        try:
            dims[name] = dim.convert(raw)
        except (TypeError, ValueError):
            return None, name
    for name, dim in spec.dims.items():  # fixed values (FL-STD's r is 1 whatever params.r says)
        for other, table in dim.fixed.items():
            if dims.get(other) in table:
                dims[name] = table[dims[other]]
    for name, dim in spec.dims.items():
        if dims[name] is None and name != spec.replicate:
            return None, name
        if dim.values is not None and dims[name] not in dim.values:   # the replicate's values too (seeds kept)
            return None, name
    return dims, ""


def run_values(spec: Spec, record: Mapping[str, Any], dims: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, v in spec.values.items():
        if any(dims.get(d) not in allowed for d, allowed in v.when.items()):
            out[name] = math.nan
            continue
        out[name] = v.fn(record, dims, out)
    return out


def _keep(spec: Spec, record: Mapping[str, Any]) -> bool:
    return all(str(record.get(k, "")) in allowed for k, allowed in spec.where.items())


def collect(spec: Spec, records: Sequence[Mapping[str, Any]]) -> Placed:
    """Place every record: filter (``where``), dims, one run per (cell, seed): the newest."""
    placed = Placed(cells={}, read=len(records))
    newest: dict[tuple, tuple[tuple, Run]] = {}
    for rec in records:
        if not _keep(spec, rec):
            placed.filtered += 1
            continue
        dims, why = place(spec, rec)
        if dims is None:
            placed.outside[why] = placed.outside.get(why, 0) + 1
            continue
        run = Run(dims, run_values(spec, rec, dims), rec)
        key = tuple(dims[d] for d in spec.cell_dims)
        slot = (key, dims.get(spec.replicate) if spec.replicate else None)
        order = (int(rec.get("start_time") or 0), str(rec.get("run_id", "")))
        if slot in newest:
            placed.duplicates += 1
            if newest[slot][0] >= order:
                continue
        newest[slot] = (order, run)
    for (key, _), (_, run) in newest.items():
        placed.cells.setdefault(key, []).append(run)
    for key in placed.cells:
        placed.cells[key].sort(key=lambda r: (str(r.dims.get(spec.replicate)), str(r.record.get("run_id", ""))))
    return placed


def _sort_key(spec: Spec, names: Sequence[str], values: Sequence[Any]) -> tuple:
    return tuple(spec.dims[n].order(v) for n, v in zip(names, values))


def matching(spec: Spec, placed: Placed, at: Mapping[str, Any]) -> list[tuple[tuple, list[Run]]]:
    """The cells whose dims agree with ``at`` (a partial assignment), in spec order."""
    idx = {d: i for i, d in enumerate(spec.cell_dims)}
    out = [(key, runs) for key, runs in placed.cells.items()
           if all(key[idx[d]] in (v if isinstance(v, tuple) else (v,)) for d, v in at.items() if d in idx)]
    return sorted(out, key=lambda kv: _sort_key(spec, spec.cell_dims, kv[0]))


def cell_stat(spec: Spec, placed: Placed, at: Mapping[str, Any], value: str) -> Stat:
    """One value over the runs of every cell matching ``at`` (one cell when ``at`` names every cell dim)."""
    return stat([r.values[value] for _, runs in matching(spec, placed, at) for r in runs])


def present(spec: Spec, placed: Placed, dim: str, at: Mapping[str, Any] | None = None) -> list[Any]:
    """The values of ``dim`` that have runs (among the cells matching ``at``), in the dim's order."""
    i = spec.cell_dims.index(dim)
    vals = {key[i] for key, _ in matching(spec, placed, at or {})}
    return sorted(vals, key=spec.dims[dim].order)


# --------------------------------------------------------------------------------------------- paper numbers
def marks(spec: Spec) -> dict[int, str]:
    """Paper entry index → its mark (inferred numbers only: †, ‡, §, …), in spec order."""
    inferred = [i for i, p in enumerate(spec.paper) if p.status == "inferred"]
    return {i: MARKS[j % len(MARKS)] * (1 + j // len(MARKS)) for j, i in enumerate(inferred)}


def paper_entry(spec: Spec, quantity: str, at: Mapping[str, Any]) -> int | None:
    """The index of the paper number for ``quantity`` at ``at`` (every dim the entry names agrees)."""
    found = [i for i, p in enumerate(spec.paper)
             if p.quantity == quantity and all(d in at and at[d] == v for d, v in p.at.items())]
    if len(found) > 1:
        raise SpecError(f"{spec.name}: paper[{found[0]}] and paper[{found[1]}] both give {quantity!r} at "
                        f"{describe(spec, at)}")
    return found[0] if found else None


def describe(spec: Spec, at: Mapping[str, Any]) -> str:
    return " ".join(spec.dims[d].tag(v) for d, v in at.items() if d in spec.dims)


def paper_text(spec: Spec, i: int, mk: Mapping[int, str], fmt: str = "{:g}") -> str:
    """The paper's number (its own format, else ``fmt``) with its mark if inferred."""
    p = spec.paper[i]
    return fmt_number(p.number, p.fmt or fmt) + mk.get(i, "")


# --------------------------------------------------------------------------------------------- tables
def _layout(spec: Spec, table: Table, placed: Placed, base: Mapping[str, Any]) -> list[tuple[Cell, dict[str, Any]]]:
    """The columns: (cell spec, the column dims it is placed at), column groups without runs left out."""
    full = len(table.columns)
    out: list[tuple[Cell, dict[str, Any]]] = []

    def walk(depth: int, fixed: dict[str, Any]) -> None:
        for c in table.cells:
            if (c.level if c.level is not None else full) == depth:
                out.append((c, dict(fixed)))
        if depth < full:
            dim = table.columns[depth]
            for v in present(spec, placed, dim, {**base, **fixed}):
                walk(depth + 1, {**fixed, dim: v})

    walk(0, {})
    return out


def _header(spec: Spec, cell: Cell, fixed: Mapping[str, Any]) -> str:
    parts = [spec.dims[d].label(v) for d, v in fixed.items()]
    if cell.header:
        parts.append(cell.header)
    return " · ".join(parts) or (cell.value or cell.paper or "")


def table_sections(spec: Spec, table: Table, placed: Placed, mk: Mapping[int, str]
                   ) -> list[tuple[str, str, list[int]]]:
    """(section heading, markdown table, paper entries used) per section of ``table`` (one without a split)."""
    base = {d: v for d, v in table.where.items()}
    splits = present(spec, placed, table.split, base) if table.split else [None]
    out = []
    for sv in splits:
        at = dict(base)
        if table.split:
            at[table.split] = sv
        cols = _layout(spec, table, placed, at)
        rows = sorted({tuple(key[spec.cell_dims.index(d)] for d in table.rows)
                       for key, _ in matching(spec, placed, at)}, key=lambda r: _sort_key(spec, table.rows, r))
        used: list[int] = []
        body: list[list[str]] = []
        for row in rows:
            ctx = {**at, **dict(zip(table.rows, row))}
            texts = [spec.dims[d].label(v) for d, v in zip(table.rows, row)]
            best: dict[int, tuple[float, int]] = {}   # cell spec → (its best aggregate in this row, column)
            for c, fixed in cols:
                here = {**ctx, **fixed}
                if c.paper is not None:
                    i = paper_entry(spec, c.paper, here)
                    if i is None:
                        texts.append("")
                    else:
                        texts.append(paper_text(spec, i, mk, c.fmt))
                        if i not in used:
                            used.append(i)
                else:
                    st = cell_stat(spec, placed, here, c.value)
                    texts.append(st.render(c.agg, c.fmt))
                    x = st.agg("mean" if c.agg == "same" else c.agg)
                    if c.best and not math.isnan(x):
                        key = (x if c.best == "min" else -x, len(texts) - 1)
                        j = table.cells.index(c)
                        best[j] = min(best.get(j, key), key)
            for _, col in best.values():
                texts[col] = f"**{texts[col]}**"
            body.append(texts)
        head = [spec.dims[d].header for d in table.rows] + [_header(spec, c, f) for c, f in cols]
        keep = list(range(len(head)))
        if table.drop_empty:  # columns with nothing in any row of this section
            keep = [j for j in keep if j < len(table.rows) or any(r[j] not in ("", "–") for r in body)]
        lines = ["| " + " | ".join(head[j] for j in keep) + " |", "|" + "|".join("---" for _ in keep) + "|"]
        lines += ["| " + " | ".join(r[j] for j in keep) + " |" for r in body]
        heading = spec.dims[table.split].label(sv) if table.split else ""
        out.append((heading, "\n".join(lines) + "\n", used))
    return out


def footnotes(spec: Spec, used: Sequence[int], mk: Mapping[int, str]) -> str:
    lines = []
    for i in sorted(set(used)):
        if i in mk:
            p = spec.paper[i]
            lines.append(f"{mk[i]} inferred, not stated in the paper: {p.how} ({p.where})")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- claims
@dataclass(frozen=True)
class Verdict:
    verdict: str
    detail: str


def compare(left: Stat, right: Stat, op: str, tol: float = 0.0, k: float = 2.0,
            min_seeds: int = 3) -> tuple[str, float, float]:
    """The rule for one comparison ``left op right`` (tolerance ``tol`` in the claim's favour): (verdict,
    difference in the claimed direction + tol, k·SE)."""
    if not left.n or not right.n:
        return NOT_CHECKABLE, math.nan, math.nan
    d = (left.mean - right.mean if op in (">", ">=") else right.mean - left.mean) + tol
    if min(left.n, right.n) < min_seeds:
        return FEW.format(n=min_seeds), d, math.nan
    band = k * math.sqrt(left.std ** 2 / left.n + right.std ** 2 / right.n)
    if d > band:
        return MET, d, band
    if d < -band:
        return NOT_MET, d, band
    return NOISE, d, band


def combine(verdicts: Sequence[str], how: str = "all") -> str:
    """Several comparisons. ``all``: not met if any is, met if all are; ``any``: met if any is, not met if all are
    not. Otherwise the first inconclusive reason (not checkable, then fewer seeds, then within noise)."""
    if how == "any":
        if MET in verdicts:
            return MET
        if all(v == NOT_MET for v in verdicts):
            return NOT_MET
    else:
        if NOT_MET in verdicts:
            return NOT_MET
        if all(v == MET for v in verdicts):
            return MET
    if NOT_CHECKABLE in verdicts:
        return NOT_CHECKABLE
    few = [v for v in verdicts if v.startswith("inconclusive (fewer")]
    return few[0] if few else NOISE


def _for_each_values(spec: Spec, claim: Claim, placed: Placed) -> list[dict[str, Any]]:
    """The for_each combinations: the listed values, or those with runs (the dim's first value when none has)."""
    lists = []
    for d, vals in claim.for_each:
        if vals is None:
            vals = present(spec, placed, d) or list(spec.dims[d].values or [])[:1]
        lists.append(list(vals))
    names = [d for d, _ in claim.for_each]
    return [dict(zip(names, combo)) for combo in itertools.product(*lists)]


def _fill(text: str, env: Mapping[str, Any]) -> str:
    return text.format(**{d: (f"{v:g}" if isinstance(v, float) else str(v)) for d, v in env.items()})


def _names(spec: Spec, cells: Sequence[Mapping[str, Any]]) -> list[str]:
    """Short names of claim cells: the dims that differ between them (all dims if none differ)."""
    dims = [d for d in spec.cell_dims if len({c.get(d, None) for c in cells}) > 1]
    dims = dims or [d for d in spec.cell_dims if any(d in c for c in cells)]
    return [" ".join(spec.dims[d].tag(c[d]) for d in dims if d in c) for c in cells]


def _one_cell(spec: Spec, placed: Placed, at: Mapping[str, Any]) -> str | None:
    """None when ``at`` picks at most one cell; else why not."""
    n = len(matching(spec, placed, at))
    if n <= 1:
        return None
    free = [d for d in spec.cell_dims if d not in at]
    return f"{describe(spec, at)} matches {n} cells (name {', '.join(free)})"


def evaluate(spec: Spec, claim: Claim, placed: Placed) -> list[tuple[str, Verdict]]:
    """(claim text with its for_each values, verdict) for each for_each combination."""
    out = []
    for env in _for_each_values(spec, claim, placed):
        labels = {d: spec.dims[d].label(v) for d, v in env.items()}
        text = claim.text.format(**labels)
        extra = [labels[d] for d in env if "{" + d + "}" not in claim.text]
        if extra:
            text += f" [{'; '.join(extra)}]"
        if claim.kind == "saving":
            cells = [spec.parse_cell(_fill(claim.left, env)), spec.parse_cell(_fill(claim.right, env))]
        else:
            cells = [spec.parse_cell(_fill(t, env)) for c in claim.compare for t in (c.left, c.right)]
        bad = next((why for why in (_one_cell(spec, placed, c) for c in cells) if why), None)
        if bad:
            out.append((text, Verdict(NOT_CHECKABLE, bad)))
            continue
        names = dict(zip(map(lambda c: tuple(sorted(c.items(), key=str)), cells), _names(spec, cells)))

        def name(c: Mapping[str, Any]) -> str:
            return names[tuple(sorted(c.items(), key=str))]

        if claim.kind == "saving":
            left, right = (cell_stat(spec, placed, c, claim.value) for c in cells)
            if not left.n or not right.n:
                missing = [name(c) for c, s in zip(cells, (left, right)) if not s.n]
                out.append((text, Verdict(NOT_CHECKABLE, f"no runs: {', '.join(missing)}")))
                continue
            saving = 1 - left.mean / right.mean if right.mean else math.nan
            v = MET if saving >= claim.at_least else NOT_MET
            out.append((text, Verdict(v, f"saving {saving * 100:.1f} % (threshold {claim.at_least * 100:.1f} %): "
                                         f"{name(cells[0])} {left.brief('{:.4g}')} vs {name(cells[1])} "
                                         f"{right.brief('{:.4g}')}")))
            continue
        verdicts, parts = [], []
        for comp, (lc, rc) in zip(claim.compare, zip(cells[::2], cells[1::2])):
            left, right = cell_stat(spec, placed, lc, claim.value), cell_stat(spec, placed, rc, claim.value)
            v, d, band = compare(left, right, comp.op, comp.tol, spec.rule.k, spec.rule.min_seeds)
            verdicts.append(v)
            op = {">=": "≥", "<=": "≤"}.get(comp.op, comp.op)
            if v == NOT_CHECKABLE:
                missing = [name(c) for c, s in ((lc, left), (rc, right)) if not s.n]
                desc = f"{name(lc)} {op} {name(rc)}: no runs of {' and '.join(missing)}"
            else:
                desc = f"{name(lc)} {left.brief()} {op} {name(rc)} {right.brief()}"
                desc += f": difference {d:+.3f}" + (f" (tolerance {comp.tol:+g} included)" if comp.tol else "")
                if not math.isnan(band):
                    desc += f", {spec.rule.k:g}·SE = {band:.3f}"
            parts.append(desc)
        detail = ("any of: " if claim.combine == "any" else "") + "; ".join(parts)
        out.append((text, Verdict(combine(verdicts, claim.combine), detail)))
    return out


def rule_text(spec: Spec) -> str:
    k, n = spec.rule.k, spec.rule.min_seeds
    return (f"Rule: each comparison of two cells takes the difference of their means over seeds in the claimed "
            f"direction (plus the claim's tolerance, if any): **met** when it is above {k:g}·SE, **not met** when "
            f"below −{k:g}·SE, **inconclusive (within noise)** in between, with SE = √(s₁²/n₁ + s₂²/n₂) "
            f"(s: sample std over seeds); **inconclusive (fewer than {n} seeds)** when either cell has fewer than {n} "
            f"runs. A "
            f"claim of several comparisons is met when all are met and not met when any is not met"
            + ("" if not any(c.combine == "any" for c in spec.claims) else
               "; a claim whose comparisons are listed as *any of* is met when any is met and not met when all "
               "are not met")
            + ". A bandwidth saving counts bytes (no noise): met when 1 − mean(left)/mean(right) reaches the "
              "threshold.")


# --------------------------------------------------------------------------------------------- figures (data)
@dataclass(frozen=True)
class Curve:
    label: str
    steps: tuple[int, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    n: int
    color: str | None
    linestyle: str | None


def curves(spec: Spec, fig: Figure, placed: Placed) -> tuple[list[tuple[str, list[Curve]]], int]:
    """((panel title, curves) per panel, number of columns): the mean (± std where n ≥ 2) of ``fig.series``
    per step over the runs of each line. Panels: every combination of the panel dims' values that have runs
    (row by row: the last panel dim's values are the columns; a combination without runs is an empty panel)."""
    from fedrun.tracking import internal_name

    series = internal_name(fig.series)
    base = dict(fig.where)
    panel_values = [present(spec, placed, d, base) for d in fig.panels]
    out = []
    for combo in itertools.product(*panel_values):
        at = {**base, **dict(zip(fig.panels, combo))}
        title = ", ".join(spec.dims[d].label(v) for d, v in zip(fig.panels, combo))
        line_keys = sorted({tuple(key[spec.cell_dims.index(d)] for d in fig.lines)
                            for key, _ in matching(spec, placed, at)}, key=lambda r: _sort_key(spec, fig.lines, r))
        lines = []
        for lk in line_keys:
            lat = {**at, **dict(zip(fig.lines, lk))}
            runs = [r for _, rs in matching(spec, placed, lat) for r in rs]
            by_step: dict[int, list[float]] = {}
            for r in runs:
                for step, value in (r.record.get("series") or {}).get(series, []):
                    by_step.setdefault(int(step), []).append(float(value))
            if not by_step:
                continue
            steps = tuple(sorted(by_step))
            stats = [stat(by_step[s]) for s in steps]
            label = " ".join(spec.dims[d].tag(v) for d, v in zip(fig.lines, lk))
            color = fig.color.map.get(lat.get(fig.color.dim)) if fig.color else None
            style = fig.linestyle.map.get(lat.get(fig.linestyle.dim)) if fig.linestyle else None
            lines.append(Curve(label, steps, tuple(s.mean for s in stats), tuple(s.std for s in stats),
                               max(s.n for s in stats), color, style))
        out.append((title, lines))
    ncols = len(panel_values[-1]) if len(fig.panels) >= 2 else min(2, max(1, len(out)))
    return out, max(1, ncols)


# --------------------------------------------------------------------------------------------- the document
def _hours(ms: float) -> str:
    return f"{ms / 3.6e6:.2f} h"


def runs_line(spec: Spec, placed: Placed, export_names: Sequence[str]) -> str:
    runs = placed.runs
    parts = [f"Runs: {placed.read} in the export{'s' if len(export_names) > 1 else ''} "
             f"{', '.join(f'`{e}`' for e in export_names)}; {len(runs)} in the tables"]
    left = []
    if placed.filtered:
        wanted = ", ".join(f"{k} = {'/'.join(v)}" for k, v in spec.where.items())
        left.append(f"{placed.filtered} not matching {wanted}")
    for d, n in sorted(placed.outside.items()):
        left.append(f"{n} outside the spec's {d} values")
    if placed.duplicates:
        left.append(f"{placed.duplicates} older repeats of a (cell, {spec.replicate or 'cell'})")
    if left:
        parts[0] += " (left out: " + "; ".join(left) + ")"
    times = [(int(r.record.get("start_time") or 0), int(r.record.get("end_time") or 0)) for r in runs]
    times = [(s, e) for s, e in times if s and e and e >= s]
    if times:
        parts.append(f"first start to last end {_hours(max(e for _, e in times) - min(s for s, _ in times))}, "
                     f"the runs' own durations sum to {_hours(sum(e - s for s, e in times))}")
    return "; ".join(parts) + "."


def coverage(spec: Spec, placed: Placed) -> str:
    """How many of the expected cells have ≥ min_seeds / fewer / no runs (with the short list)."""
    if not spec.expect:
        return ""
    cells = []
    for e in spec.expect:
        names = [d for d in spec.cell_dims if d in e]
        for combo in itertools.product(*(e[d] for d in names)):
            at = dict(zip(names, combo))
            if at not in cells:
                cells.append(at)
    n_min = spec.rule.min_seeds
    full, few, none = [], [], []
    for at in cells:
        n = sum(len(rs) for _, rs in matching(spec, placed, at))
        (full if n >= n_min else few if n else none).append((at, n))
    text = (f"Cells: {len(cells)} expected; {len(full)} with ≥ {n_min} seeds, {len(few)} with 1–{n_min - 1}, "
            f"{len(none)} without runs.")
    if few or none:
        items = [f"{describe(spec, at)} ({n})" for at, n in few + none]
        text += (f"\n\n<details><summary>cells with fewer than {n_min} seeds (number of runs)</summary>\n\n"
                 + "; ".join(items) + "\n\n</details>")
    return text


def paper_numbers(spec: Spec, mk: Mapping[int, str]) -> str:
    if not spec.paper:
        return ""
    lines = ["| cell | quantity | paper | where in the paper | read or inferred |", "|---|---|---|---|---|"]
    for i, p in enumerate(spec.paper):
        how = "read (stated)" if p.status == "read" else f"**inferred**{mk.get(i, '')}: {p.how}"
        cell_fmt = next((c.fmt for t in spec.tables for c in t.cells if c.paper == p.quantity), "{:g}")
        lines.append(f"| {describe(spec, p.at)} | {spec.values[p.quantity].label} | "
                     f"{paper_text(spec, i, mk, cell_fmt)} | {p.where} | {how} |")
    return "\n".join(lines) + "\n"


def render(spec: Spec, records: Sequence[Mapping[str, Any]], export_names: Sequence[str] = (),
           figures: Sequence[str] = (), notes: str = "") -> str:
    """The report's markdown (``figures``: the figure files' names, linked in order)."""
    placed = collect(spec, records)
    mk = marks(spec)
    parts = [f"# {spec.title}\n"]
    if spec.intro:
        parts.append(spec.intro + "\n")
    parts.append("Generated by `python -m fedrun.report " + spec.name + "` from the committed run data alone; do "
                 "not edit by hand.\n")
    if spec.commands:
        parts.append("Commands:\n\n```\n" + "\n".join(spec.commands) + "\n```\n")
    parts.append(runs_line(spec, placed, export_names) + "\n")
    cov = coverage(spec, placed)
    if cov:
        parts.append(cov + "\n")
    for table in spec.tables:
        if table.title:
            parts.append(f"## {table.title}\n")
        if table.note:
            parts.append(table.note.strip() + "\n")
        for heading, md, used in table_sections(spec, table, placed, mk):
            if heading:
                parts.append(f"### {heading}\n")
            parts.append(md)
            notes_text = footnotes(spec, used, mk)
            if notes_text:
                parts.append(notes_text + "\n")
    for fig, file in zip(spec.figures, figures):
        parts.append(f"![{fig.alt or fig.title or fig.series}]({file})\n")
    if spec.claims:
        parts.append("## The paper's claims\n")
        parts.append(rule_text(spec) + "\n")
        lines = []
        for claim in spec.claims:
            for text, v in evaluate(spec, claim, placed):
                paper = ""
                if claim.paper:
                    paper = f" Paper: {claim.paper}" + (f" ({claim.where})" if claim.where else "") + "."
                lines.append(f"- {text}: **{v.verdict}** — {v.detail}.{paper}")
        parts.append("\n".join(lines) + "\n")
    pn = paper_numbers(spec, mk)
    if pn:
        parts.append("## The paper's numbers\n")
        parts.append("Every number of the paper in this report, where it stands, and whether the paper states it "
                     "(read) or it was worked out from what the paper states (inferred, marked).\n")
        parts.append(pn)
    if notes.strip():
        parts.append(notes.strip() + "\n")
    return "\n".join(parts)
