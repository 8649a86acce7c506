"""Several slots' model calls in one llama.cpp pass per step.

Each slot runs the engine's rounds in a thread of its own, exactly as one request runs
alone; its models are `SlotModel`s, views of one sequence of a shared context. A view's
call does not decode: it waits in the `Batcher` until every active slot waits too (each
has finished its round's Python and needs a model again); then the batcher's own thread
runs the step: the draft model's (or MTP head's, `SlotHead`) calls first where there are
any (so that the rounds wait for each other and meet in one target pass), `plan_step`
decides what each call reads, one `decode_parts` pass reads it, and each call whose tokens
are all read gets its logits. A prompt longer than its share goes on in the next step, so
the others' rounds come in between; a call whose client left is dropped between steps.
With one active slot a call runs at once. The pass itself runs without the batcher's lock,
so a slot that comes meanwhile (a keystroke's completion while a paste is read) joins the
next step; no slot's thread runs during a pass, since each may change its sequences' cache
between calls.

Work beside the slots (an embedding request's texts) runs there too, in passes of its
own, one after each of their target passes and as long as it (`beside_chunk`): it
neither waits for the slots to go idle nor stops them.

Every pass runs on that one thread: llama.cpp's CPU backend (OpenMP) keeps a team of
worker threads per calling thread, which it makes on the first pass from a thread and
which spins a while after each; passes from changing threads ran ~35% slower here
(4-token passes of the 1.5B Q4_K_M on 2 cores: 171 ms against 127 ms).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from localspec.backends.base import Cancelled, FimTokens, Model, Tokens, common_prefix
from localspec.backends.llama import LlamaModel
from localspec.backends.mtp import MtpHead
from localspec.backends.seq_layout import Part
from localspec.decoding.estimates import VerifyCost
from localspec.server.scheduling import (
    ALONE_MIN_CHUNK,
    ROUND_TOKENS,
    Pace,
    Want,
    beside_chunk,
    plan_step,
    split_pass_s,
)


class Decoder(Protocol):
    """What the passes run: a model (or an MTP head) that reads several sequences' parts
    in one pass."""

    name: str
    n_batch: int

    @property
    def size_bytes(self) -> int: ...

    def decode_parts(self, parts: list[Part]) -> list[np.ndarray]: ...


@dataclass(eq=False)
class Call:
    """One model call of one slot, waiting for (or going through) the shared passes."""

    model: Decoder
    seq: int
    tokens: list[int]
    pos: int
    n_logits: int
    short: bool
    cancel: threading.Event | None
    arrived: int
    done: int = 0  # tokens read so far
    seconds: float = 0.0  # in the passes that read them
    shared: bool = False  # a pass that read them read other calls' tokens too
    # an idle slot's reading ahead: no round, so its passes teach nothing of rounds
    idle: bool = False
    embd: tuple = ()  # an MTP head's input state for each token
    result: np.ndarray | None = None
    error: BaseException | None = None
    finished: bool = False

    @property
    def kind(self) -> str:
        """What its passes teach of: "idle" (a slot reading ahead: nothing), "round" (the
        round passes' times), "prompt" (a prompt token's time)."""
        if self.idle:
            return "idle"
        return "round" if len(self.tokens) <= ROUND_TOKENS else "prompt"

    def want(self, index: int) -> Want:
        need = len(self.tokens) - self.done
        return Want(index, need, self.n_logits, self.short, self.arrived)

    def part(self, n: int) -> Part:
        start = self.done
        rest = len(self.tokens) - start - n  # tokens after this chunk
        scored = max(0, self.n_logits - rest)
        embd = self.embd[start : start + n]
        return Part(self.seq, self.tokens[start : start + n], self.pos + start, scored, embd)


# Work beside the slots: a generator that waits at each `yield` for the next pass's most
# tokens (sent) and yields the tokens it read in the last (0 before the first), and
# returns its result
Work = Generator[int, int, object]


@dataclass(eq=False)
class Beside:
    """Work beside the slots, with passes of `model`'s weights; dropped between two
    passes where `cancel` is set."""

    work: Work
    model: LlamaModel
    cancel: threading.Event
    result: Future[object] = field(default_factory=Future)
    started: bool = False


@dataclass(frozen=True)
class PassRecord:
    """One pass: its model, tokens read per sequence, and its time."""

    model: str
    reads: dict[int, int]
    seconds: float


@dataclass
class StepLog:
    """What the passes did, for tests and the bench: steps run, how many of them
    carried more than one slot's tokens, and the last passes."""

    steps: int = 0
    shared: int = 0
    tokens: int = 0
    seconds: float = 0.0
    recent: deque[PassRecord] = field(default_factory=lambda: deque(maxlen=1024))


