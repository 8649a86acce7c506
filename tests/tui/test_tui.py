"""The chat app end to end, driven by Textual's pilot against a scripted pair (the real
engine over toy models) and, once, against the real pair."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console
from textual.css.query import NoMatches

from localspec.backends.base import LoadFailed
from localspec.backends.toy import THINKING_TEMPLATE
from localspec.conversations import ConversationStore
from localspec.settings import Settings, load_settings
from tui.app import ChatApp
from tui.memory import MemoryUse
from tui.pair import PairSpec
from tui.scripted import SPEC, scripted_loader
from tui.widgets import Answer, PromptInput, StatsPanel
from tui.widgets.transcript import ProvenanceView, UserMessage

pytestmark = pytest.mark.tui

REPLY = "The answer is **42**, as everyone knows."
GiB = 1 << 30
FAKE_MEMORY = MemoryUse(process=GiB // 2, used=GiB, total=2 * GiB)


def make_app(
    reply: object = REPLY, token_s: float = 0.0, settings: Settings | None = None, **loader_args
) -> ChatApp:
    return ChatApp(
        scripted_loader(reply, token_s, **loader_args), SPEC, settings, memory=lambda: FAKE_MEMORY
    )


async def until(pilot, condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Let the app run until `condition` holds; a widget it queries that is not mounted
    yet (Textual composes a widget's children after the widget itself) is a "not yet"."""
    deadline = time.monotonic() + timeout
    while not holds(condition):
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)


def holds(condition: Callable[[], bool]) -> bool:
    try:
        return condition()
    except NoMatches:
        return False


async def ready(pilot) -> ChatApp:
    app = pilot.app
    await until(pilot, lambda: app.pair_state != "loading")
    return app


async def send(pilot, text: str) -> None:
    app: ChatApp = pilot.app
    app.query_one(PromptInput).focus()
    await pilot.press(*text)
    await pilot.press("enter")


def answers(app: ChatApp) -> list[Answer]:
    return list(app.query(Answer))


def done(app: ChatApp) -> bool:
    return bool(answers(app)) and answers(app)[-1].status != "streaming"


def plain(static) -> str:
    """What a Static shows, as text."""
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(static.content)
    return console.export_text()


def saved(home: Path) -> list:
    store = ConversationStore(home / "conversations")
    return [store.load(info.id) for info in store.list()]


async def test_an_answer_streams_in_and_is_saved(home: Path):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "What is the answer?")
        await until(pilot, lambda: done(app))
        answer = answers(app)[-1]
        assert answer.status == "done"
        assert answer.text == REPLY
        assert "42" in str(answer.query_one("Markdown").source)
        assert not answer.query_one("Collapsible").display  # no reasoning: no block
        assert answer.summary.startswith("done · ") and "tok/s" in answer.summary
        assert app.query_one(PromptInput).text == ""
        assert not app.generating
        figures = app.query_one(StatsPanel).figures
        assert figures["tokens"] == len(REPLY.encode())
        assert figures["drafted"] > 0
    (conversation,) = saved(home)
    user, assistant = conversation.messages
    assert (user.role, user.content) == ("user", "What is the answer?")
    assert (assistant.content, assistant.stop_reason) == (REPLY, "eog")
    assert {src for _, src in assistant.spans} == {"draft", "target"}
    assert assistant.stats["tokens"] == len(REPLY.encode())


@pytest.mark.parametrize(("width", "shown"), [(40, False), (80, False), (120, True)])
async def test_the_stats_panel_gives_way_on_a_narrow_terminal(width: int, shown: bool):
    """Below 100 columns the stats panel is hidden and the transcript takes the width
    (80 columns left 42 for an answer's code); Ctrl+B shows it, or hides it where it
    shows; the answer's own line keeps its figures either way. Shown on 40 columns, the
    chat keeps a width of its own (the prompt's placeholder wrapped in no columns at all
    was a crash in Textual)."""
    app = make_app()
    async with app.run_test(size=(width, 30)) as pilot:
        await ready(pilot)
        stats, transcript = app.query_one("#stats"), app.query_one("#transcript")
        await pilot.pause()
        assert stats.display is shown
        assert transcript.outer_size.width == width - (stats.outer_size.width if shown else 0)
        await pilot.press("ctrl+b")
        await pilot.pause()
        assert stats.display is not shown
        assert app.query_one("#chat").outer_size.width >= 24
        await send(pilot, "hi")
        await until(pilot, lambda: done(app))
        await pilot.press("ctrl+b")
        await pilot.pause()
        assert stats.display is shown


