#!/usr/bin/env python3
"""OpenAI's `n` against llama-server's: four sampled answers to one prompt of a few
hundred tokens, asked as one request with n 4 and as four requests at once, of
`localspec serve --draft none --parallel 4` and `llama-server -np 4` (both decoding
plainly, so that they differ in how they serve the four answers). Each try's prompt is
new (a number in front), so no server finds it cached; the servers take turns. Wall time
until every answer is in, median over --reps, and the ratios.

    .venv/bin/python scripts/choices_bench.py --target T.gguf
(docs/bench/serve/2026-12-03-moves: the 1.5B Q4_K_M target, 2 cores)
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import serve_bench as sb

CODE = inspect.getsource(textwrap.TextWrapper._wrap_chunks)[:2200]  # not ours: ~550 tokens


def ask(base: str, prompt: str, n: int, max_tokens: int) -> int:
    """One chat request for n sampled answers; the answers' tokens."""
    body = {
        "model": "any",
        "messages": [{"role": "user", "content": prompt}],
        "n": n,
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "seed": 1,
    }
    r = httpx.post(f"{base}/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    answer = r.json()
    assert len(answer["choices"]) == n, answer
    return int(answer["usage"]["completion_tokens"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=2048, help="tokens per slot")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--logs", type=Path, default=Path("choices-bench-logs"))
    a = p.parse_args()
    commands, ports = sb.plain_pair(a.target, a.threads, a.ctx)
    a.logs.mkdir(parents=True, exist_ok=True)
    walls: dict[tuple[str, str], list[float]] = {}
    tries = 0
    with sb.servers(commands, ports, a.logs, "choices") as bases:
        for rep in range(a.reps):
            names = list(bases) if rep % 2 == 0 else list(bases)[::-1]
            for name in names:
                for mode in ("n 4", "4 requests"):
                    tries += 1
                    prompt = f"({tries}) What does this function do? One sentence.\n\n{CODE}"
                    started = time.perf_counter()
                    if mode == "n 4":
                        tokens = ask(bases[name], prompt, 4, a.max_tokens)
                    else:
                        with ThreadPoolExecutor(4) as pool:
                            asks = [(bases[name], prompt, 1, a.max_tokens)] * 4
                            tokens = sum(pool.map(lambda x: ask(*x), asks))
                    wall = time.perf_counter() - started
                    sb.settle(bases[name])
                    walls.setdefault((name, mode), []).append(wall)
                    print(f"rep {rep} {name:12} {mode:10} {wall:6.1f} s, {tokens} tokens")
    print()
    for (name, mode), times in walls.items():
        print(f"{name:12} {mode:10} median {statistics.median(times):6.1f} s")
    ours, theirs = walls["localspec", "n 4"], walls["llama-server", "n 4"]
    ratios = [x / y for x, y in zip(ours, theirs, strict=True)]
    print(
        "localspec n 4 over llama-server n 4, rep for rep:", " ".join(f"{r:.2f}x" for r in ratios)
    )
    alone = [x / y for x, y in zip(ours, walls["localspec", "4 requests"], strict=True)]
    print("localspec n 4 over its 4 requests:", " ".join(f"{r:.2f}x" for r in alone))


if __name__ == "__main__":
    main()
