#!/usr/bin/env python3
"""Random-weight twins of the models people run now, for tests and timing without weights.

Two shapes, each with the layer shapes of a published model at as many layers as asked:

- `hybrid`: Qwen3.5-0.8B (llama.cpp arch `qwen35`): Gated DeltaNet layers with one full
  attention layer in four, and one MTP head (`qwen35.nextn_predict_layers = 1`,
  tensors `blk.N.nextn.*` after the trunk), its 248,320-token vocabulary (the Qwen2
  tokens padded) tied with the embeddings; `hybrid-27b`: the same layers at Qwen3.6-27B's
  widths, its output head untied (~15 GB: for a GPU);
- `moe`: Qwen3-Coder-30B-A3B (`qwen3moe`): 128 experts of 768 rows, 8 used per token,
  no shared expert, 32 query heads over 4 KV heads of 128.

Matrices are Q4_0: 4.5 bits a weight, what the published Q4_K_M file's layers read, and
symmetric around zero (random Q4_K blocks carry a common offset that makes every token
predict the same next one, which any n-gram drafter would then guess); norms and the
recurrent layers' small vectors are F32. Random weights make every drafter wrong: the
twins test what speculation costs where nothing is accepted, and that the caches and the
recurrent state stay exact, never acceptance.

    python scripts/make_twin_gguf.py --vocab VOCAB.gguf --out-dir DIR [--layers 4]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_gguf import TinySpec, Vocab, finish_gguf, read_vocab, start_gguf

Q = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class Hybrid:
    """Qwen3.5-0.8B's shape (its config.json)."""

    n_layer: int = 24
    n_embd: int = 1024
    n_head: int = 8
    n_head_kv: int = 2
    head_dim: int = 256
    n_ff: int = 3584
    attention_every: int = 4  # full_attention_interval: layer i is attention if (i+1) % 4 == 0
    rope_dims: int = 64  # partial_rotary_factor 0.25 of 256
    ssm_conv: int = 4
    ssm_state: int = 128  # linear key/value head dim
    ssm_groups: int = 16  # linear key heads
    ssm_heads: int = 16  # linear value heads
    n_nextn: int = 1  # MTP heads
    n_vocab: int = 248_320
    tied: bool = True  # the output head is the embedding table
    label: str = "Qwen3.5-0.8B"


# Qwen3.6-27B's shape (docs/models-sources.md): 48 DeltaNet + 16 attention layers, the
# MTP head, an untied output head
HYBRID_27B = Hybrid(
    n_layer=64,
    n_embd=5120,
    n_head=24,
    n_head_kv=4,
    n_ff=17408,
    ssm_heads=48,
    tied=False,
    label="Qwen3.6-27B",
)


@dataclass(frozen=True)
class Moe:
    """Qwen3-Coder-30B-A3B-Instruct's layer shape (48 layers published)."""

    n_layer: int = 48
    n_embd: int = 2048
    n_head: int = 32
    n_head_kv: int = 4
    head_dim: int = 128
    n_expert: int = 128
    n_expert_used: int = 8
    expert_ff: int = 768
    n_vocab: int = 151_936


# each byte with a 0 nibble made 8 (one table lookup per byte: ~5x numpy's bit arithmetic)
_BYTES = np.arange(256, dtype=np.uint8)
NONZERO_NIBBLES = (
    _BYTES | np.where(_BYTES & 0x0F, 0, 0x08) | np.where(_BYTES & 0xF0, 0, 0x80)
).astype(np.uint8)


