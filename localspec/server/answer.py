"""A request's answer as its API shapes it, built from the worker's events: OpenAI's
chat and completion bodies and their streams of chunks (log-probabilities, tool calls
as they are written, a thinking model's reasoning), llama-server's /infill stream, and
server-sent events to carry any of them. Anthropic's and the Responses API's shapes are
made from the chat's (localspec.server.anthropic, localspec.server.responses).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from localspec.decoding.events import Event, Finished, Piece, RoundEnd, Stats, StopReason
from localspec.server.calls import Rewriter, rewriter
from localspec.server.chat import ToolCall, ToolCallDeltas, ToolCallStream
from localspec.server.errors import ApiError
from localspec.server.fence import Unfence
from localspec.server.infill import Unopened
from localspec.server.jobs import SHUTTING_DOWN, Failed, Job
from localspec.server.prepare import Prepared
from localspec.thinking import Split

FINISH_REASONS: dict[StopReason, str] = {
    "eog": "stop",
    "stop_string": "stop",
    "max_tokens": "length",
    "context_full": "length",
    "cancelled": "stop",
}


class Answer:
    """One request's answer, built from the worker's events: OpenAI's response body, or
    its stream of chunks."""

    def __init__(
        self,
        job: Job,
        prepared: Prepared,
        model: str,
        kind: str,
        withdraw: Callable[[Job], None],
        token_bytes: Callable[[int], bytes] = lambda _: b"",
    ) -> None:
        self.job, self.prepared = job, prepared
        self.token_bytes = token_bytes
        self.logprobs = prepared.config.logprobs is not None
        self.withdraw = withdraw  # the client left: free its place at once
        self.model = model
        self.kind = kind
        self.id = f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{short_id()}"
        self.created = int(time.time())
        self.tools, self.tool_params = prepared.tools, prepared.tool_params
        self.thinking = prepared.thinking
        self.reasoning_tokens = 0
        self._opening = 0  # tokens that may be opening a thinking block
        self.done: Finished | None = None  # the Finished event, once it came
        # a middle's opening is the client's own typed text: not sent back
        self.unopened = Unopened(prepared.opening, token_bytes) if prepared.opening else None

    # --- not streamed ----------------------------------------------------------------
    async def collect(
        self, request: Request | None, build: Callable[[list[Event], Finished], dict[str, Any]]
    ) -> dict[str, Any]:
        """Wait for the whole answer; a client that leaves meanwhile cancels it at once
        (its disconnect is the next message the request receives; None: the caller
        watches, for several answers at once)."""
        events: list[Event] = []
        watcher = None
        if request is not None:
            watcher = asyncio.create_task(on_disconnect(request, lambda: self.withdraw(self.job)))
        try:
            async for event in self.events():
                events.append(event)
                if isinstance(event, Finished):
                    return build(events, event)
            raise ApiError(500, "the answer ended without finishing")
        finally:
            if watcher is not None:
                watcher.cancel()

    def chat_body(self, events: list[Event], done: Finished) -> dict[str, Any]:
        reasoning, answer = self.think([e for e in events if isinstance(e, Piece)])
        text, calls = self.split(answer)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["content"] = text.strip() or None
            message["tool_calls"] = [call.as_dict() for call in calls]
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": self.finish_reason(done, bool(calls)),
            "logprobs": self.chat_logprobs(events, done.text),
        }
        return self.envelope("chat.completion", [choice]) | self.figures(done)

    def completion_body(self, events: list[Event], done: Finished) -> dict[str, Any]:
        choice = {
            "index": 0,
            "text": done.text,
            "finish_reason": self.finish_reason(done, False),
            "logprobs": self.completion_logprobs(events, done.text),
        }
        return self.envelope("text_completion", [choice]) | self.figures(done)

    def think(self, pieces: list[Piece]) -> tuple[str, str]:
        """A thinking model's reasoning and its answer (the pieces' text else)."""
        if self.thinking is None:
            return "", "".join(p.text for p in pieces)
        split = self.thinking.split()
        reasoning, content = "", ""
        for piece in pieces:
            r, c = self.think_piece(split, piece)
            reasoning, content = reasoning + r, content + c
        r, c = split.flush()
        return reasoning + r, content + c

    def think_piece(self, split: Split, piece: Piece) -> tuple[str, str]:
        """One piece through the split; a token written inside the block (its marks
        included) counts as a reasoning token."""
        before = split.state
        r, c = split.push(piece.text)
        if piece.token < 0:
            return r, c
        if before == split.state == "start":  # the block's opening, or not: not yet known
            self._opening += 1
        elif "think" in (before, split.state):
            self.reasoning_tokens += 1 + (self._opening if before == "start" else 0)
            self._opening = 0
        return r, c

    def split(self, text: str) -> tuple[str, list[ToolCall]]:
        """The whole answer's content and tool calls."""
        if (native := self.rewriter()) is not None:
            text = native.push(text) + native.flush()
        if not self.tools:
            return text, []
        calls = ToolCallStream(self.tool_params)
        content, found = calls.push(text)
        rest, more = calls.flush()
        return content + rest, found + more

    def rewriter(self) -> Rewriter | None:
        """What the content goes through: a JSON answer's fence taken off, or a tool
        call's format turned into Qwen's tags (a request has tools or a format, not both)."""
        if self.prepared.fenced:
            return Unfence()
        return rewriter(self.tools, self.tool_params, self.prepared.after_result)

    # --- streamed --------------------------------------------------------------------
    async def stream_chat(self, include_usage: bool) -> AsyncIterator[dict[str, Any]]:
        yield self.chat_chunk({"role": "assistant", "content": ""})
        calls = ToolCallDeltas(self.tool_params) if self.tools else None
        native = self.rewriter()  # a fence taken off, or calls as Qwen's tags
        split = self.thinking.split() if self.thinking is not None else None
        scored: list[Event] = []  # pieces whose log-probabilities are not yet sent
        async for event in self.events():
            if isinstance(event, Piece) and self.logprobs:
                scored.append(event)
            if isinstance(event, Piece) and event.text:
                text = event.text
                if split is not None:
                    reasoning, text = self.think_piece(split, event)
                    if reasoning:
                        yield self.chat_chunk({"reasoning_content": reasoning})
                text = native.push(text) if native else text
                for delta in calls.push(text) if calls else [{"content": text}] if text else []:
                    logprobs = self.chat_logprobs(scored) if "content" in delta else None
                    scored = [] if logprobs else scored
                    yield self.chat_chunk(delta, logprobs=logprobs)
            elif isinstance(event, Finished):
                reasoning, text = split.flush() if split is not None else ("", "")
                if reasoning:
                    yield self.chat_chunk({"reasoning_content": reasoning})
                if native is not None:
                    text = native.push(text) + native.flush()
                tail = (calls.push(text) if text else []) + calls.flush() if calls else []
                for delta in tail if calls else ([{"content": text}] if text else []):
                    yield self.chat_chunk(delta)
                reason = self.finish_reason(event, bool(calls and calls.calls))
                last = self.chat_chunk({}, reason)
                if include_usage:
                    yield last
                    last = self.envelope("chat.completion.chunk", [])
                yield last | self.figures(event, include_usage)

    async def stream_completion(self, include_usage: bool) -> AsyncIterator[dict[str, Any]]:
        scored: list[Event] = []
        async for event in self.events():
            if isinstance(event, Piece) and self.logprobs:
                scored.append(event)
            if isinstance(event, Piece) and event.text:
                yield self.completion_chunk(event.text, logprobs=self.completion_logprobs(scored))
                scored = []
            elif isinstance(event, Finished):
                last = self.completion_chunk("", self.finish_reason(event, False))
                if include_usage:
                    yield last
                    last = self.envelope("text_completion", [])
                yield last | self.figures(event, include_usage)

    async def stream_infill(
        self, build: Callable[[list[Event], Finished], dict[str, Any]]
    ) -> AsyncIterator[dict[str, Any]]:
        """llama-server's streamed /infill: {content, stop: false} pieces, then the whole
        response with empty content and stop: true."""
        scored: list[Event] = []
        async for event in self.events():
            if isinstance(event, Piece) and self.logprobs:
                scored.append(event)
            if isinstance(event, Piece) and event.text:
                chunk = {
                    "index": 0,
                    "content": event.text,
                    "stop": False,
                    "id_slot": self.job.slot or 0,
                }
                if self.logprobs:
                    chunk["completion_probabilities"] = self.token_logprobs(scored)
                    scored = []
                yield chunk
            elif isinstance(event, Finished):
                yield {**build([], event), "content": ""}

    async def events(self) -> AsyncIterator[Event]:
        """The job's events; a client that leaves (the stream is closed) cancels it."""
        try:
            async for event in self.job.events():
                if isinstance(event, Failed):
                    raise failure(event)
                if (shown := self.shown(event)) is None:
                    continue
                if isinstance(shown, Finished):
                    self.done = shown
                yield shown
        finally:  # over either way: a slot stops within the round, the queue drops it
            self.withdraw(self.job)

    def shown(self, event: Event) -> Event | None:
        """The event as the client sees it: a middle's without its opening."""
        if self.unopened is None or isinstance(event, RoundEnd):
            return event
        if isinstance(event, Finished):
            return self.unopened.finished(event)
        return self.unopened.piece(event)

    def chat_chunk(
        self, delta: dict[str, Any], reason: str | None = None, logprobs: Any = None
    ) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": logprobs}
        return self.envelope("chat.completion.chunk", [choice])

    def completion_chunk(
        self, text: str, reason: str | None = None, logprobs: Any = None
    ) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}
        return self.envelope("text_completion", [choice])

    # --- log-probabilities, as OpenAI shapes them ---------------------------------------
    def scored(self, events: list[Event], shown: str | None = None, lead: int = 0) -> list[Piece]:
        """The pieces with log-probabilities; where `shown` is the whole answer's text,
        none after it (a stop string's tokens, left out as llama-server leaves them, and
        as a stream never shows them); `lead`: bytes of the first piece's token before
        the text (a middle's opening, which the client has)."""
        pieces = [e for e in events if isinstance(e, Piece) and e.logprob is not None]
        if shown is None:
            return pieces
        at, end = -lead, len(shown.encode())
        for i, piece in enumerate(pieces):
            if at >= end:
                return pieces[:i]
            at += len(self.token_bytes(piece.token))
        return pieces

    def token_entry(self, token: int, logprob: float) -> dict[str, Any]:
        raw = self.token_bytes(token)
        text = raw.decode("utf-8", "replace")
        # "id" as llama-server gives it: which token, where bytes leave it open
        return {"id": token, "token": text, "logprob": logprob, "bytes": list(raw)}

    def chat_logprobs(self, events: list[Event], shown: str | None = None) -> dict[str, Any] | None:
        """{"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}"""
        if not self.logprobs:
            return None
        content = self.token_logprobs(events, shown)
        return {"content": content} if content else None

    def token_logprobs(
        self, events: list[Event], shown: str | None = None, lead: int = 0
    ) -> list[dict[str, Any]]:
        """Each token's {id, token, logprob, bytes, top_logprobs: [...]} (also what
        llama-server's /completion gives as `completion_probabilities`)."""
        return [
            self.token_entry(p.token, p.logprob or 0.0)
            | {"top_logprobs": [self.token_entry(t, lp) for t, lp in p.top_logprobs]}
            for p in self.scored(events, shown, lead)
        ]

    def completion_logprobs(
        self, events: list[Event], shown: str | None = None
    ) -> dict[str, Any] | None:
        """The legacy shape: tokens, token_logprobs, top_logprobs ({token: logprob})."""
        if not self.logprobs:
            return None
        pieces = self.scored(events, shown)
        tokens = [self.token_entry(p.token, 0.0)["token"] for p in pieces]
        offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        return {
            "tokens": tokens,
            "token_logprobs": [p.logprob for p in pieces],
            "top_logprobs": [
                {self.token_entry(t, 0.0)["token"]: lp for t, lp in p.top_logprobs} for p in pieces
            ],
            "text_offset": offsets,
        }

    # --- the parts ---------------------------------------------------------------------
    def envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def finish_reason(self, done: Finished, called: bool) -> str:
        """The answer's finish_reason: "tool_calls" where it called, unless it was cut (a
        call that max_tokens cut has arguments that do not parse, and clients look for
        "length" before they run it; a streamed call's name went out before the cut)."""
        return "tool_calls" if called and not done.cut else FINISH_REASONS[done.stop_reason]

    def figures(self, done: Finished, usage: bool = True) -> dict[str, Any]:
        """`usage` (where asked for) and the engine's figures, under `localspec`."""
        out: dict[str, Any] = {"localspec": stats_object(done.stats)}
        if usage:
            out["usage"] = self.usage(done)
        return out

    def usage(self, done: Finished) -> dict[str, Any]:
        prompt, completion = len(self.job.prompt), len(done.tokens)
        accepted, rejected = self.job.prediction_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.job.cached_tokens},
            "completion_tokens_details": {
                "accepted_prediction_tokens": accepted,
                "rejected_prediction_tokens": rejected,
                "reasoning_tokens": self.reasoning_tokens,
            },
        }


