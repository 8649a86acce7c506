#!/usr/bin/env python3
"""Random-weight twins of the models people run now, for tests and timing without weights.

Two shapes, each with the layer shapes of a published model at as many layers as asked:

- `hybrid`: Qwen3.5-0.8B (llama.cpp arch `qwen35`): Gated DeltaNet layers with one full
  attention layer in four, and one MTP head (`qwen35.nextn_predict_layers = 1`,
  tensors `blk.N.nextn.*` after the trunk), its 248,320-token vocabulary (the Qwen2
  tokens padded) tied with the embeddings; `hybrid-27b`: the same layers at Qwen3.6-27B's
  widths, its output head untied (~15 GB: for a GPU);
- `moe`: Qwen3-Coder-30B-A3B (`qwen3moe`): 128 experts of 768 rows, 8 used per token,
  no shared expert, 32 query heads over 4 KV heads of 128;
- `gemma4`: Gemma 4 12B (`gemma4`, dense): sliding-window layers (16 query heads over 8
  KV heads of 256, a 1,024-token window) with a full-attention layer in six (one KV head
  of 512, its keys its values), the last layer full; its 262,144-token vocabulary (Gemma
  3's tokens) tied with the embeddings. Beside it, its "assistant" drafter
  (`gemma4-assistant`, `gemma-4-12B-it-assistant`'s published shape): 4 blocks of 1,024
  that read the target's KV cache (its last sliding and last full layer) instead of a
  cache of their own, and its token embeddings, with the target's final state as input.

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
from make_tiny_gguf import (
    TinySpec,
    Vocab,
    Writer,
    copy_tokenizer,
    finish_gguf,
    read_vocab,
    start_gguf,
)

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


@dataclass(frozen=True)
class Gemma4:
    """Gemma 4 12B's shape (its text config: 48 layers, 40 sliding and 8 full)."""

    n_layer: int = 48
    n_embd: int = 3840
    n_head: int = 16
    kv_heads_swa: int = 8
    kv_heads_full: int = 1
    head_dim_swa: int = 256
    head_dim_full: int = 512
    n_ff: int = 15360
    full_every: int = 6  # a full-attention layer in six, counted from the last
    window: int = 1024
    n_vocab: int = 262_144

    def is_swa(self, i: int) -> bool:
        return (self.n_layer - 1 - i) % self.full_every != 0


@dataclass(frozen=True)
class Gemma4Assistant:
    """gemma-4-12B-it-assistant's shape (its GGUF's metadata: 4 blocks of 1,024, ffn 8,192,
    16 heads, the first three sliding)."""

    n_embd: int = 1024
    n_head: int = 16
    n_ff: int = 8192
    swa: tuple[bool, ...] = (True, True, True, False)


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

    def matrix(self, name: str, rows: int, cols: int, n: int = 1, scale: float = 1.0) -> None:
        """A (rows, cols) matrix in ggml's (out, in) order, n of them stacked (experts),
        its weights (q - 8) * d with d scaled like an init: rms ~ scale / sqrt(cols)."""
        block, size = gguf.GGML_QUANT_SIZES[Q.Q4_0]  # 32 weights: f16 d, 16 bytes of nibbles
        count = n * rows * cols // block
        blocks = np.empty((count, size), dtype=np.uint8)
        if self.pool is None:
            blocks[:, 2:] = self.nibbles(count)
        else:
            start = int(self.rng.integers(len(self.pool)))
            blocks[:, 2:] = np.resize(np.roll(self.pool, -start, axis=0), (count, size - 2))
        d = np.float16(scale / (4.3 * np.sqrt(cols)))  # 4.3: the rms of q - 8
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


def _gemma4_keys(
    w: gguf.GGUFWriter, t: Gemma4, swa: list[bool], vocab: Vocab, context: int
) -> None:
    """The keys a Gemma 4 model and its assistant share: attention by layer kind."""
    w.add_context_length(context)
    w.add_head_count([t.n_head] * len(swa))
    w.add_head_count_kv([t.kv_heads_swa if s else t.kv_heads_full for s in swa])
    w.add_key_length(t.head_dim_full)
    w.add_value_length(t.head_dim_full)
    w.add_key_length_swa(t.head_dim_swa)
    w.add_value_length_swa(t.head_dim_swa)
    w.add_rope_dimension_count(t.head_dim_full)
    w.add_rope_dimension_count_swa(t.head_dim_swa)
    w.add_rope_freq_base(1_000_000.0)
    w.add_rope_freq_base_swa(10_000.0)
    w.add_sliding_window(t.window)
    w.add_sliding_window_pattern(swa)
    w.add_layer_norm_rms_eps(1e-6)
    copy_tokenizer(w, vocab, t.n_vocab)


def _gemma4_attention(
    t: Tensors, blk: str, n_embd: int, n_head: int, head_dim: int, kv: int | None
) -> None:
    """A Gemma 4 attention block's tensors; kv=None: none of its own (an assistant's)."""
    ones = np.ones(n_embd)
    t.vector(f"{blk}.attn_norm.weight", ones)
    t.matrix(f"{blk}.attn_q", n_head * head_dim, n_embd)
    if kv is not None:
        t.matrix(f"{blk}.attn_k", kv * head_dim, n_embd)  # no attn_v: the keys are the values
        t.vector(f"{blk}.attn_k_norm.weight", np.ones(head_dim))
    t.matrix(f"{blk}.attn_output", n_embd, n_head * head_dim)
    t.vector(f"{blk}.attn_q_norm.weight", np.ones(head_dim))
    t.vector(f"{blk}.post_attention_norm.weight", ones)
    t.vector(f"{blk}.layer_output_scale.weight", np.ones(1))


