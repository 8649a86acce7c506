#!/usr/bin/env python3
"""What a hybrid target's recurrent-state snapshots cost every pass, drafted or not.

llama.cpp keeps snapshots of a hybrid model's recurrent state after each of a pass's last
tokens (`n_rs_seq`, `LoadOptions.rollback`), so that a rejected draft can be dropped; a
session that may draft loads its target with GAMMA_MAX of them, `--draft none` with none.
For each depth this loads the target with two sequences and times T(1), T(2), T(4) (one
sequence) and a pass of one token in each of two sequences (two of serve's slots),
medians over `--loads` loads taken in turns.

    .venv/bin/python scripts/snapshot_cost.py --target HYBRID.gguf [--depths 0,2,3,4,8]
(docs/models.md, "MTP heads": the 24-layer hybrid twin of scripts/make_twin_gguf.py)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.backends.seq_layout import Part
from localspec.bench.costs import time_pass

TEXT = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n" * 4


def two_slots_pass(model: LlamaModel, prefix: list[int], reps: int) -> float:
    """Median seconds of a pass of one token in each of two sequences after `prefix`."""
    model.reset()
    model.decode_parts([Part(0, prefix, 0, 1), Part(1, prefix, 0, 1)])
    times = []
    for i in range(reps + 3):
        at = len(prefix) + i
        started = time.perf_counter()
        model.decode_parts([Part(s, [prefix[i % len(prefix)]], at, 1) for s in (0, 1)])
        times.append(time.perf_counter() - started)
    return statistics.median(times[3:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--depths", default="0,2,3,4,8", help="n_rs_seq values to compare")
    p.add_argument("--loads", type=int, default=3)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    ms: dict[int, dict[str, list[float]]] = {d: {} for d in depths}
    for _ in range(args.loads):
        for depth in depths:
            opts = LoadOptions(
                n_ctx=2048, n_threads=args.threads, rollback=depth, n_seq=2, kv_unified=True
            )
            model = LlamaModel(args.target, opts)
            try:
                prefix = model.tokenize(TEXT)
                for k in (1, 2, 4):
                    t = time_pass(model, prefix, k, args.reps, warmup=3).llama_s
                    ms[depth].setdefault(f"T({k})", []).append(t * 1e3)
                t = two_slots_pass(model, prefix, args.reps)
                ms[depth].setdefault("two slots", []).append(t * 1e3)
            finally:
                model.close()
    base = {name: statistics.median(v) for name, v in ms[depths[0]].items()}
    for depth in depths:
        cells = []
        for name, values in ms[depth].items():
            t = statistics.median(values)
            cells.append(f"{name} {t:.2f} ms ({t / base[name] - 1:+.1%})")
        print(f"n_rs_seq {depth}: " + ", ".join(cells))
        print("   loads:", {n: [round(x, 1) for x in v] for n, v in ms[depth].items()})


if __name__ == "__main__":
    main()
