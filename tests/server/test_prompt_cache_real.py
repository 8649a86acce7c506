"""Prompts a slot gives up, kept in RAM and loaded back (serve's --cache-ram), on the
real default pair: a state loaded back is the cache it was, and conversations taking
turns in fewer slots than there are of them read only what is new."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from server.test_slots_real import Loop, assert_scores_alike

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.decoding.events import Finished
from localspec.server.jobs import Failed
from localspec.server.scheduling import KEEP_TOKENS
from localspec.server.worker import Worker
from localspec.session import Session, SessionConfig, open_session

pytestmark = pytest.mark.real


def test_a_state_loaded_back_is_the_cache_it_was(real_models):
    """Saved, overwritten by another prompt, loaded back: the next token scores as it
    would have without the detour (a stale or misplaced entry changes it wholesale)."""
    target, _ = real_models
    a = target.tokenize("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 6)
    b = target.tokenize("SELECT name FROM users WHERE id = 1;\n" * 8)
    target.reset()
    target.evaluate(a, 1)
    expected = target.evaluate([*a, 13], 1)[0].copy()
    target.reset()
    target.evaluate(a, 1)
    state = target.save_state()
    assert state is not None
    target.evaluate(b, 1)  # another prompt takes the cache
    assert target.load_state(a, state)
    assert target.cached == a and target.kv_len() == len(a)
    np.testing.assert_allclose(target.evaluate([*a, 13], 1)[0], expected, rtol=1e-4, atol=1e-3)


@pytest.fixture(scope="module")
def session(real_paths) -> Iterator[Session]:
    load = LoadOptions(n_ctx=2048, n_threads=2, n_seq=2, kv_unified=True)  # as serve's
    s = open_session(SessionConfig(str(real_paths[0]), str(real_paths[1]), "auto", load, load))
    yield s
    s.close()


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


def test_one_slot_stops_reading_a_prompt_whose_client_left(session, loop):
    """`serve --parallel 1` (or a cache with room for one sequence): the session's own
    models read the prompt, not shared passes. A request withdrawn while its prompt is
    read stops between chunks there too (a streamed request whose client left kept the
    one slot reading ~10k tokens for minutes), keeping what it read."""
    target = session.target
    for model in (target, session.draft_model):
        model.reset()
    worker = Worker(session, max_queue=8, parallel=1)
    worker.start()
    try:
        assert worker.slots[0].views == []  # the session's own engine
        log = "Summarize this log:\n" + "GET /index.html 200 0.003s\n" * 100
        long = session.render([{"role": "user", "content": log}])
        assert len(long) > 2 * target.n_batch  # three chunks or more
        job = loop.job(long, 16)
        worker.submit(job)
        deadline = time.monotonic() + 30
        while worker.slots[0].job is not job:  # it has the slot (withdrawn before, it
            assert time.monotonic() < deadline  # would only leave the queue)
            time.sleep(0.01)
        time.sleep(0.5)  # in its first chunk: the whole prompt takes ~20 s on 2 cores
        worker.withdraw(job)
        end = loop.wait(job, timeout=60)
        assert isinstance(end, Failed) and end.message == "cancelled"
        assert 0 < len(target.cached) < len(long) - 1  # it stopped between chunks
        assert target.kv_len() == len(target.cached)  # and kept what it read
        deadline = time.monotonic() + 5
        while worker.depth():
            assert time.monotonic() < deadline, "the slot was not freed"
            time.sleep(0.01)
        short = loop.job(session.render([{"role": "user", "content": "hi"}]), 4)
        worker.submit(short)  # and the slot serves on
        assert isinstance(loop.wait(short), Finished)
    finally:
        worker.stop()


def test_three_conversations_in_two_slots_come_back_from_ram(session, loop):
    """A reviewer, a shell assistant and a tester take turns in two slots: each second
    turn finds its first in RAM (its slot went to another) and reads only what is new;
    afterwards both slots' caches, in both models, score as a fresh read of their tokens."""
    worker = Worker(session, max_queue=8, parallel=2, cache_ram=1 << 30)
    worker.start()
    roles = ["You review Python code.", "You write shell commands.", "You write pytest tests."]
    rule = " Answer in one short sentence, and never repeat the question back."
    # just long enough that a slot's cache is worth keeping (no more: each is read twice)
    repeats = KEEP_TOKENS // len(session.target.tokenize(rule)) + 2
    talks = [[{"role": "system", "content": role + rule * repeats}] for role in roles]
    first: list[int] = []
    try:
        for turn in range(2):
            for who, talk in enumerate(talks):
                talk.append({"role": "user", "content": f"Question {turn} for you, please."})
                prompt = session.render(talk)  # type: ignore[arg-type]
                job = loop.job(prompt, 6)
                worker.submit(job)
                end = loop.wait(job)
                assert isinstance(end, Finished)
                talk.append({"role": "assistant", "content": end.text})
                if turn == 0:
                    first.append(len(prompt))
                else:
                    assert job.cached_tokens >= first[who], (who, job.cached_tokens, first[who])
        assert worker.prompt_cache is not None and len(worker.prompt_cache.entries()) >= 2
        fresh = [
            LlamaModel(view.shared.path, LoadOptions(n_ctx=2048, n_threads=2))
            for view in worker.slots[0].views
        ]
        try:
            for slot in worker.slots:
                for view, anew in zip(slot.views, fresh, strict=True):
                    assert view.kv_len() == len(view.cached)
                    if view.cached:
                        assert_scores_alike(view, anew, [*view.cached, 13])
        finally:
            for model in fresh:
                model.close()
    finally:
        worker.stop()
