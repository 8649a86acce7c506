"""What every part of the chat app shares: its long-lived resources and its state.

`ChatApp` (tui.app) is this base with one mixin per concern: answering (tui.answers),
loading a pair (tui.loading), downloading one (tui.downloads) and saved conversations
(tui.conversations). They meet here: the loaded pair, the conversation store and the
settings, the answer being streamed, and `turn_lock`, which lets one worker at a time
use the models and the conversation file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from textual import work
from textual.app import App
from textual.reactive import reactive

from localspec.conversations import ConversationStore, new_id
from localspec.settings import Settings, save_settings
from tui.advice import advice
from tui.memory import MemoryProbe, MemoryUse
from tui.messages import Download
from tui.pair import LoadedPair, PairLoader, PairSpec
from tui.turn import Pacer
from tui.widgets import StatsPanel, Transcript


class ChatBase(App[None]):
    """The chat's resources and state; the concerns are mixins on top (see tui.app)."""

    generating: reactive[bool] = reactive(False, bindings=True)
    """An answer is streaming (Esc stops it)."""

    provenance: reactive[bool] = reactive(False)
    """Answers are coloured by who chose each piece: accepted draft tokens or the target."""

    pair_state: reactive[str] = reactive("loading")
    """loading, ready or failed: whether a message can be answered."""

    download: reactive[Download | None] = reactive(None)
    """The pair being downloaded (or the last one), and how far it got."""

    def __init__(
        self,
        loader: PairLoader,
        spec: PairSpec,
        settings: Settings | None = None,
        store: ConversationStore | None = None,
        memory: Callable[[], MemoryUse] | None = None,
        settings_file: Path | None = None,
        problems: Iterable[str] = (),
    ) -> None:
        super().__init__()
        self.loader = loader
        self.spec = spec
        self.settings = settings or Settings()
        self.store = store or ConversationStore()
        self.memory_probe = memory or MemoryProbe()
        self.settings_file = settings_file
        self.problems = list(problems)
        self.pair: LoadedPair | None = None  # set by the load worker
        self.conversation_id = new_id()
        self.turn_lock = threading.Lock()
        self.current: tuple[int, threading.Event] | None = None  # the streaming answer
        self._answers = 0
        self._stopping = threading.Event()  # the app is closing: background loops end
        self.pacer = Pacer()  # how often the streaming answer is redrawn
        self.set_reactive(ChatBase.provenance, self.settings.provenance)

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def stats_panel(self) -> StatsPanel:
        return self.query_one(StatsPanel)

    async def action_stop(self) -> None:
        """Stop the answer now: the UI stops at once, the engine at its round's end."""
        if self.current is None:
            return
        answer_id, cancel = self.current
        cancel.set()
        answer = self.transcript.answer(answer_id)
        if answer is not None:
            answer.stop()
        self.finish_current()

    def cancel_current(self) -> None:
        """Ask the streaming answer's engine to stop at its round's end."""
        if self.current is not None:
            self.current[1].set()

    def finish_current(self) -> None:
        """No answer is streaming any more, as far as the UI is concerned."""
        self.current = None
        self.generating = False
        self.stats_panel.generating = False

    @work(thread=True, exit_on_error=False, group="settings")
    def save_settings(self, settings: Settings) -> None:
        try:
            save_settings(settings, self.settings_file)
        except OSError as e:
            what, todo = advice(e)
            self.call_from_thread(
                self.notify, f"{what}\n{todo}", title="Settings not saved", severity="error"
            )
