#!/usr/bin/env python3
"""A fresh `auto` against one started from the last engine's timings, in process.

For each of the bench's prompts (greedy, 128 tokens): plain decoding, then a fresh `auto`
engine, then another fresh one seeded with the first's T(k) and draft step, as a new
session's is from calibration.json (localspec/calibrate.py). Prints each run's decode
tok/s and the medians of auto over plain, fresh and seeded:

    .venv/bin/python scripts/seeded_auto.py TARGET.gguf DRAFT.gguf --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from localspec.backends.llama import LoadOptions
from localspec.decoding.adaptive import AdaptiveDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished
from localspec.decoding.sampling import SamplingParams
from localspec.session import Session, SessionConfig, make_engine, open_session

PROMPTS = Path(__file__).parent.parent / "localspec" / "data" / "bench_prompts.json"


def decode_rate(session: Session, engine: Engine, prompt: str) -> float:
    """Tokens a second after the first, both caches cleared first (as the bench's runs)."""
    session.target.reset()
    if session.draft_model is not None:
        session.draft_model.reset()
    tokens = session.render([{"role": "user", "content": prompt}])
    config = GenerationConfig(128, SamplingParams(temperature=0))
    (done,) = [e for e in engine.generate(tokens, config) if isinstance(e, Finished)]
    return done.stats.tokens / (done.stats.elapsed_s - done.stats.ttft_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=9, help="the first N of the bench's")
    args = parser.parse_args()
    load = LoadOptions(n_ctx=4096, n_threads=2, prompt_reader=True)
    config = SessionConfig(args.target, args.draft, "auto", load, LoadOptions(4096, n_threads=2))
    session = open_session(config)
    plain = make_engine(session.target, None, SessionConfig(args.target, "none", "auto"))
    listed = json.loads(PROMPTS.read_text())
    prompts = {name: listed[name]["prompt"] for name in list(listed)[: args.prompts]}
    ratios: dict[str, list[float]] = {"fresh": [], "seeded": []}
    for _ in range(args.repeats):
        for name, prompt in prompts.items():
            base = decode_rate(session, plain, prompt)
            fresh = make_engine(session.target, session.draft_model, config)
            rate = {"fresh": decode_rate(session, fresh, prompt)}
            seeded = make_engine(session.target, session.draft_model, config)
            timed, seed = fresh.drafter, seeded.drafter
            assert isinstance(timed, AdaptiveDrafter) and isinstance(seed, AdaptiveDrafter)
            seed.verify.seed(dict(timed.verify.seconds))
            if timed.model is not None and seed.model is not None:
                seed.model.step_s, seed.model.catchup_s = timed.model.step_s, timed.model.catchup_s
            rate["seeded"] = decode_rate(session, seeded, prompt)
            for kind, value in rate.items():
                ratios[kind].append(value / base)
            runs = "  ".join(f"{kind} {value:.1f}" for kind, value in rate.items())
            print(f"{name:<24} plain {base:.1f}  {runs}")
    for kind, values in ratios.items():
        median = statistics.median(values)
        print(f"auto {kind} / plain, median over {len(values)} runs: {median:.3f}")
    session.close()


if __name__ == "__main__":
    main()
