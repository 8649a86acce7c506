#!/usr/bin/env python3
"""Build tiny random-weight GGUFs (a qwen2 target and draft, or a Mamba) for tests and timing.

The weights are random, so the text is nonsense, but the vocabulary is real: every
`tokenizer.*` key is copied from a vocabulary GGUF (llama.cpp's
models/ggml-vocab-qwen2.gguf, or any Qwen2/2.5 model file), so both models have the
152k-token Qwen2 vocabulary and all vocabulary-wide work on the logits (argmax, top-2,
softmax, the device-to-host copy of each logits row) costs what it costs on a real pair.
The layers are tiny, so a pass is dominated by fixed costs (kernel launches, the
lm_head, the logits copy): the worst case for per-round Python overhead.

Embeddings are tied (no output.weight, as in Qwen2.5 0.5B/1.5B) and stored as Q8_0 by
default to keep the files small (~41 MB target, ~21 MB draft); the layers are F16.

`n_vocab` pads the vocabulary with `[PAD<i>]` entries as Hugging Face's converter does
(Qwen2.5 7B and 32B have 152,064 logits, the 0.5B 151,936): a pair of unequal
vocabularies, as the catalog pairs them. `arch="mamba"` builds a recurrent model (its
cache cannot drop a suffix), to test what the engine does where a cut fails.

    python scripts/make_tiny_gguf.py --vocab path/to/vocab.gguf --out-dir DIR
"""

from __future__ import annotations

import argparse
import mmap
import struct
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - the package is a localspec dependency
    sys.exit("make_tiny_gguf needs the 'gguf' package (pip install gguf)")

ARCH = "qwen2"
EMBD_TYPES = {
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "f16": gguf.GGMLQuantizationType.F16,
    "f32": gguf.GGMLQuantizationType.F32,
}


