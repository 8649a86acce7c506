#!/usr/bin/env python3
"""Two or more OpenAI-compatible servers side by side, in rotated rounds.

One run of each server (`serve_bench.py`) cannot tell a few percent from this shared
machine's drift. Here each round starts every server in turn (the order rotated, so none
always meets the same neighbour's leftovers), streams the same prompts (greedy, the bench's
suite spread over its categories), and stops it; a prompt's figure is the median over the
rounds of its client-side tok/s (tokens after the first over the time after it), and each
pair of servers is compared prompt for prompt.

    scripts/serve_ab.py --rounds 3 --prompts 9 \\
        --server "new=.venv/bin/localspec serve -t T.gguf -d D.gguf --threads 2 --port {port}" \\
        --server "plain=.venv/bin/localspec serve -t T.gguf --draft none --threads 2 --port {port}"

`{port}` is filled with a free loopback port. To set an older checkout beside this one,
run it from its tree: `--server "old=env PYTHONPATH=/path/to/checkout .venv/bin/python -m
localspec serve ..."`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from serve_bench import free_port, server  # same directory: the bench's server lifecycle

ROOT = Path(__file__).resolve().parent.parent


def spread(prompts: list[str], n: int) -> list[str]:
    """n prompts taken evenly over the suite (it is ordered by category)."""
    return prompts[:: max(1, len(prompts) // n)][:n]


def tokens_per_s(base: str, model: str, prompt: str, max_tokens: int) -> float:
    """Streamed greedy answer: completion tokens (from usage) after the first, over the
    time from the first content chunk to the last."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = last = None
    chunks = tokens = 0
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if (data.get("usage") or {}).get("completion_tokens"):
                tokens = data["usage"]["completion_tokens"]
            if data.get("choices") and data["choices"][0].get("delta", {}).get("content"):
                last = time.perf_counter()
                first = first or last
                chunks += 1
    if first is None or last is None or last == first:
        return 0.0
    return ((tokens or chunks) - 1) / (last - first)


def run_round(command: str, prompts: list[str], max_tokens: int, log: Path) -> list[float]:
    port = free_port()
    with server(shlex.split(command.format(port=port)), port, log) as v1:
        base = v1.removesuffix("/v1")
        model = httpx.get(f"{v1}/models").json()["data"][0]["id"]
        tokens_per_s(base, model, "Say hello.", 16)  # warm-up
        return [tokens_per_s(base, model, p, max_tokens) for p in prompts]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", action="append", required=True, metavar="NAME=COMMAND")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=9, help="spread over the bench's suite")
    p.add_argument("--max-tokens", type=int, default=128)
    args = p.parse_args()
    servers = dict(s.split("=", 1) for s in args.server)
    if len(servers) < 2:
        p.error("give at least two --server NAME=COMMAND")
    suite = json.loads((ROOT / "localspec/data/bench_prompts.json").read_text())
    prompts = spread([v["prompt"] for v in suite.values()], args.prompts)
    names = list(servers)
    os.chdir(ROOT)  # commands may name .venv/bin/... and scripts/... relative to the repo
    logs = Path(tempfile.mkdtemp(prefix="serve_ab-"))  # each server's output, if it fails
    speeds: dict[str, list[list[float]]] = {n: [[] for _ in prompts] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            log = logs / f"{name}.log"
            for i, s in enumerate(run_round(servers[name], prompts, args.max_tokens, log)):
                speeds[name][i].append(s)
            row = " ".join(f"{s[-1]:5.1f}" for s in speeds[name])
            print(f"round {r + 1} {name:>12}: {row} tok/s", flush=True)
    print("\n| tok/s of | over | median | worst | prompts |\n|---|---|---:|---:|---:|")
    for a, b in itertools.combinations(names, 2):
        ratios = [
            statistics.median(x) / statistics.median(y)
            for x, y in zip(speeds[a], speeds[b], strict=True)
            if statistics.median(y) > 0
        ]
        print(
            f"| {a} | {b} | {statistics.median(ratios):.3f}x | {min(ratios):.3f}x | {len(ratios)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
