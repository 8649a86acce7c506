"""Where an editor's next middle is laid out (server/anchors.py; fast: no model): at a
recent middle's prefix where the request's goes on from it by whole lines, until those
lines outgrow the text after the cursor."""

from localspec.server.anchors import SLID, Anchors, Placed, written_after

PREFIX = "".join(f"line {i}\n" for i in range(40))
SUFFIX = "    return x\n\n\ndef after():\n    pass\n"
EXTRA = (("other.py", "def helper():\n    pass\n"),)


def test_enter_lays_the_next_middle_out_at_the_last_ones_prefix():
    anchors = Anchors()
    assert anchors.place(EXTRA, PREFIX, SUFFIX) == Placed(PREFIX, "")  # its own, remembered
    first = "    x = compute()\n"
    assert anchors.place(EXTRA, PREFIX + first, SUFFIX) == Placed(PREFIX, first)
    second = first + "    x += 1\n"
    assert anchors.place(EXTRA, PREFIX + second, SUFFIX) == Placed(PREFIX, second)
    # a keystroke back (the line deleted again): the prefix itself
    assert anchors.place(EXTRA, PREFIX, SUFFIX) == Placed(PREFIX, "")


def test_only_the_same_context_and_the_same_text_after_the_cursor_match():
    anchors = Anchors()
    anchors.place(EXTRA, PREFIX, SUFFIX)
    line = "    y = 2\n"
    assert anchors.place((), PREFIX + line, SUFFIX) == Placed(PREFIX + line, "")
    assert anchors.place(EXTRA, PREFIX + line, SUFFIX + "# more\n").written == ""
    edited = PREFIX.replace("line 3\n", "line three\n")  # a line above changed
    assert anchors.place(EXTRA, edited + line, SUFFIX) == Placed(edited + line, "")


def test_lines_gone_from_the_top_of_the_editors_window_are_kept():
    """llama.vim sends a window of lines before the cursor: in a long file each new line
    pushes the first out. The layout keeps them, as the file does."""
    anchors = Anchors()
    anchors.place(EXTRA, PREFIX, SUFFIX)
    slid = PREFIX.split("\n", 1)[1] + "    z = 3\n"
    assert anchors.place(EXTRA, slid, SUFFIX) == Placed(PREFIX, "    z = 3\n")
    far = "".join(PREFIX.splitlines(keepends=True)[SLID + 1 :]) + "    z = 3\n"
    assert anchors.place(EXTRA, far, SUFFIX) == Placed(far, "")


def test_written_lines_that_outgrow_the_suffix_make_a_new_layout():
    """Read at every request, they cost more than reading the suffix once again."""
    anchors = Anchors()
    anchors.place(EXTRA, PREFIX, SUFFIX)
    long = "    total = 0\n" * (len(SUFFIX) // 14 + 1)
    assert anchors.place(EXTRA, PREFIX + long, SUFFIX) == Placed(PREFIX + long, "")
    more = "    total += 1\n"
    assert anchors.place(EXTRA, PREFIX + long + more, SUFFIX) == Placed(PREFIX + long, more)


def test_written_after_takes_whole_lines_only():
    assert written_after("a\nb\n", "a\nb\nc\n") == "c\n"
    assert written_after("a\nb\n", "a\nb\nc") is None  # not how a prefix ends
    assert written_after("a\nb\n", "b\nc\n") == "c\n"  # the first line gone
    assert written_after("a\nb\n", "x\n") is None
    assert written_after("", "a\n") == "a\n"
