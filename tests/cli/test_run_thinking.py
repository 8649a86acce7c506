"""`localspec run` with a thinking model (none is reachable offline: a scripted toy with a
Qwen3's kind of template): the answer alone on stdout, the reasoning on stderr, both in --json."""

from __future__ import annotations

import json

import pytest
from helpers import localspec

from localspec.backends.toy import TEMPLATE, THINKING_TEMPLATE
from localspec.cli import main
from tui.scripted import scripted_session

REPLY = "<think>\nWeighing it up.\n</think>\n\nYes, it is."


@pytest.fixture
def thinker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "localspec.session.open_session",
        lambda config, say: scripted_session(REPLY, template=THINKING_TEMPLATE),
    )


def test_the_answer_goes_to_stdout_and_the_reasoning_to_stderr(thinker, capsys):
    assert main(["run", "Is it?", "--target", "toy.gguf", "--draft", "none"]) == 0
    out, err = capsys.readouterr()
    assert out == "Yes, it is.\n"
    assert "Weighing it up." in err and "<think>" not in err + out


def test_json_has_the_answer_and_its_reasoning_apart(thinker, capsys):
    main(["run", "Is it?", "--target", "toy.gguf", "--draft", "none", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["text"] == "Yes, it is."
    assert result["reasoning"].strip() == "Weighing it up."


def test_raw_completion_shows_the_text_as_written(thinker, capsys):
    main(["run", "<|user|>Is it?\n<|assistant|>", "--raw", "--target", "t.gguf", "--draft", "none"])
    assert capsys.readouterr().out == REPLY + "\n"


def test_a_template_variable_turns_thinking_off(monkeypatch, capsys):
    """Qwen3's template writes an empty block where `enable_thinking` is false: the
    model answers at once."""
    empty = "<think>\n\n</think>\n\nYes, it is."
    monkeypatch.setattr(
        "localspec.session.open_session",
        lambda config, say: scripted_session(empty, template=THINKING_TEMPLATE),
    )
    run = ["run", "Is it?", "--target", "toy.gguf", "--draft", "none", "--json"]
    main([*run, "--chat-template-kwargs", '{"enable_thinking": false}'])
    off = json.loads(capsys.readouterr().out)
    assert (off["text"], off["tokens"]) == ("Yes, it is.", len("Yes, it is."))
    main(run)  # thinking on: the model writes the block itself
    assert json.loads(capsys.readouterr().out)["tokens"] == len(empty)
    main([*run, "--reasoning", "off"])  # llama-server's switch: the same variable
    off = json.loads(capsys.readouterr().out)
    assert (off["text"], off["tokens"]) == ("Yes, it is.", len("Yes, it is."))
    kwargs = ["--chat-template-kwargs", '{"enable_thinking": false}']
    main([*run, *kwargs, "--reasoning", "on"])  # --reasoning wins over the variables
    assert json.loads(capsys.readouterr().out)["tokens"] == len(empty)


@pytest.mark.parametrize(
    ("template", "said"),
    [
        (TEMPLATE, "toy-target does not think (its chat template has no reasoning): thinking"),
        (TEMPLATE + "{# <think> #}", "toy-target's chat template has no switch for thinking"),
        (THINKING_TEMPLATE, None),
        (None, "toy-target does not think"),  # a model for plain completion (--raw)
    ],
    ids=["no reasoning", "no switch", "a switch", "no template"],
)
def test_a_switch_the_template_does_not_have_is_said(monkeypatch, capsys, template, said):
    monkeypatch.setattr(
        "localspec.session.open_session",
        lambda config, say: scripted_session("Yes.", template=template),
    )
    run = ["run", "Is it?", "--target", "t.gguf", "--draft", "none", "--reasoning", "off"]
    assert main([*run, *(["--raw"] if template is None else [])]) == 0
    err = capsys.readouterr().err
    assert (said in err) if said else "thinking" not in err, err


@pytest.mark.parametrize(
    ("value", "words"),
    [("{oops", "not JSON"), ("[1]", "a JSON object"), ('{"messages": 1}', "cannot set messages")],
)
def test_bad_template_variables_are_one_line(value: str, words: str):
    r = localspec("run", "hi", "--target", "x.gguf", "--chat-template-kwargs", value)
    assert r.returncode != 0 and words in r.stderr.splitlines()[-1]
    assert "Traceback" not in r.stderr


def test_a_reasoning_budget_ends_the_reasoning(thinker, capsys):
    run = ["run", "Is it?", "--target", "toy.gguf", "--draft", "none", "--json"]
    main([*run, "--reasoning-budget", "3"])
    result = json.loads(capsys.readouterr().out)
    assert result["reasoning"] == "\nWe", result  # three tokens, then the block's end
    main([*run, "--reasoning-budget", "-1"])  # no limit
    assert json.loads(capsys.readouterr().out)["reasoning"].strip() == "Weighing it up."


def test_a_chat_template_file_replaces_the_ggufs(monkeypatch, capsys, tmp_path):
    """`--chat-template-file` (run and serve, as llama-server's): the target loads with
    that template in place of its GGUF's, and the answer is that template's prompt's."""
    given = []

    def opened(config, say):
        given.append(config)
        return scripted_session(REPLY, template=config.target_load.chat_template)

    monkeypatch.setattr("localspec.session.open_session", opened)
    path = tmp_path / "thinking.jinja"
    path.write_text(THINKING_TEMPLATE, encoding="utf-8")
    run = ["run", "Is it?", "--target", "toy.gguf", "--draft", "none", "--json"]
    assert main([*run, "--chat-template-file", str(path)]) == 0
    assert given[-1].target_load.chat_template == THINKING_TEMPLATE
    assert json.loads(capsys.readouterr().out)["reasoning"].strip() == "Weighing it up."


@pytest.mark.parametrize(
    ("text", "words"),
    [(None, "cannot read"), ("{% for m in messages %}", "line 1: Unexpected end of template")],
)
def test_a_bad_chat_template_file_is_one_line(tmp_path, text: str | None, words: str):
    path = tmp_path / "t.jinja"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    for command in ("run", "serve"):
        r = localspec(
            command, *(["hi"] if command == "run" else []), "--chat-template-file", str(path)
        )
        assert r.returncode != 0 and words in r.stderr.splitlines()[-1], r.stderr
        assert "Traceback" not in r.stderr
