#!/usr/bin/env python3
"""How well the target's own confidence predicts the draft model's agreement with it.

For each answer of a replay recording (scripts/replay.py record), one batched pass of the
target over prompt + answer gives its top-token probability at every position of the
answer; the recording says where the draft model's greedy guess was the target's token.
Prints the share of agreeing guesses per band of the target's probability, and how well
the mean over an answer's first k tokens foretells the agreement over the rest of it.

    .venv/bin/python scripts/draft_calibration.py -t TARGET.gguf \\
        docs/bench/replay/specbench-f16.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np

from localspec.backends.llama import LlamaModel, LoadOptions

BANDS = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.01)


def top_probability(target: LlamaModel, prompt: list[int], answer: list[int]) -> np.ndarray:
    """The target's top-token probability at each position of `answer`."""
    target.rollback([])
    logits = target.evaluate([*prompt, *answer][:-1], len(answer)).astype(np.float64)
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z.max(axis=1) / z.sum(axis=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("--target", "-t", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    prompts = json.loads(args.recording.read_text())["prompts"]
    target = LlamaModel(args.target, LoadOptions(n_threads=args.threads))
    conf, agree = [], []
    for r in prompts.values():
        conf.append(top_probability(target, r["prompt"], r["y"]))
        agree.append(np.array([g == y for g, y in zip(r["guess"], r["y"], strict=False)]))
    c, a = np.concatenate(conf), np.concatenate(agree)
    print("| target's top probability | positions | draft agrees |\n|---|---:|---:|")
    for lo, hi in itertools.pairwise(BANDS):
        band = (c >= lo) & (c < hi)
        print(f"| {lo:.2f}-{min(hi, 1):.2f} | {band.sum()} | {a[band].mean():.3f} |")
    print("\n| first k tokens | r(their mean, agreement after them) | mean abs error |")
    print("|---|---:|---:|")
    for k in (4, 8, 16):
        answers = zip(conf, agree, strict=True)
        pairs = [(x[:k].mean(), y[k:].mean()) for x, y in answers if len(y) > k]
        early, rest = np.array(pairs).T
        r = np.corrcoef(early, rest)[0, 1]
        print(f"| {k} | {r:.2f} | {np.abs(early - rest).mean():.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
