"""How serve stops, without models: the first Ctrl-C asks the worker to end its answers,
a second exits at once (the real server's first Ctrl-C: test_server_real.py)."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import uvicorn

from localspec.server.shutdown import Server


class Answers:
    """The worker, as far as stopping goes."""

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def stop_answers(self) -> None:
        self.stopped.set()


def test_the_first_ctrl_c_ends_the_answers_and_a_second_exits_at_once(monkeypatch, capsys):
    def exit_now(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_now)
    worker = Answers()
    server = Server(uvicorn.Config(app=None), worker)  # type: ignore[arg-type]
    server.handle_exit(signal.SIGINT, None)
    assert worker.stopped.wait(5) and server.should_exit and not server.force_exit
    with pytest.raises(SystemExit) as exited:
        server.handle_exit(signal.SIGINT, None)
    assert exited.value.code == 130
    assert "stopped without waiting for the answers" in capsys.readouterr().err
