"""The divergence audit: where a greedy speculative answer differs from plain decoding's,
prove what made it differ.

Greedy speculation emits exactly the target's argmax tokens, so its one licensed way to
differ from plain decoding is numerical: it scores each round's tokens in one batched
pass where plain decoding scores one token a pass, and the two kernels can disagree in
the last bits, which flips a near-tie. The audit replays each run's target passes from a
cleared cache, in their order and with their tokens (recorded while the run ran: see
`DraftLog` and `rounds_of`), up to the pass that scored the first position where the
answers differ, and takes the argmax there. It is "numerics" when each replay gives its
own run's token, so the one-token pass and the batched pass really pick differently;
anything else is a defect, however close the tie looks. It needs only the `Model`
interface.

A server's answer comes without its passes: `judge` replays plain decoding's passes and
one pass over the same tokens, the two shapes between which a speculative round's lie.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from localspec.backends.base import Model
from localspec.decoding.drafters import Draft, Drafter, Outcome
from localspec.decoding.events import RoundEnd
from localspec.decoding.grammar import GrammarState, masked_argmax
from localspec.decoding.sampling import SamplingParams

Verdict = Literal["numerics", "defect"]
NEAR_TIE = 1.0  # logits: the tests' bound for a batched-vs-single difference


class AuditError(Exception):
    """A run's record cannot be replayed (the message says why); the divergence is a defect."""


@dataclass(frozen=True)
class Round:
    """One round of a run as the target scored it: one pass over [answer[start - 1],
    *drafted], whose row j predicts answer[start + j]; the first `accepted` drafted tokens
    were kept, then the target's own token."""

    start: int  # index in the answer of the round's first new token (1 for the first round)
    drafted: tuple[int, ...]
    accepted: int


@dataclass(frozen=True)
class Trace:
    """What the audit needs of one greedy run: its prompt, its answer, why it stopped, and
    its rounds (their drafts included, the rejected tokens too)."""

    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    stop_reason: str
    rounds: tuple[Round, ...] = ()

    def token_at(self, i: int) -> int | None:
        """answer[i]; None where the answer ended at i (an end-of-generation token)."""
        return self.answer[i] if i < len(self.answer) else None


@dataclass(frozen=True)
class Pass:
    """One target pass of a run: after it the cache holds `tokens`; it decoded the last
    `size` of them and its logits rows predicted answer[first], answer[first + 1], ..."""

    tokens: tuple[int, ...]
    size: int
    n_logits: int
    first: int
    emitted: int  # how many of its rows gave answer tokens

    @property
    def position(self) -> int:
        """Where its batch starts in the sequence."""
        return len(self.tokens) - self.size


@dataclass(frozen=True)
class Divergence:
    """The first position where a run's answer differs from the baseline's, and the audit's
    verdict on it. Tokens are None where that answer ended (an end-of-generation token)."""

    index: int
    verdict: Verdict
    why: str  # one line: what each re-scored pass picked, or why the run did not reproduce
    baseline_token: int | None
    other_token: int | None
    one_token_argmax: int | None = None  # plain decoding's one-token pass, re-scored
    batched_argmax: int | None = None  # the batch the other run scored there, re-scored
    batch_position: int | None = None
    batch_size: int | None = None

    @property
    def is_defect(self) -> bool:
        return self.verdict == "defect"

    def label(self) -> str:
        if self.is_defect:
            return f"differs at {self.index}: DEFECT, {self.why}"
        return f"differs at {self.index}: numerics ({self.why})"