class Batcher:
    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._active = 0
        self._calls: list[Call] = []
        self._arrivals = itertools.count()
        self._stopping = False
        # A pass runs with the lock released, so that a slot can ask to join meanwhile:
        # it then waits for that pass's end, and the next step waits for it. No slot's
        # thread runs while a pass does (each may change its sequences' cache entries)
        self._in_pass = False
        self._joining = 0  # slots waiting for the pass in flight to end, to join
        self._passes: dict[int, VerifyCost] = {}  # per model: pass times by tokens in them
        self._calls_per_pass: dict[int, float] = {}  # per model: a moving average
        self._prompt_token_s: dict[int, float] = {}  # per model: in passes of prompts alone
        self._beside: deque[Beside] = deque()
        self._beside_turn = False  # a step of its model ran since its last pass
        self._beside_token_s: dict[int, float] = {}  # per model: a token's time in its passes
        self._last_pass_s: dict[int, float] = {}  # per model
        # per model: its passes in a row so far that carried a short request's round
        self._short_steps: dict[int, int] = {}
        self._thread = threading.Thread(target=self._run, name="localspec-passes", daemon=True)
        self._thread.start()
        self.log = StepLog()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join(timeout=30)
        for beside in self._beside:
            beside.result.set_exception(Cancelled())

    def _run(self) -> None:
        """The passes' thread: a step whenever every active slot waits for one, and a
        pass of the work beside them after each step of its model (its turn), or
        whenever no slot decodes."""
        with self._cv:
            while not self._stopping:
                ran = False
                if self._calls and len(self._calls) >= self._active and not self._joining:
                    model = self._step()
                    self._beside_turn |= bool(self._beside) and model is self._beside[0].model
                    ran = True
                if self._beside and not self._joining and (self._beside_turn or not self._active):
                    self._beside_turn = False
                    self._step_beside()
                    ran = True
                if not ran:
                    self._cv.wait()

    def beside(self, work: Work, model: LlamaModel, cancel: threading.Event) -> Future[object]:
        """`work` run beside the slots, a pass of it (of `model`'s weights) after each
        of their passes of that model, or whenever none decodes: its result, or its error
        (Cancelled where `cancel` was set before it ended)."""
        beside = Beside(work, model, cancel)
        with self._cv:
            self._beside.append(beside)
            self._cv.notify_all()
        return beside.result

    def cancel_beside(self) -> None:
        """Every work beside the slots ends before its next pass."""
        with self._cv:
            for beside in self._beside:
                beside.cancel.set()
            self._cv.notify_all()

    def _step_beside(self) -> None:
        """One pass of the first work beside the slots: as long as the slots' last pass
        of its model, timed by its own passes."""
        beside = self._beside[0]
        model = beside.model
        step_s = self._last_pass_s.get(id(model)) if self._active else None
        token_s = self._beside_token_s.get(id(model), 0.0)
        n = beside_chunk(token_s, step_s, model.n_batch)
        try:
            if beside.cancel.is_set():
                raise Cancelled()
            with self._unlocked():
                if not beside.started:  # to its first pass
                    next(beside.work)
                    beside.started = True
                started = time.perf_counter()
                read = beside.work.send(n)
            if read > 0:
                took = (time.perf_counter() - started) / read
                last = self._beside_token_s.get(id(model), took)
                self._beside_token_s[id(model)] = last + 0.3 * (took - last)
            return
        except StopIteration as done:
            beside.result.set_result(done.value)
        except Exception as e:
            beside.result.set_exception(e)
        self._beside.popleft()

    @contextmanager
    def active(self) -> Iterator[None]:
        """A slot decoding a request: the steps wait for its calls. A slot that comes
        during a pass joins at its end (not at the end of every call in it: a paste's
        prompt is read over many passes)."""
        with self._cv:
            self._joining += 1
            while self._in_pass:
                self._cv.wait()
            self._joining -= 1
            self._active += 1
            self._cv.notify_all()
        try:
            yield
        finally:
            with self._cv:
                self._active -= 1
                self._cv.notify_all()  # the others may all be waiting now

    def load(self) -> int:
        """Slots decoding now (at least 1: the one asking)."""
        return max(1, self._active)

    def calls_per_pass(self, model: Decoder) -> float:
        """How many slots' calls `model`'s passes of rounds carry, on average (before
        any: all the slots decoding, the hope that they go together)."""
        return self._calls_per_pass.get(id(model), float(self.load()))

    def passes(self, model: Decoder) -> VerifyCost:
        """`model`'s pass times by tokens in the pass, over passes of rounds only (a
        prompt's chunk would tilt the line): what `auto` prices a draft by under load."""
        if id(model) not in self._passes:
            self._passes[id(model)] = VerifyCost(cold_passes=getattr(model, "cold_passes", 0))
        return self._passes[id(model)]

    def call(
        self,
        model: Decoder,
        seq: int,
        tokens: list[int],
        pos: int,
        n_logits: int,
        short: bool = False,
        cancel: threading.Event | None = None,
        idle: bool = False,
        embd: tuple = (),
    ) -> Call:
        """`tokens` read into sequence `seq` at pos.. (with `embd`, an MTP head's input
        states): the finished call, with the logits of their last n_logits (or its error:
        Cancelled where `cancel` was set before all were read) and its time in passes."""
        with self._cv:
            arrived = next(self._arrivals)
            call = Call(
                model, seq, tokens, pos, n_logits, short, cancel, arrived, idle=idle, embd=embd
            )
            self._calls.append(call)
            self._cv.notify_all()
            while not call.finished or self._in_pass:
                if self._stopping and not self._in_pass:
                    raise Cancelled(call.done)
                self._cv.wait()
        return call

    def _step(self) -> Decoder | None:
        """One pass over the waiting calls of one model (the lock is held, but for the
        pass itself: every active slot waits for it anyway); that model."""
        for call in self._calls:
            if call.cancel is not None and call.cancel.is_set():
                call.error, call.finished = Cancelled(call.done), True
        live = [c for c in self._calls if not c.finished]
        if live:
            # The draft model's pass first, alone: a slot whose draft is done waits with its
            # target call until the others' drafts are done too, and their rounds meet in
            # one target pass (the dear one) instead of one each.
            model = min(dict.fromkeys(c.model for c in live), key=lambda m: m.size_bytes)
            self._pass(model, [c for c in live if c.model is model])
        self._calls = [c for c in self._calls if not c.finished]
        self._cv.notify_all()
        return model if live else None

    def pace(self, model: Decoder, wants: Sequence[Want]) -> Pace:
        """`model`'s passes as timed, for this step's `wants`: a prompt token's time, and
        the time of the rounds among them alone (the batcher's fit of round passes, read in
        micro-batches where each slot has a cache of its own; before any, as many prompt
        tokens')."""
        sizes = [w.need for w in wants if w.is_round]
        short = [w.need for w in wants if w.is_round and w.short]
        token_s = self._prompt_token_s.get(id(model), 0.0)
        rounds, k = self.passes(model), sum(sizes)
        if not (k and rounds.seconds):
            return Pace(token_s, k * token_s)
        if getattr(model, "kv_unified", True):  # one cache: unequal rounds in one micro-batch
            sizes, short = [k], [sum(short)] if short else []
        table = rounds.table(k)
        return Pace(token_s, split_pass_s(sizes, table), split_pass_s(short, table))

    @contextmanager
    def _unlocked(self) -> Iterator[None]:
        """The pass's own time, without the lock (held once, by `_run`)."""
        self._in_pass = True
        self._cv.release()
        try:
            yield
        finally:
            self._cv.acquire()
            self._in_pass = False
            self._cv.notify_all()

    def _pass(self, model: Decoder, calls: list[Call]) -> None:
        wants = [c.want(i) for i, c in enumerate(calls)]
        short_steps = self._short_steps.get(id(model), 0)
        shares = plan_step(wants, model.n_batch, self.pace(model, wants), short_steps)
        chosen = [(calls[i], n) for i, n in shares.items()]
        short = any(w.is_round and w.short for w in wants)
        self._short_steps[id(model)] = short_steps + 1 if short else 0
        parts = [call.part(n) for call, n in chosen]
        started = time.perf_counter()
        try:
            with self._unlocked():
                rows = model.decode_parts(parts)
        except Exception as e:  # every call in the pass failed with it
            for call, _n in chosen:
                call.error, call.finished = e, True
            return
        took = time.perf_counter() - started
        self._last_pass_s[id(model)] = took
        tokens = sum(n for _c, n in chosen)
        kinds = {c.kind for c, _n in chosen}
        # what `auto` prices rounds by: passes of rounds only (neither a prompt's chunk
        # nor an idle slot's reading ahead, whose passes carry one slot's call each)
        if kinds == {"round"}:
            self.passes(model).time_pass(tokens, took)
            mean = self._calls_per_pass.get(id(model), len(chosen))
            self._calls_per_pass[id(model)] = mean + 0.2 * (len(chosen) - mean)
        elif kinds == {"prompt"} and tokens >= ALONE_MIN_CHUNK:
            # a pass of prompts alone (a small one reads less efficiently): what sizes
            # the next ones' chunks by time
            last = self._prompt_token_s.get(id(model), took / tokens)
            self._prompt_token_s[id(model)] = last + 0.3 * (took / tokens - last)
        self.log.steps += 1
        self.log.shared += len(chosen) > 1
        self.log.tokens += tokens
        self.log.seconds += took
        self.log.recent.append(PassRecord(model.name, {c.seq: n for c, n in chosen}, took))
        for (call, n), logits in zip(chosen, rows, strict=True):
            call.done += n
            call.seconds += took
            call.shared |= len(chosen) > 1
            if call.done == len(call.tokens):
                call.result, call.finished = logits, True


