"""A plan for people: its decisions as the sentences `localspec plan`, the chat and
`run` show, and as the JSON `localspec plan --json` prints. Nothing is decided here."""

from __future__ import annotations

from typing import Any

from localspec.models.hardware import fmt_size
from localspec.models.planner import Plan, Side
from localspec.models.rationale import DrafterChoice, NextSizeUp, Rationale, TargetChoice
from localspec.models.speed import ACCEPTANCE

_STAGE_WHY = {
    "pair-on-gpu": "the largest quantization that keeps it and its draft wholly on the GPU",
    "target-on-gpu": "the largest quantization that keeps it wholly on the GPU",
    "partial": "{quant} puts the most of it on the GPU",
    "cpu": "on a CPU every weight byte is read for each token, so {quant} is fastest",
}


def reasons(plan: Plan) -> tuple[str, ...]:
    """Why the plan is what it is, one sentence per decision."""
    why = plan.why
    said = [f"This machine: {why.machine}."]
    said.extend(f"Note: {note.rstrip('.')}." for note in why.notes)
    said.append(
        target_sentence(
            why.target,
            why.gpu_usable,
            remote=why.placement.remote > 0,
            cpu_moe=why.placement.cpu_moe,
        )
    )
    said.append(drafter_sentence(why.drafter, why.gpu_usable))
    said.append(context_sentence(why.n_ctx, why.asked_ctx))
    said.append(memory_sentence(why))
    if why.next_size_up is not None:
        said.append(next_size_sentence(why.next_size_up))
    if why.slow is not None:
        said.append(
            f"Slow: nothing fits that decodes at {why.slow.min_speed:g} tokens/s here; "
            f"this target manages ~{why.slow.tokens_per_s:.1f}."
        )
    return tuple(said)


def target_sentence(
    target: TargetChoice, gpu_usable: bool, remote: bool = False, cpu_moe: int = 0
) -> str:
    if cpu_moe:
        where = (
            f"all {target.gpu_layers} layers on the GPU but the routed experts of the first "
            f"{cpu_moe}, which stay on the CPU (a token reads few of them; attention, shared "
            "weights and the KV cache it reads whole)"
        )
    elif remote:
        also = " and this machine's GPU" if gpu_usable else ""
        where = f"all {target.gpu_layers} layers on the rpc-servers{also}"
    elif not gpu_usable:
        where = "on the CPU"
    elif target.gpu_layers > target.layers:
        where = f"all {target.gpu_layers} layers on the GPU"
    else:
        where = f"{target.gpu_layers} of {target.layers + 1} layers on the GPU, the rest on the CPU"
    why = _STAGE_WHY[target.stage].format(quant=target.quant)
    if remote:
        why = why.replace("on a CPU ", "on the servers ")
    return f"Target: {target.name} {target.quant}, {where}: the largest target that fits" + (
        f"; {why}." if target.had_choice else "."
    )


def drafter_sentence(choice: DrafterChoice, gpu_usable: bool) -> str:
    draft = choice.draft
    match choice.reason:
        case "draft":
            assert draft is not None
            where = "wholly on the GPU" if draft.on_gpu else "on the CPU"
            return (
                f"Draft: {draft.name} {draft.quant}, {where}; estimated "
                f"x{draft.speedup:.2f} at γ={draft.gamma} (acceptance {ACCEPTANCE} assumed; "
                f"--gamma auto measures and turns drafting off where it does not pay)."
            )
        case "asked-none":
            return "Drafter: none (asked for plain decoding)."
        case "asked-ngram":
            return "Drafter: n-gram prompt lookup (asked for)."
        case "no-draft-model":
            return "Drafter: n-gram prompt lookup (no draft model of this family is available)."
        case "none-fits":
            return (
                "Drafter: n-gram prompt lookup: no draft model fits "
                + ("wholly on the GPU " if gpu_usable else "")
                + "next to the target."
            )
        case "does-not-pay":
            assert draft is not None
            return (
                f"Drafter: n-gram prompt lookup: {draft.name} "
                f"would not pay on this device (estimated x{draft.speedup:.2f})."
            )
    raise AssertionError(f"unknown drafter reason {choice.reason}")


def context_sentence(n_ctx: int, asked: int) -> str:
    return f"Context: {n_ctx} tokens" + (
        " (as asked)." if n_ctx == asked else f", the most that fits (asked for {asked})."
    )


