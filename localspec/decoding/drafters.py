"""Draft sources, behind one small interface (as in transformers' candidate generators).

A drafter proposes up to γ tokens to follow the context; for sampled decoding it also
gives the distribution q_i each token was drawn from (None = proposed with certainty).
After the target's verdict it hears how many were accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from localspec.backends.base import Model, Tokens, common_prefix, followed_by, shared_prefix
from localspec.decoding.grammar import GrammarState, jump_forward, shortlisted
from localspec.decoding.sampling import (
    Probs,
    SamplingParams,
    logits_to_probs,
    penalize,
    sample,
    top2,
)

if TYPE_CHECKING:
    from localspec.backends.mtp import MtpHead


@dataclass(frozen=True)
class Draft:
    tokens: list[int] = field(default_factory=list)
    q: list[Probs | None] = field(default_factory=list)  # per token; None = certain
    by: str = ""  # which source drafted, when a drafter combines several
    planned: int | None = None  # γ the drafter chose (it may stop early)
    why: str = ""
    # of the grammar's forced tokens before it, how many the round drafts (None: all);
    # a drafter that keeps fewer drafts nothing of its own (its tokens would follow all)
    lead: int | None = None


@dataclass(frozen=True)
class Outcome:
    """What the target made of one round's draft."""

    drafted: int
    accepted: int
    verify_s: float  # the target's time for its pass: forced + drafted + 1 tokens
    forced: int = 0  # the grammar's tokens before these, in the same pass (jump-forward)
    forced_accepted: int = 0  # of those


UNBOUNDED = 1 << 30  # the context a model-free drafter can draft after


class Drafter(Protocol):
    name: str

    @property
    def busy_s(self) -> float:
        """Seconds spent inside model calls so far (0 for model-free drafters)."""
        ...

    @property
    def n_ctx(self) -> int:
        """The longest text it can draft after (a draft model's context; UNBOUNDED
        for model-free drafters): the engine's room is the smaller of this and the
        target's."""
        ...

    def draft(
        self,
        context: Sequence[int],
        gamma: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        forced: int = 0,
        grammar: GrammarState | None = None,
    ) -> Draft:
        """Propose up to `gamma` tokens to follow `context`, whose last `forced` tokens
        are the grammar's jump-forward draft: not yet verified, in the same pass. Under a
        grammar, `grammar` is its state after `context`: a drafter may draft within it."""
        ...

    def accept(self, tokens: Sequence[int], outcome: Outcome) -> None:
        """The target kept `outcome.accepted` drafted tokens; `tokens` is now the text."""
        ...


class NoDrafter:
    """Plain decoding through the same loop: every round is just the target's token."""

    name = "none"
    busy_s = 0.0
    n_ctx = UNBOUNDED

    def draft(
        self,
        context: Sequence[int],
        gamma: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        forced: int = 0,
        grammar: GrammarState | None = None,
    ) -> Draft:
        return Draft()

    def accept(self, tokens: Sequence[int], outcome: Outcome) -> None:
        pass


SINKS = 4  # leading tokens a cut context keeps (StreamingLLM's attention sinks)
WINDOW = 512  # the most unread tokens a draft model reads at once


class StepTimes:
    """A draft model's timings, which `auto` prices it by: a one-token step, and a
    catch-up batch per token (timed apart: it would overstate a step's cost)."""

    step_s = 0.0  # moving average of a one-token draft step (0 = not yet timed)
    catchup_s = 0.0  # same, per token of a catch-up batch (after plain rounds)

    def time_step(self, n: int, took: float) -> None:
        """A pass of n tokens took `took`."""
        if n == 1:
            self.step_s = _ema(self.step_s, took)
        elif n > 1:
            self.catchup_s = _ema(self.catchup_s, took / n)


