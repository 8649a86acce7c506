"""The HTTP routes, shaped as OpenAI's so its SDKs and the editors that use them work
unmodified: chat and plain completions (streamed as server-sent events or not),
models, health and Prometheus metrics; llama-server's own (/infill, /completion,
/tokenize, /props); and the APIs agents speak that become a chat on the way in,
Anthropic's Messages API (localspec.server.anthropic, Claude Code) and OpenAI's
Responses API (localspec.server.responses, Codex CLI).

A request is read, checked and tokenized (localspec.server.prepare), then queued for
the worker; its answer comes back as engine events, shaped here. Every refusal is a
4xx in its API's error shape; nothing here lets a traceback reach a client.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from localspec import version
from localspec.decoding.events import Event, Finished, Piece, Stats, StopReason
from localspec.server import anthropic, native, responses
from localspec.server.calls import rewriter
from localspec.server.chat import (
    ToolCall,
    ToolCallDeltas,
    ToolCallStream,
)
from localspec.server.errors import ApiError, error_body
from localspec.server.guard import Guard, GuardMiddleware
from localspec.server.infill import (
    InfillRequest,
    infill_body,
    pick_fields,
)
from localspec.server.prepare import (
    Prepared,
    prepare_chat,
    prepare_completion,
    prepare_infill,
    prepare_llama_completion,
    read_body,
    render_chat,
)
from localspec.server.schemas import (
    ChatRequest,
    CompletionRequest,
    LlamaCompletionRequest,
    parse,
)
from localspec.server.worker import Failed, Job, Worker
from localspec.session import Session
from localspec.thinking import Split

FINISH_REASONS: dict[StopReason, str] = {
    "eog": "stop",
    "stop_string": "stop",
    "max_tokens": "length",
    "context_full": "length",
    "cancelled": "stop",
}


@dataclass(frozen=True)
class ServerOptions:
    model_id: str  # the name clients use; the target file's stem is accepted too
    draft_id: str | None = None
    api_key: str | None = None
    max_queue: int = 16
    max_body_bytes: int = 8 << 20
    parallel: int = 1  # slots: requests decoded at once
    cache_reuse: int = 0  # move cached chunks of at least this many tokens (0: off)
    # which Host and Origin headers are answered (by default any: `serve` sets its own)
    guard: Guard = field(default_factory=lambda: Guard(None, frozenset({"*"})))


def create_app(session: Session, options: ServerOptions) -> FastAPI:
    worker = Worker(session, options.max_queue, options.parallel, options.cache_reuse)
    metrics = worker.metrics

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        worker.start()
        yield
        worker.stop()

    app = FastAPI(title="localspec", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(GuardMiddleware, guard=options.guard)
    app.state.worker = worker

    def check_key(request: Request) -> None:
        if options.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else ""
        given = given or request.headers.get("x-api-key", "")  # Anthropic's clients' header
        if not hmac.compare_digest(given.encode(), options.api_key.encode()):
            raise ApiError(401, "missing or wrong API key", code="invalid_api_key")

    guarded = [Depends(check_key)]

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, e: ApiError) -> Response:
        metrics.observe_request(request.url.path, e.status)
        body = anthropic.error_body(e) if in_anthropic(request) else e.body()
        return JSONResponse(body, status_code=e.status, headers=e.headers)

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, e: HTTPException) -> Response:
        message = str(e.detail)
        if e.status_code == 404:  # say what is served (an embeddings client, a typo)
            paths = sorted({route.path for route in app.routes if isinstance(route, APIRoute)})
            message = f"no {request.method} {request.url.path} here; served: {', '.join(paths)}"
        elif e.status_code == 405:
            message = f"{request.url.path} does not take {request.method}"
        return await on_api_error(request, ApiError(e.status_code, message))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, e: RequestValidationError) -> Response:
        return await on_api_error(request, ApiError(400, str(e)))

    @app.exception_handler(Exception)
    async def on_failure(request: Request, e: Exception) -> Response:
        metrics.observe_request(request.url.path, 500)
        message = f"internal error: {type(e).__name__}: {e}"
        if in_anthropic(request):
            return JSONResponse(anthropic.error_body(ApiError(500, message)), status_code=500)
        return JSONResponse(error_body(message, "server_error"), status_code=500)

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": options.model_id,
            "draft": options.draft_id,
            "queue_depth": worker.depth(),
            "slots": len(worker.slots),
        }

    @app.get("/v1/models", dependencies=guarded)
    @app.get("/models", dependencies=guarded)  # the paths without /v1, as llama-server's
    async def models() -> dict[str, Any]:
        metrics.observe_request("/v1/models", 200)
        entry = {
            "id": options.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "localspec",
            "draft": options.draft_id,
            # what Anthropic's SDKs read of a model
            "type": "model",
            "display_name": options.model_id,
            "created_at": "1970-01-01T00:00:00Z",
        }
        ends = {"first_id": options.model_id, "last_id": options.model_id, "has_more": False}
        return {"object": "list", "data": [entry], **ends}

    @app.post("/tokenize", dependencies=guarded)
    async def tokenize(request: Request) -> dict[str, Any]:
        body = parse(native.TokenizeRequest, await read_body(request, options.max_body_bytes))
        return await run_in_threadpool(native.tokenize, session.target, body)

    @app.post("/detokenize", dependencies=guarded)
    async def detokenize(request: Request) -> dict[str, Any]:
        body = parse(native.DetokenizeRequest, await read_body(request, options.max_body_bytes))
        return native.detokenize(session.target, body)

    @app.get("/props", dependencies=guarded)
    async def props() -> dict[str, Any]:
        return native.props(session.target, options.model_id, len(worker.slots), version())

    @app.get("/metrics", dependencies=guarded)
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def answer(
        request: Request, prepare: Callable[[], Prepared], label: str, kind: str
    ) -> Answer:
        """The request prepared (off the event loop) and queued: its answer, to be shaped
        from the worker's events as they come."""
        prepared = await run_in_threadpool(prepare)
        job = Job(
            label,
            prepared.prompt,
            prepared.config,
            asyncio.get_running_loop(),
            prepared.prediction,
            prepared.source,
        )
        worker.submit(job)
        metrics.observe_request(request.url.path, 200)
        return Answer(
            job, prepared, options.model_id, kind, worker.withdraw, session.target.token_bytes
        )

    @app.post("/v1/chat/completions", dependencies=guarded)
    @app.post("/chat/completions", dependencies=guarded)
    async def chat_completions(request: Request) -> Response:
        body = parse(ChatRequest, await read_body(request, options.max_body_bytes))
        chat = await answer(
            request, lambda: prepare_chat(body, session), f"chat {short_id()}", "chat.completion"
        )
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return sse(chat.stream_chat(usage))
        return JSONResponse(await chat.collect(request, chat.chat_body))

    @app.post("/v1/completions", dependencies=guarded)
    async def completions(request: Request) -> Response:
        body = parse(CompletionRequest, await read_body(request, options.max_body_bytes))
        completion = await answer(
            request,
            lambda: prepare_completion(body, session),
            f"completion {short_id()}",
            "text_completion",
        )
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return sse(completion.stream_completion(usage))
        return JSONResponse(await completion.collect(request, completion.completion_body))

    @app.post("/v1/messages", dependencies=guarded)
    async def messages(request: Request) -> Response:
        """Anthropic's Messages API (Claude Code, Anthropic's SDKs), answered as a chat."""
        body = parse(anthropic.MessagesRequest, await read_body(request, options.max_body_bytes))
        chat = body.chat()
        message = await answer(
            request, lambda: prepare_chat(chat, session), f"message {short_id()}", "chat.completion"
        )
        message_id = f"msg_{short_id()}"

        def ending(done: Finished, called: bool) -> tuple[str, str | None]:
            limit = message.prepared.config.max_tokens
            return anthropic.ending(done, called, body.asked_tokens(), limit)

        def finish(called: bool) -> tuple[str, str | None]:
            assert message.done is not None  # the chunks ended with it
            return ending(message.done, called)

        if body.stream:
            prompt = len(message.job.prompt)
            stream = anthropic.MessageStream(message_id, options.model_id, prompt)
            events = stream.events(message.stream_chat(True), finish)
            return sse(events, named=True, error=anthropic.error_body)

        def build(events: list[Event], done: Finished) -> dict[str, Any]:
            chat_body = message.chat_body(events, done)
            called = bool(chat_body["choices"][0]["message"].get("tool_calls"))
            return anthropic.message_body(message_id, chat_body, ending(done, called))

        return JSONResponse(await message.collect(request, build))

    @app.post("/v1/messages/count_tokens", dependencies=guarded)
    async def count_tokens(request: Request) -> dict[str, Any]:
        body = parse(anthropic.MessagesRequest, await read_body(request, options.max_body_bytes))
        chat = body.chat()
        prompt = await run_in_threadpool(lambda: render_chat(chat, session).tokens)
        metrics.observe_request(request.url.path, 200)
        return {"input_tokens": len(prompt)}

    @app.post("/v1/responses", dependencies=guarded)
    @app.post("/responses", dependencies=guarded)
    async def create_response(request: Request) -> Response:
        """OpenAI's Responses API (Codex CLI, the SDKs' `responses`), answered as a chat."""
        body = parse(responses.ResponsesRequest, await read_body(request, options.max_body_bytes))
        chat = body.chat()
        response = await answer(
            request,
            lambda: prepare_chat(chat, session),
            f"response {short_id()}",
            "chat.completion",
        )
        ids = responses.ItemIds(short_id())
        if body.stream:
            stream = responses.ResponseStream(ids, options.model_id, body)
            events = stream.events(response.stream_chat(True), lambda: response.done)
            return sse(events, named=True, error=responses.error_event)

        def build(events: list[Event], done: Finished) -> dict[str, Any]:
            chat_body = response.chat_body(events, done)
            output = responses.output_items(chat_body["choices"][0]["message"], ids)
            whole = responses.response_body(
                ids, options.model_id, body, output, done, chat_body["usage"]
            )
            return whole | {"localspec": chat_body["localspec"]}

        return JSONResponse(await response.collect(request, build))

    @app.post("/infill", dependencies=guarded)
    async def infill(request: Request) -> Response:
        """llama-server's fill-in-the-middle endpoint, as llama.vim and llama.vscode call it."""
        body = parse(InfillRequest, await read_body(request, options.max_body_bytes))
        middle = await answer(
            request, lambda: prepare_infill(body, session), f"infill {short_id()}", "infill"
        )
        return await answer_as_llama_server(request, middle, body)

    @app.post("/completion", dependencies=guarded)
    @app.post("/completions", dependencies=guarded)
    async def llama_completion(request: Request) -> Response:
        """llama-server's own completion endpoint (Continue's `llama.cpp` provider)."""
        body = parse(LlamaCompletionRequest, await read_body(request, options.max_body_bytes))
        completion = await answer(
            request,
            lambda: prepare_llama_completion(body, session),
            f"completion {short_id()}",
            "infill",
        )
        return await answer_as_llama_server(request, completion, body)

    async def answer_as_llama_server(
        request: Request, answered: Answer, body: InfillRequest | LlamaCompletionRequest
    ) -> Response:
        """llama-server's response body (`content`, `timings`, ...), or its stream."""
        job, prepared = answered.job, answered.prepared

        def build(_events: list[Event], done: Finished) -> dict[str, Any]:
            whole = infill_body(
                done,
                options.model_id,
                len(job.prompt),
                job.cached_tokens,
                prepared.truncated,
                prepared.lines,
                body.return_tokens,
            )
            return pick_fields(whole, body.response_fields)

        if body.stream:
            return sse(answered.stream_infill(build), done_line=False)
        return JSONResponse(await answered.collect(request, build))

    return app


