"""Drafts from everything already said: a suffix index over the conversation
(SuffixDecoding, Oliaro et al. 2024; vLLM's `suffix_decoding`).

Two corpora are indexed by where each k-gram (k in LEVELS) ends: the *context* (the chat
as its template renders it: every earlier prompt and answer, the new prompt, the answer
so far) and the *history* (what earlier contexts held that the current one does not:
another conversation, a chat whose earlier turns were edited). Each round the context's
last tokens are matched against both: the occurrences of its last 8 tokens (else 4,
else 2) are extended backwards, up to MAX_RUN tokens, and the longest run wins. Among
the occurrences with that run the continuation is read as a suffix tree reads it: at
each step the token most of them go on with (a tie: the latest), its share the
confidence; the draft stops where the product of shares falls below MIN_PROB (a run
that reaches the context's own end goes on with its period, as a copy would). The run
says how sure the match is: `auto` keeps α per run length (SUFFIX_PRIOR) and drafts deep
along a long run.

The context is searched first; the history counts only where it holds a longer run. An
earlier turn is in the context and may be in the history as well, and counting it twice
would outvote the latest edit of the same text.

Nothing is saved: a reopened chat's prompt is its saved messages, re-rendered and
re-tokenized, so the first round rebuilds the index from it. As a drafter it only
proposes; the target verifies every token.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from localspec.backends.base import Tokens, shared_prefix

LEVELS = (8, 4, 2)  # k-gram lengths indexed, longest first
MAX_RUN = 64  # the longest run compared; longer adds no certainty
MAX_CANDIDATES = 64  # the latest occurrences of a k-gram that are extended
MIN_PROB = 0.3  # a draft stops where the product of its tokens' shares falls below this
HISTORY_TOKENS = 1 << 15  # the history keeps its latest documents up to this many tokens
RETIRE_MIN = 16  # a context's cut tail shorter than this is not kept as history
SEP = -1  # between documents: matches no token
# α before any measurement, by run length (at least this long)
SUFFIX_PRIOR = {2: 0.35, 4: 0.55, 8: 0.75, 16: 0.85}
DEEP_RUN = 16  # a run at least this long is drafted as deep as a prediction


@dataclass(frozen=True)
class SuffixMatch:
    """The longest run of the context's tail found earlier, and what followed it."""

    run: int = 0  # 0: no match
    tokens: list[int] = field(default_factory=list)
    shares: list[float] = field(default_factory=list)  # per token: of the runs, how many went on so


def suffix_key(run: int) -> str:
    """The acceptance key of a suffix match with this run length."""
    at_least = max((n for n in SUFFIX_PRIOR if n <= run), default=min(SUFFIX_PRIOR))
    return f"suffix{at_least}"


class Corpus:
    """Token sequences end to end (SEP between documents), with where each k-gram ends."""

    def __init__(self) -> None:
        self.tokens = Tokens()
        self._array = np.empty(1024, dtype=np.int64)  # tokens, for vectorized compares
        self._ends: dict[tuple[int, ...], list[int]] = {}  # k-gram -> its end positions

    @property
    def n(self) -> int:
        return len(self.tokens)

    def extend(self, new: Sequence[int]) -> None:
        start = self.n
        self.tokens.extend(new)
        if self.n > len(self._array):
            grown = np.empty(max(self.n, 2 * len(self._array)), dtype=np.int64)
            grown[:start] = self._array[:start]
            self._array = grown
        self._array[start : self.n] = new
        for i in range(start, self.n):
            for k in LEVELS:
                key = tuple(self.tokens[i - k + 1 : i + 1]) if i >= k - 1 else ()
                if key and SEP not in key:
                    self._ends.setdefault(key, []).append(i)

    def truncate(self, n: int) -> list[int]:
        """Drop everything from position n on; returns what was dropped."""
        for i in range(self.n - 1, n - 1, -1):
            for k in LEVELS:
                ends = self._ends.get(tuple(self.tokens[i - k + 1 : i + 1])) if i >= k - 1 else None
                if ends and ends[-1] == i:  # appended in order: the last ones go first
                    ends.pop()
        dropped = self.tokens[n:]
        del self.tokens[n:]
        return dropped

    def runs(self, tail: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(run lengths, end positions) of the latest occurrences of `tail`'s last k
        tokens for the longest k that occurs with a token after it; each run is how many
        of `tail`'s last tokens (up to MAX_RUN) match backwards from that end."""
        for k in LEVELS:
            if len(tail) < k:
                continue
            found = self._ends.get(tuple(tail[-k:]))
            if not found:
                continue
            ends = np.asarray(found[-MAX_CANDIDATES - 1 :], dtype=np.int64)
            ends = ends[ends + 1 < self.n]  # the tail's own end has nothing after it
            ends = ends[self._array[ends + 1] != SEP][-MAX_CANDIDATES:]
            if ends.size:
                return self._extend_back(ends, tail), ends
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)

    def _extend_back(self, ends: np.ndarray, tail: Sequence[int]) -> np.ndarray:
        back = np.asarray(tail[-MAX_RUN:], dtype=np.int64)[::-1]  # back[j] = tail[-1 - j]
        at = ends[:, None] - np.arange(len(back))[None, :]
        same = (at >= 0) & (self._array[np.maximum(at, 0)] == back[None, :])
        return np.where(same.all(axis=1), len(back), same.argmin(axis=1))

    def following(self, ends: np.ndarray, gamma: int, periodic: bool = False) -> np.ndarray:
        """The up to `gamma` tokens after each end, one row each, SEP where none.
        `periodic`: this corpus ends where the text goes on, so a run that overlaps its
        own continuation repeats with period n - 1 - end past it (as drafters.copy_on)."""
        j = np.arange(gamma)[None, :]
        if periodic:  # before the end, j is under the period: the same positions
            j = j % (self.n - 1 - ends)[:, None]
        at = ends[:, None] + 1 + j
        rows = np.where(at < self.n, self._array[np.minimum(at, self.n - 1)], SEP)
        # a document ends at its first SEP
        return np.where(np.cumprod(rows != SEP, axis=1).astype(bool), rows, SEP)


