"""The speculative decoding loop.

Each round: the drafter proposes up to γ tokens x_1..x_γ (`draft`); the target scores
the last accepted token and the draft in one batched pass (`score`), giving p_1..p_{γ+1};
`verify` keeps a prefix of the draft and adds the target's own token; the kept tokens are
emitted. Both KV caches follow the accepted text through `Model.evaluate`, so a rejected
tail is dropped at the start of the next call. With γ = 0 a round is plain decoding.

Under a grammar (structured output) each row of a pass is masked by the grammar's state
after the tokens before it, and what the grammar alone allows next is drafted first
(jump-forward): see localspec.decoding.grammar.

A greedy answer is kept (`Answered`): a later request that it answers too (the same one
again, a client's retry, or the next keystroke of a middle that opened with the answer's
own first characters) takes its tokens again without a pass (`recall`).

A target whose cache cannot drop a rejected tail (a recurrent or hybrid model without
state snapshots) would re-read the whole text after every rejection: it decodes plainly,
and `notes` says why. One with snapshots drafts at most as deep as they reach.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from localspec.backends.base import ContextFull, Model, Tokens
from localspec.decoding.drafters import Draft, Drafter, NoDrafter, Outcome
from localspec.decoding.events import (
    Event,
    Finished,
    Piece,
    Source,
    StatsRecorder,
    StopReason,
)
from localspec.decoding.grammar import (
    Grammar,
    GrammarState,
    allowed_prefix,
    jump_forward,
    last_state,
    masked_argmax,
    masked_probs,
    states_along,
)
from localspec.decoding.sampling import (
    Probs,
    SamplingParams,
    greedy_token,
    logits_to_probs,
    penalize,
    recent,
    sample,
)
from localspec.decoding.text import LineRule, TextStream
from localspec.decoding.verify import Verdict, verify_greedy, verify_sampled


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 512
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    trace: bool = False  # attach the target's top-2 logit margin to each piece
    logprobs: int | None = None  # attach each token's log-probability and this many top ones
    lines: LineRule | None = None  # judges each line as it completes (fill-in-the-middle)
    grammar: Grammar | None = None  # what the answer may be (structured output)
    # control tokens the answer shows as text: a chat format's markers, which its parser
    # reads (llama-server's preserved tokens)
    shown: frozenset[int] = frozenset()
    # where the prompt's messages start (a chat's, rendered): a recurrent target keeps
    # its state there for a later prompt that shares the text before (Model.evaluate)
    marks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Answered:
    """A greedy answer: `tokens` (the prompt, then from `start` the target's choices, the
    last not yet evaluated), under these sampling settings and grammar. The list is the
    answer's own, growing with it."""

    tokens: list[int]
    start: int
    sampling: SamplingParams
    grammar: Grammar | None


