"""Token bytes to text as it streams: UTF-8-safe, and never showing part of a stop string."""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    """Feed each emitted token's bytes; get back the text that is safe to show."""

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stops if s]
        self._held = ""  # decoded text that might be the start of a stop string
        self.text = ""  # everything released so far
        self.stopped = False

    def push(self, data: bytes) -> str:
        """Returns newly releasable text; sets `stopped` when a stop string completes."""
        self._held += self._decoder.decode(data)
        hit = min((i for s in self._stops if (i := self._held.find(s)) >= 0), default=-1)
        if hit >= 0:
            self.stopped = True
            return self._release(hit, drop_rest=True)
        return self._release(len(self._held) - self._stop_prefix_len())

    def flush(self) -> str:
        """The end of the answer: release what was held (incomplete bytes become U+FFFD)."""
        self._held += self._decoder.decode(b"", final=True)
        return self._release(len(self._held))

    def _stop_prefix_len(self) -> int:
        """Length of the longest suffix of the held text that begins some stop string."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(self._held)), best, -1):
                if self._held.endswith(s[:n]):
                    best = n
                    break
        return best

    def _release(self, upto: int, drop_rest: bool = False) -> str:
        out, self._held = self._held[:upto], "" if drop_rest else self._held[upto:]
        self.text += out
        return out
