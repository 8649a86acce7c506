"""Thinking models (Qwen3 and the like write `<think>…</think>` before their answer): the
block goes to `reasoning_content`, as llama-server and vLLM send it, the rest to
`content`. Where the chat template opens the block itself (the prompt ends in
`<think>`), the answer starts inside it and only closes it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from localspec.server.chat import held_prefix

OPEN, CLOSE = "<think>", "</think>"
State = Literal["start", "think", "content"]


def opens_thinking(template: str | None, prompt_text: str) -> tuple[bool, bool]:
    """(whether the model thinks: its template knows `<think>`, whether the prompt has
    already opened the block)."""
    thinks = template is not None and OPEN in template
    return thinks, thinks and prompt_text.rstrip().endswith(OPEN)


@dataclass
class ThinkSplit:
    """Feed the answer's text as it streams; get (reasoning, content) back, holding what
    may be the start of a mark."""

    state: State = "start"
    _held: str = ""
    _content_began: bool = False

    @classmethod
    def opened(cls, inside: bool) -> ThinkSplit:
        return cls("think" if inside else "start")

    def push(self, text: str) -> tuple[str, str]:
        self._held += text
        reasoning = ""
        if self.state == "start":
            stripped = self._held.lstrip()
            if stripped.startswith(OPEN):
                self.state, self._held = "think", stripped[len(OPEN) :]
            elif OPEN.startswith(stripped):
                return "", ""  # maybe the block's opening, still coming
            else:
                self.state = "content"
        if self.state == "think":
            end = self._held.find(CLOSE)
            if end < 0:
                keep = held_prefix(self._held, CLOSE)
                reasoning, self._held = (
                    self._held[: len(self._held) - keep],
                    self._held[len(self._held) - keep :],
                )
                return reasoning, ""
            reasoning, self._held = self._held[:end], self._held[end + len(CLOSE) :]
            self.state = "content"
        return reasoning, self._content()

    def flush(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        if self.state == "think":
            return held, ""
        return "", held if self._content_began or self.state == "content" else held.lstrip()

    def _content(self) -> str:
        if not self._content_began:  # the blank lines after the block are not content
            self._held = self._held.lstrip()
            self._content_began = bool(self._held)
        out, self._held = self._held, ""
        return out
