#!/usr/bin/env python3
"""`auto` on this machine, the target's costs booked as another machine's.

The decisions `auto` makes depend on the costs it measures (T(k), the MTP head's c), not
on where they come from. This runs the real engine on a real model (a twin,
scripts/make_twin_gguf.py) but books each target pass as `--t-ms` gives T(k) (or
`--t1-ms` + `--per-token-ms` a token more), and each MTP head step as `--c-ms`: what a
GPU would report, on a CPU. `--growth` replaces auto's prior T(k)/T(1) for a MoE target.
`--real` books nothing: what `auto` decides on this machine's own costs (on a GPU, with
every layer offloaded). Prints, per prompt, the rounds that drafted out of all rounds and
the tokens per round; `--why N`, also each of the first N rounds and auto's reason;
`--as-bench`, each prompt as `localspec bench --modes baseline,mtp,auto` runs it (the
target's cache cleared, the MTP head at γ 4 first, then a fresh `auto` engine).

    python scripts/booked_auto.py TWIN.gguf --t1-ms 1.6 --per-token-ms 0.15 --c-ms 0.8
    python scripts/booked_auto.py TWIN.gguf --t-ms 1.58,1.94,2.11,2.23,2.33 --c-ms 0.27 \
        --cold-ms 2.7,1.8   # the H200's 0.8B hybrid twin (docs/gpu.md)
    python scripts/booked_auto.py MOE_TWIN.gguf --drafter ngram --t-ms 3.23,3.88,4.45 \
        --growth 1,1.54,2.06
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import localspec.backends.llama as llama
import localspec.backends.mtp as mtp
import localspec.session as session_module
from localspec.backends.llama import LoadOptions
from localspec.bench.modes import Mode, build_engine
from localspec.decoding.engine import GenerationConfig
from localspec.decoding.events import RoundEnd
from localspec.session import Session, SessionConfig, open_session

PROMPTS = ("def fib(n):\n", "Explain TCP vs UDP.")


def book(t_s: list[float], per_token_s: float, c_s: float, cold_s: Sequence[float] = ()) -> None:
    """Replace the measured times with the booked ones (T(k) past the list: its last step
    continued, else per_token_s a token); `cold_s`: what the passes after each change of
    the target's pass size cost more, in turn (a GPU's CUDA-graph warm-up)."""
    last = {"k": 0, "run": 0}

    def busy_since(self: llama.LlamaModel, started: float) -> float:
        k = max(self._last_pass.values() or [1])
        last["run"] = last["run"] + 1 if k == last["k"] else 1
        last["k"] = k
        cold = cold_s[last["run"] - 1] if last["run"] <= len(cold_s) else 0.0
        step = t_s[-1] - t_s[-2] if len(t_s) > 1 else per_token_s
        return cold + (t_s[k - 1] if k <= len(t_s) else t_s[-1] + step * (k - len(t_s)))

    if cold_s:
        llama.LlamaModel.cold_passes = len(cold_s)  # type: ignore[assignment,misc]

    step = mtp.MtpHead.step

    def booked_step(
        self: mtp.MtpHead, entries: Sequence[tuple[int, int, np.ndarray]], seq: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        busy = self.busy_s
        out = step(self, entries, seq)
        self.busy_s = busy + c_s
        return out

    llama.LlamaModel._busy_since = busy_since  # type: ignore[method-assign,assignment]
    mtp.MtpHead.step = booked_step  # type: ignore[method-assign]


def busy(session: Session) -> float:
    """The target's and its MTP head's time so far (booked, where booked)."""
    target = session.target  # its head as is (head_of would attach it)
    head = mtp._HEADS.get(target) if isinstance(target, llama.LlamaModel) else None
    return session.target.busy_s + (head.busy_s if head is not None else 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="a GGUF (with an MTP head for --drafter mtp)")
    parser.add_argument("--drafter", choices=("mtp", "ngram"), default="mtp")
    parser.add_argument("--t1-ms", type=float, default=1.6)
    parser.add_argument("--per-token-ms", type=float, default=0.15)
    parser.add_argument("--t-ms", help="T(1),T(2),... in ms (instead of --t1-ms)")
    parser.add_argument("--c-ms", type=float, default=0.8)
    parser.add_argument("--growth", help="auto's prior T(k)/T(1), k = 1, 2, ...")
    parser.add_argument(
        "--cold-ms", help="the passes after a change of size cost this more, in turn: 2.7,1.8"
    )
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--real", action="store_true", help="book nothing: the measured costs")
    parser.add_argument("--why", type=int, default=0, help="print the first N rounds")
    parser.add_argument("--as-bench", action="store_true", help="fresh engines, as the bench's")
    args = parser.parse_args(argv)
    if args.as_bench and args.drafter != "mtp":
        parser.error("--as-bench runs the bench's mtp and auto modes: a target with an MTP head")
    t_ms = [float(x) for x in args.t_ms.split(",")] if args.t_ms else [args.t1_ms]
    if not args.real:
        cold = [float(x) / 1e3 for x in args.cold_ms.split(",")] if args.cold_ms else []
        book([t / 1e3 for t in t_ms], args.per_token_ms / 1e3, args.c_ms / 1e3, cold)
    if args.growth:
        growth = tuple(float(x) for x in args.growth.split(","))
        session_module.verify_growth = lambda target: growth  # type: ignore[assignment]
    load = LoadOptions(n_ctx=1024, n_threads=2)
    config = SessionConfig(str(args.target), args.drafter, "auto", target_load=load)
    session = open_session(config)
    try:
        for text in PROMPTS:
            prompt, asked = session.target.tokenize(text), GenerationConfig(args.tokens)
            engine = session.engine
            if args.as_bench:
                for mode in (Mode("mtp", "mtp", 4), Mode("auto", "auto")):
                    session.target.reset()
                    engine = build_engine(mode, session.target, None)
                    if mode.kind == "mtp":
                        list(engine.generate(prompt, asked))
            rounds, marks = [], []  # the booked time at each round's end
            for e in engine.generate(prompt, asked):
                if isinstance(e, RoundEnd):
                    rounds.append(e)
                    marks.append(busy(session))
            for i, e in enumerate(rounds[: args.why]):
                print(f"  {i:2} {e.drafter:>6} {e.accepted}/{e.drafted}: {e.why}")
            drafted = sum(e.drafter != "none" for e in rounds)
            mean = args.tokens / max(len(rounds), 1)
            print(f"{text!r}: {drafted} of {len(rounds)} rounds drafted, {mean:.2f} tokens a round")
            if not args.real and len(rounds) > 1:  # after the first round (the prompt's)
                took = marks[-1] - marks[0]
                made = sum(e.accepted + 1 for e in rounds[1:])
                plain = made * t_ms[0] / 1e3  # warm 1-token passes, not one cold
                print(f"  booked: {took * 1e3:.1f} ms for {made} tokens, {plain / took:.2f}x plain")
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
