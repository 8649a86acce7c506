"""Which target and draft fit this machine, how they are placed, and why.

Memory. A model's footprint is its weights (per layer: the GGUF header's tensor sizes
for a downloaded file, the catalog's file size spread over the layers otherwise), its KV
cache (2 x layers x KV heads x head size x 2 bytes per token of context, f16), compute
buffers, and a little host overhead. llama.cpp offloads the *last* n layers and, when
all are offloaded, the output head; the token embeddings always stay in RAM.

Placement. The draft goes wholly on the GPU first (a partly offloaded draft is slower
than the time it saves), then as many target layers as fit. On Apple Silicon GPU and
CPU share one budget.

Choice. The largest target that fits at a 2048-token context and decodes at least
`min_speed` tokens/s (on a CPU the largest that fits is often unusably slow); then the
largest quantization that keeps target and draft wholly on the GPU, else the target
alone, else Q4_K_M with the most layers on the GPU (on a CPU every weight byte is read
per token, so Q4_K_M); then the largest context up to the one asked for; then the
drafter: the draft model when the speed model says it pays, else n-grams.

Speed model. A decode step costs a fixed overhead plus the bytes read over the memory
bandwidth of where they live; calibrated on a 2-core CPU (1.5B Q4_K_M at 10 tok/s, 0.5B
at 17 tok/s) and on conservative GPU bandwidths. Speculation with acceptance α and γ
drafted tokens yields (1-α^(γ+1))/(1-α) tokens per γ draft steps plus one verification
pass (Leviathan et al.). These are estimates for choosing; `--gamma auto` measures.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from localspec.errors import LocalspecError
from localspec.models.catalog import DEFAULT_QUANT, Catalog, Model, Quant
from localspec.models.hardware import GiB, Hardware, MiB, fmt_size
from localspec.models.store import GgufInfo, Installed

UBATCH = 512  # llama.cpp's default micro-batch: compute buffers scale with it
KV_ELEMENT_BYTES = 2  # f16 K and V
MIN_CTX = 2048
DEFAULT_CTX = 8192
HOST_OVERHEAD = 160 * MiB  # per model: llama.cpp's host structures, logits, the process
VRAM_RESERVE = 512 * MiB  # per GPU at least: the CUDA/Metal context, fragmentation
VRAM_RESERVE_SHARE = 0.05
RAM_RESERVE = 1 * GiB  # at least, for the OS and everything else running
RAM_RESERVE_SHARE = 0.10
DEFAULT_MIN_SPEED = 5.0  # tokens/s of plain decoding a target must reach to be chosen

# The speed model (see the module docstring).
CPU_BANDWIDTH_PER_CORE = 8.25e9  # bytes/s
CPU_BANDWIDTH_MAX = 45e9  # what llama.cpp reaches on a desktop with dual-channel DDR5
CPU_STEP_OVERHEAD = 0.06  # seconds x cores: ~30 ms a token on 2 cores, measured
# GPU memory bandwidth grows with the card's memory: (up to this much memory, bytes/s),
# conservative within each class (a laptop RTX 4060, a desktop 3090/4090, an A100/H100;
# an M-series base, Pro, Max).
GPU_BANDWIDTH = {
    "nvidia": ((12 * GiB, 250e9), (32 * GiB, 700e9), (1 << 50, 1500e9)),
    "apple": ((16 * GiB, 100e9), (36 * GiB, 150e9), (1 << 50, 300e9)),
}
GPU_STEP_OVERHEAD = 0.004
ACCEPTANCE = 0.85  # the Qwen-Coder pair accepts 0.85-0.95 on code (measured)
VERIFY_SLOPE = {"cpu": 0.15, "gpu": 0.02}  # a k-token verify costs 1 + slope(k-1) steps
MIN_SPEEDUP = 1.0  # a draft must at least pay for itself
NGRAM_GAMMA = 4
GAMMA_MAX = 8

# Weight bytes per parameter of the embedding and output tensors in each file type
# (llama.cpp keeps the output head at Q6_K in the K-quant mixes).
_EMBD_BYTES = {"Q4_K_M": 0.5625, "Q5_K_M": 0.6875, "Q6_K": 0.8203, "Q8_0": 1.0625, "F16": 2.0}
_OUTPUT_BYTES = {"Q4_K_M": 0.8203, "Q5_K_M": 0.8203, "Q6_K": 0.8203, "Q8_0": 1.0625, "F16": 2.0}


class NothingFits(LocalspecError):
    """No target fits the memory budget (or none is installed to plan with)."""


@dataclass(frozen=True)
class Request:
    """What the user asks of the plan."""

    family: str | None = None  # None: the catalog's default family (all, for installed)
    n_ctx: int | None = None  # the context wanted; None: 8192, or less if trained on less
    min_speed: float = DEFAULT_MIN_SPEED
    draft: str | None = None  # None: choose; "ngram" | "none"; or a draft's id


@dataclass(frozen=True)
class Weights:
    """What placement needs to know about one model file."""

    layers: tuple[int, ...]  # bytes of each repeating layer, first to last
    embd: int  # token embeddings and small tensors: always in RAM
    output: int  # the output head; 0 when tied to the embeddings
    kv_per_token_layer: int  # K + V bytes for one token in one layer
    vocab: int
    embedding: int

    @property
    def head(self) -> int:
        """The output head's bytes on a GPU (a tied head is copied there)."""
        return self.output or self.embd

    @property
    def total(self) -> int:
        return sum(self.layers) + self.embd + self.output

    @classmethod
    def from_gguf(cls, info: GgufInfo) -> Weights:
        kv = 2 * info.kv_heads * info.head_dim * KV_ELEMENT_BYTES
        return cls(
            info.layer_bytes, info.embd_bytes, info.output_bytes, kv, info.vocab, info.embedding
        )

    @classmethod
    def estimate(cls, model: Model, quant: Quant) -> Weights:
        """From the catalog: the file size, less embeddings and head, spread evenly."""
        s = model.shape
        table = s.vocab * s.embedding
        embd = int(table * _EMBD_BYTES.get(quant.name, 1.0))
        output = 0 if s.tied_embeddings else int(table * _OUTPUT_BYTES.get(quant.name, 1.0))
        body = max(quant.size - embd - output, quant.size // 3)
        per_layer = body // s.layers
        kv = 2 * s.kv_heads * s.head_dim * KV_ELEMENT_BYTES
        return cls((per_layer,) * s.layers, embd, output, kv, s.vocab, s.embedding)


@dataclass(frozen=True)
class Candidate:
    """A model file the planner may pick: a catalog quantization or an installed file."""

    id: str
    name: str
    quant: str
    family: str | None
    role: str
    params: float  # billions (estimated from bytes for a file not in the catalog)
    context: int  # training context
    weights: Weights
    path: Path | None = None  # set when installed

    @property
    def n_layers(self) -> int:
        return len(self.weights.layers)


@dataclass(frozen=True)
class Budget:
    vram: int  # bytes the GPU(s) may take; 0 without a usable GPU
    ram: int
    unified: bool  # Apple: vram + ram together must fit in ram


@dataclass(frozen=True)
class Placement:
    n_ctx: int
    target_layers: int  # llama.cpp's n_gpu_layers: layers + 1 means the output head too
    draft_on_gpu: bool
    vram: int
    ram: int


@dataclass(frozen=True)
class Side:
    """One model of the plan, as the JSON shows it."""

    id: str
    quant: str
    path: str | None
    n_gpu_layers: int
    n_ctx: int

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "quant": self.quant,
            "path": self.path,
            "n_gpu_layers": self.n_gpu_layers,
            "n_ctx": self.n_ctx,
        }


