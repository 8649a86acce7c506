"""The chat's restart after llama.cpp aborts (tui/recovery.py): the command it execs,
and the guard that keeps a chat failing at once from restarting forever. The restart
itself is tested for real in tests/backends/test_rpc.py (a server killed mid-answer)."""

from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

import pytest

from tui import recovery
from tui.pair import PairSpec


def test_the_restart_keeps_the_options_and_pins_the_pair():
    spec = PairSpec("/m/t.gguf", "ngram", 2048, None)
    argv = ["chat", "--rpc", "10.0.0.2:50052", "--threads", "4"]
    assert recovery.restart_command(argv, spec) == [
        sys.executable, "-m", "localspec", *argv,
        "--target", "/m/t.gguf", "--draft", "ngram", "--ctx", "2048",
    ]  # fmt: skip


def test_a_chat_restarted_again_keeps_one_pair_on_its_command_line():
    spec = PairSpec("/m/t.gguf", "/m/d.gguf", 4096, None)
    argv = ["chat", "-t", "qwen", "--draft=ngram", "--draft-quant", "keep", "--threads", "4",
            "--ctx", "2048", "-dx"]  # fmt: skip
    first = recovery.restart_command(argv, spec)
    again = recovery.restart_command(first[3:], spec)
    assert first == again == [
        sys.executable, "-m", "localspec", "chat", "--draft-quant", "keep", "--threads", "4",
        "--target", "/m/t.gguf", "--draft", "/m/d.gguf", "--ctx", "4096",
    ]  # fmt: skip
    unsized = PairSpec("/m/t.gguf", "/m/d.gguf", None, None)  # the context as given stays
    assert recovery.restart_command(["--ctx", "2048"], unsized)[3:5] == ["--ctx", "2048"]


def test_a_chat_that_fails_again_soon_after_a_restart_ends(monkeypatch: pytest.MonkeyPatch):
    execs: list[object] = []
    monkeypatch.setattr(os, "execve", lambda *a: execs.append(a))
    app = SimpleNamespace(conversation_id="c1", spec=PairSpec("t", "d", None, None))
    monkeypatch.setenv(recovery.RESTARTED_AT, str(time.time() - 5))
    recovery.restart(app, "an RPC server stopped answering (x)")  # type: ignore[arg-type]
    assert execs == []  # returns: the process ends with its one line
    monkeypatch.setenv(recovery.RESTARTED_AT, str(time.time() - recovery.MIN_UPTIME_S - 1))
    recovery.restart(app, "an RPC server stopped answering (x)")  # type: ignore[arg-type]
    ((_, _, env),) = execs  # type: ignore[misc]
    assert env[recovery.REOPEN] == "c1" and env[recovery.NOTICE].startswith("an RPC server")


def test_the_reopen_is_taken_once(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(recovery.REOPEN, "c1")
    monkeypatch.setenv(recovery.NOTICE, "why")
    assert recovery.take_reopen() == ("c1", "why")
    assert recovery.take_reopen() == (None, None)
