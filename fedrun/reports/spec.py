"""A report spec (``conf/report/<table>.yaml``) → a validated :class:`Spec`. Pure: no MLflow, no run data.

The file, by key (every field is checked; a bad one raises :class:`SpecError`, one line naming it):

``title``, ``intro`` (markdown), ``commands`` (shown in a code block), ``notes`` (a markdown file appended,
relative to the repository), ``output`` (the markdown file, relative to the repository).

``exports``: the run data: ``[{path: results/x/runs/<name>, experiment: <MLflow experiment>, every: k,
metrics: [...]}]`` (``every`` / ``metrics``: how ``--export`` thins the per-round history, see
:mod:`fedrun.export`).

``where``: record filters, ``{record key: value or [values]}`` (``status: FINISHED``).

``dims``: named values of a run that place it in the table: ``{name: {from: key or [keys tried in order],
type: str|float|int, values: [order, and the values kept], labels: {value: text}, map: {raw text: value},
missing: value for runs without the key (else the run is left out), fixed: {other dim: {its value: this
value}}, header: text}}``. ``replicate``: the dim that numbers repetitions (the seed): a cell is every other
dim's value, its runs are the repetitions, one per replicate value (the newest run if several).

``values``: named per-run numbers: ``{name: expression}`` or ``{name: {expr: …, when: {dim: value}, label}}``;
an expression is arithmetic (+ - * / **, numbers) over record keys (``metrics.best_test_accuracy``,
``params.num_clients``), dims and values defined above it, and two functions of a run's per-round history:
``reach(series.test_accuracy, 0.78)`` (the first round at which it is ≥ 0.78) and ``at(series.uplink_bytes_total,
rounds)`` (its value at that round), NaN where never reached or not recorded.

``tables``: ``[{title, rows: [dims], columns: [dims], split: dim, where: {dim: values}, note, drop_empty: true
(leave out a column empty in every row of a section), cells: [...]}]``;
a cell is ``{header, value: name, agg: mean_std|mean|median|min|max|same|n, fmt: "{:.3f}", level: k}`` (a
measured value, aggregated over the repetitions) or ``{header, paper: name, fmt, level}`` (the paper's
number for that quantity); ``level``: how many of the column dims the cell is split by (default all);
``best: min|max`` (measured cells): in each row, the column of this cell with the lowest / highest aggregate is
bold.

``paper``: the paper's numbers: ``[{at: "scheme=fl_cs r=0.05 dp=on", quantity: value name, number: 0.78,
where: "Sec. V, text", status: read|inferred, how: "…" (required when inferred)}]``.

``claims``: ``[{text, paper, where, for_each: [dims] or {dim: [values] or present}, kind: compare, value: name,
compare: [[cell, op, cell, tol]], combine: all|any}]`` (op: ``>``, ``>=``, ``<``, ``<=``; ``combine``: the claim
holds when every comparison holds (``all``, the default) or when some comparison holds (``any``)) or
``{kind: saving, value, left: cell, right: cell, at_least: 0.945}``; a cell is ``"dim=value dim=value"`` (``{dim}`` placeholders take the ``for_each``
values). ``rule: {k: 2, min_seeds: 3}``: see :mod:`fedrun.reports.build`.

``figures``: ``[{file: x.svg|x.png, series: test_accuracy, panels: [dims], lines: [dims], color: {dim, map},
linestyle: {dim, map}, title, xlabel, ylabel, yscale: linear|log, where}]``.

YAML note: the loader reads ``on``/``off``/``yes``/``no`` as text (YAML 1.2); only ``true``/``false`` are
booleans.
"""

from __future__ import annotations

import ast
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

AGGS = ("mean_std", "mean", "median", "min", "max", "same", "n")
BESTS = ("min", "max")
COMBINES = ("all", "any")
SCALES = ("linear", "log")
OPS = (">", ">=", "<", "<=")
TYPES = ("str", "float", "int")
STATUSES = ("read", "inferred")
RECORD_PREFIXES = ("params.", "metrics.", "tags.")


class SpecError(ValueError):
    """A bad report spec: one line naming the file, the field and the value."""