@dataclass(frozen=True)
class TinySpec:
    """The shape of one tiny qwen2 model."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int = 4096
    embd_type: str = "q8_0"  # token_embd (tied with the output): q8_0, f16 or f32
    # Embedding scale. Small, so the layers (not the token's own embedding, which the
    # tied lm_head would favour) decide the next token: varied text, rarely a loop.
    embd_scale: float = 0.02
    n_vocab: int = 0  # 0: the vocabulary GGUF's size; larger: padded with [PAD<i>] tokens
    arch: str = ARCH  # "qwen2" or "mamba" (then n_head, n_head_kv and n_ff are unused)
    d_state: int = 16  # mamba: SSM state size
    d_conv: int = 4  # mamba: convolution width

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


TARGET = TinySpec("tiny-qwen2-target", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=1024)
DRAFT = TinySpec("tiny-qwen2-draft", n_layer=2, n_embd=128, n_head=2, n_head_kv=1, n_ff=512)
MAMBA = TinySpec("tiny-mamba", n_layer=2, n_embd=128, n_head=0, n_head_kv=0, n_ff=0, arch="mamba")


PER_TOKEN = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")


@dataclass
class Vocab:
    """A GGUF file's tokenizer.* keys as (type, item type of an array, value), strings as
    raw bytes: what a model built from it copies."""

    keys: dict[str, tuple[Any, Any, Any]] = field(default_factory=dict)


Q = gguf.GGUFValueType
SCALARS = {
    Q.UINT8: "B", Q.INT8: "b", Q.UINT16: "H", Q.INT16: "h", Q.UINT32: "I", Q.INT32: "i",
    Q.FLOAT32: "f", Q.BOOL: "?", Q.UINT64: "Q", Q.INT64: "q", Q.FLOAT64: "d",
}  # fmt: skip


def read_vocab(path: Path) -> Vocab:
    """The tokenizer.* keys of the GGUF at `path`, read from its header in well under a
    second (gguf.GGUFReader makes a numpy view per vocabulary entry: ~20 s on 2 cores)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos = 0

        def take(fmt: str) -> Any:
            nonlocal pos
            (value,) = struct.unpack_from("<" + fmt, mm, pos)
            pos += struct.calcsize("<" + fmt)
            return value

        def string() -> bytes:
            nonlocal pos
            n = take("Q")
            pos += n
            return mm[pos - n : pos]

        def value(kind: Q) -> Any:
            if kind == Q.STRING:
                return string()
            if kind in SCALARS:
                return take(SCALARS[kind])
            raise ValueError(f"{path}: unexpected GGUF value type {kind!r}")

        if mm[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        pos = 8
        _, n_kv = take("Q"), take("Q")
        vocab = Vocab()
        for _ in range(n_kv):
            key, kind = string().decode(), Q(take("I"))
            sub = None
            if kind == Q.ARRAY:
                sub, count = Q(take("I")), take("Q")
                items = [value(sub) for _ in range(count)]
            else:
                items = value(kind)
            if key.startswith("tokenizer."):
                vocab.keys[key] = (kind, sub, items)
        return vocab


class Writer(gguf.GGUFWriter):
    """gguf's writer, packing arrays of strings and numbers in one go: item by item, a
    152k-token vocabulary and its merges took ~2 s of every file written."""

    def _pack_val(self, val: Any, vtype: Any, add_vtype: bool, sub_type: Any = None) -> bytes:
        if vtype != Q.ARRAY or not val or sub_type not in (Q.STRING, *SCALARS):
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        order = ">" if self.endianess == gguf.GGUFEndian.BIG else "<"
        head = struct.pack(f"{order}IIQ", vtype, sub_type, len(val))
        if sub_type == Q.STRING:
            items = [s.encode() if isinstance(s, str) else s for s in val]
            body = b"".join(struct.pack(f"{order}Q", len(s)) + s for s in items)
        else:
            body = struct.pack(f"{order}{len(val)}{SCALARS[sub_type]}", *val)
        return head + body if add_vtype else head[4:] + body


def copy_tokenizer(writer: gguf.GGUFWriter, vocab: Vocab, pad_to: int = 0) -> int:
    """Copy every tokenizer.* key, padding the per-token arrays to `pad_to` entries;
    returns the vocabulary size."""
    n_vocab = 0
    for key, (main, sub, value) in vocab.keys.items():
        if key in PER_TOKEN:
            value = _padded(key, value, pad_to)
        writer.add_key_value(key, value, main, sub)
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
    if not n_vocab:
        raise ValueError("the vocabulary GGUF has no tokenizer.ggml.tokens")
    return n_vocab


def _padded(key: str, values: list, n: int) -> list:
    """Per-token entries for ids len(values)..n-1, as the HF converter writes padding."""
    extra = range(len(values), n)
    if key == "tokenizer.ggml.tokens":
        return values + [f"[PAD{i}]".encode() for i in extra]
    if key == "tokenizer.ggml.token_type":
        return values + [int(gguf.TokenType.UNUSED)] * len(extra)
    return values + [0.0] * len(extra)  # scores


def _weight(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A random (rows, cols) matrix in ggml's (out, in) order, scaled like an init."""
    return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)


def start_gguf(
    path: Path,
    arch: str,
    name: str,
    file_type: gguf.LlamaFileType,
    shape: TinySpec,
    vocab: Vocab,
) -> tuple[gguf.GGUFWriter, int]:
    """A writer with the model-wide keys of `shape` and `vocab`'s tokenizer (padded to
    shape.n_vocab); and the vocabulary size."""
    writer = Writer(str(path), arch)
    writer.add_name(name)
    writer.add_file_type(file_type)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-6)
    if arch == ARCH:
        writer.add_rope_freq_base(1_000_000.0)
    return writer, copy_tokenizer(writer, vocab, shape.n_vocab)


def finish_gguf(writer: gguf.GGUFWriter, path: Path) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def build(
    spec: TinySpec,
    vocab: Vocab,
    path: Path,
    seed: int = 0,
    metadata: dict[str, float | int] | None = None,
) -> Path:
    """Write one tiny model to `path`, with `metadata` keys besides its shape's (numbers:
    a float is written as float32, an int as int32)."""
    rng = np.random.default_rng(seed)
    file_type = gguf.LlamaFileType.MOSTLY_F16
    writer, n_vocab = start_gguf(path, spec.arch, spec.name, file_type, spec, vocab)
    for key, value in (metadata or {}).items():
        if isinstance(value, int):
            writer.add_int32(key, value)
        else:
            writer.add_float32(key, value)
    if spec.n_vocab and n_vocab != spec.n_vocab:
        raise ValueError(f"the vocabulary GGUF has {n_vocab} tokens, more than {spec.n_vocab}")

    embd = rng.standard_normal((n_vocab, spec.n_embd), dtype=np.float32) * spec.embd_scale
    qtype = EMBD_TYPES[spec.embd_type]
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor("token_embd.weight", embd)
    elif qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor("token_embd.weight", embd.astype(np.float16))
    else:
        writer.add_tensor("token_embd.weight", gguf.quants.quantize(embd, qtype), raw_dtype=qtype)
    del embd
    writer.add_tensor("output_norm.weight", np.ones(spec.n_embd, dtype=np.float32))
    if spec.arch == "mamba":
        add_mamba_layers(writer, spec, rng)
    else:
        add_qwen2_layers(writer, spec, rng)
    return finish_gguf(writer, path)