class Engine:
    """A target model and a drafter: turns a prompt into events.

    `gamma` is the most tokens a round may draft; an adaptive drafter chooses fewer (or
    none) each round, a fixed one drafts that many unless its early stop cuts in.
    """

    def __init__(self, target: Model, drafter: Drafter, gamma: int = 4) -> None:
        self.notes: list[str] = []  # what the engine had to give up, for the user
        if gamma > 0 and not target.can_cut:
            self.notes.append(
                f"plain decoding: {target.name} is a recurrent or hybrid model, whose cache "
                "cannot drop a rejected draft"
            )
            drafter, gamma = NoDrafter(), 0
        depth = target.cut_depth
        if depth is not None and gamma > depth:
            gamma = depth  # a verify pass of γ+1 tokens rolls back at most γ
        self.target = target
        self.drafter = drafter
        self.gamma = gamma
        self.answered: Answered | None = None  # the last greedy answer, for `recall`

    def room(self, context_len: int) -> int:
        """How many more tokens fit into the smaller of the two contexts."""
        return min(self.target.n_ctx, self.drafter.n_ctx) - context_len

    def generate(
        self,
        prompt: Sequence[int],
        config: GenerationConfig = GenerationConfig(),
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Stream the answer to `prompt` as Piece/RoundEnd events, then one Finished."""
        if not prompt:
            raise ValueError("empty prompt")
        if self.room(len(prompt)) < 1:
            raise ContextFull(
                f"the prompt has {len(prompt)} tokens; the context holds "
                f"{self.target.n_ctx} with room for the answer"
            )
        params = config.sampling
        rng = np.random.default_rng(params.seed)
        rec = StatsRecorder(prompt_tokens=len(prompt))
        stream = TextStream(config.stop, config.lines)
        out = _Output(
            self.target, stream, config.max_tokens, config.trace, config.logprobs, config.shown
        )
        tokens = Tokens(prompt)  # the text: grows by each round's tokens (see Tokens)
        state = config.grammar.start() if config.grammar is not None else None
        if recalled := self.recall(tokens, config, state):
            pieces = list(out.emit(recalled, 0, NO_LOGITS))
            rec.observe_recalled(len(out.tokens))
            yield from rec.timed(pieces)
            state = self._follow(state, recalled[: out.kept_last])
            tokens.extend(recalled[: out.kept_last])
        if params.greedy and config.max_tokens > 0:
            self.answered = Answered(tokens, len(prompt), params, config.grammar)

        if out.stop_reason is None:
            # prefill: the target alone gives the first token (this is the TTFT), or the
            # one after those recalled (the cache mostly holds them)
            read = self.target.decoded
            logits = self.target.evaluate(tokens, 1, checkpoint=True, marks=config.marks)
            # its last token counts as read, as llama-server counts it (the cache holds the
            # whole prompt where the last answer was recalled)
            kept = len(tokens) - (self.target.decoded - read)
            rec.prompt_cached = min(kept, len(prompt) - 1)
            if config.max_tokens == 0:  # only read the prompt (an editor's warm-up)
                yield Finished("", (), "max_tokens", rec.snapshot(final=True))
                return
            first = self._choose(logits[0], params, tokens, rng, state)
            if recalled:
                rec.observe_tokens(1)
            else:
                rec.observe_first_token()
            yield from rec.timed(out.emit([first], 0, logits))
            state = self._follow(state, [first][: out.kept_last])
            tokens.append(first)

        while out.stop_reason is None:
            if cancel is not None and cancel.is_set():
                out.stop_reason = "cancelled"
                break
            room = self.room(len(tokens))
            if room < 1:
                out.stop_reason = "context_full"
                break
            started = time.perf_counter()
            budget = max(0, min(self.gamma, room - 1, out.remaining - 1))
            lead = jump_forward(self.target, state, budget, out.tokens)
            draft = self._timed_draft(rec, tokens, lead, budget, params, rng, state)
            lead = lead[: draft.lead]  # as much of it as the drafter finds worth a pass
            draft = with_lead(lead, draft)
            # the target reads the draft up to a token it does not have, which it refuses
            n = self.readable(draft.tokens)
            with tokens.trying(draft.tokens[:n]):
                logits, verify_s = self._timed_score(rec, tokens, n + 1)
            verdict = self._verify(draft, logits, params, tokens, rng, state)
            new = [*draft.tokens[: verdict.accepted], verdict.token]
            answered = len(out.tokens)
            pieces = list(out.emit(new, verdict.accepted, logits))
            state = self._follow(state, new[: out.kept_last])
            tokens.extend(new[: out.kept_last])
            outcome = Outcome(len(draft.tokens), verdict.accepted, verify_s)
            self.trim_caches(tokens, drafters_part(outcome, len(lead)))

            round_end = rec.end_round(
                draft.by or self.drafter.name,
                budget if draft.planned is None else draft.planned,
                outcome.drafted,
                outcome.accepted,
                len(out.tokens) - answered,
                draft.why,
            )
            # the round's engine time ends here: what the caller does with the events
            # below is not ours
            rec.round_s += time.perf_counter() - started
            yield from rec.timed(pieces)
            yield round_end

        if tail := out.stream.flush():
            yield Piece(tail, -1, "target")
        yield Finished(
            out.stream.text,
            tuple(out.tokens),
            out.stop_reason or "cancelled",
            rec.snapshot(final=True),
            out.stream.stop_string,
        )

    # --- one step each ---------------------------------------------------------------
    def recall(
        self, tokens: list[int], config: GenerationConfig, state: GrammarState | None
    ) -> list[int]:
        """The last greedy answer's tokens after `tokens`, as far as this answer would
        choose them too: `tokens` run into that answer, the sampling is the same, and
        each token is allowed here. A choice made under the last grammar stands under
        one that allows, position by position, at most what it allowed (a middle's
        opening typed further: `Grammar.within`) and allows that token: the best of
        fewer is the same best. Not where a piece needs its pass's row (logprobs)."""
        last = self.answered
        n = len(tokens)
        if (
            last is None
            or config.logprobs is not None
            or config.trace
            or config.max_tokens < 1
            or config.sampling != last.sampling
            or not last.start <= n < len(last.tokens)
            or last.tokens[:n] != tokens
        ):
            return []
        if last.grammar is not None and (  # its states ran from the last answer's start
            config.grammar is None or n != last.start or not config.grammar.within(last.grammar)
        ):
            return []
        return allowed_prefix(state, last.tokens[n:])

    def readable(self, draft: Sequence[int]) -> int:
        """How many drafted tokens precede the first one past the target's vocabulary
        (a draft's vocabulary may be up to 128 entries larger)."""
        n_vocab = self.target.n_vocab
        return next((i for i, x in enumerate(draft) if x >= n_vocab), len(draft))

    def trim_caches(self, tokens: Sequence[int], outcome: Outcome) -> None:
        """Both caches keep the accepted text only: the target's last token is not yet
        evaluated (it starts the next round's batch), and the rejected tail goes."""
        self.target.rollback(tokens, len(tokens) - 1)
        self.drafter.accept(tokens, outcome)

    def _timed_draft(
        self,
        rec: StatsRecorder,
        tokens: Tokens,
        lead: list[int],
        budget: int,
        params: SamplingParams,
        rng: np.random.Generator,
        state: GrammarState | None = None,
    ) -> Draft:
        """The drafter's tokens after the grammar's forced `lead` (which it is told of:
        they go in the same pass), `budget` in all, within the grammar (its state after
        the lead)."""
        gamma = budget - len(lead)
        if gamma <= 0:
            return Draft()
        busy, started = self.drafter.busy_s, time.perf_counter()
        grammar = None if state is None else last_state(state, lead)
        with tokens.trying(lead):
            draft = self.drafter.draft(
                tokens, gamma, params, rng, forced=len(lead), grammar=grammar
            )
        rec.draft_s += time.perf_counter() - started
        rec.llama_s += self.drafter.busy_s - busy
        return draft

    def _timed_score(
        self, rec: StatsRecorder, tokens: list[int], n_logits: int
    ) -> tuple[np.ndarray, float]:
        """The target's logits for the last n_logits positions, and its time in llama."""
        busy, started = self.target.busy_s, time.perf_counter()
        logits = self.target.evaluate(tokens, n_logits)
        rec.verify_s += time.perf_counter() - started
        in_llama = self.target.busy_s - busy
        rec.llama_s += in_llama
        return logits, in_llama

    def _choose(
        self,
        logits: np.ndarray,
        params: SamplingParams,
        history: Sequence[int],
        rng: np.random.Generator,
        state: GrammarState | None = None,
    ) -> int:
        if state is not None and params.greedy:
            return masked_argmax(state, penalize(logits, params, history))
        if state is not None:
            return sample(masked_probs(state, logits, params, history), rng)
        if params.greedy:
            return greedy_token(logits, params, history)
        return sample(logits_to_probs(logits, params, history), rng)

    def _verify(
        self,
        draft: Draft,
        logits: np.ndarray,
        params: SamplingParams,
        tokens: list[int],
        rng: np.random.Generator,
        state: GrammarState | None = None,
    ) -> Verdict:
        if state is not None:
            return self._verify_constrained(draft, logits, params, tokens, rng, state)
        if params.greedy:
            if not params.reshapes_logits:
                argmax = np.argmax(logits, axis=1).tolist()
            else:
                argmax = [
                    greedy_token(row, params, recent(params, tokens, draft.tokens[:i]))
                    for i, row in enumerate(logits)
                ]
            return verify_greedy(draft.tokens, argmax)

        def p(i: int) -> np.ndarray:
            return logits_to_probs(logits[i], params, recent(params, tokens, draft.tokens[:i]))

        return verify_sampled(draft.tokens, draft.q, p, rng)

    def _verify_constrained(
        self,
        draft: Draft,
        logits: np.ndarray,
        params: SamplingParams,
        tokens: list[int],
        rng: np.random.Generator,
        state: GrammarState,
    ) -> Verdict:
        """Row i masked by the grammar's state after draft[:i], each row only once the
        rows before it accepted (see localspec.decoding.grammar)."""
        states = states_along(state, draft.tokens)
        if params.greedy:
            argmax: list[int] = []
            for i, here in enumerate(states):
                history = recent(params, tokens, draft.tokens[:i])
                argmax.append(self._choose(logits[i], params, history, rng, here))
                if i == len(draft.tokens) or argmax[i] != draft.tokens[i]:
                    break
            return verify_greedy(draft.tokens, argmax)

        def p(i: int) -> np.ndarray:
            history = recent(params, tokens, draft.tokens[:i])
            return masked_probs(next(states), logits[i], params, history)

        return verify_sampled(draft.tokens, draft.q, p, rng)

    def _follow(self, state: GrammarState | None, emitted: list[int]) -> GrammarState | None:
        """Advance the grammar past the answer's new tokens (not an end token: the
        answer ends there); None once it allows everything (`GrammarState.free`)."""
        if state is None:
            return None
        for token in emitted:
            if not self.target.is_eog(token):
                state.accept(token)
        return None if state.free else state


NO_LOGITS = np.empty((0, 0), dtype=np.float32)  # recalled tokens come from no pass


def with_lead(lead: list[int], draft: Draft) -> Draft:
    """The round's draft: the grammar's forced tokens (certain, q one-hot), then the
    drafter's."""
    if not lead:
        return draft
    by = "grammar" + (f"+{draft.by or 'draft'}" if draft.tokens else "")
    q: list[Probs | None] = [None] * len(lead)
    return replace(draft, tokens=[*lead, *draft.tokens], q=q + draft.q, by=by)


def drafters_part(outcome: Outcome, lead: int) -> Outcome:
    """What the drafter's own tokens (after `lead` forced ones) met: untested where a
    forced token was refused. The pass's time stays whole, with the forced tokens it held:
    T(k) is a pass's time by its size, and a share pro rata would teach `auto` a T(1) of
    a fraction of a real pass's (on a CPU, T(5) is about 1.5 T(1), not 5 T(1))."""
    if not lead:
        return outcome
    own, accepted = outcome.drafted - lead, outcome.accepted - lead
    kept = min(outcome.accepted, lead)
    if accepted < 0:
        return Outcome(0, 0, outcome.verify_s, forced=lead, forced_accepted=kept)
    return Outcome(own, accepted, outcome.verify_s, forced=lead, forced_accepted=kept)


class _Output:
    """Turns emitted tokens into pieces, and notices every reason to stop."""

    def __init__(
        self,
        target: Model,
        stream: TextStream,
        max_tokens: int,
        trace: bool = False,
        logprobs: int | None = None,
        shown: frozenset[int] = frozenset(),
    ) -> None:
        self.target = target
        self.shown = shown
        self.stream = stream
        self.max_tokens = max_tokens
        self.trace = trace
        self.logprobs = logprobs
        self.tokens: list[int] = []
        self.stop_reason: StopReason | None = None
        self.kept_last = 0  # how many of the last emit's tokens belong to the answer

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.tokens)

    def emit(self, new: list[int], drafted: int, logits: np.ndarray) -> Iterator[Piece]:
        """`new`: the round's tokens, of which the first `drafted` came from the draft;
        row i of `logits` scored new[i]."""
        self.kept_last = 0
        for i, token in enumerate(new):
            source: Source = "draft" if i < drafted else "target"
            self.kept_last += 1
            if self.target.is_eog(token):
                self.stop_reason = "eog"
                return
            self.tokens.append(token)
            text = self.stream.push(self.target.token_bytes(token, token in self.shown))
            traced = _top2(logits, i) if self.trace else (None, None)
            yield Piece(text, token, source, *traced, *self._logprobs(logits, i, token))
            if self.stream.stopped:
                self.stop_reason = "stop_string"
                return
            if self.remaining <= 0:
                self.stop_reason = "max_tokens"
                return

    def _logprobs(
        self, logits: np.ndarray, i: int, token: int
    ) -> tuple[float | None, tuple[tuple[int, float], ...]]:
        """log p(token) under the target's own distribution (row i's softmax, before
        any sampling transform or grammar), and the `logprobs` most likely tokens'."""
        if self.logprobs is None:
            return None, ()
        x = logits[i].astype(np.float64)
        lp = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
        k = min(self.logprobs, len(lp))
        top = np.argpartition(lp, -k)[-k:] if k else np.empty(0, dtype=np.int64)
        top = top[np.argsort(-lp[top], kind="stable")]
        return float(lp[token]), tuple((int(t), float(lp[t])) for t in top)


def _top2(logits: np.ndarray, i: int) -> tuple[float | None, int | None]:
    """(top-2 logit gap, second choice) of row i, when tracing."""
    first, second = np.argpartition(logits[i], -2)[-2:][::-1]
    if logits[i][second] > logits[i][first]:
        first, second = second, first
    return float(logits[i][first] - logits[i][second]), int(second)
