"""The chat's cost of one redraw of a streaming answer: the UI thread's CPU time per
append of ~30 characters to a Markdown answer with a code fence, headless, after N
earlier answers in the transcript (what `tui.turn.Pacer` budgets). `--no-fold` keeps
every earlier answer unfolded (see `tui.widgets.transcript.Transcript`).

Usage: .venv/bin/python scripts/redraw_cost.py [--no-fold] [N ...]   (default: 0 5 20 40)
"""

from __future__ import annotations

import asyncio
import sys
import time

from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header

from tui.app import ChatApp
from tui.widgets import PromptInput, StatsPanel, Transcript
from tui.widgets.transcript import Answer, UserMessage

CODE = "\n".join(
    f"    def method_{i}(self, key):\n        return self.cache.get(key, {i})" for i in range(12)
)
ANSWER = (
    f"Here is a small cache class:\n\n```python\nclass Cache:\n{CODE}\n```\n\n"
    "How it works:\n\n"
    + "".join(f"{i}. **Method {i}** looks a key up and falls back to {i}.\n" for i in range(4))
    + "\nEach method looks a key up and falls back to a default. " * 2
)
CHUNK = 30  # characters per redraw: a few tokens, as a paced redraw brings
PAUSE_S = 0.1  # after each append: time for the redraw (a pilot's pause would also wait
# on a message to every widget of the screen, a cost that grows with the chat and that
# the app does not pay)


class Layout(App[None]):
    """The chat's layout and styles, without a pair."""

    CSS_PATH = ChatApp.CSS_PATH

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield Transcript(id="transcript")
                yield PromptInput(id="prompt")
            yield StatsPanel(id="stats")
        yield Footer()


async def redraw_ms(earlier: int) -> float:
    app = Layout()
    async with app.run_test(size=(120, 40)) as pilot:
        transcript = app.query_one(Transcript)
        if earlier:
            await transcript.mount_all(
                [
                    w
                    for i in range(earlier)
                    for w in (
                        UserMessage(f"question {i}"),
                        Answer(None, ANSWER, [(ANSWER, "target")], "done", "done"),
                    )
                ]
            )
        answer = await transcript.add_turn("a question", 1)
        await pilot.pause()
        await asyncio.sleep(5 * PAUSE_S)
        cpu = time.thread_time()
        await asyncio.sleep(5 * PAUSE_S)
        idle = (time.thread_time() - cpu) / 5  # a clock, a cursor: per pause, without appends
        cpu, n = time.thread_time(), 0
        for i in range(0, len(ANSWER), CHUNK):
            await answer.add([(ANSWER[i : i + CHUNK], "target")])
            await asyncio.sleep(PAUSE_S)  # the redraw
            n += 1
        return 1e3 * ((time.thread_time() - cpu) / n - idle)


def main() -> int:
    args = sys.argv[1:]
    if "--no-fold" in args:
        args.remove("--no-fold")
        Answer.fold = lambda self: None  # type: ignore[method-assign]
    for earlier in [int(a) for a in args] or [0, 5, 20, 40]:
        ms = asyncio.run(redraw_ms(earlier))
        print(f"{earlier:3d} earlier answers: {ms:.1f} ms of UI-thread CPU per redraw")
    return 0


if __name__ == "__main__":
    sys.exit(main())
