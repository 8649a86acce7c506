#!/usr/bin/env python3
"""`auto` with the target's MTP head on this machine, its costs booked as another's.

The decisions `auto` makes depend on the costs it measures (T(k), the head's c), not on
where they come from. This runs the real engine on a real model (a twin with an MTP head,
scripts/make_twin_gguf.py) but books each target pass as `--t1-ms` + `--per-token-ms` a
token more, and each head step as `--c-ms`: what a GPU would report, on a CPU. Prints,
per prompt, the rounds that drafted out of all rounds.

    python scripts/booked_auto.py TWIN.gguf --t1-ms 1.6 --per-token-ms 0.15 --c-ms 0.8
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import localspec.backends.llama as llama
import localspec.backends.mtp as mtp
from localspec.backends.llama import LoadOptions
from localspec.decoding.engine import GenerationConfig
from localspec.decoding.events import RoundEnd
from localspec.session import SessionConfig, open_session

PROMPTS = ("def fib(n):\n", "Explain TCP vs UDP.")


def book(t1_s: float, per_token_s: float, c_s: float) -> None:
    """Replace the measured times with the booked ones."""

    def busy_since(self: llama.LlamaModel, started: float) -> float:
        tokens = max(self._last_pass.values() or [1])
        return t1_s + per_token_s * (tokens - 1)

    step = mtp.MtpHead.step

    def booked_step(
        self: mtp.MtpHead, entries: Sequence[tuple[int, int, np.ndarray]]
    ) -> tuple[np.ndarray, np.ndarray]:
        busy = self.busy_s
        out = step(self, entries)
        self.busy_s = busy + c_s
        return out

    llama.LlamaModel._busy_since = busy_since  # type: ignore[method-assign,assignment]
    mtp.MtpHead.step = booked_step  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="a GGUF with an MTP head")
    parser.add_argument("--t1-ms", type=float, default=1.6)
    parser.add_argument("--per-token-ms", type=float, default=0.15)
    parser.add_argument("--c-ms", type=float, default=0.8)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args(argv)
    book(args.t1_ms / 1e3, args.per_token_ms / 1e3, args.c_ms / 1e3)
    load = LoadOptions(n_ctx=1024, n_threads=2)
    session = open_session(SessionConfig(str(args.target), "mtp", "auto", target_load=load))
    try:
        for text in PROMPTS:
            events = session.engine.generate(
                session.target.tokenize(text), GenerationConfig(args.tokens)
            )
            rounds = [e for e in events if isinstance(e, RoundEnd)]
            drafted = sum(e.drafter != "none" for e in rounds)
            print(f"{text!r}: {drafted} of {len(rounds)} rounds drafted (c {args.c_ms} ms)")
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
