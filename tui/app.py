"""The chat app: a transcript that streams, an input that is always usable, live stats.

This module is the shell: the layout, the key bindings and commands, and the resources
started on mount and closed on unmount. Each concern is a mixin of its own module, with
its thread worker and the messages (tui.messages) that worker posts back:

- tui.answers: sending a message and streaming its answer (group "generate")
- tui.loading: loading a pair of models (group "load")
- tui.downloads: downloading a pair (group "download")
- tui.conversations: new and saved conversations (group "open")

and tui.base holds what they share.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path, PurePath
from typing import ClassVar

from textual import work
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header
from textual.worker import Worker, WorkerState, get_current_worker

from localspec.settings import Settings
from tui import recovery
from tui.advice import advice
from tui.answers import Answers
from tui.conversations import Conversations
from tui.downloads import Downloads
from tui.loading import Loading
from tui.messages import MemoryUpdate
from tui.pair import PairLoader, PairSpec
from tui.widgets import PromptInput, StatsPanel, Transcript

MEMORY_EVERY_S = 1.0  # between memory readings for the stats panel
STYLES = Path(__file__).parent  # absolute, so that subclasses elsewhere find the .tcss


class ChatApp(Answers, Loading, Downloads, Conversations):
    """localspec's chat."""

    TITLE = "localspec"
    CSS_PATH: ClassVar[list[str | PurePath]] = [
        STYLES / name for name in ("app.tcss", "settings.tcss", "conversations.tcss", "models.tcss")
    ]
    # below 100 columns the stats panel gives its width to the transcript (an answer's
    # line keeps its figures); ctrl+b shows it, or hides it where it shows
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]  # noqa: RUF012 - as App has it
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_conversation", "New"),
        Binding("ctrl+o", "conversations", "Open"),
        Binding("ctrl+t", "toggle_provenance", "Provenance"),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("ctrl+l", "models", "Models"),
        Binding("ctrl+b", "toggle_stats", "Stats"),
        Binding("ctrl+r", "reload_models", "Reload", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    # --- layout and lifetime ---------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield Transcript(id="transcript")
                yield PromptInput(
                    id="prompt",
                    placeholder="Ask anything… (Enter sends, Shift+Enter or Ctrl+J a new line)",
                )
            yield StatsPanel(id="stats")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.sub_title = self.spec.label
        self.set_class(self.provenance, "-provenance")
        self.query_one(PromptInput).focus()
        for problem in self.problems:
            self.notify(problem, title="Settings", severity="warning", timeout=10)
        self.switch_pair(self.spec)
        self.read_memory()
        if self.settings.rpc:  # llama.cpp ends the process when a server fails: restart
            recovery.install(self)
        self.say_why_restarted()

    def say_why_restarted(self) -> None:
        conversation_id, reason = recovery.take_reopen()
        if conversation_id and self.store.exists(conversation_id):
            self.open_conversation(conversation_id)
        if reason:
            self.notify(
                f"{reason[0].upper()}{reason[1:]}. The chat started again; the answer so far "
                "is saved. If the models do not load, press Ctrl+R once the server is back.",
                title="The chat restarted",
                severity="error",
                timeout=60,
            )

    def action_reload_models(self) -> None:
        """Load the pair again (after a server came back, or a failed load)."""
        self.switch_pair(self.spec)

    def on_unmount(self) -> None:
        self._stopping.set()
        self.cancel_current()
        # the answer being stopped ends within a round; then the models can go
        if self.turn_lock.acquire(timeout=10):
            try:
                if self.pair is not None:
                    self.pair.close()
                    self.pair = None
            finally:
                self.turn_lock.release()
        close = getattr(self.memory_probe, "close", None)
        if close is not None:
            close()

    @work(thread=True, exit_on_error=False, group="memory")
    def read_memory(self) -> None:
        worker = get_current_worker()
        while not (worker.is_cancelled or self._stopping.is_set()):
            with contextlib.suppress(Exception):  # a failed reading: the panel keeps the last
                self.post_message(MemoryUpdate(self.memory_probe()))
            self._stopping.wait(MEMORY_EVERY_S)

    def on_memory_update(self, message: MemoryUpdate) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        self.stats_panel.memory = message.memory

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Workers report their own errors; this catches what slipped through."""
        if event.state is WorkerState.ERROR and event.worker.error is not None:
            what, todo = advice(event.worker.error)
            self.notify(f"{what}\n{todo}", title="Error", severity="error", timeout=15)
            if event.worker.group == "generate":
                self.finish_current()

    # --- actions and commands ---------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return True if self.generating else None  # shown, dimmed, when idle
        return True

    def action_toggle_stats(self) -> None:
        self.toggle_class("-stats-toggled")

    def action_toggle_provenance(self) -> None:
        self.provenance = not self.provenance

    def watch_provenance(self, provenance: bool) -> None:
        self.set_class(provenance, "-provenance")
        for transcript in self.query(Transcript):  # none yet while the app starts
            transcript.refold()  # the provenance view's height is not the Markdown's
        if provenance != self.settings.provenance:
            self.settings = replace(self.settings, provenance=provenance)
            self.save_settings(self.settings)

    def action_settings(self) -> None:
        from tui.screens.settings import SettingsScreen

        self.push_screen(SettingsScreen(self.settings), self._apply_settings)

    def _apply_settings(self, settings: Settings | None) -> None:
        if settings is None or settings == self.settings:
            return
        switched = settings.reasoning != self.settings.reasoning
        self.settings = settings or Settings()
        self.save_settings(settings)
        self.notify("Settings saved; they apply from the next answer.", title="Settings")
        note = self.pair.base.switch_note(settings.reasoning) if switched and self.pair else None
        if note:
            self.notify(note, title="Thinking", timeout=10)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield SystemCommand("New conversation", "Start over (Ctrl+N)", self.action_new_conversation)
        yield SystemCommand(
            "Open a conversation", "Reopen a saved conversation (Ctrl+O)", self.action_conversations
        )
        yield SystemCommand(
            "Toggle provenance colours",
            "Colour answers by source: accepted draft tokens vs the target (Ctrl+T)",
            self.action_toggle_provenance,
        )
        yield SystemCommand(
            "Settings", "System prompt, sampling, γ, drafter (Ctrl+S)", self.action_settings
        )
        yield SystemCommand("Models", "Switch or download a pair (Ctrl+L)", self.action_models)
        yield SystemCommand(
            "Reload models", "Load the pair again, e.g. once a server is back (Ctrl+R)",
            self.action_reload_models,
        )  # fmt: skip
        if self.generating:
            yield SystemCommand(
                "Stop the answer", "Keep what has been said (Esc)", self.action_stop
            )
        yield from super().get_system_commands(screen)


def run_chat(
    loader: PairLoader, spec: PairSpec, settings: Settings, problems: Iterable[str] = ()
) -> int:
    """Run the chat in this terminal until the user quits; the exit status."""
    app = ChatApp(loader, spec, settings, problems=problems)
    app.run()
    return app.return_code or 0
