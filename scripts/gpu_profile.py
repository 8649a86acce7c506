#!/usr/bin/env python3
"""Cost profiles of the catalog's Qwen2.5-Coder models on this machine's GPU.

A pass's time depends on the shapes and types of a model's tensors, not on their values.
So the script writes GGUFs with the exact tensors of a catalog model at Q4_K_M (llama.cpp's
type per tensor, the real 152k-token vocabulary copied from a vocabulary GGUF) but random
weights, loads each fully offloaded and times what speculation pays:

- T(k): the target's seconds to score k new tokens in one pass (k = 1..32), after a
  512-token context and, for a few k, after 4096 tokens;
- c: the draft's seconds per drafted token (one token, one logits row);
- the draft's catch-up: seconds per token of a 32-token batch with one logits row, and
  its read of 128 and 512 tokens (a prompt's first read).

Those are the costs `scripts/replay.py replay --profile` feeds to the recorded answers of
the real pair, to project what `auto` gains on that GPU. Random weights make the text
nonsense, so nothing here measures acceptance.

    python scripts/gpu_profile.py --vocab VOCAB.gguf --dir /tmp/shapes --out profile.json \\
        --targets qwen2.5-coder-7b-instruct,... --drafts qwen2.5-coder-0.5b-instruct

Each model is written, measured and deleted in turn (the 32B file is 20 GB).

    python scripts/gpu_profile.py --compare REAL.gguf RANDOM.gguf [MORE.gguf ...] [--gpu-layers 0]

times files side by side (T(1), T(2), T(4), T(8), alternated): a real file and its random
twin, to check that the values do not change the cost on that machine, or any models, to
see what a pass of k tokens costs against one of one.
"""

from __future__ import annotations

# isort: off
# llama_cpp before numpy: with a CUDA build a model load once crashed when numpy came
# first (docs/gpu-overhead.md).
import localspec.backends.llama  # noqa: F401
# isort: on

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import gguf
import numpy as np

from localspec.backends.llama import LlamaModel, LoadOptions, supports_gpu_offload
from localspec.bench.costs import time_pass
from localspec.bench.replay import catchup_per_token
from localspec.models.catalog_file import default_catalog

sys.path.insert(0, str(Path(__file__).parent))
from gpu_overhead import gpu_name
from make_tiny_gguf import TinySpec, Vocab, finish_gguf, read_vocab, start_gguf

Q = gguf.GGMLQuantizationType
# Qwen2.5's feed-forward widths (not in the catalog's shape, which holds what memory needs)
FFN = {
    "qwen2.5-coder-0.5b-instruct": 4864,
    "qwen2.5-coder-1.5b-instruct": 8960,
    "qwen2.5-coder-3b-instruct": 11008,
    "qwen2.5-coder-7b-instruct": 18944,
    "qwen2.5-coder-14b-instruct": 13824,
    "qwen2.5-coder-32b-instruct": 27648,
}
# A k-quant needs rows of a multiple of 256; llama.cpp falls back to these (the 0.5B's
# 896-wide rows, as in the published file)
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}
# Where each block type keeps its fp16 scale(s), and a value that keeps weights small
# (random scales would hold infinities and NaNs; the arithmetic costs the same either way)
SCALES = {
    Q.Q4_K: ((0, 1e-4), (2, 1e-4)),  # d, dmin
    Q.Q6_K: ((208, 2e-5),),
    Q.Q5_0: ((0, 2e-3),),
    Q.Q8_0: ((0, 2e-4),),
}
CONTEXTS = (512, 4096)
K_LONG = (1, 2, 4, 8, 16)  # batch sizes timed after the long context too
READS = (128, 512)  # a draft's read of this many tokens in one batch (one logits row)


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's Q4_K_M rule: attn_v and ffn_down get Q6_K in these layers."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name: str, layer: int, n_layer: int, cols: int) -> Q:
    """The type llama.cpp's Q4_K_M gives a weight matrix with rows of `cols` values."""
    wide = name == "output" or (name in ("attn_v", "ffn_down") and use_more_bits(layer, n_layer))
    kind = Q.Q6_K if wide else Q.Q4_K
    return FALLBACK[kind] if cols % 256 else kind


