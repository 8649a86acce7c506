"""The speculative decoding loop.

Each round: the drafter proposes up to γ tokens x_1..x_γ (`draft`); the target scores
the last accepted token and the draft in one batched pass (`score`), giving p_1..p_{γ+1};
`verify` keeps a prefix of the draft and adds the target's own token; the kept tokens are
emitted. Both KV caches follow the accepted text through `Model.evaluate`, so a rejected
tail is dropped at the start of the next call. With γ = 0 a round is plain decoding.

A target whose cache cannot drop a rejected tail (a recurrent or hybrid model) would
re-read the whole text after every rejection: it decodes plainly, and `notes` says why.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from localspec.backends.base import ContextFull, Model
from localspec.decoding.drafters import Draft, Drafter, NoDrafter, Outcome
from localspec.decoding.events import (
    Event,
    Finished,
    Piece,
    Source,
    StatsRecorder,
    StopReason,
)
from localspec.decoding.sampling import SamplingParams, greedy_token, logits_to_probs, sample
from localspec.decoding.text import LineRule, TextStream
from localspec.decoding.verify import Verdict, verify_greedy, verify_sampled


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 512
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    trace: bool = False  # attach the target's top-2 logit margin to each piece
    lines: LineRule | None = None  # judges each line as it completes (fill-in-the-middle)


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
        self.target = target
        self.drafter = drafter
        self.gamma = gamma

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
        out = _Output(self.target, TextStream(config.stop, config.lines), config.max_tokens)
        tokens = list(prompt)

        # prefill: the target alone gives the first token (this is the TTFT)
        logits = self.target.evaluate(tokens, 1)
        if config.max_tokens == 0:  # only read the prompt into the cache (an editor's warm-up)
            yield Finished("", (), "max_tokens", rec.snapshot(final=True))
            return
        first = self._choose(logits[0], params, tokens, rng)
        rec.observe_first_token()
        yield from rec.timed(out.emit([first], 0, logits if config.trace else None))
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
            draft = self._timed_draft(rec, tokens, budget, params, rng)
            # the target reads the draft up to a token it does not have, which it refuses
            n = self.readable(draft.tokens)
            logits, verify_s = self._timed_score(rec, tokens + draft.tokens[:n], n + 1)
            verdict = self._verify(draft, logits, params, tokens, rng)
            new = [*draft.tokens[: verdict.accepted], verdict.token]
            answered = len(out.tokens)
            pieces = list(out.emit(new, verdict.accepted, logits if config.trace else None))
            tokens.extend(new[: out.kept_last])
            outcome = Outcome(len(draft.tokens), verdict.accepted, verify_s)
            self.trim_caches(tokens, outcome)

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
        )

    # --- one step each ---------------------------------------------------------------
    def readable(self, draft: Sequence[int]) -> int:
        """How many drafted tokens precede the first one past the target's vocabulary
        (a draft's vocabulary may be up to 128 entries larger)."""
        n_vocab = self.target.n_vocab
        return next((i for i, x in enumerate(draft) if x >= n_vocab), len(draft))

    def trim_caches(self, tokens: list[int], outcome: Outcome) -> None:
        """Both caches keep the accepted text only: the target's last token is not yet
        evaluated (it starts the next round's batch), and the rejected tail goes."""
        self.target.rollback(tokens[:-1])
        self.drafter.accept(tokens, outcome)

    def _timed_draft(
        self,
        rec: StatsRecorder,
        tokens: list[int],
        gamma: int,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> Draft:
        if gamma == 0:
            return Draft()
        busy, started = self.drafter.busy_s, time.perf_counter()
        draft = self.drafter.draft(tokens, gamma, params, rng)
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
        history: list[int],
        rng: np.random.Generator,
    ) -> int:
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
    ) -> Verdict:
        if params.greedy:
            if params.repeat_penalty == 1.0:
                argmax = np.argmax(logits, axis=1).tolist()
            else:
                argmax = [
                    greedy_token(row, params, tokens + draft.tokens[:i])
                    for i, row in enumerate(logits)
                ]
            return verify_greedy(draft.tokens, argmax)

        def p(i: int) -> np.ndarray:
            return logits_to_probs(logits[i], params, tokens + draft.tokens[:i])

        return verify_sampled(draft.tokens, draft.q, p, rng)


class _Output:
    """Turns emitted tokens into pieces, and notices every reason to stop."""

    def __init__(self, target: Model, stream: TextStream, max_tokens: int) -> None:
        self.target = target
        self.stream = stream
        self.max_tokens = max_tokens
        self.tokens: list[int] = []
        self.stop_reason: StopReason | None = None
        self.kept_last = 0  # how many of the last emit's tokens belong to the answer

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.tokens)

    def emit(self, new: list[int], drafted: int, logits: np.ndarray | None) -> Iterator[Piece]:
        """`new`: the round's tokens, of which the first `drafted` came from the draft."""
        self.kept_last = 0
        for i, token in enumerate(new):
            source: Source = "draft" if i < drafted else "target"
            self.kept_last += 1
            if self.target.is_eog(token):
                self.stop_reason = "eog"
                return
            self.tokens.append(token)
            text = self.stream.push(self.target.token_bytes(token))
            yield Piece(text, token, source, *_top2(logits, i))
            if self.stream.stopped:
                self.stop_reason = "stop_string"
                return
            if self.remaining <= 0:
                self.stop_reason = "max_tokens"
                return


def _top2(logits: np.ndarray | None, i: int) -> tuple[float | None, int | None]:
    """(top-2 logit gap, second choice) of row i, when tracing."""
    if logits is None:
        return None, None
    first, second = np.argpartition(logits[i], -2)[-2:][::-1]
    if logits[i][second] > logits[i][first]:
        first, second = second, first
    return float(logits[i][first] - logits[i][second]), int(second)
