"""`localspec run` with a thinking model (none is reachable offline: a scripted toy with a
Qwen3's kind of template): the answer alone on stdout, the reasoning on stderr, both in --json."""

from __future__ import annotations

import json

import pytest

from localspec.backends.toy import THINKING_TEMPLATE
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