class BlockPool:
    """Random quantized blocks, one buffer per type: every tensor of a type is a view of
    it, so a 20 GB model needs a few hundred MB of memory to write."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.pools: dict[Q, np.ndarray] = {}

    def tensor(self, qtype: Q, rows: int, cols: int) -> np.ndarray:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        row_bytes = cols // block * size
        pool = self.pools.get(qtype)
        if pool is None or pool.size < rows * row_bytes:
            pool = self.rng.integers(0, 256, rows * row_bytes, dtype=np.uint8)
            blocks = pool.reshape(-1, size)
            for offset, value in SCALES[qtype]:
                blocks[:, offset : offset + 2] = np.frombuffer(
                    np.float16(value).tobytes(), dtype=np.uint8
                )
            self.pools[qtype] = pool
        return pool[: rows * row_bytes].reshape(rows, row_bytes)


def shape_of(model_id: str) -> TinySpec:
    s = default_catalog().model(model_id).shape
    n_head = s.embedding // s.head_dim
    return TinySpec(
        model_id, s.layers, s.embedding, n_head, s.kv_heads, FFN[model_id], 32768, n_vocab=s.vocab
    )


def write_shaped(model_id: str, vocab: Vocab, path: Path, seed: int = 0) -> Path:
    """A random-weight GGUF with the tensors of `model_id` at Q4_K_M."""
    s, pool = shape_of(model_id), BlockPool(seed)
    kv = s.n_head_kv * s.head_dim
    name, file_type = f"{model_id} (random weights)", gguf.LlamaFileType.MOSTLY_Q4_K_M
    w, _ = start_gguf(path, "qwen2", name, file_type, s, vocab)

    def matrix(name: str, rows: int, cols: int, layer: int = 0) -> None:
        qtype = q4_k_m_type(name.split(".")[-1], layer, s.n_layer, cols)
        full = name if name in ("token_embd", "output") else f"blk.{layer}.{name}"
        w.add_tensor(f"{full}.weight", pool.tensor(qtype, rows, cols), raw_dtype=qtype)

    ones = np.ones(s.n_embd, dtype=np.float32)
    matrix("token_embd", s.n_vocab, s.n_embd)
    w.add_tensor("output_norm.weight", ones)
    matrix("output", s.n_vocab, s.n_embd)  # the published files store it, tied or not
    for i in range(s.n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        for name, rows in (("attn_q", s.n_embd), ("attn_k", kv), ("attn_v", kv)):
            matrix(name, rows, s.n_embd, i)
            w.add_tensor(f"blk.{i}.{name}.bias", np.full(rows, 0.01, dtype=np.float32))
        matrix("attn_output", s.n_embd, s.n_embd, i)
        matrix("ffn_gate", s.n_ff, s.n_embd, i)
        matrix("ffn_up", s.n_ff, s.n_embd, i)
        matrix("ffn_down", s.n_embd, s.n_ff, i)
    return finish_gguf(w, path)


def context(n: int) -> list[int]:
    """n real token ids, any will do (a pass costs the same whatever they say)."""
    return [1000 + (7 * i) % 50000 for i in range(n)]


def measure(path: Path, k_max: int, reps: int, draft: bool) -> dict:
    """Load `path` fully offloaded and time its passes (milliseconds)."""
    started = time.perf_counter()
    model = LlamaModel(path, LoadOptions(n_ctx=CONTEXTS[-1] + 2 * k_max + 64, n_gpu_layers=-1))
    load_s = time.perf_counter() - started
    short, long = context(CONTEXTS[0]), context(CONTEXTS[-1])

    def ms(prefix: list[int], k: int, n_logits: int | None = None) -> float:
        times = time_pass(model, prefix, k, reps, warmup=2, n_logits=n_logits)
        return round(times.llama_s * 1e3, 4)

    out: dict = {"file_bytes": path.stat().st_size, "load_s": round(load_s, 2)}
    if draft:
        out["step_ms"] = ms(short, 1)
        out["catchup_ms_per_token"] = round(catchup_per_token(model, short, reps) * 1e3, 4)
        # a first read of a long prompt runs in larger batches, cheaper per token
        out["read_ms"] = {n: ms(short, n, n_logits=1) for n in READS}
        out["verify_ms"] = [ms(short, k) for k in range(1, 9)]
    else:
        out["verify_ms"] = [ms(short, k) for k in range(1, k_max + 1)]
        out["verify_ms_at_4096"] = {k: ms(long, k) for k in K_LONG}
    model.close()
    return out


COMPARED = (1, 2, 4, 8)  # batch sizes --compare times


def compare(paths: list[Path], layers: int, reps: int) -> None:
    """T(k) of each file, measured in turns, medians over the turns; each against the
    first file's (a real file and its random twin), and against its own T(1) (what a
    forced or drafted token costs on this machine)."""
    models = [LlamaModel(p, LoadOptions(n_ctx=2048, n_gpu_layers=layers)) for p in paths]
    prefix = context(256)
    times: dict[tuple[int, int], list[float]] = {}
    for _ in range(4):
        for i, model in enumerate(models):
            for k in COMPARED:
                times.setdefault((i, k), []).append(time_pass(model, prefix, k, reps).llama_s)
    t = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    for i, path in enumerate(paths):
        print(path.name)
        for k in COMPARED:
            print(
                f"  T({k}): {t[i, k]:.2f} ms, {t[i, k] / t[i, 1]:.2f} T(1)"
                + (f", {t[i, k] / t[0, k]:.3f} of {paths[0].name}'s" if i else "")
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=Path, help="GGUF to take tokenizer.* from")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/shapes"), help="where models go")
    parser.add_argument("--out", type=Path, help="the profile (JSON)")
    parser.add_argument("--compare", type=Path, nargs="+", metavar="GGUF")
    parser.add_argument("--gpu-layers", type=int, default=-1, help="for --compare")
    parser.add_argument("--targets", default="qwen2.5-coder-7b-instruct")
    parser.add_argument("--drafts", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--k-max", type=int, default=32)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--keep", default="", help="comma list of targets whose files stay")
    args = parser.parse_args(argv)
    if args.compare:
        compare(args.compare, args.gpu_layers, args.reps)
        return 0
    if args.vocab is None or args.out is None:
        parser.error("--vocab and --out are needed to profile")

    args.dir.mkdir(parents=True, exist_ok=True)
    vocab = read_vocab(args.vocab)
    profile: dict = {
        "gpu": gpu_name(),
        "cpu": platform.processor() or platform.machine(),
        "gpu_offload": supports_gpu_offload(),
        "quant": "Q4_K_M",
        "contexts": list(CONTEXTS),
        "models": {},
    }
    roles = [(m, True) for m in args.drafts.split(",") if m]
    roles += [(m, False) for m in args.targets.split(",") if m]
    for model_id, is_draft in roles:
        path = args.dir / f"{model_id}-q4_k_m-random.gguf"
        started = time.perf_counter()
        if not path.exists():
            write_shaped(model_id, vocab, path)
        written = time.perf_counter() - started
        figures = measure(path, args.k_max, args.reps, is_draft)
        figures["write_s"] = round(written, 1)
        figures["catalog_bytes"] = default_catalog().model(model_id).quant("Q4_K_M").size
        profile["models"][model_id] = figures
        t = figures["verify_ms"]
        print(
            f"{model_id:30} {figures['file_bytes'] / 1e9:5.2f} GB "
            f"(catalog {figures['catalog_bytes'] / 1e9:5.2f}) T(1) {t[0]:.3f} ms"
            + "".join(f" T({k})/T(1) {t[k - 1] / t[0]:.2f}" for k in (8, 32) if len(t) >= k)
            + (f" catch-up {figures['catchup_ms_per_token']:.3f} ms/token" if is_draft else ""),
            flush=True,
        )
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(profile, indent=1))
        tmp.replace(args.out)
        if not is_draft and model_id not in args.keep.split(","):
            path.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