class SlotHead:
    """An MTP head's draft steps for one slot (the sequence of its target `view`), as
    calls of the shared passes: the steps of every slot drafting meet in one pass of the
    head, as the draft model's do (llama.cpp's draft-mtp drafts so for all its slots)."""

    def __init__(self, head: MtpHead, view: SlotModel) -> None:
        self.head = head
        self.view = view
        self.shared_pass = False  # the last step's pass carried other slots' steps too

    def step(
        self, entries: Sequence[tuple[int, int, np.ndarray]], seq: int
    ) -> tuple[np.ndarray, np.ndarray]:
        part = self.head.part(entries, seq)
        view = self.view
        call = view.batcher.call(
            self.head, seq, part.tokens, part.pos, 1, view.short, view.cancel, embd=part.embd
        )
        self.shared_pass = call.shared
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return self.head.split(call.result[0])


class SlotModel(Model):
    """Sequence `seq` of a shared model, as a Model of its own: its own cached tokens,
    its calls batched with the other slots'. Set `cancel` and `short` per request, and
    `idle` while the slot reads ahead between requests."""

    def __init__(self, shared: LlamaModel, seq: int, batcher: Batcher) -> None:
        super().__init__()
        self.shared = shared
        self.seq = seq
        self.batcher = batcher
        self.name = shared.name
        self.n_vocab = shared.n_vocab
        self.n_ctx = shared.n_ctx
        self.short = False
        self.idle = False
        self._pass_s = 0.0  # the last call's time in passes
        self.calls = self.shared_calls = 0  # its calls, and those that shared a pass

    def _decode(self, tokens: list[int], pos: int, n_logits: int) -> np.ndarray:
        call = self.batcher.call(
            self.shared, self.seq, tokens, pos, n_logits, self.short, self.cancel, self.idle
        )
        self._pass_s, self.shared_pass = call.seconds, call.shared
        self.calls += 1
        self.shared_calls += call.shared
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    def _busy_since(self, started: float) -> float:
        """Its passes' time, not its wait for them: the costs `auto` weighs are the
        passes' (how the slots share them is its load's business)."""
        return self._pass_s

    def _remove_from(self, pos: int) -> bool:
        return self.shared.remove_from(self.seq, pos)

    def _move(self, gap: tuple[int, int], chunk: tuple[int, int]) -> bool:
        return self.shared.move(self.seq, gap, chunk)

    def save_state(self) -> bytearray | None:
        return self.shared.save_seq(self.seq)

    def load_state(self, tokens: Sequence[int], state: bytearray) -> bool:
        loaded = self.shared.load_seq(self.seq, state)
        self.cached = Tokens(tokens if loaded else ())
        return loaded

    def copy_from(self, other: SlotModel, tokens: list[int]) -> int:
        """Another slot's cache, as far as it holds `tokens`, copied into this one (which
        loses its own); how many tokens that is."""
        held = common_prefix(list(other.cached), tokens)  # a copy: its thread may append
        n = self.shared.copy_seq(other.seq, self.seq, held)
        if n is None:
            return 0
        self.cached = Tokens(tokens[:n])
        return n

    def checkpoint(self, lasting: bool = False, held: Sequence[int] = ()) -> None:
        self.shared.keep_state(self.seq, lasting, held)

    def _restore(self, pos: int) -> int | None:
        return self.shared.back_to_state(self.seq, pos)

    @property
    def can_cut(self) -> bool:
        return self.shared.can_cut

    @property
    def cut_depth(self) -> int | None:
        return self.shared.cut_depth

    def kv_len(self) -> int:
        return self.shared.seq_len(self.seq)

    # --- the shared model's vocabulary -------------------------------------------------
    def tokenize(self, text: str, special: bool = True) -> list[int]:
        return self.shared.tokenize(text, special)

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        return self.shared.token_bytes(token, special)

    def is_eog(self, token: int) -> bool:
        return self.shared.is_eog(token)

    def token_text(self, token: int) -> str:
        return self.shared.token_text(token)

    @property
    def size_bytes(self) -> int:
        return self.shared.size_bytes

    @property
    def read_bytes(self) -> int:
        return self.shared.read_bytes

    @property
    def vocab_kind(self) -> str:
        return self.shared.vocab_kind

    @property
    def special_ids(self) -> tuple[int, int]:
        return self.shared.special_ids

    def chat_template(self) -> str | None:
        return self.shared.chat_template()

    def metadata(self, key: str) -> str | None:
        return self.shared.metadata(key)

    def fim_tokens(self) -> FimTokens:
        return self.shared.fim_tokens()