# ------------------------------------------------------------------------------------------------ YAML
def yaml_load(text: str) -> Any:
    """YAML with only ``true``/``false`` as booleans (``on``, ``off``, ``yes``, ``no`` stay text)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        ch: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
        for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))
    return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass


# ------------------------------------------------------------------------------------------------ model
@dataclass(frozen=True)
class Dim:
    name: str
    sources: tuple[str, ...]
    type: str = "str"
    values: tuple[Any, ...] | None = None
    labels: Mapping[Any, str] = field(default_factory=dict)
    map: Mapping[str, Any] = field(default_factory=dict)
    missing: Any = None
    fixed: Mapping[str, Mapping[Any, Any]] = field(default_factory=dict)
    header: str = ""

    def convert(self, raw: Any) -> Any:
        """A raw record value (text) → this dim's value (mapped, typed); ValueError if it does not convert."""
        if isinstance(raw, str) and raw in self.map:
            return self.map[raw]
        if self.type == "float":
            return float(raw)
        if self.type == "int":
            return int(float(raw))
        return str(raw)

    def label(self, value: Any) -> str:
        if value in self.labels:
            return self.labels[value]
        return f"{value:g}" if isinstance(value, float) else str(value)

    def tag(self, value: Any) -> str:
        """The value with its name, for text that lists cells: the label, or ``r = 0.05``."""
        if value in self.labels:
            return self.labels[value]
        return f"{self.name} = {self.label(value)}"

    def order(self, value: Any) -> tuple:
        if self.values is not None and value in self.values:
            return (0, self.values.index(value), "")
        return (1, 0, str(value))


@dataclass(frozen=True)
class Value:
    name: str
    expr: str
    fn: Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, float]], float]
    when: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    label: str = ""


@dataclass(frozen=True)
class Cell:
    header: str
    value: str | None = None   # a measured value …
    paper: str | None = None   # … or the paper's number for this quantity
    agg: str = "mean_std"
    fmt: str = "{:.3f}"
    level: int | None = None
    best: str | None = None    # "min" / "max": the best column of this cell in a row is bold


@dataclass(frozen=True)
class Table:
    title: str
    rows: tuple[str, ...]
    columns: tuple[str, ...] = ()
    split: str | None = None
    where: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    cells: tuple[Cell, ...] = ()
    note: str = ""
    drop_empty: bool = False


@dataclass(frozen=True)
class PaperNumber:
    at: Mapping[str, Any]
    quantity: str
    number: float
    where: str
    status: str = "read"
    how: str = ""
    fmt: str | None = None   # None: the table cell's format (the list of the paper's numbers: {:g})


@dataclass(frozen=True)
class Comparison:
    left: str   # a cell pattern (may hold {dim} placeholders)
    op: str
    right: str
    tol: float = 0.0


@dataclass(frozen=True)
class Claim:
    text: str
    kind: str
    value: str
    compare: tuple[Comparison, ...] = ()
    left: str = ""
    right: str = ""
    at_least: float = math.nan
    for_each: tuple[tuple[str, tuple[Any, ...] | None], ...] = ()   # (dim, its values; None: those with runs)
    paper: str = ""
    where: str = ""
    combine: str = "all"   # "all": every comparison must hold; "any": one is enough


@dataclass(frozen=True)
class Rule:
    k: float = 2.0
    min_seeds: int = 3


@dataclass(frozen=True)
class Style:
    dim: str
    map: Mapping[Any, str]


@dataclass(frozen=True)
class Figure:
    file: str
    series: str
    panels: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    color: Style | None = None
    linestyle: Style | None = None
    title: str = ""
    xlabel: str = "round"
    ylabel: str = ""
    where: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    alt: str = ""
    yscale: str = "linear"


