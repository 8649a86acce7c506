"""The conversation store: append-only, crash-tolerant, listed and reopened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localspec.conversations import (
    INTERRUPTED,
    ConversationError,
    ConversationStore,
    title_of,
)


def test_a_conversation_reads_back_as_written(tmp_path: Path):
    store = ConversationStore(tmp_path)
    with store.create("What is 2+2?", target="t.gguf", draft="d.gguf") as w:
        w.message("user", "What is 2+2?")
        w.start_answer()
        for text, src in [("2", "target"), ("+", "draft"), ("2", "draft"), (" is 4", "target")]:
            w.piece(text, src)
        w.end_answer("eog", {"tokens": 4, "tokens_per_s": 9.5})
    conv = store.load(w.id)
    assert conv.title == "What is 2+2?"
    assert conv.meta == {"target": "t.gguf", "draft": "d.gguf"}
    user, answer = conv.messages
    assert (user.role, user.content) == ("user", "What is 2+2?")
    assert answer.content == "2+2 is 4"
    assert answer.spans == (("2", "target"), ("+2", "draft"), (" is 4", "target"))
    assert answer.stop_reason == "eog" and answer.stats["tokens"] == 4
    assert conv.chat_messages() == [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 is 4"},
    ]


def test_reopened_conversations_continue_in_the_same_file(tmp_path: Path):
    store = ConversationStore(tmp_path)
    with store.create("one") as w:
        w.message("user", "one")
    with store.open(w.id) as w2:
        w2.message("user", "two")
    assert [m.content for m in store.load(w.id).messages] == ["one", "two"]
    assert len(list(tmp_path.iterdir())) == 1


def test_list_is_newest_first_with_titles(tmp_path: Path):
    store = ConversationStore(tmp_path)
    ids = []
    for i, title in enumerate(["first", "second  line\nbreak " + "x" * 100]):
        with store.create(title) as w:
            ids.append(w.id)
        os.utime(w.path, (1000 + i, 1000 + i))
    (tmp_path / "junk.jsonl").write_text("not json\n")
    infos = store.list()
    assert [i.id for i in infos] == ids[::-1]
    assert infos[0].title.startswith("second line break x") and len(infos[0].title) == 60
    assert infos[1].title == "first"


def test_a_torn_last_line_is_skipped_and_writing_resumes_on_a_new_line(tmp_path: Path):
    store = ConversationStore(tmp_path)
    with store.create("q") as w:
        w.message("user", "q")
        w.start_answer()
        w.piece("partial", "target")
    with open(w.path, "ab") as f:
        f.write(b'{"t": "piece", "text": "cut of')  # the crash happened mid-write
    conv = store.load(w.id)
    assert conv.messages[-1].content == "partial"
    assert conv.messages[-1].stop_reason == INTERRUPTED
    with store.open(w.id) as w2:
        w2.message("user", "again")
    conv = store.load(w.id)
    assert [m.content for m in conv.messages] == ["q", "partial", "again"]
    assert conv.messages[1].stop_reason == INTERRUPTED


KILLED_WRITER = """
import sys, time
from pathlib import Path
from localspec.conversations import ConversationStore
w = ConversationStore(Path(sys.argv[1])).create("kill me")
w.message("user", "count")
w.start_answer()
for i in range(10_000):
    w.piece(f"{i} ", "draft" if i % 2 else "target")
    print(i, flush=True)  # the piece is on disk before it is reported
    time.sleep(0.01)
"""


def test_a_killed_writer_loses_no_emitted_piece(tmp_path: Path):
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    reported = -1
    deadline = time.monotonic() + 30
    while reported < 20 and time.monotonic() < deadline:
        reported = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (info,) = ConversationStore(tmp_path).list()
    answer = ConversationStore(tmp_path).load(info.id).messages[-1]
    numbers = [int(n) for n in answer.content.split()]
    assert numbers[: reported + 1] == list(range(reported + 1))
    assert answer.stop_reason == INTERRUPTED


def test_bad_ids_are_refused(tmp_path: Path):
    store = ConversationStore(tmp_path)
    for bad in ["", "../x", ".hidden"]:
        with pytest.raises(ConversationError):
            store.path(bad)
    with pytest.raises(ConversationError):
        store.load("20250101-000000-abcdef")


def test_title_is_one_short_line():
    assert title_of("  a\n b\tc  ") == "a b c"
    assert len(title_of("y" * 500)) == 60


def test_create_with_a_chosen_id_once(tmp_path: Path):
    store = ConversationStore(tmp_path)
    assert not store.exists("c1")
    store.create("hello", conversation_id="c1").close()
    assert store.exists("c1") and store.load("c1").title == "hello"
    with pytest.raises(ConversationError):
        store.create("again", conversation_id="c1")
