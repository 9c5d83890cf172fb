"""Markdown table of FbFTL's expected label leakage vs the number of clients U (paper 003, eq. (19)).

Each cell is E_s[H^a(B | Y = y) - H^a(B | S = s)] in bits, s ~ Multinomial(U, P^a_{B|y}), computed by
``fedrun.transfer.leakage.expected_leakage``: "exact" (binomial-marginal sum) or "MC" (Monte Carlo mean ± s.e.).

    python scripts/leakage_table.py                          # N in {2, 10}, K in {1, 2, 8}, uniform labels
    python scripts/leakage_table.py --zipf 1 --out results/003/leakage_zipf1.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedrun.reports import save
from fedrun.transfer import leakage as lk


@dataclass(frozen=True)
class Row:
    num_classes: int
    batch_size: int
    num_types: int
    prior_bits: float
    cells: tuple[lk.LeakageEstimate, ...]


def zipf_labels(num_classes: int, exponent: float) -> np.ndarray | None:
    """y_a ∝ a^(-exponent), a = 1..N; None (the uniform y0) for exponent 0."""
    if exponent == 0:
        return None
    y = np.arange(1, num_classes + 1, dtype=float) ** -exponent
    return y / y.sum()


def compute_rows(
    num_classes: list[int],
    batch_sizes: list[int],
    num_clients: list[int],
    *,
    zipf: float = 0.0,
    method: str = "auto",
    num_samples: int = 2000,
    max_exact_terms: int = 20_000_000,
    seed: int = 0,
) -> list[Row]:
    rows = []
    for n in num_classes:
        y = zipf_labels(n, zipf)
        for k in batch_sizes:
            cells = tuple(
                lk.expected_leakage(
                    n, k, u, y,
                    method=method,
                    rng=np.random.default_rng([seed, n, k, u]),  # one stream per cell, order-independent
                    num_samples=num_samples,
                    max_exact_terms=max_exact_terms,
                )
                for u in num_clients
            )
            rows.append(Row(n, k, lk.num_batch_types(n, k), lk.prior_entropy(n, k, y), cells))
    return rows


def format_cell(est: lk.LeakageEstimate) -> str:
    if est.exact:
        return f"{est.mean:.4g} (exact)"
    return f"{est.mean:.4g} ± {est.stderr:.2g} (MC)"


def to_markdown(rows: list[Row], num_clients: list[int], *, zipf: float, command: str, num_samples: int,
                seed: int) -> str:
    labels = "uniform y0" if zipf == 0 else f"Zipf, y_a ∝ a^-{zipf:g}"
    lines = [
        "# FbFTL label leakage of the shuffled upload vs number of clients U (paper 003, eq. (19))",
        "",
        f"Command: `{command}`",
        "",
        f"Expected leakage E_s[H^a(B|Y=y) − H^a(B|S=s)] in bits, s ~ Multinomial(U, P^a_{{B|y}}); labels: {labels}. "
        "N classes, K labels per client batch, |B| = C(N+K−1, K) batch types, H^a(B|Y=y) = prior uncertainty. "
        f"exact: binomial-marginal sum; MC: Monte Carlo mean ± standard error over {num_samples} draws "
        f"(seed {seed}).",
        "",
        "| N | K | \\|B\\| | H^a(B\\|Y=y) | " + " | ".join(f"U = {u}" for u in num_clients) + " |",
        "|---:|---:|---:|---:|" + "---:|" * len(num_clients),
    ]
    for r in rows:
        cells = " | ".join(format_cell(c) for c in r.cells)
        lines.append(f"| {r.num_classes} | {r.batch_size} | {r.num_types} | {r.prior_bits:.4g} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-classes", type=int, nargs="+", default=[2, 10], help="N values")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 8], help="K values")
    parser.add_argument("--num-clients", type=int, nargs="+", default=[1, 2, 5, 10, 100, 1000, 6250],
                        help="U values")
    parser.add_argument("--zipf", type=float, default=0.0,
                        help="label distribution y_a ∝ a^-ZIPF (default 0: uniform y0)")
    parser.add_argument("--method", choices=lk.METHODS, default="auto")
    parser.add_argument("--num-samples", type=int, default=2000, help="Monte Carlo draws per cell")
    parser.add_argument("--max-exact-terms", type=int, default=20_000_000,
                        help="auto: exact when (#distinct batch probabilities) × (U+1) is at most this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    if args.zipf < 0:
        parser.error(f"--zipf must be >= 0, got {args.zipf}")

    rows = compute_rows(
        args.num_classes, args.batch_sizes, args.num_clients,
        zipf=args.zipf, method=args.method, num_samples=args.num_samples,
        max_exact_terms=args.max_exact_terms, seed=args.seed,
    )
    argv_used = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "scripts/leakage_table.py", *argv_used])
    text = to_markdown(rows, args.num_clients, zipf=args.zipf, command=command,
                       num_samples=args.num_samples, seed=args.seed)
    print(text, end="")
    if args.out is not None:
        save(text, args.out)


if __name__ == "__main__":
    main()