async def test_shift_enter_and_ctrl_j_start_a_new_line():
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("a", "ctrl+j", "b", "shift+enter", "c")
        assert app.query_one(PromptInput).text == "a\nb\nc"
        assert not answers(app)
        await pilot.press("enter")
        await until(pilot, lambda: done(app))
        assert app.query_one(UserMessage).content.plain == "a\nb\nc"


async def test_escape_stops_the_answer_at_once_and_keeps_it(home: Path):
    # `auto` drafts a repeated word deep and all of it is accepted (17 tokens a pass), so
    # slow passes keep the answer going for seconds, on any machine; the second is short.
    long_reply = "word " * 400
    app = make_app(lambda prompt: "again, briefly" if "again" in prompt else long_reply, 0.2)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "talk")
        await until(pilot, lambda: len(answers(app)[-1].text) > 20)
        await pilot.press("escape")
        answer = answers(app)[-1]
        assert answer.status == "stopped" and answer.has_class("-stopped")
        assert not app.generating, "the input is free at once"
        await until(pilot, lambda: "tokens" in answer.summary)  # the engine's figures follow
        assert answer.summary.startswith("stopped")
        shown = answer.text
        await pilot.pause(0.3)
        assert answer.text == shown, "nothing arrives after the stop"
        assert 20 < len(shown) < len(long_reply)
        await send(pilot, "again")
        await until(pilot, lambda: len(answers(app)) == 2 and done(app), timeout=30)
        assert answers(app)[-1].status == "done"
    (conversation,) = saved(home)
    stopped = conversation.messages[1]
    assert stopped.stop_reason == "cancelled"
    assert stopped.content == shown, "what was shown is what was saved"


async def test_ctrl_n_starts_a_new_conversation(home: Path):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "first")
        await until(pilot, lambda: done(app))
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert not answers(app) and app.query("#welcome")
        await send(pilot, "second")
        await until(pilot, lambda: done(app))
    titles = sorted(c.title for c in saved(home))
    assert titles == ["first", "second"]


async def test_a_saved_conversation_reopens_and_continues(home: Path):
    def reply(prompt: str) -> str:
        return f"I have seen {prompt.count('<|user|>')} user turns."

    app = make_app(reply)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "one")
        await until(pilot, lambda: done(app))
    first = saved(home)[0]

    app = make_app(reply)
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("ctrl+o")
        await until(
            pilot,
            lambda: (
                app.screen.query("OptionList Option, OptionList")
                and app.screen.query_one("OptionList").option_count > 0
            ),
        )
        await pilot.press("enter")
        await until(pilot, lambda: len(answers(app)) == 1)
        assert answers(app)[0].text == "I have seen 1 user turns."
        assert answers(app)[0].status == "done"
        await send(pilot, "two")
        await until(pilot, lambda: len(answers(app)) == 2 and done(app))
        assert answers(app)[-1].text == "I have seen 2 user turns."
    (conversation,) = saved(home)
    assert conversation.id == first.id
    assert [m.content for m in conversation.messages] == [
        "one",
        "I have seen 1 user turns.",
        "two",
        "I have seen 2 user turns.",
    ]


THOUGHT = "The user greets me; I greet back."


