"""`localspec bench`'s run loop: every decoding mode on the same loaded models, side by side.

Runs are interleaved prompt by prompt (for each repeat, for each prompt, every mode in
turn) in one process on the same two loaded models, greedy, so each speedup is the ratio
of two runs made seconds apart on the same weights, threads and machine state. Every run
starts cold, as `localspec run` does: both KV caches are cleared, the prompt is prefilled,
and the engine is built fresh (an adaptive drafter starts from its priors). The prompt's
tokens are rendered once, through the target's chat template, and shared by every mode.
Where a mode's answer differs from the baseline's, the audit (`localspec.bench.audit`)
says whether kernel numerics explain it. The result is a `Report` (results.py).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from localspec.backends.base import Model
from localspec.bench.audit import DraftLog, Trace, audit, rounds_of
from localspec.bench.costs import measure_costs, median
from localspec.bench.machine import CpuClock, describe_machine, llama_cpp_version, machine_load
from localspec.bench.modes import EngineFactory, Mode, build_engine, peer_command
from localspec.bench.peer import LlamaCppPeer, Peer, PeerRun
from localspec.bench.results import Agreement, BenchInfo, Report, Result, RunFigures, median_ratio
from localspec.bench.suite import BenchError, BenchPrompt
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished, RoundEnd
from localspec.decoding.sampling import SamplingParams
from localspec.session import Session, _formatter


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
class Record:
    """One run: its figures and, for localspec's own modes, its answer and how the
    target scored it (for the audit)."""

    figures: RunFigures
    trace: Trace | None = None
    text: str = ""


@dataclass
class Runs:
    """Every run, by (prompt, mode), in repeat order; each prompt's tokens and text."""

    finished: dict[tuple[str, str], list[Record]] = field(default_factory=dict)
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
    peer_bin: LlamaCppPeer | None = None,
    suite: str | None = None,
    placement: str | None = None,
) -> Report:
    """Run every mode on every prompt, `config.repeats` times, interleaved; `suite`
    names the prompts in the report (None: a prompts file), `placement` where the target
    ran when not all on this machine."""
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
            "run live, side by side: " + ", ".join(peer_command(m) for m in modes if m.is_peer),
            {},
        )
    session = Session(Engine(target, NoDrafter(), 0))
    runs = Runs()
    for p in prompts:
        runs.prompt_tokens[p.name] = session.render([{"role": "user", "content": p.prompt}])
        if live_peer:
            runs.prompt_text[p.name] = render_text(target, p.prompt)
    if config.warmup:
        warm_up(target, draft, runs.prompt_tokens[prompts[0].name], engine_factory, modes)
    costs = (
        measure_costs(target, draft, runs.prompt_tokens[prompts[0].name]) if config.costs else None
    )

    interrupted = False
    try:
        # the CPU share says whether a run had the CPU to itself; with the target on
        # rpc-servers its work is in their processes, which it cannot see
        clock_threads = threads if placement is None else 0
        measure(
            target, draft, prompts, modes, config, runs, engine_factory, progress, peer_bin,
            clock_threads,
        )  # fmt: skip
    except KeyboardInterrupt:
        # keep what is complete: a long run stopped early still reports
        interrupted = True
        prompts = runs.complete(prompts, modes)
        if not prompts:
            raise
    results = collect_results(target, prompts, modes, runs, peer.runs if peer else {})
    info = BenchInfo(
        target=target.name,
        draft=draft.name if draft is not None else None,
        modes=tuple(m.name for m in modes),
        max_tokens=config.max_tokens,
        repeats=config.repeats,
        threads=threads,
        started=started.isoformat(timespec="seconds"),
        duration_s=time.perf_counter() - clock,
        machine=describe_machine(),
        llama_cpp=llama_cpp_version(),
        peer=peer.name if peer else None,
        load=(load, machine_load()),
        interrupted=interrupted,
        costs=costs,
        suite=suite,
        placement=placement,
    )
    return Report(info, results)


