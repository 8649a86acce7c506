"""What the suffix index costs per round: `python scripts/suffix_cost.py`.

A conversation is simulated by the project's own source files, cut into word-like
tokens (runs of letters, of spaces, single punctuation: about as long as a code
model's tokens). Its first `--context` tokens are the prompt; then each round appends
the next few tokens (as an accepted draft does) and asks for a 16-token draft. The
figure is the median time of such a round (indexing what was appended, and the match),
beside the time to index the prompt at the first round.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

from localspec.decoding.suffix import SuffixIndex

ROOT = Path(__file__).resolve().parent.parent


def corpus_tokens() -> list[int]:
    text = "".join(p.read_text() for p in sorted((ROOT / "localspec").rglob("*.py")))
    ids: dict[str, int] = {}
    return [ids.setdefault(w, len(ids)) for w in re.findall(r"\w+|\s+|[^\w\s]", text)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, nargs="+", default=[2000, 8000])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--step", type=int, default=3, help="tokens appended per round")
    args = parser.parse_args()
    tokens = corpus_tokens()
    for n in args.context:
        index = SuffixIndex()
        started = time.perf_counter()
        index.match(tokens[:n], 16)
        build = time.perf_counter() - started
        times, drafted = [], 0
        for r in range(args.rounds):
            context = tokens[: n + (r + 1) * args.step]
            started = time.perf_counter()
            m = index.match(context, 16)
            times.append(time.perf_counter() - started)
            drafted += bool(m.tokens)
        print(
            f"context {n} tokens: first round (indexing it) {build * 1e3:.1f} ms; "
            f"a round: median {statistics.median(times) * 1e6:.0f} µs, "
            f"p90 {statistics.quantiles(times, n=10)[-1] * 1e6:.0f} µs; "
            f"{drafted}/{args.rounds} rounds had a draft"
        )


if __name__ == "__main__":
    main()
