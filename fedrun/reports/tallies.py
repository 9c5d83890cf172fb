"""results/README.md's tallies: the verdicts of every report's registered claims (the ``*.verdicts.csv`` the reports
write beside their tables), summed per paper and family; a "by construction" line is counted apart, never as met."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

from fedrun.reports.common import MET, NOT_MET, OPEN, md, splice

PAPERS = {"kerkouche21": "000 compressive sensing + DP (Kerkouche et al.)", "fu21": "001 local DP, tuned E (Fu et al.)",
          "fedsketch": "002 FedSKETCH (Haddadpour et al.)", "fbftl": "003 FbFTL (Wang et al.)",
          "deploy": "fedrun: time to accuracy under deployment", "correlated": "fedrun: correlated noise"}
FILE = "results/README.md"


def tallies(root: Path) -> dict[Path, bytes]:
    counts: dict[str, Counter] = {p: Counter() for p in PAPERS}
    for path in sorted(Path(root).glob("results/*/*.verdicts.csv")):
        with open(path, newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                counts[path.parent.name][(r["family"], r["verdict"])] += 1
    rows = []
    for paper, c in counts.items():
        def fam(f: str) -> str:
            n = sum(v for (g, _), v in c.items() if g == f)
            return (f"{n}: {c[f, MET]} met, {c[f, NOT_MET]} not met, {c[f, OPEN]} inconclusive"
                    + "".join(f", {v} {verdict}" for (g, verdict), v in sorted(c.items())
                              if g == f and verdict not in (MET, NOT_MET, OPEN))) if n else "–"
        bc = sum(v for (g, _), v in c.items() if g == "by construction")
        rows.append((PAPERS[paper], fam("primary"), fam("secondary"), str(bc) if bc else "–",
                     str(sum(v for (g, _), v in c.items() if g == "not attempted")) or "–"))
    body = ("Verdicts per paper and family, summed from the reports (`python -m fedrun.report tallies`, from the "
            "`*.verdicts.csv` each report writes):\n\n"
            + md(["paper", "primary (the paper's headline claims, confirmatory seeds)", "secondary",
                  "by construction (never counted as met)", "not attempted"], rows))
    return {Path(FILE): splice((Path(root) / FILE).read_text(), "tallies", body).encode("utf-8")}