@dataclass(frozen=True)
class Export:
    path: str
    experiment: str = ""
    every: int | None = None
    metrics: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Spec:
    name: str
    title: str
    output: str
    exports: tuple[Export, ...]
    dims: Mapping[str, Dim]
    replicate: str | None
    values: Mapping[str, Value]
    tables: tuple[Table, ...]
    where: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    paper: tuple[PaperNumber, ...] = ()
    claims: tuple[Claim, ...] = ()
    rule: Rule = Rule()
    figures: tuple[Figure, ...] = ()
    expect: tuple[Mapping[str, tuple[Any, ...]], ...] = ()
    intro: str = ""
    commands: tuple[str, ...] = ()
    notes: str | None = None

    @property
    def cell_dims(self) -> tuple[str, ...]:
        """The dims that make a cell (all but the replicate), in spec order."""
        return tuple(d for d in self.dims if d != self.replicate)

    def parse_cell(self, text: str, where: str = "cell") -> dict[str, Any]:
        """``"scheme=fl_cs r=0.05 dp=on"`` → {dim: value} (values converted by each dim's type)."""
        return parse_cell(text, self.dims, where)


# ------------------------------------------------------------------------------------------ expressions
_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Attribute, ast.Load,
          ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.USub, ast.UAdd, ast.Call)
SERIES_PREFIX = "series."


def _reach(points: Sequence[tuple[int, float]], target: float) -> float:
    """The first step whose value is ≥ target (NaN if none, or if the target is NaN)."""
    if math.isnan(target):
        return math.nan
    for step, value in points:
        if as_float(value) >= target:
            return float(step)
    return math.nan


def _at(points: Sequence[tuple[int, float]], step: float) -> float:
    """The value recorded at exactly this step (NaN if the step was not recorded: an export thinned to every
    k-th round keeps only those steps)."""
    if math.isnan(step):
        return math.nan
    for s, value in points:
        if s == step:
            return as_float(value)
    return math.nan


# functions of a per-round series (its first argument, ``series.<metric>``) and one number
SERIES_FUNCTIONS: dict[str, Callable[[Sequence[tuple[int, float]], float], float]] = {"reach": _reach, "at": _at}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def as_float(value: Any) -> float:
    """A record value as a number (NaN when missing or not a number; the largest float, as MLflow stores
    infinity, is infinity)."""
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        x = float(value)
    except (TypeError, ValueError):
        return math.nan
    return math.copysign(math.inf, x) if abs(x) == sys.float_info.max else x  # MLflow logs ±inf as ±max float


def compile_expr(text: str, names: Sequence[str], where: str) -> Callable[..., float]:
    """An arithmetic expression over record keys (``metrics.x``, ``params.y.z``, ``tags.t``) and ``names``
    (dims and values defined before) → fn(record, dims, values) → float (NaN propagates).

    Two functions read a run's per-round history (``series``): ``reach(series.test_accuracy, 0.78)``, the first
    step at which the series is ≥ 0.78, and ``at(series.uplink_bytes_total, step)``, its value at that step;
    NaN where the series never reaches the target or the step was not recorded."""
    try:
        tree = ast.parse(str(text), mode="eval")
    except SyntaxError:
        raise SpecError(f"{where}: {text!r} is not an expression") from None
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise SpecError(f"{where}: {text!r}: {type(node).__name__} is not allowed (only + - * / **, numbers, "
                            f"record keys like metrics.best_test_accuracy, and dims/values)")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            raise SpecError(f"{where}: {text!r}: only numbers are allowed as constants, not {node.value!r}")
        if isinstance(node, ast.Attribute) and _dotted(node) is None:
            raise SpecError(f"{where}: {text!r}: a dotted name must be a record key like params.r")
    known = set(names)
    fns = ", ".join(SERIES_FUNCTIONS)

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name not in SERIES_FUNCTIONS:
                raise SpecError(f"{where}: {text!r}: {ast.unparse(node.func)!r} is not a function here; allowed: {fns}")
            if node.keywords or len(node.args) != 2:
                raise SpecError(f"{where}: {text!r}: {name}() takes two arguments: series.<metric> and a number")
            first = _dotted(node.args[0])
            if first is None or not first.startswith(SERIES_PREFIX) or first == SERIES_PREFIX:
                raise SpecError(f"{where}: {text!r}: {name}()'s first argument must be a per-round series like "
                                f"series.test_accuracy, not {ast.unparse(node.args[0])!r}")
            check(node.args[1])
            return
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = _dotted(node)
            if not (name.startswith(RECORD_PREFIXES) or name in known):
                raise SpecError(f"{where}: {text!r}: {name!r} is neither a record key (params.*, metrics.*, tags.*) "
                                f"nor a dim/value defined before ({', '.join(sorted(known)) or 'none'})")
            return
        for child in ast.iter_child_nodes(node):
            check(child)

    check(tree)

    def ev(node: ast.AST, rec, dims, vals) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body, rec, dims, vals)
        if isinstance(node, ast.Constant):
            return float(node.value)
        if isinstance(node, ast.Call):
            from fedrun.tracking import internal_name

            key = internal_name(_dotted(node.args[0])[len(SERIES_PREFIX):])
            points = (rec.get("series") or {}).get(key, [])
            return SERIES_FUNCTIONS[node.func.id](points, ev(node.args[1], rec, dims, vals))
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = _dotted(node)
            if name.startswith(RECORD_PREFIXES):
                return as_float(rec.get(name))
            if name in vals:
                return vals[name]
            return as_float(dims.get(name))
        if isinstance(node, ast.UnaryOp):
            x = ev(node.operand, rec, dims, vals)
            return -x if isinstance(node.op, ast.USub) else x
        a, b = ev(node.left, rec, dims, vals), ev(node.right, rec, dims, vals)
        try:
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, ast.Div):
                return a / b
            return a ** b
        except (ZeroDivisionError, OverflowError):
            return math.nan

    return lambda rec, dims, vals: ev(tree, rec, dims, vals)


