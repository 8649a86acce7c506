"""Answers far out of view are folded: blank boxes of their height, so that a long chat
does not make every redraw of a streaming answer dearer (tui.widgets.transcript)."""

from __future__ import annotations

import pytest
from test_tui import done, make_app, ready, send, until

from localspec.conversations import Conversation, StoredMessage
from tui.widgets import Answer, Transcript

pytestmark = pytest.mark.tui

CODE = "\n".join(f"    value_{i} = compute({i})" for i in range(8))
REPLY = (
    f"Here is the code:\n\n```python\n{CODE}\n```\n\n"
    "- first point, long enough to wrap at a narrow width of the terminal\n"
    "- second point\n\nAnd a closing paragraph that wraps when the screen is narrow."
)


def conversation(turns: int) -> Conversation:
    messages = []
    for i in range(turns):
        messages += [
            StoredMessage("user", f"question {i}"),
            StoredMessage(
                "assistant",
                f"Answer {i}. {REPLY}",
                ((f"Answer {i}. ", "target"), (REPLY, "draft")),
                "stop",
            ),
        ]
    return Conversation("c", "a long chat", 0.0, tuple(messages))


async def settle(pilot) -> None:
    for _ in range(4):  # a fold pass runs after a refresh, and may unfold for another
        await pilot.pause()


def shown(answer: Answer, view: str = "Markdown") -> bool:
    """Its Markdown (or provenance view) is laid out, on the screen or scrolled out of it."""
    return answer.query_one(view).region.height > 0


async def all_unfolded_height(pilot, transcript: Transcript) -> int:
    """The transcript's height with every answer laid out in full."""
    for answer in transcript.query(Answer):
        answer.unfold()
    transcript.fold_later = lambda: None  # stay unfolded
    await settle(pilot)
    return transcript.virtual_size.height


async def open_long_chat(pilot) -> Transcript:
    await ready(pilot)
    transcript = pilot.app.query_one(Transcript)
    transcript.show(conversation(12))
    await settle(pilot)
    return transcript


async def test_answers_out_of_view_are_folded_and_those_scrolled_to_unfold():
    async with make_app().run_test(size=(100, 30)) as pilot:
        transcript = await open_long_chat(pilot)
        answers = list(transcript.query(Answer))
        assert [a.folded for a in answers[:8]] == [True] * 8
        assert not answers[-1].folded and shown(answers[-1])
        assert not shown(answers[0])
        height = transcript.virtual_size.height
        assert transcript.scroll_y == transcript.max_scroll_y > 0  # at the end

        transcript.scroll_home(animate=False)
        await settle(pilot)
        assert transcript.scroll_y == 0
        assert not answers[0].folded and shown(answers[0])
        assert answers[-1].folded
        assert transcript.virtual_size.height == height, "folding keeps every height"
        assert await all_unfolded_height(pilot, transcript) == height


@pytest.mark.parametrize("change", ["width", "provenance"])
async def test_a_change_of_height_refolds_at_the_new_height(change: str):
    async with make_app().run_test(size=(100, 30)) as pilot:
        transcript = await open_long_chat(pilot)
        before = transcript.virtual_size.height
        if change == "width":
            await pilot.resize_terminal(30, 30)
        else:
            await pilot.press("ctrl+t")
        await settle(pilot)
        after = transcript.virtual_size.height
        answers = list(transcript.query(Answer))
        assert after != before and sum(a.folded for a in answers) >= 8
        assert shown(answers[-1], "ProvenanceView" if change == "provenance" else "Markdown")
        assert await all_unfolded_height(pilot, transcript) == after


async def test_answers_streamed_earlier_in_the_chat_fold_when_a_new_one_starts():
    app = make_app(REPLY)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        for i in range(6):
            await send(pilot, f"q{i}")
            await until(pilot, lambda i=i: len(app.query(Answer)) == i + 1 and done(app))
        await settle(pilot)
        answers = list(app.query(Answer))
        assert answers[0].folded and not answers[-1].folded
        transcript = app.query_one(Transcript)
        height = transcript.virtual_size.height
        assert await all_unfolded_height(pilot, transcript) == height
        assert [a.text for a in answers] == [REPLY] * 6