class DraftModel(StepTimes):
    """A small model of the same vocabulary, decoding γ tokens one at a time.

    For sampled decoding each token is drawn from q, the draft's logits under the same
    transform as the target's (`logits_to_probs`), and q is what it reports: rejection
    sampling is exact only if the reported q is the law the token was drawn from.

    It stops early when its own top-token probability falls below `p_min`: an unsure
    guess is likely rejected, and each extra token costs a draft step and a verify slot.
    `p_min` is one threshold, or one per drafted position (the last one holds after).

    It reads the whole context, unless that means reading more than `window` tokens it
    has not seen (a long prompt, or a long stretch of a conversation without it); then it
    reads the first SINKS tokens and the last `window`, and goes on from there. Catching
    up stays bounded, so it can be tried again late in a long chat; a draft decides only
    how fast the answer comes, so a cut context can cost acceptance, never output.
    """

    name = "draft"

    def __init__(
        self, model: Model, p_min: float | Sequence[float] = 0.5, window: int = WINDOW
    ) -> None:
        self.model = model
        self.p_min = p_min
        self.window = window
        # what a round it drafts in costs beyond its steps: a recurrent draft model's copy
        # of its state and its return to it (see Model.checkpoint); ~0 for others
        self.round_s = 0.0
        self._overhead: float | None = None  # this round's so far (None: it did not draft)
        self._cut = 0  # context[SINKS:_cut] is left out of what it reads (0: nothing)
        self._seq = Tokens()  # what it reads, uncut (see `_seen_as`)
        self._text_len = -1  # the text's length at the last round's end (`accept`)

    def view(self, context: Sequence[int]) -> tuple[list[int], int]:
        """What the draft model reads for `context` (see the class docstring), and how
        much of it its cache already holds."""
        if self._cut:
            seq, held = self._seen_as(context)
            if held > SINKS and len(seq) - held <= self.window:
                return seq, held  # going on from its cut
            self._cut = 0  # not read yet, or another conversation: judge it afresh
        # judged on the raw context, not the mapped one (an idle draft model does this
        # every round): a token past its vocabulary counts as unread, so in such a pair
        # it may cut once where it need not have
        if len(context) - shared_prefix(self.model.cached, context) > self.window:
            self._cut = len(context) - self.window
        return self._seen_as(context)

    def unread(self, context: Sequence[int]) -> int:
        """Tokens it would read before its first draft step for `context`."""
        seq, held = self.view(context)
        return len(seq) - min(held, len(seq) - 1)

    def _seen_as(self, context: Sequence[int]) -> tuple[list[int], int]:
        """`context` as read at the current cut, and how much of that the cache holds.
        Uncut, that is a copy kept from round to round (drafts append to it), brought
        up to the context by what changed (Tokens), not copied anew."""
        seq: list[int] = self._seq
        if self._cut <= SINKS:
            self._seq.follow(context)
        else:
            seq = [*context[:SINKS], *context[self._cut :]]
        cached, n_vocab = self.model.cached, self.model.n_vocab
        held = shared_prefix(cached, seq)
        # What the cache holds is in the vocabulary (the model read it); of the rest, a
        # target token past the draft's vocabulary (one of a padded vocabulary's extra
        # entries) reads as the draft's last token, in such pairs a padding token too: it
        # costs acceptance at most, never output. Only the unread tail is scanned: the
        # whole context, every round, was the largest cost of a round at 7k tokens.
        if held < len(seq) and max(seq[held:]) >= n_vocab:
            seq[held:] = [t if t < n_vocab else n_vocab - 1 for t in seq[held:]]
            held += common_prefix(cached[held:], seq[held:])
        return seq, held

    @property
    def busy_s(self) -> float:
        return self.model.busy_s

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    def draft(
        self,
        context: Sequence[int],
        gamma: int,
        params: SamplingParams,
        rng: np.random.Generator,
        p_min: float | Sequence[float] | None = None,
        *,
        forced: int = 0,
        grammar: GrammarState | None = None,
    ) -> Draft:
        """Up to `gamma` tokens, stopping at a confidence below `p_min` (this round's;
        default: its own)."""
        seq, _ = self.view(context)
        # a new text (not the last round's, which it heard of in `accept`, with the
        # grammar's forced tokens) is a prompt: its read keeps a lasting checkpoint
        # (Model.evaluate); a catch-up within an answer, after rounds it sat out, does
        # not, or its copies would push the prompt's out
        prompt = len(context) - forced != self._text_len

        def step(i: int) -> np.ndarray:
            logits = self._step(seq, prompt and i == 0)
            if i == 0:  # a recurrent draft model comes back here after a rejection
                started = time.perf_counter()
                self.model.checkpoint()
                self._overhead = time.perf_counter() - started
            return logits

        def jump(here: GrammarState, text: Sequence[int], n: int) -> list[int]:
            return jump_forward(self.model, here, n, text)

        # (greedy answers: a sampled answer's split of forced text is a bet that `auto`
        # weighs for the round's lead; within a draft the draft model's own q bets better)
        p_min = self.p_min if p_min is None else p_min
        return draw(step, seq, gamma, params, rng, p_min, grammar, jump if params.greedy else None)

    def read_ahead(self, context: Sequence[int], n: int) -> int:
        """Read up to `n` tokens of `context` it has not (between requests, so that the
        next one finds it caught up); returns how many are left. A recurrent draft model
        reads nothing here: its state cannot drop what a shorter next prompt leaves out."""
        seq, held = self.view(context)
        end = min(len(seq), held + n)
        if end <= held or not self.model.can_cut or self.model.cut_depth is not None:
            return 0
        self._step(seq[:end])
        return len(seq) - end

    def _step(self, seq: list[int], prompt: bool = False) -> np.ndarray:
        """One draft forward pass, timed (see `time_step`) where it ran alone: a pass
        shared with other slots' tokens (a prompt's catch-up among them) says nothing of
        this step's cost, and under load `auto` prices steps by the shared passes."""
        decoded, busy = self.model.decoded, self.model.busy_s
        logits = self.model.evaluate(seq, 1, checkpoint=prompt)[0]
        if not self.model.shared_pass:
            self.time_step(self.model.decoded - decoded, self.model.busy_s - busy)
        return logits

    def accept(self, tokens: Sequence[int], outcome: Outcome) -> None:
        # drop the rejected draft tokens now, as the target does
        self._text_len = len(tokens)
        started = time.perf_counter()
        self.model.rollback(self._seen_as(tokens)[0])
        if self._overhead is not None:
            spent = self._overhead + time.perf_counter() - started
            self.round_s, self._overhead = _ema(self.round_s, spent), None