@dataclass(frozen=True)
class Plan:
    target: Side
    draft: Side | None
    drafter: str  # "draft" | "ngram" | "none"
    gamma: int
    vram_budget: int
    vram_estimate: int
    ram_budget: int
    ram_estimate: int
    reasons: tuple[str, ...]
    tokens_per_s: float = 0.0  # estimated plain decoding
    speedup: float = 1.0  # estimated, from the draft model
    unified: bool = False

    def fits(self) -> bool:
        if self.vram_estimate > self.vram_budget:
            return False
        used_ram = self.ram_estimate + (self.vram_estimate if self.unified else 0)
        return used_ram <= self.ram_budget

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target.to_json(),
            "draft": self.draft.to_json() if self.draft else None,
            "drafter": self.drafter,
            "gamma": self.gamma,
            "memory": {
                "vram_budget": self.vram_budget,
                "vram_estimate": self.vram_estimate,
                "ram_budget": self.ram_budget,
                "ram_estimate": self.ram_estimate,
            },
            "reasons": list(self.reasons),
        }


# --- candidates ----------------------------------------------------------------------


def catalog_candidates(
    catalog: Catalog, installed: Iterable[Installed] = (), family: str | None = None
) -> list[Candidate]:
    """Every quantization of the family's targets and drafts (all families if None);
    an installed file brings its path and its measured weights."""
    have = {(e.model, e.quant): e for e in installed}
    found = []
    for m in catalog.models:
        if family is not None and m.family != family:
            continue
        for q in m.quants:
            entry = have.get((m.id, q.name))
            found.append(_from_catalog(m, q, entry))
    return found


