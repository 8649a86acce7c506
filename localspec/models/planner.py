"""Which target and draft fit this machine, how they are placed, and why, as data.

Choice. The largest target that fits at a 2048-token context and decodes at least
`min_speed` tokens/s (on a CPU the largest that fits is often unusably slow); then the
largest quantization that keeps target and draft wholly on the GPU, else the target
alone, else Q4_K_M with the most layers on the GPU (on a CPU every weight byte is read
per token, so Q4_K_M); then the largest context up to the one asked for; then the
drafter: the draft model when the speed model says it pays, else n-grams.

A `Plan` carries each decision with the numbers behind it (`rationale.py`); `explain`
turns them into sentences. Memory and placement are in memory.py, the speed model in
speed.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from localspec.errors import LocalspecError
from localspec.models.candidates import Candidate, catalog_candidates, installed_candidates
from localspec.models.catalog import DEFAULT_QUANT, Catalog
from localspec.models.hardware import Hardware
from localspec.models.memory import (
    Budget,
    Placement,
    Requirement,
    memory_budget,
    place,
    reader_bytes,
    requirement,
    slots_that_fit,
)
from localspec.models.rationale import (
    DrafterChoice,
    DraftEstimate,
    NextSizeUp,
    Rationale,
    Slow,
    Stage,
    TargetChoice,
)
from localspec.models.speed import VERIFY_SLOPE, batch_growth, speculation, step_seconds
from localspec.models.store import Installed

MIN_CTX = 2048
DEFAULT_CTX = 8192
DEFAULT_MIN_SPEED = 5.0  # tokens/s of plain decoding a target must reach to be chosen
MIN_SPEEDUP = 1.05  # a draft must pay for itself by more than the estimate's noise
NGRAM_GAMMA = 4
_CTX_LADDER = (65536, 32768, 16384, 8192, 4096)  # contexts tried below the asked one


class NothingFits(LocalspecError):
    """No target fits the memory budget (or none is installed to plan with)."""


@dataclass(frozen=True)
class Request:
    """What the user asks of the plan."""

    family: str | None = None  # None: the catalog's default family (all, for installed)
    n_ctx: int | None = None  # the context wanted; None: 8192, or less if trained on less
    min_speed: float = DEFAULT_MIN_SPEED
    draft: str | None = None  # None: choose; "ngram" | "none"; or a draft's id
    # None: choose; else an installed target's path (`--target` alone): the plan is
    # about its quantization, offload, context and draft
    target: str | None = None


@dataclass(frozen=True)
class Side:
    """One model of the plan: what llama.cpp loads, and how."""

    id: str
    quant: str
    path: str | None
    n_gpu_layers: int
    n_ctx: int
    cpu_moe: int = 0  # a MoE's routed experts of its first this many layers stay in RAM


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
    why: Rationale
    tokens_per_s: float = 0.0  # estimated plain decoding
    speedup: float = 1.0  # estimated, from the draft model
    unified: bool = False
    slots: int = 1  # requests `serve` can decode at once, each with a context of n_ctx

    def fits(self) -> bool:
        if self.vram_estimate > self.vram_budget:
            return False
        used_ram = self.ram_estimate + (self.vram_estimate if self.unified else 0)
        return used_ram <= self.ram_budget


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
    budget = memory_budget(hw)
    targets = _by_size([c for c in candidates if c.role == "target" and _asked(c, request)])
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
        (c.id, c.quant): _speed_at_floor(c, hw, budget, request)
        for _, quants in targets
        for c in quants
    }
    for i, (_, quants) in enumerate(targets):
        fast = [
            c
            for c in quants
            if 0 < request.min_speed <= speeds[c.id, c.quant]
            or (request.min_speed <= 0 and speeds[c.id, c.quant] > 0)
        ]
        if fast:
            bigger = _next_size_up(targets, i, hw, budget, request)
            return _plan_target(fast, drafts, hw, budget, request, bigger)
    # nothing reaches the speed asked for: the smallest target that fits, said so
    for i, (_, quants) in reversed(list(enumerate(targets))):
        fitting = [c for c in quants if speeds[c.id, c.quant] > 0]
        if fitting:
            slow = Slow(request.min_speed, max(speeds[c.id, c.quant] for c in fitting))
            bigger = _next_size_up(targets, i, hw, budget, request)
            chosen = _plan_target(fitting, drafts, hw, budget, request, bigger)
            return replace(chosen, why=replace(chosen.why, slow=slow))
    smallest = targets[-1][1][0]
    needs = _needs(smallest, hw, budget)
    raise NothingFits(
        f"nothing fits: the smallest target, {smallest.name} {smallest.quant}, "
        f"needs {needs.describe()}"
    )


def _asked(candidate: Candidate, request: Request) -> bool:
    """Whether `candidate` is a target the request allows (any, unless it names one)."""
    if request.target is None:
        return True
    wanted = Path(request.target).expanduser().resolve()
    return candidate.path is not None and Path(candidate.path).expanduser().resolve() == wanted


def _speed_at_floor(candidate: Candidate, hw: Hardware, budget: Budget, request: Request) -> float:
    """Plain decoding tokens/s of `candidate` alone at the minimum context; 0 if it does not fit."""
    n_ctx = min(MIN_CTX, _asked_ctx(candidate, request))
    placement = place(candidate.weights, None, n_ctx, budget, hw)
    if placement is None:
        return 0.0
    return 1 / step_seconds(
        candidate.weights, placement.target_layers, hw, placement.remote > 0, placement.cpu_moe
    )


def _plan_target(
    quants: list[Candidate],
    drafts: list[Candidate],
    hw: Hardware,
    budget: Budget,
    request: Request,
    bigger: NextSizeUp | None,
) -> Plan:
    """The plan with one of `quants` (one target model's files) as the target."""
    own_drafts = _by_params([d for d in drafts if d.family == quants[0].family])
    # one quantization per draft model: its smallest (drafting is all about speed)
    own_drafts = [
        min(group, key=lambda d: d.weights.total)
        for _, group in itertools.groupby(own_drafts, key=lambda d: d.id)
    ]
    target, stage, ctx = _choose_quant(quants, own_drafts, hw, budget, request)
    options = [
        option
        for draft in [*own_drafts, None]
        if (option := _option(target, draft, ctx, hw, budget))
    ]
    plain = next(o for o in options if o.draft is None)  # the target alone always fits here
    paying = [o for o in options if o.draft is not None and o.speedup >= MIN_SPEEDUP]
    best = max(paying, key=lambda o: o.effective, default=plain)
    if paying and best.effective < plain.tokens_per_s:
        best = plain
    placement = best.placement
    drafter = "draft" if best.draft else ("none" if request.draft == "none" else "ngram")
    draft_weights = best.draft.weights if best.draft else None
    slots = slots_that_fit(target.weights, draft_weights, ctx, budget, hw)
    reader = _reader(target, placement, ctx, hw)
    reader_fits = bool(reader) and budget.holds(placement.vram, placement.ram + reader)
    # the slots beside which it still has room (serve weighs it once their caches are made)
    left = replace(budget, ram=budget.ram - reader)
    reader_slots = (
        slots_that_fit(target.weights, draft_weights, ctx, left, hw, slots) if reader_fits else 0
    )
    why = Rationale(
        machine=hw.describe(),
        notes=hw.notes,
        gpu_usable=hw.gpu_usable,
        target=TargetChoice(
            target.name,
            target.quant,
            target.n_layers,
            placement.target_layers,
            stage,
            len(quants) > 1,
        ),
        drafter=_drafter_choice(best, options, own_drafts, request),
        n_ctx=ctx,
        asked_ctx=_asked_ctx(target, request),
        placement=placement,
        budget=budget,
        next_size_up=bigger,
        state=target.weights.state,
        kept=target.weights.kept,
        reader=reader,
        reader_slots=reader_slots,
    )
    draft_side = None
    if best.draft is not None:
        draft = best.draft
        draft_layers = draft.n_layers + 1 if placement.draft_on_gpu else 0
        draft_side = Side(draft.id, draft.quant, _str(draft.path), draft_layers, ctx)
    return Plan(
        target=Side(
            target.id,
            target.quant,
            _str(target.path),
            placement.target_layers,
            ctx,
            placement.cpu_moe,
        ),
        draft=draft_side,
        drafter=drafter,
        gamma=best.gamma,
        vram_budget=budget.vram,
        vram_estimate=placement.vram,
        ram_budget=budget.ram,
        ram_estimate=placement.ram + (reader if reader_fits else 0),
        why=why,
        tokens_per_s=plain.tokens_per_s,
        speedup=best.speedup,
        unified=budget.unified,
        slots=slots,
    )


def _reader(target: Candidate, placement: Placement, n_ctx: int, hw: Hardware) -> int:
    """RAM for the target's prompt reader where `serve`, `run` and `chat` would load one
    (reader.py: on x86, every layer on the CPU, no recurrent state), else 0."""
    on_cpu = not (placement.target_layers or placement.remote or placement.cpu_moe)
    if not (hw.x86 and on_cpu) or target.weights.state:
        return 0
    return reader_bytes(target.weights, n_ctx)


def _choose_quant(
    quants: list[Candidate],
    drafts: list[Candidate],
    hw: Hardware,
    budget: Budget,
    request: Request,
) -> tuple[Candidate, Stage, int]:
    """(quantization, stage, context). Within a stage (best first, each at the asked
    context and then at a smaller one), the largest quantization wins; for "partial"
    and "cpu", Q4_K_M (fewest bytes per token, still good quality)."""
    by_quality = sorted(quants, key=lambda c: -c.weights.total)
    if hw.gpu_usable:
        stages: list[tuple[Stage, Candidate | None]] = [("target-on-gpu", None)]
        if drafts:
            stages.insert(0, ("pair-on-gpu", drafts[0]))
        for at_asked in (True, False):
            for stage, draft in stages:
                for c in by_quality:
                    ctx = _largest_ctx(
                        c, draft, hw, budget, request, whole=True, asked_only=at_asked
                    )
                    if ctx:
                        return c, stage, ctx
    preferred = [c for c in quants if c.quant == DEFAULT_QUANT]
    chosen = preferred[0] if preferred else min(quants, key=lambda c: c.weights.total)
    ctx = _largest_ctx(chosen, None, hw, budget, request, whole=False, asked_only=False)
    return chosen, ("partial" if hw.gpu_usable else "cpu"), ctx or MIN_CTX


def _largest_ctx(
    candidate: Candidate,
    draft: Candidate | None,
    hw: Hardware,
    budget: Budget,
    request: Request,
    whole: bool,
    asked_only: bool,
) -> int | None:
    """The largest context up to the asked one at which `candidate` (and `draft`) fit, with the
    whole target on the GPU if `whole`; None if none does."""
    asked = _asked_ctx(candidate, request)
    floor = min(MIN_CTX, asked)
    if asked_only:
        ladder = [asked]
    else:
        below = (x for x in _CTX_LADDER if floor < x < asked)
        ladder = sorted({asked, floor, *below}, reverse=True)
    for ctx in ladder:
        placement = place(candidate.weights, draft.weights if draft else None, ctx, budget, hw)
        if placement is None:
            continue
        # wholly: every layer, the head and every expert (a MoE may be "all layers"
        # with the experts of some in RAM)
        if not whole or (
            placement.target_layers == candidate.n_layers + 1 and not placement.cpu_moe
        ):
            return ctx
    return None


def _option(
    target: Candidate, draft: Candidate | None, ctx: int, hw: Hardware, budget: Budget
) -> _Option | None:
    placement = place(target.weights, draft.weights if draft else None, ctx, budget, hw)
    if placement is None:
        return None
    on_servers = placement.remote > 0
    t_target = step_seconds(
        target.weights, placement.target_layers, hw, on_servers, placement.cpu_moe
    )
    if draft is None:
        return _Option(placement, None, 1 / t_target, NGRAM_GAMMA, 1.0)
    draft_layers = draft.n_layers + 1 if placement.draft_on_gpu else 0
    t_draft = step_seconds(draft.weights, draft_layers, hw)
    mostly_gpu = not on_servers and placement.target_layers > target.n_layers // 2
    slope = VERIFY_SLOPE["gpu" if mostly_gpu else "cpu"]
    layers = 0 if on_servers else placement.target_layers  # servers are priced as a CPU

    def growth(k: int) -> float:
        return batch_growth(target.weights, k, layers, hw, placement.cpu_moe)

    gamma, speedup = speculation(t_target, t_draft, slope, growth_of=growth)
    return _Option(placement, draft, 1 / t_target, gamma, speedup)


def _drafter_choice(
    best: _Option, options: list[_Option], drafts: list[Candidate], request: Request
) -> DrafterChoice:
    if best.draft is not None:
        return DrafterChoice("draft", _estimate(best))
    if request.draft == "none":
        return DrafterChoice("asked-none")
    if request.draft == "ngram":
        return DrafterChoice("asked-ngram")
    if not drafts:
        return DrafterChoice("no-draft-model")
    tried = [o for o in options if o.draft is not None]
    if not tried:
        return DrafterChoice("none-fits")
    return DrafterChoice("does-not-pay", _estimate(max(tried, key=lambda o: o.speedup)))


def _estimate(option: _Option) -> DraftEstimate:
    assert option.draft is not None
    draft = option.draft
    on_gpu = option.placement.draft_on_gpu
    return DraftEstimate(draft.name, draft.quant, on_gpu, option.gamma, option.speedup)


def _needs(candidate: Candidate, hw: Hardware, budget: Budget) -> Requirement:
    """What `candidate` would need at the minimum context."""
    return requirement(candidate.weights, min(MIN_CTX, candidate.context), budget, hw)


def _next_size_up(
    targets: list[tuple[str, list[Candidate]]],
    i: int,
    hw: Hardware,
    budget: Budget,
    request: Request,
) -> NextSizeUp | None:
    if i == 0:
        return None
    bigger = targets[i - 1][1]
    candidate = next(
        (c for c in bigger if c.quant == DEFAULT_QUANT),
        min(bigger, key=lambda c: c.weights.total),
    )
    speed = _speed_at_floor(candidate, hw, budget, request)
    needs = _needs(candidate, hw, budget)
    return NextSizeUp(candidate.name, candidate.quant, speed, request.min_speed, needs)


# --- helpers -------------------------------------------------------------------------


def _asked_ctx(candidate: Candidate, request: Request) -> int:
    asked = request.n_ctx or DEFAULT_CTX
    return max(16, min(asked, candidate.context)) if candidate.context else asked


def _by_size(candidates: list[Candidate]) -> list[tuple[str, list[Candidate]]]:
    """Candidates grouped by model, largest model first."""
    ordered = sorted(candidates, key=lambda c: (-c.params, c.id))
    return [(k, list(group)) for k, group in itertools.groupby(ordered, key=lambda c: c.id)]


def _by_params(candidates: list[Candidate]) -> list[Candidate]:
    return sorted(candidates, key=lambda c: (-c.params, c.id, c.weights.total))


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
    candidates = installed_candidates(catalog, installed)
    if request.family:
        candidates = [c for c in candidates if c.family == request.family]
    if not any(c.role == "target" for c in candidates):
        of = f" of family {request.family}" if request.family else ""
        raise NothingFits(
            f"no target{of} is installed: run `localspec pull default` "
            "(or `localspec plan` to see what would fit)"
        )
    return plan(candidates, hw, request)