# ------------------------------------------------------------------------------------------------ parsing
def _seq(x: Any) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _need(d: Mapping, key: str, where: str) -> Any:
    if not isinstance(d, Mapping):
        raise SpecError(f"{where}: expected a mapping, got {d!r}")
    if key not in d or d[key] is None:
        raise SpecError(f"{where}: '{key}' is missing")
    return d[key]


def _check_keys(d: Mapping, allowed: Sequence[str], where: str) -> None:
    if not isinstance(d, Mapping):
        raise SpecError(f"{where}: expected a mapping, got {d!r}")
    for k in d:
        if k not in allowed:
            raise SpecError(f"{where}: unknown key {k!r}; allowed: {', '.join(allowed)}")


def _fmt(spec: Any, where: str) -> str:
    spec = str(spec)
    try:
        spec.format(1.5)
    except (ValueError, IndexError, KeyError):
        raise SpecError(f"{where}: fmt {spec!r} is not a format for one number, like '{{:.3f}}'") from None
    return spec


def _dim_value(dim: Dim, raw: Any, where: str) -> Any:
    if isinstance(raw, bool):
        raise SpecError(f"{where}: {raw!r} for dim {dim.name!r} is a boolean; write it as text ('on', 'true')")
    try:
        return dim.convert(raw if isinstance(raw, str) else (str(raw) if dim.type == "str" else raw))
    except (TypeError, ValueError):
        raise SpecError(f"{where}: {raw!r} is not a {dim.type} value of dim {dim.name!r}") from None


def _dim_where(d: Any, dims: Mapping[str, Dim], where: str) -> dict[str, tuple[Any, ...]]:
    if d is None:
        return {}
    if not isinstance(d, Mapping):
        raise SpecError(f"{where}: expected {{dim: value or [values]}}, got {d!r}")
    out = {}
    for name, vals in d.items():
        if name not in dims:
            raise SpecError(f"{where}: {name!r} is not a dim; dims: {', '.join(dims)}")
        out[name] = tuple(_dim_value(dims[name], v, f"{where}.{name}") for v in _seq(vals))
    return out


def parse_cell(text: str, dims: Mapping[str, Dim], where: str = "cell") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in str(text).split():
        if "=" not in part:
            raise SpecError(f"{where}: {part!r} in {text!r} is not dim=value")
        name, raw = part.split("=", 1)
        if name not in dims:
            raise SpecError(f"{where}: {name!r} in {text!r} is not a dim; dims: {', '.join(dims)}")
        value = _dim_value(dims[name], raw, where)
        if dims[name].values is not None and value not in dims[name].values:
            raise SpecError(f"{where}: {name}={raw} in {text!r} is not among the values of dim {name!r}: "
                            f"{', '.join(map(str, dims[name].values))}")
        out[name] = value
    return out


