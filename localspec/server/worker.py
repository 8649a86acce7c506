"""The slots that decode: each request runs in a slot of its own, through the engine's
event iterator (as the chat runs a turn), beside the others.

A slot is one sequence of each model's shared context (its own KV cache), an engine
over views of it (its own drafter statistics and suffix index) and a thread; the slots'
model calls meet in one llama.cpp pass per step (batching.py). A new request goes to the
idle slot whose cache shares most with it, or waits (at most `max_queue` of them) for
one to free. Events reach the request's handler on the server's event loop in batches,
one per round (and the first piece at once: that is the TTFT).

A request whose client has gone is cancelled: waiting, it leaves the queue at once;
decoding, its slot stops within the round (a prompt between chunks) and is free. When
the server stops (Ctrl-C), every request is cancelled so, and its client told why.

A request's n answers (OpenAI's `n`) are jobs of their own, each in a slot; those after
the first copy the prompt from the first's slot once it is read, instead of reading it
again (as llama-server's child slots do).

A slot about to give up most of its cache for a new prompt keeps it in RAM first
(`--cache-ram`, prompt_cache.py), and a request that continues a prompt kept there gets
it back instead of reading it again.

An idle slot's draft model reads ahead what the slot's cache holds, a chunk at a time,
while no request waits or decodes: an editor's next completion shares most of the last
one's prompt, which the draft model would otherwise read within it.

Embedding requests take no slot: their texts are read in a context of their own, a
chunk after each of the slots' target passes (batching.py). With one slot, whose passes
do not go through the batcher, they wait while it decodes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import queue
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Future
from typing import cast

import numpy as np

from localspec.backends.base import Cancelled, Model, common_prefix, moves
from localspec.backends.embedding import Embedder, embed_all
from localspec.backends.llama import LlamaModel
from localspec.backends.mtp import MtpHead
from localspec.decoding.adaptive import AdaptiveDrafter
from localspec.decoding.engine import Engine
from localspec.decoding.estimates import VerifyCost
from localspec.decoding.events import Finished, Piece, RoundEnd
from localspec.decoding.load import Load
from localspec.decoding.prediction import Prediction, PredictionDrafter, prediction_usage
from localspec.drafting import GAMMA_MAX
from localspec.server.batching import Batcher, SlotHead, SlotModel
from localspec.server.errors import ApiError
from localspec.server.jobs import CANCELLED, SHUTTING_DOWN, Delivery, Failed, Job
from localspec.server.metrics import Metrics, answer_line
from localspec.server.prompt_cache import HeadCache, Holder, PromptCache, Saved
from localspec.server.scheduling import dearer, pick_slot, plan_swap, read_ahead_chunk
from localspec.session import Session

log = logging.getLogger("localspec.server")


class Slot:
    """One sequence of the pair: its engine over views of that sequence (none where the
    slot runs the session's own engine), the job it runs (None: idle), and the inbox its
    thread (the worker's) takes jobs from."""

    def __init__(
        self, index: int, engine: Engine, views: list[SlotModel], models: list[Model]
    ) -> None:
        self.index = index
        self.engine = engine
        self.views = views
        self.models = models  # whose caches it holds: the target's, the draft model's
        self.holders: list[Holder] = list(models)  # with an MTP head's, kept in RAM with them
        self.job: Job | None = None
        # its draft model may read ahead (set as its job ends, so that no one sees the
        # slot idle before its reading ahead begins; cleared once it has nothing to read)
        self.reading_ahead = False
        self.read_chunk = 16  # tokens it reads ahead at a time (`read_ahead_chunk`)
        self.last_used = 0.0
        self.last: Job | None = None  # the job it ran before (GET /slots tells of it)
        self.held = False  # a chore of a request's has its cache (`Worker.holding`)
        self.inbox: queue.Queue[Job | None] = queue.Queue()

    @property
    def cached(self) -> list[int]:
        return self.engine.target.cached

    @property
    def idle(self) -> bool:
        return self.job is None and not self.held

    def take(self, job: Job | None) -> None:
        """Run `job` next (None: the slot's own reading ahead): its cancel reaches the
        models' reading (the views' shared passes, or the session's own models' chunks
        where this is the one slot), its length the shared passes."""
        cancel, short = (job.cancel, job.short) if job else (threading.Event(), False)
        for model in self.models:
            model.cancel = cancel
        for view in self.views:
            view.short, view.idle = short, job is None


class Worker:
    def __init__(
        self,
        session: Session,
        max_queue: int = 16,
        parallel: int = 1,
        cache_reuse: int = 0,
        cache_ram: int = 0,
    ) -> None:
        self.session = session
        self.max_queue = max_queue
        self.cache_reuse = cache_reuse  # llama-server's --cache-reuse (0: off, exact)
        # llama-server's --cache-ram, in bytes
        self.prompt_cache = cache = PromptCache(cache_ram) if cache_ram > 0 else None
        self.metrics = Metrics(self.depth)
        if cache is not None:
            self.metrics.kept_prompts.set_function(lambda: cache.size)
        self.batcher = Batcher()
        self._embedder: Embedder | None = None  # made at the first embedding request
        self.slots = self._make_slots(parallel)
        self._waiting: list[Job] = []  # submitted, no slot yet; the oldest first
        self._lock = threading.Lock()
        self.stopping = False  # the server is shutting down: every job ends now
        self._mean_s = 1.0  # moving average of a request's decoding time, for Retry-After
        self._tasks = 0  # requests submitted
        self._threads = [
            threading.Thread(target=self._serve, args=(slot,), name=f"localspec-slot{i}")
            for i, slot in enumerate(self.slots)
        ]

    def _make_slots(self, parallel: int) -> list[Slot]:
        """`parallel` slots over views of the shared contexts (which hold as many
        sequences); one over the session's own engine otherwise (one sequence, or a
        target that is not llama.cpp's, as the tests' toy model)."""
        session = self.session
        target, draft = session.target, session.draft_model
        if parallel <= 1 or not isinstance(target, LlamaModel) or target.n_seq < parallel:
            models = [target] if draft is None else [target, draft]
            return [self._with_head(Slot(0, session.engine, [], models))]
        target.reset()
        if draft is not None:
            draft.reset()
        slots = []
        expects: dict[int, list[float] | None] = dict.fromkeys(range(parallel))  # shared
        head = session.head  # drafts for every slot, their steps in shared passes
        drafter = self._drafter()
        for i in range(parallel):
            views = [SlotModel(target, i, self.batcher)]
            if draft is not None:
                views.append(SlotModel(draft, i, self.batcher))
            steps = None if head is None else SlotHead(head, views[0])
            engine = session.engine_for(
                views[0], views[1] if draft is not None else None, head, i, steps
            )
            if isinstance(engine.drafter, AdaptiveDrafter):  # γ follows the load
                engine.drafter.load = Load(
                    functools.partial(self._sharing, i, self.batcher.passes(target)),
                    self.batcher.passes(target),
                    self._drafting,
                    i,
                    expects,
                    None if drafter is None else self.batcher.passes(drafter),
                    splits=not target.kv_unified,
                    yields=functools.partial(self._yields, i, self.batcher.passes(target)),
                )
            slots.append(self._with_head(Slot(i, engine, views, list(views))))
        return slots

    def _giving_way(self, passes: VerifyCost) -> int:
        """Short requests decoding (their first piece sent) beside long ones that give way to
        them, all rounds making the pass (`passes`) dear (`scheduling.dearer`); else 0."""
        jobs = [s.job for s in self.slots if s.job is not None]
        short, n = sum(1 for j in jobs if j.short and j.read.is_set()), len(jobs)
        if not short or short == n or not passes.seconds:
            return 0
        t = passes.table(n)
        return short if dearer(t[n - 1], t[short - 1]) else 0

    def _yields(self, index: int, passes: VerifyCost) -> bool:
        """Whether slot `index`'s long request gives way, drafting nothing (Load.yields)."""
        job = self.slots[index].job
        return job is not None and not job.short and self._giving_way(passes) > 0

    def _sharing(self, index: int, passes: VerifyCost) -> int:
        """Slots whose rounds share slot `index`'s passes (Load.slots): all decoding, or
        for a short request beside long ones that give way, the short ones (the others
        join one step in a few): it drafts as alone."""
        job = self.slots[index].job
        short = self._giving_way(passes) if job is not None and job.short else 0
        return short or self.batcher.load()

    def _with_head(self, slot: Slot) -> Slot:
        """`slot`, its part of a target's own MTP head's cache among what it holds."""
        if (head := self.session.head) is not None and head.own_cache:
            slot.holders.append(HeadCache(head, slot.index))
        return slot

    def embed(self, texts: list[list[int]], cancel: threading.Event) -> Future[list[np.ndarray]]:
        """The texts' embeddings, read beside the slots; dropped between two chunks once
        `cancel` is set."""
        if self.stopping:
            raise ApiError(503, SHUTTING_DOWN.message, code="shutting_down")
        target = self.session.target
        assert isinstance(target, LlamaModel)
        work = self._embeddings(target, texts)
        return cast(Future[list[np.ndarray]], self.batcher.beside(work, target, cancel))

    def _embeddings(
        self, target: LlamaModel, texts: list[list[int]]
    ) -> Generator[int, int, list[np.ndarray]]:
        if self._embedder is None:  # on the passes' thread, as every pass of it
            self._embedder = Embedder(target)
        started = time.perf_counter()
        vectors = yield from embed_all(self._embedder, texts)
        n, tokens = len(texts), sum(len(t) for t in texts)
        took = time.perf_counter() - started
        log.info("embeddings: %d text%s, %d tokens in %.2f s", n, "s" * (n > 1), tokens, took)
        return vectors

    def _drafter(self) -> LlamaModel | MtpHead | None:
        """What the slots draft with in shared passes: the draft model, else an MTP head."""
        session = self.session
        return session.draft_model if session.draft_model is not None else session.head

    def _drafting(self) -> float:
        """Slots drafting in each draft-model (or MTP head) pass, on average."""
        drafter = self._drafter()
        return 1.0 if drafter is None else self.batcher.calls_per_pass(drafter)

    def start(self) -> None:
        for thread in self._threads:
            thread.daemon = True
            thread.start()

    def stop(self) -> None:
        for slot in self.slots:
            slot.inbox.put(None)
            if slot.job is not None:
                slot.job.cancel.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self.batcher.stop()

    def stop_answers(self) -> None:
        """The server is shutting down: waiting jobs leave the queue and running ones stop
        within the round, each with SHUTTING_DOWN for its client; none start after (nor
        does the next pass of any embedding request)."""
        with self._lock:
            self.stopping = True
            waiting, self._waiting = self._waiting, []
            running = [s.job for s in self.slots if s.job is not None]
        self.batcher.cancel_beside()
        for job in [*waiting, *running]:
            job.cancel.set()
        for job in waiting:
            self._end(job, [], " while waiting")

    def _end(self, job: Job, batch: Delivery, where: str = "") -> None:
        """`job` was cancelled: its last events, then why, to its client and the log."""
        job.read.set()  # an answer that would copy its prompt waits no longer
        job.deliver([*batch, SHUTTING_DOWN if self.stopping else CANCELLED])
        why = "the server is shutting down" if self.stopping else "the client left"
        log.info("%s cancelled%s: %s", job.label, where, why)

    def depth(self) -> int:
        """Requests waiting or being decoded."""
        with self._lock:
            return len(self._waiting) + sum(s.job is not None for s in self.slots)

    def jobs(self) -> list[tuple[Slot, Job | None, bool]]:
        """Each slot, the job it runs (else the last it ran; None: none yet), and whether
        it runs one."""
        with self._lock:
            return [(s, s.job or s.last, s.job is not None) for s in self.slots]

    def reading_ahead(self) -> int:
        """Idle slots whose draft model reads ahead: work on no request's behalf, which a
        bench waits for before it times another server."""
        with self._lock:
            return sum(s.reading_ahead for s in self.slots)

    def submit(self, job: Job) -> None:
        """Start `job` in an idle slot, or queue it; a 429 where `max_queue` requests
        already wait (0: no waiting at all), a 503 once the server is shutting down."""
        with self._lock:
            if self.stopping:
                raise ApiError(503, SHUTTING_DOWN.message, code="shutting_down")
            idle = any(s.idle for s in self.slots)
            if not idle and len(self._waiting) >= self.max_queue:
                waiting = len(self._waiting)
                retry = max(1, math.ceil(self._mean_s * (waiting + 1) / len(self.slots)))
                raise ApiError(
                    429,
                    f"all {len(self.slots)} slots are busy and {waiting} requests wait; "
                    f"try again in {retry} s",
                    code="queue_full",
                    headers={"Retry-After": str(retry)},
                )
            job.task, self._tasks = self._tasks, self._tasks + 1
            self._waiting.append(job)
            self._dispatch()

    def withdraw(self, job: Job) -> None:
        """The client left: a waiting job leaves the queue now; a running one stops
        within the round (its slot sees `cancel`)."""
        job.cancel.set()
        with self._lock:
            if job not in self._waiting:
                return
            self._waiting.remove(job)
        self._end(job, [], " while waiting")

    def _dispatch(self) -> None:
        """Waiting jobs to idle slots, the oldest first, each to the slot whose cache
        shares most with its prompt (the lock is held)."""
        while self._waiting:
            idle = {s.index: (s.cached, s.last_used) for s in self.slots if s.idle}
            if not idle:
                return
            job = self._waiting.pop(0)
            slot = self.slots[pick_slot(job.prompt, idle, self._keeps)]
            slot.job, job.slot = job, slot.index
            slot.inbox.put(job)

    @contextlib.contextmanager
    def holding(self, index: int) -> Iterator[Slot]:
        """Slot `index` for a chore of the caller's thread (its cache saved to a file,
        ...), once it is idle and its draft model no longer reads ahead (as llama-server
        defers a slot's action till it is free); no job goes to it meanwhile."""
        slot, claimed = self.slots[index], False
        try:
            while True:
                with self._lock:
                    if self.stopping:
                        raise ApiError(503, SHUTTING_DOWN.message, code="shutting_down")
                    if not claimed and slot.idle:  # no job goes to it, nor does it read ahead
                        slot.held = claimed = True
                    if claimed and not slot.reading_ahead:  # its chunk in flight read
                        break
                time.sleep(0.02)
            yield slot
        finally:
            if claimed:
                with self._lock:
                    slot.held = False
                    self._dispatch()

    def _keeps(self, cached: Sequence[int], prompt: Sequence[int]) -> int:
        """How much of `prompt` a slot's cache keeps: its shared prefix, and the chunks
        --cache-reuse would move."""
        n_past, chunks = moves(cached, prompt, self.cache_reuse)
        return n_past + sum(n for _p, _c, n in chunks)

    def _serve(self, slot: Slot) -> None:
        while (job := self._next_job(slot)) is not None:
            started = time.perf_counter()
            try:
                self._await_twin(job)
                if job.cancel.is_set() or self.stopping:  # as it got the slot
                    self._end(job, [])
                    continue
                slot.take(job)
                with self.batcher.active():
                    self._decode(slot, job)
            finally:
                job.read.set()
                slot.take(None)  # the job's cancel is its own: not left on the models
                with self._lock:
                    self._mean_s += 0.2 * (time.perf_counter() - started - self._mean_s)
                    if slot.job is job:  # not released as it finished (failed, cancelled)
                        self._release(slot)

    def _release(self, slot: Slot) -> None:
        """The slot is free for the next job (under the lock); its draft model may read
        ahead until one comes, so it counts as reading ahead from now on."""
        slot.job, slot.last, slot.last_used = None, slot.job, time.monotonic()
        slot.reading_ahead = True
        self._dispatch()

    def _next_job(self, slot: Slot) -> Job | None:
        """The slot's next job; until it comes, its draft model reads ahead."""
        while slot.inbox.empty() and self._read_ahead(slot):
            pass
        with self._lock:
            slot.reading_ahead = False
        return slot.inbox.get()

    def _read_ahead(self, slot: Slot) -> bool:
        """One chunk of the idle slot's draft model reading what the slot's cache holds,
        while nothing else decodes or waits; False when there is nothing (more) to read."""
        drafter = slot.engine.drafter
        if not isinstance(drafter, AdaptiveDrafter) or self.depth() > 0 or slot.held:
            return False
        slot.take(None)
        try:
            with self.batcher.active():
                started = time.perf_counter()
                left = drafter.read_ahead(slot.cached, slot.read_chunk)
                if left > 0:  # a whole chunk, timed
                    slot.read_chunk = read_ahead_chunk(
                        slot.read_chunk, time.perf_counter() - started
                    )
                return left > 0
        except Exception as e:  # the next request reads it within its rounds instead
            log.warning("reading ahead failed: %s", e)
            return False

    def _swap(self, slot: Slot, job: Job) -> None:
        """Before `job` reads its prompt: the slot's cache kept in RAM where most of it
        would go, and a kept prompt loaded where it keeps more of the job's."""
        if self.prompt_cache is None:
            return
        entries = self.prompt_cache.entries()
        swap = plan_swap(job.prompt, slot.cached, [e.tokens for e in entries], self._keeps)
        if swap.save:
            kept = []
            for holder in slot.holders:
                if (state := holder.save_state()) is None:
                    break
                kept.append((tuple(holder.cached), state))
            else:
                self.prompt_cache.put(Saved(tuple(slot.cached), tuple(kept)))
        if swap.restore is None:
            return
        saved = self.prompt_cache.use(entries[swap.restore])
        pairs = zip(slot.holders, saved.states, strict=True)
        if all(holder.load_state(t, s) for holder, (t, s) in pairs):
            log.info("%s: %d tokens of its prompt back from RAM", job.label, len(saved.tokens))
            self.metrics.prompts_back.inc(len(saved.tokens))
        else:  # no room in a shared cache: read it as if nothing were kept
            for holder in slot.holders:
                holder.reset()

    def _await_twin(self, job: Job) -> None:
        """An answer after the first of a request's n waits, outside the passes, until the
        first has read the prompt it will copy (or has ended)."""
        twin = job.twin
        while twin is not None and not (twin.read.wait(0.05) or job.cancel.is_set()):
            if self.stopping:
                return

    def _copy_twin(self, slot: Slot, job: Job) -> None:
        """The prompt of an answer after the first of a request's n, copied from the
        first's slot, which has read it (~20 ms for 1,000 tokens of the 1.5B here,
        against ~25 s to read them on 2 cores), whether the first still runs there or
        has ended (a short or well-drafted answer may end before this slot is free).
        No pass runs meanwhile: this slot is active and has made no call yet."""
        twin = job.twin
        if twin is None or twin.slot is None or not twin.copyable:
            return
        with self._lock:  # the first's slot keeps its cache while it runs, or idles
            source = self.slots[twin.slot]
            if source is slot or source.job not in (twin, None):
                return
            if common_prefix(source.cached, job.prompt) <= common_prefix(slot.cached, job.prompt):
                return  # this slot holds as much already
            pairs = zip(slot.models, source.models, strict=True)
            copied = [
                mine.copy_from(theirs, job.prompt)
                for mine, theirs in pairs
                if isinstance(mine, SlotModel) and isinstance(theirs, SlotModel)
            ]
        if not copied:
            return
        log.info("%s: %d tokens of its prompt copied from %s", job.label, copied[0], twin.label)

    def _decode(self, slot: Slot, job: Job) -> None:
        self._swap(slot, job)
        self._copy_twin(slot, job)
        engine = self._engine_for(slot.engine, job)
        if self.cache_reuse:  # the draft model reads what moved again, within its window
            engine.target.reuse(job.prompt, self.cache_reuse)
        # the engine reads at least the prompt's last token, for its logits; what it read
        # replaces this once it has (`_observe`), unless it recalled the whole answer
        job.cached_tokens = min(common_prefix(slot.cached, job.prompt), len(job.prompt) - 1)
        batch: Delivery = []
        sent_first = finished = False
        passes = self._passes(slot)
        events = engine.generate(job.prompt, job.config, job.cancel)
        try:
            for event in events:
                batch.append(event)
                if isinstance(event, RoundEnd | Finished):
                    job.stats = event.stats
                if isinstance(event, Finished):
                    finished = True
                    calls, shared = (b - a for a, b in zip(passes, self._passes(slot), strict=True))
                    self._observe(job, event, shared / calls if calls else 0.0)
                    # free before the client hears of it: its next request (the next
                    # keystroke, at once) finds this slot's cache, not another slot's
                    with self._lock:
                        self._release(slot)
                if isinstance(event, RoundEnd | Finished) or not sent_first:
                    sent_first = sent_first or isinstance(event, Piece)
                    job.deliver(batch)
                    batch = []
                    if sent_first and not job.read.is_set():  # its prompt is in the cache
                        job.copyable = True
                        job.read.set()
                if job.cancel.is_set() and not isinstance(event, Finished):
                    break  # the client left: nothing after this round
        except Cancelled:  # its prompt was being read
            pass
        except Exception as e:  # a failed decode: the caches were reset, go on serving
            log.warning("request failed: %s", e)
            job.deliver([*batch, Failed(str(e) or type(e).__name__)])
            return
        finally:
            close = getattr(events, "close", None)  # a generator: closing stops the engine
            if close is not None:
                close()
            if isinstance(slot.engine.drafter, AdaptiveDrafter):
                slot.engine.drafter.predict(None)
                if slot.engine.drafter.load is not None:
                    slot.engine.drafter.load.leave()
        if not finished:
            self._end(job, batch)

    def _engine_for(self, engine: Engine, job: Job) -> Engine:
        """The slot's engine; with a prediction, told of it (or, for a fixed γ, one
        whose drafter tries the prediction first); `auto` told of a free source too."""
        if not job.prediction:
            if job.source and isinstance(engine.drafter, AdaptiveDrafter):
                engine.drafter.predict(Prediction(job.source, len(job.prompt), anchored=False))
            return engine
        job.predicted = Prediction(job.prediction, len(job.prompt))
        if isinstance(engine.drafter, AdaptiveDrafter):
            engine.drafter.predict(job.predicted)
            return engine
        drafter = PredictionDrafter(job.predicted, engine.drafter)
        return Engine(engine.target, drafter, engine.gamma or GAMMA_MAX)

    @staticmethod
    def _passes(slot: Slot) -> tuple[int, int]:
        """The slot's calls to the target so far, and how many shared a pass."""
        target = slot.engine.target
        return (target.calls, target.shared_calls) if isinstance(target, SlotModel) else (0, 0)

    def _observe(self, job: Job, done: Finished, shared: float = 0.0) -> None:
        if done.stats.prompt_cached is not None:  # what it read, not what it shared
            job.cached_tokens = done.stats.prompt_cached
        if job.prediction:
            job.prediction_tokens = prediction_usage(job.prediction, done.tokens)
        accepted, rejected = job.prediction_tokens
        self.metrics.observe_answer(done.stats, len(done.tokens), accepted, rejected)
        line = answer_line(done.stats, done.stop_reason, shared, self.plain_round_s())
        log.info("%s: %s", job.label, line)

    def plain_round_s(self) -> float:
        """The target's time for one plain round, as `auto` measured it (0: unknown)."""
        drafter = self.slots[0].engine.drafter
        return drafter.verify.one if isinstance(drafter, AdaptiveDrafter) else 0.0