async def test_a_thinking_models_reasoning_folds_above_its_answer(home: Path):
    def reply(prompt: str) -> str:
        # the next turn's prompt holds the answers without their reasoning
        turns = prompt.count("<|user|>")
        return f"<think>\n{THOUGHT}\n</think>\n\nHello, turn {turns}!" + (
            " I forgot my thought." if turns > 1 and THOUGHT not in prompt else ""
        )

    app = make_app(reply, template=THINKING_TEMPLATE)
    async with app.run_test(size=(100, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "Hi")
        await until(pilot, lambda: done(app))
        answer = answers(app)[-1]
        block = answer.query_one("Collapsible")
        assert block.display and block.collapsed  # the answer proper began: folded
        assert plain(block.query_one(".answer-reasoning-text")).strip() == THOUGHT
        assert answer.query_one("Markdown").source == "Hello, turn 1!"
        assert answer.text == "Hello, turn 1!"  # the provenance view: the answer proper
        await send(pilot, "Again")
        await until(pilot, lambda: len(answers(app)) == 2 and done(app))
        assert answers(app)[-1].text == "Hello, turn 2! I forgot my thought."
    (conversation,) = saved(home)
    first = conversation.messages[1]
    assert first.content == f"<think>\n{THOUGHT}\n</think>\n\nHello, turn 1!"  # as written

    app = make_app(reply, template=THINKING_TEMPLATE)  # reopened: shown as it streamed
    async with app.run_test(size=(100, 40)) as pilot:
        await ready(pilot)
        app.open_conversation(conversation.id)
        await until(pilot, lambda: len(answers(app)) == 2)
        answer = answers(app)[0]
        await until(pilot, lambda: answer.query_one("Markdown").source != "")
        await until(pilot, lambda: bool(answer.query(".answer-reasoning-text")))
        block = answer.query_one("Collapsible")
        assert block.display and block.collapsed
        assert plain(block.query_one(".answer-reasoning-text")).strip() == THOUGHT
        assert answer.query_one("Markdown").source == "Hello, turn 1!"
        assert answer.text == "Hello, turn 1!"


async def test_settings_apply_to_the_next_answer_and_persist(home: Path):
    app = make_app("a long answer that will be cut short")
    async with app.run_test(size=(120, 45)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.screen.query("#max_tokens"))
        max_tokens = app.screen.query_one("#max_tokens")
        max_tokens.value = "5"
        app.screen.query_one("#drafter").value = "none"
        app.screen.query_one("#reasoning").value = "off"
        app.screen.query_one("#system_prompt").text = "Be brief."
        await pilot.press("ctrl+s")  # save
        await until(pilot, lambda: app.screen is app.screen_stack[0])
        # the scripted model does not think: the switch is said to change nothing
        (thinking,) = [n.message for n in app._notifications if n.title == "Thinking"]
        assert thinking.startswith("toy-target does not think")
        await send(pilot, "go")
        await until(pilot, lambda: done(app))
        answer = answers(app)[-1]
        assert answer.text == "a lon"
        assert answer.summary.startswith("max tokens · 5 tokens")
        assert "nothing drafted" in answer.summary
    settings, problems = load_settings(home / "settings.toml")
    assert problems == []
    assert (settings.max_tokens, settings.drafter, settings.system_prompt) == (
        5,
        "none",
        "Be brief.",
    )
    assert settings.reasoning == "off"


async def test_invalid_settings_are_refused_in_the_form(home: Path):
    app = make_app()
    async with app.run_test(size=(120, 45)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.screen.query("#temperature"))
        app.screen.query_one("#temperature").value = "-3"
        await pilot.click("#save")
        assert app.screen.has_class("-invalid")
        said = plain(app.screen.query_one("#settings-error")).strip()
        assert said == "Temperature must be a number from 0 to 5, not -3"  # as typed
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.screen_stack[0]
    assert not (home / "settings.toml").exists()


async def test_provenance_colours_the_answer_by_source(home: Path):
    # a fixed γ: `auto` times the toy pair's passes, which are noise, and may not draft
    app = make_app(settings=Settings(gamma=3))
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await until(pilot, lambda: done(app))
        view = answers(app)[-1].query_one(ProvenanceView)
        assert not view.display
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert app.has_class("-provenance") and view.display
        assert not answers(app)[-1].query_one("Markdown").display
        text = view.render()
        assert text.plain == REPLY
        styles = {str(span.style) for span in text.spans}
        assert len(styles) == 2, "draft and target runs look different"
        await until(pilot, lambda: load_settings(home / "settings.toml")[0].provenance)


async def test_a_provenance_view_hidden_while_the_answer_streams_shows_all_of_it(home: Path):
    """Hidden, it is not redrawn as pieces arrive; shown again, it has every piece."""
    app = make_app("stream " * 60, token_s=0.02)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await until(pilot, lambda: bool(answers(app)) and bool(answers(app)[-1].text))
        view = answers(app)[-1].query_one(ProvenanceView)
        await pilot.press("ctrl+t")  # shown mid-answer, then hidden again
        await until(pilot, lambda: view.display and bool(view.render().plain))
        await pilot.press("ctrl+t")
        await until(pilot, lambda: done(app))
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert view.display
        assert view.render().plain == "stream " * 60
        assert (
            " ".join(strip.text for strip in view.render_lines(view.region.reset_offset)).split()
            == ["stream"] * 60
        )


async def test_command_palette_runs_the_app_commands():
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"provenance")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await until(pilot, lambda: app.provenance)


