"""Answering: a sent message starts a generation worker; its messages stream the answer in.

The worker (group "generate", exclusive) runs `tui.turn.run_turn` off the UI thread
under the turn lock, so an answer that is being stopped finishes its last round before
the next one starts. Every message names its answer, so one from an answer the user
has already left (stopped, or another conversation) leaves the current figures alone.
"""

from __future__ import annotations

import threading
import time

from textual import on, work

from tui.base import ChatBase
from tui.figures import stats_record, summary_line
from tui.messages import AnswerDone, AnswerPieces, AnswerTick, ContextWindow
from tui.turn import Turn, run_turn
from tui.widgets import PromptInput
from tui.widgets.transcript import STATUS


class Answers(ChatBase):
    """Send a message, stream its answer, show how it ended."""

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
                "No models are loaded: pick a pair on the models screen (Ctrl+L), or load "
                "this one again (Ctrl+R).",
                severity="error",
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

    def on_context_window(self, message: ContextWindow) -> None:
        if not self.is_running:
            return
        self.notify(
            f"This conversation outgrew the model's context ({message.n_ctx} tokens): its "
            f"first {message.dropped} messages no longer reach the model, which reads the "
            f"last {message.kept}. All of them stay saved here.",
            title="Context",
            timeout=10,
        )

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
            self.finish_current()
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