def _parse_dim(name: str, d: Any, where: str) -> Dim:
    if isinstance(d, str):
        d = {"from": d}
    _check_keys(d, ("from", "type", "values", "labels", "map", "missing", "fixed", "header"), where)
    typ = d.get("type", "str")
    if typ not in TYPES:
        raise SpecError(f"{where}.type: {typ!r}; allowed: {', '.join(TYPES)}")
    sources = tuple(str(s) for s in _seq(_need(d, "from", where)))
    for s in sources:
        if not s.startswith(RECORD_PREFIXES + ("status", "run_name", "experiment")):
            raise SpecError(f"{where}.from: {s!r} is not a record key (params.*, metrics.*, tags.*, status, run_name)")
    base = Dim(name, sources, typ)
    mapping = {}
    for raw, v in (d.get("map") or {}).items():
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        mapping[str(raw)] = v if number else _dim_value(base, v, f"{where}.map")
    base = Dim(name, sources, typ, map=mapping)
    values = None
    if d.get("values") is not None:
        values = tuple(_dim_value(base, v, f"{where}.values") for v in _seq(d["values"]))
    labels = {_dim_value(base, k, f"{where}.labels"): str(v) for k, v in (d.get("labels") or {}).items()}
    missing = d.get("missing")
    if missing is not None:
        missing = _dim_value(base, missing, f"{where}.missing")
    return Dim(name, sources, typ, values, labels, mapping, missing, d.get("fixed") or {}, str(d.get("header", name)))


def _parse_cell_spec(c: Any, columns: Sequence[str], where: str) -> Cell:
    _check_keys(c, ("header", "value", "paper", "agg", "fmt", "level", "best"), where)
    if ("value" in c) == ("paper" in c):
        raise SpecError(f"{where}: give either 'value' (a measured value) or 'paper' (the paper's number)")
    agg = c.get("agg", "mean_std")
    if agg not in AGGS:
        raise SpecError(f"{where}.agg: {agg!r}; allowed: {', '.join(AGGS)}")
    level = c.get("level")
    if level is not None and (not isinstance(level, int) or not 0 <= level <= len(columns)):
        raise SpecError(f"{where}.level: {level!r}; allowed: 0..{len(columns)} (the number of column dims)")
    best = c.get("best")
    if best is not None and best not in BESTS:
        raise SpecError(f"{where}.best: {best!r}; allowed: {', '.join(BESTS)}")
    if best is not None and "value" not in c:
        raise SpecError(f"{where}.best: only a measured cell ('value') can mark its best column")
    return Cell(str(c.get("header", "")), c.get("value"), c.get("paper"), agg,
                _fmt(c.get("fmt", "{:.3f}"), f"{where}.fmt"), level, best)


