"""Constrained decoding: what the answer may be (a JSON schema, a GBNF grammar), as a
state that follows the answer token by token.

Speculation stays exact under a grammar: row i of a verify pass is masked by the state
after the tokens before it (the accepted text, then draft[:i]), so greedy output is
constrained plain decoding's, and the rejection test compares the draft's q with the
masked target p (a drafted token the grammar refuses has p = 0: always rejected, and the
residual holds allowed tokens only). Rows are masked lazily: verification stops at the
first rejection, and past a refused token there is no state to mask with.

Where the grammar leaves a single way on for several characters (a key, a colon, the
quote that opens a string), those characters are a free draft ("jump-forward"):
`forced_text` finds them, split into tokens as the answer split that text before (or
by the target's tokenizer: a constrained target often splits a key its own way), and
the target verifies them with the rest of the round.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np

from localspec.backends.base import Model
from localspec.decoding.sampling import (
    Probs,
    SamplingParams,
    law_over,
    logits_to_probs,
    penalize,
)


class GrammarState(Protocol):
    def allows(self, token: int) -> bool:
        """Whether `token` may come next (an end-of-generation token: where the grammar
        is complete)."""
        ...

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """`logits` with every token the grammar refuses next at -inf (a copy)."""
        ...

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        """Whether each of `tokens` may come next (booleans)."""
        ...

    def accept(self, token: int) -> None:
        """Advance past `token`, which must be allowed."""
        ...

    def clone(self) -> GrammarState: ...

    def forced_text(self, limit: int) -> bytes:
        """The characters (at most `limit`) that are the only way on from here."""
        ...

    def forced_tokens(self, limit: int) -> list[int]:
        """The tokens (at most `limit`) that are the only way on from here, where a rule
        over tokens forces them (a reasoning budget's close: localspec.decoding.budget);
        [] where only text is forced (`forced_text`), or nothing."""
        ...

    @property
    def free(self) -> bool:
        """Whether every token may come next from here on (a middle's opening written):
        the answer goes on without the grammar, whose masks would only cost time."""
        ...


class Grammar(Protocol):
    """A compiled grammar for one vocabulary; each answer follows a state of its own."""

    def start(self) -> GrammarState: ...

    def within(self, other: Grammar) -> bool:
        """Whether this grammar allows, at each position of an answer, at most what
        `other` allowed there (then a greedy choice made under `other` that this one
        allows is this one's too: see Engine.recall)."""
        ...


_RENDERED: weakref.WeakKeyDictionary[Model, dict[int, bytes]] = weakref.WeakKeyDictionary()


def rendered(model: Model, token: int) -> bytes:
    """What `token` renders to, a control token's text too (the marks a rule over tokens
    watches for may be control tokens), each looked up once per model."""
    pieces = _RENDERED.setdefault(model, {})
    if (found := pieces.get(token)) is None:
        found = pieces[token] = model.token_bytes(token, special=True)
    return found


def states_along(state: GrammarState, tokens: Sequence[int]) -> Iterator[GrammarState]:
    """The state before tokens[0], before tokens[1], ... and after the last, each made
    only when asked for (a clone: `state` itself does not move). Stops at a token the
    grammar refuses, whose successors have no state."""
    here = state.clone()
    yield here
    for token in tokens:
        if not here.allows(token):
            return
        here = here.clone()
        here.accept(token)
        yield here


def last_state(state: GrammarState, tokens: Sequence[int]) -> GrammarState | None:
    """The state after `tokens` (a clone), None where the grammar refuses one of them."""
    states = list(states_along(state, tokens))
    return states[-1] if len(states) == len(tokens) + 1 else None


def allowed_prefix(state: GrammarState | None, tokens: Sequence[int]) -> list[int]:
    """`tokens` up to the first one the grammar refuses from `state` (which stays; all of
    them without a grammar, or once it is free): a draft past a refused token would be
    rejected there whatever it holds, and a choice it refuses is not this answer's."""
    tokens = list(tokens)
    if state is None:
        return tokens
    here = state.clone()
    for i, token in enumerate(tokens):
        if here.free:
            break
        if not here.allows(token):
            return tokens[:i]
        if i + 1 < len(tokens):  # (an end token comes last: nothing follows it)
            here.accept(token)
    return tokens


def jump_forward(
    model: Model, state: GrammarState | None, budget: int, text: Sequence[int]
) -> list[int]:
    """Jump-forward: the tokens of what the grammar alone allows next (at most
    `budget`), as `text` (the answer so far, under the grammar) wrote that text before
    (`as_written`), else as `model`'s tokenizer writes it; or the tokens a rule over
    tokens forces, as they are."""
    if state is None or budget < 1:
        return []
    if tokens := state.forced_tokens(budget):
        return tokens
    forced = state.forced_text(4 * budget)
    if not forced:
        return []
    run, spelled = as_written(model, text, forced)
    rest = forced[len(spelled) :].decode("utf-8", "replace")
    tokens = run + (model.tokenize(rest, special=False) if rest else [])
    # the last token may merge with the free text after it (` "` + `John` is ` "John`
    # to the tokenizer), which the target would then write instead: leave it out
    return tokens[: min(budget, len(tokens) - 1)]


WRITTEN_WINDOW = 512  # tokens of the text `as_written` looks back over


def as_written(model: Model, text: Sequence[int], forced: bytes) -> tuple[list[int], bytes]:
    """The longest earlier run of `text`'s tokens that spells the start of `forced`, and
    what it spells: under a grammar the target splits text as it pleases (`f` `i` `le`
    for a key its tokenizer writes `file`, where an unconstrained favourite such as
    `filename` is refused), and it splits the same key the same way each time."""
    best: list[int] = []
    spelled = b""
    recent = text[-WRITTEN_WINDOW:]
    for i in range(len(recent)):
        run, here = [], b""
        for token in recent[i:]:
            piece = model.token_bytes(token)
            if not piece or not forced.startswith(here + piece):
                break
            run.append(token)
            here += piece
        if len(here) >= len(spelled):  # the latest of the longest
            best, spelled = run, here
    return best, spelled


SHORTLIST = 64  # a row's best tokens checked before its whole vocabulary
# and then its best 1024: of the whole-row masks (~20 ms each) in the json suite's
# constrained answers, 7 in 8 found the best allowed token within them (rank 89-764)
WIDE_SHORTLIST = 1024


def allowed_best(state: GrammarState, row: np.ndarray, size: int = SHORTLIST) -> np.ndarray:
    """The ids among the row's `size` best that the grammar allows, in id order (all of a
    row no longer than that); tokens that tie the last of them are among them too, so
    the best allowed of these is the best allowed of all wherever there is one."""
    if len(row) <= size:
        return np.flatnonzero(state.allowed(np.arange(len(row))))
    ids = np.flatnonzero(row >= np.partition(row, -size)[-size])
    return ids[state.allowed(ids)]


def shortlisted(state: GrammarState, row: np.ndarray) -> np.ndarray | None:
    """A draft model's row under the grammar: its SHORTLIST best tokens that the grammar
    allows, the rest at -inf (None where none of them is: the draft stops there). The
    whole vocabulary's mask would cost a draft step's worth of time per token; a draft
    only has to report the law it drew from, and this is that law."""
    ok = allowed_best(state, row)
    if not len(ok):
        return None
    out = np.full_like(row, -np.inf)
    out[ok] = row[ok]
    return out


def masked_argmax(state: GrammarState, row: np.ndarray) -> int:
    """The best token the grammar allows: the row's own argmax where it is allowed (one
    token checked), else the best allowed among its SHORTLIST best, then among its
    WIDE_SHORTLIST best (if any is allowed, the best allowed of all is among them), else
    the argmax of the masked row (the whole vocabulary checked: ~20 ms under llama.cpp's
    grammar for a 152k vocabulary, where a shortlist takes ~1). Ties go to the lower
    id, as np.argmax's do."""
    best = int(np.argmax(row))
    if state.allows(best):
        return best
    for size in (SHORTLIST, WIDE_SHORTLIST):
        if len(ok := allowed_best(state, row, size)):
            return int(ok[np.argmax(row[ok])])
    return int(np.argmax(state.mask(row)))


def masked_probs(
    state: GrammarState, row: np.ndarray, params: SamplingParams, history: Sequence[int]
) -> Probs:
    """The constrained target's law, logits_to_probs(state.mask(row), ...), computed
    from the row's best tokens where that gives the same law (see `shortlist_holds`),
    else from the whole masked row (~20 ms a row under llama.cpp's grammar: a sampled
    round of five rows would spend more on masks than on its pass)."""
    x = penalize(row, params, history)  # elementwise, so it commutes with the mask
    size = max(SHORTLIST, 2 * params.top_k)
    if len(x) > size:
        best = np.argpartition(x, -size)[-size:]
        ok = best[state.allowed(best)]
        if len(ok) and shortlist_holds(x[ok], float(x[best].min()), len(x) - size, params):
            return law_over(ok, x[ok], params, len(x))
    return logits_to_probs(state.mask(x), params, ())  # no history: penalized above


def shortlist_holds(kept: np.ndarray, ceiling: float, n_out: int, params: SamplingParams) -> bool:
    """Whether the allowed tokens among a row's best (logits `kept`) decide the masked
    law alone, whatever the allowed tokens outside (at most `n_out`, each with a logit
    of at most `ceiling`) may be: top-k keeps none of those, or min-p would drop each of
    them and top-p cuts the kept ones at the same place with or without their mass."""
    k = params.top_k
    if k and len(kept) >= k:
        return True  # the k best allowed of all are all in the shortlist
    if params.min_p <= 0:
        return False
    w = np.sort(np.exp((kept.astype(np.float64) - kept.max()) / params.temperature))[::-1]
    outside = np.exp((ceiling - kept.max()) / params.temperature)  # relative to the best
    if outside >= params.min_p:
        return False
    if params.top_p >= 1.0:
        return True
    most = w.sum() + (min(n_out, k - len(kept)) if k else n_out) * outside
    cum = np.cumsum(w)
    # the cut with none of their mass, and with all of it (past the shortlist: all kept)
    return int(np.searchsorted(cum, params.top_p * w.sum())) == min(
        int(np.searchsorted(cum, params.top_p * most)), len(w) - 1
    )
