"""The batcher's steps with a stand-in model whose passes take a while (fast): when a
slot that comes during a long prompt's reading gets its first pass. The real slots:
test_slots_real.py."""

from __future__ import annotations

import functools
import itertools
import threading
import time
from typing import Any

import numpy as np
import pytest

from localspec.backends.base import Cancelled
from localspec.backends.seq_layout import Part
from localspec.server.batching import Batcher
from localspec.server.scheduling import MOST_OUT


class SlowModel:
    """Passes of at most 8 tokens, 20 ms each; it records what each pass read."""

    name = "slow"
    size_bytes = 1
    n_batch = 8

    def __init__(self) -> None:
        self.passes: list[dict[int, int]] = []

    def decode_parts(self, parts: list[Part]) -> list[np.ndarray]:
        time.sleep(0.02)
        self.passes.append({p.seq: len(p.tokens) for p in parts})
        return [np.zeros((p.n_logits, 4), np.float32) for p in parts]


def test_a_slot_that_comes_during_a_long_prompt_joins_after_the_pass_in_flight():
    batcher, model = Batcher(), SlowModel()
    stand_in: Any = model

    def paste() -> None:  # 160 tokens to read: 20 passes of 8
        with batcher.active():
            batcher.call(stand_in, 0, list(range(160)), 0, 1)

    reading = threading.Thread(target=paste)
    reading.start()
    try:
        while not model.passes:
            time.sleep(0.001)
        with batcher.active():  # a completion, while the paste is read
            call = batcher.call(stand_in, 1, [1, 2], 0, 2, short=True)
        assert call.result is not None and call.result.shape == (2, 4)
        first = next(i for i, p in enumerate(model.passes) if 1 in p)
        # it joined the step after the pass in flight as it came, not after all 20
        assert first <= 2, model.passes
    finally:
        reading.join(timeout=10)
        batcher.stop()
    assert sum(p.get(0, 0) for p in model.passes) == 160  # the paste was read whole


def side_work(log: list[str], passes: int):
    """Work beside the slots (as an embedding request's): 20 ms a pass of one token."""
    read = 0
    for i in range(passes):
        n = yield read  # the tokens the last pass read; this one's most
        time.sleep(0.02)
        log.append(f"beside {i} {n}")
        read = 1
    return "done"


def test_work_beside_the_slots_runs_a_pass_between_two_of_their_steps():
    batcher, model = Batcher(), SlowModel()
    stand_in: Any = model
    log: list[str] = []

    class Logged(list):  # the slot's passes, in the same log
        def append(self, item: dict[int, int]) -> None:
            log.append("slot")
            super().append(item)

    model.passes = Logged()
    reading_started = threading.Event()

    def paste() -> None:  # 80 tokens: 10 passes of 8
        with batcher.active():
            reading_started.set()
            batcher.call(stand_in, 0, list(range(80)), 0, 1)

    reading = threading.Thread(target=paste)
    reading.start()
    try:
        reading_started.wait()
        result = batcher.beside(side_work(log, 5), stand_in, threading.Event())
        assert result.result(timeout=10) == "done"
        reading.join(timeout=10)
    finally:
        batcher.stop()
    kinds = [entry.split()[0] for entry in log]
    first, last = kinds.index("beside"), len(kinds) - kinds[::-1].index("beside")
    # neither waited for the other: from the first beside pass on, the two took turns
    turns = kinds[first:last]
    assert all(a != b for a, b in itertools.pairwise(turns)), log
    assert turns.count("beside") == 5 and kinds.count("slot") == 10, log


def test_work_beside_the_slots_is_dropped_between_two_passes_once_cancelled():
    batcher, stand_in = Batcher(), SlowModel()
    log: list[str] = []
    cancel = threading.Event()
    try:
        result = batcher.beside(side_work(log, 50), stand_in, cancel)
        while not log:
            time.sleep(0.001)
        cancel.set()
        with pytest.raises(Cancelled):
            result.result(timeout=10)
        assert len(log) <= 3  # the pass in flight ended, no more began
        after = batcher.beside(side_work(log, 1), stand_in, threading.Event())  # the next runs
        assert after.result(timeout=10) == "done"
        # the server stops (Ctrl-C): every work ends before its next pass
        log.clear()
        works = [batcher.beside(side_work(log, 50), stand_in, threading.Event()) for _ in "ab"]
        while not log:
            time.sleep(0.001)
        batcher.cancel_beside()
        for work in works:
            with pytest.raises(Cancelled):
                work.result(timeout=10)
        assert len(log) <= 3
    finally:
        batcher.stop()


