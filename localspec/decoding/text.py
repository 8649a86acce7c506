"""Token bytes to text as it streams: UTF-8-safe, and never showing part of a stop string
(nor, with a line rule, part of a line the rule has not passed)."""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Literal, Protocol

Verdict = Literal["keep", "end", "drop"]  # go on; stop after this line; stop before it


class LineRule(Protocol):
    """Judges each line as it completes (fill-in-the-middle: a middle that re-joins the
    text after the cursor, or has run past its time): the stream holds a line back until
    its newline comes, so a line dropped was never shown."""

    def start(self) -> None:
        """The first token came (a time limit runs from here)."""
        ...

    def check(self, before: str, line: str) -> Verdict:
        """`line` (without its newline) completes after the text `before`."""
        ...

    def check_start(self, before: str, start: str) -> Verdict:
        """The start of a line not yet complete ("drop" ends the answer before it, as
        soon as that is clear, rather than after the whole line is written)."""
        ...


class TextStream:
    """Feed each emitted token's bytes; get back the text that is safe to show."""

    def __init__(self, stops: Sequence[str] = (), lines: LineRule | None = None) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stops if s]
        self._lines = lines
        self._pushed = False
        self._held = ""  # decoded text that might be the start of a stop string
        self.text = ""  # everything released so far
        self.stopped = False

    def push(self, data: bytes) -> str:
        """Returns newly releasable text; sets `stopped` when a stop string completes."""
        if self._lines is not None and not self._pushed:
            self._lines.start()
        self._pushed = True
        self._held += self._decoder.decode(data)
        hit = min((i for s in self._stops if (i := self._held.find(s)) >= 0), default=-1)
        if hit >= 0:
            self.stopped = True
            self._held = self._held[:hit]
            if self._lines is None:
                return self._release(hit, drop_rest=True)
            return self._release_lines() + self._release(len(self._held), drop_rest=True)
        if self._lines is not None:
            return self._release_lines()
        return self._release(len(self._held) - self._stop_prefix_len())

    def flush(self) -> str:
        """The end of the answer: release what was held (incomplete bytes become U+FFFD)."""
        self._held += self._decoder.decode(b"", final=True)
        rule = self._lines
        # the last line, ended by the answer's end rather than a newline
        unended = rule is not None and not self.stopped and self._held
        if unended and rule is not None and rule.check(self.text, self._held) == "drop":
            self._held = ""
        return self._release(len(self._held))

    def _release_lines(self) -> str:
        """The held lines the rule passes, up to the last newline; the rest stays held
        (a stop string's start among it too)."""
        out = ""
        while not self.stopped and (nl := self._held.find("\n")) >= 0:
            line = self._held[:nl]
            verdict = self._lines.check(self.text + out, line) if self._lines else "keep"
            if verdict == "drop":
                self.stopped, self._held = True, ""
                break
            out, self._held = out + line + "\n", self._held[nl + 1 :]
            if verdict == "end":
                self.stopped, self._held = True, ""
        # a line may end the answer before it completes (llama-server's indentation)
        rule, held = self._lines, self._held
        if not self.stopped and held and rule and rule.check_start(self.text + out, held) == "drop":
            self.stopped, self._held = True, ""
        self.text += out
        return out

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
