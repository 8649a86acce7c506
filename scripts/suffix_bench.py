"""`auto` with and without the suffix source on second turns that rework the first:
`python scripts/suffix_bench.py [--target ID] [--draft ID]`.

Each conversation's first answer is the target's own (greedy, untimed); the second turn
asks for an edit of it. On that turn three engines run cold, interleaved, as the bench
runs them (`localspec.bench.runner.run_once`, one session with the draft's CPU copy):
plain decoding, `auto` without the suffix source, `auto` with it. Printed per turn and
as medians: tokens/s, tokens per round (accepted + the target's own), and the ratios.
"""

from __future__ import annotations

import argparse
import statistics

from localspec.backends import load_llama_library

load_llama_library()

from localspec.backends.llama import LoadOptions  # noqa: E402
from localspec.bench.runner import run_once  # noqa: E402
from localspec.decoding.adaptive import AdaptiveDrafter, auto_engine  # noqa: E402
from localspec.decoding.drafters import NoDrafter  # noqa: E402
from localspec.decoding.engine import Engine  # noqa: E402
from localspec.session import Message, SessionConfig, open_session  # noqa: E402

CONVERSATIONS = {
    "hints": (
        "Write a Python function that parses a CSV line into fields, handling quoted "
        "fields that contain commas. Only the code.",
        "Now add type hints to that function. Only the code.",
    ),
    "rename": (
        "Write a Python class Stack with push, pop, peek and is_empty methods. Only the code.",
        "Rename the class to LifoStack and add a __len__ method. Only the code.",
    ),
    "docstring": (
        "Write a Python function that merges two sorted lists into one sorted list. Only the code.",
        "Add a docstring to that function. Only the code.",
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    load = LoadOptions(n_ctx=4096, n_threads=2)
    config = SessionConfig(args.target, args.draft, "auto", load, load)
    session = open_session(config, say=print)
    target, draft = session.target, session.draft_model
    rows: dict[str, list[tuple[float, float]]] = {"plain": [], "auto-nosuffix": [], "auto": []}
    for name, (first, second) in CONVERSATIONS.items():
        turn1: list[Message] = [{"role": "user", "content": first}]
        answer = run_once(Engine(target, NoDrafter(), 0), target, None, session.render(turn1), 256)
        turn2: list[Message] = [*turn1, {"role": "assistant", "content": answer.text}]
        prompt = session.render([*turn2, {"role": "user", "content": second}])
        for _ in range(args.repeats):
            for mode in rows:
                engine = (
                    auto_engine(target, draft) if "auto" in mode else Engine(target, NoDrafter(), 0)
                )
                if mode == "auto-nosuffix":
                    assert isinstance(engine.drafter, AdaptiveDrafter)
                    engine.drafter.suffix = None
                f = run_once(engine, target, draft, prompt, args.max_tokens).figures
                per_round = f.tokens / f.rounds if f.rounds else 0.0
                rows[mode].append((f.tokens_per_s, per_round))
                print(
                    f"{name:10} {mode:14} {f.tokens:4} tokens {f.tokens_per_s:6.1f} tok/s "
                    f"{per_round:5.2f} tokens/round"
                )
    plain = statistics.median(t for t, _ in rows["plain"])
    for mode, figures in rows.items():
        speed = statistics.median(t for t, _ in figures)
        per_round = statistics.median(r for _, r in figures)
        ratios = [t / p for (t, _), (p, _) in zip(figures, rows["plain"], strict=True)]
        print(
            f"median {mode:14} {speed:6.1f} tok/s ({speed / plain:.2f}x plain; per turn "
            f"{statistics.median(ratios):.2f}x) {per_round:5.2f} tokens/round"
        )
    session.close()


if __name__ == "__main__":
    main()
