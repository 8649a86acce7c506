#!/usr/bin/env python3
"""Build tiny random-weight qwen2 GGUFs (a target and a draft) for timing the engine.

The weights are random, so the text is nonsense, but the vocabulary is real: every
`tokenizer.*` key is copied from a vocabulary GGUF (llama.cpp's
models/ggml-vocab-qwen2.gguf, or any Qwen2/2.5 model file), so both models have the
152k-token Qwen2 vocabulary and all vocabulary-wide work on the logits (argmax, top-2,
softmax, the device-to-host copy of each logits row) costs what it costs on a real pair.
The layers are tiny, so a pass is dominated by fixed costs (kernel launches, the
lm_head, the logits copy): the worst case for per-round Python overhead.

Embeddings are tied (no output.weight, as in Qwen2.5 0.5B/1.5B) and stored as Q8_0 by
default to keep the files small (~41 MB target, ~21 MB draft); the layers are F16.

    python scripts/make_tiny_gguf.py --vocab path/to/vocab.gguf --out-dir DIR
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

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

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


TARGET = TinySpec("tiny-qwen2-target", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=1024)
DRAFT = TinySpec("tiny-qwen2-draft", n_layer=2, n_embd=128, n_head=2, n_head_kv=1, n_ff=512)


def copy_tokenizer(writer: gguf.GGUFWriter, vocab: gguf.GGUFReader) -> int:
    """Copy every tokenizer.* key (strings as raw bytes); returns the vocabulary size."""
    n_vocab = 0
    for key, field in vocab.fields.items():
        if not key.startswith("tokenizer."):
            continue
        main = gguf.GGUFValueType(field.types[0])
        if main == gguf.GGUFValueType.ARRAY:
            sub = gguf.GGUFValueType(field.types[-1])
            if sub == gguf.GGUFValueType.STRING:
                value: object = [bytes(field.parts[i]) for i in field.data]
            else:
                value = field.contents()
            writer.add_key_value(key, value, main, sub)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(field.data)
        elif main == gguf.GGUFValueType.STRING:
            writer.add_key_value(key, bytes(field.parts[field.data[0]]), main)
        else:
            writer.add_key_value(key, field.contents(), main)
    if not n_vocab:
        raise ValueError("the vocabulary GGUF has no tokenizer.ggml.tokens")
    return n_vocab


def _weight(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A random (rows, cols) matrix in ggml's (out, in) order, scaled like an init."""
    return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)


def build(spec: TinySpec, vocab: gguf.GGUFReader, path: Path, seed: int = 0) -> Path:
    """Write one tiny model to `path`."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_name(spec.name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(spec.n_ctx)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    n_vocab = copy_tokenizer(writer, vocab)

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

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def build_pair(vocab_path: Path, out_dir: Path, seed: int = 0) -> tuple[Path, Path]:
    """The tiny target and draft, built from one vocabulary GGUF into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = gguf.GGUFReader(str(vocab_path))
    target = build(TARGET, vocab, out_dir / f"{TARGET.name}.gguf", seed)
    draft = build(DRAFT, vocab, out_dir / f"{DRAFT.name}.gguf", seed + 1)
    return target, draft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=Path, required=True, help="GGUF to take tokenizer.* from")
    parser.add_argument("--out-dir", type=Path, default=Path("tiny-models"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for path in build_pair(args.vocab, args.out_dir, args.seed):
        print(f"{path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
