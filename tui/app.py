"""The chat app: a transcript that streams, an input that is always usable, live stats.

Blocking work runs in thread workers and reports back through messages (tui.messages):
loading a pair (group "load"), answering (group "generate", exclusive), reading memory
use. `turn_lock` makes one worker at a time use the models and the conversation file:
an answer that is being stopped finishes its last round before the next one starts, and
a pair is closed only when no answer uses it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path, PurePath
from typing import ClassVar

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header
from textual.worker import Worker, WorkerState, get_current_worker

from localspec.conversations import ConversationError, ConversationStore, new_id
from localspec.settings import Settings, save_settings
from tui.advice import advice
from tui.figures import stats_record, summary_line
from tui.listing import PairRow, download_files, downloaded_bytes, pull_pair
from tui.memory import MemoryProbe, MemoryUse
from tui.messages import (
    AnswerDone,
    AnswerPieces,
    AnswerTick,
    ConversationOpened,
    Download,
    DownloadUpdate,
    MemoryUpdate,
    PairFailed,
    PairLoaded,
    PairLoading,
)
from tui.pair import LoadedPair, PairLoader, PairSpec
from tui.turn import Pacer, Turn, run_turn
from tui.widgets import PromptInput, StatsPanel, Transcript
from tui.widgets.transcript import STATUS

MEMORY_EVERY_S = 1.0
STYLES = Path(__file__).parent  # absolute, so that subclasses elsewhere find the .tcss


class ChatApp(App[None]):
    """localspec's chat."""

    TITLE = "localspec"
    CSS_PATH: ClassVar[list[str | PurePath]] = [
        STYLES / name for name in ("app.tcss", "settings.tcss", "conversations.tcss", "models.tcss")
    ]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_conversation", "New"),
        Binding("ctrl+o", "conversations", "Open"),
        Binding("ctrl+t", "toggle_provenance", "Provenance"),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("ctrl+l", "models", "Models"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

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
        self._stopping = threading.Event()
        self.pacer = Pacer()  # how often the streaming answer is redrawn
        self.set_reactive(ChatApp.provenance, self.settings.provenance)

    # --- layout and lifetime ---------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield Transcript(id="transcript")
                yield PromptInput(id="prompt", placeholder="Ask anything… (Enter sends)")
            yield StatsPanel(id="stats")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.spec.label
        self.set_class(self.provenance, "-provenance")
        self.query_one(PromptInput).focus()
        for problem in self.problems:
            self.notify(problem, title="Settings", severity="warning", timeout=10)
        self.switch_pair(self.spec)
        self.read_memory()

    def on_unmount(self) -> None:
        self._stopping.set()
        if self.current is not None:
            self.current[1].set()
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

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def stats_panel(self) -> StatsPanel:
        return self.query_one(StatsPanel)

    def switch_pair(self, spec: PairSpec) -> None:
        self.pair_state = "loading"
        self.stats_panel.pair = f"loading {spec.label}…"
        self.load_pair(spec)

    # --- workers (threads) ------------------------------------------------------------
    @work(thread=True, exclusive=True, exit_on_error=False, group="load")
    def load_pair(self, spec: PairSpec) -> None:
        """Unload the current pair (once no answer uses it), then load `spec`."""
        with self.turn_lock:
            old, self.pair = self.pair, None
            if old is not None:
                old.close()

        def say(line: str) -> None:
            self.post_message(PairLoading(spec, line))

        try:
            session = self.loader(spec, say)
        except Exception as e:
            self.post_message(PairFailed(spec, *advice(e)))
            return
        if get_current_worker().is_cancelled:  # another pair was asked for meanwhile
            session.close()
            return
        pair = LoadedPair(spec, session)
        with self.turn_lock:
            self.pair = pair
        self.post_message(PairLoaded(pair, tuple(getattr(session, "notes", ()))))

    @work(thread=True, exclusive=True, exit_on_error=False, group="generate")
    def generate(self, turn: Turn) -> None:
        with self.turn_lock:
            pair = self.pair
            if pair is None:
                what = "The models are not loaded."
                self.post_message(
                    AnswerDone(
                        turn.answer_id,
                        "error",
                        {"error": what},
                        what,
                        "Pick a pair on the models screen (Ctrl+L).",
                    )
                )
                return
            run_turn(turn, pair, self.store, self.post_message)

    @work(thread=True, exit_on_error=False, group="memory")
    def read_memory(self) -> None:
        worker = get_current_worker()
        while not (worker.is_cancelled or self._stopping.is_set()):
            with contextlib.suppress(Exception):  # a failed reading: the panel keeps the last
                self.post_message(MemoryUpdate(self.memory_probe()))
            self._stopping.wait(MEMORY_EVERY_S)

    @work(thread=True, exit_on_error=False, group="settings")
    def save_settings(self, settings: Settings) -> None:
        try:
            save_settings(settings, self.settings_file)
        except OSError as e:
            what, todo = advice(e)
            self.call_from_thread(
                self.notify, f"{what}\n{todo}", title="Settings not saved", severity="error"
            )

    @work(thread=True, exclusive=True, exit_on_error=False, group="open")
    def open_conversation(self, conversation_id: str) -> None:
        try:
            conversation = self.store.load(conversation_id)
        except (ConversationError, OSError) as e:
            self.call_from_thread(self.notify, str(e), title="Cannot open", severity="error")
            return
        self.post_message(ConversationOpened(conversation))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Workers report their own errors; this catches what slipped through."""
        if event.state is WorkerState.ERROR and event.worker.error is not None:
            what, todo = advice(event.worker.error)
            self.notify(f"{what}\n{todo}", title="Error", severity="error", timeout=15)
            if event.worker.group == "generate":
                self._finish_current()

    # --- sending and stopping ---------------------------------------------------------
    @on(PromptInput.Submitted)
    async def send(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if self.pair_state == "loading":
            self.notify(
                "The models are still loading; your message is kept in the box.", severity="warning"
            )
            return
        if self.pair_state == "failed":
            self.notify(
                "No models are loaded: pick a pair on the models screen (Ctrl+L).", severity="error"
            )
            return
        if self.current is not None:
            await self.action_stop()  # a new message stops the answer in progress
        event.prompt_input.clear()
        self._answers += 1
        answer_id = self._answers
        await self.transcript.add_turn(text, answer_id)
        cancel = threading.Event()
        self.current = (answer_id, cancel)
        self.generating = True
        self.stats_panel.start_answer()
        self.pacer.restart()
        self.generate(
            Turn(answer_id, self.conversation_id, text, self.settings, cancel, self.pacer)
        )

    async def action_stop(self) -> None:
        """Stop the answer now: the UI stops at once, the engine at its round's end."""
        if self.current is None:
            return
        answer_id, cancel = self.current
        cancel.set()
        answer = self.transcript.answer(answer_id)
        if answer is not None:
            answer.stop()
        self._finish_current()

    def _finish_current(self) -> None:
        self.current = None
        self.generating = False
        self.stats_panel.generating = False

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return True if self.generating else None  # shown, dimmed, when idle
        return True

    # --- what the workers say ---------------------------------------------------------
    def _is_current(self, answer_id: int) -> bool:
        return self.current is not None and self.current[0] == answer_id

    async def on_answer_pieces(self, message: AnswerPieces) -> None:
        # A stopped answer still takes what was sent before the stop (it is saved too);
        # the worker sends nothing after it.
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        if self._is_current(message.answer_id):
            self.stats_panel.count(message.tokens)
            self.pacer.observe(time.thread_time(), time.monotonic())
        answer = self.transcript.answer(message.answer_id)
        if answer is not None:
            await answer.add(message.runs)

    def on_answer_tick(self, message: AnswerTick) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        if self._is_current(message.answer_id):
            self.stats_panel.figures = stats_record(message.stats, message.speedup)
            self.stats_panel.why = message.why

    async def on_answer_done(self, message: AnswerDone) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        summary = summary_line(message.stop_reason, message.record)
        answer = self.transcript.answer(message.answer_id)
        if answer is not None:
            await answer.end(STATUS.get(message.stop_reason, "done"), summary)
        if message.answer_id == self._answers and not message.error:
            self.stats_panel.figures = dict(message.record)  # the latest answer's figures
        if self._is_current(message.answer_id):
            self._finish_current()
        if message.error:
            self.notify(
                f"{message.error}\n{message.advice}".strip(),
                title="Answer failed",
                severity="error",
                timeout=15,
            )
        elif message.stop_reason == "context_full":
            self.notify(
                "The answer filled the model's context. Start a new conversation "
                "with Ctrl+N, or restart with a larger --ctx.",
                title="Context full",
                severity="warning",
                timeout=15,
            )

    def on_pair_loading(self, message: PairLoading) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        self.notify(message.line, title="Loading models", severity="warning")

    def on_pair_loaded(self, message: PairLoaded) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        self.pair_state = "ready"
        self.spec = message.pair.spec
        self.sub_title = self.spec.label
        self.stats_panel.pair = self.spec.lines
        for note in message.notes:
            self.notify(note, title="Models", severity="warning", timeout=10)
        if self.settings.drafter == "model" and not message.pair.has_draft_model:
            self.notify("This pair has no draft model: drafting with n-grams.", title="Models")

    def on_pair_failed(self, message: PairFailed) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        self.pair_state = "failed"
        self.stats_panel.pair = f"not loaded: {short_line(message.error)}"
        self.sub_title = "no models loaded"
        self.notify(
            f"{message.error}\n{message.advice}".strip(),
            title=f"Could not load {message.spec.label}",
            severity="error",
            timeout=20,
        )

    def on_memory_update(self, message: MemoryUpdate) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        self.stats_panel.memory = message.memory

    def on_conversation_opened(self, message: ConversationOpened) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        if self.current is not None:
            self.current[1].set()
            self._finish_current()
        conversation = message.conversation
        self.conversation_id = conversation.id
        self.transcript.show(conversation)
        last = next((m for m in reversed(conversation.messages) if m.role == "assistant"), None)
        self.stats_panel.figures = dict(last.stats) if last else {}
        self.query_one(PromptInput).focus()

    # --- actions ----------------------------------------------------------------------
    async def action_new_conversation(self) -> None:
        await self.action_stop()
        self.conversation_id = new_id()
        self.transcript.clear()
        self.stats_panel.figures = {}
        self.query_one(PromptInput).focus()

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
        self.settings = settings or Settings()
        self.save_settings(settings)
        self.notify("Settings saved; they apply from the next answer.", title="Settings")

    def action_conversations(self) -> None:
        from tui.screens.conversations import ConversationsScreen

        def chosen(conversation_id: str | None) -> None:
            if conversation_id:
                self.open_conversation(conversation_id)

        self.push_screen(ConversationsScreen(self.store, self.conversation_id), chosen)

    def action_models(self) -> None:
        from tui.screens.models import ModelsScreen

        def chosen(spec: PairSpec | None) -> None:
            if spec is None or spec == self.spec:
                return
            if self.current is not None:
                self.current[1].set()  # the answer in progress ends with the old pair
            self.settings = replace(self.settings, target=spec.target, draft=spec.draft)
            self.save_settings(self.settings)  # the next run opens this pair too
            self.switch_pair(spec)

        self.push_screen(ModelsScreen(self.spec), chosen)

    def start_download(self, pair: PairRow) -> None:
        if self.download is not None and not self.download.finished:
            self.notify(
                f"{self.download.pair_id} is downloading; one at a time.", severity="warning"
            )
            return
        self.download = Download(pair.id, 0, pair.missing, "starting…")
        self.pull(pair)

    @work(thread=True, exclusive=True, exit_on_error=False, group="download")
    def pull(self, pair: PairRow) -> None:
        """Download a pair; progress is read off the disk twice a second meanwhile."""
        since = time.time() - 1
        line = ["starting…"]
        finished = threading.Event()

        def progress() -> None:
            while not finished.wait(0.5) and not self._stopping.is_set():
                done = downloaded_bytes(since, download_files)
                self.post_message(DownloadUpdate(Download(pair.id, done, pair.missing, line[0])))

        self.call_from_thread(
            self.run_worker, progress, thread=True, group="download-progress", exit_on_error=False
        )
        try:
            pull_pair(pair.id, say=lambda text: line.__setitem__(0, text))
        except Exception as e:
            what, todo = advice(e)
            end = Download(pair.id, 0, pair.missing, "", True, f"{what} {todo}".strip())
        else:
            end = Download(pair.id, pair.missing, pair.missing, "done", True)
        finally:
            finished.set()
        self.post_message(DownloadUpdate(end))

    def on_download_update(self, message: DownloadUpdate) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        self.download = message.download
        if not message.download.finished:
            return
        if message.download.error:
            self.notify(
                message.download.error,
                title=f"{message.download.pair_id} not downloaded",
                severity="error",
                timeout=20,
            )
        else:
            self.notify(
                f"{message.download.pair_id} is ready: use it on the models screen (Ctrl+L).",
                title="Downloaded",
            )

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
        if self.generating:
            yield SystemCommand(
                "Stop the answer", "Keep what has been said (Esc)", self.action_stop
            )
        yield from super().get_system_commands(screen)


def short_line(text: str, limit: int = 60) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def run_chat(
    loader: PairLoader, spec: PairSpec, settings: Settings, problems: Iterable[str] = ()
) -> int:
    """Run the chat in this terminal until the user quits; the exit status."""
    app = ChatApp(loader, spec, settings, problems=problems)
    app.run()
    return app.return_code or 0
