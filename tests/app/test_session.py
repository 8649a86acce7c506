"""Loading a pair: the back-off when llama.cpp cannot allocate what was planned."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec import session as session_mod
from localspec.backends.base import LoadFailed
from localspec.backends.llama import LoadOptions
from localspec.backends.toy import ToyModel
from localspec.session import SessionConfig, backoff, open_session

CONFIG = SessionConfig(target="t.gguf", draft="d.gguf", target_load=LoadOptions(n_ctx=8192))


def test_backoff_shrinks_context_then_layers_then_drops_the_draft(monkeypatch):
    monkeypatch.setattr(session_mod, "supports_gpu_offload", lambda: True)
    steps = list(backoff(replace_layers(CONFIG, 8)))
    contexts = [c.target_load.n_ctx for c, _ in steps]
    assert contexts[:4] == [8192, 4096, 2048, 1024]
    layers = [c.target_load.n_gpu_layers for c, _ in steps[4:-1]]
    assert layers == [4, 2, 1, 0]
    assert steps[-1][0].draft == "ngram"
    assert all(c.draft_load.n_ctx == c.target_load.n_ctx for c, _ in steps[1:])


def test_open_session_retries_and_says_why(monkeypatch):
    monkeypatch.setattr(session_mod, "supports_gpu_offload", lambda: False)
    tried = []

    def fake_load(config):
        tried.append(config.target_load.n_ctx)
        if config.target_load.n_ctx > 2048:
            raise LoadFailed(f"not enough memory for a context of {config.target_load.n_ctx}")
        return session_mod.Session.__new__(session_mod.Session)

    monkeypatch.setattr(session_mod, "_load", fake_load)
    monkeypatch.setattr(session_mod.Session, "notes", [], raising=False)
    said = []
    open_session(CONFIG, say=said.append)
    assert tried == [8192, 4096, 2048]
    assert said[-1].endswith("retrying with a context of 2048 tokens")


def test_open_session_gives_the_last_failure_when_nothing_fits(monkeypatch):
    monkeypatch.setattr(session_mod, "supports_gpu_offload", lambda: False)

    def never(config):
        raise LoadFailed("out of memory")

    monkeypatch.setattr(session_mod, "_load", never)
    with pytest.raises(LoadFailed, match="out of memory"):
        open_session(CONFIG)


def replace_layers(config: SessionConfig, layers: int) -> SessionConfig:
    from dataclasses import replace

    return replace(config, target_load=replace(config.target_load, n_gpu_layers=layers))


def test_open_session_skips_contexts_that_would_be_capped_to_the_one_that_failed(monkeypatch):
    """`--ctx 16M` on a model trained for 32k is capped to 32k: when that does not fit,
    halving to 8M, 4M, ... would load the same 32k context again."""
    monkeypatch.setattr(session_mod, "supports_gpu_offload", lambda: False)
    huge = SessionConfig(target="t.gguf", draft="d.gguf", target_load=LoadOptions(n_ctx=1 << 24))
    tried = []

    def capped_load(config):
        n_ctx = min(config.target_load.n_ctx, 32768)
        tried.append(config.target_load.n_ctx)
        if n_ctx > 8192:
            raise LoadFailed(f"not enough memory for a context of {n_ctx} tokens", n_ctx)
        return session_mod.Session.__new__(session_mod.Session)

    monkeypatch.setattr(session_mod, "_load", capped_load)
    monkeypatch.setattr(session_mod.Session, "notes", [], raising=False)
    said = []
    open_session(huge, say=said.append)
    assert tried == [1 << 24, 16384, 8192]
    assert said == [
        "not enough memory for a context of 32768 tokens; retrying with a context of 16384 tokens",
        "not enough memory for a context of 16384 tokens; retrying with a context of 8192 tokens",
    ]


TEMPLATES = Path(__file__).parent.parent / "data/templates"


class Hybridish(ToyModel):
    """A toy whose cache, like a recurrent state, drops at most a few tokens."""

    @property
    def cut_depth(self) -> int | None:
        return 4


@pytest.mark.parametrize("template", ["toy", *sorted(p.name for p in TEMPLATES.glob("*.jinja"))])
def test_a_chats_marks_are_where_its_first_and_last_user_messages_begin(template: str) -> None:
    """Each chat template writes its own headers (a system prompt folded into the first
    user turn, harmony's channels): the marks fall a token before the first and the last
    user message's content, wherever the template puts it; none for a model that cuts
    its cache anywhere."""
    from localspec.backends.toy import TEMPLATE, scripted
    from localspec.decoding.adaptive import auto_engine
    from localspec.session import Session

    source = TEMPLATE if template == "toy" else (TEMPLATES / template).read_text()
    messages = [
        {"role": "system", "content": "You review code. " * 8},
        {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": "An answer."},
        {"role": "user", "content": "Second question?"},
    ]
    for model, marked in (
        (Hybridish(scripted("x"), template=source), True),
        (ToyModel(scripted("x"), template=source), False),
    ):
        session = Session(auto_engine(model, None))
        text = session.prompt_text(messages)
        tokens = model.tokenize(text)
        first, last = text.index("First question?"), text.rindex("Second question?")
        want = (len(text[:first].encode()) - 1, len(text[:last].encode()) - 1)
        assert session.message_marks(messages, text, tokens) == (want if marked else ())


def test_an_agents_task_is_marked_where_the_user_asked_it() -> None:
    """After an agent's tool calls and results, the marks are the first message's start,
    where the task's own prompt (the last from the user) kept its copy (4 tokens before
    its end, past the task's words: a thinking model's template renders what follows it
    otherwise once the next task comes) and the last result's start."""
    from localspec.backends.toy import TEMPLATE, scripted
    from localspec.decoding.adaptive import auto_engine
    from localspec.session import Session

    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    messages = [
        {"role": "system", "content": "You edit code. " * 8},
        {"role": "user", "content": "Hello there."},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "def f(): return 1"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "def g(): return 2"},
    ]
    model = Hybridish(scripted("x"), template=TEMPLATE)
    session = Session(auto_engine(model, None))
    text = session.prompt_text(messages)
    starts = [text.index(needle) for needle in ("Hello", "def g")]
    want = [len(text[:at].encode()) - 1 for at in starts]
    task = session.prompt_text(messages[:4])  # the prompt the task was asked in
    assert task.endswith("Fix the bug.\n<|assistant|>") and text.startswith(task)
    want.insert(1, len(task.encode()) - 4)
    assert session.message_marks(messages, text, model.tokenize(text)) == tuple(want)