async def test_a_pair_that_fails_to_load_is_a_notification():
    app = make_app(fail=LoadFailed("not enough memory for a context of 4096 tokens"))
    async with app.run_test() as pilot:
        await ready(pilot)
        assert app.pair_state == "failed"
        (note,) = app._notifications
        assert note.severity == "error" and "not enough memory" in note.message
        assert "smaller pair" in note.message
        await send(pilot, "hello")
        await pilot.pause()
        assert not answers(app)
        assert app.query_one(PromptInput).text == "hello", "the message is kept"
        assert "No models are loaded" in list(app._notifications)[-1].message


def saying(*lines: str, fail: Exception | None = None):
    """The scripted loader, saying `lines` of what it does as a real load does."""
    inner = scripted_loader(REPLY, fail=fail)

    def loader(spec: PairSpec, say: Callable[[str], None]):
        for line in lines:
            say(line)
        return inner(spec, say)

    return loader


@pytest.mark.parametrize("fail", [None, LoadFailed("not enough memory")])
async def test_what_a_load_is_doing_is_withdrawn_once_it_is_done(fail):
    """A toast left up would cover the stats panel through the first answer (the smoke
    test's TTFT line, on a machine that loads and answers within the toast's 5 s)."""
    loader = saying(
        "making a CPU-fast Q4_0 copy of the draft (once)", "loading the target", fail=fail
    )
    app = ChatApp(loader, SPEC, memory=lambda: FAKE_MEMORY)
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.pause()
        titles = [note.title for note in app._notifications]
        assert "Loading models" not in titles, titles
        assert titles == ([] if fail is None else [f"Could not load {SPEC.label}"])


async def test_a_textual_without_a_withdraw_still_says_what_a_load_is_doing(monkeypatch):
    """The withdraw uses Textual's private notification collection; a Textual without it
    gets the toasts as `notify` gives them (they time out) and loads all the same."""
    monkeypatch.setattr(ChatApp, "can_withdraw_toasts", lambda self: False)
    app = ChatApp(saying("loading the target"), SPEC, memory=lambda: FAKE_MEMORY)
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.pause()
        assert app.pair_state == "ready"
        assert [n.title for n in app._notifications] == ["Loading models"]


async def test_a_full_context_is_a_notification_not_a_crash(home: Path):
    app = make_app(n_ctx=200)
    async with app.run_test() as pilot:
        await ready(pilot)
        prompt = app.query_one(PromptInput)
        prompt.focus()
        prompt.insert("x" * 300)  # pasted: the pilot takes 20 s to press 300 keys
        await pilot.press("enter")
        await until(pilot, lambda: done(app))
        assert answers(app)[-1].status == "error"
        notes = [n for n in app._notifications if n.severity == "error"]
        assert notes and "Ctrl+N" in notes[-1].message
        await pilot.press("ctrl+n")
        await send(pilot, "ok")
        await until(pilot, lambda: done(app))
    assert sorted(c.messages[-1].stop_reason for c in saved(home)) == ["eog", "error"]


async def test_a_conversation_that_outgrows_the_context_goes_on(home: Path):
    """Its oldest turns leave the prompt (once, down to half the context, said in a
    notification); every answer ends as it should, and the file keeps every message."""
    app = make_app(n_ctx=400)
    async with app.run_test() as pilot:
        await ready(pilot)
        for i in range(8):
            await send(pilot, f"q{i}")
            await until(pilot, lambda n=i + 1: done(app) and len(answers(app)) == n)
        assert [a.status for a in answers(app)] == ["done"] * 8
        notes = [n for n in app._notifications if n.title == "Context"]
        # in batches down to half the context, not a turn at a time (each drop re-reads)
        assert 1 <= len(notes) <= 3 and "(400 tokens)" in notes[0].message
        assert app.pair is not None and min(app.pair.windows.values()) > 1
    (conversation,) = saved(home)
    assert len(conversation.messages) == 16


async def test_escape_stops_a_long_prompt_while_it_is_read(home: Path):
    """A long paste stopped before its answer began: the reading stops between chunks of
    512 tokens (a long file takes minutes on a CPU), keeps what it read, and the next
    prompt is answered."""
    app = make_app("Fine.", token_s=0.2)  # 0.2 s a pass: the paste takes 7 passes
    async with app.run_test() as pilot:
        await ready(pilot)
        target = app.pair.base.target if app.pair else None
        assert target is not None
        read = target.decode_calls
        prompt = app.query_one(PromptInput)
        prompt.focus()
        prompt.insert("x" * 3500)
        await pilot.press("enter")
        await until(pilot, lambda: target.decode_calls > read)  # its first chunk is read
        await pilot.press("escape")
        passes = target.decode_calls
        while True:  # until no pass came for three passes' time: the reading stopped
            await pilot.pause(0.6)
            if target.decode_calls == passes:
                break
            passes = target.decode_calls
        assert passes - read < 7, "the paste was read to its end"
        await send(pilot, "ok")
        await until(pilot, lambda: len(answers(app)) == 2 and done(app))
        assert [a.status for a in answers(app)] == ["stopped", "done"]
    stopped = saved(home)[0].messages[1]
    assert stopped.stop_reason == "cancelled" and stopped.content == ""


