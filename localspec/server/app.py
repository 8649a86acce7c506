"""The HTTP routes, shaped as OpenAI's so its SDKs and the editors that use them work
unmodified: chat and plain completions (streamed as server-sent events or not),
models, health and Prometheus metrics; llama-server's own (/infill, /completion,
/tokenize, /apply-template, /props); and the APIs agents speak that become a chat on the
way in, Anthropic's Messages API (localspec.server.anthropic, Claude Code) and OpenAI's
Responses API (localspec.server.responses, Codex CLI).

A request is read, checked and tokenized (localspec.server.prepare), then queued for
the worker; its answer comes back as engine events, shaped by its API
(localspec.server.answer). Every refusal is a
4xx in its API's error shape; nothing here lets a traceback reach a client.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from localspec import version
from localspec.backends.base import Cancelled, ModelError
from localspec.backends.embedding import embedding_limit, embedding_size
from localspec.backends.llama import LlamaModel
from localspec.decoding.events import Event, Finished
from localspec.decoding.opening import pieces_of
from localspec.server import anthropic, choices, native, responses, responses_out, slot_files
from localspec.server.anchors import Anchors
from localspec.server.answer import (
    Answer,
    as_function_call,
    as_function_call_chunks,
    on_disconnect,
    short_id,
    sse,
)
from localspec.server.custom_calls import as_custom_call_chunks, as_custom_calls
from localspec.server.defaults import ReasoningDefaults, SamplingDefaults, T
from localspec.server.embeddings import EmbeddingRequest, embeddings_body, token_lists
from localspec.server.errors import ApiError, error_body, parse
from localspec.server.guard import Guard, GuardMiddleware
from localspec.server.infill import (
    InfillRequest,
    infill_body,
    pick_fields,
)
from localspec.server.jobs import Job
from localspec.server.prepare import (
    ChatPrompt,
    Prepared,
    prepare_chat,
    prepare_completion,
    prepare_infill,
    prepare_llama_completion,
    read_body,
    render_chat,
)
from localspec.server.schemas import ChatRequest, CompletionRequest, LlamaCompletionRequest
from localspec.server.worker import Worker
from localspec.session import Session

log = logging.getLogger("localspec.server")

# requests that amount to a chat: what the token-counting endpoints read
ChatSource = ChatRequest | anthropic.MessagesRequest | responses.ResponsesRequest


@dataclass(frozen=True)
class ServerOptions:
    model_id: str  # the name clients use; the target file's stem is accepted too
    draft_id: str | None = None
    api_key: str | None = None
    max_queue: int = 16
    max_body_bytes: int = 8 << 20
    parallel: int = 1  # slots: requests decoded at once
    cache_reuse: int = 0  # move cached chunks of at least this many tokens (0: off)
    cache_ram: int = 0  # bytes of RAM for prompts the slots gave up (0: none kept)
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)  # for requests' gaps
    reasoning: ReasoningDefaults = field(default_factory=ReasoningDefaults)  # and a chat's
    max_tokens: int | None = None  # an answer's most tokens, whatever a request asks
    slots_endpoint: bool = True  # GET /slots (llama-server's --slots; --no-slots: off)
    slot_save_path: Path | None = None  # where POST /slots/{id} saves caches (None: off)
    # which Host and Origin headers are answered (by default any: `serve` sets its own)
    guard: Guard = field(default_factory=lambda: Guard(None, frozenset({"*"})))


def create_app(session: Session, options: ServerOptions) -> FastAPI:
    worker = Worker(
        session, options.max_queue, options.parallel, options.cache_reuse, options.cache_ram
    )
    metrics = worker.metrics
    anchors = Anchors()  # where editors' middles are laid out: Enter reads one line

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if session.target.fim_tokens().complete:  # not on the first completion's time
            pieces_of(session.target)
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

    def fill(body: T) -> T:
        return options.reasoning.fill(options.sampling.fill(body))

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, e: ApiError) -> Response:
        metrics.observe_request(endpoint(request), e.status)
        body = anthropic.error_body(e) if in_anthropic(request) else e.body()
        return JSONResponse(body, status_code=e.status, headers=e.headers)

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, e: HTTPException) -> Response:
        message = str(e.detail)
        if e.status_code == 404:  # say what is served (an embeddings client, a typo)
            paths = sorted(
                {r.path.replace(":path}", "}") for r in app.routes if isinstance(r, APIRoute)}
            )
            message = f"no {request.method} {request.url.path} here; served: {', '.join(paths)}"
        elif e.status_code == 405:
            message = f"{request.url.path} does not take {request.method}"
        return await on_api_error(request, ApiError(e.status_code, message))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, e: RequestValidationError) -> Response:
        return await on_api_error(request, ApiError(400, str(e)))

    @app.exception_handler(Exception)
    async def on_failure(request: Request, e: Exception) -> Response:
        metrics.observe_request(endpoint(request), 500)
        message = f"internal error: {type(e).__name__}: {e}"
        if in_anthropic(request):
            return JSONResponse(anthropic.error_body(ApiError(500, message)), status_code=500)
        return JSONResponse(error_body(message, "server_error"), status_code=500)

    @app.get("/", response_class=PlainTextResponse)
    async def home(request: Request) -> str:
        """What someone who opens the printed address in a browser sees."""
        base = str(request.base_url).rstrip("/")
        draft = f", drafting with {options.draft_id}" if options.draft_id else ""
        n = len(worker.slots)
        return (
            f"localspec is serving {options.model_id}{draft}, {n} slot{'s' * (n > 1)}.\n\n"
            f"OpenAI API:     {base}/v1  (POST /v1/chat/completions, /v1/completions, "
            "/v1/responses, /v1/embeddings; GET /v1/models)\n"
            f"Anthropic API:  {base}  (POST /v1/messages)\n"
            "llama-server's: POST /infill, /completion, /tokenize, /slots/ID; GET /props\n"
            "Figures:        GET /metrics, /health, /slots\n"
        )

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": options.model_id,
            "draft": options.draft_id,
            "queue_depth": worker.depth(),
            "slots": len(worker.slots),
            "reading_ahead": worker.reading_ahead(),  # idle slots' draft models catching up
        }

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

    @app.get("/v1/models", dependencies=guarded)
    @app.get("/models", dependencies=guarded)  # the paths without /v1, as llama-server's
    async def models() -> dict[str, Any]:
        metrics.observe_request("/v1/models", 200)
        ends = {"first_id": options.model_id, "last_id": options.model_id, "has_more": False}
        return {"object": "list", "data": [entry], **ends}

    @app.get("/v1/models/{name:path}", dependencies=guarded)
    @app.get("/models/{name:path}", dependencies=guarded)
    async def model(name: str) -> dict[str, Any]:
        """The SDKs' `models.retrieve`: the loaded model, by whatever name, as a request
        that names another model is answered by it."""
        metrics.observe_request("/v1/models/{model}", 200)
        return entry

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
        slots = len(worker.slots)
        return native.props(session.target, options.model_id, slots, version(), fill)

    @app.get("/slots", dependencies=guarded)
    async def slots(fail_on_no_slot: str = "") -> list[dict[str, Any]]:
        """What each slot does (llama-server's figures, and its drafts); a 503 with
        `?fail_on_no_slot=1` where every slot is busy (a load balancer's question)."""
        if not options.slots_endpoint:
            raise ApiError(501, "this server's /slots is off (--no-slots)", code="not_supported")
        states, idle = native.slots(worker)
        if fail_on_no_slot and not idle:
            raise ApiError(503, "no slot available", code="unavailable")
        return states

    @app.post("/slots/{id_slot}", dependencies=guarded)
    async def slot_action(request: Request, id_slot: str, action: str = "") -> dict[str, Any]:
        """llama-server's: a slot's cache saved to a file of --slot-save-path, restored
        from one, or erased, once the slot is idle (slot_files.py)."""
        if options.slot_save_path is None:
            raise ApiError(501, "this server saves no slots: start it with --slot-save-path DIR")
        index = int(id_slot) if id_slot.isdigit() else -1
        if not 0 <= index < len(worker.slots):
            raise ApiError(400, f"no slot {id_slot!r}: the slots are 0-{len(worker.slots) - 1}")
        if action not in ("save", "restore", "erase"):
            raise ApiError(400, "action: save, restore or erase", "action")
        name = ""
        if action != "erase":
            body = await read_body(request, options.max_body_bytes)
            name = slot_files.checked_name(parse(slot_files.SlotFileRequest, body).filename)
        return await run_in_threadpool(slot_chore, index, action, options.slot_save_path / name)

    def slot_chore(index: int, action: str, path: Path) -> dict[str, Any]:
        with worker.holding(index) as slot:
            if action == "save":
                return slot_files.save(slot, path)
            return slot_files.restore(slot, path) if action == "restore" else slot_files.erase(slot)

    @app.get("/metrics", dependencies=guarded)
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def answer(
        request: Request, prepare: Callable[[], Prepared], label: str, kind: str
    ) -> Answer:
        """The request prepared (off the event loop) and queued: its answer, to be shaped
        from the worker's events as they come."""
        return (await answers(request, lambda: [prepare()], label, kind))[0]

    async def answers(
        request: Request, prepare: Callable[[], list[Prepared]], label: str, kind: str, n: int = 1
    ) -> list[Answer]:
        """`answer` for a request with n answers to each of its prompts (choices.py): a job
        each, those after a prompt's first copying its cache (`Job.twin`), a seed each
        (the request's + j) where it sets one; all queued, or none."""
        made: list[Answer] = []
        for prepared in await run_in_threadpool(prepare):
            first: Job | None = None
            for j in range(n):
                job = make_job(prepared, label, first, j)
                first = first or job
                made.append(
                    Answer(
                        job,
                        prepared,
                        options.model_id,
                        kind,
                        worker.withdraw,
                        session.target.token_bytes,
                    )
                )
        if len(made) > 1:
            for i, a in enumerate(made):
                a.job.label = f"{label} ({i + 1} of {len(made)})"
        submitted: list[Job] = []
        try:
            for a in made:
                worker.submit(a.job)
                submitted.append(a.job)
        except ApiError:
            for job in submitted:
                worker.withdraw(job)
            raise
        metrics.observe_request(endpoint(request), 200)
        return made

    def make_job(prepared: Prepared, label: str, twin: Job | None, j: int) -> Job:
        config = prepared.config
        if options.max_tokens is not None and config.max_tokens > options.max_tokens:
            config = replace(config, max_tokens=options.max_tokens)
        if j and config.sampling.seed is not None:
            config = replace(
                config, sampling=replace(config.sampling, seed=config.sampling.seed + j)
            )
        return Job(
            label,
            prepared.prompt,
            config,
            asyncio.get_running_loop(),
            prepared.prediction,
            prepared.source,
            middle=prepared.middle,
            twin=twin,
        )

    @app.post("/v1/chat/completions", dependencies=guarded)
    @app.post("/chat/completions", dependencies=guarded)
    async def chat_completions(request: Request) -> Response:
        body = fill(parse(ChatRequest, await read_body(request, options.max_body_bytes)))
        chats = await answers(
            request,
            lambda: [prepare_chat(body, session)],
            f"chat {short_id()}",
            "chat.completion",
            body.choices,
        )
        custom = body.custom_names()
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            chunks = choices.stream(chats, [chat.stream_chat(usage) for chat in chats])
            if custom:
                chunks = as_custom_call_chunks(chunks, custom)
            return sse(as_function_call_chunks(chunks) if body.answers_functions else chunks)
        reply = await choices.collect(chats, request, lambda chat: chat.chat_body)
        if custom:
            reply = as_custom_calls(reply, custom)
        return JSONResponse(as_function_call(reply) if body.answers_functions else reply)

    @app.post("/v1/completions", dependencies=guarded)
    async def completions(request: Request) -> Response:
        body = fill(parse(CompletionRequest, await read_body(request, options.max_body_bytes)))
        prompts = body.prompts()
        completions = await answers(
            request,
            lambda: [prepare_completion(body, session, prompt, anchors) for prompt in prompts],
            f"completion {short_id()}",
            "text_completion",
            body.choices,
        )
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            streams = [c.stream_completion(usage) for c in completions]
            return sse(choices.stream(completions, streams))
        return JSONResponse(
            await choices.collect(completions, request, lambda c: c.completion_body)
        )

    @app.post("/v1/embeddings", dependencies=guarded)
    async def embeddings(request: Request) -> dict[str, Any]:
        """OpenAI's embeddings, from the served model's own weights (embeddings.py)."""
        body = parse(EmbeddingRequest, await read_body(request, options.max_body_bytes))
        target = session.target
        if not isinstance(target, LlamaModel):
            raise ApiError(501, f"{options.model_id} gives no embeddings")
        limit, size = embedding_limit(target), embedding_size(target)
        texts = await run_in_threadpool(token_lists, body, target, limit, size)
        cancel = threading.Event()
        watcher = asyncio.create_task(on_disconnect(request, cancel.set))
        try:
            vectors = await asyncio.wrap_future(worker.embed(texts, cancel))
        except Cancelled:
            if worker.stopping:
                raise ApiError(503, "the server is shutting down", code="shutting_down") from None
            log.info("embeddings cancelled: the client left")
            raise ApiError(499, "the client left") from None
        except ModelError as e:  # no memory for its context, or llama.cpp's pass failed
            raise ApiError(500, str(e), code="embeddings_failed") from None
        finally:
            watcher.cancel()
        metrics.observe_request(endpoint(request), 200)
        tokens = sum(len(t) for t in texts)
        return embeddings_body(vectors, options.model_id, tokens, body.encoding_format)

    @app.post("/v1/messages", dependencies=guarded)
    async def messages(request: Request) -> Response:
        """Anthropic's Messages API (Claude Code, Anthropic's SDKs), answered as a chat."""
        body = parse(anthropic.MessagesRequest, await read_body(request, options.max_body_bytes))
        chat = fill(body.chat())
        message = await answer(
            request, lambda: prepare_chat(chat, session), f"message {short_id()}", "chat.completion"
        )
        message_id = f"msg_{short_id()}"

        def ending(done: Finished, called: bool) -> tuple[str, str | None]:
            limit = message.prepared.config.max_tokens
            capped = message.job.config.max_tokens < limit  # `serve --max-tokens` ended it
            return anthropic.ending(done, called, body.asked_tokens(), limit, capped)

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

    async def rendered(request: Request, kind: type[ChatSource]) -> ChatPrompt:
        """The prompt the request would be answered from."""
        body = parse(kind, await read_body(request, options.max_body_bytes))
        chat = body if isinstance(body, ChatRequest) else body.chat()
        prompt = await run_in_threadpool(render_chat, chat, session, False)  # nothing read
        metrics.observe_request(endpoint(request), 200)
        return prompt

    async def count_prompt(request: Request, kind: type[ChatSource]) -> int:
        return len((await rendered(request, kind)).tokens)

    @app.post("/apply-template", dependencies=guarded)
    async def apply_template(request: Request) -> dict[str, Any]:
        """llama-server's: a chat request's messages and tools through the template."""
        return {"prompt": (await rendered(request, ChatRequest)).text}

    @app.post("/v1/messages/count_tokens", dependencies=guarded)
    async def count_tokens(request: Request) -> dict[str, Any]:
        return {"input_tokens": await count_prompt(request, anthropic.MessagesRequest)}

    @app.post("/v1/responses/input_tokens", dependencies=guarded)
    @app.post("/responses/input_tokens", dependencies=guarded)
    async def responses_input_tokens(request: Request) -> dict[str, Any]:
        """OpenAI's count of a Responses request's input (llama-server's too)."""
        counted = await count_prompt(request, responses.ResponsesRequest)
        return {"object": "response.input_tokens", "input_tokens": counted}

    @app.post("/v1/chat/completions/input_tokens", dependencies=guarded)
    @app.post("/chat/completions/input_tokens", dependencies=guarded)
    async def chat_input_tokens(request: Request) -> dict[str, Any]:
        """llama-server's count of a chat request's prompt."""
        counted = await count_prompt(request, ChatRequest)
        return {"object": "response.input_tokens", "input_tokens": counted}

    @app.post("/v1/responses", dependencies=guarded)
    @app.post("/responses", dependencies=guarded)
    async def create_response(request: Request) -> Response:
        """OpenAI's Responses API (Codex CLI, the SDKs' `responses`), answered as a chat."""
        body = parse(responses.ResponsesRequest, await read_body(request, options.max_body_bytes))
        body = fill(body)  # the response echoes its temperature
        chat = fill(body.chat())
        response = await answer(
            request,
            lambda: prepare_chat(chat, session),
            f"response {short_id()}",
            "chat.completion",
        )
        ids = responses_out.ItemIds(short_id())
        if body.stream:
            stream = responses_out.ResponseStream(ids, options.model_id, body)
            events = stream.events(response.stream_chat(True), lambda: response.done)
            return sse(events, named=True, error=responses_out.error_event)

        def build(events: list[Event], done: Finished) -> dict[str, Any]:
            chat_body = response.chat_body(events, done)
            output = responses_out.output_items(
                chat_body["choices"][0]["message"], ids, body.custom_names()
            )
            whole = responses_out.response_body(
                ids, options.model_id, body, output, done, chat_body["usage"]
            )
            return whole | {"localspec": chat_body["localspec"]}

        return JSONResponse(await response.collect(request, build))

    @app.post("/infill", dependencies=guarded)
    async def infill(request: Request) -> Response:
        """llama-server's fill-in-the-middle endpoint, as llama.vim and llama.vscode call it."""
        body = fill(parse(InfillRequest, await read_body(request, options.max_body_bytes)))
        prepare = partial(prepare_infill, body, session, anchors)
        middle = await answer(request, prepare, f"infill {short_id()}", "infill")
        return await answer_as_llama_server(request, middle, body)

    @app.post("/completion", dependencies=guarded)
    @app.post("/completions", dependencies=guarded)
    async def llama_completion(request: Request) -> Response:
        """llama-server's own completion endpoint (Continue's `llama.cpp` provider)."""
        body = fill(parse(LlamaCompletionRequest, await read_body(request, options.max_body_bytes)))
        completion = await answer(
            request,
            lambda: prepare_llama_completion(body, session, anchors),
            f"completion {short_id()}",
            "infill",
        )
        return await answer_as_llama_server(request, completion, body)

    async def answer_as_llama_server(
        request: Request, answered: Answer, body: InfillRequest | LlamaCompletionRequest
    ) -> Response:
        """llama-server's response body (`content`, `timings`, ...), or its stream."""
        job, prepared = answered.job, answered.prepared

        def build(events: list[Event], done: Finished) -> dict[str, Any]:
            whole = infill_body(
                done,
                options.model_id,
                len(job.prompt),
                job.cached_tokens,
                prepared.truncated,
                prepared.lines,
                body.return_tokens,
                answered.unopened.inside if answered.unopened else 0,
                job.slot or 0,
            )
            if answered.logprobs and events:  # streamed, each piece had its own
                lead = answered.unopened.lead if answered.unopened else 0
                whole["completion_probabilities"] = answered.token_logprobs(events, done.text, lead)
            return pick_fields(whole, body.response_fields)

        if body.stream:
            return sse(answered.stream_infill(build), done_line=False)
        return JSONResponse(await answered.collect(request, build))

    return app


def endpoint(request: Request) -> str:
    """A request's route, as /metrics labels it: a path served, else "unknown" (a
    scanner's made-up paths would each add a series)."""
    return getattr(request.scope.get("route"), "path", "unknown")


def in_anthropic(request: Request) -> bool:
    """A request to Anthropic's API, answered in its error shape."""
    return request.url.path.startswith("/v1/messages")
