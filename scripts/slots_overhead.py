#!/usr/bin/env python3
"""Four slots (--slots; --clients prompts at once) of serve's `Worker` in-process: tok/s of one
batch of fresh chat prompts, with a cache per slot or one shared (`kv_unified`), plainly
or with `--gamma auto` or a fixed γ; the share of the wall time spent in llama.cpp's
passes; and what a round cost as it ran (draft passes before each target pass).

    .venv/bin/python scripts/slots_overhead.py --target T.gguf --draft D.gguf \\
        --mode auto --cache shared
    # the bench's chat prompts, four a round as serve_bench's clients suite sends them
    ... --bench-round 1 --tokens 128 --ctx 16384
    # Spec-Bench's first turns, one of each category (seed 0), the Rth four
    ... --specbench 0 --tokens 128 --ctx 16384
(docs/bench/serve/2026-11-27-clients: the F16 target, 96 tokens; each mode once, then
three rounds of the modes in turn)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from pathlib import Path

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.bench import specbench
from localspec.decoding.engine import GenerationConfig
from localspec.decoding.events import Finished
from localspec.decoding.sampling import SamplingParams
from localspec.server.batching import PassRecord
from localspec.server.jobs import Failed, Job
from localspec.server.scheduling import ROUND_TOKENS
from localspec.server.worker import Worker
from localspec.session import SessionConfig, open_session

WARM = [  # read first, so that the measured batch starts warm but on other prompts
    "Write a C function that reverses a linked list.",
    "What is a monad? Briefly.",
    "Write a SQL query for the top 5 customers by revenue.",
    "Describe the water cycle.",
]
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain how a hash map handles collisions, in detail.",
    "Write a bash script that renames all .txt files to .md.",
    "In a few paragraphs: why do cats purr?",
]


def bench_round(r: int) -> list[str]:
    """The bench's chat prompts of round r, as scripts/serve_bench.py's clients suite
    sends them, four at once."""
    data = Path(__file__).parent.parent / "localspec/data/bench_prompts.json"
    prompts = [p["prompt"] for p in json.loads(data.read_text()).values()]
    return prompts[4 * r : 4 * r + 4]


def print_rounds(records: list[PassRecord], target: str) -> None:
    """The target's passes of rounds alone (no prompt's chunk), by whether a slot in
    them drafted, and the draft model's passes before each: what a drafted round costs
    as it ran, against what `auto` priced (`Load.depth`: d steps of one token a
    drafting slot, then one pass of every slot's round)."""
    before: list[PassRecord] = []
    rounds: dict[bool, list[tuple[list[PassRecord], PassRecord]]] = {True: [], False: []}
    for r in records:
        if r.model != target:
            before.append(r)
            continue
        if max(r.reads.values()) <= ROUND_TOKENS:
            rounds[sum(r.reads.values()) > len(r.reads)].append((before, r))
        before = []
    for drafted, rs in rounds.items():
        if not rs:
            continue
        steps = [d for d, _ in rs]
        mean = statistics.mean
        slots = mean(len(t.reads) for _, t in rs)
        tokens = mean(sum(t.reads.values()) for _, t in rs)
        print(
            f"  {'drafted' if drafted else 'plain'} rounds: {len(rs)} target passes of "
            f"{slots:.2f} slots, {tokens:.2f} tokens, "
            f"{mean(t.seconds for _, t in rs) * 1e3:.0f} ms; before each "
            f"{mean(len(d) for d in steps):.2f} draft passes, "
            f"{mean(sum(x.seconds for x in d) for d in steps) * 1e3:.0f} ms"
        )
        if drafts := [x for d in steps for x in d]:
            print(
                f"    a draft pass: {mean(len(x.reads) for x in drafts):.2f} slots, "
                f"{mean(sum(x.reads.values()) for x in drafts):.2f} tokens, "
                f"{mean(x.seconds for x in drafts) * 1e3:.0f} ms"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--mode", default="auto", help="plain, auto, or a fixed γ with the draft model")
    p.add_argument("--cache", choices=["per-slot", "shared"], default="shared")
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=2048, help="tokens of cache, for all slots")
    p.add_argument(
        "--bench-round", type=int, help="the bench's chat prompts 4R..4R+3, not our four"
    )
    p.add_argument("--specbench", type=int, help="Spec-Bench's first turns 4R..4R+3")
    p.add_argument("--clients", type=int, default=4, help="prompts at once")
    p.add_argument("--slots", type=int, help="slots (default: --clients)")
    p.add_argument(
        "--warm",
        choices=["four", "one"],
        default="four",
        help="before the measured batch: four other prompts at once, or one 8-token "
        "answer alone (serve_bench's warm-up)",
    )
    args = p.parse_args()
    slots = args.slots or args.clients
    load = LoadOptions(
        n_ctx=args.ctx,
        n_threads=args.threads,
        n_seq=slots,
        kv_unified=args.cache == "shared",
    )
    plain = args.mode == "plain"
    gamma: int | str = 0 if plain else args.mode if args.mode == "auto" else int(args.mode)
    config = SessionConfig(args.target, "none" if plain else args.draft, gamma, load, load)
    session = open_session(config)
    worker = Worker(session, max_queue=8, parallel=slots)
    worker.start()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def answer(prompts: list[str], tokens: int = args.tokens) -> list[Finished]:
        jobs = [
            Job(
                "bench",
                session.render([{"role": "user", "content": text}]),
                GenerationConfig(tokens, SamplingParams(temperature=0)),
                loop,
            )
            for text in prompts
        ]
        for job in jobs:
            worker.submit(job)

        async def end(job: Job) -> Finished:
            async for event in job.events():
                if isinstance(event, Failed):
                    raise SystemExit(f"failed: {event}")
                if isinstance(event, Finished):
                    return event
            raise SystemExit("no end")

        return [asyncio.run_coroutine_threadsafe(end(j), loop).result(600) for j in jobs]

    if args.warm == "one":
        answer(WARM[:1], 8)
        while worker.depth() or worker.reading_ahead():  # as serve_bench waits (settle)
            time.sleep(0.01)
    else:
        answer(WARM[: args.clients])
    log = worker.batcher.log
    log.recent = type(log.recent)(maxlen=1 << 16)
    steps, seconds, started = log.steps, log.seconds, time.perf_counter()
    if args.specbench is not None:
        questions = specbench.load_sample(None, specbench.Sample(per_category=1))
        prompts = [q.prompt for q in questions[4 * args.specbench : 4 * args.specbench + 4]]
    else:
        prompts = PROMPTS if args.bench_round is None else bench_round(args.bench_round)
    ends = answer(prompts[: args.clients])
    wall = time.perf_counter() - started
    tokens = sum(e.stats.tokens for e in ends)
    print(
        f"{args.mode}, {args.cache} cache: {tokens / wall:.2f} tok/s (prompts read "
        f"included), {wall:.1f} s, {log.steps - steps} steps, "
        f"{(log.seconds - seconds) / wall:.0%} of it in llama.cpp's passes"
    )
    for name in dict.fromkeys(r.model for r in log.recent):
        mine = [r for r in log.recent if r.model == name]
        read = sum(sum(r.reads.values()) for r in mine)
        took = sum(r.seconds for r in mine)
        print(f"  {name}: {len(mine)} passes, {read} tokens, {took:.1f} s ({took / wall:.0%})")
    for e in ends:
        s = e.stats
        print(
            f"  {s.tokens} tokens, {s.rounds} rounds, drafted {s.drafted}, "
            f"accepted {s.accepted}, TTFT {s.ttft_s:.2f} s"
        )
    assert isinstance(session.target, LlamaModel)
    passes = worker.batcher.passes(session.target)
    times = ", ".join(f"{k}: {t * 1000:.0f}" for k, t in sorted(passes.seconds.items()))
    print(f"  the target's shared passes, ms by tokens in the pass: {times}")
    print_rounds(list(log.recent), session.target.name)
    worker.stop()
    session.close()


if __name__ == "__main__":
    main()
