"""The chat's engine for the settings (`LoadedPair.session_for`) keeps what the command
line set for the conversation (the template's variables) and follows the settings'
thinking switch and reasoning budget (a scripted thinker with a Qwen3 kind of template)."""

from __future__ import annotations

import threading
from pathlib import Path

from localspec.backends.toy import THINKING_TEMPLATE
from localspec.conversations import ConversationStore
from localspec.settings import Settings
from tui.messages import AnswerPieces
from tui.pair import LoadedPair
from tui.scripted import SPEC, scripted_session
from tui.turn import Pacer, Turn, run_turn

REPLY = "<think>\nWeighing it up.\n</think>\n\nYes, it is."


def test_the_chats_engine_keeps_the_template_variables_and_the_budget(tmp_path: Path):
    base = scripted_session(REPLY, template=THINKING_TEMPLATE)
    base.template_kwargs = {"enable_thinking": False}
    pair = LoadedPair(SPEC, base)
    session = pair.session_for(Settings(gamma=2))  # another engine than the base's
    assert session.engine is not base.engine and session.reasoning_budget is None
    prompt = session.prompt_text([{"role": "user", "content": "Is it?"}])
    assert prompt.endswith("<think>\n\n</think>\n\n")  # thinking off, as asked
    for switch, off in (("on", False), ("auto", True), ("off", True)):  # the setting wins
        session = pair.session_for(Settings(gamma=2, reasoning=switch))
        prompt = session.prompt_text([{"role": "user", "content": "Is it?"}])
        assert prompt.endswith("<think>\n\n</think>\n\n") is off, switch
    assert base.template_kwargs == {"enable_thinking": False}  # the loaded pair's, as it was
    base.template_kwargs = {}
    posted: list[object] = []
    turn = Turn(
        1, "c1", "Is it?", Settings(gamma=2, reasoning_budget=3), threading.Event(), Pacer()
    )
    run_turn(turn, LoadedPair(SPEC, base), ConversationStore(tmp_path / "c"), posted.append)
    runs = [run for m in posted if isinstance(m, AnswerPieces) for run in m.runs]
    reasoning = "".join(text for text, source in runs if source == "reasoning")
    assert reasoning == "\nWe", runs  # three tokens, then the block's end
