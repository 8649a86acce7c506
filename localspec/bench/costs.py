"""What speculation has to work with on this machine: the target's time to score k tokens
in one pass, T(k), and the draft model's time per token, c. Together they bound the
speedup any drafter can reach (`Costs.ceiling`). `time_pass` is also used by the replay
and by scripts/gpu_overhead.py.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from localspec.backends.base import Model


@dataclass(frozen=True)
class Costs:
    """The target's seconds to score a batch of k tokens, T(k) for k = 1..K, and the
    draft model's seconds per token, c: together they bound what speculation can gain
    on this machine, however good the drafter."""

    verify_s: tuple[float, ...]
    draft_s: float | None = None
    head_s: float | None = None  # c of the target's own MTP head, where it has one
    head: str = "the target's MTP head"  # or Gemma 4's assistant, from a file of its own

    def ceiling(self, per_token_s: float) -> tuple[int, float] | None:
        """(γ, speedup) for a drafter that is always right (α = 1) and costs
        `per_token_s` a token: the best over γ of (γ + 1)·T(1) / (γ·c + T(γ + 1))."""
        t = self.verify_s
        if len(t) < 2 or t[0] <= 0:
            return None
        gains = {g: (g + 1) * t[0] / (g * per_token_s + t[g]) for g in range(1, len(t))}
        best = max(gains, key=lambda g: gains[g])
        return best, gains[best]


def measure_costs(
    target: Model, draft: Model | None, prompt: list[int], k_max: int = 8, reps: int = 5
) -> Costs:
    """T(1..k_max) and c (the timed runs after this start cold again)."""
    from localspec.backends.llama import LlamaModel
    from localspec.backends.mtp import head_of

    verify = tuple(time_pass(target, prompt, k, reps).llama_s for k in range(1, k_max + 1))
    step = time_pass(draft, prompt, 1, reps).llama_s if draft is not None else None
    costs = Costs(verify, step, time_head_step(target, prompt, reps))
    if isinstance(target, LlamaModel) and (head := head_of(target)) and head.from_file:
        return replace(costs, head=f"its assistant {head.name}")
    return costs


def time_head_step(target: Model, prompt: list[int], reps: int) -> float | None:
    """Median seconds of one draft step of the target's MTP head after `prompt` (its
    catch-up done first), or None where it has none."""
    from localspec.backends.llama import LlamaModel
    from localspec.backends.mtp import head_of

    head = head_of(target) if isinstance(target, LlamaModel) else None
    if head is None:
        return None
    target.evaluate(prompt[:-1], 1)
    head.step(head.catch_up(prompt))  # the catch-up, and the step after the prompt
    last = len(prompt)
    times = []
    for _ in range(reps + 1):
        busy = head.busy_s
        at = last - 1 if head.in_place else last  # one drafted position
        head.step([(prompt[-1], at, head.row(last - 2))])
        times.append(head.busy_s - busy)
        head.settle(prompt)
    return median(times[1:])


@dataclass(frozen=True)
class PassTimes:
    """Median seconds of one Model.evaluate of k new tokens after a cached prefix."""

    tokens: int
    wall_s: float  # around evaluate: Python bookkeeping included
    llama_s: float  # inside llama.cpp (busy_s)


def time_pass(
    model: Model, prefix: list[int], k: int, reps: int, warmup: int = 1, n_logits: int | None = None
) -> PassTimes:
    """Score k new tokens after `prefix`, which stays cached, with logits for the last
    `n_logits` of them (all k by default: a verify pass; 1 for a catch-up); the first
    `warmup` passes (allocations, graph capture) are not counted."""
    model.evaluate(prefix, 0)  # read, or kept as it is (a cut of a recurrent state re-reads)
    # a recurrent state cannot drop a whole pass in place: each rollback comes back to a
    # copy of it (else every timed pass would re-read the prefix)
    model.checkpoint()
    new = (prefix * (k // len(prefix) + 1))[:k]  # real token ids, any will do
    walls, busies = [], []
    for _ in range(reps + warmup):
        busy, started = model.busy_s, time.perf_counter()
        model.evaluate(prefix + new, k if n_logits is None else n_logits)
        walls.append(time.perf_counter() - started)
        busies.append(model.busy_s - busy)
        model.evaluate(prefix, 0)  # roll the k tokens back
    return PassTimes(k, median(walls[warmup:]), median(busies[warmup:]))


def median(values: Sequence[float]) -> float:
    """The median, 0 for no values (a figure nothing measured)."""
    return float(statistics.median(values)) if values else 0.0
