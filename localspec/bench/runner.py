"""`localspec bench`: every decoding mode on the same loaded models, side by side.

Runs are interleaved prompt by prompt (for each repeat, for each prompt, every mode in
turn) in one process on the same two loaded models, greedy, so each speedup is the ratio
of two runs made seconds apart on the same weights, threads and machine state. Every run
starts cold, as `localspec run` does: both KV caches are cleared, the prompt is prefilled,
and the engine is built fresh (an adaptive drafter starts from its priors). The prompt's
tokens are rendered once, through the target's chat template, and shared by every mode.

Per prompt and mode: decode tokens/s, speedup over the baseline run of the same repeat,
acceptance, mean accepted length (the target's own token counted, as in vLLM), TTFT,
per-token latency p50/p95, the share of decode time spent outside llama.cpp, and greedy
agreement with the baseline (identical, or where the two first differ and how close a
tie the baseline had there). Reports: Markdown, JSON with every figure, PNG chart.
"""

from __future__ import annotations

import gc
import io
import json
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import numpy as np

from localspec.backends.base import Model
from localspec.errors import LocalspecError
from localspec.paths import write_atomic

MODE_KINDS = ("baseline", "draft", "ngram", "auto", "peer", "peer-plain")
MODE_RE = re.compile(r"^(baseline|draft|ngram|auto|peer-plain|peer)(?:-g(\d+))?$")
FIXED_GAMMA = ("draft", "ngram", "peer")  # the kinds a -gN suffix applies to
PEER_KINDS = ("peer", "peer-plain")  # llama.cpp's own binaries (localspec.bench.peer)
DEFAULT_MODES = "baseline,draft,ngram,auto"
PROMPT_KEYS = {"category", "prompt"}
NEAR_TIE = 1.0  # logits: batched and one-token kernels differ by up to ~0.5 on this CPU
CONTENDED = 0.85  # a run that got less of the CPU than this shared it with other work


class BenchError(LocalspecError):
    """A bench input (prompts file, modes, peer file) is wrong; one line for the user."""


# --- prompts ---------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchPrompt:
    name: str
    category: str  # "code", "edit", "chat", "summarize", or any the file uses
    prompt: str  # the user message; rendered with the target's chat template


def default_prompts_path() -> Path:
    return Path(str(resources.files("localspec") / "data" / "bench_prompts.json"))


