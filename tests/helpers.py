"""Helpers shared by the test areas: the `localspec` command as a user runs it, and what
its errors must look like."""

from __future__ import annotations

import subprocess
import sys


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
