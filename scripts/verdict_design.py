"""The decisive rate of the verdict design actually used, with no true effect: every registered claim that is
tested (results/*/claims.csv) simulated with its cells' seeds (n per cell at its registered seeds, from the
committed exports), spreads (each cell's observed sd), test shape, looks (a first look at 3 seeds, then the seeds
it has; p × looks), and Holm over its family, every comparison's true difference at its claim's boundary (where a
verdict either way is an error). Time-to-target claims: exponential times, equal rates, no censoring, log-rank.

    python scripts/verdict_design.py --out results/verdict_design.md [--reps 2000]

Prints, per paper and family, m (claims tested), the family-wise decisive rate (any verdict in the family: an
error here) with its Monte Carlo standard error, and the largest single-claim rate."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedrun.reports import FAMILIES, REPORTS, common, stats  # noqa: E402
from fedrun.reports import report_files  # noqa: E402


def designs(names: list[str]) -> list[dict]:
    """Every tested claim of these reports: its family and, per comparison, the cells' (n, sd, coef) and the test."""
    out = []
    for name in names:
        common.BUILT.clear()
        report_files(name, ROOT)
        rep = next((r for r in common.BUILT if r.name == name and hasattr(r, "claimed")), None)
        for c in rep.claimed if rep else []:
            if c.fixed or c.family not in common.FAMILY_ORDER:
                continue
            pin = {} if c.seeds is None else {rep.seed: tuple(c.seeds)}
            comps = []
            for terms, kind, bound, center in c.comps:
                cells = []
                for cell, k in terms:
                    v = rep.values({**rep.typed(cell), **pin}, c.value)
                    cells.append((len(v), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, k))
                comps.append((cells, kind, bound, center))
            if all(n >= 2 for cs, *_ in comps for n, _, _ in cs):
                out.append(dict(report=name, id=c.id, family=c.family, any=c.any, looks=c.looks, comps=comps))
    return out


def one(rng: np.random.Generator, claim: dict, n_look: int | None) -> float:
    """The claim's p (before × looks) on one draw at its boundary, ``n_look`` seeds per cell (None: all)."""
    ps = []
    for cells, kind, bound, center in claim["comps"]:
        target = center + bound if kind == "≈" else bound   # the boundary: a verdict either way is an error
        if kind == "sooner":
            got = []
            for n, _, _ in cells:
                m = min(n, n_look or n)
                got.append((rng.exponential(1.0, m), np.ones(m, dtype=bool)))
            ps.append(stats.logrank_p(*got))
            continue
        samples = []
        for i, (n, sd, k) in enumerate(cells):
            m = min(n, n_look or n)
            shift = target / k if i == 0 else 0.0
            samples.append(rng.normal(shift, sd if sd > 0 else 1e-12, m))
        w = stats.welch(samples, [k for _, _, k in cells])
        ps.append(stats.p_values(w, "<" if kind == "<" else (">" if kind != "≈" else "≈"), bound, center))
    return stats.decide(*stats.combine(ps, claim["any"]))[0]


def family_rate(claims: list[dict], reps: int, seed: int = 0) -> tuple[float, float]:
    """(family-wise decisive rate, the largest single-claim rate) over ``reps`` draws."""
    rng = np.random.default_rng(seed)
    any_, per = 0, np.zeros(len(claims))
    for _ in range(reps):
        decided = np.zeros(len(claims), dtype=bool)
        looks = [[3, None] if c["looks"] == 2 else [3, 6, None] if c["looks"] >= 3 else [None] for c in claims]
        for step in range(max(len(x) for x in looks)):   # a claim decided at a look stays decided
            ps = [min(1.0, one(rng, c, lk[step] if step < len(lk) else None) * c["looks"])
                  if step < len(lk) else 1.0 for c, lk in zip(claims, looks)]
            decided |= np.array(stats.holm(ps)) <= stats.ALPHA
        any_ += decided.any()
        per += decided
    return any_ / reps, float(per.max() / reps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the table here (markdown)")
    ap.add_argument("--reps", type=int, default=2000)
    args = ap.parse_args(argv)
    names = [n for n in REPORTS if n != "tallies"]
    groups = [list(f) for f in FAMILIES] + [[n] for n in names if not any(n in f for f in FAMILIES)]
    rows, t0 = [], time.time()
    for group in groups:
        claims = designs(group)
        for fam in common.FAMILY_ORDER:
            cs = [c for c in claims if c["family"] == fam]
            if not cs:
                continue
            rate, worst = family_rate(cs, args.reps)
            se = math.sqrt(max(rate * (1 - rate), 1e-12) / args.reps)
            line = (f"| {', '.join(group)} | {fam} | {len(cs)} | {', '.join(sorted({str(c['looks']) for c in cs}))} | "
                    f"{rate * 100:.2f} % ± {se * 100:.2f} | {worst * 100:.2f} % |")
            rows.append(line)
            print(line, f"({time.time() - t0:.0f} s)", flush=True)
    text = ("# The verdict design with no true effect\n\nCommand: `python scripts/verdict_design.py --out "
            f"results/verdict_design.md --reps {args.reps}` ({__doc__.split(chr(10) * 2)[0].split(': ', 1)[1]})\n\n"
            "| reports (one family per paper) | family | claims tested | looks | family-wise decisive rate (± MC s.e.) "
            "| largest single-claim rate |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