def load_prompts(path: Path | None = None) -> tuple[BenchPrompt, ...]:
    """The suite in `path` (default: the one shipped with localspec), validated: every
    problem in the file is reported at once, in one line."""
    path = path or default_prompts_path()
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BenchError(f"prompts file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BenchError(f"cannot read prompts file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise BenchError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(data, dict) or not data:
        raise BenchError(
            f'{path}: expected an object of prompts, {{"name": {{"category": ..., "prompt": ...}}}}'
        )
    problems: list[str] = []
    prompts: list[BenchPrompt] = []
    for name, entry in data.items():
        if not name.strip():
            problems.append("a prompt has an empty name")
            continue
        if not isinstance(entry, dict):
            problems.append(f"{name!r} is not an object")
            continue
        if missing := sorted(PROMPT_KEYS - entry.keys()):
            problems.append(f"{name!r} lacks {', '.join(missing)}")
        if unknown := sorted(entry.keys() - PROMPT_KEYS):
            problems.append(f"{name!r} has unknown key(s) {', '.join(unknown)}")
        bad = [
            k
            for k in sorted(PROMPT_KEYS & entry.keys())
            if not isinstance(entry[k], str) or not entry[k].strip()
        ]
        problems += [f"{name!r}: {k} must be a non-empty string" for k in bad]
        if not missing and not unknown and not bad:
            prompts.append(BenchPrompt(name, entry["category"].strip(), entry["prompt"]))
    if problems:
        raise BenchError(f"{path}: " + "; ".join(problems))
    return tuple(prompts)


def select_prompts(prompts: Sequence[BenchPrompt], only: str | None) -> tuple[BenchPrompt, ...]:
    """Prompts whose name or category is in the comma-separated `only` (all if None)."""
    if not only:
        return tuple(prompts)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    known = {p.name for p in prompts} | {p.category for p in prompts}
    if unknown := [w for w in wanted if w not in known]:
        raise BenchError(
            f"no prompt or category named {', '.join(unknown)} "
            f"(categories: {', '.join(sorted({p.category for p in prompts}))})"
        )
    return tuple(p for p in prompts if p.name in wanted or p.category in wanted)


# --- modes -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Mode:
    """One way to decode: `baseline` (plain), `draft`/`ngram` at a fixed γ, `auto`; or
    the peer: `peer` (llama.cpp's speculative example), `peer-plain` (its plain decoding)."""

    name: str
    kind: str  # one of MODE_KINDS
    gamma: int = 0  # fixed γ for draft/ngram, the peer's --spec-draft-n-max; else 0

    @property
    def needs_draft_model(self) -> bool:
        return self.kind in ("draft", "peer")

    @property
    def is_peer(self) -> bool:
        return self.kind in PEER_KINDS


def parse_modes(text: str, gamma: int = 4, have_draft: bool = True) -> tuple[Mode, ...]:
    """`baseline,draft,ngram,auto,draft-g2,...`: baseline is always run, first (every
    speedup is a ratio to it); `draft`/`ngram` take `gamma`, `draft-gN` takes N; `peer`
    drafts DEFAULT_N_MAX, `peer-gN` N."""
    from localspec.bench.peer import DEFAULT_N_MAX

    modes: dict[str, Mode] = {}
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        m = MODE_RE.match(word)
        if m is None:
            raise BenchError(
                f"unknown mode {word!r}: use baseline, draft, ngram, auto, draft-gN, "
                "ngram-gN, peer, peer-gN or peer-plain"
            )
        kind, n = m.group(1), m.group(2)
        if n is not None and kind not in FIXED_GAMMA:
            raise BenchError(f"mode {word!r}: only draft, ngram and peer take a fixed γ (-gN)")
        default = DEFAULT_N_MAX if kind == "peer" else gamma
        g = int(n) if n is not None else (default if kind in FIXED_GAMMA else 0)
        if kind in FIXED_GAMMA and not 1 <= g <= 32:
            raise BenchError(f"mode {word!r}: γ must be between 1 and 32")
        modes[word] = Mode(word, kind, g)
    if not have_draft and (need := [m.name for m in modes.values() if m.needs_draft_model]):
        raise BenchError(f"mode(s) {', '.join(need)} need a draft model (--draft)")
    baseline = modes.pop("baseline", Mode("baseline", "baseline"))
    return (baseline, *modes.values())


def build_engine(mode: Mode, target: Model, draft: Model | None):  # -> Engine
    """A fresh engine for one run: no state carries over from the previous one."""
    from localspec.decoding.adaptive import auto_engine
    from localspec.decoding.drafters import DraftModel, NgramDrafter, NoDrafter
    from localspec.decoding.engine import Engine

    if mode.kind == "baseline":
        return Engine(target, NoDrafter(), 0)
    if mode.kind == "draft":
        if draft is None:
            raise BenchError(f"mode {mode.name} needs a draft model")
        return Engine(target, DraftModel(draft), mode.gamma)
    if mode.kind == "ngram":
        return Engine(target, NgramDrafter(), mode.gamma)
    return auto_engine(target, draft)


EngineFactory = Callable[[Mode, Model, Model | None], object]


# --- results ---------------------------------------------------------------------------
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
    def from_peer(cls, f) -> RunFigures:  # f: bench_peer.PeerFigures
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


@dataclass(frozen=True)
class Agreement:
    """Greedy output compared with the baseline's, token for token. Where they differ, the
    baseline's own logits there say how far behind its choice the token taken was."""

    identical: bool
    first_diff: int | None = None  # index of the first token that differs
    gap: float | None = None  # baseline's top logit minus that of the token taken there
    rank: int | None = None  # the taken token's place in the baseline's order (2: runner-up)

    @property
    def near_tie(self) -> bool:
        """A divergence that kernel numerics explain (batched vs one-token passes)."""
        return self.gap is not None and self.gap < NEAR_TIE

    def label(self) -> str:
        if self.identical:
            return "identical"
        where = f"differs at {self.first_diff}"
        if self.gap is None or self.rank is None:
            return where
        if self.rank == 1:  # re-scored, plain decoding's own logits flip too
            return f"{where} (re-scored, the baseline's top token too: a tie)"
        tie = "near-tie" if self.near_tie else "NOT a near-tie"
        return f"{where} (baseline's #{self.rank}, {self.gap:.2f} behind: {tie})"


def first_difference(baseline: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first token where the two differ (a shorter answer differs where it
    ends); None if identical."""
    for i, (a, b) in enumerate(zip(baseline, other, strict=False)):
        if a != b:
            return i
    return None if len(baseline) == len(other) else min(len(baseline), len(other))


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


@dataclass(frozen=True)
class ModeSummary:
    """One mode over the suite: medians of per-prompt speedups, and the slowest prompt."""

    mode: str
    by_category: tuple[tuple[str, float], ...]
    median: float
    worst: float
    worst_prompt: str
    acceptance_rate: float  # median over prompts
    overhead_share: float  # median over prompts
    max_overhead_share: float
    identical: int  # prompts with output identical to the baseline's
    prompts: int
    vs_peer: float | None = None  # median over prompts the peer ran
    external: bool = False  # the peer itself: no overhead or agreement figures


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

    def result(self, prompt: str, mode: str) -> Result:
        return next(r for r in self.results if r.prompt == prompt and r.mode == mode)

    def summary(self) -> tuple[ModeSummary, ...]:
        out = []
        for mode in self.info.modes[1:]:
            rows = [r for r in self.results if r.mode == mode]
            worst = min(rows, key=lambda r: r.speedup)
            peers = [r.vs_peer for r in rows if r.vs_peer is not None]
            out.append(
                ModeSummary(
                    mode=mode,
                    by_category=tuple(
                        (c, _median([r.speedup for r in rows if r.category == c]))
                        for c in self.categories
                    ),
                    median=_median([r.speedup for r in rows]),
                    worst=worst.speedup,
                    worst_prompt=worst.prompt,
                    acceptance_rate=_median([r.acceptance_rate for r in rows]),
                    overhead_share=_median([r.overhead_share for r in rows]),
                    max_overhead_share=max(r.overhead_share for r in rows),
                    identical=sum(bool(r.agreement and r.agreement.identical) for r in rows),
                    prompts=len(rows),
                    vs_peer=_median(peers) if peers else None,
                    external=rows[0].external,
                )
            )
        return tuple(out)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


# --- the runner ------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchConfig:
    max_tokens: int = 128
    repeats: int = 1
    warmup: bool = True  # one short untimed run first: page in weights, allocate buffers
    costs: bool = True  # time T(k) and the draft's step first (a few seconds)


@dataclass(frozen=True)
class Progress:
    """One run started (figures None) or finished."""

    done: int
    total: int
    repeat: int
    prompt: BenchPrompt
    mode: Mode
    figures: RunFigures | None = None
    speedup: float | None = None  # against this repeat's baseline run


@dataclass(frozen=True)
class PeerRun:
    """llama.cpp's speculative example on one prompt (scripts/peer_speculative.sh)."""

    plain_tps: float  # llama.cpp's own plain decoding of the same prompt
    spec_tps: float
    acceptance: float


@dataclass(frozen=True)
class Peer:
    name: str  # its command line
    runs: dict[str, PeerRun]  # by prompt name


@dataclass(frozen=True)
class _Record:
    """One run: its figures and, for localspec's own modes, its answer."""

    figures: RunFigures
    tokens: tuple[int, ...] = ()
    text: str = ""


@dataclass
class _Runs:
    """Every run, by (prompt, mode), in repeat order; each prompt's tokens and text."""

    finished: dict[tuple[str, str], list[_Record]] = field(default_factory=dict)
    prompt_tokens: dict[str, list[int]] = field(default_factory=dict)
    prompt_text: dict[str, str] = field(default_factory=dict)  # for the peer binaries

    def complete(
        self, prompts: Sequence[BenchPrompt], modes: Sequence[Mode]
    ) -> tuple[BenchPrompt, ...]:
        """The prompts every mode has run on, each mode cut to as many repeats as all
        modes have: a speedup needs its baseline run."""
        kept = []
        for p in prompts:
            lists = [self.finished.get((p.name, m.name), []) for m in modes]
            if n := min(len(runs) for runs in lists):
                for runs in lists:
                    del runs[n:]
                kept.append(p)
        return tuple(kept)


def run_bench(
    target: Model,
    draft: Model | None,
    prompts: Sequence[BenchPrompt],
    modes: Sequence[Mode],
    config: BenchConfig = BenchConfig(),
    progress: Callable[[Progress], None] | None = None,
    engine_factory: EngineFactory = build_engine,
    peer: Peer | None = None,
    threads: int = 0,
    peer_bin=None,  # bench_peer.LlamaCppPeer: runs the peer modes
) -> Report:
    """Run every mode on every prompt, `config.repeats` times, interleaved."""
    from localspec.decoding.drafters import NoDrafter
    from localspec.decoding.engine import Engine
    from localspec.session import Session

    if not prompts:
        raise BenchError("no prompts to run")
    if not modes or modes[0].kind != "baseline":
        raise BenchError("the first mode must be the baseline")
    live_peer = [m.name for m in modes if m.is_peer]
    if live_peer and peer_bin is None:
        raise BenchError(f"mode(s) {', '.join(live_peer)} need llama.cpp's binaries")
    if live_peer and peer is not None:
        raise BenchError("compare with the peer live (peer modes) or from a file, not both")
    started, clock, load = datetime.now(UTC), time.perf_counter(), machine_load()
    if live_peer:
        peer = Peer(
            "run live, side by side: " + ", ".join(_peer_command(m) for m in modes if m.is_peer), {}
        )
    session = Session(Engine(target, NoDrafter(), 0))
    runs = _Runs()
    for p in prompts:
        runs.prompt_tokens[p.name] = session.render([{"role": "user", "content": p.prompt}])
        if live_peer:
            runs.prompt_text[p.name] = _render_text(target, p.prompt)
    if config.warmup:
        _warm_up(target, draft, runs.prompt_tokens[prompts[0].name], engine_factory, modes)
    costs = (
        measure_costs(target, draft, runs.prompt_tokens[prompts[0].name]) if config.costs else None
    )

    interrupted = False
    try:
        _measure(
            target, draft, prompts, modes, config, runs, engine_factory, progress, peer_bin, threads
        )
    except KeyboardInterrupt:
        # keep what is complete: a long run stopped early still reports
        interrupted = True
        prompts = runs.complete(prompts, modes)
        if not prompts:
            raise
    results = _results(target, prompts, modes, runs, peer.runs if peer else {})
    info = BenchInfo(
        target=target.name,
        draft=draft.name if draft is not None else None,
        modes=tuple(m.name for m in modes),
        max_tokens=config.max_tokens,
        repeats=config.repeats,
        threads=threads,
        started=started.isoformat(timespec="seconds"),
        duration_s=time.perf_counter() - clock,
        machine=_machine(),
        llama_cpp=_llama_cpp_version(),
        peer=peer.name if peer else None,
        load=(load, machine_load()),
        interrupted=interrupted,
        costs=costs,
    )
    return Report(info, results)


# --- what speculation has to work with --------------------------------------------------
@dataclass(frozen=True)
class Costs:
    """The target's seconds to score a batch of k tokens, T(k) for k = 1..K, and the
    draft model's seconds per token, c: together they bound what speculation can gain
    on this machine, however good the drafter."""

    verify_s: tuple[float, ...]
    draft_s: float | None = None

    def ceiling(self, per_token_s: float) -> tuple[int, float] | None:
        """(γ, speedup) for a drafter that is always right (α = 1) and costs
        `per_token_s` a token: the best over γ of (γ + 1)·T(1) / (γ·c + T(γ + 1))."""
        t = self.verify_s
        if len(t) < 2 or t[0] <= 0:
            return None
        gains = {g: (g + 1) * t[0] / (g * per_token_s + t[g]) for g in range(1, len(t))}
        best = max(gains, key=lambda g: gains[g])
        return best, gains[best]


def measure_costs(
    target: Model, draft: Model | None, prompt: list[int], k_max: int = 8, reps: int = 5
) -> Costs:
    """T(1..k_max) and c (the timed runs after this start cold again)."""
    verify = tuple(time_pass(target, prompt, k, reps).llama_s for k in range(1, k_max + 1))
    step = time_pass(draft, prompt, 1, reps).llama_s if draft is not None else None
    return Costs(verify, step)


@dataclass(frozen=True)
class PassTimes:
    """Median seconds of one Model.evaluate of k new tokens after a cached prefix."""

    tokens: int
    wall_s: float  # around evaluate: Python bookkeeping included
    llama_s: float  # inside llama.cpp (busy_s)


def time_pass(
    model: Model, prefix: list[int], k: int, reps: int, warmup: int = 1, n_logits: int | None = None
) -> PassTimes:
    """Score k new tokens after `prefix`, which stays cached, with logits for the last
    `n_logits` of them (all k by default: a verify pass; 1 for a catch-up); the first
    `warmup` passes (allocations, graph capture) are not counted."""
    model.evaluate(prefix, 1)
    new = (prefix * (k // len(prefix) + 1))[:k]  # real token ids, any will do
    walls, busies = [], []
    for _ in range(reps + warmup):
        busy, started = model.busy_s, time.perf_counter()
        model.evaluate(prefix + new, k if n_logits is None else n_logits)
        walls.append(time.perf_counter() - started)
        busies.append(model.busy_s - busy)
        model.evaluate(prefix, 0)  # roll the k tokens back
    return PassTimes(k, _median(walls[warmup:]), _median(busies[warmup:]))


def _measure(
    target: Model,
    draft: Model | None,
    prompts: Sequence[BenchPrompt],
    modes: Sequence[Mode],
    config: BenchConfig,
    runs: _Runs,
    engine_factory: EngineFactory,
    progress: Callable[[Progress], None] | None,
    peer_bin=None,
    threads: int = 0,
) -> None:
    """The timed runs: for each repeat, for each prompt, every mode in turn."""
    total, done = config.repeats * len(prompts) * len(modes), 0
    for repeat in range(config.repeats):
        for p in prompts:
            base_tps = None
            for mode in modes:
                if progress:
                    progress(Progress(done, total, repeat, p, mode))
                cpu = _CpuClock(threads)
                if mode.is_peer:
                    record = _run_peer(peer_bin, mode, runs.prompt_text[p.name], config)
                else:
                    finished = _run_once(
                        engine_factory(mode, target, draft),
                        target,
                        draft,
                        runs.prompt_tokens[p.name],
                        config.max_tokens,
                    )
                    record = _Record(
                        RunFigures.from_finished(finished), finished.tokens, finished.text
                    )
                record = replace(record, figures=replace(record.figures, cpu_share=cpu.share()))
                runs.finished.setdefault((p.name, mode.name), []).append(record)
                figures = record.figures
                if mode.kind == "baseline":
                    base_tps = figures.tokens_per_s
                done += 1
                if progress:
                    speedup = figures.tokens_per_s / base_tps if base_tps else None
                    progress(Progress(done, total, repeat, p, mode, figures, speedup))


class _CpuClock:
    """How much of the CPU a run got: CPU seconds (this process and the peer binaries it
    waited for) over wall seconds × threads. Uncontended, llama.cpp's threads run (or
    spin) throughout, near 1; other work on the machine shows as less, and makes that
    run's figures noisy. None when the thread count is not known."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.wall, self.cpu = time.perf_counter(), self._cpu()

    @staticmethod
    def _cpu() -> float | None:
        try:
            import resource  # POSIX only
        except ImportError:
            return None
        me, children = (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
        return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime

    def share(self) -> float | None:
        wall, now = time.perf_counter() - self.wall, self._cpu()
        if not self.threads or wall <= 0 or now is None or self.cpu is None:
            return None
        return (now - self.cpu) / (wall * self.threads)


def _run_once(engine, target: Model, draft: Model | None, prompt: list[int], max_tokens: int):
    """One cold, greedy, untraced generation; returns its Finished event."""
    from localspec.decoding.engine import GenerationConfig
    from localspec.decoding.events import Finished
    from localspec.decoding.sampling import SamplingParams

    target.reset()
    if draft is not None:
        draft.reset()
    gc.collect()  # a collection mid-run would be timed as engine overhead
    config = GenerationConfig(max_tokens=max_tokens, sampling=SamplingParams(temperature=0))
    finished = None
    for event in engine.generate(prompt, config):
        if isinstance(event, Finished):
            finished = event
    assert finished is not None  # generate() always ends with Finished
    return finished


def _run_peer(peer_bin, mode: Mode, prompt_text: str, config: BenchConfig) -> _Record:
    if mode.kind == "peer":
        figures = peer_bin.speculative(prompt_text, config.max_tokens, mode.gamma)
    else:
        figures = peer_bin.plain(prompt_text, config.max_tokens)
    return _Record(RunFigures.from_peer(figures))


def _peer_command(mode: Mode) -> str:
    if mode.kind == "peer":
        return (
            f"{mode.name} = llama-speculative-simple --spec-type draft-simple "
            f"--spec-draft-n-max {mode.gamma}"
        )
    return f"{mode.name} = llama-completion (plain decoding)"


def _render_text(target: Model, prompt: str) -> str:
    """The prompt as text through the target's chat template, special tokens written
    out: what localspec tokenizes, for the peer binaries to tokenize the same way."""
    from localspec.session import _formatter

    render = _formatter(target)  # type: ignore[arg-type]
    return render(messages=[{"role": "user", "content": prompt}]).prompt  # type: ignore[operator]


def _warm_up(target, draft, prompt, engine_factory, modes) -> None:
    """Untimed: the first passes after loading page the weights in and allocate buffers,
    which would be charged to whichever mode ran first."""
    for mode in modes:
        if mode.kind in ("baseline", "draft") or (mode.kind == "auto" and draft is not None):
            _run_once(engine_factory(mode, target, draft), target, draft, prompt, 8)


def _results(
    target: Model,
    prompts: Sequence[BenchPrompt],
    modes: Sequence[Mode],
    runs: _Runs,
    peer: dict[str, PeerRun],
) -> tuple[Result, ...]:
    live_peer = next((m.name for m in modes if m.kind == "peer"), None)
    out = []
    for p in prompts:
        base = runs.finished[(p.name, "baseline")]
        base_tps = [r.figures.tokens_per_s for r in base]
        peer_tps = (
            [r.figures.tokens_per_s for r in runs.finished[(p.name, live_peer)]]
            if (live_peer)
            else []
        )
        plain_tps = [r.figures.tokens_per_s for r in runs.finished.get((p.name, "peer-plain"), [])]
        for mode in modes:
            records = runs.finished[(p.name, mode.name)]
            figures = tuple(r.figures for r in records)
            tps = [f.tokens_per_s for f in figures]
            peer_run = peer.get(p.name)
            vs_peer: float | None
            peer_figures: tuple[float | None, float | None]
            if live_peer:
                vs_peer = _median_ratio(tps, peer_tps)
                peer_figures = (_median(peer_tps), _median(plain_tps) if plain_tps else None)
            elif peer_run:
                vs_peer = _median(tps) / peer_run.spec_tps if peer_run.spec_tps else None
                peer_figures = (peer_run.spec_tps, peer_run.plain_tps)
            else:
                vs_peer, peer_figures = None, (None, None)
            agreement = (
                None
                if mode.is_peer
                else _agreement(
                    target, runs.prompt_tokens[p.name], base[0].tokens, records[0].tokens
                )
            )
            out.append(
                Result(
                    prompt=p.name,
                    category=p.category,
                    mode=mode.name,
                    tokens=figures[0].tokens,
                    stop_reason=figures[0].stop_reason,
                    tokens_per_s=_median(tps),
                    speedup=_median_ratio(tps, base_tps),
                    acceptance_rate=figures[0].acceptance_rate,
                    mean_accepted_len=figures[0].mean_accepted_len,
                    ttft_s=_median([f.ttft_s for f in figures]),
                    itl_p50_s=_median([f.itl_p50_s for f in figures]),
                    itl_p95_s=_median([f.itl_p95_s for f in figures]),
                    overhead_share=_median([f.overhead_share for f in figures]),
                    agreement=agreement,
                    runs=figures,
                    text=records[0].text,
                    external=mode.is_peer,
                    peer_tokens_per_s=peer_figures[0],
                    peer_plain_tokens_per_s=peer_figures[1],
                    vs_peer=vs_peer,
                )
            )
    return tuple(out)


def _median_ratio(values: Sequence[float], bases: Sequence[float]) -> float:
    """Median over repeats of value ÷ the same repeat's base: side by side."""
    ratios = [v / b for v, b in zip(values, bases, strict=True) if b]
    return _median(ratios)


def _agreement(
    target: Model, prompt: list[int], baseline: Sequence[int], other: Sequence[int]
) -> Agreement:
    i = first_difference(baseline, other)
    if i is None:
        return Agreement(True)
    row = baseline_logits(target, prompt, baseline, i)
    order = np.argsort(row)[::-1]
    taken: int | None
    if i < len(other):
        taken = other[i]
    else:  # `other` ended here: it took an end-of-generation token, the baseline's best one
        taken = next((int(t) for t in order[:64] if target.is_eog(int(t))), None)
    if taken is None:
        return Agreement(False, i)
    rank = int(np.count_nonzero(row > row[taken])) + 1
    return Agreement(False, i, float(row[order[0]] - row[taken]), rank)


def baseline_logits(target: Model, prompt: list[int], baseline: Sequence[int], i: int):
    """The target's logits for the baseline's token i, as plain decoding saw them.

    Scored after the timed runs, not traced during them (tracing costs ~0.5 ms a token
    and would slow the baseline): the context goes in as one batch, then token i-1 alone,
    the one-token pass plain decoding used there (the first token came from the prompt's
    batch, and is re-scored the same way)."""
    context = [*prompt, *baseline[:i]]
    target.reset()
    if i > 0:
        target.evaluate(context[:-1], 0)
    return np.array(target.evaluate(context, 1)[0], dtype=np.float32)


# --- the peer --------------------------------------------------------------------------
def load_peer(path: Path) -> Peer:
    """The JSON that scripts/peer_speculative.sh --out writes."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        runs = {
            name: PeerRun(float(r["plain_tps"]), float(r["spec_tps"]), float(r["acceptance"]))
            for name, r in data["prompts"].items()
        }
        return Peer(str(data.get("peer", "llama.cpp speculative example")), runs)
    except FileNotFoundError:
        raise BenchError(f"peer file not found: {path}") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise BenchError(f"{path}: not a peer_speculative.sh result ({e})") from None


# --- writers ---------------------------------------------------------------------------
def _x(value: float) -> str:
    return f"{value:.2f}×"


def _pct(value: float) -> str:
    return f"{value:.0%}" if value >= 0.1 else f"{value:.1%}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int] = (0,)) -> str:
    """A Markdown table; columns in `left` hold words, the others figures (right-aligned)."""
    align = ["---" if i in left else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def to_markdown(report: Report) -> str:
    """The report as Markdown: the summary first, then per prompt, then every figure."""
    info, modes = report.info, report.info.modes
    cats = report.categories
    peer = info.peer is not None
    head = [
        f"# localspec bench: {info.target}" + (f" + {info.draft}" if info.draft else ""),
        "",
        *(
            ["**Interrupted**: the prompts that completed in every mode.", ""]
            if info.interrupted
            else []
        ),
        f"Greedy, {info.max_tokens} new tokens, {info.threads or 'default'} threads, "
        f"{info.repeats} repeat(s), {len(report.prompts)} prompts; {info.caches}. "
        f"{info.machine} (load {info.load[0]:.1f} at the start, {info.load[1]:.1f} at the "
        f"end); {info.llama_cpp}; {info.started}, {info.duration_s / 60:.1f} min.",
        "",
        *_contention_note(report),
        "## Speedup over baseline (median over prompts)",
    ]
    summary_header = [
        "mode",
        *cats,
        "all",
        "slowest prompt",
        "accept",
        "outside llama.cpp",
        "identical",
    ] + (["vs peer"] if peer else [])
    summary_rows = []
    for s in report.summary():
        row = [
            s.mode,
            *(_x(v) for _, v in s.by_category),
            _x(s.median),
            f"{_x(s.worst)} {s.worst_prompt}",
            _pct(s.acceptance_rate) if s.mode != "peer-plain" else "-",
            f"{_pct(s.overhead_share)} (max {_pct(s.max_overhead_share)})"
            if not s.external
            else "-",
            f"{s.identical}/{s.prompts}" if not s.external else "-",
        ]
        if peer:
            row.append(_x(s.vs_peer) if s.vs_peer is not None else "-")
        summary_rows.append(row)
    base_tps = [report.result(p, "baseline").tokens_per_s for p in report.prompts]

    by_prompt_header = ["prompt", "category", "baseline tok/s", *modes[1:]]
    if peer:
        by_prompt_header += ["peer plain/spec tok/s", "best mode vs peer"]
    by_prompt = []
    for p, tps in zip(report.prompts, base_tps, strict=True):
        rows = [report.result(p, m) for m in modes[1:]]
        line = [p, report.result(p, "baseline").category, f"{tps:.2f}"]
        line += [_x(r.speedup) for r in rows]
        if peer:
            ratios = [r.vs_peer for r in rows if r.vs_peer is not None and not r.external]
            base = report.result(p, "baseline")
            tps_pair = (
                f"{base.peer_plain_tokens_per_s:.2f}/{base.peer_tokens_per_s:.2f}"
                if base.peer_tokens_per_s and base.peer_plain_tokens_per_s
                else "-"
            )
            line += [tps_pair, _x(max(ratios)) if ratios else "-"]
        by_prompt.append(line)

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
    details = [_detail_row(r) for r in report.results]
    parts = [
        "\n".join(head),
        _table(summary_header, summary_rows, left=(0, len(cats) + 2)),
        *_costs_section(info.costs),
        "## By prompt (speedup over baseline)",
        _table(by_prompt_header, by_prompt, left=(0, 1)),
        "## Every figure",
        _table(detail_header, details, left=(0, 1, len(detail_header) - 1)),
        "Speedup: decode tokens/s over the baseline run's, median over repeats. Accept: "
        "accepted / drafted. Mean len: tokens per round, the target's own included. "
        "Outside llama.cpp: the share of round time spent in Python, sampling and "
        "bookkeeping. CPU: the least CPU time a run got, over what its threads asked for "
        f"(under {CONTENDED:.0%}: other work slowed it). "
        "Agreement: greedy output against the baseline's; where they differ, the place of "
        "the token taken in the baseline's own order there and how far its logit trails "
        f"the baseline's choice (under {NEAR_TIE}: a near-tie, kernel numerics, since "
        "batched and one-token passes differ in the last bits)."
        + (f" Peer: {info.peer}." if peer else ""),
    ]
    return "\n\n".join(parts) + "\n"


def _costs_section(costs: Costs | None) -> list[str]:
    """T(k), c and the ceilings they set, where they were measured."""
    if costs is None or not costs.verify_s or costs.verify_s[0] <= 0:
        return []
    t = costs.verify_s
    table = _table(
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
            f"{costs.draft_s / t[0]:.2f} T(1)) {_x(best[1])} at γ {best[0]}"
        )
    if best := costs.ceiling(0.0):
        lines.append(f"n-gram lookup (free) {_x(best[1])} at γ {best[0]}")
    return [
        "## What speculation has to work with",
        "T(k): the target's time to score k tokens in one pass (median of 5, after the "
        "first prompt). A round that drafts γ tokens costs γ·c + T(γ + 1) and yields at "
        "most γ + 1 tokens, so a drafter that is always right could reach at most: "
        + "; ".join(lines)
        + ".",
        table,
    ]


def _contention_note(report: Report) -> list[str]:
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


def _cpu(r: Result) -> str:
    shares = [f.cpu_share for f in r.runs if f.cpu_share is not None]
    return f"{min(shares):.0%}" if shares else "-"


def _detail_row(r: Result) -> list[str]:
    """One run's figures; '-' where a figure means nothing (the baseline's acceptance) or
    is not known (what llama.cpp's binaries do not report)."""
    spec = r.mode != "baseline" and r.mode != "peer-plain"
    own = not r.external
    return [
        r.prompt,
        r.mode,
        f"{r.tokens}",
        f"{r.tokens_per_s:.2f}",
        _x(r.speedup),
        _pct(r.acceptance_rate) if spec else "-",
        f"{r.mean_accepted_len:.2f}" if spec and own else "-",
        f"{r.ttft_s:.2f}",
        f"{r.itl_p50_s * 1e3:.0f}/{r.itl_p95_s * 1e3:.0f}" if own else "-",
        _pct(r.overhead_share) if own else "-",
        _cpu(r),
        r.agreement.label() if r.agreement and r.mode != "baseline" else "-",
    ]


def to_json(report: Report) -> dict:
    """Every figure, every run; summaries alongside."""
    return {
        "info": asdict(report.info),
        "summary": [asdict(s) for s in report.summary()],
        "results": [
            {
                **asdict(r),
                "runs": [{**asdict(f), "overhead_share": f.overhead_share} for f in r.runs],
            }
            for r in report.results
        ],
    }


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
        lo, hi = _spread(report, s.mode)
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


def _spread(report: Report, mode: str) -> tuple[list[float], list[float]]:
    """Per category, then over all: the lowest and highest per-prompt speedup."""
    rows = [r for r in report.results if r.mode == mode]
    groups = [[r.speedup for r in rows if r.category == c] for c in report.categories]
    groups.append([r.speedup for r in rows])
    return [min(g) for g in groups], [max(g) for g in groups]


def write_report(report: Report, out_dir: Path, chart: bool = True) -> tuple[Path, ...]:
    """bench.md, bench.json and bench.png in `out_dir`, each written atomically; returns
    the paths written."""
    md, js, png = out_dir / "bench.md", out_dir / "bench.json", out_dir / "bench.png"
    write_atomic(md, to_markdown(report))
    write_atomic(js, json.dumps(to_json(report), indent=2, ensure_ascii=False))
    if not chart:
        return md, js
    write_atomic(png, chart_png(report))
    return md, js, png


# --- about the machine -----------------------------------------------------------------
def machine_load() -> float:
    """The 1-minute load average (0 where the OS has none): other work on the machine
    slows every mode, unevenly, and makes the ratios noisy."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                cpu,
            )
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, {platform.system()}"


def _llama_cpp_version() -> str:
    try:
        from importlib.metadata import version

        return f"llama-cpp-python {version('llama-cpp-python')}"
    except Exception:
        return "unknown"
