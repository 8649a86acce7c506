"""What each step of the shared passes reads, decided over plain data (as vLLM's
scheduler returns its decision), so the rules are tested without a model.

A slot's pending model call is a `Want`: a round (its last token and its draft, a few
tokens) or a prompt still to read. Each step fills one pass per model: whole rounds
first, short requests (an editor's completion) before long ones, then prompt chunks in
arrival order with what is left, so a long paste slows the others' rounds but never
holds them back. A new request goes to the idle slot whose cache shares the longest
prefix with its prompt, where that is most of it (llama-server's rule), so a chat and an
editor each keep theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from localspec.backends.base import common_prefix

ROUND_TOKENS = 17  # the largest round: a prediction drafted 16 deep, and the last token
SHORT_TOKENS = 64  # a request asking for at most this many tokens goes first
SIMILAR = 0.5  # llama-server's --slot-prompt-similarity: a match worth keeping a slot for
BUSY_CHUNK = 128  # a prompt's chunk in a step that also carries other slots' rounds
# An idle slot's draft model reads ahead in chunks, and a request that comes meanwhile
# waits for the chunk in flight: each chunk is sized to take about this long (on two
# CPU cores 16 tokens of a 0.5B draft; on a GPU hundreds), between these bounds
READ_AHEAD_S = 0.03
READ_AHEAD_CHUNKS = (8, 512)


@dataclass(frozen=True)
class Want:
    """One slot's pending call, as the scheduler sees it."""

    slot: int
    need: int  # tokens still to read
    n_logits: int  # rows of logits the call returns: its last tokens must come together
    short: bool = False  # a short request: served before the others when the pass is full
    arrived: int = 0  # order of arrival

    @property
    def is_round(self) -> bool:
        return self.need <= ROUND_TOKENS


def plan_step(wants: Sequence[Want], budget: int) -> dict[int, int]:
    """Tokens each slot reads in this step's pass, at most `budget` in all. A round goes
    whole or waits; a prompt is cut into chunks (smaller while others have rounds in the
    pass, unless it is a short request's), never leaving fewer tokens than its logits
    rows for the next chunk."""
    order = sorted(wants, key=lambda w: (not w.is_round, not w.short, w.arrived))
    rounds = any(w.is_round for w in wants)
    shares: dict[int, int] = {}
    left = budget
    for w in order:
        if w.is_round:
            n = w.need if w.need <= left else 0
        else:
            # a short request's prompt (an editor waits on it) takes what is left whole
            n = min(w.need, left, budget if w.short or not rounds else BUSY_CHUNK)
            if n < w.need and w.need - n < w.n_logits:
                n = max(0, w.need - w.n_logits)
        if n:
            shares[w.slot] = n
            left -= n
    if not shares and order:  # a pass always reads something (a round over the budget)
        shares[order[0].slot] = min(order[0].need, budget)
    return shares


def pick_slot(
    prompt: Sequence[int],
    idle: Mapping[int, tuple[Sequence[int], float]],
    keeps: Callable[[Sequence[int], Sequence[int]], int] = common_prefix,
) -> int:
    """The idle slot for `prompt`: the one whose cache keeps the most of it (the longest
    shared prefix; with --cache-reuse, the chunks it would move too), where that is at
    least SIMILAR of the prompt; else the one used least recently (a few shared tokens, a
    chat template's opening, are not worth another's cache). `idle` maps a slot to (its
    cached tokens, when it was last used)."""
    shared = {s: keeps(cache, prompt) for s, (cache, _used) in idle.items()}
    best = max(idle, key=lambda s: (shared[s], -idle[s][1]))
    if shared[best] >= SIMILAR * len(prompt):
        return best
    return min(idle, key=lambda s: idle[s][1])


KEEP_TOKENS = 256  # a cache's part worth keeping in RAM: fewer are read again quickly
MIN_GAIN = 64  # tokens a saved prompt must keep beyond the slot's own to be loaded


@dataclass(frozen=True)
class Swap:
    """What happens to a slot's cache before it reads a new prompt (llama-server's
    --cache-ram): `save` it to RAM first, and/or `restore` a saved prompt (its index)."""

    save: bool = False
    restore: int | None = None


def plan_swap(
    prompt: Sequence[int],
    cached: Sequence[int],
    saved: Sequence[Sequence[int]],
    keeps: Callable[[Sequence[int], Sequence[int]], int] = common_prefix,
) -> Swap:
    """Load the saved prompt that keeps the most of `prompt`, where it keeps MIN_GAIN
    more than the slot's cache; save the slot's cache where KEEP_TOKENS or more of it
    would be lost (a conversation taking its turn later finds it) and no saved prompt
    holds it already."""
    kept = keeps(cached, prompt)
    gains = [keeps(s, prompt) for s in saved]
    best = max(range(len(saved)), key=gains.__getitem__, default=None)
    restore = best if best is not None and gains[best] >= kept + MIN_GAIN else None
    survives = kept if restore is None else common_prefix(cached, saved[restore])
    held = any(common_prefix(s, cached) == len(cached) for s in saved)
    return Swap(len(cached) - survives >= KEEP_TOKENS and not held, restore)


def read_ahead_chunk(n: int, took: float) -> int:
    """The next chunk of an idle draft model's reading ahead, after a whole chunk of `n`
    tokens took `took` seconds: as many as take about READ_AHEAD_S. A smaller chunk
    reads less efficiently, which costs only idle time; a larger one makes a request
    that comes meanwhile (the next keystroke, at once) wait longer."""
    low, high = READ_AHEAD_CHUNKS
    if took <= 0:
        return high
    return max(low, min(high, round(n * READ_AHEAD_S / took)))