def measure(
    target: Model,
    draft: Model | None,
    prompts: Sequence[BenchPrompt],
    modes: Sequence[Mode],
    config: BenchConfig,
    runs: Runs,
    engine_factory: EngineFactory,
    progress: Callable[[Progress], None] | None,
    peer_bin: LlamaCppPeer | None = None,
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
                cpu = CpuClock(threads)
                if mode.is_peer:
                    assert peer_bin is not None  # run_bench checked
                    record = run_peer(peer_bin, mode, runs.prompt_text[p.name], config)
                else:
                    engine = engine_factory(mode, target, draft)
                    record = run_once(
                        engine, target, draft, runs.prompt_tokens[p.name], config.max_tokens
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


def run_once(
    engine: Engine, target: Model, draft: Model | None, prompt: list[int], max_tokens: int
) -> Record:
    """One cold, greedy, untraced generation, and the record the audit replays: each
    round's draft (noted by a DraftLog around the drafter) and its RoundEnd."""
    target.reset()
    if draft is not None:
        draft.reset()
    engine.drafter = log = DraftLog(engine.drafter)
    gc.collect()  # a collection mid-run would be timed as engine overhead
    config = GenerationConfig(max_tokens=max_tokens, sampling=SamplingParams(temperature=0))
    finished, ends = None, []
    for event in engine.generate(prompt, config):
        if isinstance(event, RoundEnd):
            ends.append(event)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None  # generate() always ends with Finished
    rounds = rounds_of(len(prompt), ends, log.drafts)
    trace = Trace(tuple(prompt), finished.tokens, finished.stop_reason, rounds)
    return Record(RunFigures.from_finished(finished), trace, finished.text)


def run_peer(peer_bin: LlamaCppPeer, mode: Mode, prompt_text: str, config: BenchConfig) -> Record:
    if mode.kind == "peer":
        figures = peer_bin.speculative(prompt_text, config.max_tokens, mode.gamma)
    else:
        figures = peer_bin.plain(prompt_text, config.max_tokens)
    return Record(RunFigures.from_peer(figures))


def render_text(target: Model, prompt: str) -> str:
    """The prompt as text through the target's chat template, special tokens written
    out: what localspec tokenizes, for the peer binaries to tokenize the same way."""
    render = _formatter(target)
    return render(messages=[{"role": "user", "content": prompt}]).prompt  # type: ignore[operator]


def warm_up(
    target: Model,
    draft: Model | None,
    prompt: list[int],
    engine_factory: EngineFactory,
    modes: Sequence[Mode],
) -> None:
    """Untimed: the first passes after loading page the weights in and allocate buffers,
    which would be charged to whichever mode ran first."""
    for mode in modes:
        if mode.kind in ("baseline", "draft") or (mode.kind == "auto" and draft is not None):
            run_once(engine_factory(mode, target, draft), target, draft, prompt, 8)


def collect_results(
    target: Model,
    prompts: Sequence[BenchPrompt],
    modes: Sequence[Mode],
    runs: Runs,
    peer: dict[str, PeerRun],
) -> tuple[Result, ...]:
    """Per prompt and mode: medians over the repeats, ratios to the same repeat's
    baseline and peer runs, and the first run's answer audited against the baseline's."""
    live_peer = next((m.name for m in modes if m.kind == "peer"), None)
    out = []
    for p in prompts:
        base = runs.finished[(p.name, "baseline")]
        base_tps = [r.figures.tokens_per_s for r in base]
        base_latency = [r.figures.last_token_s for r in base]
        peer_tps = (
            [r.figures.tokens_per_s for r in runs.finished[(p.name, live_peer)]]
            if live_peer
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
                vs_peer = median_ratio(tps, peer_tps)
                peer_figures = (median(peer_tps), median(plain_tps) if plain_tps else None)
            elif peer_run:
                vs_peer = median(tps) / peer_run.spec_tps if peer_run.spec_tps else None
                peer_figures = (peer_run.spec_tps, peer_run.plain_tps)
            else:
                vs_peer, peer_figures = None, (None, None)
            out.append(
                Result(
                    prompt=p.name,
                    category=p.category,
                    mode=mode.name,
                    tokens=figures[0].tokens,
                    stop_reason=figures[0].stop_reason,
                    tokens_per_s=median(tps),
                    speedup=median_ratio(tps, base_tps),
                    acceptance_rate=figures[0].acceptance_rate,
                    mean_accepted_len=figures[0].mean_accepted_len,
                    ttft_s=median([f.ttft_s for f in figures]),
                    itl_p50_s=median([f.itl_p50_s for f in figures]),
                    itl_p95_s=median([f.itl_p95_s for f in figures]),
                    overhead_share=median([f.overhead_share for f in figures]),
                    agreement=agreement(target, base[0], records[0]),
                    runs=figures,
                    text=records[0].text,
                    external=mode.is_peer,
                    peer_tokens_per_s=peer_figures[0],
                    peer_plain_tokens_per_s=peer_figures[1],
                    vs_peer=vs_peer,
                    # a time, so the ratio is inverted: the baseline's ÷ this run's
                    latency_speedup=median_ratio(base_latency, [f.last_token_s for f in figures]),
                )
            )
    return tuple(out)


def agreement(target: Model, baseline: Record, other: Record) -> Agreement | None:
    """The other run's answer against the baseline's (None for a peer's: not seen)."""
    if baseline.trace is None or other.trace is None:
        return None
    divergence = audit(target, baseline.trace, other.trace)
    return Agreement(divergence is None, divergence)
