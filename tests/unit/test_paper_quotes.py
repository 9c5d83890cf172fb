"""The paper's words that the claims cite (the ``source`` of results/<paper>/claims.csv, and the quoted passages in
paper_numbers.csv's "where"): each passage in double quotes stands, word for word, on the lines of the stored paper
text that its "where" names (../shared/papers/, found through $FEDRUN_PAPERS or beside $FEDRUN_DATA; skipped where
the papers are not on the machine). Compared on letters and digits only: the stored text writes math as LaTeX
($r$, \\times), the quotes as it reads (r, ×); "..." and "[...]" mark words left out."""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAPERS = {"kerkouche21": "000_", "fu21": "001_", "fedsketch": "002_", "fbftl": "003_"}


def _papers() -> Path | None:
    for p in (os.environ.get("FEDRUN_PAPERS"), os.environ.get("FEDRUN_DATA") and Path(os.environ["FEDRUN_DATA"]).parent
              / "papers", REPO.parent / "shared" / "papers"):
        if p and Path(p).is_dir():
            return Path(p)
    return None


def _key(text: str) -> str:
    text = re.sub(r"\\(?!ln\b)[a-zA-Z]+|\$", "", text.replace("²", "2"))   # LaTeX commands but \ln, math delimiters
    return re.sub(r"[^0-9a-z]", "", text.lower())


def _lines(where: str) -> list[int]:
    """The paper's lines a "where" names ("line 79", "lines 193, 195, 201", "line 43; notes line 61", "title")."""
    paper_part = re.split(r"notes|table in the notes", where)[0]
    return [int(n) for part in re.findall(r"lines? ([\d, –-]+)", paper_part) for n in re.findall(r"\d+", part)]


def _passages():
    for folder, prefix in PAPERS.items():
        for name, field in (("claims.csv", "source"), ("paper_numbers.csv", "where")):
            path = REPO / "results" / folder / name
            if path.exists():
                with open(path, newline="", encoding="utf-8") as f:
                    for row in csv.DictReader(f):
                        for q in re.findall(r'"([^"]{12,})"', row[field]):
                            key = row.get("id") or row["quantity"]
                            yield pytest.param(folder, prefix, row["where"], q, id=f"{folder}:{key}")


@pytest.mark.parametrize("folder,prefix,where,quote", list(_passages()))
def test_a_quoted_passage_stands_on_the_lines_it_names(folder, prefix, where, quote):
    papers = _papers()
    if papers is None:
        pytest.skip("the stored paper texts are not on this machine")
    text = next(papers.glob(f"{prefix}*.txt")).read_text().split("\n")
    lines = _lines(where) or range(1, len(text) + 1)
    named = _key(" ".join(text[n - 1] for n in lines if 0 < n <= len(text)))
    notes = _key((papers / "README.md").read_text()) if "notes" in where else ""
    for piece in re.split(r"\.\.\.|\[\.\.\.\]|…", quote):
        if _key(piece):
            assert _key(piece) in named or _key(piece) in notes, f"{piece!r} not on {where} of {prefix}*.txt"