# --- answering -------------------------------------------------------------------------
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

    # --- not streamed ----------------------------------------------------------------
    async def collect(
        self, request: Request, build: Callable[[list[Event], Finished], dict[str, Any]]
    ) -> dict[str, Any]:
        """Wait for the whole answer; a client that leaves meanwhile cancels it at once
        (its disconnect is the next message the request receives)."""
        events: list[Event] = []
        watcher = asyncio.create_task(self.watch(request))
        try:
            async for event in self.events():
                events.append(event)
                if isinstance(event, Finished):
                    return build(events, event)
            raise ApiError(500, "the answer ended without finishing")
        finally:
            watcher.cancel()

    async def watch(self, request: Request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.withdraw(self.job)

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
            "logprobs": self.chat_logprobs(events),
        }
        return self.envelope("chat.completion", [choice]) | self.figures(done)

    def completion_body(self, events: list[Event], done: Finished) -> dict[str, Any]:
        choice = {
            "index": 0,
            "text": done.text,
            "finish_reason": self.finish_reason(done, False),
            "logprobs": self.completion_logprobs(events),
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
        if not self.tools:
            return text, []
        if (native := rewriter(self.tools, self.tool_params)) is not None:
            text = native.push(text) + native.flush()
        calls = ToolCallStream(self.tool_params)
        content, found = calls.push(text)
        rest, more = calls.flush()
        return content + rest, found + more

    # --- streamed --------------------------------------------------------------------
    async def stream_chat(self, include_usage: bool) -> AsyncIterator[dict[str, Any]]:
        yield self.chat_chunk({"role": "assistant", "content": ""})
        calls = ToolCallDeltas(self.tool_params) if self.tools else None
        native = rewriter(self.tools, self.tool_params)  # its calls as Qwen's tags
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
        async for event in self.events():
            if isinstance(event, Piece) and event.text:
                yield {"index": 0, "content": event.text, "stop": False, "id_slot": 0}
            elif isinstance(event, Finished):
                yield {**build([], event), "content": ""}

    async def events(self) -> AsyncIterator[Event]:
        """The job's events; a client that leaves (the stream is closed) cancels it."""
        try:
            async for event in self.job.events():
                if isinstance(event, Failed):
                    raise failure(event)
                if isinstance(event, Finished):
                    self.done = event
                yield event
        finally:  # over either way: a slot stops within the round, the queue drops it
            self.withdraw(self.job)

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
    def scored(self, events: list[Event]) -> list[Piece]:
        return [e for e in events if isinstance(e, Piece) and e.logprob is not None]

    def token_entry(self, token: int, logprob: float) -> dict[str, Any]:
        raw = self.token_bytes(token)
        text = raw.decode("utf-8", "replace")
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    def chat_logprobs(self, events: list[Event]) -> dict[str, Any] | None:
        """{"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}"""
        if not self.logprobs:
            return None
        content = [
            self.token_entry(p.token, p.logprob or 0.0)
            | {"top_logprobs": [self.token_entry(t, lp) for t, lp in p.top_logprobs]}
            for p in self.scored(events)
        ]
        return {"content": content} if content else None

    def completion_logprobs(self, events: list[Event]) -> dict[str, Any] | None:
        """The legacy shape: tokens, token_logprobs, top_logprobs ({token: logprob})."""
        if not self.logprobs:
            return None
        pieces = self.scored(events)
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
        return "tool_calls" if called else FINISH_REASONS[done.stop_reason]

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
    }


def failure(event: Failed) -> ApiError:
    return ApiError(500, f"generation failed: {event.message}", code="generation_failed")


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


def in_anthropic(request: Request) -> bool:
    """A request to Anthropic's API, answered in its error shape."""
    return request.url.path.startswith("/v1/messages")


def short_id() -> str:
    return uuid.uuid4().hex[:12]
