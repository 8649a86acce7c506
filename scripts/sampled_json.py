#!/usr/bin/env python3
"""Sampled structured output in process: tok/s of the json bench's six schemas, sampled
at OpenAI's defaults (temperature 1, top_k 40, min_p 0.05), with no drafter but the
grammar's forced tokens (`--mode none`) or with `--gamma auto`. To compare two versions
of localspec, run it under each in turn (PYTHONPATH pointing at the other's copy):

    .venv/bin/python scripts/sampled_json.py --target T.gguf --draft D.gguf --mode auto
(docs/serve.md's figures: the Q4_K_M pair, 80 tokens, each mode under both versions in
turn, twice)
"""

from __future__ import annotations

import argparse
import statistics
import time

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.backends.llama_grammar import schema_grammar
from localspec.bench.structured import CASES
from localspec.decoding.engine import GenerationConfig
from localspec.decoding.events import Finished
from localspec.decoding.sampling import SamplingParams
from localspec.server.fence import chat_grammar
from localspec.session import SessionConfig, open_session


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--mode", choices=("none", "auto"), default="auto")
    p.add_argument("--max-tokens", type=int, default=80)
    p.add_argument("--temperature", type=float, default=1.0)
    args = p.parse_args()
    load = LoadOptions(n_ctx=2048, n_threads=2)
    auto = args.mode == "auto"
    config = SessionConfig(
        args.target, args.draft if auto else "none", "auto" if auto else 4, load, load
    )
    session = open_session(config)
    params = SamplingParams(temperature=args.temperature, top_k=40, top_p=1.0, min_p=0.05, seed=1)
    target = session.target
    assert isinstance(target, LlamaModel)
    rates = []
    for name, (prompt, schema) in CASES.items():
        grammar = chat_grammar(target, schema_grammar(schema))
        gen = GenerationConfig(max_tokens=args.max_tokens, sampling=params, grammar=grammar)
        first, tokens = None, 0
        for event in session.chat([{"role": "user", "content": prompt}], gen):
            first = first or time.perf_counter()
            if isinstance(event, Finished):
                tokens = len(event.tokens)
        assert first is not None
        rates.append(tokens / (time.perf_counter() - first))
        print(f"{name}: {tokens} tokens, {rates[-1]:.2f} tok/s", flush=True)
    print(f"{args.mode}: median {statistics.median(rates):.2f} tok/s")
    session.close()


if __name__ == "__main__":
    main()