def _gemma4_mlp(t: Tensors, blk: str, n_embd: int, n_ff: int) -> None:
    ones = np.ones(n_embd)
    t.vector(f"{blk}.ffn_norm.weight", ones)
    t.matrix(f"{blk}.ffn_gate", n_ff, n_embd)
    t.matrix(f"{blk}.ffn_up", n_ff, n_embd)
    t.matrix(f"{blk}.ffn_down", n_embd, n_ff)
    t.vector(f"{blk}.post_ffw_norm.weight", ones)


def write_gemma4(
    vocab: Vocab, path: Path, shape: Gemma4, seed: int = 0, fast: bool = False
) -> Path:
    s = shape
    if s.n_layer < 2 or not s.is_swa(s.n_layer - 2):  # the assistant reads both kinds
        raise ValueError("a Gemma 4 twin needs at least 2 layers, the last but one sliding")
    w = Writer(str(path), "gemma4")
    w.add_name(f"Gemma 4 12B shape, {s.n_layer} layers (random weights)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    swa = [s.is_swa(i) for i in range(s.n_layer)]
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_final_logit_softcapping(30.0)
    w.add_embedding_length_per_layer_input(0)  # the E2B/E4B models' per-layer inputs: none
    _gemma4_keys(w, s, swa, vocab, 262_144)
    t = Tensors(w, seed, fast)
    # Gemma scales its input embeddings by sqrt(width) and ties its output head to them:
    # at an init's scale a token's own row outweighs random layers, and every token
    # would predict itself
    t.matrix("token_embd", s.n_vocab, s.n_embd, scale=0.1)
    t.vector("output_norm.weight", np.ones(s.n_embd))
    t.vector("rope_freqs.weight", np.ones(s.head_dim_full // 2))
    for i in range(s.n_layer):
        blk = f"blk.{i}"
        kv, dim = (s.kv_heads_swa, s.head_dim_swa) if swa[i] else (s.kv_heads_full, s.head_dim_full)
        _gemma4_attention(t, blk, s.n_embd, s.n_head, dim, kv)
        _gemma4_mlp(t, blk, s.n_embd, s.n_ff)
    return finish_gguf(w, path)


def write_gemma4_assistant(
    vocab: Vocab, path: Path, target: Gemma4, shape: Gemma4Assistant, seed: int = 0
) -> Path:
    s, n = shape, len(shape.swa)
    w = Writer(str(path), "gemma4-assistant")
    w.add_name("Gemma 4 12B assistant shape (random weights)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_embedding_length(s.n_embd)
    w.add_embedding_length_out(target.n_embd)
    w.add_block_count(n)
    w.add_nextn_predict_layers(n)
    w.add_shared_kv_layers(n)
    w.add_feed_forward_length(s.n_ff)
    _gemma4_keys(w, replace(target, n_head=s.n_head), list(s.swa), vocab, 131_072)
    t = Tensors(w, seed)
    t.matrix("token_embd", target.n_vocab, s.n_embd)
    t.vector("output_norm.weight", np.ones(s.n_embd))
    t.vector("rope_freqs.weight", np.ones(target.head_dim_full // 2))
    # [embedding of x, the target's h] -> the blocks' width -> back to the target's width
    t.matrix("nextn.pre_projection", s.n_embd, 2 * target.n_embd)
    t.matrix("nextn.post_projection", target.n_embd, s.n_embd)
    for i, swa in enumerate(s.swa):
        dim = target.head_dim_swa if swa else target.head_dim_full
        _gemma4_attention(t, f"blk.{i}", s.n_embd, s.n_head, dim, None)
        _gemma4_mlp(t, f"blk.{i}", s.n_embd, s.n_ff)
    return finish_gguf(w, path)


def build(
    kind: str,
    vocab: Vocab,
    out_dir: Path,
    layers: int | None,
    seed: int = 0,
    fast: bool = False,
) -> Path:
    """Write the `kind` twin ("hybrid", "hybrid-27b", "moe", "gemma4" or
    "gemma4-assistant", the drafter of a gemma4 twin) into out_dir, with the tokenizer of
    the `vocab` GGUF (reading one takes seconds: read it once); layers=None: the real
    count."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if kind == "gemma4":
        g = Gemma4() if layers is None else Gemma4(n_layer=layers)
        return write_gemma4(vocab, out_dir / f"gemma4-12b-twin-{g.n_layer}l.gguf", g, seed, fast)
    if kind == "gemma4-assistant":
        path = out_dir / "gemma4-12b-assistant-twin.gguf"
        return write_gemma4_assistant(vocab, path, Gemma4(), Gemma4Assistant(), seed)
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
    kinds = ("hybrid", "hybrid-27b", "moe", "gemma4", "gemma4-assistant", "both")
    parser.add_argument("--kind", choices=kinds, default="both")
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
