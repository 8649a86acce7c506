"""Saved conversations: one append-only JSON Lines file each, under $LOCALSPEC_HOME.

Each record is one line written with a single `write` on an O_APPEND descriptor, so a
reader sees whole records or a torn last line (skipped). Answers are saved piece by
piece as they stream: a killed process loses nothing already emitted, and since pieces
are fsynced at most `sync_every_s` apart (whole messages at once), a power cut loses at
most that much of the answer being generated.

Records: {"t": "meta", ...} first, then "msg" (a whole message), or "answer" followed by
"piece" records and an "end" record carrying the stop reason and the answer's stats.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.errors import LocalspecError
from localspec.paths import conversations_dir

FORMAT = 1
TITLE_CHARS = 60
INTERRUPTED = "interrupted"  # stop reason of an answer whose file ends mid-way


class ConversationError(LocalspecError):
    """A conversation that cannot be found or read."""


@dataclass(frozen=True)
class StoredMessage:
    role: str  # "system" | "user" | "assistant"
    content: str
    spans: tuple[tuple[str, str], ...] = ()  # assistant: (text, "draft"|"target") runs
    stop_reason: str | None = None  # assistant: how the answer ended
    stats: Mapping[str, Any] = field(default_factory=dict)  # assistant: the answer's figures


@dataclass(frozen=True)
class ConversationInfo:
    id: str
    title: str
    created: float  # Unix time
    updated: float  # the file's modification time
    path: Path


@dataclass(frozen=True)
class Conversation:
    id: str
    title: str
    created: float
    messages: tuple[StoredMessage, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def chat_messages(self) -> list[dict[str, str]]:
        """The messages as a model reads them (empty answers, e.g. stopped at once, left out)."""
        return [{"role": m.role, "content": m.content} for m in self.messages if m.content]


def new_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{secrets.token_hex(3)}"


def title_of(text: str) -> str:
    """A one-line title from a conversation's first message."""
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


class ConversationStore:
    """The conversations directory."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or conversations_dir()

    def path(self, conversation_id: str) -> Path:
        if not conversation_id or "/" in conversation_id or conversation_id.startswith("."):
            raise ConversationError(f"not a conversation id: {conversation_id!r}")
        return self.root / f"{conversation_id}.jsonl"

    def exists(self, conversation_id: str) -> bool:
        return self.path(conversation_id).exists()

    def create(
        self, title: str, conversation_id: str | None = None, **meta: Any
    ) -> ConversationWriter:
        """A new conversation (with a fresh id unless given), its meta record on disk."""
        self.root.mkdir(parents=True, exist_ok=True)
        now = time.time()
        conversation_id = conversation_id or new_id(now)
        if self.exists(conversation_id):
            raise ConversationError(f"conversation {conversation_id!r} exists already")
        writer = ConversationWriter(self.path(conversation_id))
        writer.write(
            {
                "t": "meta",
                "v": FORMAT,
                "id": conversation_id,
                "title": title_of(title),
                "created": now,
                **meta,
            },
            sync=True,
        )
        return writer

    def open(self, conversation_id: str) -> ConversationWriter:
        """Append to an existing conversation."""
        path = self.path(conversation_id)
        if not path.exists():
            raise ConversationError(f"no conversation {conversation_id!r}")
        return ConversationWriter(path)

    def list(self) -> list[ConversationInfo]:
        """All conversations, most recently updated first (reads each file's first line)."""
        infos = []
        for path in self.root.glob("*.jsonl"):
            try:
                with open(path, encoding="utf-8") as f:
                    meta = json.loads(f.readline())
                updated = path.stat().st_mtime
            except (OSError, ValueError):
                continue  # a file being created, or not ours
            if not isinstance(meta, dict) or meta.get("t") != "meta":
                continue
            infos.append(
                ConversationInfo(
                    id=path.stem,
                    title=str(meta.get("title", "")),
                    created=float(meta.get("created", updated)),
                    updated=updated,
                    path=path,
                )
            )
        return sorted(infos, key=lambda i: (i.updated, i.created), reverse=True)

    def load(self, conversation_id: str) -> Conversation:
        path = self.path(conversation_id)
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            raise ConversationError(f"no conversation {conversation_id!r}") from None
        return fold(conversation_id, _records(lines))

    def delete(self, conversation_id: str) -> None:
        self.path(conversation_id).unlink(missing_ok=True)


def _records(lines: list[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn write from a crash
        if isinstance(record, dict):
            yield record


def fold(conversation_id: str, records: Iterator[dict[str, Any]]) -> Conversation:
    """Replay records into messages; an answer without its "end" record was interrupted."""
    meta: dict[str, Any] = {}
    messages: list[StoredMessage] = []
    spans: list[list[str]] | None = None  # the answer being replayed

    def close_answer(stop_reason: str, stats: Mapping[str, Any]) -> None:
        assert spans is not None
        messages.append(
            StoredMessage(
                "assistant",
                "".join(s[0] for s in spans),
                tuple((t, s) for t, s in spans),
                stop_reason,
                stats,
            )
        )

    for r in records:
        kind = r.get("t")
        if kind == "meta" and not meta:
            meta = r
        elif kind == "piece" and spans is not None:
            text, source = str(r.get("text", "")), str(r.get("src", "target"))
            if spans and spans[-1][1] == source:
                spans[-1][0] += text
            elif text:
                spans.append([text, source])
        elif kind == "end" and spans is not None:
            close_answer(str(r.get("stop_reason", "")), dict(r.get("stats") or {}))
            spans = None
        elif kind in ("msg", "answer"):
            if spans is not None:
                close_answer(INTERRUPTED, {})
            spans = [] if kind == "answer" else None
            if kind == "msg":
                messages.append(StoredMessage(str(r.get("role")), str(r.get("content", ""))))
    if spans is not None:
        close_answer(INTERRUPTED, {})
    return Conversation(
        id=conversation_id,
        title=str(meta.get("title", "")),
        created=float(meta.get("created", 0.0)),
        messages=tuple(messages),
        meta={k: v for k, v in meta.items() if k not in ("t", "v", "id", "title", "created")},
    )


class ConversationWriter:
    """Appends records to one conversation file. Not thread-safe: one writer at a time."""

    def __init__(self, path: Path, sync_every_s: float = 0.25) -> None:
        self.path = path
        self.id = path.stem
        self.sync_every_s = sync_every_s
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._synced_at = time.monotonic()
        self._dirty = False
        # A crash mid-write can leave a torn last line: start on a fresh one.
        size = os.fstat(self._fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(self._fd, b"\n")

    def write(self, record: Mapping[str, Any], sync: bool = True) -> None:
        """Append one record in a single write; fsync now, or when `sync_every_s` is due."""
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        self._dirty = True
        if sync or time.monotonic() - self._synced_at >= self.sync_every_s:
            self.sync()

    def sync(self) -> None:
        if self._dirty:
            os.fsync(self._fd)
            self._dirty = False
        self._synced_at = time.monotonic()

    def message(self, role: str, content: str) -> None:
        self.write({"t": "msg", "role": role, "content": content})

    def start_answer(self) -> None:
        self.write({"t": "answer"})

    def piece(self, text: str, source: str) -> None:
        if text:
            self.write({"t": "piece", "text": text, "src": source}, sync=False)

    def end_answer(self, stop_reason: str, stats: Mapping[str, Any]) -> None:
        self.write({"t": "end", "stop_reason": stop_reason, "stats": dict(stats)})

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self.sync()
            finally:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> ConversationWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
