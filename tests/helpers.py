"""Helpers shared by the test areas: the `localspec` command as a user runs it, what
its errors must look like, the chat in tmux, and the scripts under scripts/."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import httpx
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
# the real pair scripts/setup.sh installs
TARGET_ID = "qwen2.5-coder-1.5b-instruct"
DRAFT_ID = "qwen2.5-coder-0.5b-instruct"


def installed(model_id: str) -> Path:
    """An installed model's file; a missing one fails the test (a set-up step was
    skipped), it never skips it."""
    from localspec.models.resolve import resolve_installed

    try:
        return resolve_installed(model_id)
    except Exception as e:
        pytest.fail(f"{model_id} is not installed ({e}); run ./scripts/setup.sh")


def load_script(name: str) -> ModuleType:
    """scripts/NAME.py as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def localspec(
    *args: str, stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """`localspec ARGS` in a fresh process (the real entry point, with its imports)."""
    return subprocess.run(
        [sys.executable, "-m", "localspec", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(code: int, stderr: str, words: str) -> None:
    """A user's mistake: exit 1 and one `localspec: …` line naming `words`, no traceback."""
    assert code == 1, (code, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localspec: ") and words in lines[0], stderr


def tmux(*args: str) -> str:
    """A tmux command's output (the chat's real-terminal tests)."""
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def wait_for(screen: Callable[[], str], ok: Callable[[str], bool], timeout: float) -> str:
    """The screen once `ok` holds for it; an assertion with the screen after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        text = screen()
        if ok(text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; the screen reads:\n{text}")
        time.sleep(0.5)


def free_port() -> int:
    """A loopback port no one listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(
    base: str, proc: subprocess.Popen, timeout: float, said: Callable[[], str]
) -> None:
    """Until the server at `base` answers /health; an assertion with what it `said` where
    it exits first or `timeout` s pass."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, said()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        assert time.monotonic() < deadline, f"the server did not come up: {said()}"
        time.sleep(0.2)
