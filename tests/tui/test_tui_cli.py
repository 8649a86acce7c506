"""`localspec chat` options: what wins over the saved settings, and which pair opens."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import assert_one_line_error, localspec

import tui.app
from localspec.cli import build_parser, main
from localspec.cli.chat import pair_loader
from localspec.settings import Settings, save_settings
from tui.pair import PairSpec

pytestmark = pytest.mark.tui


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list:
    """What run_chat was called with, instead of starting the app."""
    calls: list = []
    monkeypatch.setattr(tui.app, "run_chat", lambda *a: calls.append(a) or 0)
    return calls


def test_options_win_over_saved_settings_for_this_run(home: Path, started: list):
    save_settings(Settings(temperature=0.5, max_tokens=100, gamma=3, system_prompt="saved"))
    chat = ["chat", "--demo", "--max-tokens", "7", "--system", "cli", "--reasoning-budget", "64"]
    assert main([*chat, "--reasoning", "off"]) == 0
    ((_, spec, settings, problems),) = started
    assert (settings.max_tokens, settings.system_prompt) == (7, "cli")
    assert (settings.reasoning_budget, settings.reasoning) == (64, "off")
    assert (settings.temperature, settings.gamma) == (0.5, 3)  # not given: as saved
    assert spec.target == "toy-target" and problems == []


def test_no_command_opens_the_chat(started: list, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sys, "argv", ["localspec"])
    monkeypatch.setattr(
        "localspec.cli.chat.pair_loader",
        lambda args, settings: ("loader", PairSpec("t", "d")),
    )
    assert main([]) == 0
    ((_, spec, _, _),) = started
    assert spec.target == "t"


def test_settings_problems_are_passed_to_the_app(home: Path, started: list):
    (home / "settings.toml").write_text("colour = 'red'\n")
    main(["chat", "--demo"])
    assert started[0][3] == ["settings.toml: colour: unknown setting, ignored"]


def test_a_bad_option_is_one_line_before_any_screen():
    r = localspec("chat", "--demo", "--top-p", "2", timeout=60)
    assert_one_line_error(r.returncode, r.stderr, "--top-p must be a number above 0, at most 1")


def test_a_model_named_that_names_nothing_is_one_line_before_any_screen(
    home: Path,
    started: list,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # nothing installed anywhere
    target = tmp_path / "t.gguf"
    assert main(["chat", "--target", "nope"]) == 1
    assert main(["chat", "-t", str(target), "-d", "ngram"]) == 1
    assert main(["chat", "-t", "qwen2.5-coder-1.5b-instruct"]) == 1
    target.write_bytes(b"GGUF")
    assert main(["chat", "-t", str(target), "-d", "nope.gguf"]) == 1
    errors = capsys.readouterr().err.splitlines()
    assert errors[0].startswith("localspec: 'nope' is not a model file, an installed model")
    assert errors[1:] == [
        f"localspec: model file not found: {target}",
        "localspec: qwen2.5-coder-1.5b-instruct is not installed: "
        "run `localspec pull qwen2.5-coder-1.5b-instruct`",
        "localspec: model file not found: nope.gguf",
    ]
    assert started == []


def test_the_chat_takes_only_the_sampling_options_it_uses(capsys: pytest.CaptureFixture):
    """Its settings hold temperature, top-p and the token limit: a sampler option it
    would not pass on is not offered (it was taken and ignored)."""
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["chat", "--top-k", "5"])
    assert exit_.value.code == 2 and "unrecognized arguments: --top-k" in capsys.readouterr().err
    args = build_parser().parse_args(["chat", "--top-p", "0.9"])
    assert (args.top_p, args.temperature, args.max_tokens, args.gamma) == (0.9, None, None, None)


def test_the_pair_opened_first():
    parse = build_parser().parse_args
    spec = pair_loader(parse(["chat", "-t", "t.gguf"]), Settings())[1]
    assert (spec.target, spec.draft) == ("t.gguf", "ngram")
    spec = pair_loader(
        parse(["chat", "-t", "t.gguf", "-d", "d.gguf", "--ctx", "512"]),
        Settings(target="saved.gguf"),
    )[1]
    assert (spec.target, spec.draft, spec.n_ctx) == ("t.gguf", "d.gguf", 512)
    saved = Settings(target="a.gguf", draft="b.gguf")
    spec = pair_loader(parse(["chat"]), saved)[1]
    assert (spec.target, spec.draft) == ("a.gguf", "b.gguf")


def test_the_chat_templates_variables_reach_the_loaded_pair(monkeypatch: pytest.MonkeyPatch):
    from tui.scripted import scripted_session

    monkeypatch.setattr(
        "localspec.session.open_session", lambda config, say: scripted_session("hi")
    )
    args = build_parser().parse_args(
        ["chat", "-t", "t.gguf", "--chat-template-kwargs", '{"enable_thinking": false}']
    )
    load, spec = pair_loader(args, Settings())
    assert load(spec, print).template_kwargs == {"enable_thinking": False}
