#!/usr/bin/env python3
"""What a pass of one token a slot costs by which slots bring one, with a cache per slot
(serve's default where drafts do not pay under load): llama.cpp reads sequences whose
ids leave a gap (0, 1, 3) in one micro-batch per run of ids, unless the gap is filled
(`Layout.fillers`) or, once it lasts, closed by moving caches (`Layout.moves`).
Each set of slots runs --run passes in a row, the sets taking turns, --repeats times:
the mean of a pass over the runs (what a gap costs in all, moves included) and the
median of each run's second half. To compare two versions, run it under each
(PYTHONPATH pointing at the other's copy).

    .venv/bin/python scripts/seq_gaps.py --target T.gguf
(docs/bench/serve/2026-12-02-gaps: the 1.5B Q4_K_M and F16 targets, 2 cores)
"""

from __future__ import annotations

import argparse
import statistics
import time

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.backends.seq_layout import Part

SETS = [(0, 1, 2, 3), (0, 1, 2), (0, 1, 3), (0, 2, 3), (0, 1), (0, 2), (0, 3), (0,)]
TEXT = "Write a long story about a lighthouse keeper who finds a message in a bottle. "


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--run", type=int, default=12, help="passes in a row for each set")
    args = p.parse_args()
    model = LlamaModel(args.target, LoadOptions(n_ctx=2048, n_threads=args.threads, n_seq=4))
    text = model.tokenize(TEXT * 8)
    for seq in range(4):  # caches of unequal lengths, as slots' are
        model.decode_parts([Part(seq, text[: 60 + 40 * seq], 0, 1)])
    pos = {seq: model.seq_len(seq) for seq in range(4)}

    def one_pass(seqs: tuple[int, ...]) -> float:
        parts = [Part(s, [text[pos[s] % len(text)]], pos[s], 1) for s in seqs]
        started = time.perf_counter()
        model.decode_parts(parts)
        for s in seqs:
            pos[s] += 1
        return time.perf_counter() - started

    for seqs in SETS:  # warm: the graphs of each shape
        one_pass(seqs)
    runs: dict[tuple[int, ...], list[list[float]]] = {seqs: [] for seqs in SETS}
    for _ in range(args.repeats):
        for seqs in SETS:
            runs[seqs].append([one_pass(seqs) for _ in range(args.run)])
    print(f"{'slots':16} {'mean':>6} {'2nd half':>9}  (ms a pass)")
    for seqs in SETS:
        passes = [t for run in runs[seqs] for t in run]
        late = [t for run in runs[seqs] for t in run[len(run) // 2 :]]
        label = ", ".join(map(str, seqs))
        mean, median = statistics.mean(passes) * 1e3, statistics.median(late) * 1e3
        print(f"slots {label:10} {mean:6.0f} {median:9.0f}", flush=True)
    model.close()


if __name__ == "__main__":
    main()
