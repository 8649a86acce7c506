"""Prompts the slots gave up, kept in RAM (llama-server's `--cache-ram`): before a slot
reads a prompt that shares little with its cache, the cache's state (llama.cpp's
sequence state, of the target and the draft model) is saved here, and a later request
that continues it (a chat's next turn, after an agent's took the slot) gets it back in a
copy instead of reading its prompt again. What to save and load is `plan_swap`'s
decision (scheduling.py); this holds the states, the least recently used going first
when the budget is full.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from localspec.backends.base import SeqState


@dataclass(frozen=True, eq=False)
class Saved:
    """One slot's cache: the target's tokens, and each model's (tokens, state)."""

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