def parse(raw: Any, name: str = "report", where: str | None = None) -> Spec:
    """A spec's parsed YAML → :class:`Spec`; ``where`` names the file in errors."""
    w = where or name
    _check_keys(raw, ("title", "output", "exports", "where", "dims", "replicate", "values", "tables", "paper",
                      "claims", "rule", "figures", "expect", "intro", "commands", "notes"), w)
    exports = []
    for i, e in enumerate(_seq(_need(raw, "exports", w))):
        if isinstance(e, str):
            e = {"path": e}
        _check_keys(e, ("path", "experiment", "every", "metrics"), f"{w}: exports[{i}]")
        every = e.get("every")
        if every is not None and (not isinstance(every, int) or every < 1):
            raise SpecError(f"{w}: exports[{i}].every: {every!r}; allowed: an integer >= 1")
        metrics = e.get("metrics")
        exports.append(Export(str(_need(e, "path", f"{w}: exports[{i}]")), str(e.get("experiment", "")), every,
                              None if metrics is None else tuple(str(m) for m in _seq(metrics))))
    dims_raw = _need(raw, "dims", w)
    if not isinstance(dims_raw, Mapping) or not dims_raw:
        raise SpecError(f"{w}: dims: expected {{name: {{from: record key, …}}}}")
    dims = {str(k): _parse_dim(str(k), v, f"{w}: dims.{k}") for k, v in dims_raw.items()}
    for dname, dim in dims.items():
        fixed = {}
        for other, table in dim.fixed.items():
            if other not in dims or other == dname:
                raise SpecError(f"{w}: dims.{dname}.fixed: {other!r} is not another dim; dims: {', '.join(dims)}")
            if not isinstance(table, Mapping):
                raise SpecError(f"{w}: dims.{dname}.fixed.{other}: expected {{{other} value: {dname} value}}")
            fixed[other] = {_dim_value(dims[other], k, f"{w}: dims.{dname}.fixed.{other}"):
                            _dim_value(dim, v, f"{w}: dims.{dname}.fixed.{other}") for k, v in table.items()}
        dims[dname] = Dim(dim.name, dim.sources, dim.type, dim.values, dim.labels, dim.map, dim.missing, fixed,
                          dim.header)
    replicate = raw.get("replicate")
    if replicate is not None and replicate not in dims:
        raise SpecError(f"{w}: replicate: {replicate!r} is not a dim; dims: {', '.join(dims)}")
    where_rec = {}
    for k, v in (raw.get("where") or {}).items():
        where_rec[str(k)] = tuple(str(x) for x in _seq(v))
    values: dict[str, Value] = {}
    for vname, v in (raw.get("values") or {}).items():
        vw = f"{w}: values.{vname}"
        if vname in dims:
            raise SpecError(f"{vw}: {vname!r} is already a dim")
        if isinstance(v, Mapping):
            _check_keys(v, ("expr", "when", "label"), vw)
            expr, when = str(_need(v, "expr", vw)), _dim_where(v.get("when"), dims, f"{vw}.when")
            label = str(v.get("label") or vname)
        else:
            expr, when, label = str(v), {}, str(vname)
        fn = compile_expr(expr, [*dims, *values], vw)
        values[str(vname)] = Value(str(vname), expr, fn, when, label)
    tables = []
    for i, t in enumerate(_seq(_need(raw, "tables", w))):
        tw = f"{w}: tables[{i}]"
        _check_keys(t, ("title", "rows", "columns", "split", "where", "cells", "note", "drop_empty"), tw)
        if not isinstance(t.get("drop_empty", False), bool):
            raise SpecError(f"{tw}.drop_empty: {t['drop_empty']!r}; allowed: true, false")
        rows = tuple(str(x) for x in _seq(_need(t, "rows", tw)))
        columns = tuple(str(x) for x in _seq(t.get("columns")))
        split = t.get("split")
        for role, names in (("rows", rows), ("columns", columns), ("split", _seq(split))):
            for d in names:
                if d not in dims:
                    raise SpecError(f"{tw}.{role}: {d!r} is not a dim; dims: {', '.join(dims)}")
                if d == replicate:
                    raise SpecError(f"{tw}.{role}: {d!r} is the replicate dim (runs of a cell are aggregated over it)")
        used = [*rows, *columns, *_seq(split)]
        if len(set(used)) != len(used):
            raise SpecError(f"{tw}: a dim is used twice in rows/columns/split: {used}")
        cells = tuple(_parse_cell_spec(c, columns, f"{tw}.cells[{j}]")
                      for j, c in enumerate(_seq(_need(t, "cells", tw))))
        for j, c in enumerate(cells):
            q = c.value or c.paper
            if q not in values:
                raise SpecError(f"{tw}.cells[{j}]: {q!r} is not a value; values: {', '.join(values)}")
        tables.append(Table(str(t.get("title", "")), rows, columns, split,
                            _dim_where(t.get("where"), dims, f"{tw}.where"), cells, str(t.get("note", "")),
                            bool(t.get("drop_empty", False))))
    paper = []
    for i, p in enumerate(_seq(raw.get("paper"))):
        pw = f"{w}: paper[{i}]"
        _check_keys(p, ("at", "quantity", "number", "where", "status", "how", "fmt"), pw)
        status = p.get("status", "read")
        if status not in STATUSES:
            raise SpecError(f"{pw}.status: {status!r}; allowed: {', '.join(STATUSES)}")
        if status == "inferred" and not p.get("how"):
            raise SpecError(f"{pw}: an inferred number needs 'how' (how it was inferred from what the paper states)")
        q = _need(p, "quantity", pw)
        if q not in values:
            raise SpecError(f"{pw}.quantity: {q!r} is not a value; values: {', '.join(values)}")
        number = _need(p, "number", pw)
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise SpecError(f"{pw}.number: {number!r} is not a number")
        paper.append(PaperNumber(parse_cell(_need(p, "at", pw), dims, f"{pw}.at"), str(q), float(number),
                                 str(_need(p, "where", pw)), status, str(p.get("how", "")),
                                 None if p.get("fmt") is None else _fmt(p["fmt"], f"{pw}.fmt")))
    claims = [_parse_claim(c, dims, values, f"{w}: claims[{i}]") for i, c in enumerate(_seq(raw.get("claims")))]
    rule_raw = raw.get("rule") or {}
    _check_keys(rule_raw, ("k", "min_seeds"), f"{w}: rule")
    rule = Rule(float(rule_raw.get("k", 2.0)), int(rule_raw.get("min_seeds", 3)))
    figures = [_parse_figure(f, dims, f"{w}: figures[{i}]") for i, f in enumerate(_seq(raw.get("figures")))]
    expect = tuple(_dim_where(e, dims, f"{w}: expect[{i}]") for i, e in enumerate(_seq(raw.get("expect"))))
    cell_dims = [d for d in dims if d != replicate]
    for i, e in enumerate(expect):
        lacking = [d for d in cell_dims if d not in e]
        if lacking:
            raise SpecError(f"{w}: expect[{i}] does not name {', '.join(lacking)} (an expected cell names every dim "
                            f"but the replicate)")
    commands = raw.get("commands")
    if isinstance(commands, str):
        commands = tuple(commands.strip().splitlines())
    else:
        commands = tuple(str(c) for c in _seq(commands))
    return Spec(name, str(_need(raw, "title", w)), str(_need(raw, "output", w)), tuple(exports), dims, replicate,
                values, tuple(tables), where_rec, tuple(paper), tuple(claims), rule, tuple(figures), expect,
                str(raw.get("intro") or "").strip(), commands, raw.get("notes"))