def add_qwen2_layers(writer: gguf.GGUFWriter, spec: TinySpec, rng: np.random.Generator) -> None:
    kv = spec.n_head_kv * spec.head_dim
    for i in range(spec.n_layer):
        blk = f"blk.{i}"
        ones = np.ones(spec.n_embd, dtype=np.float32)
        writer.add_tensor(f"{blk}.attn_norm.weight", ones)
        writer.add_tensor(f"{blk}.attn_q.weight", _weight(rng, spec.n_embd, spec.n_embd))
        writer.add_tensor(f"{blk}.attn_k.weight", _weight(rng, kv, spec.n_embd))
        writer.add_tensor(f"{blk}.attn_v.weight", _weight(rng, kv, spec.n_embd))
        for name, n in (("attn_q", spec.n_embd), ("attn_k", kv), ("attn_v", kv)):
            bias = rng.standard_normal(n, dtype=np.float32) * 0.02
            writer.add_tensor(f"{blk}.{name}.bias", bias)
        writer.add_tensor(f"{blk}.attn_output.weight", _weight(rng, spec.n_embd, spec.n_embd))
        writer.add_tensor(f"{blk}.ffn_norm.weight", ones.copy())
        writer.add_tensor(f"{blk}.ffn_gate.weight", _weight(rng, spec.n_ff, spec.n_embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", _weight(rng, spec.n_ff, spec.n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", _weight(rng, spec.n_embd, spec.n_ff))


def add_mamba_layers(writer: gguf.GGUFWriter, spec: TinySpec, rng: np.random.Generator) -> None:
    """Mamba (v1) blocks; llama.cpp supports only an expansion factor of 2."""
    d_inner = 2 * spec.n_embd
    dt_rank = max(1, spec.n_embd // 16)
    writer.add_ssm_conv_kernel(spec.d_conv)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(spec.d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    # A = -exp(A_log) with A_log = log(1..d_state), as Mamba initialises it
    a = -np.tile(np.arange(1, spec.d_state + 1, dtype=np.float32), (d_inner, 1))
    for i in range(spec.n_layer):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(spec.n_embd, dtype=np.float32))
        writer.add_tensor(f"{blk}.ssm_in.weight", _weight(rng, 2 * d_inner, spec.n_embd))
        conv = rng.standard_normal((d_inner, spec.d_conv), dtype=np.float32) / spec.d_conv
        writer.add_tensor(f"{blk}.ssm_conv1d.weight", conv)
        writer.add_tensor(f"{blk}.ssm_conv1d.bias", np.zeros(d_inner, dtype=np.float32))
        x_proj = _weight(rng, dt_rank + 2 * spec.d_state, d_inner)
        writer.add_tensor(f"{blk}.ssm_x.weight", x_proj)
        writer.add_tensor(f"{blk}.ssm_dt.weight", _weight(rng, d_inner, dt_rank))
        writer.add_tensor(f"{blk}.ssm_dt.bias", np.full(d_inner, -2.0, dtype=np.float32))
        writer.add_tensor(f"{blk}.ssm_a", a.copy())
        writer.add_tensor(f"{blk}.ssm_d", np.ones(d_inner, dtype=np.float32))
        writer.add_tensor(f"{blk}.ssm_out.weight", _weight(rng, spec.n_embd, d_inner))


def build_pair(
    vocab_path: Path, out_dir: Path, seed: int = 0, n_ctx: int = TARGET.n_ctx
) -> tuple[Path, Path]:
    """The tiny target and draft, built from one vocabulary GGUF into `out_dir`, with a
    training context of `n_ctx` tokens (the most llama.cpp gives them)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = read_vocab(vocab_path)
    target = build(replace(TARGET, n_ctx=n_ctx), vocab, out_dir / f"{TARGET.name}.gguf", seed)
    draft = build(replace(DRAFT, n_ctx=n_ctx), vocab, out_dir / f"{DRAFT.name}.gguf", seed + 1)
    return target, draft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=Path, required=True, help="GGUF to take tokenizer.* from")
    parser.add_argument("--out-dir", type=Path, default=Path("tiny-models"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-ctx", type=int, default=TARGET.n_ctx, help="training context")
    args = parser.parse_args(argv)
    for path in build_pair(args.vocab, args.out_dir, args.seed, args.n_ctx):
        print(f"{path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