def test_work_beside_the_slots_waits_for_their_whole_round_not_each_draft_step():
    """Its passes are of the target's weights: one after each target pass, none after a
    draft model's (a round of γ drafts would otherwise wait γ + 1 of them)."""
    batcher, target, draft = Batcher(), SlowModel(), SlowModel()
    draft.size_bytes = 0  # the smaller: its calls pass first
    log: list[str] = []

    class Logged(list):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def append(self, item: dict[int, int]) -> None:
            log.append(self.name)
            super().append(item)

    target.passes, draft.passes = Logged("target"), Logged("draft")
    stand_ins: tuple[Any, Any] = (target, draft)
    decoding = threading.Event()

    def rounds() -> None:  # 6 rounds of 3 draft steps and a target pass
        with batcher.active():
            decoding.set()
            for r in range(6):
                for d in range(3):
                    batcher.call(stand_ins[1], 0, [1], r * 3 + d, 1)
                batcher.call(stand_ins[0], 0, [1, 2, 3, 4], r * 4, 4)

    slot = threading.Thread(target=rounds)
    slot.start()
    try:
        decoding.wait()
        result = batcher.beside(side_work(log, 3), stand_ins[0], threading.Event())
        assert result.result(timeout=10) == "done"
        slot.join(timeout=10)
    finally:
        batcher.stop()
    kinds = [entry.split()[0] for entry in log]
    for i, kind in enumerate(kinds):
        if kind == "beside" and i > 0:
            assert kinds[i - 1] == "target", log
    assert kinds.count("beside") == 3 and kinds.count("target") == 6, log


class TokenTimedModel(SlowModel):
    """Passes that take 10 ms a token: two slots' tokens cost twice one's (a CPU's r)."""

    def decode_parts(self, parts: list[Part]) -> list[np.ndarray]:
        time.sleep(0.01 * sum(len(p.tokens) for p in parts))
        self.passes.append({p.seq: len(p.tokens) for p in parts})
        return [np.zeros((p.n_logits, 4), np.float32) for p in parts]


def test_a_chats_rounds_go_one_step_in_four_while_a_completion_decodes():
    """A chat streams (slot 0) and an editor's completion comes (slot 1), on a model where
    the chat's token makes each pass twice as dear: the completion goes every step, the
    chat one step in four (scheduling.MOST_OUT), and every step again once the
    completion is done."""
    batcher, model = Batcher(), TokenTimedModel()
    stand_in: Any = model
    done = threading.Event()

    def chat() -> None:
        with batcher.active():
            while not done.is_set():
                batcher.call(stand_in, 0, [1], 0, 1)

    streaming = threading.Thread(target=chat)
    streaming.start()
    try:
        while len(model.passes) < 5:  # a one-token pass timed
            time.sleep(0.001)
        with batcher.active():
            for _ in range(12):
                batcher.call(stand_in, 1, [1], 0, 1, short=True)
        after = len(model.passes)
        while len(model.passes) < after + 4:
            time.sleep(0.001)
    finally:
        done.set()
        streaming.join(timeout=10)
        batcher.stop()
    during = [p for p in model.passes if 1 in p]
    assert len(during) == 12
    went = [i for i, p in enumerate(during) if 0 in p]
    assert len(went) >= 3 and all(b - a == MOST_OUT + 1 for a, b in itertools.pairwise(went))
    assert all(p == {0: 1} for p in model.passes[after : after + 4])  # the chat alone again


def test_a_long_request_yields_to_a_short_one_decoding_not_to_one_reading_its_prompt():
    """The worker's rules for `Load.yields` and `Load.slots`: a chat drafts nothing while
    an editor's completion decodes beside it on dear passes, and the completion prices
    its drafts as alone (the chat sits out most steps); not while the completion reads
    its prompt (every round goes every step then), nor where passes are cheap (a GPU)."""
    from types import SimpleNamespace

    from localspec.decoding.estimates import VerifyCost
    from localspec.server.worker import Worker

    cpu, gpu = VerifyCost(), VerifyCost()
    for k, (c, g) in {1: (0.075, 0.015), 2: (0.105, 0.0152)}.items():
        cpu.observe(k, c)
        gpu.observe(k, g)
    chat = SimpleNamespace(short=False, read=threading.Event())
    completion = SimpleNamespace(short=True, read=threading.Event())
    slots = [SimpleNamespace(job=chat), SimpleNamespace(job=completion)]
    worker: Any = SimpleNamespace(slots=slots, batcher=SimpleNamespace(load=lambda: 2))
    worker._giving_way = functools.partial(Worker._giving_way, worker)
    assert not Worker._yields(worker, 0, cpu)  # the completion reads its prompt
    assert Worker._sharing(worker, 1, cpu) == 2
    completion.read.set()
    assert Worker._yields(worker, 0, cpu)
    assert not Worker._yields(worker, 1, cpu)  # the short one itself drafts as it may,
    assert Worker._sharing(worker, 1, cpu) == 1  # priced as alone: the chat sits out
    assert Worker._sharing(worker, 0, cpu) == 2
    assert not Worker._yields(worker, 0, gpu) and Worker._sharing(worker, 1, gpu) == 2
    assert not Worker._yields(worker, 0, VerifyCost())  # untimed
