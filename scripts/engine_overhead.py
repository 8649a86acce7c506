#!/usr/bin/env python3
"""What a request costs outside llama.cpp: the app in process (`TestClient`), every
`llama_decode` timed, one request at a time; per request its wall time, its time in
llama.cpp, and the rest (the HTTP app, tokenizing, the rounds' Python). Suites: `fim`
(the fim bench's cases as llama.vim's /infill body, n_predict 64), `json` (the json
bench's six schemas as `response_format` json_schema, greedy, 60 tokens) and `agent` (a
conversation that grows as an agent's does: files of ~19k tokens first, then per turn a
short answer and a tool's result, all of it sent again each time; greedy, 8 tokens; a
32k context, so a target that allows it: scripts/make_tiny_gguf.py with a larger
`n_ctx`). For /infill, also the rest within its decoding: `timings.predicted_ms` (after
the first token) less the one-token passes' time. To compare two versions, run it under
each in turn (PYTHONPATH pointing at the other's copy).

    .venv/bin/python scripts/engine_overhead.py --suite fim --target T.gguf
(docs/bench/fim/README.md and docs/serve.md, 2026-12-02: `--draft none`, both suites;
docs/serve.md, "Long conversations": `--suite agent`, with and without a draft)
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

import localspec.backends.llama as llama
from localspec.backends.llama import LoadOptions
from localspec.bench.fim import cut_cases
from localspec.bench.structured import CASES
from localspec.server.app import ServerOptions, create_app
from localspec.session import SessionConfig, open_session


def requests(suite: str, cases: int) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(name, path, body) of each request."""
    if suite == "fim":
        for case in cut_cases(cases + 1, 0)[1:]:  # the first one warms the server up
            yield case.name, "/infill", case.body(64)
        return
    if suite == "agent":
        yield from agent_turns(cases)
        return
    for name, (prompt, schema) in CASES.items():
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 60}
        yield name, "/v1/chat/completions", {**body, "temperature": 0, "response_format": fmt}


def agent_turns(turns: int) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """An agent's conversation, a turn longer each time; the files are the standard
    library's `json` package, `pstats` and `cProfile` (no one here wrote them)."""
    paths = [*sorted(Path(json.__file__).parent.glob("*.py")), Path(pstats.__file__)]
    sources = [p.read_text() for p in [*paths, Path(cProfile.__file__)]]
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read these files:\n" + "\n".join(sources)},
    ]
    for turn in range(turns):
        body = {"messages": list(messages), "max_tokens": 8, "temperature": 0}
        yield f"turn {turn}", "/v1/chat/completions", body
        messages += [
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": f"Tool result:\n{sources[turn % len(sources)][:1500]}"},
        ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=("fim", "json", "agent"), default="fim")
    p.add_argument("--target", required=True)
    p.add_argument("--draft", default="none")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cases", type=int, default=8, help="fim cases, agent turns")
    args = p.parse_args()
    load = LoadOptions(n_ctx=32768 if args.suite == "agent" else 4096, n_threads=args.threads)
    gamma: int | str = 0 if args.draft == "none" else "auto"
    session = open_session(SessionConfig(args.target, args.draft, gamma, load, load))
    in_llama = one_token = 0.0
    decode = llama.ll.llama_decode

    def timed(ctx: Any, batch: Any) -> int:
        nonlocal in_llama, one_token
        started = time.perf_counter()
        try:
            return decode(ctx, batch)
        finally:
            took = time.perf_counter() - started
            in_llama += took
            one_token += took if batch.n_tokens == 1 else 0.0

    llama.ll.llama_decode = timed
    options = (
        ServerOptions("coder", parallel=1) if args.suite == "agent" else ServerOptions("coder")
    )
    outside = []
    with TestClient(create_app(session, options)) as http:
        warm = cut_cases(1, 0)[0].body(8) if args.suite == "fim" else None
        if warm is not None:
            http.post("/infill", json=warm)
        for name, path, body in requests(args.suite, args.cases):
            in_llama = one_token = 0.0
            started = time.perf_counter()
            reply = http.post(path, json=body)
            wall = time.perf_counter() - started
            reply.raise_for_status()
            line = (
                f"{name[:32]:32} {wall * 1e3:7.0f} ms, in llama.cpp {in_llama * 1e3:7.0f}, "
                f"outside {(wall - in_llama) * 1e3:4.0f}"
            )
            if timings := reply.json().get("timings"):
                line += f", of it in the decoding {timings['predicted_ms'] - one_token * 1e3:4.0f}"
            print(line, flush=True)
            outside.append(wall - in_llama)
    session.close()
    if len(outside) > 1:  # the first read the agent's files
        median = statistics.median(outside[1:]) * 1e3
        print(f"outside llama.cpp, median after the first: {median:.1f} ms")


if __name__ == "__main__":
    main()
