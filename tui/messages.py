"""What the workers tell the UI: small dataclass messages, posted from their threads.

Every answer message carries the answer's id, so messages from an answer the user has
already left (stopped, or a new conversation) are recognised and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message

from localspec.conversations import Conversation, ConversationInfo
from localspec.decoding.events import Stats
from tui.figures import Speedup
from tui.listing import Listing
from tui.memory import MemoryUse
from tui.pair import LoadedPair, PairSpec


@dataclass
class AnswerPieces(Message):
    """Text emitted since the last message, as (text, source) runs: the rounds since the
    last redraw (see turn.Pacer), or the first token alone (so that it shows at once).
    A source is "draft" or "target" (events.Source), or "reasoning" (tui.reasoning)."""

    answer_id: int
    runs: list[tuple[str, str]]
    tokens: int


@dataclass
class AnswerTick(Message):
    """Figures as of a redraw; a newer tick of the same answer replaces a queued one."""

    answer_id: int
    stats: Stats
    speedup: Speedup | None  # a figure or a range (see figures.speedup)
    why: str = ""  # the adaptive drafter's reason for the round, in a line

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, AnswerTick) and message.answer_id == self.answer_id


@dataclass
class AnswerDone(Message):
    """The answer ended: finished, stopped, or failed (then `error` says why)."""

    answer_id: int
    stop_reason: str
    record: dict[str, Any]  # the figures saved with the answer (see figures.stats_record)
    error: str = ""
    advice: str = ""


@dataclass
class ContextWindow(Message):
    """The conversation outgrew the context: its prompts now leave out the first
    `dropped` messages (after the system prompt) and hold the last `kept`."""

    answer_id: int
    dropped: int
    kept: int
    n_ctx: int


@dataclass
class PairLoading(Message):
    """A step of loading a pair worth telling (a memory back-off)."""

    spec: PairSpec
    line: str


@dataclass
class PairLoaded(Message):
    pair: LoadedPair
    notes: tuple[str, ...] = ()


@dataclass
class PairFailed(Message):
    spec: PairSpec
    error: str
    advice: str


@dataclass
class MemoryUpdate(Message):
    """The latest memory reading; a newer one replaces a queued one."""

    memory: MemoryUse

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, MemoryUpdate)


@dataclass
class ConversationsListed(Message):
    conversations: list[ConversationInfo]


@dataclass
class ConversationOpened(Message):
    conversation: Conversation


@dataclass
class Listed(Message):
    """The models screen's listing (catalog, installed, fits, plan)."""

    listing: Listing


@dataclass(frozen=True)
class Download:
    """A pair being downloaded: how far, and how it ended."""

    pair_id: str
    done: int  # bytes
    total: int
    line: str = ""  # the latest step, as the download tells it
    finished: bool = False
    error: str = ""


@dataclass
class DownloadUpdate(Message):
    """Progress or the end of a download; a newer one replaces a queued progress one
    (never a queued end, which says how it ended)."""

    download: Download

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, DownloadUpdate) and not message.download.finished
