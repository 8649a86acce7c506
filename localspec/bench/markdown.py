"""The bench report as Markdown: the summary first, then per prompt, then every figure.

Rendered from a `Report` alone (so from its JSON too): nothing here measures anything.
"""

from __future__ import annotations

from collections.abc import Sequence

from localspec.bench.costs import Costs
from localspec.bench.machine import CONTENDED
from localspec.bench.results import SHORT_ANSWER, Report, Result

WIDE = 5  # with more categories than this, they get their own table


def fmt_ratio(value: float) -> str:
    return f"{value:.2f}×"


def fmt_percent(value: float) -> str:
    return f"{value:.0%}" if value >= 0.1 else f"{value:.1%}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int] = (0,)) -> str:
    """A Markdown table; columns in `left` hold words, the others figures (right-aligned)."""
    align = ["---" if i in left else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def to_markdown(report: Report) -> str:
    """The report as Markdown: the summary first, then per prompt, then every figure."""
    info = report.info
    head = [
        f"# localspec bench: {info.target}" + (f" + {info.draft}" if info.draft else ""),
        "",
        *(
            ["**Interrupted**: the prompts that completed in every mode.", ""]
            if info.interrupted
            else []
        ),
        f"Greedy, {info.max_tokens} new tokens, {info.threads or 'default'} threads, "
        f"{info.repeats} repeat(s), {len(report.prompts)} prompts"
        + (f" ({info.suite})" if info.suite else "")
        + f"; {info.caches}. "
        + (f"{info.placement}. " if info.placement else "")
        + f"{info.machine} (load {info.load[0]:.1f} at the start, {info.load[1]:.1f} at the "
        f"end); {info.llama_cpp}; {info.started}, {info.duration_s / 60:.1f} min.",
        "",
        *defects_note(report),
        *contention_note(report),
        "## Speedup over baseline (median over prompts)",
    ]
    detail_header = [
        "prompt",
        "mode",
        "tokens",
        "tok/s",
        "speedup",
        "accept",
        "mean len",
        "TTFT s",
        "ITL p50/p95 ms",
        "outside llama.cpp",
        "CPU",
        "agreement",
    ]
    parts = [
        "\n".join(head),
        summary_table(report),
        *category_section(report),
        *short_section(report),
        *costs_section(info.costs),
        "## By prompt (speedup over baseline)",
        by_prompt_table(report),
        "## Every figure",
        table(detail_header, [detail_row(r) for r in report.results], left=(0, 1, 11)),
        "Speedup: decode tokens/s over the baseline run's, median over repeats; an "
        f"answer under {SHORT_ANSWER} tokens counts in the medians (all, categories) and "
        "as the slowest prompt by its time to the last token (TTFT and decoding) instead, "
        "marked TTLT where it is the slowest; the tables by prompt show decode speed. Accept: "
        "accepted / drafted. Mean len: tokens per round, the target's own included. "
        "Outside llama.cpp: the share of round time spent in Python, sampling and "
        "bookkeeping. CPU: the least CPU time a run got, over what its threads asked for "
        f"(under {CONTENDED:.0%}: other work slowed it). "
        "Agreement: greedy output against the baseline's; where they differ, each run's "
        "target passes (plain decoding's one token at a time, the speculative run's in "
        "batches) are replayed up to that position: numerics when each replay gives its "
        "own run's token there (the passes differ only in how they batch, so the kernels' "
        "last bits decided), a DEFECT otherwise."
        + (f" Peer: {info.peer}." if info.peer is not None else ""),
    ]
    return "\n\n".join(parts) + "\n"


def summary_table(report: Report) -> str:
    cats, peer = report.categories, report.info.peer is not None
    wide = len(cats) > WIDE
    shown = () if wide else cats  # many categories: in their own table
    header = [
        "mode",
        *shown,
        *(["categories"] if wide else []),
        "all",
        "slowest prompt",
        "accept",
        "outside llama.cpp",
        "identical",
    ] + (["vs peer"] if peer else [])
    rows = []
    for s in report.summary():
        identical = f"{s.identical}/{s.prompts}" + (f", {s.defects} DEFECT" if s.defects else "")
        worst = report.result(s.worst_prompt, s.mode)
        short = worst.short and worst.latency_speedup is not None
        row = [
            s.mode,
            *(fmt_ratio(v) for _, v in (() if wide else s.by_category)),
            *([fmt_ratio(s.over_categories)] if wide else []),
            fmt_ratio(s.median),
            f"{fmt_ratio(s.worst)}{' TTLT' if short else ''} {s.worst_prompt}",
            fmt_percent(s.acceptance_rate) if s.mode != "peer-plain" else "-",
            f"{fmt_percent(s.overhead_share)} (max {fmt_percent(s.max_overhead_share)})"
            if not s.external
            else "-",
            identical if not s.external else "-",
        ]
        if peer:
            row.append(fmt_ratio(s.vs_peer) if s.vs_peer is not None else "-")
        rows.append(row)
    return table(header, rows, left=(0, len(header) - 4 - peer))


def category_section(report: Report) -> list[str]:
    """Many categories (Spec-Bench's 13): one row each, and their median."""
    cats, summary = report.categories, report.summary()
    if len(cats) <= WIDE:
        return []
    modes = [s.mode for s in summary]
    counts = {
        c: sum(report.result(p, "baseline").category == c for p in report.prompts) for c in cats
    }
    rows = [
        [c, str(counts[c]), *(fmt_ratio(dict(s.by_category)[c]) for s in summary)] for c in cats
    ]
    rows.append(["median over categories", "", *(fmt_ratio(s.over_categories) for s in summary)])
    return [
        "## By category (median speedup over the category's prompts)",
        table(["category", "prompts", *modes], rows),
    ]


def short_section(report: Report) -> list[str]:
    """Short answers: there the draft model's first read of the prompt weighs most, so
    they are judged by the time to their last token, TTFT included."""
    short = [p for p in report.prompts if report.result(p, "baseline").short]
    if not short:
        return []
    modes = report.info.modes[1:]
    rows = []
    for p in short:
        base = report.result(p, "baseline")
        cells = []
        for m in modes:
            r = report.result(p, m)
            cells.append(fmt_ratio(r.latency_speedup) if r.latency_speedup is not None else "-")
        rows.append([p, str(base.tokens), f"{base.runs[0].last_token_s:.2f}", *cells])
    return [
        f"## Short answers (under {SHORT_ANSWER} tokens): time to the last token",
        "Baseline's time to its last token (TTFT and decoding) over each mode's, median "
        "over repeats.",
        table(["prompt", "tokens", "baseline s", *modes], rows),
    ]


def by_prompt_table(report: Report) -> str:
    modes, peer = report.info.modes, report.info.peer is not None
    header = ["prompt", "category", "tokens", "baseline tok/s", *modes[1:]]
    if peer:
        header += ["peer plain/spec tok/s", "best mode vs peer"]
    lines = []
    for p in report.prompts:
        base = report.result(p, "baseline")
        rows = [report.result(p, m) for m in modes[1:]]
        line = [p, base.category, str(base.tokens), f"{base.tokens_per_s:.2f}"]
        line += [fmt_ratio(r.speedup) for r in rows]
        if peer:
            ratios = [r.vs_peer for r in rows if r.vs_peer is not None and not r.external]
            tps_pair = (
                f"{base.peer_plain_tokens_per_s:.2f}/{base.peer_tokens_per_s:.2f}"
                if base.peer_tokens_per_s and base.peer_plain_tokens_per_s
                else "-"
            )
            line += [tps_pair, fmt_ratio(max(ratios)) if ratios else "-"]
        lines.append(line)
    return table(header, lines, left=(0, 1))


def costs_section(costs: Costs | None) -> list[str]:
    """T(k), c and the ceilings they set, where they were measured."""
    if costs is None or not costs.verify_s or costs.verify_s[0] <= 0:
        return []
    t = costs.verify_s
    rows = table(
        ["", *(str(k) for k in range(1, len(t) + 1))],
        [
            ["T(k) ms", *(f"{s * 1e3:.3g}" for s in t)],
            ["T(k) / T(1)", *(f"{s / t[0]:.2f}" for s in t)],
        ],
    )
    lines = []
    if costs.draft_s is not None and (best := costs.ceiling(costs.draft_s)):
        lines.append(
            f"the draft model (c = {costs.draft_s * 1e3:.3g} ms a token, "
            f"{costs.draft_s / t[0]:.2f} T(1)) {fmt_ratio(best[1])} at γ {best[0]}"
        )
    if costs.head_s is not None and (best := costs.ceiling(costs.head_s)):
        lines.append(
            f"{costs.head} (c = {costs.head_s * 1e3:.3g} ms a token, "
            f"{costs.head_s / t[0]:.2f} T(1)) {fmt_ratio(best[1])} at γ {best[0]}"
        )
    if best := costs.ceiling(0.0):
        lines.append(f"n-gram lookup (free) {fmt_ratio(best[1])} at γ {best[0]}")
    return [
        "## What speculation has to work with",
        "T(k): the target's time to score k tokens in one pass (median of 5, after the "
        "first prompt). A round that drafts γ tokens costs γ·c + T(γ + 1) and yields at "
        "most γ + 1 tokens, so a drafter that is always right could reach at most: "
        + "; ".join(lines)
        + ".",
        rows,
    ]


def defects_note(report: Report) -> list[str]:
    """Loud, at the top: answers that differ from plain decoding for no proven reason."""
    if not (found := report.defects()):
        return []
    listed = "; ".join(f"{r.prompt} {r.mode}: {r.agreement.label()}" for r in found if r.agreement)
    return [
        f"**DEFECT**: {len(found)} greedy answer(s) differ from plain decoding where the "
        f"replayed passes do not explain it (kernel numerics would): {listed}.",
        "",
    ]


def contention_note(report: Report) -> list[str]:
    if not (runs := report.contended()):
        return []
    n = sum(len(r.runs) for r in report.results)
    worst = sorted(runs, key=lambda run: run[2])[:3]
    listed = ", ".join(f"{p} {m} ({share:.0%})" for p, m, share in worst)
    return [
        f"**Noisy**: {len(runs)} of {n} runs got less than {CONTENDED:.0%} of the CPU time "
        f"their threads asked for (other work on the machine), e.g. {listed}. Their "
        "figures are low; rerun on a quiet machine, or with more --repeats.",
        "",
    ]


def least_cpu_share(r: Result) -> str:
    shares = [f.cpu_share for f in r.runs if f.cpu_share is not None]
    return f"{min(shares):.0%}" if shares else "-"


def detail_row(r: Result) -> list[str]:
    """One run's figures; '-' where a figure means nothing (the baseline's acceptance) or
    is not known (what llama.cpp's binaries do not report)."""
    spec = r.mode != "baseline" and r.mode != "peer-plain"
    own = not r.external
    return [
        r.prompt,
        r.mode,
        f"{r.tokens}",
        f"{r.tokens_per_s:.2f}",
        fmt_ratio(r.speedup),
        fmt_percent(r.acceptance_rate) if spec else "-",
        f"{r.mean_accepted_len:.2f}" if spec and own else "-",
        f"{r.ttft_s:.2f}",
        f"{r.itl_p50_s * 1e3:.0f}/{r.itl_p95_s * 1e3:.0f}" if own else "-",
        fmt_percent(r.overhead_share) if own else "-",
        least_cpu_share(r),
        cell(r.agreement.label()) if r.agreement and r.mode != "baseline" else "-",
    ]


def cell(text: str) -> str:
    """Text for a table cell: a token quoted in it may be a pipe."""
    return text.replace("|", "\\|")
