"""A streamed chat answer as the blocks Anthropic's and the Responses API's streams are
made of: its reasoning, its text and each tool call, opened, filled and closed one after
another. Both APIs render the same three steps in their own events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["thinking", "text", "call"]


@dataclass(frozen=True)
class Open:
    kind: Kind
    call_id: str = ""  # a call's id and function name
    name: str = ""


@dataclass(frozen=True)
class Fill:
    kind: Kind
    text: str  # reasoning, text, or a piece of a call's arguments (JSON)


@dataclass(frozen=True)
class Close:
    kind: Kind
    text: str  # the whole block's


Step = Open | Fill | Close


class Blocks:
    """Feed each chat chunk's delta (reasoning_content, content, tool_calls); get back
    the steps it makes. A block closes when one of another kind (or another call) opens,
    and at `close()`."""

    def __init__(self) -> None:
        self.open: Kind | None = None
        self.text = ""  # the open block's so far
        self.calls = 0  # tool calls opened
        self.last: dict[str, Any] = {}  # the last chunk fed by `steps` (usage, figures)

    async def steps(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[Step]:
        """Each chunk's steps, in turn (`close()` ends the last block)."""
        async for chunk in chunks:
            self.last = chunk
            for choice in chunk["choices"]:
                for step in self.feed(choice["delta"]):
                    yield step

    def feed(self, delta: dict[str, Any]) -> list[Step]:
        steps: list[Step] = []
        if text := delta.get("reasoning_content"):
            steps += self.fill("thinking", text)
        if text := delta.get("content"):
            steps += self.fill("text", text)
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            if call.get("id"):  # a new call: its id and name come first
                steps += self.start(Open("call", call["id"], function["name"]))
                self.calls += 1
            if function.get("arguments"):
                steps += self.fill("call", function["arguments"])
        return steps

    def fill(self, kind: Kind, text: str) -> list[Step]:
        steps = [] if self.open == kind else self.start(Open(kind))
        self.text += text
        return [*steps, Fill(kind, text)]

    def start(self, opening: Open) -> list[Step]:
        steps = self.close()
        self.open, self.text = opening.kind, ""
        return [*steps, opening]

    def close(self) -> list[Step]:
        if self.open is None:
            return []
        step = Close(self.open, self.text)
        self.open, self.text = None, ""
        return [step]
