#!/usr/bin/env python3
"""What reading a prompt costs by chunk size: `python scripts/read_ahead_cost.py MODEL.gguf`.

Reads the first `--tokens` tokens of the project's own engine.py into a fresh cache in
chunks of each size, three times, and prints the median time of the whole read and the
time of one chunk at its start: a request that comes meanwhile waits for one chunk. With
the draft model: serve's idle slots reading ahead between requests (`read_ahead_chunk`);
with the target and `--chunks 32,64,128,256,512`: serve's prompt chunks (`prompt_chunk`,
ALONE_MIN_CHUNK), both in localspec.server.scheduling.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from localspec.backends.llama import LlamaModel, LoadOptions

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a .gguf (the draft model's Q4_0 CPU copy, or the target)")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chunks", default="16,32,64,128", help="comma-separated chunk sizes")
    p.add_argument("--no-repack", dest="repack", action="store_false", help="as serve's")
    p.add_argument(
        "--prompt-reader", action="store_true", help="long passes read not repacked, as serve's"
    )
    args = p.parse_args()
    options = LoadOptions(
        n_ctx=4096, n_threads=args.threads, repack=args.repack, prompt_reader=args.prompt_reader
    )
    model = LlamaModel(args.model, options)
    text = (ROOT / "localspec/decoding/engine.py").read_text()
    tokens = model.tokenize(text, special=False)[: args.tokens]
    for chunk in (int(c) for c in args.chunks.split(",")):
        whole, first = [], []
        for _ in range(3):
            model.rollback([])
            started = time.perf_counter()
            for end in range(chunk, len(tokens) + chunk, chunk):
                t = time.perf_counter()
                model.evaluate(tokens[:end], 1)
                if end == chunk:
                    first.append(time.perf_counter() - t)
            whole.append(time.perf_counter() - started)
        print(
            f"chunks of {chunk}: {len(tokens)} tokens in {statistics.median(whole):.2f} s, "
            f"one chunk {statistics.median(first) * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
