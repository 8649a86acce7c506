#!/usr/bin/env python3
"""What a request costs outside llama.cpp: the app in process (`TestClient`), every
`llama_decode` timed, one request at a time; per request its wall time, its time in
llama.cpp, and the rest (the HTTP app, tokenizing, the rounds' Python). Suites: `fim`
(the fim bench's cases as llama.vim's /infill body, n_predict 64) and `json` (the json
bench's six schemas as `response_format` json_schema, greedy, 60 tokens). For /infill, also
the rest within its decoding: `timings.predicted_ms` (after the first token) less the
one-token passes' time. To compare two
versions, run it under each in turn (PYTHONPATH pointing at the other's copy).

    .venv/bin/python scripts/engine_overhead.py --suite fim --target T.gguf
(docs/bench/fim/README.md and docs/serve.md, 2026-12-02: `--draft none`, both suites)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
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
    for name, (prompt, schema) in CASES.items():
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 60}
        yield name, "/v1/chat/completions", {**body, "temperature": 0, "response_format": fmt}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=("fim", "json"), default="fim")
    p.add_argument("--target", required=True)
    p.add_argument("--draft", default="none")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cases", type=int, default=8, help="fim cases")
    args = p.parse_args()
    load = LoadOptions(n_ctx=4096, n_threads=args.threads)
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
    with TestClient(create_app(session, ServerOptions("coder"))) as http:
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
    session.close()


if __name__ == "__main__":
    main()
