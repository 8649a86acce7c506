"""The bench report as a PNG: median speedup by category, one bar per mode, with whiskers
from the slowest to the fastest prompt. Rendered from a `Report` alone."""

from __future__ import annotations

import io

import numpy as np

from localspec.bench.results import Report


def chart_png(report: Report) -> bytes:
    """Grouped bars: median speedup by category (and over all prompts), one bar per mode."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    summary = report.summary()
    groups = [*report.categories, "all"]
    width = 0.8 / max(1, len(summary))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) + 2), 4.5), dpi=120)
    for j, s in enumerate(summary):
        values = [v for _, v in s.by_category] + [s.median]
        xs = np.arange(len(groups)) + (j - (len(summary) - 1) / 2) * width
        bars = ax.bar(xs, values, width, label=s.mode)
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=7, padding=2)
        # whiskers from the slowest to the fastest prompt: a median can hide a slow one
        lo, hi = speedup_spread(report, s.mode)
        ax.vlines(xs, lo, hi, color="0.15", linewidth=0.8)
    ax.axhline(1.0, color="0.3", linewidth=0.8, linestyle="--")
    ax.set_xticks(np.arange(len(groups)), groups)
    ax.set_ylabel("speedup over plain decoding\n(median; whiskers: slowest to fastest prompt)")
    title = report.info.target + (f" + {report.info.draft}" if report.info.draft else "")
    ax.set_title(f"{title}\n{report.info.max_tokens} tokens, greedy", fontsize=9)
    if summary:
        ax.legend(fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    return png.getvalue()


def speedup_spread(report: Report, mode: str) -> tuple[list[float], list[float]]:
    """Per category, then over all: the lowest and highest per-prompt speedup."""
    rows = [r for r in report.results if r.mode == mode]
    groups = [[r.speedup for r in rows if r.category == c] for c in report.categories]
    groups.append([r.speedup for r in rows])
    return [min(g) for g in groups], [max(g) for g in groups]