def _parse_claim(c: Any, dims: Mapping[str, Dim], values: Mapping[str, Value], cw: str) -> Claim:
    _check_keys(c, ("text", "kind", "value", "compare", "left", "right", "at_least", "for_each", "paper", "where",
                    "combine"), cw)
    kind = c.get("kind", "compare")
    value = str(_need(c, "value", cw))
    if value not in values:
        raise SpecError(f"{cw}.value: {value!r} is not a value; values: {', '.join(values)}")
    fe = c.get("for_each")
    fe_items = list(fe.items()) if isinstance(fe, Mapping) else [(x, "present") for x in _seq(fe)]
    for_each = []
    for d, vals in fe_items:
        if d not in dims:
            raise SpecError(f"{cw}.for_each: {d!r} is not a dim; dims: {', '.join(dims)}")
        if vals == "present":
            for_each.append((str(d), None))
        else:
            for_each.append((str(d), tuple(_dim_value(dims[d], v, f"{cw}.for_each.{d}") for v in _seq(vals))))
    for_each = tuple(for_each)
    placeholder_values = {d: (vals or dims[d].values or ("x",))[0] for d, vals in for_each}

    def check_cell(text: str, where: str) -> str:
        text = str(text)
        try:
            filled = text.format(**{d: _raw_text(v) for d, v in placeholder_values.items()})
        except (KeyError, IndexError, ValueError):
            raise SpecError(f"{where}: {text!r} uses a placeholder that is not in for_each "
                            f"({', '.join(d for d, _ in for_each) or 'none'})") from None
        parse_cell(filled, dims, where)
        return text

    try:
        str(_need(c, "text", cw)).format(**{d: "x" for d, _ in for_each})
    except (KeyError, IndexError, ValueError):
        raise SpecError(f"{cw}.text: {c['text']!r} has a {{placeholder}} that is not in for_each "
                        f"({', '.join(d for d, _ in for_each) or 'none'})") from None
    common = dict(text=str(_need(c, "text", cw)), kind=kind, value=value, for_each=for_each,
                  paper=str(c.get("paper", "")), where=str(c.get("where", "")))
    combine = c.get("combine", "all")
    if combine not in COMBINES:
        raise SpecError(f"{cw}.combine: {combine!r}; allowed: {', '.join(COMBINES)}")
    if "combine" in c and kind != "compare":
        raise SpecError(f"{cw}.combine: only a compare claim combines comparisons")
    if kind == "compare":
        comps = []
        for j, item in enumerate(_seq(_need(c, "compare", cw))):
            iw = f"{cw}.compare[{j}]"
            if not isinstance(item, (list, tuple)) or len(item) not in (3, 4):
                raise SpecError(f"{iw}: expected [cell, op, cell] or [cell, op, cell, tol], got {item!r}")
            op = str(item[1])
            if op not in OPS:
                raise SpecError(f"{iw}: op {op!r}; allowed: {', '.join(OPS)}")
            tol = item[3] if len(item) == 4 else 0.0
            if isinstance(tol, bool) or not isinstance(tol, (int, float)):
                raise SpecError(f"{iw}: tol {tol!r} is not a number")
            comps.append(Comparison(check_cell(item[0], iw), op, check_cell(item[2], iw), float(tol)))
        return Claim(compare=tuple(comps), combine=combine, **common)
    if kind == "saving":
        at_least = _need(c, "at_least", cw)
        if isinstance(at_least, bool) or not isinstance(at_least, (int, float)):
            raise SpecError(f"{cw}.at_least: {at_least!r} is not a number")
        return Claim(left=check_cell(_need(c, "left", cw), f"{cw}.left"),
                     right=check_cell(_need(c, "right", cw), f"{cw}.right"), at_least=float(at_least), **common)
    raise SpecError(f"{cw}.kind: {kind!r}; allowed: compare, saving")


