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

    def joint(self, gap: str) -> str:
        """What stays of `gap`, the line breaks (and blank lines) between the last line
        kept and a line dropped: the text after the cursor may bring its own."""
        ...


class TextStream:
    """Feed each emitted token's bytes; get back the text that is safe to show."""

    def __init__(self, stops: Sequence[str] = (), lines: LineRule | None = None) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stops if s]
        self._lines = lines
        self._pushed = False
        self._held = ""  # decoded text that might be the start of a stop string
        # with a line rule: the line break after the last line with text, and blank
        # lines since, held until a line with text follows (or the rule drops it)
        self._gap = ""
        self.text = ""  # everything released so far
        self.stopped = False
        self.stop_string: str | None = None  # the stop string that ended the text

    def push(self, data: bytes) -> str:
        """Returns newly releasable text; sets `stopped` when a stop string completes."""
        if self._lines is not None and not self._pushed:
            self._lines.start()
        self._pushed = True
        self._held += self._decoder.decode(data)
        hits = [(i, s) for s in self._stops if (i := self._held.find(s)) >= 0]
        if hits:
            hit, self.stop_string = min(hits, key=lambda h: h[0])
            self._held = self._held[:hit]
            if self._lines is None:
                self.stopped = True
                return self._release(hit, drop_rest=True)
            out = self._release_lines() + self._release_last_line()
            self.stopped = True
            return out
        if self._lines is not None:
            return self._release_lines()
        return self._release(len(self._held) - self._stop_prefix_len())

    def flush(self) -> str:
        """The end of the answer: release what was held (incomplete bytes become U+FFFD)."""
        self._held += self._decoder.decode(b"", final=True)
        if self._lines is not None:
            return self._release_last_line()
        return self._release(len(self._held))

    def _release_last_line(self) -> str:
        """The last line, ended by the answer's end (or a stop string) rather than a
        newline, as the rule judges it."""
        rule = self._lines
        assert rule is not None
        if self.stopped:
            return ""
        if self._held and rule.check(self.text + self._gap, self._held) == "drop":
            self._held, self._gap = "", rule.joint(self._gap)
        return self._release_gap() + self._release(len(self._held), drop_rest=True)

    def _release_lines(self) -> str:
        """The held lines the rule passes, up to the last newline; the rest stays held
        (a stop string's start among it too)."""
        rule, out = self._lines, ""
        assert rule is not None
        while not self.stopped and (nl := self._held.find("\n")) >= 0:
            line, self._held = self._held[:nl], self._held[nl + 1 :]
            verdict = rule.check(self.text + out + self._gap, line)
            if verdict == "drop":
                out += rule.joint(self._gap)
                self.stopped, self._held, self._gap = True, "", ""
                break
            if line.strip():
                out, self._gap = out + self._gap + line, "\n"
            else:
                self._gap += line + "\n"
            if verdict == "end":
                out += self._gap
                self.stopped, self._held, self._gap = True, "", ""
        # a line may end the answer before it completes (llama-server's indentation)
        before, held = self.text + out + self._gap, self._held
        if not self.stopped and held and rule.check_start(before, held) == "drop":
            out += rule.joint(self._gap)
            self.stopped, self._held, self._gap = True, "", ""
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

    def _release_gap(self) -> str:
        out, self._gap = self._gap, ""
        self.text += out
        return out

    def _release(self, upto: int, drop_rest: bool = False) -> str:
        out, self._held = self._held[:upto], "" if drop_rest else self._held[upto:]
        self.text += out
        return out
