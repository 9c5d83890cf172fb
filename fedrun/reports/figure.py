"""Per-round curves → an SVG or PNG whose bytes depend on the data only (same matplotlib, same bytes).

SVG: ``svg.hashsalt`` fixed (the ids of clip paths and glyphs are hashes), no date in the metadata, glyphs as
paths (no dependence on the reader's fonts). PNG: no ``Software`` metadata. Both render with matplotlib's
bundled DejaVu Sans.
"""

from __future__ import annotations

import io
import math
from typing import NamedTuple, Sequence


class Curve(NamedTuple):
    """One line of a panel: the mean and std over runs per step, the most runs at a step, its colour and style."""
    label: str
    steps: tuple[int, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    n: int
    color: str | None
    linestyle: str | None

RC = {"svg.hashsalt": "fedrun-report", "svg.fonttype": "path", "font.family": "DejaVu Sans",
      "path.simplify": False, "figure.dpi": 100}


def draw(panels: Sequence[tuple[str, Sequence[Curve]]], file: str, title: str = "", xlabel: str = "round",
         ylabel: str = "", ncols: int = 2, yscale: str = "linear") -> bytes:
    """The figure's bytes (format from ``file``'s extension): one panel per (title, curves), ``ncols`` a row,
    y shared (``yscale``: linear or log; on a log scale a line whose mean − std reaches 0 has no band); a panel
    without curves says so."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fmt = "svg" if file.endswith(".svg") else "png"
    with matplotlib.rc_context(RC):
        n = max(1, len(panels))
        cols = max(1, min(n, ncols))
        rows = math.ceil(n / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows + 0.9), sharey=True, squeeze=False)
        handles: dict[str, object] = {}  # one legend for the figure: a line's label → its first handle
        for ax, (ptitle, lines) in zip(axes.flat, panels):
            for c in lines:
                (h,) = ax.plot(c.steps, c.mean, color=c.color, linestyle=c.linestyle or "-", marker=".",
                               markersize=3, linewidth=1.2, label=c.label)
                handles.setdefault(c.label, h)
                lo = [m - s for m, s in zip(c.mean, c.std) if not math.isnan(s)]
                if len(lo) == len(c.mean) and (yscale == "linear" or min(lo, default=1) > 0):  # log: no band to ≤ 0
                    hi = [m + s for m, s in zip(c.mean, c.std)]
                    ax.fill_between(c.steps, lo, hi, color=c.color, alpha=0.12, linewidth=0)
            seeds = sorted({c.n for c in lines})
            n_text = "" if not seeds else f" (n = {seeds[0]}" + (f"–{seeds[-1]})" if len(seeds) > 1 else ")")
            ax.set_title(ptitle + n_text, fontsize=9)
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
        height = 3.4 * rows + 0.9
        if handles:
            fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(5, len(handles)),
                       fontsize=7, frameon=False)
        if title:
            fig.suptitle(title, fontsize=10)
        # fixed margins (no tight_layout: seconds per figure, and the same bytes either way)
        fig.subplots_adjust(left=0.6 / (4.6 * cols), right=1 - 0.15 / (4.6 * cols), top=1 - 0.55 / height,
                            bottom=(0.5 + 0.18 * math.ceil(len(handles) / 5)) / height, wspace=0.08, hspace=0.35)
        buf = io.BytesIO()
        meta = {"Date": None} if fmt == "svg" else {"Software": None}
        fig.savefig(buf, format=fmt, metadata=meta, dpi=100)
        plt.close(fig)
    return buf.getvalue()
