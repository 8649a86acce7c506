"""One turn of the conversation, as the generation worker runs it (off the UI thread).

The conversation file is the record: the user's message is appended first, then the
answer piece by piece as it streams, then how it ended. The model is shown exactly what
the file holds, so a stopped answer's saved part is what the next turn builds on.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from textual.message import Message

from localspec.backends.base import Cancelled
from localspec.conversations import ConversationStore, ConversationWriter
from localspec.decoding.events import Finished, Piece, RoundEnd, Stats
from localspec.session import Message as ChatMessage
from localspec.session import Session
from localspec.settings import Settings
from localspec.window import kept_first
from tui.advice import advice
from tui.figures import Speedup, speedup, stats_record
from tui.messages import AnswerDone, AnswerPieces, AnswerTick, ContextWindow
from tui.pair import LoadedPair
from tui.reasoning import ReasoningRuns

UI_SHARE = 0.1  # of a core, at most, for redrawing a streaming answer


@dataclass
class Pacer:
    """How often a streaming answer is redrawn: ten times a second, less where redrawing
    would take more than UI_SHARE of a core. A redraw is the UI thread's work, and where
    llama.cpp's threads fill every core it comes out of their time: redrawn every round,
    the chat decodes well below `localspec run`'s speed (docs/chat-performance.md). The
    UI thread reports what it spent (`observe`); the generation worker reads `every_s`."""

    every_s: float = 0.1
    """Seconds between redraws now; the worker posts pieces at this pace."""

    fastest_s: float = 0.1
    """The shortest interval: ten redraws a second are as smooth as reading needs."""

    slowest_s: float = 1.0
    """The longest interval: a redraw's cost grows with the chat and the answer (a long
    code fence is highlighted again at each redraw), but text should still move."""

    _last: tuple[float, float] | None = None  # the UI thread's CPU and wall clocks

    def observe(self, cpu_s: float, wall_s: float) -> None:
        """The UI thread's own CPU time (time.thread_time()) and time.monotonic(), taken
        each time it shows a batch of pieces."""
        last, self._last = self._last, (cpu_s, wall_s)
        if last is None or wall_s - last[1] <= 0:
            return
        share = (cpu_s - last[0]) / (wall_s - last[1])
        wanted = self.every_s * share / UI_SHARE  # the pace at which share = UI_SHARE
        # halfway there: one interval's share is noisy (a redraw may fall in the next one)
        self.every_s = min(
            max(self.every_s + (wanted - self.every_s) / 2, self.fastest_s), self.slowest_s
        )

    def restart(self) -> None:
        """A new answer: the pause between answers says nothing of redraws."""
        self._last = None


@dataclass(frozen=True)
class Turn:
    """One message to answer: all the generation worker needs, handed over whole."""

    answer_id: int
    conversation_id: str
    user_text: str
    settings: Settings
    cancel: threading.Event
    pacer: Pacer = field(default_factory=Pacer)


def run_turn(
    turn: Turn, pair: LoadedPair, store: ConversationStore, post: Callable[[Message], object]
) -> None:
    """Save the user's message, stream the answer into the file and the UI; never raises."""
    log: ConversationWriter | None = None
    started = False
    try:
        if store.exists(turn.conversation_id):
            log = store.open(turn.conversation_id)
        else:
            log = store.create(
                turn.user_text, turn.conversation_id, target=pair.spec.target, draft=pair.spec.draft
            )
        log.message("user", turn.user_text)
        messages = chat_messages(turn.settings, store, turn.conversation_id)
        log.start_answer()
        started = True
        stop_reason, stats = stream(turn, pair, messages, log, post)
        estimate = _speedup(pair, stats)
        record = stats_record(stats, estimate)
        log.end_answer(stop_reason, record)
        post(AnswerDone(turn.answer_id, stop_reason, record))
    except Exception as e:
        what, todo = advice(e)
        if log is not None and started:
            with contextlib.suppress(OSError):  # the disk failed; the notification says so
                log.end_answer("error", {"error": what})
        post(AnswerDone(turn.answer_id, "error", {"error": what}, error=what, advice=todo))
    finally:
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()


def chat_messages(
    settings: Settings, store: ConversationStore, conversation_id: str
) -> list[ChatMessage]:
    """The system prompt, then the conversation as saved."""
    system: list[ChatMessage] = (
        [{"role": "system", "content": settings.system_prompt}]
        if settings.system_prompt.strip()
        else []
    )
    saved = store.load(conversation_id).chat_messages()
    return system + [{"role": m["role"], "content": m["content"]} for m in saved]


