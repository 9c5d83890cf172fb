"""Lines of DP logic outside fedrun/privacy/: code lines (no blank, comment or docstring line) of fedrun/ that name a
DP concept (the privatizer, client-level or local DP, ε/δ/σ, clipping, noise, accountants, canaries, cohorts' laws).

    python scripts/dp_lines.py            # per module, then the total
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

DP = re.compile(r"\b(dp|\w*privat\w*|\w*epsilon\w*|sigma|\w*noise\w*|\w*clip\w*|\w*accountant\w*|\w*canar\w*|"
                r"delta|ldp_\w*|\w*_dp|dp_\w*|laplace|gaussian|participation|cohort\w*|law)\b", re.I)


def code_lines(path: Path) -> dict[int, str]:
    text = path.read_text()
    lines = text.splitlines()
    skip = set()
    for node in ast.walk(ast.parse(text)):  # docstrings
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            skip.update(range(body[0].lineno, body[0].end_lineno + 1))
    code: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):  # code tokens only: no comments
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER) and tok.start[0] not in skip:
            for n in range(tok.start[0], tok.end[0] + 1):
                code.setdefault(n, lines[n - 1])
    return code


def main(root: Path = Path(__file__).resolve().parent.parent / "fedrun") -> int:
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "privacy" in path.relative_to(root).parts:
            continue
        hits = sum(1 for line in code_lines(path).values() if DP.search(line))
        if hits:
            print(f"{hits:5d}  {path.relative_to(root.parent)}")
        total += hits
    print(f"{total:5d}  DP lines outside fedrun/privacy/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
