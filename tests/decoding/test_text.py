from localspec.decoding.text import TextStream


def feed(stream: TextStream, chunks: list[bytes]) -> list[str]:
    return [stream.push(c) for c in chunks]


def test_utf8_split_across_tokens_is_released_whole():
    s = TextStream()
    euro = "€".encode()
    assert feed(s, [b"a", euro[:1], euro[1:2], euro[2:], b"b"]) == ["a", "", "", "€", "b"]


def test_stop_string_is_never_partly_shown():
    s = TextStream(stops=["</end>"])
    out = feed(s, [b"x <", b"/en", b"d> tail"])
    assert out == ["x ", "", ""]
    assert s.stopped and s.text == "x "


def test_held_prefix_is_released_when_it_turns_out_not_to_be_a_stop():
    s = TextStream(stops=["STOP"])
    assert feed(s, [b"ST", b"ART"]) == ["", "START"]
    assert not s.stopped


def test_flush_releases_held_text_and_marks_broken_bytes():
    s = TextStream(stops=["STOP"])
    assert feed(s, [b"x ST", b"\xe2\x82"]) == ["x ", ""]
    assert s.flush() == "ST\ufffd"
