"""Several answers to one request: OpenAI's `n`, and a batch of prompts on
/v1/completions (each answered `n` times). Each answer is a job and an `Answer` of its
own (the worker runs them in slots side by side, and those after a prompt's first copy
its cache: worker.py); here their bodies and streams become one response: the choices
numbered as OpenAI numbers them (prompt i's answer j is choice i * n + j), under the
first answer's id, with one usage that counts each prompt once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import Request

from localspec.decoding.events import Event, Finished
from localspec.server.answer import Answer, on_disconnect
from localspec.server.errors import ApiError

Build = Callable[[Answer], Callable[[list[Event], Finished], dict[str, Any]]]
Chunks = AsyncIterator[dict[str, Any]]


async def collect(answers: Sequence[Answer], request: Request, build: Build) -> dict[str, Any]:
    """The answers' bodies as one: every choice, numbered, and their usage summed. A
    client that leaves, or one answer's failure, cancels them all."""
    if len(answers) == 1:
        return await answers[0].collect(request, build(answers[0]))
    watcher = asyncio.create_task(on_disconnect(request, lambda: _withdraw(answers)))
    try:
        bodies = await asyncio.gather(*(a.collect(None, build(a)) for a in answers))
    except BaseException:
        _withdraw(answers)
        raise
    finally:
        watcher.cancel()
    body = bodies[0] | {
        "choices": [b["choices"][0] | {"index": i} for i, b in enumerate(bodies)],
    }
    if "usage" in body:
        body["usage"] = usage(answers, [b["usage"] for b in bodies])
    return body


def _withdraw(answers: Sequence[Answer]) -> None:
    for answer in answers:
        answer.withdraw(answer.job)


async def stream(answers: Sequence[Answer], streams: Sequence[Chunks]) -> Chunks:
    """The answers' chunks as they come, each renumbered as its choice and under the first
    answer's id; the usage chunks (include_usage) held back and sent as one at the end.
    A failure of any ends the stream with it; the rest are cancelled."""
    if len(streams) == 1:
        async for chunk in streams[0]:
            yield chunk
        return
    arrivals: asyncio.Queue[tuple[int, dict[str, Any] | ApiError | None]] = asyncio.Queue()

    async def pump(i: int, chunks: Chunks) -> None:
        try:
            async for chunk in chunks:
                await arrivals.put((i, chunk))
        except ApiError as e:
            await arrivals.put((i, e))
        finally:
            await arrivals.put((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    usages: list[dict[str, Any]] = []
    last: dict[str, Any] | None = None
    try:
        running = len(tasks)
        while running:
            i, got = await arrivals.get()
            if got is None:
                running -= 1
            elif isinstance(got, ApiError):
                raise got
            elif not got["choices"]:  # an answer's usage chunk
                usages.append(got["usage"])
                last = got
            else:
                choices = [c | {"index": i} for c in got["choices"]]
                yield got | {"id": answers[0].id, "choices": choices}
        if last is not None:
            yield last | {"id": answers[0].id, "usage": usage(answers, usages)}
    finally:  # each answer's events end with its task (and withdraw its job)
        for task in tasks:
            task.cancel()


def usage(answers: Sequence[Answer], usages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The answers' usage as one: completion tokens summed, each prompt counted once (an
    answer whose job copies another's prompt does not count it again)."""
    firsts = [u for a, u in zip(answers, usages, strict=True) if a.job.twin is None]
    prompt = sum(u["prompt_tokens"] for u in firsts)
    completion = sum(u["completion_tokens"] for u in usages)
    details = [u["completion_tokens_details"] for u in usages]
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": sum(u["prompt_tokens_details"]["cached_tokens"] for u in firsts)
        },
        "completion_tokens_details": {key: sum(d[key] for d in details) for key in details[0]},
    }