class Tensors:
    """Adds named tensors: matrices as random Q4_0 blocks, vectors as given."""

    def __init__(self, writer: gguf.GGUFWriter, seed: int, fast: bool = False) -> None:
        self.w, self.rng = writer, np.random.default_rng(seed)
        # fast: each matrix a stretch of one pool of random blocks (a pass costs the same;
        # drawing 15-17 GB of fresh blocks took minutes of a lent GPU machine)
        self.pool = self.nibbles(1 << 21) if fast else None

    def nibbles(self, count: int) -> np.ndarray:
        """count blocks' random nibbles, 0 made 8: q - 8 in -7..7, symmetric around 0
        (0..15 would add a common -0.5 to every weight, a direction each layer amplifies
        until every token predicts the same one)."""
        size = gguf.GGML_QUANT_SIZES[Q.Q4_0][1] - 2
        raw = np.frombuffer(self.rng.bytes(count * size), dtype=np.uint8)
        return NONZERO_NIBBLES[raw].reshape(count, size)

    def matrix(self, name: str, rows: int, cols: int, n: int = 1) -> None:
        """A (rows, cols) matrix in ggml's (out, in) order, n of them stacked (experts),
        its weights (q - 8) * d with d scaled like an init: rms ~ 1/sqrt(cols)."""
        block, size = gguf.GGML_QUANT_SIZES[Q.Q4_0]  # 32 weights: f16 d, 16 bytes of nibbles
        count = n * rows * cols // block
        blocks = np.empty((count, size), dtype=np.uint8)
        if self.pool is None:
            blocks[:, 2:] = self.nibbles(count)
        else:
            start = int(self.rng.integers(len(self.pool)))
            blocks[:, 2:] = np.resize(np.roll(self.pool, -start, axis=0), (count, size - 2))
        d = np.float16(1.0 / (4.3 * np.sqrt(cols)))  # 4.3: the rms of q - 8
        blocks[:, :2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
        data = blocks.reshape(n, rows, -1) if n > 1 else blocks.reshape(rows, -1)
        self.w.add_tensor(f"{name}.weight", data, raw_dtype=Q.Q4_0)

    def vector(self, name: str, values: np.ndarray) -> None:
        self.w.add_tensor(name, values.astype(np.float32))


def _spec(name: str, n_layer: int, n_embd: int, n_head: int, kv: int, ff: int, vocab: int):
    return TinySpec(name, n_layer, n_embd, n_head, kv, ff, n_ctx=32768, n_vocab=vocab)


def write_hybrid(
    vocab: Vocab, path: Path, shape: Hybrid, seed: int = 0, fast: bool = False
) -> Path:
    s = shape
    if s.n_layer < s.attention_every:  # llama.cpp aborts on a hybrid without attention
        raise ValueError(f"a hybrid twin needs at least {s.attention_every} layers")
    n_all = s.n_layer + s.n_nextn
    spec = _spec("qwen35-twin", n_all, s.n_embd, s.n_head, s.n_head_kv, s.n_ff, s.n_vocab)
    name = f"{s.label} shape, {s.n_layer} layers (random weights)"
    w, _ = start_gguf(path, "qwen35", name, gguf.LlamaFileType.MOSTLY_Q4_0, spec, vocab)
    w.add_rope_freq_base(10_000_000.0)
    w.add_rope_dimension_count(s.rope_dims)
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_ssm_conv_kernel(s.ssm_conv)
    w.add_ssm_state_size(s.ssm_state)
    w.add_ssm_group_count(s.ssm_groups)
    w.add_ssm_time_step_rank(s.ssm_heads)
    w.add_ssm_inner_size(s.ssm_state * s.ssm_heads)
    w.add_full_attention_interval(s.attention_every)
    w.add_nextn_predict_layers(s.n_nextn)
    t, rng = Tensors(w, seed, fast), np.random.default_rng(seed)
    ones = np.ones(s.n_embd)

    t.matrix("token_embd", s.n_vocab, s.n_embd)
    t.vector("output_norm.weight", ones)
    if not s.tied:
        t.matrix("output", s.n_vocab, s.n_embd)

    def attention(blk: str) -> None:
        q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
        t.matrix(f"{blk}.attn_q", 2 * q, s.n_embd)  # the query and its output gate
        t.matrix(f"{blk}.attn_k", kv, s.n_embd)
        t.matrix(f"{blk}.attn_v", kv, s.n_embd)
        t.matrix(f"{blk}.attn_output", s.n_embd, q)
        t.vector(f"{blk}.attn_q_norm.weight", np.ones(s.head_dim))
        t.vector(f"{blk}.attn_k_norm.weight", np.ones(s.head_dim))

    def delta_net(blk: str) -> None:
        key, value = s.ssm_state * s.ssm_groups, s.ssm_state * s.ssm_heads
        conv = 2 * key + value
        t.matrix(f"{blk}.attn_qkv", conv, s.n_embd)
        t.matrix(f"{blk}.attn_gate", value, s.n_embd)
        t.vector(f"{blk}.ssm_conv1d.weight", rng.standard_normal((conv, s.ssm_conv)) / s.ssm_conv)
        t.vector(f"{blk}.ssm_dt.bias", np.zeros(s.ssm_heads))
        t.vector(f"{blk}.ssm_a", -np.linspace(1.0, 16.0, s.ssm_heads))
        t.matrix(f"{blk}.ssm_beta", s.ssm_heads, s.n_embd)
        t.matrix(f"{blk}.ssm_alpha", s.ssm_heads, s.n_embd)
        t.vector(f"{blk}.ssm_norm.weight", np.ones(s.ssm_state))
        t.matrix(f"{blk}.ssm_out", s.n_embd, value)

    def mlp(blk: str) -> None:
        t.matrix(f"{blk}.ffn_gate", s.n_ff, s.n_embd)
        t.matrix(f"{blk}.ffn_up", s.n_ff, s.n_embd)
        t.matrix(f"{blk}.ffn_down", s.n_embd, s.n_ff)

    for i in range(n_all):
        blk = f"blk.{i}"
        t.vector(f"{blk}.attn_norm.weight", ones)
        t.vector(f"{blk}.post_attention_norm.weight", ones)
        if i >= s.n_layer or (i + 1) % s.attention_every == 0:
            attention(blk)
        else:
            delta_net(blk)
        mlp(blk)
        if i >= s.n_layer:  # the MTP head: [norm(embedding of x), norm(h)] -> n_embd
            t.matrix(f"{blk}.nextn.eh_proj", s.n_embd, 2 * s.n_embd)
            t.vector(f"{blk}.nextn.enorm.weight", ones)
            t.vector(f"{blk}.nextn.hnorm.weight", ones)
            t.vector(f"{blk}.nextn.shared_head_norm.weight", ones)
    return finish_gguf(w, path)


def write_moe(vocab: Vocab, path: Path, shape: Moe, seed: int = 0, fast: bool = False) -> Path:
    s = shape
    spec = _spec("qwen3moe-twin", s.n_layer, s.n_embd, s.n_head, s.n_head_kv, 6144, s.n_vocab)
    name = f"Qwen3-Coder-30B-A3B shape, {s.n_layer} layers (random weights)"
    w, _ = start_gguf(path, "qwen3moe", name, gguf.LlamaFileType.MOSTLY_Q4_0, spec, vocab)
    w.add_rope_freq_base(10_000_000.0)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_expert_count(s.n_expert)
    w.add_expert_used_count(s.n_expert_used)
    w.add_expert_feed_forward_length(s.expert_ff)
    t = Tensors(w, seed, fast)
    ones = np.ones(s.n_embd)
    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    t.matrix("token_embd", s.n_vocab, s.n_embd)
    t.vector("output_norm.weight", ones)
    t.matrix("output", s.n_vocab, s.n_embd)
    for i in range(s.n_layer):
        blk = f"blk.{i}"
        t.vector(f"{blk}.attn_norm.weight", ones)
        t.matrix(f"{blk}.attn_q", q, s.n_embd)
        t.matrix(f"{blk}.attn_k", kv, s.n_embd)
        t.matrix(f"{blk}.attn_v", kv, s.n_embd)
        t.matrix(f"{blk}.attn_output", s.n_embd, q)
        t.vector(f"{blk}.attn_q_norm.weight", np.ones(s.head_dim))
        t.vector(f"{blk}.attn_k_norm.weight", np.ones(s.head_dim))
        t.vector(f"{blk}.ffn_norm.weight", ones)
        # the router stays F32, as the converter leaves it
        w.add_tensor(f"{blk}.ffn_gate_inp.weight", _router(s, i))
        t.matrix(f"{blk}.ffn_gate_exps", s.expert_ff, s.n_embd, s.n_expert)
        t.matrix(f"{blk}.ffn_up_exps", s.expert_ff, s.n_embd, s.n_expert)
        t.matrix(f"{blk}.ffn_down_exps", s.n_embd, s.expert_ff, s.n_expert)
    return finish_gguf(w, path)


def _router(s: Moe, layer: int) -> np.ndarray:
    """Random routing logits, so tokens spread over the experts as a trained router's do."""
    rng = np.random.default_rng(1000 + layer)
    return (rng.standard_normal((s.n_expert, s.n_embd)) / np.sqrt(s.n_embd)).astype(np.float32)


def build(
    kind: str,
    vocab: Vocab,
    out_dir: Path,
    layers: int | None,
    seed: int = 0,
    fast: bool = False,
) -> Path:
    """Write the `kind` twin ("hybrid", "hybrid-27b" or "moe") into out_dir, with the
    tokenizer of the `vocab` GGUF (reading one takes seconds: read it once); layers=None:
    the real count."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if kind in ("hybrid", "hybrid-27b"):
        h = Hybrid() if kind == "hybrid" else HYBRID_27B
        h = h if layers is None else replace(h, n_layer=layers)
        size = "0.8b" if kind == "hybrid" else "27b"
        return write_hybrid(vocab, out_dir / f"qwen35-{size}-twin-{h.n_layer}l.gguf", h, seed, fast)
    m = Moe() if layers is None else Moe(n_layer=layers)
    return write_moe(vocab, out_dir / f"qwen3moe-30b-a3b-twin-{m.n_layer}l.gguf", m, seed, fast)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=Path, required=True, help="GGUF to take tokenizer.* from")
    parser.add_argument("--out-dir", type=Path, default=Path("twins"))
    parser.add_argument("--kind", choices=("hybrid", "hybrid-27b", "moe", "both"), default="both")
    parser.add_argument("--layers", type=int, help="layers (default: the published model's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    vocab = read_vocab(args.vocab)
    for kind in ("hybrid", "moe") if args.kind == "both" else (args.kind,):
        path = build(kind, vocab, args.out_dir, args.layers, args.seed)
        print(f"{path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
