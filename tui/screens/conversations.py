"""Saved conversations, newest first; Enter reopens one."""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from localspec.conversations import ConversationInfo, ConversationStore
from tui.messages import ConversationsListed


def when(t: float, now: float | None = None) -> str:
    """A short local date: the time today, else the day."""
    now = time.time() if now is None else now
    same_day = time.localtime(t)[:3] == time.localtime(now)[:3]
    return time.strftime("%H:%M" if same_day else "%Y-%m-%d", time.localtime(t))


class ConversationsScreen(ModalScreen[str | None]):
    """Pick a saved conversation; dismisses with its id, or None."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "Close")]

    def __init__(self, store: ConversationStore, current: str | None = None) -> None:
        super().__init__()
        self.store = store
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="conversations-dialog", classes="dialog"):
            yield Static("Conversations", classes="dialog-title")
            yield OptionList(id="conversations")
            yield Static("Enter opens · Esc closes", classes="dialog-hint")
        yield Footer(compact=True)  # this screen's keys, not the chat's under it

    def on_mount(self) -> None:
        self.query_one(OptionList).loading = True
        self.list_conversations()

    @work(thread=True, exclusive=True, exit_on_error=False, group="list")
    def list_conversations(self) -> None:
        self.post_message(ConversationsListed(self.store.list()))

    def on_conversations_listed(self, message: ConversationsListed) -> None:
        options = self.query_one(OptionList)
        options.loading = False
        options.clear_options()
        options.focus()  # it could not take the focus while loading
        if not message.conversations:
            options.add_option(Option("No saved conversations yet.", disabled=True))
            return
        options.add_options(self._option(info) for info in message.conversations)
        options.highlighted = 0

    def _option(self, info: ConversationInfo) -> Option:
        label = Text.assemble(
            (f"{when(info.updated):>10}  ", "dim"),
            info.title or "(untitled)",
            ("  (open)" if info.id == self.current else "", "dim"),
        )
        return Option(label, id=info.id)

    @on(OptionList.OptionSelected)
    def open(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)
