"""The input box: Enter sends, Shift+Enter or Ctrl+J starts a new line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual import events
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    """A multi-line input that sends on Enter."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # not in the footer (it would push the chat's own keys out of 80 columns): the
        # box's placeholder says it
        Binding("shift+enter,ctrl+j", "newline", "New line", show=False),
    ]

    @dataclass
    class Submitted(Message):
        prompt_input: PromptInput
        text: str

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, **kwargs)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            # TextArea would insert a newline; Enter sends instead
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
            return
        await super()._on_key(event)

    def action_newline(self) -> None:
        self.insert("\n")