def stream(
    turn: Turn,
    pair: LoadedPair,
    messages: list[ChatMessage],
    log: ConversationWriter,
    post: Callable[[Message], object],
) -> tuple[str, Stats]:
    """Run the engine until it finishes or the user stops it: (stop reason, stats)."""
    if turn.cancel.is_set():  # stopped while waiting for the previous turn to end
        return "cancelled", Stats()
    session = pair.session_for(turn.settings)
    messages = windowed(turn, pair, session, messages, post)
    thinking = session.thinking(messages)
    events = session.chat(messages, turn.settings.generation(), turn.cancel)
    last: Stats | None = None
    pending = Pending(turn.answer_id, post, ReasoningRuns(thinking.split()) if thinking else None)
    shown_at = -math.inf  # the first round shows at once, however long the machine has been up
    session.stop_reads_on(turn.cancel)  # a long paste stops between its chunks when stopped
    try:
        for event in events:
            if turn.cancel.is_set():
                pending.end()  # saved already, so shown too; nothing after the stop
                return "cancelled", last or Stats()
            if isinstance(event, Piece):
                log.piece(event.text, event.source)  # on disk before it is shown
                pending.add(event)
                if last is None:
                    pending.flush()  # the first token shows at once (TTFT)
            elif isinstance(event, RoundEnd):
                if last is not None:  # the first round's time includes the prefill
                    pair.costs.observe(event.drafted + 1, event.stats.verify_s - last.verify_s)
                last = event.stats
                if (now := time.monotonic()) - shown_at >= turn.pacer.every_s:
                    shown_at = now
                    pending.flush()
                    post(AnswerTick(turn.answer_id, last, _speedup(pair, last), event.why))
            elif isinstance(event, Finished):
                pending.end()
                return event.stop_reason, event.stats
    except Cancelled:  # stopped while the prompt was read: what was read stays cached
        pass
    finally:
        close = getattr(events, "close", None)  # a generator: closing stops the engine
        if close is not None:
            close()
        session.stop_reads_on(None)  # the turn's own: not left for whatever reads next
    pending.end()
    return "cancelled", last or Stats()


def windowed(
    turn: Turn,
    pair: LoadedPair,
    session: Session,
    messages: list[ChatMessage],
    post: Callable[[Message], object],
) -> list[ChatMessage]:
    """The conversation as far as the context holds it with room for the answer: from
    the message its last turn's prompt began at, or, where it outgrew that, from a later
    one (localspec.window), which the UI is told of once."""
    first = kept_first(messages)  # the system prompt
    kept = max(pair.windows.get(turn.conversation_id, 0), first)
    start = session.window(messages, kept, turn.settings.max_tokens)
    if start > kept:
        pair.windows[turn.conversation_id] = start
        n_ctx = session.engine.room(0)
        post(ContextWindow(turn.answer_id, start - first, len(messages) - start, n_ctx))
    return [*messages[:first], *messages[start:]]


class Pending:
    """Pieces not yet posted, merged into runs by source: one message per redraw rather
    than one per token keeps the UI ahead of a fast GPU. A thinking model's reasoning
    comes in runs of its own (`reasoning`)."""

    def __init__(
        self,
        answer_id: int,
        post: Callable[[Message], object],
        reasoning: ReasoningRuns | None = None,
    ) -> None:
        self.answer_id = answer_id
        self.post = post
        self.reasoning = reasoning
        self.runs: list[tuple[str, str]] = []
        self.tokens = 0

    def add(self, piece: Piece) -> None:
        self.tokens += piece.token >= 0  # a flushed tail is text, not a token
        if self.reasoning is None:
            self._add(piece.text, piece.source)
            return
        for text, source in self.reasoning.push(piece.text, piece.source):
            self._add(text, source)

    def _add(self, text: str, source: str) -> None:
        if not text:
            return
        if self.runs and self.runs[-1][1] == source:
            self.runs[-1] = (self.runs[-1][0] + text, source)
        else:
            self.runs.append((text, source))

    def end(self) -> None:
        """The answer ended (or stopped): what a reasoning split still held, then all."""
        if self.reasoning is not None:
            for text, source in self.reasoning.flush():
                self._add(text, source)
        self.flush()

    def flush(self) -> None:
        if self.runs or self.tokens:
            self.post(AnswerPieces(self.answer_id, self.runs, self.tokens))
            self.runs, self.tokens = [], 0


def _speedup(pair: LoadedPair, stats: Stats) -> Speedup | None:
    return speedup(stats, pair.costs.plain_s())
