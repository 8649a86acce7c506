"""A thinking model's reasoning budget (llama-server's `reasoning_budget_tokens` and
`--reasoning-budget`, Anthropic's `thinking.budget_tokens`): once the reasoning block
has run `budget` tokens, its end mark (after a message, where one is given) is forced,
and the answer follows. As llama.cpp's budget sampler does it: the tokens after the
block's opening count (from the first where the prompt opened it), a token that leaves
a character unfinished runs on to the next, and a block the model ends itself is done.

It is a grammar over tokens (`ThoughtBudget`, wrapping the request's own grammar, if
any), so speculation keeps it exactly as it keeps a grammar: each verified row is masked
by the state after the tokens before it, and the forced close is a free draft
(`forced_tokens`) that the target verifies with the rest of its round. Only a block at
the start of the answer is counted, as only that one is reasoning to the split
(localspec.thinking); once it is closed, or the answer opened without it, the budget has
nothing more to say (`free`), and the engine decodes on without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from localspec.backends.base import Model
from localspec.decoding.grammar import Grammar, GrammarState, last_state, rendered
from localspec.thinking import BlockReader

Phase = Literal["before", "thinking", "closing", "done"]


@dataclass(frozen=True, eq=False)
class ThoughtBudget:
    """At most `budget` tokens of reasoning between `marks`, then `close` forced."""

    model: Model
    marks: tuple[bytes, bytes]  # the block's opening and end, as the tokens render them
    budget: int
    close: tuple[int, ...]  # the message, if any, then the end mark
    opened: bool = False  # the prompt opened the block: the answer starts inside it
    inner: Grammar | None = None  # the request's own grammar, which holds as well
    message: str = ""
    _rests: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(
        cls,
        model: Model,
        marks: tuple[str, str],
        budget: int,
        message: str = "",
        opened: bool = False,
        inner: Grammar | None = None,
    ) -> ThoughtBudget:
        start, end = (m.encode() for m in marks)
        close = tokens_of(model, message + marks[1])
        return cls(model, (start, end), budget, close, opened, inner, message)

    def closing(self, written: bytes) -> tuple[int, ...]:
        """The tokens that close the block after `written`: the close, or where the
        thought ends in the start of the end mark (a mark that is text, not one token)
        and no message comes first, the rest of the mark."""
        end = self.marks[1]
        begun = max((k for k in range(1, len(end)) if written.endswith(end[:k])), default=0)
        if not begun or self.message:
            return self.close
        if (rest := self._rests.get(begun)) is None:
            rest = self._rests[begun] = tokens_of(self.model, end[begun:].decode())
        return rest

    def start(self) -> BudgetState:
        inner = self.inner.start() if self.inner is not None else None
        reader = BlockReader(self.marks, "thinking" if self.opened else "before")
        state = BudgetState(self, inner, "before", self.budget, reader)
        if self.opened:
            state.open()
        return state

    def within(self, other: Grammar) -> bool:
        if not isinstance(other, ThoughtBudget):
            return False
        same = (self.marks, self.budget, self.close, self.opened) == (
            other.marks,
            other.budget,
            other.close,
            other.opened,
        )
        if self.inner is None or other.inner is None:
            return same and self.inner is other.inner
        return same and self.inner.within(other.inner)


@dataclass
class BudgetState:
    rule: ThoughtBudget
    inner: GrammarState | None
    phase: Phase
    left: int  # reasoning tokens still allowed
    reader: BlockReader  # the answer's reading, while before or thinking
    close: tuple[int, ...] = ()  # while closing: what is forced,
    at: int = 0  # and the next of its tokens

    def open(self) -> None:
        """The block is open: count from here (a budget of 0 closes it at once)."""
        self.phase, self.left = "thinking", self.rule.budget
        if self.left <= 0:
            self._close()

    def _close(self) -> None:
        close = self.rule.closing(self.reader.text)
        if self.inner is not None and last_state(self.inner, close) is None:
            self.phase = "done"  # the request's grammar refuses the close: it rules
            return
        self.phase, self.close, self.at = "closing", close, 0

    def _next(self) -> int | None:
        return self.close[self.at] if self.phase == "closing" else None

    def allows(self, token: int) -> bool:
        if (forced := self._next()) is not None:
            return token == forced
        return self.inner is None or self.inner.allows(token)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        if (forced := self._next()) is not None:
            out = np.full_like(logits, -np.inf)
            out[forced] = logits[forced]
            return out
        return logits.copy() if self.inner is None else self.inner.mask(logits)

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        if (forced := self._next()) is not None:
            return np.asarray(tokens) == forced
        if self.inner is None:
            return np.ones(len(tokens), dtype=bool)
        return self.inner.allowed(tokens)

    def accept(self, token: int) -> None:
        if self.inner is not None:
            self.inner.accept(token)
            if self.inner.free:
                self.inner = None
        if self.phase == "closing":
            self.at += 1
            if self.at == len(self.close):
                self.phase = "done"
        elif self.phase in ("before", "thinking"):
            if self.reader.read(rendered(self.rule.model, token)) is not None:
                self.phase = "done"  # the model closed the block, or answered without one
            elif self.phase == "before":
                if self.reader.phase == "thinking":
                    self.open()
            else:
                self.left -= 1
                if self.left <= 0 and whole_characters(self.reader.text):
                    self._close()

    def clone(self) -> BudgetState:
        inner = self.inner.clone() if self.inner is not None else None
        return BudgetState(
            self.rule, inner, self.phase, self.left, replace(self.reader), self.close, self.at
        )

    def forced_text(self, limit: int) -> bytes:
        if self.phase == "closing" or self.inner is None:
            return b""
        return self.inner.forced_text(limit)

    def forced_tokens(self, limit: int) -> list[int]:
        if self.phase != "closing":
            return [] if self.inner is None else self.inner.forced_tokens(limit)
        return list(self.close[self.at : self.at + limit])

    @property
    def free(self) -> bool:
        return self.phase == "done" and (self.inner is None or self.inner.free)


def tokens_of(model: Model, text: str) -> tuple[int, ...]:
    """`text`'s tokens, its marks as the model's control tokens where it has them."""
    bos, _ = model.special_ids
    return tuple(t for t in model.tokenize(text, special=True) if t != bos)


def whole_characters(data: bytes) -> bool:
    """Whether `data` ends at the end of a UTF-8 character (not inside one)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return back == 1
        if byte >= 0xC0:  # a lead byte: how long its character is
            return back == (2 if byte < 0xE0 else 3 if byte < 0xF0 else 4)
    return len(data) == 0