def first_difference(baseline: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first token where the two differ (a shorter answer differs where it
    ends); None if identical."""
    for i, (a, b) in enumerate(zip(baseline, other, strict=False)):
        if a != b:
            return i
    return None if len(baseline) == len(other) else min(len(baseline), len(other))


def audit(model: Model, baseline: Trace, other: Trace) -> Divergence | None:
    """None if the two answers are identical; else their first divergence, re-scored by
    replaying plain decoding's one-token passes and the other run's batched passes up to
    it, on `model` (the target both runs decoded with), and the verdict."""
    i = first_difference(baseline.answer, other.answer)
    if i is None:
        return None
    b, o = baseline.token_at(i), other.token_at(i)
    try:
        one_row, _ = rescore(model, baseline, i)
        batch_row, batch = rescore(model, other, i)
    except AuditError as e:
        return Divergence(i, "defect", str(e), b, o)
    one, batched = int(np.argmax(one_row)), int(np.argmax(batch_row))
    name = TokenNames(model)
    last = f"the last a {batch.size}-token batch at position {batch.position}"
    verdict: Verdict = "defect"
    if not took(model, b, one):
        why = (
            f"does not reproduce: plain decoding took {name(b)}, but its own passes, "
            f"replayed, pick {name(one)}"
        )
    elif not took(model, o, batched):
        why = (
            f"not numerics: the run took {name(o)}, but its own passes, replayed "
            f"({last}), pick {name(batched)}"
            + (" as plain decoding does" if batched == one else "")
        )
    else:
        verdict = "numerics"
        why = (
            f"reproduced: plain decoding's passes, replayed, pick {name(one)}; the run's "
            f"({last}) pick {name(batched)}"
        )
        if b is not None and o is not None:  # how close a tie each pass saw
            why += (
                f"; {name(o)} trails by {margin(one_row, one, o)} in the first, "
                f"{name(b)} by {margin(batch_row, batched, b)} in the second"
            )
    return Divergence(i, verdict, why, b, o, one, batched, batch.position, batch.size)


# what `judge`'s verdicts mean, for the reports
JUDGED = (
    f"within {NEAR_TIE:g} logit in plain decoding's own passes, a near-tie; taken by one "
    "pass over the same tokens, numerics; else a DEFECT"
)


def judge(
    model: Model,
    prompt: list[int],
    a: list[int],
    b: list[int],
    state: GrammarState | None = None,
    other_grammar: bool = False,
) -> str:
    """Why a server's answer `b` leaves plain decoding's `a` at their first different
    token i, where only the tokens are known (not the other run's passes, as `audit` has
    them):
    - the same tokens, stopped elsewhere: one is the other's beginning;
    - another grammar: the grammar refuses b[i] after a[:i] (`state`: its start,
      advanced here; another server's grammar may allow what localspec's does not);
      with `other_grammar` (`b` is another server's, under its own grammar), also where
      the target's clear choice a[i] is one `state` allows: that grammar refuses it;
    - a near-tie: plain decoding's own passes, replayed (the prompt in one pass, then
      one token a pass), put b[i] within NEAR_TIE of a[i];
    - numerics: not close in those passes, but one pass over the same tokens (a shape a
      speculative round's pass has) takes b[i]: the passes' shapes round otherwise, far
      apart only where the answer has lost its way (a run of <|im_start|> in a string);
    - a defect: neither explains it, or the replay does not take a[i] as plain did
      (unless it takes b[i] within NEAR_TIE: a server's plain run read its prompt after
      a cached part, in other passes than the replay's one, and a near-tie may round
      the other way)."""
    i = first_difference(a, b)
    if i is None or i >= min(len(a), len(b)):
        return f"the same tokens, stopped elsewhere ({len(a)} vs {len(b)})"
    name = TokenNames(model)

    def best(row: np.ndarray) -> int:
        return int(np.argmax(row)) if state is None else masked_argmax(state, row.copy())

    if state is not None:
        for token in a[:i]:
            state.accept(token)
        if not state.allows(b[i]):
            return f"another grammar: token {i}, {name(b[i])}, which the schema's refuses"
    model.reset()
    row = model.evaluate(prompt, 1)[0]
    for k in range(i):
        row = model.evaluate([*prompt, *a[: k + 1]], 1)[0]
    one, gap = best(row), float(row[a[i]] - row[b[i]])
    model.reset()
    if one != a[i]:
        took, picked = name(a[i]), name(one)
        if one == b[i] and -gap < NEAR_TIE:  # the replay read the prompt in other passes
            return (
                f"near-tie: token {i}, the replayed passes pick {picked} over {took} by "
                f"{-gap:.3f} (plain decoding read its prompt after a cached part)"
            )
        return f"DEFECT: token {i}: plain decoding took {took}, its passes replayed pick {picked}"
    if gap < NEAR_TIE:
        return f"near-tie: token {i}, {name(a[i])} against {name(b[i])}, logit gap {gap:.3f}"
    batched = best(model.evaluate([*prompt, *a[:i]], 1)[0])
    model.reset()
    if batched == b[i]:
        return (
            f"numerics: token {i}: plain decoding's passes pick {name(a[i])} ({name(b[i])} "
            f"{gap:.1f} behind), one pass over the same tokens picks {name(b[i])}"
        )
    verdict = f"token {i}, {name(a[i])} against {name(b[i])}, logit gap {gap:.3f}"
    if other_grammar and state is not None:
        return f"another grammar: {verdict}: its grammar refuses the target's choice, {name(a[i])}"
    return f"DEFECT: {verdict}"


def took(model: Model, token: int | None, argmax: int) -> bool:
    """Whether a pass whose argmax is `argmax` gives `token` (None: the answer ended)."""
    return model.is_eog(argmax) if token is None else argmax == token


def margin(row: np.ndarray, chosen: int, other: int) -> str:
    """How far `other`'s logit trails the chosen token's in this row."""
    return f"{float(row[chosen] - row[other]):.3g}"


def rescore(model: Model, trace: Trace, i: int) -> tuple[np.ndarray, Pass]:
    """The target's logits for answer[i] as `trace`'s run computed them: its passes
    replayed in order from a cleared cache, up to the one that scored i. A cache cut that
    the backend did not make is an AuditError (the replay would not be the run)."""
    if i > len(trace.answer) or (i == len(trace.answer) and trace.stop_reason != "eog"):
        raise AuditError(f"the run stopped at {i} ({trace.stop_reason}), the other went on")
    model.reset()
    for step in passes(trace):
        logits = model.evaluate(step.tokens, step.n_logits)
        if (held := model.kv_len()) != len(model.cached):
            raise AuditError(
                f"the target's cache holds {held} positions where {len(model.cached)} were "
                "kept: a cut failed, so the run decoded from a wrong cache"
            )
        if step.first <= i < step.first + step.emitted:
            return np.array(logits[i - step.first], dtype=np.float32), step
    raise AuditError(f"no pass of the run's record scored position {i}")


def passes(trace: Trace) -> Iterator[Pass]:
    """The target passes a run made: the prompt's, then one per round, as the engine
    scores a round: the last accepted token and the draft, in one batch."""
    prompt, context = trace.prompt, (*trace.prompt, *trace.answer)
    yield Pass(prompt, len(prompt), 1, 0, 1)
    for r in trace.rounds:
        batch = (*context[: len(prompt) + r.start], *r.drafted)
        yield Pass(batch, len(r.drafted) + 1, len(r.drafted) + 1, r.start, r.accepted + 1)


def rounds_of(
    prompt_len: int, ends: Sequence[RoundEnd], drafts: Mapping[int, tuple[int, ...]]
) -> tuple[Round, ...]:
    """A run's rounds from its RoundEnd events and the drafts a `DraftLog` noted."""
    rounds, start = [], 1
    for end in ends:
        drafted = drafts.get(prompt_len + start, ()) if end.drafted else ()
        if len(drafted) != end.drafted:
            raise AuditError(
                f"round at {start} drafted {end.drafted} tokens, the log has {len(drafted)}"
            )
        rounds.append(Round(start, drafted, end.accepted))
        start += end.accepted + 1
    return tuple(rounds)


class DraftLog:
    """A drafter that notes each draft it proposes, by the length of the context it
    drafted after (rounds that draft nothing may not call it); all else is the wrapped
    drafter's. The audit needs the rejected tokens too: they were in the target's batch."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.name = drafter.name
        self.drafts: dict[int, tuple[int, ...]] = {}

    @property
    def busy_s(self) -> float:
        return self.drafter.busy_s

    @property
    def n_ctx(self) -> int:
        return self.drafter.n_ctx

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
        proposed = self.drafter.draft(context, gamma, params, rng, forced=forced, grammar=grammar)
        self.drafts[len(context)] = tuple(proposed.tokens)
        return proposed

    def accept(self, tokens: Sequence[int], outcome: Outcome) -> None:
        self.drafter.accept(tokens, outcome)


class TokenNames:
    """A token as a reader wants it in a report: its text, quoted; a control token
    (no text) by its name, <|im_start|>; the end of the answer for none."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def __call__(self, token: int | None) -> str:
        if token is None:
            return "the end of the answer"
        text = self.model.token_bytes(token).decode("utf-8", "replace")
        return repr(text) if text else self.model.token_text(token) or f"<{token}>"
