"""How often a streaming answer is redrawn: each redraw costs the UI thread time that,
on a machine whose cores llama.cpp's threads fill, comes out of decoding."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from localspec.conversations import ConversationStore
from localspec.settings import Settings
from tui.messages import AnswerPieces, AnswerTick
from tui.pair import LoadedPair
from tui.scripted import SPEC, scripted_session
from tui.turn import UI_SHARE, Pacer, Turn, run_turn

REPLY = "A reply long enough for many rounds of a scripted pair. " * 6


def test_the_pacer_redraws_at_its_fastest_while_redraws_are_cheap():
    pacer = Pacer()
    for i in range(20):  # a redraw every 0.1 s, costing the UI thread 2 ms each
        pacer.observe(cpu_s=0.002 * i, wall_s=0.1 * i)
    assert pacer.every_s == pacer.fastest_s


def test_the_pacer_slows_down_until_redraws_take_their_share_of_a_core():
    pacer, cpu, wall = Pacer(slowest_s=10.0), 0.0, 0.0
    for _ in range(40):  # each redraw costs 40 ms, whatever its pace
        pacer.observe(cpu, wall)
        cpu, wall = cpu + 0.04, wall + pacer.every_s
    assert pacer.every_s == pytest.approx(0.04 / UI_SHARE, rel=0.01)


def test_the_pacer_never_waits_longer_than_its_slowest():
    pacer = Pacer()
    for i in range(20):  # the UI thread is always busy
        pacer.observe(cpu_s=1.0 * i, wall_s=1.0 * i)
    assert pacer.every_s == pacer.slowest_s


def test_a_new_answer_does_not_count_the_pause_before_it():
    pacer = Pacer()
    pacer.observe(0.0, 0.0)
    pacer.restart()
    pacer.observe(cpu_s=5.0, wall_s=5.5)  # what the UI did between answers
    assert pacer.every_s == pacer.fastest_s


def run(pacer: Pacer, tmp_path: Path) -> list[object]:
    posted: list[object] = []
    pair = LoadedPair(SPEC, scripted_session(REPLY))
    turn = Turn(1, "c1", "go", Settings(), threading.Event(), pacer)
    run_turn(turn, pair, ConversationStore(tmp_path / "conversations"), posted.append)
    return posted


def test_an_answer_is_posted_to_the_ui_at_the_pacers_rate(tmp_path: Path):
    runs = [
        run(Pacer(every_s=0.0, fastest_s=0.0), tmp_path),  # every round
        run(Pacer(every_s=3600.0, fastest_s=3600.0), tmp_path),
    ]  # seldom
    pieces = [[m for m in posted if isinstance(m, AnswerPieces)] for posted in runs]
    ticks = [[m for m in posted if isinstance(m, AnswerTick)] for posted in runs]
    rounds = len(ticks[0])
    assert rounds > 10
    # the first token at once, the first round, then the rest at the end
    assert len(pieces[1]) == 3 and len(ticks[1]) == 1
    for shown in pieces:
        assert "".join(text for m in shown for text, _ in m.runs) == REPLY
        assert sum(m.tokens for m in shown) == len(REPLY.encode())