def stats_object(s: Stats) -> dict[str, Any]:
    """The speculation figures every answer carries."""
    return {
        "acceptance_rate": round(s.acceptance_rate, 4),
        "mean_accepted_len": round(s.mean_accepted_len, 4),
        "tokens_per_s": round(s.tokens_per_s, 3),
        "ttft_s": round(s.ttft_s, 4),
        "drafted": s.drafted,
        "accepted": s.accepted,
        "rounds": s.rounds,
        "gamma": s.gamma,
        "drafter": s.drafter,
        "recalled": s.recalled,
    }


async def on_disconnect(request: Request, then: Callable[[], None]) -> None:
    """`then()` once the client of a request whose body was read disconnects (its next
    message): a task beside a request that is not streamed."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    then()


def failure(event: Failed) -> ApiError:
    if event == SHUTTING_DOWN:
        return ApiError(503, event.message, code="shutting_down")
    return ApiError(500, f"generation failed: {event.message}", code="generation_failed")


def as_function_call(body: dict[str, Any]) -> dict[str, Any]:
    """A chat answer in the shape of OpenAI's deprecated `functions` API: its first tool
    call as `message.function_call`, finished by "function_call"."""
    for choice in body["choices"]:
        message = choice["message"]
        if calls := message.pop("tool_calls", None):
            message["function_call"] = calls[0]["function"]
            if choice["finish_reason"] == "tool_calls":
                choice["finish_reason"] = "function_call"
    return body


async def as_function_call_chunks(
    chunks: AsyncIterator[dict[str, Any]],
) -> AsyncIterator[dict[str, Any]]:
    """A streamed chat answer in that shape: the first call's name, then its arguments
    in pieces, as `delta.function_call`; any further calls are left out, as the API has
    room for one."""
    async for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            firsts = [c["function"] for c in delta.pop("tool_calls", ()) if c["index"] == 0]
            if firsts:
                delta["function_call"] = firsts[0]
            if choice["finish_reason"] == "tool_calls":
                choice["finish_reason"] = "function_call"
        if not chunk["choices"] or any(c["delta"] or c["finish_reason"] for c in chunk["choices"]):
            yield chunk


def sse(
    chunks: AsyncIterator[dict[str, Any]],
    done_line: bool = True,
    named: bool = False,
    error: Callable[[ApiError], dict[str, Any]] = ApiError.body,
) -> StreamingResponse:
    """Server-sent events: one `data:` line per chunk, then `data: [DONE]` (OpenAI's chat
    and completions; not llama-server's own endpoints'). `named` (Anthropic's API and the
    Responses API): each event named by its type (`event:`), no [DONE]. A failure
    mid-stream becomes an `error` event (the status line is long gone)."""

    def event(data: dict[str, Any]) -> str:
        name = f"event: {data['type']}\n" if named else ""
        return f"{name}data: {json.dumps(data, ensure_ascii=False)}\n\n"

    async def lines() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield event(chunk)
        except ApiError as e:
            yield event(error(e))
            return
        if done_line and not named:
            yield "data: [DONE]\n\n"

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(lines(), media_type="text/event-stream", headers=headers)


def short_id() -> str:
    return uuid.uuid4().hex[:12]
