#!/usr/bin/env python3
"""Two bench runs of the same prompts, prompt for prompt: one mode's speedup in each (each
over its own run's baseline), and for answers under 32 tokens the time to the last token.

    scripts/bench_compare.py BEFORE/bench.json AFTER/bench.json [--mode auto]

Prints a Markdown table, then the medians per category and over categories.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from localspec.bench.report import load_report
from localspec.bench.results import SHORT_ANSWER, Report, Result


def latency(report: Report, prompt: str, mode: str) -> float:
    """The baseline's time to its last token over the mode's (first repeat)."""
    base, run = report.result(prompt, "baseline").runs[0], report.result(prompt, mode).runs[0]
    return base.last_token_s / run.last_token_s


def measure(report: Report, r: Result) -> float:
    """Decode speedup, or for a short answer its time to the last token."""
    return latency(report, r.prompt, r.mode) if r.tokens < SHORT_ANSWER else r.speedup


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--mode", default="auto")
    args = parser.parse_args()
    before, after = load_report(args.before), load_report(args.after)
    prompts = [p for p in after.prompts if p in before.prompts]
    print(
        f"| prompt | tokens | {args.mode} before | after | TTLT before | after | "
        "measure before | after |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    cats: dict[str, list[tuple[float, float]]] = {}
    for p in prompts:
        b, a = before.result(p, args.mode), after.result(p, args.mode)
        mb, ma = measure(before, b), measure(after, a)
        cats.setdefault(a.category, []).append((b.speedup, a.speedup))
        short = " (short)" if a.tokens < SHORT_ANSWER else ""
        print(
            f"| {p}{short} | {a.tokens} | {b.speedup:.2f}× | {a.speedup:.2f}× | "
            f"{latency(before, p, args.mode):.2f}× | {latency(after, p, args.mode):.2f}× | "
            f"{mb:.2f}× | {ma:.2f}× |"
        )
    print("\n| category | before | after |\n|---|---:|---:|")
    medians = {c: [statistics.median(x) for x in zip(*v, strict=True)] for c, v in cats.items()}
    for c, (mb, ma) in medians.items():
        print(f"| {c} | {mb:.2f}× | {ma:.2f}× |")
    over = [statistics.median(x) for x in zip(*medians.values(), strict=True)]
    print(f"| median over categories | {over[0]:.2f}× | {over[1]:.2f}× |")
    worst = [min(measure(r, r.result(p, args.mode)) for p in prompts) for r in (before, after)]
    print(f"| slowest prompt (TTLT if short) | {worst[0]:.2f}× | {worst[1]:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
