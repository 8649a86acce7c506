"""The one thread that decodes: requests wait in a queue and run one at a time, in
arrival order, through the engine's event iterator (as the chat runs a turn).

Events reach the request's handler on the server's event loop in batches, one per
round (and the first piece at once: that is the TTFT). A request whose client has gone
sets its `cancel`: the engine stops within the round, or the request is skipped while
it waits. The engine's caches keep the longest prefix the next prompt shares with the
last, so an editor that resends the whole chat each turn reads only the new part.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from localspec.decoding.adaptive import AdaptiveDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Event, Finished, Piece, RoundEnd, Stats
from localspec.decoding.prediction import Prediction, PredictionDrafter, prediction_usage
from localspec.drafting import GAMMA_MAX
from localspec.server.errors import ApiError
from localspec.server.metrics import Metrics
from localspec.session import Session

log = logging.getLogger("localspec.server")


@dataclass(frozen=True)
class Failed:
    """The request ended with an error while decoding (llama.cpp failed, mostly)."""

    message: str


Delivery = list[Event | Failed]


@dataclass
class Job:
    """One request's generation: its prompt, how to generate, and where events go."""

    label: str  # for the log line: "chat", "completion"
    prompt: list[int]
    config: GenerationConfig
    loop: asyncio.AbstractEventLoop
    prediction: list[int] | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    inbox: asyncio.Queue[Delivery] = field(default_factory=asyncio.Queue)
    predicted: Prediction | None = None  # set when it runs with a prediction
    prediction_tokens: tuple[int, int] = (0, 0)  # (accepted, rejected), once finished

    def deliver(self, batch: Delivery) -> None:
        """From the worker thread: hand a batch to the handler's event loop."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody listens
            self.loop.call_soon_threadsafe(self.inbox.put_nowait, batch)

    async def events(self) -> AsyncIterator[Event | Failed]:
        """The events as they come, until Finished or Failed."""
        while True:
            for event in await self.inbox.get():
                yield event
                if isinstance(event, Finished | Failed):
                    return


class Worker:
    def __init__(self, session: Session, max_queue: int = 16) -> None:
        self.session = session
        self.max_queue = max_queue
        self.metrics = Metrics(self.depth)
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._waiting = 0  # submitted, not yet started
        self._running = False
        self._lock = threading.Lock()
        self._mean_s = 1.0  # moving average of a request's decoding time, for Retry-After
        self._thread = threading.Thread(target=self._run, name="localspec-decode", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)

    def depth(self) -> int:
        """Requests waiting or being decoded."""
        return self._waiting + self._running

    def submit(self, job: Job) -> None:
        """Queue `job`, or a 429 where `max_queue` requests already wait."""
        with self._lock:
            if self._waiting >= self.max_queue:
                retry = max(1, math.ceil(self._mean_s * (self._waiting + 1)))
                raise ApiError(
                    429,
                    f"{self._waiting} requests are waiting; try again in {retry} s",
                    code="queue_full",
                    headers={"Retry-After": str(retry)},
                )
            self._waiting += 1
        self._jobs.put(job)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting -= 1
                self._running = True
            try:
                if job.cancel.is_set():  # its client left while it waited
                    job.deliver([Failed("cancelled")])
                    continue
                started = time.perf_counter()
                self._decode(job)
                self._mean_s += 0.2 * (time.perf_counter() - started - self._mean_s)
            finally:
                self._running = False

    def _decode(self, job: Job) -> None:
        engine = self._engine_for(job)
        batch: Delivery = []
        sent_first = finished = False
        with self.session.lock:
            events = engine.generate(job.prompt, job.config, job.cancel)
            try:
                for event in events:
                    batch.append(event)
                    if isinstance(event, Finished):
                        finished = True
                        self._observe(job, event)
                    if isinstance(event, RoundEnd | Finished) or not sent_first:
                        sent_first = sent_first or isinstance(event, Piece)
                        job.deliver(batch)
                        batch = []
                    if job.cancel.is_set() and not isinstance(event, Finished):
                        break  # the client left: nothing after this round
            except Exception as e:  # a failed decode: the caches were reset, go on serving
                log.warning("request failed: %s", e)
                job.deliver([*batch, Failed(str(e) or type(e).__name__)])
                return
            finally:
                close = getattr(events, "close", None)  # a generator: closing stops the engine
                if close is not None:
                    close()
                if isinstance(self.session.drafter, AdaptiveDrafter):
                    self.session.drafter.predict(None)
        if not finished:
            job.deliver([*batch, Failed("cancelled")])
            log.info("%s cancelled: the client left", job.label)

    def _engine_for(self, job: Job) -> Engine:
        """The session's engine; with a prediction, told of it (or, for a fixed γ, one
        whose drafter tries the prediction first)."""
        engine = self.session.engine
        if not job.prediction:
            return engine
        job.predicted = Prediction(job.prediction, len(job.prompt))
        if isinstance(engine.drafter, AdaptiveDrafter):
            engine.drafter.predict(job.predicted)
            return engine
        drafter = PredictionDrafter(job.predicted, engine.drafter)
        return Engine(engine.target, drafter, engine.gamma or GAMMA_MAX)

    def _observe(self, job: Job, done: Finished) -> None:
        if job.prediction:
            job.prediction_tokens = prediction_usage(job.prediction, done.tokens)
        accepted, rejected = job.prediction_tokens
        self.metrics.observe_answer(done.stats, len(done.tokens), accepted, rejected)
        log.info("%s: %s", job.label, self.describe(done.stats, done.stop_reason))

    def describe(self, s: Stats, stop_reason: str) -> str:
        """The request's log line: tokens, speed, TTFT, acceptance, drafter, speedup."""
        line = (
            f"{s.tokens} tokens ({stop_reason}), {s.tokens_per_s:.1f} tok/s, "
            f"TTFT {s.ttft_s:.2f}s, acceptance {s.acceptance_rate:.0%} "
            f"({s.accepted}/{s.drafted}), drafter {s.drafter or 'none'}"
        )
        if (plain := self.plain_round_s()) and s.tokens_per_s:
            line += f", ≈{s.tokens_per_s * plain:.2f}x plain decoding"
        return line

    def plain_round_s(self) -> float:
        """The target's time for one plain round, as `auto` measured it (0: unknown)."""
        drafter = self.session.drafter
        return drafter.verify.a if isinstance(drafter, AdaptiveDrafter) else 0.0