class HeadSteps(Protocol):
    """How an MTP head's draft steps run: the head's own passes, or serve's shared ones
    (`SlotHead`), whose `shared_pass` says the last one carried other slots' steps."""

    shared_pass: bool

    def step(
        self, entries: Sequence[tuple[int, int, np.ndarray]], seq: int
    ) -> tuple[np.ndarray, np.ndarray]: ...


class MtpDrafter(StepTimes):
    """The target's own MTP head (localspec.backends.mtp): a draft model that reads the
    target's hidden states, not just its tokens, and needs no second file. It drafts as
    DraftModel does (q, `p_min`, the timings `auto` prices it by); its catch-up reads
    what the target's passes have read since its last draft."""

    name = "mtp"
    round_s = 0.0  # nothing beyond its steps: its cache follows the target's

    def __init__(
        self,
        head: MtpHead,
        p_min: float | Sequence[float] = 0.5,
        seq: int = 0,
        steps: HeadSteps | None = None,
    ) -> None:
        self.head = head
        self.p_min = p_min
        self.seq = seq  # the target's sequence it drafts for (serve's slot)
        self.steps: HeadSteps = head if steps is None else steps

    @property
    def busy_s(self) -> float:
        return self.head.busy_s

    @property
    def n_ctx(self) -> int:
        return self.head.n_ctx

    def unread(self, context: Sequence[int]) -> int:
        return self.head.unread(context, self.seq)

    def draft(
        self,
        context: Sequence[int],
        gamma: int,
        params: SamplingParams,
        rng: np.random.Generator,
        p_min: float | Sequence[float] | None = None,
        *,
        forced: int = 0,
        grammar: GrammarState | None = None,
    ) -> Draft:
        head, last = self.head, len(context) - 1
        entries: Sequence[tuple[int, int, np.ndarray]] = []

        def step(i: int) -> np.ndarray:
            nonlocal entries
            if i > 0:  # the token drafted last, its own state standing in for the trunk's
                entries = [(seq[-1], last if head.in_place else last + i, state)]
            busy = head.busy_s
            logits, state[:] = self.steps.step(entries, self.seq)
            if not self.steps.shared_pass:  # see DraftModel._step
                self.time_step(len(entries), head.busy_s - busy)
            return logits

        state = np.empty(head.n_embd, dtype=np.float32)
        p_min = self.p_min if p_min is None else p_min
        with head.lock:  # serve's slots keep their own sequences' caches at once
            entries = head.catch_up(context, self.seq)
        try:
            with followed_by(context, ()) as seq:  # the drafted tokens go after it
                drafted = draw(step, seq, gamma, params, rng, p_min, grammar)
        except BaseException:
            with head.lock:  # a step cut short: what its cache holds is not known
                head.drop(self.seq)
            raise
        with head.lock:
            head.settle(context, self.seq)
        return drafted

    def accept(self, tokens: Sequence[int], outcome: Outcome) -> None:
        pass  # the head follows the target's passes


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens
    (longest n first) and propose what followed it. Free, and strong wherever the answer
    repeats its prompt (code edits, quoting, summaries)."""

    name = "ngram"
    busy_s = 0.0
    n_ctx = UNBOUNDED

    def __init__(self, n_max: int = 4, n_min: int = 1) -> None:
        self.index = NgramIndex(n_max, n_min)

    def draft(
        self,
        context: Sequence[int],
        gamma: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        forced: int = 0,
        grammar: GrammarState | None = None,
    ) -> Draft:
        tokens = self.index.lookup(context, gamma)
        return Draft(tokens, [None] * len(tokens))

    def accept(self, tokens: Sequence[int], outcome: Outcome) -> None:
        pass


def copy_on(context: Sequence[int], start: int, gamma: int) -> list[int]:
    """γ tokens as a copy of the text from `start` goes on. Where it reaches the end of
    the context it reads what it has just written: a match that overlaps its own
    continuation ("!!!!", a short line said again and again) repeats with period
    len(context) - start, so it drafts γ deep instead of stopping at the end."""
    period = len(context) - start
    return [context[start + j % period] for j in range(gamma)]


# where a grammar forces text mid-draft: its tokens (at most n) after `seq`, from `here`
Jump = Callable[[GrammarState, Sequence[int], int], list[int]]


def draw(
    step: Callable[[int], np.ndarray],
    seq: list[int],
    gamma: int,
    params: SamplingParams,
    rng: np.random.Generator,
    p_min: float | Sequence[float],
    grammar: GrammarState | None = None,
    jump: Jump | None = None,
) -> Draft:
    """Up to `gamma` tokens from a draft model: `step(i)` gives the logits after `seq`,
    which each drafted token extends; it stops at a token too unsure (`pick`). Under a
    grammar it drafts what the grammar allows (`shortlisted`: a token the target's
    grammar refuses is a sure rejection), q the law it drew from; where the grammar then
    forces text, `jump` gives its tokens, drafted without steps of their own (chosen, not
    drawn: q one-hot) and read with the next step."""
    tokens: list[int] = []
    qs: list[Probs | None] = []
    here = grammar.clone() if grammar is not None else None
    steps = 0
    while len(tokens) < gamma:
        logits: np.ndarray | None = step(steps)
        steps += 1
        if here is not None and logits is not None:
            logits = shortlisted(here, logits)
        if logits is None:
            break
        x, q = pick(logits, params, seq, rng, p_min_at(p_min, len(tokens)))
        if x is None:
            break
        qs.append(q)
        tokens.append(x)
        seq.append(x)
        if here is None:
            continue
        here.accept(x)
        for forced in jump(here, seq, gamma - len(tokens)) if jump else ():
            if not here.allows(forced):
                break
            qs.append(None)
            tokens.append(forced)
            seq.append(forced)
            here.accept(forced)
    return Draft(tokens, qs)


def pick(
    logits: np.ndarray,
    params: SamplingParams,
    seq: Sequence[int],
    rng: np.random.Generator,
    p_min: float,
) -> tuple[int | None, Probs | None]:
    """A draft model's next token and the q it was drawn from (None when greedy: greedy
    verification needs none); no token where its confidence is below p_min."""
    if params.greedy:
        x, confidence = top2(penalize(logits, params, seq))
        return (x if confidence >= p_min else None), None
    q = logits_to_probs(logits, params, seq)
    if float(q.max()) < p_min:
        return None, q
    return sample(q, rng), q


def p_min_at(p_min: float | Sequence[float], i: int) -> float:
    """The early-stop threshold of the i-th drafted token: one for all, or one per
    position (the last one holds after)."""
    if isinstance(p_min, int | float):
        return p_min
    return p_min[min(i, len(p_min) - 1)]


def stop_thresholds(
    t: np.ndarray, alpha: Sequence[float], c: float, rate: float, ngram: int, reach: float
) -> list[float]:
    """The confidence each token a draft model drafts needs for drafting on from it to pay
    (its p_min), in a round of len(t) - 1 tokens, the first `ngram` from a free match that
    is all accepted with chance `reach`; t[i] = T(i + 1), α per draft-model position, c a
    draft step. Its own step is spent; drafting on to depth m costs the verify slots it
    adds, T(m + 1) − T(here), and the draft steps after it, and adds q (1 + α_next +
    α_next α_after + ...) tokens times the chance that the draft gets this far. It pays
    when that beats `rate` (tokens/s) for some m up to the round's depth. So a token that
    alone would not pay its slot can still open a deep draft that does, as on a CPU,
    where T(2) − T(1) can be ten times T(6) − T(2)."""
    k, n_model = len(t) - 1, len(t) - 1 - ngram
    a = np.array(alpha[:n_model])
    thresholds = []
    for j in range(n_model):
        before = ngram + j  # drafted tokens ahead of this one
        cost = t[before + 1 : k + 1] - t[before] + np.arange(n_model - j) * c
        adds = reach * (1 + np.concatenate(([0.0], np.cumsum(np.cumprod(a[j + 1 :])))))
        thresholds.append(float(np.clip(np.min(rate * cost / adds), 0.05, 0.9)))
        reach *= a[j]
    return thresholds


def _ema(old: float, new: float, weight: float = 0.2) -> float:
    return new if old == 0 else old + weight * (new - old)


class NgramIndex:
    """Where each n-gram of a growing context (n_min..n_max tokens) last occurred with a
    known next token: a few dict updates per new token instead of a scan per round. A
    context that departs from the last one (the next request of a chat: the same earlier
    turns, another answer) costs what departed and what is new, not a re-read of all."""

    def __init__(self, n_max: int = 4, n_min: int = 1) -> None:
        self.n_max, self.n_min = n_max, n_min
        # n-gram -> the indexes of what followed it, in order (the latest last)
        self._next: dict[tuple[int, ...], list[int]] = {}
        self._tokens = Tokens()  # the context indexed so far

    def lookup(self, context: Sequence[int], gamma: int) -> list[int]:
        """γ tokens as the text from the latest earlier match of the context's last n
        tokens on goes on (longest n first; see `copy_on`)."""
        return self.match(context, gamma)[1]

    def match(self, context: Sequence[int], gamma: int) -> tuple[int, list[int]]:
        """`lookup`, with the n that matched (0: none); a longer match is a safer bet."""
        self._sync(context)
        for n in range(min(self.n_max, len(context) - 1), self.n_min - 1, -1):
            found = self._next.get(tuple(context[-n:]))
            if found:
                return n, copy_on(context, found[-1], gamma)
        return 0, []

    def _sync(self, context: Sequence[int]) -> None:
        done = shared_prefix(self._tokens, context)
        self._truncate(done)
        self._tokens.extend(context[done:])
        for i in range(max(done, 1), len(context)):
            for n in range(self.n_min, min(self.n_max, i) + 1):
                self._next.setdefault(tuple(context[i - n : i]), []).append(i)

    def _truncate(self, n: int) -> None:
        """Forget the text from position n on (latest first: each entry is its list's last)."""
        tokens = self._tokens
        for i in range(len(tokens) - 1, max(n, 1) - 1, -1):
            for k in range(self.n_min, min(self.n_max, i) + 1):
                key = tuple(tokens[i - k : i])
                found = self._next[key]
                found.pop()
                if not found:
                    del self._next[key]
        del tokens[n:]
