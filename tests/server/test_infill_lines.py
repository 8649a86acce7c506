"""A middle's line rule as the text streams (fast: no model): where it re-joins the text
after the cursor, what of the line breaks before that line it keeps, and llama-server's
indentation and time rules; the typed text taken off the middle."""

from dataclasses import replace

import pytest

from localspec.decoding.events import Finished, Piece, Stats
from localspec.decoding.text import TextStream
from localspec.server.infill import InfillLines, Unopened


def middle(text: str, suffix: str, stops: tuple[str, ...] = (), **rule) -> str:
    """The middle served for a model that writes `text` a character at a time (what
    streamed equals the whole)."""
    stream = TextStream(stops, InfillLines(suffix, **rule))
    shown = ""
    for ch in text:
        shown += stream.push(ch.encode())
        if stream.stopped:
            break
    shown += stream.flush()
    assert shown == stream.text
    return shown


@pytest.mark.parametrize(
    ("written", "suffix", "want"),
    [
        # the suffix brings one blank line, the model wrote two: one is the middle's
        ("return a + b\n\n\nprint(a)\n", "\n\nprint(a)\n", "return a + b\n"),
        # as many as the suffix brings: none are the middle's
        ("return a + b\n\nprint(a)\n", "\n\nprint(a)\n", "return a + b"),
        ("return a + b\nprint(a)\n", "\n\nprint(a)\n", "return a + b"),
        # the cursor at the start of the line the suffix re-joins: the breaks are the middle's
        ("    return a\n\nprint(a)\n", "print(a)\n", "    return a\n\n"),
        # re-joined on its last line, ended by the answer's end rather than a newline
        ("return a + b\n\n\nprint(a)", "\n\nprint(a)\n", "return a + b\n"),
        # the first line re-joins: nothing
        ("print(a)\nmore\n", "print(a)\n", ""),
    ],
)
def test_a_middle_that_rejoins_the_suffix_keeps_only_its_own_line_breaks(
    written: str, suffix: str, want: str
):
    shown = middle(written, suffix)
    assert shown == want


def test_blank_lines_wait_for_the_line_after_them():
    stream = TextStream((), InfillLines("\n\nprint(a)\n"))
    assert stream.push(b"x = 1\n") == "x = 1"
    assert stream.push(b"\n") == ""
    assert stream.push(b"y = 2\n") == "\n\ny = 2"


def test_lines_before_a_stop_string_still_pass_the_rule():
    shown = middle("return a\nprint(a)\nSTOP", "\nprint(a)\n", stops=("STOP",))
    assert shown == "return a"
    # (written in one piece: the lines and the stop string arrive in one push)
    stream = TextStream(("STOP",), InfillLines("\nprint(a)\n"))
    assert stream.push(b"return a\nprint(a)\nSTOP") == "return a" and stream.stopped


def test_llama_servers_indentation_and_time_rules_keep_their_line_breaks():
    shown = middle("x = 1\n    y\nz = 2\n", "", n_indent=4)
    assert shown == "x = 1\n    y\n"
    shown = middle("x = 1\n\n    y\n", "", n_indent=4)  # a blank line is left of it
    assert shown == "x = 1\n"
    shown = middle("a\n\nb\nc\n", "", t_max_predict_s=1e-9)
    assert shown == "a\n"


def test_the_client_gets_the_middle_without_the_text_it_typed():
    """The typed text opens the answer (the opening grammar); what is streamed and what
    ends it lose it, a token that runs past it keeps what follows (fast: no model)."""
    pieces = {1: b"   ", 2: b" s", 3: b"elf", 4: b".x"}  # `    se` typed: `elf` runs past it
    cut = Unopened("    se", lambda t: pieces[t])
    shown = [cut.piece(Piece(pieces[t].decode(), t, "target")) for t in pieces]
    assert [p.text if p else None for p in shown] == [None, None, "lf", ".x"]
    done = cut.finished(Finished("    self.x", (1, 2, 3, 4), "eog", Stats()))
    assert (done.text, done.tokens, cut.inside) == ("lf.x", (3, 4), 2)
    # the line rule dropped the typed line: nothing is left of the middle
    assert Unopened("    se", lambda t: pieces[t]).finished(replace(done, text="")).text == ""


def test_lines_the_client_wrote_open_the_middle_unjudged():
    """After Enter the lines written since the layout's prefix open the middle
    (server/anchors.py): left of `n_indent`, or the suffix's own line, they stay, and
    the line after them goes on from the cursor as a middle's first line does."""
    written = "def area(r):\nprint(a)\n"
    shown = middle(
        written + "    return r * r\nz = 2\n", "\nprint(a)\n", n_indent=4, written=written
    )
    assert shown == written + "    return r * r\n"  # z = 2 is left of n_indent
    # without them, the rule judges those lines as the middle's: it ends at the first
    assert middle(written + "    return r * r\n", "\nprint(a)\n", n_indent=4) == "def area(r):\n"
