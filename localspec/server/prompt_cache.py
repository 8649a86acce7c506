"""Prompts the slots gave up, kept in RAM (llama-server's `--cache-ram`): before a slot
reads a prompt that shares little with its cache, the cache's state (llama.cpp's
sequence state, of the target and the draft model or MTP head) is saved here, and a later request
that continues it (a chat's next turn, after an agent's took the slot) gets it back in a
copy instead of reading its prompt again. What to save and load is `plan_swap`'s
decision (scheduling.py); this holds the states, the least recently used going first
when the budget is full.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from localspec.backends.base import SeqState
from localspec.backends.mtp import MtpHead


class Holder(Protocol):
    """What holds a part of a slot's cache: its models, and an MTP head's sequence."""

    @property
    def cached(self) -> Sequence[int]: ...

    def save_state(self) -> bytearray | None: ...

    def load_state(self, tokens: Sequence[int], state: bytearray) -> bool: ...

    def reset(self) -> None: ...


class HeadCache:
    """A target's own MTP head's cache of sequence `seq`, a Holder: unlike the target's
    (which Gemma 4's assistant reads), it is the head's own, and it drafts from the
    trunk's rows it kept of that sequence's text; both go to RAM and come back with the
    target's."""

    def __init__(self, head: MtpHead, seq: int) -> None:
        self.head, self.seq = head, seq

    @property
    def cached(self) -> Sequence[int]:
        cache = self.head.caches.get(self.seq)
        return () if cache is None else cache.tokens

    def save_state(self) -> bytearray | None:
        with self.head.lock:
            return self.head.save_seq(self.seq)

    def load_state(self, tokens: Sequence[int], state: bytearray) -> bool:
        with self.head.lock:
            return self.head.load_seq(self.seq, state)

    def reset(self) -> None:
        with self.head.lock:
            self.head.drop(self.seq)


@dataclass(frozen=True, eq=False)
class Saved:
    """One slot's cache: the target's tokens, and each holder's (tokens, state)."""

    tokens: tuple[int, ...]
    states: tuple[tuple[tuple[int, ...], bytearray], ...]

    @property
    def size(self) -> int:
        return sum(s.size if isinstance(s, SeqState) else len(s) for _tokens, s in self.states)


class PromptCache:
    def __init__(self, budget: int) -> None:
        self.budget = budget  # bytes
        self._entries: list[Saved] = []  # the least recently used first
        self._lock = threading.Lock()  # the slots' threads share it

    def entries(self) -> list[Saved]:
        with self._lock:
            return list(self._entries)

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries())

    def put(self, saved: Saved) -> None:
        """Keep `saved` in place of any entry it extends; the least recently used go
        where the budget is exceeded (`saved` itself, if larger than all of it)."""
        if saved.size > self.budget:
            return
        with self._lock:
            self._entries = [e for e in self._entries if saved.tokens[: len(e.tokens)] != e.tokens]
            self._entries.append(saved)
            while sum(e.size for e in self._entries) > self.budget:
                self._entries.pop(0)

    def use(self, saved: Saved) -> Saved:
        """`saved`, now the most recently used (it stays: another conversation may
        begin as it does, as two agents share a system prompt)."""
        with self._lock:
            if saved in self._entries:
                self._entries.remove(saved)
                self._entries.append(saved)
        return saved
