"""Smoke test: the real `localspec chat` in tmux with the real pair, read off the screen."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from helpers import tmux, wait_for

from localspec.conversations import ConversationStore

pytestmark = [pytest.mark.real, pytest.mark.tui]

PROMPT = "Write a Python function add(a, b) that returns a + b."


def test_chat_answers_in_a_real_terminal(real_paths: tuple[Path, Path], tmp_path: Path):
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed (apt-get install tmux)")
    target, draft = real_paths
    exe = Path(sys.executable).with_name("localspec")
    command = shlex.join(
        [
            str(exe),
            "chat",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--max-tokens",
            "24",
            "--ctx",
            "1024",
            "--threads",
            "2",
        ]
    )
    name = f"localspec-smoke-{uuid.uuid4().hex[:8]}"
    tmux(
        "new-session",
        "-d",
        "-s",
        name,
        "-x",
        "140",
        "-y",
        "45",
        "-e",
        f"LOCALSPEC_HOME={tmp_path}",
        "-e",
        "TERM=xterm-256color",
        # the size the app reads: started from pytest, it laid out 80x24 in this 140x45
        # window (shutil's fallback), where the stats panel this test reads is hidden
        "-e",
        "COLUMNS=140",
        "-e",
        "LINES=45",
        f"{command}; echo EXITED $?; sleep 60",
    )

    def screen() -> str:
        return tmux("capture-pane", "-p", "-t", name)

    try:
        # the stats panel names the pair once it is loaded
        wait_for(screen, lambda s: target.stem in s and "loading" not in s, timeout=120)
        tmux("send-keys", "-t", name, "-l", PROMPT)
        tmux("send-keys", "-t", name, "Enter")
        text = wait_for(
            screen, lambda s: re.search(r"(done|max tokens) · \d+ tokens", s), timeout=120
        )
        assert "def add" in text, text
        assert re.search(r"accepted\s+\d+% \(\d+/\d+\)", text), text
        assert re.search(r"answer\s+\d+\.\d tok/s", text), text
        assert re.search(r"TTFT\s+\d+\.\d\d s", text), text
        assert re.search(r"RAM\s+\d+\.\d GiB / \d+\.\d GiB", text), text
        tmux("send-keys", "-t", name, "C-q")
        text = wait_for(screen, lambda s: "EXITED" in s, timeout=30)
        assert "EXITED 0" in text and "Traceback" not in text, text
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
    (info,) = ConversationStore(tmp_path / "conversations").list()
    messages = ConversationStore(tmp_path / "conversations").load(info.id).messages
    assert messages[0].content == PROMPT and "def add" in messages[1].content
