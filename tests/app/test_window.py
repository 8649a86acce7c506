"""A chat that outgrows its context: which messages the next prompt holds."""

from __future__ import annotations

from localspec.backends.toy import ToyModel, scripted
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Engine
from localspec.session import Message, Session
from localspec.window import answer_room, window_start


def test_the_window_stays_put_until_the_answer_has_no_room_then_halves():
    lengths = {0: 900, 2: 700, 4: 520, 6: 480, 8: 300, 10: 120}  # tokens from message i on
    starts = sorted(lengths)
    asked: list[int] = []

    def length(i: int) -> int:
        asked.append(i)
        return lengths[i]

    assert window_start(starts, length, 0, 1024, 100) == 0  # 900 + 100 fit
    # 900 + 200 do not: down to half the context (512) at once, not one turn at a time,
    # so that the next turns start where this one does and keep its cache
    assert window_start(starts, length, 0, 1024, 200) == 6
    assert window_start(starts, length, 6, 1024, 200) == 6
    assert len(asked) < len(starts) + 3  # a bisection, not every start rendered
    assert window_start(starts, lambda i: 5000, 0, 1024, 200) == 10  # the last one alone
    assert window_start([0], lambda i: 5000, 0, 1024, 200) == 0  # the engine says it
    assert answer_room(1024, 8192) == 1024 and answer_room(8000, 8192) == 2048


def test_a_long_conversation_keeps_its_system_prompt_and_latest_turns():
    target = ToyModel(scripted("ok"), n_vocab=258, n_ctx=400)
    session = Session(Engine(target, NoDrafter(), 0))
    messages = [Message(role="system", content="Be brief.")]
    for i in range(12):
        messages.append(Message(role="user", content=f"question {i} " + "x" * 20))
        messages.append(Message(role="assistant", content="answer " + "y" * 20))
    messages.append(Message(role="user", content="the last question"))
    start = session.window(messages, 0, 64)
    assert start > 1 and messages[start]["role"] == "user"
    assert len(session.render([messages[0], *messages[start:]])) <= 200  # half the context
    assert len(session.render([messages[0], *messages[start - 2 :]])) > 200  # no more dropped
    assert session.window(messages, start, 64) == start  # the next turn: the same start
    short = [messages[0], *messages[-3:]]
    assert session.window(short, 0, 64) == 1  # all of it fits: from the system prompt on