class SuffixIndex:
    """The context and the history, matched as the module docstring says."""

    def __init__(self, history_tokens: int = HISTORY_TOKENS) -> None:
        self.history_tokens = history_tokens
        self.context = Corpus()
        self.history = Corpus()
        self._docs: deque[tuple[int, ...]] = deque()  # the history, oldest first

    def match(self, context: Sequence[int], gamma: int) -> SuffixMatch:
        """The longest earlier run of `context`'s tail and up to `gamma` tokens that
        followed it, as far as the continuation stays sure (MIN_PROB)."""
        self.sync(context)
        best_run, rows = 0, None
        for corpus in (self.context, self.history):  # the history only where it is longer
            runs, ends = corpus.runs(context)
            if runs.size and (run := int(runs.max())) > best_run:
                periodic = corpus is self.context  # its end is the context's end
                best_run, rows = run, corpus.following(ends[runs == run], gamma, periodic)
        if rows is None or gamma < 1:
            return SuffixMatch()
        return SuffixMatch(best_run, *continuation(rows))

    def sync(self, context: Sequence[int]) -> None:
        """Index `context`: what it adds to the last one; where it departs from it (a
        new request), the last one's departed tail goes to the history."""
        done = self.context.n
        cut = shared_prefix(self.context.tokens, context)
        if cut == done:
            self.context.extend(context[done:])
            return
        departed = self.context.truncate(cut)
        if len(departed) >= RETIRE_MIN:
            self.remember(departed)
        self.context.extend(context[cut:])

    def remember(self, tokens: Sequence[int]) -> None:
        """Keep `tokens` as history (the latest HISTORY_TOKENS tokens' worth of documents)."""
        doc = tuple(tokens)
        if not doc or doc in self._docs:
            return
        self._docs.append(doc)
        if self.history.n + len(doc) + 1 <= self.history_tokens:
            self.history.extend([SEP, *doc])
            return
        while len(self._docs) > 1 and sum(len(d) + 1 for d in self._docs) > self.history_tokens:
            self._docs.popleft()
        self.history = Corpus()  # rare: rebuilt without the oldest documents
        for d in self._docs:
            self.history.extend([SEP, *d[-self.history_tokens :]])


def continuation(rows: np.ndarray) -> tuple[list[int], list[float]]:
    """Walk the runs' continuations (rows, latest last) as a suffix tree: at each step the
    token most of the remaining rows go on with, the latest on a tie, and its share.
    Plain Python (a few rows of a few tokens, every round); but where many rows are
    alike (a repeat: up to MAX_CANDIDATES runs of one text), the leading columns where
    every row goes on alike are taken at once."""
    start = 0
    if len(rows) > 4:  # below that, numpy's cost per call is more than the walk's
        start = int(np.cumprod((rows == rows[-1]).all(axis=0) & (rows[-1] != SEP)).sum())
    tokens: list[int] = rows[-1, :start].tolist()
    shares: list[float] = [1.0] * start
    alive: list[list[int]] = rows.tolist()
    prob = 1.0
    for i in range(start, rows.shape[1]):
        if len(alive) == 1:  # one run left: the rest of its row, sure as far as it goes
            rest = alive[0][i:]
            rest = rest[: rest.index(SEP)] if SEP in rest else rest
            tokens += rest
            shares += [1.0] * len(rest)
            break
        column = [row[i] for row in alive]
        counts = Counter(column)
        counts.pop(SEP, None)
        if not counts:
            break
        latest = {x: j for j, x in enumerate(column)}  # each token's latest row
        best = max(counts, key=lambda x: (counts[x], latest[x]))
        share = float(counts[best]) / len(alive)
        prob *= share
        if prob < MIN_PROB:
            break
        tokens.append(best)
        shares.append(share)
        alive = [row for row, x in zip(alive, column, strict=True) if x == best]
    return tokens, shares
