#!/usr/bin/env python3
"""Cost profiles of the models people run now, from random-weight twins of exact shapes.

For the MoE twin (Qwen3-Coder-30B-A3B's layers, `scripts/make_twin_gguf.py`), in each of
three placements (every tensor on the GPU; the routed experts of every layer in RAM,
llama.cpp's `--n-cpu-moe` at its most; and the planner's split for a card of
`--card-gib`):

- T(k), the target's seconds to score k new tokens in one pass after a 512-token context;
- the planner's estimate of T(1) and of T(k)/T(1) (`localspec.models.speed`) beside it;
- the planner's VRAM and RAM for that placement beside llama.cpp's own buffers (its log).

For the hybrid twins (Qwen3.5-0.8B and Qwen3.6-27B shapes with their MTP head): T(k), the
MTP head's seconds per drafted token c, and c / T(1) beside the prior auto starts from
(`MtpHead.cost_ratio`). The same for the Gemma 4 12B twin with its assistant, a drafter
from a file of its own (`--hybrids hybrid,gemma4`). And for either head, what `--slots`
slots' draft steps cost taken in turns, a pass each, against one pass for all (serve's
slots drafting at once: on a GPU a step reads mostly the head's weights, so a pass of
four should cost about one).

Random weights make every drafter wrong, so nothing here measures acceptance.

    python scripts/gpu_twins.py --vocab VOCAB.gguf --dir /tmp/twins --out twins.json \\
        [--moe-layers 48] [--hybrids hybrid,hybrid-27b] [--gpu-layers 0]

`--gpu-layers 0` runs the same on a CPU (small twins: a check of the script itself).
"""

from __future__ import annotations

# isort: off
# llama_cpp before numpy: with a CUDA build a model load once crashed when numpy came
# first (docs/gpu-overhead.md).
import localspec.backends.llama as llama
# isort: on

import argparse
import contextlib
import io
import json
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path

from localspec.backends.gguf import gguf_info
from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.backends.seq_layout import Part
from localspec.bench.costs import time_head_step, time_pass
from localspec.drafting import GAMMA_MAX
from localspec.models.hardware import GiB, Gpu, Hardware, probe
from localspec.models.memory import Weights, footprint, memory_budget, place
from localspec.models.speed import batch_growth, step_seconds

sys.path.insert(0, str(Path(__file__).parent))
import make_twin_gguf as twin
from gpu_overhead import gpu_name
from gpu_profile import context

PROMPT = 512  # tokens of context before each timed pass
KS = (1, 2, 3, 4, 5, 6, 8, 12, 16)
N_CTX = 4096
MIB = 2**20
BUFFER = r"(\w+) (model|KV|RS|compute) buffer size\s*=\s*([\d.]+) MiB"  # llama.cpp's log


def load_logged(path: Path, options: LoadOptions) -> tuple[LlamaModel, str, float]:
    """Load `path`, keeping what llama.cpp logs meanwhile (its buffers); load seconds."""
    llama._SHOW_LOG = True
    out = io.StringIO()
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out):
            model = LlamaModel(path, options)
    finally:
        llama._SHOW_LOG = False
    return model, out.getvalue(), time.perf_counter() - started


def buffers(log: str) -> dict[str, float]:
    """llama.cpp's buffer sizes in MiB by name ('CUDA0 model', 'CPU_Mapped model',
    'CUDA0 KV', 'CUDA_Host compute', ...), summed where one is logged twice."""
    sizes: dict[str, float] = {}
    for device, kind, mib in re.findall(BUFFER, log):
        key = f"{device} {kind}"
        sizes[key] = sizes.get(key, 0.0) + float(mib)
    return sizes


def on_device(sizes: dict[str, float], gpu: bool) -> tuple[float, float]:
    """(device MiB, host MiB) of llama.cpp's buffers: CUDA* on the GPU, the rest on the
    host (CPU, CPU_Mapped, CUDA_Host)."""
    dev = sum(v for k, v in sizes.items() if gpu and k.startswith("CUDA") and "_Host" not in k)
    return dev, sum(sizes.values()) - dev


def profile(model: LlamaModel, reps: int) -> dict[int, float]:
    """T(k) in ms for each k in KS (medians, inside llama.cpp)."""
    prefix = context(PROMPT)
    return {k: round(time_pass(model, prefix, k, reps, warmup=2).llama_s * 1e3, 4) for k in KS}


