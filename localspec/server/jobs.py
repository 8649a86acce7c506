"""One request's generation as the worker runs it (`Job`), and how it ends where it
fails (`Failed`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from localspec.decoding.engine import GenerationConfig
from localspec.decoding.events import Event, Finished, Stats
from localspec.decoding.prediction import Prediction
from localspec.server.scheduling import SHORT_TOKENS


@dataclass(frozen=True)
class Failed:
    """The request ended with an error while decoding (llama.cpp failed, mostly), or
    was cancelled."""

    message: str


CANCELLED = Failed("cancelled")  # its client left: nobody reads why
SHUTTING_DOWN = Failed("the server is shutting down")
Delivery = list[Event | Failed]


@dataclass(eq=False)
class Job:
    """One request's generation: its prompt, how to generate, and where events go."""

    label: str  # for the log line: "chat", "completion"
    prompt: list[int]
    config: GenerationConfig
    loop: asyncio.AbstractEventLoop
    prediction: list[int] | None = None
    source: list[int] | None = None  # a free draft source of the server's (FIM: the suffix)
    cancel: threading.Event = field(default_factory=threading.Event)
    inbox: asyncio.Queue[Delivery] = field(default_factory=asyncio.Queue)
    predicted: Prediction | None = None  # set when it runs with a prediction
    prediction_tokens: tuple[int, int] = (0, 0)  # (accepted, rejected), once finished
    cached_tokens: int = 0  # of the prompt, found in its slot's cache (not read again)
    middle: bool = False  # fill-in-the-middle
    # One of a request's n answers after the first (OpenAI's `n`): `twin` is the first,
    # whose slot's cache its prompt is copied from once read (`Worker._copy_twin`)
    twin: Job | None = None
    read: threading.Event = field(default_factory=threading.Event)  # prompt read, or ended
    copyable: bool = False  # its slot's cache holds its prompt (its first piece came)
    slot: int | None = None  # the index of the slot it was given
    task: int = -1  # its number among the server's requests (llama-server's id_task)
    stats: Stats | None = None  # its figures as of its last round (GET /slots)

    @property
    def short(self) -> bool:
        """An editor's completion (a middle, or a few tokens), not a chat answer: goes
        first in a full pass."""
        return self.middle or self.config.max_tokens <= SHORT_TOKENS

    def deliver(self, batch: Delivery) -> None:
        """From a slot's thread: hand a batch to the handler's event loop."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody listens
            self.loop.call_soon_threadsafe(self.inbox.put_nowait, batch)

    async def events(self) -> AsyncIterator[Event | Failed]:
        """The events as they come, until Finished or Failed."""
        while True:
            for event in await self.inbox.get():
                yield event
                if isinstance(event, Finished | Failed):
                    return