async def test_stats_panel_shows_speed_acceptance_and_memory():
    # 400 byte tokens: 20 s if auto, timing a loaded machine, settles on plain decoding.
    app = make_app("stream " * 57, token_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        panel = app.query_one(StatsPanel)
        await until(pilot, lambda: panel.rate_now > 0)  # sampled while streaming
        assert panel.has_class("-generating")
        await until(pilot, lambda: done(app), timeout=60)
        assert not panel.has_class("-generating")
        assert panel.query_one("Sparkline").data
        speculation, memory, speed = (
            plain(panel.query_one(f"#stats-{name}")) for name in ("speculation", "memory", "speed")
        )
        assert "accepted" in speculation and "%" in speculation
        assert "TTFT" in speculation and "γ" in speculation
        assert "1.0 GiB / 2.0 GiB" in memory and "512.0 MiB" in memory
        assert "tok/s" in speed
        why = panel.query_one("#stats-why")  # γ auto (the default) says why, in a line
        assert why.display and "plain" in plain(why) and "ms per extra token" in why.tooltip


async def test_exit_while_answering_waits_for_the_round_and_closes_the_pair():
    app = make_app("slow " * 200, token_s=0.02)
    async with app.run_test() as pilot:
        await ready(pilot)
        pair = app.pair
        await send(pilot, "go")
        await until(pilot, lambda: len(answers(app)[-1].text) > 5)
    assert pair is not None and app.pair is None
    await asyncio.sleep(0)


@pytest.mark.real
async def test_one_short_exchange_with_the_real_pair(real_paths, home: Path):
    from localspec.backends.llama import LoadOptions
    from localspec.session import SessionConfig, open_session

    target, draft = map(str, real_paths)
    options = LoadOptions(n_ctx=1024, n_threads=2)

    def load(spec: PairSpec, say):
        return open_session(
            SessionConfig(
                spec.target, spec.draft, gamma="auto", target_load=options, draft_load=options
            ),
            say=say,
        )

    settings = Settings(max_tokens=16, system_prompt="")
    app = ChatApp(load, PairSpec(target, draft), settings, memory=lambda: FAKE_MEMORY)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.pair_state != "loading", timeout=120)
        assert app.pair_state == "ready"
        await send(pilot, "Write a Python function that adds two numbers.")
        await until(pilot, lambda: done(app), timeout=120)
        answer = answers(app)[-1]
        assert answer.status == "done" and answer.text.strip()
        figures = app.query_one(StatsPanel).figures
        assert 0 < figures["tokens"] <= 16 and figures["tokens_per_s"] > 0
    (conversation,) = saved(home)
    assert conversation.messages[-1].content == answer.text


def fake_listing():
    from localspec.models.inventory import PairStatus
    from tui.listing import Listing, ModelRow

    return Listing(
        "no GPU, 8.0 GiB RAM available, 2 CPU cores",
        models=[
            ModelRow("toy-1b", "toy", "target", "Q4_K_M", GiB, True, "CPU"),
            ModelRow("toy-7b", "toy", "target", "Q4_K_M", 4 * GiB, False, "CPU"),
        ],
        pairs=[
            PairStatus("small", "toy-1b", "toy-draft", "Q4_K_M", GiB, 0, "CPU"),
            PairStatus("big", "toy-7b", "toy-draft", "Q4_K_M", 4 * GiB, 4000, "CPU"),
        ],
        planned=PairSpec("toy-1b:Q4_K_M", "toy-draft:Q4_K_M", 2048, 0),
        plan_note="Target: toy-1b, the largest that fits.",
    )


