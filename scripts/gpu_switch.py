#!/usr/bin/env python3
"""What a change of pass size costs the passes after it, with and without an MTP head.

On a GPU llama.cpp runs a batch shape it has not just run without its CUDA graph, then
captures the graph (`ggml_backend_cuda_graph_compute`'s warm-up). `auto` between plain
rounds (1 token a pass) and probes (2 or more) pays that at each change; and with the MTP
head attached every pass also outputs the trunk's hidden state for the head. This times
each pass of a fixed pattern on one target, head detached and attached:

- steady: 1-token passes only;
- switch: CYCLES times one 2-token pass, then AFTER 1-token passes, each 1-token pass
  timed by its place after the switch.

    python scripts/gpu_switch.py TWIN.gguf [--gpu-layers 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.backends.mtp import head_of

PROMPT = 256
CYCLES = 8
AFTER = 6
STEADY = 30


def timed(model: LlamaModel, at: int, k: int) -> float:
    """Seconds of one pass of k new tokens at position `at` (the logits read: synced)."""
    started = time.perf_counter()
    model._decode([100 + (at + i) % 1000 for i in range(k)], at, k)
    return time.perf_counter() - started


def pattern(model: LlamaModel) -> dict:
    model.reset()
    at = PROMPT
    model._decode([100 + i for i in range(PROMPT)], 0, 1)
    steady = []
    for _ in range(STEADY):
        steady.append(timed(model, at, 1))
        at += 1
    after: list[list[float]] = [[] for _ in range(AFTER)]
    two = []
    for _ in range(CYCLES):
        two.append(timed(model, at, 2))
        at += 2
        for i in range(AFTER):
            after[i].append(timed(model, at, 1))
            at += 1
    ms = lambda xs: round(statistics.median(xs) * 1e3, 4)  # noqa: E731
    return {
        "steady_t1_ms": ms(steady[5:]),
        "t2_after_plain_ms": ms(two),
        "t1_after_switch_ms": [ms(xs) for xs in after],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="a GGUF with an MTP head")
    parser.add_argument("--gpu-layers", type=int, default=-1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    opts = LoadOptions(n_ctx=1024, n_gpu_layers=args.gpu_layers, mtp=True, rollback=8)
    model = LlamaModel(args.target, opts)
    head = head_of(model)
    result: dict[str, list[dict]] = {}
    try:
        for attached in (False, True, False):
            if head is not None:
                (head.attach if attached else head.detach)()
            key = "head attached" if attached else "head detached"
            got = pattern(model)
            result.setdefault(key, []).append(got)
            print(f"{key}: {json.dumps(got)}", flush=True)
    finally:
        model.close()
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
