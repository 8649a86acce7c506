#!/usr/bin/env python3
"""What an agent's request costs outside llama.cpp: a conversation that grows as an
agent's does (a long first prompt of files, then a short answer and a tool's result per
turn, the whole conversation sent again each time), through the app in process
(`TestClient`), one slot, greedy; per request its wall time, its time in `llama_decode`
and the rest (reading the JSON, the chat template, tokenizing, the rounds' Python). The
files are the standard library's `json` package, `pstats` and `cProfile`: ~19k tokens.

    .venv/bin/python scripts/agent_overhead.py --target T.gguf [--draft D.gguf]

A 32k-context target makes the prompt fit (scripts/make_tiny_gguf.py builds tiny ones
with the real Qwen2 vocabulary; raise its `n_ctx`). To compare two versions, run it
under each in turn (PYTHONPATH pointing at the other's copy). docs/serve.md, "Long
conversations", has the figures.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

import localspec.backends.llama as llama
from localspec.backends.llama import LoadOptions
from localspec.server.app import ServerOptions, create_app
from localspec.session import SessionConfig, open_session


def files() -> list[str]:
    """Source files no one here wrote, the same on every machine with this Python."""
    paths = sorted(Path(json.__file__).parent.glob("*.py"))
    return [p.read_text() for p in [*paths, Path(pstats.__file__), Path(cProfile.__file__)]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", default="none")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=8, help="per answer")
    args = p.parse_args()
    load = LoadOptions(n_ctx=32768, n_threads=args.threads)
    gamma: int | str = 0 if args.draft == "none" else "auto"
    session = open_session(SessionConfig(args.target, args.draft, gamma, load, load))
    in_llama = 0.0
    decode = llama.ll.llama_decode

    def timed(ctx: Any, batch: Any) -> int:
        nonlocal in_llama
        started = time.perf_counter()
        try:
            return decode(ctx, batch)
        finally:
            in_llama += time.perf_counter() - started

    llama.ll.llama_decode = timed
    sources = files()
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read these files:\n" + "\n".join(sources)},
    ]
    outside = []
    with TestClient(create_app(session, ServerOptions("coder", parallel=1))) as http:
        for turn in range(args.turns):
            in_llama = 0.0
            body = {"messages": messages, "max_tokens": args.max_tokens, "temperature": 0}
            started = time.perf_counter()
            reply = http.post("/v1/chat/completions", json=body)
            wall = time.perf_counter() - started
            reply.raise_for_status()
            answer = reply.json()
            rest = wall - in_llama
            if turn:
                outside.append(rest)
            print(
                f"turn {turn}: prompt {answer['usage']['prompt_tokens']} tokens, "
                f"{wall * 1e3:6.0f} ms, in llama.cpp {in_llama * 1e3:6.0f}, "
                f"outside {rest * 1e3:4.0f}",
                flush=True,
            )
            messages += [
                {"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
                {"role": "user", "content": f"Tool result:\n{sources[turn % len(sources)][:1500]}"},
            ]
    session.close()
    median = statistics.median(outside) * 1e3
    print(f"outside llama.cpp after the first turn, median: {median:.1f} ms")


if __name__ == "__main__":
    main()