async def test_models_screen_switches_and_downloads_pairs(
    home: Path, monkeypatch: pytest.MonkeyPatch
):
    import threading

    import tui.downloads
    import tui.screens.models

    monkeypatch.setattr(tui.screens.models, "gather", fake_listing)
    downloads = home / "hub"
    downloads.mkdir()
    monkeypatch.setattr(tui.downloads, "download_files", lambda: list(downloads.iterdir()))
    halfway, finish = threading.Event(), threading.Event()

    def fake_pull(pair_id: str, say) -> None:
        say(f"downloading {pair_id}")
        (downloads / "blob.incomplete").write_bytes(b"x" * 2000)
        halfway.set()
        assert finish.wait(20)

    monkeypatch.setattr(tui.downloads, "pull_pair", fake_pull)
    loaded: list[PairSpec] = []
    loader = scripted_loader()

    def load(spec, say):
        loaded.append(spec)
        return loader(spec, say)

    app = ChatApp(load, SPEC, memory=lambda: FAKE_MEMORY)
    async with app.run_test(size=(130, 45)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+l")
        await until(pilot, lambda: getattr(app.screen, "listing", None) is not None)
        screen = app.screen
        await until(pilot, lambda: screen.query_one("#models-pairs").row_count == 2)
        assert app.focused is screen.query_one("#models-pairs")
        await pilot.press("down", "d")  # "big" is not installed: download it
        await until(pilot, halfway.is_set)
        await until(pilot, lambda: app.download is not None and app.download.done == 2000)
        assert screen.has_class("-downloading")
        assert screen.query_one("ProgressBar").percentage == pytest.approx(0.5)
        await pilot.press("escape")  # the download goes on without the screen
        await send(pilot, "still chatting")
        await until(pilot, lambda: done(app))
        finish.set()
        await until(pilot, lambda: app.download.finished)
        assert any("big is ready" in n.message for n in app._notifications)
        await pilot.press("ctrl+l")
        await until(pilot, lambda: getattr(app.screen, "listing", None) is not None)
        await pilot.press("enter")  # "small" is installed: switch to it
        await until(pilot, lambda: len(loaded) == 2 and app.pair_state == "ready")
    assert loaded[1] == PairSpec("toy-1b:Q4_K_M", "toy-draft:Q4_K_M")
    settings, _ = load_settings(home / "settings.toml")
    assert (settings.target, settings.draft) == ("toy-1b:Q4_K_M", "toy-draft:Q4_K_M")


@pytest.mark.parametrize(("width", "narrow"), [(80, True), (110, True), (130, False)])
async def test_the_models_screen_fits_the_terminals_width(home: Path, width: int, narrow: bool):
    """The real catalog: on 80 columns the pairs' TARGET and DRAFT (and the catalog's
    QUANT) are left out rather than scrolled off to the side, and the highlighted pair's
    models are named below its table; on 130 every column is there."""
    from textual.widgets import DataTable

    app = ChatApp(scripted_loader(), SPEC, memory=lambda: FAKE_MEMORY)
    async with app.run_test(size=(width, 40)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+l")
        screen = app.screen
        pairs = screen.query_one("#models-pairs", DataTable)
        await until(pilot, lambda: pairs.row_count > 1)
        await pilot.pause(0.1)
        for table in screen.query(DataTable):
            assert table.virtual_size.width <= table.scrollable_content_region.width, table.id
        labels = [str(c.label) for c in pairs.columns.values()]
        assert ("TARGET" not in labels) is narrow and screen.has_class("-compact") is narrow
        line = screen.query_one("#models-pair-models")
        assert line.display is narrow
        first, second = screen.listing.pairs[:2]  # the catalog's, as gather() read it
        assert str(line.render()) == f"{first.target} + {first.draft}"
        await pilot.press("down")
        assert str(line.render()) == f"{second.target} + {second.draft}"


async def test_a_finished_download_stays_finished(home: Path, monkeypatch: pytest.MonkeyPatch):
    """The progress reader's last update, computed while the download ended, never
    arrives after the end's (it would show the pair downloading again, and refuse the
    next download)."""
    import threading
    import time as clock

    import tui.downloads
    from localspec.models.inventory import PairStatus

    reading = threading.Event()

    def slow_reading(since, files) -> int:  # the download ends while this reads the disk
        reading.set()
        clock.sleep(0.5)
        return 1000

    def pull(pair_id: str, say) -> None:
        assert reading.wait(10)

    monkeypatch.setattr(tui.downloads, "downloaded_bytes", slow_reading)
    monkeypatch.setattr(tui.downloads, "pull_pair", pull)
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        app.start_download(PairStatus("big", "toy-7b", "toy-draft", "Q4_K_M", GiB, 4000, "CPU"))
        await until(pilot, lambda: app.download is not None and app.download.finished)
        await pilot.pause(1.0)  # the reading ends, and would post after the end
        assert app.download.finished and app.download.line == "done"
