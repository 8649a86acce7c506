"""Which part of a long conversation the chat's next prompt holds.

A chat outgrows its context after enough turns. As llama.cpp's context shift does, the
oldest turns are let go at once, down to half the context, so that the turns after that
start at the same message and find their prompt in the cache again (dropping one turn
at a time would change the prompt's start, and re-read it whole, every turn). The system
prompt always stays; the conversation itself stays whole (its file, the screen).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def window_start(
    starts: Sequence[int], length: Callable[[int], int], kept: int, n_ctx: int, room: int
) -> int:
    """The first message the next prompt holds. `starts`: where a window may begin (each
    user message, ascending); `length(i)`: the prompt's tokens from message i on (after
    the system prompt); `kept`: where the last turn's window began; `room`: the tokens
    the answer wants. `kept` while its prompt leaves that room; else the first start from
    which the prompt fits in half the context, or the last start (the latest message
    alone: where that does not fit either, the engine says so)."""
    if length(kept) + room <= n_ctx:
        return kept
    later = [i for i in starts if i > kept]
    if not later:
        return kept
    at = bisect.bisect_left(later, True, key=lambda i: length(i) <= n_ctx // 2)
    return later[min(at, len(later) - 1)]


def kept_first(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many messages open every window: 1 where the conversation opens with a
    system prompt, else 0."""
    return 1 if messages and messages[0]["role"] == "system" else 0


def answer_room(max_tokens: int, n_ctx: int) -> int:
    """The room kept for an answer: its token limit, at most a quarter of the context
    (a limit near the context's size would leave no conversation to read)."""
    return min(max_tokens, n_ctx // 4)
