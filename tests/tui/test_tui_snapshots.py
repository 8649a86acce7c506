"""Snapshots of the main screens. Everything shown is fixed: a saved conversation with
recorded figures, a fake memory probe, a fake catalog listing, a fixed clock and zone.
Update with `pytest tests/tui/test_tui_snapshots.py --snapshot-update` and review the SVGs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from localspec.conversations import ConversationStore
from tui.app import ChatApp
from tui.memory import GpuMemory, MemoryUse
from tui.scripted import SPEC, scripted_loader

pytestmark = pytest.mark.tui

SIZE = (120, 36)
GiB = 1 << 30
MEMORY = MemoryUse(
    process=2 * GiB,
    used=6 * GiB,
    total=24 * GiB,
    gpus=(GpuMemory(0, "Fake GPU", 3 * GiB, 16 * GiB),),
)
WHEN = 1_700_000_000.0  # 2023-11-14, in UTC
ANSWER = (
    "Use slicing:\n\n```python\ndef reverse(text: str) -> str:\n    return text[::-1]\n```\n\n"
    "It walks the string backwards."
)
SPANS = [
    ("Use slicing:\n\n```python\ndef ", "target"),
    ("reverse(text: str) -> str:", "draft"),
    ("\n    return ", "target"),
    ("text[::-1]\n```\n\n", "draft"),
    ("It walks the string backwards.", "target"),
]
STATS = {
    "tokens": 31,
    "tokens_per_s": 24.5,
    "acceptance_rate": 0.75,
    "accepted": 18,
    "drafted": 24,
    "mean_accepted_len": 2.8,
    "ttft_s": 0.21,
    "gamma": 4,
    "drafter": "draft",
    "speedup": 1.9,
}


@pytest.fixture(autouse=True)
def fixed_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    store = ConversationStore(tmp_path / "conversations")
    with store.create("Reverse a string in Python", conversation_id="c1") as w:
        w.message("user", "Reverse a string in Python")
        w.start_answer()
        for text, src in SPANS:
            w.piece(text, src)
        w.end_answer("eog", STATS)
        w.message("user", "And in Rust?")
        w.start_answer()
        w.piece("In Rust, collect the chars in reverse", "target")
        w.end_answer("cancelled", {"tokens": 8, "tokens_per_s": 20.0})
    with store.create("An older question", conversation_id="c0") as w:
        w.message("user", "An older question")
    os.utime(store.path("c1"), (WHEN, WHEN))
    os.utime(store.path("c0"), (WHEN - 86400, WHEN - 86400))
    yield tmp_path
    monkeypatch.delenv("TZ")
    time.tzset()


def app() -> ChatApp:
    return ChatApp(scripted_loader(), SPEC, memory=lambda: MEMORY)


async def loaded(pilot) -> None:
    # a blinking cursor is drawn or not depending on how long the run took: keep it on
    pilot.app.query_one("#prompt").cursor_blink = False
    while pilot.app.pair_state == "loading" or pilot.app.stats_panel.memory is None:
        await pilot.pause(0.02)


async def reopened(pilot) -> None:
    await loaded(pilot)
    pilot.app.open_conversation("c1")
    while len(pilot.app.query("Answer")) < 2:
        await pilot.pause(0.02)
    await pilot.pause(0.2)


def test_welcome(snap_compare):
    assert snap_compare(app(), terminal_size=SIZE, run_before=loaded)


def test_reopened_conversation_with_stats(snap_compare):
    assert snap_compare(app(), terminal_size=SIZE, run_before=reopened)


def test_provenance_colours(snap_compare):
    async def run_before(pilot) -> None:
        await reopened(pilot)
        await pilot.press("ctrl+t")
        await pilot.pause(0.2)

    assert snap_compare(app(), terminal_size=SIZE, run_before=run_before)


def test_settings_screen(snap_compare):
    async def run_before(pilot) -> None:
        await loaded(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)

    assert snap_compare(app(), terminal_size=(120, 44), run_before=run_before)


def test_conversations_screen(snap_compare):
    async def run_before(pilot) -> None:
        await loaded(pilot)
        await pilot.press("ctrl+o")
        while (
            not pilot.app.screen.query("OptionList")
            or pilot.app.screen.query_one("OptionList").option_count < 2
        ):
            await pilot.pause(0.02)
        await pilot.pause(0.2)

    assert snap_compare(app(), terminal_size=SIZE, run_before=run_before)


def test_models_screen(snap_compare, monkeypatch: pytest.MonkeyPatch):
    from test_tui import fake_listing

    import tui.screens.models

    monkeypatch.setattr(tui.screens.models, "gather", fake_listing)

    async def run_before(pilot) -> None:
        await loaded(pilot)
        await pilot.press("ctrl+l")
        while getattr(pilot.app.screen, "listing", None) is None:
            await pilot.pause(0.02)
        await pilot.pause(0.2)

    assert snap_compare(app(), terminal_size=(130, 40), run_before=run_before)
