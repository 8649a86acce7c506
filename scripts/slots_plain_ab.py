#!/usr/bin/env python3
"""`localspec serve --draft none --parallel 4` against `llama-server -np 4`, both decoding
plainly: four streaming clients on Spec-Bench's first turns (one of each category, seed
0; sets of four: --sets 0,2 are the first and the third), each set asked --reps times,
the servers taking turns (a different one first each time). Aggregate tok/s (all tokens
over the wall time) and the clients' median tok/s after their first token; then the
ratios localspec over llama-server, set for set. Where both decode plainly the servers
differ only in how they batch the slots' passes.

    .venv/bin/python scripts/slots_plain_ab.py --target T.gguf
(docs/bench/serve/2026-12-02-gaps: the F16 target, before and after the gap fillers)
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import serve_bench as sb

from localspec.bench import specbench


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096, help="tokens per slot")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--sets", default="0,2")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--logs", type=Path, default=Path("slots-plain-ab-logs"))
    a = p.parse_args()
    commands, ports = sb.plain_pair(a.target, a.threads, a.ctx)
    questions = specbench.load_sample(None, specbench.Sample(per_category=1))
    sets = [int(s) for s in a.sets.split(",")]
    a.logs.mkdir(parents=True, exist_ok=True)
    rates: dict[tuple[int, int, str], float] = {}
    with sb.servers(commands, ports, a.logs, "ab") as bases:
        for rep in range(a.reps):
            for s in sets:
                messages = [
                    [{"role": "user", "content": q.prompt}] for q in questions[4 * s : 4 * s + 4]
                ]
                names = list(bases) if (rep + s) % 2 == 0 else list(bases)[::-1]
                for name in names:
                    started = time.perf_counter()
                    with ThreadPoolExecutor(4) as pool:
                        answers = list(
                            pool.map(
                                lambda m, b=bases[name]: sb.stream_one(b, m, a.max_tokens),
                                messages,
                            )
                        )
                    wall = time.perf_counter() - started
                    sb.settle(bases[name])
                    rate = sum(x["tokens"] for x in answers) / wall
                    client = statistics.median(x["tokens_per_s"] for x in answers)
                    rates[rep, s, name] = rate
                    print(
                        f"set {s} rep {rep} {name:12} {rate:6.2f} tok/s in all, clients' median "
                        f"{client:5.2f}, {wall:5.1f} s",
                        flush=True,
                    )
    ratios = [
        rates[rep, s, "localspec"] / rates[rep, s, "llama-server"]
        for rep in range(a.reps)
        for s in sets
    ]
    print("localspec over llama-server, set for set:", " ".join(f"{r:.2f}x" for r in ratios))
    print(f"median {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
