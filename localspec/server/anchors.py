"""Where an editor's next fill-in-the-middle prompt is laid out, so that Enter reads one
line, not the text after the cursor.

A FIM prompt puts the prefix (the lines before the cursor's line) before the suffix (the
text after the cursor). Typing on the cursor's line changes neither: that text opens the
middle (infill.py). Enter does: the line just written joins the prefix, and everything
after it in the prompt, the suffix, is read again at every new line (llama-server's
layout too: ~64 lines for llama.vim, seconds on a laptop's CPU). Laid out at the prefix
of a recent request instead, with the lines written since opening the middle before the
typed text, the prompt is the one a slot already holds, and only those lines are read:
as the middle's forced first tokens, or not at all where the last middle wrote them (the
suggestion accepted line by line: `Engine.recall`).

The written lines are read at every request, the suffix only once on a new layout: once
they outgrow the suffix (in characters), the request is laid out as sent and becomes the
new anchor. That is the ski-rental rule: never more than about twice the reading of the
better choice made knowing when the user stops typing. (In a long file the editor's
window of lines before the cursor moves at each new line, so a layout as sent reads the
whole prompt again: there the anchor saves most, and it is renewed only once the
written lines would squeeze the suffix, MAX_WRITTEN.) An anchor matches a request with
the same other-file chunks and the same text after the cursor whose prefix goes on from
the anchor's by whole lines, its first few lines allowed to have left the editor's
window (llama.vim sends 256 lines before the cursor, so in a long file each new line
pushes one out); the layout keeps them, as the file still does.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

KEPT = 8  # recent layouts (an editor's files, or a few editors)
SLID = 16  # lines an anchor's prefix may have lost at its top (the editor's window)
# characters of written lines, at most: like the typed text, they take their tokens from
# the suffix's budget (a quarter of a batch, 512 tokens: infill.py), which keeps half
MAX_WRITTEN = 1024


@dataclass(frozen=True)
class Anchor:
    key: Hashable  # what comes before the prefix: other files' chunks, a template's text
    prefix: str  # the lines before the cursor's line, as laid out
    suffix: str  # the text after the cursor


@dataclass(frozen=True)
class Placed:
    prefix: str  # lay the prompt out with this prefix
    written: str  # and open the middle with these lines, before the typed text


class Anchors:
    """The recent layouts, most recent last (shared by the server's requests)."""

    def __init__(self) -> None:
        self._recent: deque[Anchor] = deque(maxlen=KEPT)
        self._lock = threading.Lock()  # requests are prepared on a thread pool

    def place(self, key: Hashable, prefix: str, suffix: str) -> Placed:
        """The layout for a request: a recent one its prefix goes on from, or its own."""
        with self._lock:
            for anchor in reversed(self._recent):
                if anchor.key != key or anchor.suffix != suffix:
                    continue
                written = written_after(anchor.prefix, prefix)
                if written is not None and len(written) <= min(len(suffix), MAX_WRITTEN):
                    self._recent.remove(anchor)
                    self._recent.append(anchor)
                    return Placed(anchor.prefix, written)
            self._recent.append(Anchor(key, prefix, suffix))
            return Placed(prefix, "")


def written_after(anchor: str, prefix: str) -> str | None:
    """The whole lines `prefix` has past `anchor`, which it goes on from (its first few
    lines may be gone); None where it does not."""
    start = 0
    for _ in range(SLID + 1):
        kept = anchor[start:]
        if prefix.startswith(kept) and (kept or not anchor):
            written = prefix[len(kept) :]
            return written if not written or written.endswith("\n") else None
        start = anchor.find("\n", start) + 1
        if start == 0:
            return None
    return None
