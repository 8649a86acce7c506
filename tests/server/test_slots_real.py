"""Serve's slots on the real default pair, in-process: requests on real threads share
llama.cpp passes, and each still answers as it would alone.

Greedy answers decoded together are held to plain decoding's (one-token passes on a
model of its own) by the weaker near-tie rule of tests/decoding/test_real_engine.py
(`assert_lossless`): a batch may move a numerical near-tie, never a clear choice.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
from decoding.test_real_engine import assert_lossless  # the near-tie rule

from localspec.backends.base import common_prefix
from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.decoding.adaptive import AdaptiveDrafter
from localspec.decoding.drafters import DraftModel, NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished, Piece
from localspec.decoding.sampling import SamplingParams
from localspec.server.batching import PassRecord, SlotModel
from localspec.server.jobs import Failed, Job
from localspec.server.scheduling import PROMPT_PASS_S, SHORT_TOKENS
from localspec.server.worker import Worker
from localspec.session import Session, SessionConfig, open_session

pytestmark = pytest.mark.real

SLOTS = 3
# total variation between a cache built in shared rounds and a fresh batched read of the
# same tokens: Q4 kernels' numerics moved it up to 0.18 here (the Q4_0 draft's); a
# misplaced or stale cache entry moves it wholesale, toward 1
TV_NOISE = 0.25
GREEDY = SamplingParams(temperature=0)
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Rename the variable x to count everywhere and return only the code:\n\n"
    "def total(items):\n    x = 0\n    for item in items:\n        x += item.price\n"
    "    return x\n",
    "In two sentences: why do cats purr?",
]


@pytest.fixture(scope="module")
def session(real_paths) -> Iterator[Session]:
    load = LoadOptions(
        n_ctx=2048, n_threads=2, n_seq=SLOTS, kv_unified=True
    )  # one cache, as serve's, and the target's long prompts read as serve's (reader.py)
    target_load = replace(load, prompt_reader=True)
    config = SessionConfig(str(real_paths[0]), str(real_paths[1]), "auto", target_load, load)
    s = open_session(config)
    yield s
    s.close()


@pytest.fixture(scope="module")
def worker(session: Session) -> Iterator[Worker]:
    w = Worker(session, max_queue=8, parallel=SLOTS)
    w.start()
    yield w
    w.stop()


class Loop:
    """An event loop in a thread of its own, as the server's: jobs deliver to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def job(self, prompt: list[int], max_tokens: int, label: str = "test") -> Job:
        return Job(label, prompt, GenerationConfig(max_tokens, GREEDY), self.loop)

    def wait(self, job: Job, timeout: float = 300) -> Finished | Failed:
        async def end() -> Finished | Failed:
            async for event in job.events():
                if isinstance(event, Finished | Failed):
                    return event
            raise AssertionError("no end")

        return asyncio.run_coroutine_threadsafe(end(), self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def chat(session: Session, text: str) -> list[int]:
    return session.render([{"role": "user", "content": text}])


def plain(real_models, prompt: list[int], max_tokens: int) -> tuple[Finished, list[Piece]]:
    """Plain decoding on a model of its own (one sequence), with each token's margin."""
    target, _ = real_models
    engine = Engine(target, NoDrafter(), 0)
    events = list(engine.generate(prompt, GenerationConfig(max_tokens, GREEDY, trace=True)))
    pieces = [e for e in events if isinstance(e, Piece) and e.token >= 0]
    done = events[-1]
    assert isinstance(done, Finished)
    return done, pieces


def test_streams_at_once_each_answer_as_plain_decoding_does(
    worker, session, loop, real_models, caplog
):
    prompts = [chat(session, p) for p in PROMPTS]
    shared_before = worker.batcher.log.shared
    jobs = [loop.job(p, 40, f"stream {i}") for i, p in enumerate(prompts)]
    with caplog.at_level(logging.INFO, logger="localspec.server"):
        for job in jobs:
            worker.submit(job)
        ends = [loop.wait(job) for job in jobs]
    assert worker.batcher.log.shared > shared_before + 10  # the rounds really met
    # each log line says how much it shared, not a speedup its shared rate cannot tell
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stream ")]
    assert len(lines) == len(jobs) and all("% of its passes shared with" in x for x in lines)
    assert not any("plain decoding" in x for x in lines), lines
    for prompt, end in zip(prompts, ends, strict=True):
        assert isinstance(end, Finished), end
        want, pieces = plain(real_models, prompt, 40)
        assert_lossless(end, pieces, want)


def test_n_answers_copy_the_prompt_the_first_one_read(worker, session, loop, real_models, caplog):
    """OpenAI's `n`: the answers after the first copy the prompt from the first's slot
    once it is read (they read only its last token again), and each answers as plain
    decoding does: a cache copied wrong would answer otherwise."""
    prompt = chat(session, "List four colours of the rainbow, one per line.")
    first = loop.job(prompt, 24, "choice 0")
    rest = [
        Job(f"choice {i}", prompt, GenerationConfig(24, GREEDY), loop.loop, twin=first)
        for i in (1, 2)
    ]
    with caplog.at_level(logging.INFO, logger="localspec.server"):
        for job in [first, *rest]:
            worker.submit(job)
        ends = [loop.wait(job) for job in [first, *rest]]
    lines = [r.getMessage() for r in caplog.records]
    assert sum(f"tokens of its prompt copied from {first.label}" in x for x in lines) == 2, lines
    assert first.cached_tokens < len(prompt) - 1  # the first read it
    assert [job.cached_tokens for job in rest] == [len(prompt) - 1] * 2
    want, pieces = plain(real_models, prompt, 24)
    for end in ends:
        assert isinstance(end, Finished), end
        assert_lossless(end, pieces, want)


def test_a_first_answer_that_ended_is_still_copied_from(
    worker, session, loop, real_models, caplog, monkeypatch
):
    """The second of n may get its slot only after the first has ended (a short or well
    drafted answer, a slot busy reading ahead): it still copies from the first's slot,
    idle now, which holds the prompt, and answers as plain decoding does."""
    prompt = chat(session, "Name three planets, one per line.")
    first = loop.job(prompt, 8, "first of two")
    second = Job("second of two", prompt, GenerationConfig(8, GREEDY), loop.loop, twin=first)
    await_twin = worker._await_twin

    def after_the_first(job):  # the race, made certain: the first's slot is idle
        await_twin(job)
        deadline = time.monotonic() + 120  # a first that never ends fails the test below
        while job is second and worker.slots[first.slot].job is not None:
            if time.monotonic() > deadline:  # rather than hold this slot's thread forever
                return
            time.sleep(0.01)

    monkeypatch.setattr(worker, "_await_twin", after_the_first)
    with caplog.at_level(logging.INFO, logger="localspec.server"):
        worker.submit(first)
        worker.submit(second)
        ends = [loop.wait(job) for job in (first, second)]
    lines = [r.getMessage() for r in caplog.records]
    assert any("second of two: " in x and "copied from first of two" in x for x in lines), lines
    assert second.cached_tokens == len(prompt) - 1
    want, pieces = plain(real_models, prompt, 8)
    for end in ends:
        assert isinstance(end, Finished), end
        assert_lossless(end, pieces, want)


def test_every_slots_caches_equal_a_fresh_evaluation(worker, session, loop, real_models):
    """After interleaved rounds (the test above, and these), each slot's cache in both
    models holds exactly its tokens, and scores the next token as a fresh read does."""
    jobs = [loop.job(chat(session, f"Count from {i} to {i + 9}."), 24) for i in range(SLOTS)]
    for job in jobs:
        worker.submit(job)
    for job in jobs:
        assert isinstance(loop.wait(job), Finished)
    # fresh models of the same files (the draft is the Q4_0 copy made for the CPU)
    load = LoadOptions(n_ctx=2048, n_threads=2)
    fresh = [LlamaModel(view.shared.path, load) for view in worker.slots[0].views]
    try:
        for slot in worker.slots:
            assert slot.views[0].cached  # every slot answered
            for view, anew in zip(slot.views, fresh, strict=True):
                assert view.kv_len() == len(view.cached)
                if view.cached:  # (auto may not have used the draft model in a slot)
                    assert_scores_alike(view, anew, [*view.cached, 13])
    finally:
        for model in fresh:
            model.close()


def assert_scores_alike(view: SlotModel, fresh: LlamaModel, tokens: list[int]) -> None:
    """The next token's scores on top of the slot's cache, against a fresh read of the
    same tokens: the same choice, and distributions apart by numerics only (a stale or
    misplaced cache entry changes them wholesale)."""
    kept = softmax(view.evaluate(tokens, 1)[0])
    fresh.reset()
    anew = softmax(fresh.evaluate(tokens, 1)[0])
    tv = float(np.abs(kept - anew).sum()) / 2
    assert tv < TV_NOISE, (view.name, len(tokens), tv)
    top, second = np.argsort(anew)[-2:][::-1]
    if int(np.argmax(kept)) != int(top):  # only where the fresh read's top two nearly tie
        assert int(np.argmax(kept)) == int(second), (view.name, len(tokens))
        assert anew[top] - anew[second] < TV_NOISE, (view.name, anew[top], anew[second])


def test_a_short_completion_during_a_long_stream_finishes_first(worker, session, loop):
    story = loop.job(chat(session, "Write a long story about a lighthouse keeper."), 300)
    worker.submit(story)
    deadline = time.monotonic() + 120
    while not story.inbox.qsize():  # its first piece: it is decoding
        assert time.monotonic() < deadline
        time.sleep(0.05)
    completion = loop.job(session.tokenize_raw("def add(a, b):\n    return"), 8, "completion")
    worker.submit(completion)
    done = loop.wait(completion)
    assert isinstance(done, Finished) and done.tokens
    assert not story.cancel.is_set() and worker.depth() >= 1  # the story still streams
    worker.withdraw(story)
    assert isinstance(loop.wait(story), Failed)


def test_a_completion_that_comes_while_a_paste_is_read_goes_between_its_chunks(
    worker, session, loop, real_models
):
    """An agent's file is read in passes sized by time, not to the budget, so an
    editor's completion that comes meanwhile waits for a short one; beside the
    completion the paste's chunks shrink to the rest of the pass, and the completion
    answers as it would alone."""
    target = session.target
    assert isinstance(target, LlamaModel)
    paste = chat(session, "Summarize this log:\n" + "GET /api/items?page=7 200 0.004s\n" * 40)
    assert 600 < len(paste) < 1000
    job = loop.job(paste, SHORT_TOKENS + 1, "paste")  # a long request: an agent's
    worker.batcher.log.recent.clear()

    def passes() -> list[PassRecord]:
        return [r for r in list(worker.batcher.log.recent) if r.model == target.name]

    worker.submit(job)
    deadline = time.monotonic() + 300
    while len(passes()) < 2:  # two passes read: the pace is timed, and sized one pass
        assert time.monotonic() < deadline
        time.sleep(0.01)
    prompt = session.tokenize_raw('def fibonacci(n):\n    """The n-th Fibonacci number."""\n')
    completion = loop.job(prompt, 24, "completion")  # short: an editor's
    worker.submit(completion)
    done = loop.wait(completion)
    worker.withdraw(job)
    assert isinstance(done, Finished), done
    loop.wait(job)
    want, pieces = plain(real_models, prompt, 24)
    assert_lossless(done, pieces, want)

    # its slot holds most of it (not all: it was cancelled), others a chat's opening
    paste_slot = max(worker.slots, key=lambda s: common_prefix(s.cached, paste)).index
    completion_slot = next(s.index for s in worker.slots if s.cached[: len(prompt)] == prompt)
    reads = [r.reads for r in passes()]
    # the completion came in while the paste was read, not once all of it was
    joined = next(i for i, r in enumerate(reads) if completion_slot in r)
    before = sum(r.get(paste_slot, 0) for r in reads[:joined])
    assert before < len(paste) - job.cached_tokens, reads
    alone = [r[paste_slot] for r in reads if set(r) == {paste_slot}]
    beside = [r[paste_slot] for r in reads if {paste_slot, completion_slot} <= set(r)]
    assert len(alone) >= 2 and beside, reads  # the paste went on beside the completion
    assert max(beside) < min(alone), reads  # and gave way to it
    # once timed (from the real passes; the first reads BUSY_CHUNK), its passes
    # alone were sized by their time
    token_s = worker.batcher.pace(target, []).prompt_token_s
    assert token_s > 0
    if token_s * target.n_batch > 2 * PROMPT_PASS_S:  # a whole budget's pass takes long here
        assert max(alone[1:]) < target.n_batch, reads


def test_a_cancelled_prompt_stops_between_chunks_and_frees_its_slot(worker, session, loop):
    long = chat(session, "Summarize this log:\n" + "GET /index.html 200 0.003s\n" * 100)
    assert 1200 < len(long) < 2000
    job = loop.job(long, 16)
    read = worker.batcher.log.tokens
    worker.submit(job)
    deadline = time.monotonic() + 120
    while worker.batcher.log.tokens == read:  # its first chunk is read
        assert time.monotonic() < deadline
        time.sleep(0.01)
    worker.withdraw(job)
    end = loop.wait(job)
    assert isinstance(end, Failed) and end.message == "cancelled"
    slot = next(s for s in worker.slots if s.views[0].cached[:10] == long[:10])
    assert 0 < len(slot.views[0].cached) < len(long) - 1  # it stopped between chunks
    assert slot.views[0].kv_len() == len(slot.views[0].cached)  # and kept what it read
    deadline = time.monotonic() + 5
    while worker.depth():
        assert time.monotonic() < deadline, "the slot was not freed"
        time.sleep(0.01)


def test_alternating_conversations_keep_their_caches(worker, session, loop):
    """A chat panel and an agent, turn by turn: each turn finds its conversation in a
    slot's cache and reads only what is new."""
    systems = [
        "You are a code reviewer. " + "Point out bugs, style issues and missing tests. " * 30,
        "You are a shell assistant. " + "Answer with one command and a short reason. " * 30,
    ]
    histories = [[{"role": "system", "content": s}] for s in systems]
    first: dict[int, int] = {}  # the first turn's prompt length, per conversation
    for who, ask in [(0, "Review: x=1"), (1, "List files"), (0, "And tests?"), (1, "Hidden?")]:
        conversation = histories[who]
        conversation.append({"role": "user", "content": ask})
        prompt = session.render(conversation)  # type: ignore[arg-type]
        job = loop.job(prompt, 8)
        worker.submit(job)
        end = loop.wait(job)
        assert isinstance(end, Finished)
        if who in first:  # all of the first turn was still in a slot's cache
            assert job.cached_tokens >= first[who], (who, job.cached_tokens, first[who])
        else:
            first[who] = len(prompt)
        conversation.append({"role": "assistant", "content": end.text})


def test_an_idle_slot_reads_ahead_and_is_busy_until_it_has_read_all(
    worker, session, loop, monkeypatch
):
    """After an answer the slot's draft model reads what the slot holds, for the next
    request (an editor's shares most of it). Until it has read all, the worker counts
    it busy (`reading_ahead`, in /health): a bench that waits for an idle server before
    it times another finds no reading left on the next one's time."""
    monkeypatch.setattr(AdaptiveDrafter, "draft_could_pay", lambda self: True)
    text = "def handler(request):\n    return respond(request.body)\n" * 20
    first = chat(session, "What does this do?\n\n" + text)
    job = loop.job(first, 8)  # times the slot's passes: `auto` needs T(1) to read ahead
    worker.submit(job)
    assert isinstance(loop.wait(job), Finished)
    while worker.depth() or worker.reading_ahead():  # its slot free, its reading done
        time.sleep(0.005)
    draft = session.draft_model
    assert isinstance(draft, LlamaModel)
    rounds = dict(worker.batcher.passes(draft).seconds), worker.batcher.calls_per_pass(draft)
    longer = chat(session, "What does this do?\n\n" + text * 2)
    job = loop.job(longer, 1)  # the target reads it; no round: the draft model does not
    worker.submit(job)
    assert isinstance(loop.wait(job), Finished)
    slot = next(s for s in worker.slots if s.cached[: len(longer)] == longer)
    drafter = slot.engine.drafter
    assert isinstance(drafter, AdaptiveDrafter) and isinstance(drafter.model, DraftModel)
    deadline = time.monotonic() + 120
    while worker.depth() or worker.reading_ahead():
        assert time.monotonic() < deadline, "still reading ahead after 2 minutes"
        time.sleep(0.005)
    assert drafter.model.unread(slot.cached) <= 1  # idle: nothing left to read
    # its chunks, one slot's each, are not rounds: what `auto` prices the slots' shared
    # draft steps by (their times, how many slots share one) is as it was
    after = dict(worker.batcher.passes(draft).seconds), worker.batcher.calls_per_pass(draft)
    assert after == rounds