def ram_read_gbps(threads: int, gib: float = 4.0, reps: int = 5) -> float:
    """The host's RAM read speed in GB/s: `threads` numpy sums at once over a buffer far
    larger than any cache (numpy lets go of the GIL in them); the best of `reps`."""
    import numpy as np

    buf = np.ones(int(gib * 2**30) // 4, dtype=np.float32)
    parts = np.array_split(buf, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(reps):
            started = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = min(best, time.perf_counter() - started)
    return buf.nbytes / best / 1e9


def write(kind: str, vocab: Path, out_dir: Path, layers: int | None) -> Path:
    """One twin, in a process of its own (writing 15-17 GB of random blocks is CPU-bound)."""
    return twin.build(kind, twin.read_vocab(vocab), out_dir, layers, fast=True)


def moe(args: argparse.Namespace, path: Path, hw: Hardware) -> dict:
    weights = Weights.from_gguf(gguf_info(path))
    n = len(weights.layers)
    top = n + 1 if args.gpu_layers else 0
    card = Gpu(0, f"a {args.card_gib} GiB card", "nvidia", int(args.card_gib * GiB), None)
    small = replace(hw, gpus=(card,), offload=True)
    split = place(weights, None, N_CTX, replace(memory_budget(small), ram=1 << 50), small)
    placements = {"all on the GPU": 0, "experts in RAM": n}
    if split is not None and 0 < split.cpu_moe < n:
        placements[f"the planner's split for {args.card_gib} GiB"] = split.cpu_moe
    out: dict = {
        "file": path.name,
        "file_bytes": path.stat().st_size,
        "layers": n,
        "placements": {},
    }
    for name, cpu_moe in placements.items():
        opts = LoadOptions(
            n_ctx=N_CTX, n_gpu_layers=-1 if top else 0, cpu_moe=cpu_moe if top else 0
        )
        model, log, load_s = load_logged(path, opts)
        times = profile(model, args.reps)
        model.close()
        est = step_seconds(weights, top, hw, cpu_moe=cpu_moe) * 1e3
        vram, ram = footprint(weights, N_CTX, top, cpu_moe)
        sizes = buffers(log)
        dev, host = on_device(sizes, bool(top))
        out["placements"][name] = {
            "cpu_moe": cpu_moe,
            "load_s": round(load_s, 1),
            "verify_ms": times,
            "estimate_t1_ms": round(est, 3),
            "estimate_growth": {
                k: round(batch_growth(weights, k, top, hw, cpu_moe), 3) for k in KS
            },
            "planner_mib": {"vram": round(vram / MIB), "ram": round(ram / MIB)},
            "llama_mib": {"device": round(dev), "host": round(host), "buffers": sizes},
        }
        print(
            f"MoE {name}: T(1) {times[1]:.2f} ms (estimate {est:.2f}), T(8) {times[8]:.2f}, "
            f"T(16) {times[16]:.2f}; device {dev:.0f} MiB (planner {vram / MIB:.0f})",
            flush=True,
        )
    return out


def hybrid(
    kind: str, args: argparse.Namespace, path: Path, hw: Hardware, assistant: Path | None = None
) -> dict:
    from localspec.backends.mtp import AssistantHead, adopt

    weights = Weights.from_gguf(gguf_info(path))
    opts = LoadOptions(n_ctx=N_CTX, n_gpu_layers=args.gpu_layers, mtp=True, rollback=max(KS))
    model, log, load_s = load_logged(path, opts)
    if assistant is not None:  # Gemma 4's drafter: the target's head from its own file
        adopt(model, AssistantHead(model, assistant))
    times = profile(model, args.reps)
    head_s = time_head_step(model, context(PROMPT), args.reps)
    from localspec.backends.mtp import head_of

    head = head_of(model)
    prior = head.cost_ratio if head is not None else None
    model.close()
    top = len(weights.layers) + 1 if args.gpu_layers else 0
    est = step_seconds(weights, top, hw) * 1e3
    c = (head_s or 0.0) * 1e3
    print(
        f"{kind}: T(1) {times[1]:.2f} ms (estimate {est:.2f}), T(4) {times[4]:.2f}; "
        f"MTP head c {c:.3f} ms = {c / times[1]:.3f} T(1) (prior {prior:.3f})",
        flush=True,
    )
    out = {
        "file": path.name,
        "load_s": round(load_s, 1),
        "verify_ms": times,
        "estimate_t1_ms": round(est, 3),
        "head_ms": round(c, 4),
        "head_over_t1": round(c / times[1], 4),
        "head_prior": round(prior or 0.0, 4),
        "buffers": buffers(log),
    }
    if args.slots > 1:
        turns, shared = shared_steps(path, args, assistant)
        print(
            f"{kind}: {args.slots} slots' head steps, a pass each {turns:.3f} ms, "
            f"one pass {shared:.3f} ms ({shared / turns:.2f}x)",
            flush=True,
        )
        out["slots"] = args.slots
        out["head_steps_in_turns_ms"] = round(turns, 4)
        out["head_steps_in_one_pass_ms"] = round(shared, 4)
    return out


def shared_steps(
    path: Path, args: argparse.Namespace, assistant: Path | None
) -> tuple[float, float]:
    """Median ms of `args.slots` slots' first draft steps of the head after a 64-token
    text each (serve's slots, loaded again with as many sequences): a pass each, in
    turns, against one pass for all."""
    from localspec.backends.mtp import AssistantHead, MtpHead

    n = args.slots
    opts = LoadOptions(
        n_ctx=N_CTX,
        n_gpu_layers=args.gpu_layers,
        mtp=True,
        rollback=GAMMA_MAX,
        n_seq=n,
        kv_unified=True,
    )
    model = LlamaModel(path, opts)
    head = MtpHead(model) if assistant is None else AssistantHead(model, assistant)
    try:
        text = context(64)
        model.decode_parts([Part(seq, text[:-1], 0, 1) for seq in range(n)])  # h, per slot
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.reps + 1):
            for together in (False, True):
                parts = [head.part(head.catch_up(text, seq), seq) for seq in range(n)]
                started = time.perf_counter()
                if together:
                    head.decode_parts(parts)
                else:
                    for part in parts:
                        head.decode_parts([part])
                times[together].append(time.perf_counter() - started)
                for seq in range(n):
                    head.settle(text, seq)
        turns, shared = (statistics.median(times[t][1:]) * 1e3 for t in (False, True))
        return turns, shared
    finally:
        head.close()
        model.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=Path, required=True, help="GGUF to take tokenizer.* from")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/twins"), help="where twins go")
    parser.add_argument("--out", type=Path, required=True, help="the profile (JSON)")
    parser.add_argument("--moe-layers", type=int, default=48)
    parser.add_argument("--hybrids", default="hybrid,hybrid-27b")
    parser.add_argument("--card-gib", type=float, default=12.0, help="the planner's split for")
    parser.add_argument("--gpu-layers", type=int, default=-1, help="0: all on the CPU")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--skip-moe", action="store_true")
    parser.add_argument(
        "--slots", type=int, default=4, help="serve's slots whose head steps are timed (1: none)"
    )
    parser.add_argument("--keep", default="", help="comma list of twins whose files stay")
    args = parser.parse_args(argv)
    hw = probe()
    result: dict = {"device": gpu_name(), "cores": hw.cores, "gamma_max": GAMMA_MAX}
    # beside the experts-in-RAM T(1): what the planner's CPU bandwidth could be measured as
    result["ram_read_gbps"] = {n: round(ram_read_gbps(n), 1) for n in (1, hw.cores)}
    print(f"RAM read (GB/s by threads): {result['ram_read_gbps']}", flush=True)
    kinds = [k for k in args.hybrids.split(",") if k] + ([] if args.skip_moe else ["moe"])
    small = None if args.gpu_layers else 4  # on a CPU: a check of the script, small twins
    layers = {k: args.moe_layers if k == "moe" else small for k in kinds}
    files = [*kinds, "gemma4-assistant"] if "gemma4" in kinds else kinds
    started = time.perf_counter()
    with ProcessPoolExecutor(len(files)) as pool:
        jobs = {k: pool.submit(write, k, args.vocab, args.dir, layers.get(k)) for k in files}
        paths = {k: job.result() for k, job in jobs.items()}
    print(f"twins written in {time.perf_counter() - started:.0f} s", flush=True)
    for kind in kinds:
        path = paths[kind]
        measure = moe if kind == "moe" else partial(hybrid, kind)
        if kind == "gemma4":
            measure = partial(hybrid, kind, assistant=paths["gemma4-assistant"])
        result[kind] = measure(args, path, hw)
        args.out.write_text(json.dumps(result, indent=1))
        if kind not in args.keep.split(","):
            path.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