def installed_candidates(catalog: Catalog, installed: Iterable[Installed]) -> list[Candidate]:
    """Only what is installed: catalog models and files registered with `add`."""
    found = []
    for e in installed:
        model = catalog.find(e.model)
        if model is not None and e.source != "local":
            quant = next((q for q in model.quants if q.name == e.quant), None)
            if quant is not None:
                found.append(_from_catalog(model, quant, e))
                continue
        if e.info is None:
            continue  # a file we cannot measure cannot be planned
        w = Weights.from_gguf(e.info)
        params = w.total / _EMBD_BYTES.get(e.quant, 1.0) / 1e9
        found.append(
            Candidate(
                e.model, e.info.name, e.quant, e.family, e.role, params, e.info.context, w, e.path
            )
        )
    return found


def _from_catalog(m: Model, q: Quant, entry: Installed | None) -> Candidate:
    if entry is not None and entry.info is not None:
        weights = Weights.from_gguf(entry.info)
    else:
        weights = Weights.estimate(m, q)
    return Candidate(
        m.id,
        m.name,
        q.name,
        m.family,
        m.role,
        m.params,
        m.shape.context,
        weights,
        entry.path if entry else None,
    )


# --- memory --------------------------------------------------------------------------


def budget(hw: Hardware) -> Budget:
    """What the plan may use: free memory less headroom."""
    ram = int(hw.ram_available - max(RAM_RESERVE, RAM_RESERVE_SHARE * hw.ram_total))
    vram = 0
    if hw.gpu_usable:
        for g in hw.gpus:
            usable = g.usable
            if usable is None:
                continue
            reserve = max(VRAM_RESERVE, int(VRAM_RESERVE_SHARE * (g.total or usable)))
            vram += max(0, usable - reserve)
    return Budget(vram=vram, ram=max(ram, 0), unified=hw.unified)


