"""What a model file costs in memory, and where llama.cpp can put it.

A model's footprint is its weights (per layer: the GGUF header's tensor sizes for a
downloaded file, the catalog's file size spread over the layers otherwise), its KV cache
(2 x layers x KV heads x head size x 2 bytes per token of context, f16), compute
buffers, and a little host overhead. llama.cpp offloads the *last* n layers and, when
all are offloaded, the output head; the token embeddings always stay in RAM.

Placement puts the draft wholly on the GPU first (a partly offloaded draft is slower than
the time it saves), then as many target layers as fit. A mixture-of-experts target goes
wholly on the GPU but for the routed experts of its first layers, as few as it takes to
fit (llama.cpp's `--n-cpu-moe`): attention, shared experts, the head and the KV cache
are read by every token, an expert by few, so the experts are what the CPU should hold.
On Apple Silicon GPU and CPU share one budget. With rpc-servers (`--rpc`) every target
layer and the output head go to the devices, the servers' and this machine's GPUs, which
llama.cpp fills in proportion to their free memory; the draft stays here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from localspec.backends.gguf import (
    GgufError,
    GgufInfo,
    gguf_info_or_none,
    layer_state_bytes,
    split_parts,
)
from localspec.drafting import GAMMA_MAX, LASTING_CHECKPOINTS
from localspec.models.catalog import ModelEntry, Quant
from localspec.models.hardware import GiB, Hardware, MiB, fmt_size

UBATCH = 512  # llama.cpp's default micro-batch: compute buffers scale with it
KV_ELEMENT_BYTES = 2  # f16 K and V
HOST_OVERHEAD = 160 * MiB  # per model: llama.cpp's host structures, logits, the process
VRAM_RESERVE = 512 * MiB  # per GPU at least: the CUDA/Metal context, fragmentation
VRAM_RESERVE_SHARE = 0.05
RAM_RESERVE = 1 * GiB  # at least, for the OS and everything else running
RAM_RESERVE_SHARE = 0.10

# Weight bytes per parameter of the embedding and output tensors in each file type
# (llama.cpp keeps the output head at Q6_K in the K-quant mixes).
EMBD_BYTES = {"Q4_K_M": 0.5625, "Q5_K_M": 0.6875, "Q6_K": 0.8203, "Q8_0": 1.0625, "F16": 2.0}
# The share of a file's layers llama.cpp repacks on x86 (gguf.REPACKED_TYPES), where the
# file was not read: Q4_K_M keeps some of them at Q6_K (Qwen2.5-Coder-1.5B's: 0.79)
REPACKED_SHARE = {"Q4_K_M": 0.8, "Q4_0": 1.0, "IQ4_NL": 1.0}
OUTPUT_BYTES = {"Q4_K_M": 0.8203, "Q5_K_M": 0.8203, "Q6_K": 0.8203, "Q8_0": 1.0625, "F16": 2.0}
# ... where the embedding width is no multiple of a K-quant's 256-value block (Qwen2.5's
# 0.5B: 896), for which llama.cpp's quantizer falls back: Q4_K to Q5_0, Q5_K to Q5_1,
# Q6_K to Q8_0 (the 0.5B's table is Q5_0, its head Q8_0)
K_BLOCK = 256
EMBD_FALLBACK = {"Q4_K_M": 0.6875, "Q5_K_M": 0.75, "Q6_K": 1.0625}
OUTPUT_FALLBACK = {"Q4_K_M": 1.0625, "Q5_K_M": 1.0625, "Q6_K": 1.0625}


@dataclass(frozen=True)
class Weights:
    """What placement needs to know about one model file."""

    layers: tuple[int, ...]  # bytes of each repeating layer, first to last
    embd: int  # token embeddings and small tensors: always in RAM
    output: int  # the output head; 0 when tied to the embeddings
    kv_per_token_layer: int  # K + V bytes for one token in one layer
    vocab: int
    embedding: int
    experts: tuple[int, ...] = ()  # a MoE's routed expert bytes in each layer (within layers)
    expert_share: float = 1.0  # the share of them one token reads (active / experts)
    state: int = 0  # a recurrent state and its rollback snapshots (hybrid models)
    recurrent_layers: int = 0  # layers with a recurrent state instead of attention
    kept: int = 0  # copies of the state in RAM: a draft round's and the lasting checkpoints
    repacked: int = 0  # bytes llama.cpp repacks for an x86 CPU (gguf.REPACKED_TYPES)

    @property
    def head(self) -> int:
        """The output head's bytes on a GPU (a tied head is copied there)."""
        return self.output or self.embd

    @property
    def total(self) -> int:
        return sum(self.layers) + self.embd + self.output

    @property
    def is_moe(self) -> bool:
        return bool(self.experts)

    @property
    def read_share(self) -> float:
        """The share of the file one token's pass reads: 1 for a dense model, a MoE's
        less the routed experts it is not sent to (Qwen3-Coder-30B-A3B: ~0.1)."""
        unread = sum(self.experts) * (1 - self.expert_share)
        return (self.total - unread) / self.total if self.total else 1.0

    def read_per_token(self, layer: int) -> float:
        """Bytes of a layer one token reads: all but the experts it is not routed to."""
        return self.read_by(layer, 1)

    def read_by(self, layer: int, tokens: int) -> float:
        """Bytes of a layer a pass of `tokens` reads: all but the experts none of them is
        routed to (each token routed independently: the worst case)."""
        experts = self.experts[layer] if self.experts else 0
        routed = 1 - (1 - self.expert_share) ** tokens
        return self.layers[layer] - experts + experts * routed

    @classmethod
    def from_gguf(cls, info: GgufInfo) -> Weights:
        kv = 2 * info.kv_heads * info.head_dim * KV_ELEMENT_BYTES
        if info.recurrent:  # a hybrid: one layer in `attention_every` has a KV cache
            kv //= max(1, info.attention_every)
        share = info.experts_used / info.experts if info.experts else 1.0
        return cls(
            info.layer_bytes,
            info.embd_bytes,
            info.output_bytes,
            kv,
            info.vocab,
            info.embedding,
            info.expert_bytes,
            share,
            # the state and the snapshots a drafting session keeps to roll drafts back
            info.state_bytes * (1 + GAMMA_MAX),
            _recurrent(len(info.layer_bytes), info.attention_every) if info.recurrent else 0,
            info.state_bytes * (1 + LASTING_CHECKPOINTS),
            _repacked(info.quant, sum(info.layer_bytes))
            if info.repacked_bytes is None
            else info.repacked_bytes,
        )

    @classmethod
    def estimate(cls, model: ModelEntry, quant: Quant) -> Weights:
        """From the catalog: the file size, less embeddings and head, spread evenly."""
        shape = model.shape
        table = shape.vocab * shape.embedding
        whole = shape.embedding % K_BLOCK == 0
        embd_bytes = (EMBD_BYTES if whole else EMBD_BYTES | EMBD_FALLBACK).get(quant.name, 1.0)
        output_bytes = (OUTPUT_BYTES if whole else OUTPUT_BYTES | OUTPUT_FALLBACK).get(
            quant.name, 1.0
        )
        embd = int(table * embd_bytes)
        output = 0 if shape.tied_embeddings else int(table * output_bytes)
        body = max(quant.size - embd - output, quant.size // 3)
        per_layer = body // shape.layers
        kv = 2 * shape.kv_heads * shape.head_dim * KV_ELEMENT_BYTES // shape.attention_every
        experts: tuple[int, ...] = ()
        share = 1.0
        if model.moe is not None:  # the file's bytes per parameter, over the experts
            per_param = quant.size / (model.params * 1e9)
            layer_experts = min(
                int(model.moe.expert_params(shape.embedding) * per_param), per_layer
            )
            experts, share = (layer_experts,) * shape.layers, model.moe.active / model.moe.experts
        recurrent = _recurrent(shape.layers, shape.attention_every)
        state = 0
        if (r := shape.recurrent) is not None:  # as the file's keys will say (from_gguf)
            d_inner = r.head_dim * r.value_heads
            state = recurrent * layer_state_bytes(r.conv_kernel, d_inner, r.head_dim, r.key_heads)
        return cls(
            (per_layer,) * shape.layers,
            embd,
            output,
            kv,
            shape.vocab,
            shape.embedding,
            experts,
            share,
            state * (1 + GAMMA_MAX),
            recurrent,
            state * (1 + LASTING_CHECKPOINTS),
            _repacked(quant.name, body),
        )


def _repacked(quant: str, layers: int) -> int:
    """The repacked share of a file's layers by its type, where the file was not read."""
    return int(REPACKED_SHARE.get(quant, 0.0) * layers)


def reader_bytes(weights: Weights, n_ctx: int) -> int:
    """RAM a prompt reader of a CPU target takes (backends/reader.py): the file pages of
    the tensors llama.cpp repacked (the reader maps them as the file lays them out), a
    cache of one sequence and its compute buffers; 0 where nothing is repacked."""
    if not weights.repacked:
        return 0
    kv = n_ctx * weights.kv_per_token_layer * len(weights.layers)  # as `footprint` counts it
    return weights.repacked + kv + compute_bytes(weights, n_ctx)


def _recurrent(layers: int, attention_every: int) -> int:
    """A hybrid's layers without attention: all but one in `attention_every`."""
    return layers - layers // attention_every if attention_every > 1 else 0


@dataclass(frozen=True)
class Budget:
    vram: int  # bytes the GPU(s) may take; 0 without a usable GPU
    ram: int
    unified: bool  # Apple: vram + ram together must fit in ram
    remote: int = 0  # bytes the rpc-servers' devices may take (the target's layers only)

    def holds(self, vram: int, ram: int) -> bool:
        """Whether `vram` bytes on the GPU and `ram` in RAM fit this budget."""
        if vram > self.vram:
            return False
        return (ram + vram if self.unified else ram) <= self.ram


@dataclass(frozen=True)
class Placement:
    n_ctx: int
    target_layers: int  # llama.cpp's n_gpu_layers: layers + 1 means the output head too
    draft_on_gpu: bool
    vram: int
    ram: int
    remote: int = 0  # the target's bytes on the rpc-servers
    cpu_moe: int = 0  # the routed experts of the target's first this many layers in RAM


@dataclass(frozen=True)
class Requirement:
    """What one model needs at the smallest context, beside what the budget has."""

    on_gpu: bool  # wholly on the GPU (else wholly on the CPU)
    vram: int
    ram: int
    budget: Budget

    def describe(self) -> str:
        """In words, for an error or a reason: '12.0 GiB of RAM (you have ...)'."""
        have = self.budget
        if self.on_gpu and have.remote:
            devices = have.remote + have.vram
            return (
                f"{fmt_size(self.vram)} on the rpc-servers{' and GPU' if have.vram else ''} "
                f"(they have {fmt_size(devices)} to spare) and {fmt_size(self.ram)} of RAM "
                f"(you have {fmt_size(have.ram)})"
            )
        if self.on_gpu and have.unified:
            return (
                f"{fmt_size(self.vram + self.ram)} of memory, {fmt_size(self.vram)} of it for "
                f"the GPU (you have {fmt_size(have.ram)}, {fmt_size(have.vram)} for the GPU)"
            )
        if self.on_gpu:
            return (
                f"{fmt_size(self.vram)} of GPU memory to run wholly on the GPU (you have "
                f"{fmt_size(have.vram)} to spare)"
            )
        return f"{fmt_size(self.ram)} of RAM (you have {fmt_size(have.ram)} to spare)"


def memory_budget(hw: Hardware) -> Budget:
    """What a plan may use: free memory less headroom."""
    ram = int(hw.ram_available - max(RAM_RESERVE, RAM_RESERVE_SHARE * hw.ram_total))
    vram = 0
    if hw.gpu_usable:
        for gpu in hw.gpus:
            usable = gpu.usable
            if usable is None:
                continue
            vram += _spare(usable, gpu.total or usable)
    remote = sum(_spare(r.free, r.total) for r in hw.remote)  # reported like a GPU's
    return Budget(vram=vram, ram=max(ram, 0), unified=hw.unified, remote=remote)


def _spare(free: int, total: int) -> int:
    """What a device's plan may take of its `free` bytes: a reserve kept back."""
    return max(0, free - max(VRAM_RESERVE, int(VRAM_RESERVE_SHARE * total)))


def compute_bytes(weights: Weights, n_ctx: int) -> int:
    """Compute buffers for one micro-batch: logits, activations, attention scratch."""
    return 4 * UBATCH * (weights.vocab + 8 * weights.embedding + n_ctx // 8)


def footprint(
    weights: Weights, n_ctx: int, gpu_layers: int, cpu_moe: int = 0, seqs: int = 1
) -> tuple[int, int]:
    """(VRAM, RAM) bytes of one model with `gpu_layers` offloaded (llama.cpp's count:
    more than the layer count puts the output head on the GPU too) and the routed experts
    of the first `cpu_moe` layers kept in RAM; `seqs` sequences (serve's slots) share
    the n_ctx cells of the KV cache, and each has a recurrent state of its own."""
    n = len(weights.layers)
    weights = replace(weights, state=weights.state * seqs, kept=weights.kept * seqs)
    on_gpu = max(0, min(gpu_layers, n))
    head_on_gpu = gpu_layers > n
    kv_layer = n_ctx * weights.kv_per_token_layer
    experts_in_ram = sum(weights.experts[n - on_gpu : cpu_moe]) if weights.experts else 0
    state_on_gpu = weights.state * on_gpu // n if n else 0  # it lives with its layers
    vram = (
        sum(weights.layers[n - on_gpu :])
        - experts_in_ram
        + on_gpu * kv_layer
        + state_on_gpu
        + (weights.head if head_on_gpu else 0)
    )
    ram = (
        sum(weights.layers[: n - on_gpu])
        + experts_in_ram
        + (n - on_gpu) * kv_layer
        + weights.state
        - state_on_gpu
        + weights.kept
        + weights.embd
        + HOST_OVERHEAD
        + (0 if head_on_gpu else weights.output)
    )
    compute = compute_bytes(weights, n_ctx)
    if gpu_layers > 0:
        vram += compute
        ram += compute // 4  # the CPU keeps a smaller buffer for its share
    else:
        ram += compute
    return vram, ram


def place(
    target: Weights,
    draft: Weights | None,
    n_ctx: int,
    budget: Budget,
    hw: Hardware,
    seqs: int = 1,
) -> Placement | None:
    """The draft wholly on the GPU (if there is one), then as many target layers as
    fit; None when not even the all-CPU placement fits. With a usable GPU a draft that
    does not fit there wholly is not placed at all (llama.cpp would offload it anyway).
    `seqs` sequences share the n_ctx cells (see `footprint`)."""
    draft_vram = draft_ram = 0
    draft_on_gpu = False
    if draft is not None:
        if hw.gpu_usable:
            draft_vram, draft_ram = footprint(draft, n_ctx, len(draft.layers) + 1, seqs=seqs)
            if not budget.holds(draft_vram, draft_ram):
                return None
            draft_on_gpu = True
        else:
            draft_vram, draft_ram = footprint(draft, n_ctx, 0, seqs=seqs)
    if budget.remote:
        return _place_on_servers(
            target, n_ctx, budget, hw, draft_on_gpu, draft_vram, draft_ram, seqs
        )
    top = len(target.layers) + 1 if hw.gpu_usable else 0
    if target.is_moe and top:
        for cpu_moe in range(len(target.layers) + 1):  # the fewest experts in RAM that fit
            target_vram, target_ram = footprint(target, n_ctx, top, cpu_moe, seqs)
            vram, ram = draft_vram + target_vram, draft_ram + target_ram
            if budget.holds(vram, ram):
                return Placement(n_ctx, top, draft_on_gpu, vram, ram, cpu_moe=cpu_moe)
    for layers in range(top, -1, -1):
        target_vram, target_ram = footprint(target, n_ctx, layers, seqs=seqs)
        vram, ram = draft_vram + target_vram, draft_ram + target_ram
        if budget.holds(vram, ram):
            return Placement(n_ctx, layers, draft_on_gpu, vram, ram)
    return None


def _place_on_servers(
    target: Weights,
    n_ctx: int,
    budget: Budget,
    hw: Hardware,
    draft_on_gpu: bool,
    draft_vram: int,
    draft_ram: int,
    seqs: int = 1,
) -> Placement | None:
    """Every target layer and the head on the devices: the servers' and the local GPUs'
    share in proportion to what each has free (llama.cpp's split)."""
    layers = len(target.layers) + 1
    on_devices, ram = footprint(target, n_ctx, layers, seqs=seqs)
    gpu_free = max(0, budget.vram - draft_vram) if hw.gpu_usable else 0
    local = on_devices * gpu_free // (gpu_free + budget.remote)
    remote = on_devices - local
    if remote > budget.remote or not budget.holds(draft_vram + local, draft_ram + ram):
        return None
    return Placement(n_ctx, layers, draft_on_gpu, draft_vram + local, draft_ram + ram, remote)


MAX_SLOTS = 4  # serve's default at most: an editor, a chat, an agent, and one more


def slots_that_fit(
    target: Weights,
    draft: Weights | None,
    n_ctx: int,
    budget: Budget,
    hw: Hardware,
    most: int = MAX_SLOTS,
) -> int:
    """How many sequences of n_ctx tokens each (serve's slots: a KV cache each, in both
    models) the pair can hold at once, up to `most`, without giving up a GPU layer, a
    layer's experts or the draft's place on the GPU for them; at least 1."""
    one = place(target, draft, n_ctx, budget, hw)
    if one is None:
        return 1
    for n in range(most, 1, -1):
        more = place(target, draft, n * n_ctx, budget, hw, seqs=n)
        if (
            more is not None
            and more.target_layers >= one.target_layers
            and more.cpu_moe <= one.cpu_moe
            and more.draft_on_gpu >= one.draft_on_gpu
        ):
            return n
    return 1


def requirement(weights: Weights, n_ctx: int, budget: Budget, hw: Hardware) -> Requirement:
    """What `weights` need at `n_ctx`: wholly on the devices (rpc-servers, GPU) where there
    are some, else in RAM."""
    if hw.gpu_usable or budget.remote:
        vram, ram = footprint(weights, n_ctx, len(weights.layers) + 1)
        return Requirement(True, vram, ram, budget)
    _, ram = footprint(weights, n_ctx, 0)
    return Requirement(False, 0, ram, budget)


def fit(weights: Weights, n_ctx: int, budget: Budget, hw: Hardware) -> str:
    """Where one model alone fits at `n_ctx`: 'GPU' (wholly), 'GPU+CPU', 'CPU', or 'no'."""
    placement = place(weights, None, n_ctx, budget, hw)
    if placement is None:
        return "no"
    if not hw.gpu_usable or placement.target_layers == 0:
        return "CPU"
    return "GPU" if placement.target_layers > len(weights.layers) else "GPU+CPU"


def moe_weights(path: Path) -> Weights | None:
    """A MoE model file's weights, from its header (every part of a split file); None for
    a dense model, or a file whose header cannot be read."""
    try:
        info = gguf_info_or_none(split_parts(path)) if path.is_file() else None
    except GgufError:  # a split file with a part missing
        return None
    return Weights.from_gguf(info) if info is not None and info.experts else None


def read_share(path: Path) -> float:
    """The share of a model file one token's pass reads (`Weights.read_share`): 1 for a
    dense model."""
    weights = moe_weights(path)
    return 1.0 if weights is None else weights.read_share
