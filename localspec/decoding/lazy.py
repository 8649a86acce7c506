"""A grammar that holds from a trigger on (llama.cpp's lazy grammar, which llama-server
puts on tool calls the model may or may not make): the answer is free until it writes
the trigger (`<tool_call>`, or a pattern: a ```json block whose object names a tool),
then the text from the trigger's first character on follows the grammar, so a call once
begun is one the tools take. The reasoning of a thinking model is not watched (a call it
muses about is not a call).

llama.cpp's own lazy sampler replays the trigger's text into the grammar and aborts the
process where that text does not fit it; here the state checks each replayed token
first, and where one does not fit, the answer goes on free, as without the grammar.
Whether a token is allowed is a function of the answer before it, so speculation keeps
it exactly, as any grammar (localspec.decoding.grammar).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from localspec.backends.base import Model
from localspec.decoding.grammar import Grammar, GrammarState, rendered
from localspec.thinking import BlockReader

Phase = Literal["before", "thinking", "watching", "held", "free"]
# a pattern of unknown length is searched for in the answer's last this many bytes
LONG_REACH = 1 << 16


def trigger_pattern(
    words: Sequence[bytes], patterns: Sequence[bytes], whole: Sequence[bytes]
) -> re.Pattern[bytes]:
    """llama.cpp's triggers as one pattern: words as written, patterns anywhere (the
    grammar reads from the first group that matched, else from the match: `find`), and
    patterns that the whole answer so far must match (re.error for a bad one)."""
    anchored = [rb"\A(?:" + p.removeprefix(b"^").removesuffix(b"$") + rb")\Z" for p in whole]
    parts = [*map(re.escape, words), *(b"(?:%s)" % p for p in patterns), *anchored]
    return re.compile(b"|".join(parts) or rb"(?!)")  # none: only tokens trigger it


@dataclass(frozen=True, eq=False)
class Triggered:
    """`inner` (whose text starts with `trigger`) from the first `trigger` on; before
    it, after the reasoning block between `reasoning` marks, if the model writes one. A
    trigger is a mark, or a pattern of the text that opens a call (a call in a wrapper,
    once it names a tool) whose matches are at most `reach` bytes long."""

    model: Model
    inner: Grammar
    trigger: bytes | re.Pattern[bytes]
    reasoning: tuple[bytes, bytes] | None = None  # (opening, end): the block not watched
    opened: bool = False  # the prompt opened the block
    reach: int = 0  # a pattern's longest match
    tokens: frozenset[int] = frozenset()  # tokens that trigger it too (llama.cpp's, by id)

    def find(self, text: bytes) -> int:
        """Where the first trigger in `text` begins (-1: none yet): a pattern's first
        group that matched something, else its match, as llama.cpp reads a trigger."""
        if isinstance(self.trigger, bytes):
            return text.find(self.trigger)
        if (m := self.trigger.search(text)) is None:
            return -1
        return next((m.start(i) for i in range(1, len(m.groups()) + 1) if m.group(i)), m.start())

    def kept(self) -> int:
        """How much of the answer's end may still begin a trigger."""
        return (len(self.trigger) if isinstance(self.trigger, bytes) else self.reach) - 1

    def start(self) -> TriggeredState:
        if self.reasoning is None:
            return TriggeredState(self, "watching")
        reader = BlockReader(self.reasoning, "thinking" if self.opened else "before")
        return TriggeredState(self, "thinking" if self.opened else "before", reader=reader)

    def within(self, other: Grammar) -> bool:
        return (
            isinstance(other, Triggered)
            and (self.trigger, self.reasoning, self.opened, self.tokens)
            == (other.trigger, other.reasoning, other.opened, other.tokens)
            and self.inner.within(other.inner)
        )


@dataclass
class TriggeredState:
    rule: Triggered
    phase: Phase
    text: bytes = b""  # the answer's last bytes, where a trigger or mark may be begun
    written: list[tuple[int, bytes]] = field(default_factory=list)  # its last tokens
    inner: GrammarState | None = None  # once triggered
    reader: BlockReader | None = None  # the reasoning's, while before or thinking

    def allows(self, token: int) -> bool:
        return self.inner.allows(token) if self.inner is not None else True

    def mask(self, logits: np.ndarray) -> np.ndarray:
        return self.inner.mask(logits) if self.inner is not None else logits.copy()

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        if self.inner is not None:
            return self.inner.allowed(tokens)
        return np.ones(len(tokens), dtype=bool)

    def accept(self, token: int) -> None:
        if self.inner is not None:
            self.inner.accept(token)
            return
        if self.phase == "free":
            return
        piece = rendered(self.rule.model, token)
        self.written.append((token, piece))
        if self.reader is None:
            self.text += piece
        elif not self._past_reasoning(piece):
            return
        if token in self.rule.tokens:  # held from the token's first byte
            self._hold_from(max(len(self.text) - len(piece), 0))
            return
        if (at := self.rule.find(self.text)) >= 0:
            self._hold_from(at)
            return
        # keep what may still begin the trigger, and the fewest tokens that wrote it
        tail = self.rule.kept()
        self.text = self.text[-tail:] if tail > 0 else b""
        kept = size = 0
        for _, written in reversed(self.written):
            kept, size = kept + 1, size + len(written)
            if size >= len(self.text):
                break
        del self.written[: len(self.written) - kept]

    def _past_reasoning(self, piece: bytes) -> bool:
        """Whether the answer is past its reasoning block (or opened without one) with
        `piece`: from there, `text` and `written` hold the answer after the block."""
        assert self.reader is not None
        rest = self.reader.read(piece)
        if rest is None:
            self.phase = "thinking" if self.reader.phase == "thinking" else "before"
            if self.phase == "thinking":
                self.written = []  # the thought's tokens
            return False
        if self.reader.phase == "after":  # (-1: a part of a token, read again)
            self.written = [(-1, rest)] if rest else []
        # (none: no reasoning, all of it is the answer, as written)
        self.phase, self.text, self.reader = "watching", rest, None
        return True

    def _hold_from(self, at: int) -> None:
        """The trigger was written, from byte `at` of `text`: the grammar reads the text
        from there (the tokens that hold it, the first one from the trigger's start);
        where that text does not fit it, the answer goes on free."""
        begin = len(self.text) - sum(len(p) for _, p in self.written)  # where `written` starts
        state = self.rule.inner.start()
        for token, piece in self.written:
            if begin + len(piece) > at:
                part = piece[max(0, at - begin) :]
                tokens = [token] if part == piece and token >= 0 else self._tokens(part)
                for t in tokens or [-1]:
                    if t < 0 or not state.allows(t):
                        self.phase, self.written, self.text = "free", [], b""
                        return
                    state.accept(t)
            begin += len(piece)
        self.phase, self.inner, self.written, self.text = "held", state, [], b""

    def _tokens(self, part: bytes) -> list[int]:
        try:
            return self.rule.model.tokenize(part.decode("utf-8"), special=False)
        except UnicodeDecodeError:
            return []

    def clone(self) -> TriggeredState:
        inner = self.inner.clone() if self.inner is not None else None
        reader = replace(self.reader) if self.reader is not None else None
        return TriggeredState(self.rule, self.phase, self.text, list(self.written), inner, reader)

    def forced_text(self, limit: int) -> bytes:
        return self.inner.forced_text(limit) if self.inner is not None else b""

    def forced_tokens(self, limit: int) -> list[int]:
        return self.inner.forced_tokens(limit) if self.inner is not None else []

    @property
    def free(self) -> bool:
        return self.phase == "free" or (self.inner is not None and self.inner.free)
