"""A bench run as data: the figures of every run, per prompt and mode, and the report.

`Report.to_json` is the one versioned record of a run (every figure, every run); the
Markdown and the chart are rendered from a `Report`, and `Report.from_json` reads one
back, so a report can be rendered again from its JSON alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from localspec.bench.audit import Divergence
from localspec.bench.costs import Costs, median
from localspec.bench.machine import CONTENDED
from localspec.bench.suite import BenchError

REPORT_VERSION = 2  # 1: the unversioned reports, whose agreement was a logit gap
SHORT_ANSWER = 32  # tokens: below this, a prompt is judged by its time to the last token


@dataclass(frozen=True)
class RunFigures:
    """One generation's figures, from the engine's Stats."""

    tokens: int
    stop_reason: str
    tokens_per_s: float  # decode speed after the first token
    ttft_s: float
    itl_p50_s: float
    itl_p95_s: float
    acceptance_rate: float
    mean_accepted_len: float
    drafted: int
    accepted: int
    rounds: int
    round_s: float  # the engine's time in the rounds after the first token
    llama_s: float  # of which inside llama.cpp calls (both models)
    outside_s: float  # the rest: Python, sampling, bookkeeping
    cpu_share: float | None = None  # CPU time got ÷ (wall × threads); low = contended

    @property
    def overhead_share(self) -> float:
        """The share of round time spent outside llama.cpp calls."""
        return self.outside_s / self.round_s if self.round_s > 0 else 0.0

    @classmethod
    def from_peer(cls, f) -> RunFigures:  # f: peer.PeerFigures
        """What llama.cpp reports of a run; the rest it does not say (zeros)."""
        return cls(
            tokens=f.tokens,
            stop_reason="n/a",
            tokens_per_s=f.tokens_per_s,
            ttft_s=f.prompt_s,
            itl_p50_s=0.0,
            itl_p95_s=0.0,
            acceptance_rate=f.accepted / f.drafted if f.drafted else 0.0,
            mean_accepted_len=0.0,
            drafted=f.drafted,
            accepted=f.accepted,
            rounds=0,
            round_s=f.decode_s,
            llama_s=f.decode_s,
            outside_s=0.0,
        )

    @classmethod
    def from_finished(cls, done) -> RunFigures:  # done: events.Finished
        s = done.stats
        return cls(
            tokens=len(done.tokens),
            stop_reason=done.stop_reason,
            tokens_per_s=s.tokens_per_s,
            ttft_s=s.ttft_s,
            itl_p50_s=s.itl_p50_s,
            itl_p95_s=s.itl_p95_s,
            acceptance_rate=s.acceptance_rate,
            mean_accepted_len=s.mean_accepted_len,
            drafted=s.drafted,
            accepted=s.accepted,
            rounds=s.rounds,
            # the engine times its rounds itself, without the time its caller spends
            # between events, so a consumer cannot inflate the figure
            round_s=s.round_s,
            llama_s=s.llama_s,
            outside_s=s.overhead_s,
        )

    @property
    def last_token_s(self) -> float:
        """Time to the last token: the TTFT and the rounds after it (for the peer, its
        prompt evaluation and its decoding)."""
        return self.ttft_s + self.round_s


@dataclass(frozen=True)
class Agreement:
    """Greedy output compared with the baseline's, token for token; where they differ,
    the audit's verdict there (localspec.bench.audit): numerics, or a defect."""

    identical: bool
    divergence: Divergence | None = None

    @property
    def first_diff(self) -> int | None:
        return self.divergence.index if self.divergence else None

    @property
    def is_defect(self) -> bool:
        return self.divergence is not None and self.divergence.is_defect

    def label(self) -> str:
        if self.divergence is None:
            return "identical" if self.identical else "differs"
        return self.divergence.label()


@dataclass(frozen=True)
class Result:
    """One prompt in one mode: medians over the repeats, and every run."""

    prompt: str
    category: str
    mode: str
    tokens: int
    stop_reason: str
    tokens_per_s: float
    speedup: float  # median over repeats of tokens/s ÷ the same repeat's baseline
    acceptance_rate: float
    mean_accepted_len: float
    ttft_s: float
    itl_p50_s: float
    itl_p95_s: float
    overhead_share: float
    agreement: Agreement | None  # None for the peer: its tokens are not seen
    runs: tuple[RunFigures, ...]
    text: str = ""  # the first run's answer, to read where modes disagree
    external: bool = False  # a peer run: figures as llama.cpp reports them, others zero
    peer_tokens_per_s: float | None = None  # llama.cpp's speculative example, same prompt
    peer_plain_tokens_per_s: float | None = None  # llama.cpp's plain decoding, same prompt
    vs_peer: float | None = None  # tokens/s ÷ the peer's (side by side when run live)
    # median over repeats of the baseline's time to the last token ÷ this run's
    latency_speedup: float | None = None

    @property
    def short(self) -> bool:
        return self.tokens < SHORT_ANSWER

    @property
    def measure(self) -> float:
        """The prompt's figure: the decode speedup, or for a short answer (where the
        draft model's first read of the prompt weighs most) the time to its last token."""
        if self.short and self.latency_speedup is not None:
            return self.latency_speedup
        return self.speedup


