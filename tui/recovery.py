"""The chat over rpc-servers outlives a server that stops answering.

llama.cpp aborts the whole process when an RPC server fails mid-answer (docs/rpc.md),
so nothing in the process can carry on. The chat starts itself again instead: the
conversation is on disk as it happened, the answer so far included, so the new process
reopens it, says what happened, and loads the same pair; once the server is back,
Ctrl+R loads it again if that failed.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Protocol

REOPEN = "LOCALSPEC_CHAT_REOPEN"  # the conversation to show after a restart
NOTICE = "LOCALSPEC_CHAT_NOTICE"  # why the chat restarted
RESTARTED_AT = "LOCALSPEC_CHAT_RESTARTED_AT"
MIN_UPTIME_S = 30.0  # a chat that fails again sooner after a restart ends instead: no loop


class Restartable(Protocol):
    conversation_id: str

    @property
    def spec(self): ...  # tui.pair.PairSpec: the pair loaded (or being loaded)


def install(app: Restartable) -> None:
    """On a llama.cpp abort, exec this chat again on `app`'s conversation and pair."""
    from localspec.backends.rpc import set_abort_handler

    set_abort_handler(lambda reason: restart(app, reason))


def restart(app: Restartable, reason: str) -> None:
    """Replace this process with the chat, reopened; returns only when it must not."""
    if time.time() - float(os.environ.get(RESTARTED_AT) or 0) < MIN_UPTIME_S:
        return
    env = dict(os.environ)
    env.update({REOPEN: app.conversation_id, NOTICE: reason, RESTARTED_AT: str(time.time())})
    os.execve(sys.executable, restart_command(sys.argv[1:], app.spec), env)


def restart_command(argv: list[str], spec) -> list[str]:
    """This chat's command line with the pair in use in place of the one it was given
    (so a chat restarted again and again keeps one command line)."""
    pair = ["--target", str(spec.target), "--draft", str(spec.draft)]
    replaced = ["--target", "-t", "--draft", "-d"]
    if spec.n_ctx is not None:
        pair += ["--ctx", str(spec.n_ctx)]
        replaced.append("--ctx")
    return [sys.executable, "-m", "localspec", *without(argv, replaced), *pair]


def without(argv: list[str], options: list[str]) -> list[str]:
    """`argv` less `options` and their values (`--target T`, `--draft=D`, `-tT`)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True  # its value is the next argument
        elif not any(arg.startswith(o + "=" if o.startswith("--") else o) for o in options):
            kept.append(arg)
    return kept


def take_reopen() -> tuple[str | None, str | None]:
    """(conversation to reopen, why) after a restart; (None, None) otherwise. Taken
    once: a later restart sets them again."""
    return os.environ.pop(REOPEN, None), os.environ.pop(NOTICE, None)
