"""What each step of the shared passes reads, decided over plain data (as vLLM's
scheduler returns its decision), so the rules are tested without a model.

A slot's pending model call is a `Want`: a round (its last token and its draft, a few
tokens) or a prompt still to read. Each step fills one pass per model: whole rounds
first, short requests (an editor's completion) before long ones, then prompt chunks in
arrival order with what is left, so a long paste slows the others' rounds but never
holds them back. Where long requests' rounds make a short request's pass much dearer
(on a CPU a pass of two tokens costs 1.4-1.9 of one), they sit out steps beside it,
as many as keep its passes within GIVE_WAY of their time alone: an editor's completion
then decodes nearly as fast as alone while a chat streams, and the chat goes on at a
quarter to a third of its speed for the second or two the completion lasts.
A pass cannot be interrupted, so prompt chunks are sized by time (as
Sarathi-Serve sizes them): a request that comes while prompts are read waits about
PROMPT_PASS_S at most for the pass in flight, and beside a short request a paste's
chunk takes no longer than the rest of the pass. A new request goes to the idle slot
whose cache shares the longest prefix with its prompt, where that is most of it
(llama-server's rule), so a chat and an editor each keep theirs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from localspec.backends.base import common_prefix

ROUND_TOKENS = 17  # the largest round: a prediction drafted 16 deep, and the last token
SHORT_TOKENS = 64  # a request asking for at most this many tokens goes first (a middle too)
SIMILAR = 0.5  # llama-server's --slot-prompt-similarity: a match worth keeping a slot for
BUSY_CHUNK = 128  # prompts' tokens in a step that also carries long requests' rounds
# A pass of prompts alone takes about this long: a request that comes meanwhile (the next
# keystroke's completion while an agent's file is read) waits for it. But it reads at
# least ALONE_MIN_CHUNK tokens: on two CPU cores smaller chunks read a prompt much slower
# (the 1.5B target in chunks of 32: +24%, of 64: +6%, of 128: +1%, against 256)
PROMPT_PASS_S = 0.5
ALONE_MIN_CHUNK = 64
MIN_CHUNK = 1  # beside a short request: a paste goes on, if slowly
# Long requests' rounds sit out steps beside a short request's round, as many as keep its
# passes within GIVE_WAY of their time alone on average (`steps_out`), at most MOST_OUT
# for each step they go. Going one step in n + 1, at r = T(all rounds) / T(the short
# ones'), the short request's passes take 1 + (r - 1) / (n + 1) of their time alone, and
# the long ones go r / (r + n) as fast as in a pass each step: at r 1.4 (a 2-token pass
# on two cores of a Xeon) n is 2, 1.13x and 0.41x; at r 1.9 (the same in slots 0 and 2,
# slot 1 filling the gap) n is 3, 1.23x and 0.39x. An editor waits on
# its completion, while a chat's reader sees 13 tokens a second become 4 for a second or
# two. On a GPU (r near 1) every round goes every step. Never all steps: a client that
# sends short requests back to back would hold a chat still.
GIVE_WAY = 1.15
MOST_OUT = 3
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


@dataclass(frozen=True)
class Pace:
    """A model's passes as timed, to size prompts' chunks by time (0: not timed yet)."""

    prompt_token_s: float = 0.0  # seconds a prompt token adds to a pass of prompts
    rounds_s: float = 0.0  # this step's rounds' pass, without prompt tokens
    short_rounds_s: float = 0.0  # ... of its short requests' rounds alone (0: untimed)


def prompt_chunk(pace: Pace, rounds: bool, short: bool, short_prompts: int, budget: int) -> int:
    """Tokens long requests' prompts read in a step's pass, after its rounds and short
    requests' prompts (`short_prompts` tokens). Beside a short request (its round or its
    prompt), as many as take as long as the rest of the pass, so that an editor's
    completion goes about half as fast as alone while an agent's file is read; beside
    long requests' rounds BUSY_CHUNK (chat answers give way more: reading a prompt
    sooner lets one more slot share each pass); alone, as many as take PROMPT_PASS_S,
    and no fewer than a CPU reads efficiently. Untimed: BUSY_CHUNK (the server's first
    pass of a prompt: a whole budget's took 14 s on two AVX2 cores)."""
    if rounds and not short:
        return min(BUSY_CHUNK, budget)
    if not short:
        seconds = PROMPT_PASS_S
    else:  # the rest of the pass
        seconds = (pace.rounds_s if rounds else 0.0) + short_prompts * pace.prompt_token_s
    if pace.prompt_token_s <= 0 or seconds <= 0:
        return min(BUSY_CHUNK, budget)
    least = MIN_CHUNK if short else ALONE_MIN_CHUNK
    return min(budget, max(least, round(seconds / pace.prompt_token_s)))


def plan_step(
    wants: Sequence[Want], budget: int, pace: Pace = Pace(), short_steps: int = 0
) -> dict[int, int]:
    """Tokens each slot reads in this step's pass, at most `budget` in all: rounds whole
    (or they wait), short requests' first, then short requests' prompts with what is left
    (an editor waits on them), then long requests' prompts in arrival order, sharing one
    chunk (`prompt_chunk`). Long requests' rounds sit this step out where they make a
    short request's pass dear (`give_way`; `short_steps`: the steps in a row before this
    one that carried a short request's round)."""
    if give_way(wants, pace, short_steps):
        wants = [w for w in wants if not (w.is_round and not w.short)]
        if not any(w.is_round and not w.short for w in wants):
            pace = replace(pace, rounds_s=pace.short_rounds_s)
    ahead = sorted(
        (w for w in wants if w.is_round or w.short),
        key=lambda w: (not w.is_round, not w.short, w.arrived),
    )
    behind = sorted((w for w in wants if not (w.is_round or w.short)), key=lambda w: w.arrived)
    shares: dict[int, int] = {}
    left = budget
    for w in ahead:
        n = (w.need if w.need <= left else 0) if w.is_round else cut(w, left)
        if n:
            shares[w.slot] = n
            left -= n
    taken = [w for w in ahead if w.slot in shares]
    rounds = any(w.is_round for w in taken)
    short = any(w.short for w in taken)
    short_prompts = sum(shares[w.slot] for w in taken if not w.is_round)
    chunk = min(left, prompt_chunk(pace, rounds, short, short_prompts, budget))
    for w in behind:
        n = cut(w, chunk)
        if n:
            shares[w.slot] = n
            chunk -= n
    if not shares and wants:  # a pass always reads something (a round over the budget)
        first = (ahead + behind)[0]
        shares[first.slot] = min(first.need, budget)
    return shares


def give_way(wants: Sequence[Want], pace: Pace, short_steps: int = 0) -> bool:
    """Whether long requests' rounds sit this step out beside its short requests' rounds:
    they go the first step and then one in `steps_out` + 1."""
    short = any(w.is_round and w.short for w in wants)
    return short and short_steps % (steps_out(pace.rounds_s, pace.short_rounds_s) + 1) > 0


def steps_out(all_s: float, short_s: float) -> int:
    """Steps long requests' rounds sit out for each they go beside a short request's,
    where a pass of every slot's round is timed at `all_s` and one of the short
    requests' rounds alone at `short_s` (0: untimed, none): the fewest that keep the
    short request's passes within GIVE_WAY of their time alone, at most MOST_OUT."""
    if short_s <= 0 or all_s <= GIVE_WAY * short_s:
        return 0
    return min(MOST_OUT, math.ceil((all_s / short_s - 1) / (GIVE_WAY - 1) - 1e-9) - 1)


def dearer(all_s: float, short_s: float) -> bool:
    """Whether long requests' rounds give way to short ones (`steps_out`). Then they
    draft nothing meanwhile too (AdaptiveDrafter: drafted, their tokens would make the
    short one's passes dearer still)."""
    return steps_out(all_s, short_s) > 0


def split_pass_s(sizes: Sequence[int], table: Sequence[float]) -> float:
    """A pass's time for rounds of these sizes (tokens, one per slot) where each slot has a
    cache of its own: llama.cpp reads them in micro-batches of an equal share of each slot
    still reading (`split_equal`), so a chat's token beside a completion's 3-token round
    costs T(2) + T(2), not T(4) (no rounds: 0). `table`: T(1..) as timed."""
    took, done = 0.0, 0
    for i, size in enumerate(sorted(sizes)):
        if size > done:
            took += table[(len(sizes) - i) * (size - done) - 1]
            done = size
    return took


def beside_chunk(token_s: float, step_s: float | None, budget: int) -> int:
    """Tokens that work beside the slots reads in a pass of its own after a step of
    theirs that took `step_s`: an embedding request's texts, which an index of a whole
    codebase may bring by the thousand, go after the slots' answers, which someone waits
    for. So it takes as long as the step did, and they keep about half the time (as an
    editor's completion does beside a paste); with no slot decoding (no step), as long
    as a prompt alone. `token_s`: a token's time in its passes (0: untimed)."""
    if token_s <= 0:
        return min(BUSY_CHUNK, budget)
    if step_s is None:
        return min(budget, max(ALONE_MIN_CHUNK, round(PROMPT_PASS_S / token_s)))
    return min(budget, max(MIN_CHUNK, round(step_s / token_s)))


def cut(w: Want, most: int) -> int:
    """A prompt's chunk of at most `most` tokens, leaving no fewer than its logits rows
    (which must come together) for the next."""
    n = min(w.need, most)
    if n < w.need and w.need - n < w.n_logits:
        n = max(0, w.need - w.n_logits)
    return n


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