@dataclass(frozen=True)
class ModeSummary:
    """One mode over the suite: medians of per-prompt speedups, and the slowest prompt."""

    mode: str
    # medians of `Result.measure`: time to the last token for short answers
    by_category: tuple[tuple[str, float], ...]
    median: float
    worst: float  # the least `Result.measure`
    worst_prompt: str
    acceptance_rate: float  # median over prompts
    overhead_share: float  # median over prompts
    max_overhead_share: float
    identical: int  # prompts with output identical to the baseline's
    prompts: int
    vs_peer: float | None = None  # median over prompts the peer ran
    external: bool = False  # the peer itself: no overhead or agreement figures
    defects: int = 0  # prompts whose divergence from the baseline the audit did not prove
    over_categories: float = 0.0  # median of the category medians


@dataclass(frozen=True)
class BenchInfo:
    target: str
    draft: str | None
    modes: tuple[str, ...]
    max_tokens: int
    repeats: int
    threads: int
    started: str  # ISO time, UTC
    duration_s: float
    machine: str
    llama_cpp: str
    caches: str = "cold: both KV caches cleared and a fresh engine before every run"
    peer: str | None = None
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at the start and end
    interrupted: bool = False  # stopped early: the prompts that completed
    costs: Costs | None = None
    suite: str | None = None  # None: the prompts file, else e.g. the Spec-Bench sample
    placement: str | None = None  # where the target ran when not here: RPC servers, latency


@dataclass(frozen=True)
class Report:
    info: BenchInfo
    results: tuple[Result, ...]

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.category for r in self.results))

    @property
    def prompts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.prompt for r in self.results))

    def contended(self) -> tuple[tuple[str, str, float], ...]:
        """(prompt, mode, CPU share) of each run that shared the CPU with other work."""
        return tuple(
            (r.prompt, r.mode, f.cpu_share)
            for r in self.results
            for f in r.runs
            if f.cpu_share is not None and f.cpu_share < CONTENDED
        )

    def defects(self) -> tuple[Result, ...]:
        """The results whose divergence from the baseline the audit did not prove."""
        return tuple(r for r in self.results if r.agreement and r.agreement.is_defect)

    def result(self, prompt: str, mode: str) -> Result:
        return next(r for r in self.results if r.prompt == prompt and r.mode == mode)

    def summary(self) -> tuple[ModeSummary, ...]:
        out = []
        for mode in self.info.modes[1:]:
            rows = [r for r in self.results if r.mode == mode]
            worst = min(rows, key=lambda r: r.measure)
            peers = [r.vs_peer for r in rows if r.vs_peer is not None]
            by_category = tuple(
                (c, median([r.measure for r in rows if r.category == c])) for c in self.categories
            )
            out.append(
                ModeSummary(
                    mode=mode,
                    by_category=by_category,
                    median=median([r.measure for r in rows]),
                    over_categories=median([v for _, v in by_category]),
                    worst=worst.measure,
                    worst_prompt=worst.prompt,
                    acceptance_rate=median([r.acceptance_rate for r in rows]),
                    overhead_share=median([r.overhead_share for r in rows]),
                    max_overhead_share=max(r.overhead_share for r in rows),
                    identical=sum(bool(r.agreement and r.agreement.identical) for r in rows),
                    prompts=len(rows),
                    vs_peer=median(peers) if peers else None,
                    external=rows[0].external,
                    defects=sum(bool(r.agreement and r.agreement.is_defect) for r in rows),
                )
            )
        return tuple(out)

    def to_json(self) -> dict:
        """Every figure, every run; summaries and defects alongside (derived, for readers:
        `from_json` recomputes them)."""
        return {
            "version": REPORT_VERSION,
            "info": asdict(self.info),
            "summary": [asdict(s) for s in self.summary()],
            "defects": [
                {"prompt": r.prompt, "mode": r.mode, "label": r.agreement.label()}
                for r in self.defects()
                if r.agreement
            ],
            "results": [
                {
                    **asdict(r),
                    "runs": [{**asdict(f), "overhead_share": f.overhead_share} for f in r.runs],
                }
                for r in self.results
            ],
        }

    @classmethod
    def from_json(cls, data: dict) -> Report:
        """The report `to_json` wrote."""
        version = data.get("version") if isinstance(data, dict) else None
        if version != REPORT_VERSION:
            raise BenchError(
                f"a bench report of version {version or 1}; "
                f"this localspec reads version {REPORT_VERSION}"
            )
        try:
            return cls(
                decode(BenchInfo, data["info"]),
                tuple(decode(Result, r) for r in data["results"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise BenchError(f"not a bench report: {e!r}") from None


def decode(kind: Any, value: Any) -> Any:
    """`value`, read from JSON, as an instance of the type `kind`: dataclasses field by
    field (keys that are not fields, such as derived figures, are left out), tuples from
    lists, optional values as given or None."""
    if value is None:
        return None
    if is_dataclass(kind) and isinstance(kind, type):
        hints = get_type_hints(kind)
        return kind(
            **{
                f.name: decode(hints[f.name], value[f.name])
                for f in fields(kind)
                if f.name in value
            }
        )
    origin, args = get_origin(kind), get_args(kind)
    if origin in (Union, UnionType):  # X | None, and value is not None
        return decode(next(a for a in args if a is not type(None)), value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v) for v in value)
        return tuple(decode(a, v) for a, v in zip(args, value, strict=True))
    if kind is float:
        return float(value)
    return value


def median_ratio(values: Sequence[float], bases: Sequence[float]) -> float:
    """Median over repeats of value ÷ the same repeat's base: side by side."""
    return median([v / b for v, b in zip(values, bases, strict=True) if b])