def memory_sentence(why: Rationale) -> str:
    placed, budget = why.placement, why.budget
    if budget.unified:
        return (
            f"Memory: {fmt_size(placed.vram)} for the GPU (budget {fmt_size(budget.vram)}) "
            f"and {fmt_size(placed.vram + placed.ram)} in all (budget {fmt_size(budget.ram)}, "
            f"shared), weights, KV cache{state_words(why)} and compute buffers included, "
            "headroom kept."
        )
    gpu = (
        f"{fmt_size(placed.vram)} of {fmt_size(budget.vram)} GPU budget, " if why.gpu_usable else ""
    )
    remote = ""
    if placed.remote:
        remote = (
            f"{fmt_size(placed.remote)} of {fmt_size(budget.remote)} on the rpc-servers "
            "(llama.cpp splits the layers by free memory; speeds assume the servers read "
            "no faster than this CPU), "
        )
    ram = placed.ram + (why.reader if why.reader_fits else 0)
    return (
        f"Memory: {remote}{gpu}{fmt_size(ram)} of {fmt_size(budget.ram)} RAM budget "
        f"(weights, KV cache{state_words(why)} and compute buffers; headroom kept for the "
        f"system).{reader_words(why)}"
    )


def reader_words(why: Rationale) -> str:
    """The CPU target's prompt reader (backends/reader.py), where one would load."""
    if not why.reader:
        return ""
    size = fmt_size(why.reader)
    if why.reader_fits:
        return (
            f" {size} of it is the target loaded again, not repacked, which reads long "
            "prompts 1.3-1.6x faster (--no-prompt-reader goes without)."
        )
    return (
        f" Prompts are read by the repacked weights: the target loaded again, to read them "
        f"1.3-1.6x faster, would take {size} more."
    )


def state_words(why: Rationale) -> str:
    """A hybrid target's recurrent state, which its memory counts beside the KV cache."""
    if not why.state:
        return ""
    return (
        f", its recurrent state ({fmt_size(why.state)} a sequence with the snapshots that "
        f"roll drafts back, {fmt_size(why.kept)} of copies kept in RAM for later turns)"
    )


def next_size_sentence(bigger: NextSizeUp) -> str:
    if bigger.tokens_per_s > 0:  # it fits: it was passed over for speed
        return (
            f"Next size up: {bigger.name} ({bigger.quant}) would fit but decode at only "
            f"~{bigger.tokens_per_s:.1f} tokens/s here (below {bigger.min_speed:g}; "
            f"--min-speed 0 allows it)."
        )
    return f"Next size up: {bigger.name} ({bigger.quant}) would need {bigger.needs.describe()}."


def plan_json(plan: Plan) -> dict[str, Any]:
    """The plan as `localspec plan --json` prints it."""
    return {
        "target": _side_json(plan.target),
        "draft": _side_json(plan.draft) if plan.draft else None,
        "drafter": plan.drafter,
        "gamma": plan.gamma,
        "slots": plan.slots,
        "tokens_per_s": round(plan.tokens_per_s, 2),
        "memory": {
            "vram_budget": plan.vram_budget,
            "vram_estimate": plan.vram_estimate,
            "ram_budget": plan.ram_budget,
            "ram_estimate": plan.ram_estimate,
            "remote_budget": plan.why.budget.remote,
            "remote_estimate": plan.why.placement.remote,
            # a hybrid target's recurrent state a sequence (with its snapshots), and its
            # lasting copies in RAM: in the estimates above (each of serve's slots adds one)
            "recurrent_state": plan.why.state,
            "recurrent_state_kept": plan.why.kept,
            # the target loaded again, not repacked, to read prompts (a CPU target on
            # x86): its bytes, in ram_estimate where the budget holds it (0: none)
            "prompt_reader": plan.why.reader,
            "prompt_reader_fits": plan.why.reader_fits,
            "prompt_reader_beside_slots": plan.why.reader_slots,
        },
        "reasons": list(reasons(plan)),
    }


def _side_json(side: Side) -> dict[str, Any]:
    return {
        "id": side.id,
        "quant": side.quant,
        "path": side.path,
        "n_gpu_layers": side.n_gpu_layers,
        "n_ctx": side.n_ctx,
        "cpu_moe": side.cpu_moe,
    }