def compute_bytes(w: Weights, n_ctx: int) -> int:
    """Compute buffers for one micro-batch: logits, activations, attention scratch."""
    return 4 * UBATCH * (w.vocab + 8 * w.embedding + n_ctx // 8)


def footprint(w: Weights, n_ctx: int, gpu_layers: int) -> tuple[int, int]:
    """(VRAM, RAM) bytes of one model with `gpu_layers` offloaded (llama.cpp's count:
    more than the layer count puts the output head on the GPU too)."""
    n = len(w.layers)
    on_gpu = max(0, min(gpu_layers, n))
    head_on_gpu = gpu_layers > n
    kv_layer = n_ctx * w.kv_per_token_layer
    vram = sum(w.layers[n - on_gpu :]) + on_gpu * kv_layer + (w.head if head_on_gpu else 0)
    ram = (
        sum(w.layers[: n - on_gpu])
        + (n - on_gpu) * kv_layer
        + w.embd
        + HOST_OVERHEAD
        + (0 if head_on_gpu else w.output)
    )
    compute = compute_bytes(w, n_ctx)
    if gpu_layers > 0:
        vram += compute
        ram += compute // 4  # the CPU keeps a smaller buffer for its share
    else:
        ram += compute
    return vram, ram


def _fits(b: Budget, vram: int, ram: int) -> bool:
    if vram > b.vram:
        return False
    return (ram + vram if b.unified else ram) <= b.ram


def place(
    target: Weights, draft: Weights | None, n_ctx: int, b: Budget, hw: Hardware
) -> Placement | None:
    """The draft wholly on the GPU (if there is one), then as many target layers as
    fit; None when not even the all-CPU placement fits. With a usable GPU a draft that
    does not fit there wholly is not placed at all (llama.cpp would offload it anyway)."""
    dv = dr = 0
    draft_on_gpu = False
    if draft is not None:
        if hw.gpu_usable:
            dv, dr = footprint(draft, n_ctx, len(draft.layers) + 1)
            if not _fits(b, dv, dr):
                return None
            draft_on_gpu = True
        else:
            dv, dr = footprint(draft, n_ctx, 0)
    top = len(target.layers) + 1 if hw.gpu_usable else 0
    for layers in range(top, -1, -1):
        tv, tr = footprint(target, n_ctx, layers)
        if _fits(b, dv + tv, dr + tr):
            return Placement(n_ctx, layers, draft_on_gpu, dv + tv, dr + tr)
    return None


# --- speed ---------------------------------------------------------------------------


def step_seconds(w: Weights, gpu_layers: int, hw: Hardware) -> float:
    """Estimated time of one decode step: every weight byte is read once per token."""
    n = len(w.layers)
    on_gpu = max(0, min(gpu_layers, n))
    gpu_bytes = sum(w.layers[n - on_gpu :]) + (w.head if gpu_layers > n else 0)
    all_bytes = sum(w.layers) + w.head
    cpu_bytes = all_bytes - gpu_bytes
    cpu_bw = min(CPU_BANDWIDTH_PER_CORE * hw.cores, CPU_BANDWIDTH_MAX)
    gpu_bw = gpu_bandwidth(hw)
    overhead = GPU_STEP_OVERHEAD if gpu_layers > 0 else CPU_STEP_OVERHEAD / max(hw.cores, 1)
    return overhead + gpu_bytes / gpu_bw + cpu_bytes / cpu_bw


def gpu_bandwidth(hw: Hardware) -> float:
    if not hw.gpus:
        return 1.0
    g = hw.gpus[0]
    memory = g.total or g.usable or 0
    tiers = GPU_BANDWIDTH.get(g.vendor, GPU_BANDWIDTH["nvidia"])
    return next(bw for limit, bw in tiers if memory <= limit)


def speculation(
    t_target: float, t_draft: float, slope: float, alpha: float = ACCEPTANCE
) -> tuple[int, float]:
    """(γ, speedup) maximizing tokens per second over γ = 1..GAMMA_MAX."""
    best = (1, 0.0)
    for gamma in range(1, GAMMA_MAX + 1):
        expected = (1 - alpha ** (gamma + 1)) / (1 - alpha)
        seconds = gamma * t_draft + t_target * (1 + slope * gamma)
        speedup = expected * t_target / seconds
        if speedup > best[1]:
            best = (gamma, speedup)
    return best


# --- the plan ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Option:
    placement: Placement
    draft: Candidate | None
    tokens_per_s: float
    gamma: int
    speedup: float

    @property
    def effective(self) -> float:
        return self.tokens_per_s * self.speedup


def plan(candidates: Sequence[Candidate], hw: Hardware, request: Request = Request()) -> Plan:
    """The best plan among `candidates` for `hw`; NothingFits when none fits."""
    b = budget(hw)
    targets = _by_size([c for c in candidates if c.role == "target"])
    if request.draft in ("ngram", "none"):
        drafts: list[Candidate] = []
    else:
        drafts = [
            c
            for c in candidates
            if c.role == "draft" and request.draft in (None, c.id, str(c.path))
        ]
    if not targets:
        raise NothingFits("no target model to plan with")
    speeds = {
        (c.id, c.quant): _speed_at_floor(c, hw, b, request) for _, quants in targets for c in quants
    }
    for i, (_, quants) in enumerate(targets):
        fast = [
            c
            for c in quants
            if 0 < request.min_speed <= speeds[c.id, c.quant]
            or (request.min_speed <= 0 and speeds[c.id, c.quant] > 0)
        ]
        if fast:
            return _plan_target(fast, drafts, hw, b, request, _next_size_up(targets, i))
    # nothing reaches the speed asked for: the smallest target that fits, said so
    for i, (_, quants) in reversed(list(enumerate(targets))):
        fitting = [c for c in quants if speeds[c.id, c.quant] > 0]
        if fitting:
            slow = max(speeds[c.id, c.quant] for c in fitting)
            plan_ = _plan_target(fitting, drafts, hw, b, request, _next_size_up(targets, i))
            note = (
                f"Slow: nothing fits that decodes at {request.min_speed:g} tokens/s here; "
                f"this target manages ~{slow:.1f}."
            )
            return replace(plan_, reasons=(*plan_.reasons, note))
    smallest = targets[-1][1]
    need = _needs(smallest[0], hw, b)
    raise NothingFits(
        f"nothing fits: the smallest target, {smallest[0].name} {smallest[0].quant}, needs {need}"
    )


def _speed_at_floor(c: Candidate, hw: Hardware, b: Budget, request: Request) -> float:
    """Plain decoding tokens/s of `c` alone at the minimum context; 0 if it does not fit."""
    p = place(c.weights, None, min(MIN_CTX, _asked_ctx(c, request)), b, hw)
    return 0.0 if p is None else 1 / step_seconds(c.weights, p.target_layers, hw)


def _plan_target(
    quants: list[Candidate],
    drafts: list[Candidate],
    hw: Hardware,
    b: Budget,
    request: Request,
    bigger: Candidate | None,
) -> Plan:
    why: list[str] = []
    own_drafts = _by_params([d for d in drafts if d.family == quants[0].family])
    # one quantization per draft model: its smallest (drafting is all about speed)
    own_drafts = [
        min(g, key=lambda d: d.weights.total)
        for _, g in itertools.groupby(own_drafts, key=lambda d: d.id)
    ]
    target, stage, ctx = _choose_quant(quants, own_drafts, hw, b, request)
    options = [o for d in [*own_drafts, None] if (o := _option(target, d, ctx, hw, b))]
    plain = next(o for o in options if o.draft is None)  # the target alone always fits here
    paying = [o for o in options if o.draft is not None and o.speedup >= MIN_SPEEDUP]
    best = max(paying, key=lambda o: o.effective, default=plain)
    if paying and best.effective < plain.tokens_per_s:
        best = plain
    p = best.placement
    drafter = "draft" if best.draft else ("none" if request.draft == "none" else "ngram")

    why.append(f"This machine: {hw.describe()}.")
    why.extend(f"Note: {n.rstrip('.')}." for n in hw.notes)
    why.append(_target_sentence(target, p, stage, hw, len(quants) > 1))
    why.append(_drafter_sentence(best, options, own_drafts, hw, request))
    asked = _asked_ctx(target, request)
    why.append(
        f"Context: {ctx} tokens"
        + (" (as asked)." if ctx == asked else f", the most that fits (asked for {asked}).")
    )
    why.append(_memory_sentence(p, b, hw))
    if bigger is not None:
        why.append(_next_sentence(bigger, hw, b, request))
    draft_side = None
    if best.draft is not None:
        d = best.draft
        draft_side = Side(d.id, d.quant, _str(d.path), d.n_layers + 1 if p.draft_on_gpu else 0, ctx)
    return Plan(
        target=Side(target.id, target.quant, _str(target.path), p.target_layers, ctx),
        draft=draft_side,
        drafter=drafter,
        gamma=best.gamma,
        vram_budget=b.vram,
        vram_estimate=p.vram,
        ram_budget=b.ram,
        ram_estimate=p.ram,
        reasons=tuple(why),
        tokens_per_s=plain.tokens_per_s,
        speedup=best.speedup,
        unified=b.unified,
    )


def _choose_quant(
    quants: list[Candidate], drafts: list[Candidate], hw: Hardware, b: Budget, request: Request
) -> tuple[Candidate, str, int]:
    """(quantization, stage, context). The stage, best first: target and draft wholly on
    the GPU ("pair-on-gpu"), the target alone wholly on it ("target-on-gpu"), each at
    the asked context and then at a smaller one; else the most layers on the GPU
    ("partial"), or the CPU ("cpu"). Within a stage, the largest quantization wins;
    for "partial" and "cpu", Q4_K_M (fewest bytes per token, still good quality)."""
    by_quality = sorted(quants, key=lambda c: -c.weights.total)
    if hw.gpu_usable:
        for at_asked in (True, False):
            for stage, draft in (
                ("pair-on-gpu", drafts[0] if drafts else None),
                ("target-on-gpu", None),
            ):
                if stage == "pair-on-gpu" and draft is None:
                    continue
                for c in by_quality:
                    ctx = _largest_ctx(c, draft, hw, b, request, whole=True, asked_only=at_asked)
                    if ctx:
                        return c, stage, ctx
    preferred = [c for c in quants if c.quant == DEFAULT_QUANT]
    chosen = preferred[0] if preferred else min(quants, key=lambda c: c.weights.total)
    ctx = _largest_ctx(chosen, None, hw, b, request, whole=False, asked_only=False)
    return chosen, ("partial" if hw.gpu_usable else "cpu"), ctx or MIN_CTX


def _largest_ctx(
    c: Candidate,
    draft: Candidate | None,
    hw: Hardware,
    b: Budget,
    request: Request,
    whole: bool,
    asked_only: bool,
) -> int | None:
    """The largest context up to the asked one at which `c` (and `draft`) fit, with the
    whole target on the GPU if `whole`; None if none does."""
    asked = _asked_ctx(c, request)
    floor = min(MIN_CTX, asked)
    ladder = (
        [asked]
        if asked_only
        else sorted(
            {asked, floor, *(x for x in (65536, 32768, 16384, 8192, 4096) if floor < x < asked)},
            reverse=True,
        )
    )
    for ctx in ladder:
        p = place(c.weights, draft.weights if draft else None, ctx, b, hw)
        if p is not None and (not whole or p.target_layers == c.n_layers + 1):
            return ctx
    return None


def _option(t: Candidate, d: Candidate | None, ctx: int, hw: Hardware, b: Budget) -> _Option | None:
    p = place(t.weights, d.weights if d else None, ctx, b, hw)
    if p is None:
        return None
    t_target = step_seconds(t.weights, p.target_layers, hw)
    if d is None:
        return _Option(p, None, 1 / t_target, NGRAM_GAMMA, 1.0)
    t_draft = step_seconds(d.weights, d.n_layers + 1 if p.draft_on_gpu else 0, hw)
    mostly_gpu = p.target_layers > t.n_layers // 2
    gamma, speedup = speculation(t_target, t_draft, VERIFY_SLOPE["gpu" if mostly_gpu else "cpu"])
    return _Option(p, d, 1 / t_target, gamma, speedup)


# --- sentences -----------------------------------------------------------------------


def _target_sentence(c: Candidate, p: Placement, stage: str, hw: Hardware, choice: bool) -> str:
    if not hw.gpu_usable:
        where = "on the CPU"
    elif p.target_layers > c.n_layers:
        where = f"all {p.target_layers} layers on the GPU"
    else:
        where = f"{p.target_layers} of {c.n_layers + 1} layers on the GPU, the rest on the CPU"
    why = {
        "pair-on-gpu": "the largest quantization that keeps it and its draft wholly on the GPU",
        "target-on-gpu": "the largest quantization that keeps it wholly on the GPU",
        "partial": f"{c.quant} puts the most of it on the GPU",
        "cpu": f"on a CPU every weight byte is read for each token, so {c.quant} is fastest",
    }[stage]
    return f"Target: {c.name} {c.quant}, {where}: the largest target that fits" + (
        f"; {why}." if choice else "."
    )


def _drafter_sentence(
    best: _Option, options: list[_Option], drafts: list[Candidate], hw: Hardware, request: Request
) -> str:
    if best.draft is not None:
        where = "wholly on the GPU" if best.placement.draft_on_gpu else "on the CPU"
        return (
            f"Draft: {best.draft.name} {best.draft.quant}, {where}; estimated "
            f"x{best.speedup:.2f} at γ={best.gamma} (acceptance {ACCEPTANCE} assumed; "
            f"--gamma auto measures and turns drafting off where it does not pay)."
        )
    if request.draft == "none":
        return "Drafter: none (asked for plain decoding)."
    if request.draft == "ngram":
        return "Drafter: n-gram prompt lookup (asked for)."
    if not drafts:
        return "Drafter: n-gram prompt lookup (no draft model of this family is available)."
    tried = [o for o in options if o.draft is not None]
    if not tried:
        return (
            "Drafter: n-gram prompt lookup: no draft model fits "
            + ("wholly on the GPU " if hw.gpu_usable else "")
            + "next to the target."
        )
    o = max(tried, key=lambda o: o.speedup)
    return (
        f"Drafter: n-gram prompt lookup: {o.draft.name if o.draft else 'the draft'} "
        f"would not pay on this device (estimated x{o.speedup:.2f})."
    )


def _memory_sentence(p: Placement, b: Budget, hw: Hardware) -> str:
    if b.unified:
        return (
            f"Memory: {fmt_size(p.vram)} for the GPU (budget {fmt_size(b.vram)}) and "
            f"{fmt_size(p.vram + p.ram)} in all (budget {fmt_size(b.ram)}, shared), "
            f"weights, KV cache and compute buffers included, headroom kept."
        )
    gpu = f"{fmt_size(p.vram)} of {fmt_size(b.vram)} GPU budget, " if hw.gpu_usable else ""
    return (
        f"Memory: {gpu}{fmt_size(p.ram)} of {fmt_size(b.ram)} RAM budget "
        f"(weights, KV cache and compute buffers; headroom kept for the system)."
    )


def _needs(c: Candidate, hw: Hardware, b: Budget) -> str:
    """What `c` would need at the minimum context, in words."""
    ctx = min(MIN_CTX, c.context)
    if hw.gpu_usable:
        vram, ram = footprint(c.weights, ctx, c.n_layers + 1)
        if b.unified:
            return (
                f"{fmt_size(vram + ram)} of memory, {fmt_size(vram)} of it for the GPU "
                f"(you have {fmt_size(b.ram)}, {fmt_size(b.vram)} for the GPU)"
            )
        return (
            f"{fmt_size(vram)} of GPU memory to run wholly on the GPU (you have "
            f"{fmt_size(b.vram)} to spare)"
        )
    _, ram = footprint(c.weights, ctx, 0)
    return f"{fmt_size(ram)} of RAM (you have {fmt_size(b.ram)} to spare)"


def _next_sentence(c: Candidate, hw: Hardware, b: Budget, request: Request) -> str:
    speed = _speed_at_floor(c, hw, b, request)
    if speed > 0:  # it fits: it was passed over for speed
        return (
            f"Next size up: {c.name} ({c.quant}) would fit but decode at only "
            f"~{speed:.1f} tokens/s here (below {request.min_speed:g}; "
            f"--min-speed 0 allows it)."
        )
    return f"Next size up: {c.name} ({c.quant}) would need {_needs(c, hw, b)}."


def _next_size_up(targets: list[tuple[str, list[Candidate]]], i: int) -> Candidate | None:
    if i == 0:
        return None
    bigger = targets[i - 1][1]
    return next(
        (c for c in bigger if c.quant == DEFAULT_QUANT), min(bigger, key=lambda c: c.weights.total)
    )


# --- helpers -------------------------------------------------------------------------


def _asked_ctx(c: Candidate, request: Request) -> int:
    asked = request.n_ctx or DEFAULT_CTX
    return max(16, min(asked, c.context)) if c.context else asked


def _by_size(cands: list[Candidate]) -> list[tuple[str, list[Candidate]]]:
    """Candidates grouped by model, largest model first."""
    ordered = sorted(cands, key=lambda c: (-c.params, c.id))
    return [(k, list(g)) for k, g in itertools.groupby(ordered, key=lambda c: c.id)]


def _by_params(cands: list[Candidate]) -> list[Candidate]:
    return sorted(cands, key=lambda c: (-c.params, c.id, c.weights.total))


def _str(path: Path | None) -> str | None:
    return str(path) if path else None


def plan_catalog(
    catalog: Catalog,
    hw: Hardware,
    request: Request = Request(),
    installed: Iterable[Installed] = (),
) -> Plan:
    """Plan over the whole catalog (one family: the asked one, else the default)."""
    family = request.family or catalog.default_family
    catalog.family(family)  # an unknown family is a one-line error
    return plan(catalog_candidates(catalog, installed, family), hw, request)


def plan_installed(
    catalog: Catalog, hw: Hardware, installed: Iterable[Installed], request: Request = Request()
) -> Plan:
    """Plan over what is installed (every family, unless one is asked for)."""
    cands = installed_candidates(catalog, installed)
    if request.family:
        cands = [c for c in cands if c.family == request.family]
    if not any(c.role == "target" for c in cands):
        of = f" of family {request.family}" if request.family else ""
        raise NothingFits(
            f"no target{of} is installed: run `localspec pull default` "
            "(or `localspec plan` to see what would fit)"
        )
    return plan(cands, hw, request)