def _raw_text(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _parse_figure(f: Any, dims: Mapping[str, Dim], fw: str) -> Figure:
    _check_keys(f, ("file", "series", "panels", "lines", "color", "linestyle", "title", "xlabel", "ylabel",
                    "where", "alt", "yscale"), fw)
    yscale = f.get("yscale", "linear")
    if yscale not in SCALES:
        raise SpecError(f"{fw}.yscale: {yscale!r}; allowed: {', '.join(SCALES)}")
    file = str(_need(f, "file", fw))
    if not file.endswith((".svg", ".png")):
        raise SpecError(f"{fw}.file: {file!r}; allowed: a .svg or .png file name")
    panels = tuple(str(x) for x in _seq(f.get("panels")))
    lines = tuple(str(x) for x in _seq(f.get("lines")))
    for role, names in (("panels", panels), ("lines", lines)):
        for d in names:
            if d not in dims:
                raise SpecError(f"{fw}.{role}: {d!r} is not a dim; dims: {', '.join(dims)}")
    styles = []
    for key in ("color", "linestyle"):
        s = f.get(key)
        if s is None:
            styles.append(None)
            continue
        _check_keys(s, ("dim", "map"), f"{fw}.{key}")
        d = str(_need(s, "dim", f"{fw}.{key}"))
        if d not in dims:
            raise SpecError(f"{fw}.{key}.dim: {d!r} is not a dim; dims: {', '.join(dims)}")
        styles.append(Style(d, {_dim_value(dims[d], k, f"{fw}.{key}.map"): str(v)
                                for k, v in (s.get("map") or {}).items()}))
    return Figure(file, str(_need(f, "series", fw)), panels, lines, styles[0], styles[1], str(f.get("title", "")),
                  str(f.get("xlabel", "round")), str(f.get("ylabel", f.get("series"))),
                  _dim_where(f.get("where"), dims, f"{fw}.where"),
                  str(f.get("alt", "")), yscale)


def load_spec(path: str | Path) -> Spec:
    """``conf/report/<name>.yaml`` → :class:`Spec` (SpecError naming the file on any bad value)."""
    path = Path(path)
    if not path.exists():
        raise SpecError(f"{path}: no such report spec")
    try:
        raw = yaml_load(path.read_text())
    except Exception as exc:  # noqa: BLE001 - any YAML error is one line
        raise SpecError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    return parse(raw, path.stem, str(path))
