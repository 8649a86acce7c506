"""Reading and checking a request: its body (within the size limit), its prompt
through the chat template, its sampling and token limit, what it must follow (a JSON
schema, a GBNF grammar, a forced tool call), each refusal a one-line 4xx that names the
parameter. What comes out, `Prepared`, is what the worker decodes.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import jinja2
from fastapi import Request

from localspec.backends.base import Model, ModelError
from localspec.backends.llama import LlamaModel
from localspec.backends.llama_grammar import (
    GrammarError,
    LlamaGrammar,
    json_object_grammar,
    schema_grammar,
)
from localspec.decoding.budget import ThoughtBudget
from localspec.decoding.engine import GenerationConfig
from localspec.decoding.grammar import Grammar
from localspec.decoding.lazy import LONG_REACH, Triggered, trigger_pattern
from localspec.decoding.opening import Opening
from localspec.decoding.sampling import BANNED
from localspec.server.anchors import Anchors, Placed
from localspec.server.calls import gemma_tool_responses, llama_builtins, shown_markers
from localspec.server.chat import (
    CALL_STYLE,
    GEMMA4,
    LLAMA3,
    forced_tools,
    lazy_tool_grammar,
    prefill,
    template_messages,
    template_tools,
    tool_format,
    tool_grammar,
)
from localspec.server.errors import ApiError
from localspec.server.fence import chat_grammar
from localspec.server.infill import (
    InfillLines,
    InfillPrompt,
    InfillRequest,
    infill_prompt,
    middle_config,
    templated_fim,
)
from localspec.server.native import token_ids
from localspec.server.schemas import (
    ChatRequest,
    CompletionRequest,
    GenerationBody,
    LlamaCompletionRequest,
    content_text,
)
from localspec.session import Session, TemplateKwargsError, shown_tokens, template_kwargs
from localspec.thinking import HARMONY, Thinking, opens_thinking

TRIGGERS = "grammar_triggers"
COMPLETION_DEFAULT_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True)
class Prepared:
    """A checked request, ready for the worker."""

    prompt: list[int]
    config: GenerationConfig
    prediction: list[int] | None = None
    tools: str | None = None  # parse tool calls out of the answer, written this way
    tool_params: dict[str, Any] = field(default_factory=dict)  # their schemas, by name
    source: list[int] | None = None  # a free draft source (FIM: the suffix, other files)
    truncated: bool = False  # the FIM prompt was cut to fit
    lines: InfillLines | None = None  # a middle's line rule (FIM)
    opening: str = ""  # the typed text a middle opens with, not sent back (FIM)
    thinking: Thinking | None = None  # how the model writes its reasoning (None: it does not)
    after_result: bool = False  # the answer follows a tool's result (calls.rewriter)
    middle: bool = False  # fill-in-the-middle: an editor waits on it (a short request)
    fenced: bool = False  # a chat's JSON, which may come in a fence the client never sees

    @classmethod
    def infill(
        cls,
        built: InfillPrompt,
        config: GenerationConfig,
        lines: InfillLines | None,
        model: Model,
    ) -> Prepared:
        """A fill-in-the-middle prompt: its suffix and extra chunks draft, the middle
        opens with the typed text (as a grammar, its tokens beyond the client's limit) and
        is judged line by line."""
        config = middle_config(built, config, model)
        opening = built.opening if isinstance(config.grammar, Opening) else ""
        return cls(
            built.tokens,
            replace(config, lines=lines),
            source=built.source,
            truncated=built.truncated,
            lines=lines,
            opening=opening,
            middle=True,
        )


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 past `limit` bytes (checked as it arrives, not only as declared)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the body is over the limit of {limit} bytes", code="too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the body is over the limit of {limit} bytes", code="too_large")
    return bytes(body)


@dataclass(frozen=True)
class ChatPrompt:
    """A chat's messages and tools through the model's template."""

    text: str
    tokens: list[int]
    template: str | None
    tools: str | None  # the format tool calls are written in (None: no tools offered)
    tool_params: dict[str, Any]  # the tools' schemas, by name
    prefilled: bool = False  # the text ends with an answer begun, for the model to go on
    marks: tuple[int, ...] = ()  # where messages begin, for a recurrent target's checkpoints


def render_chat(body: ChatRequest, session: Session, marks: bool = True) -> ChatPrompt:
    """The prompt a chat request makes (what Anthropic's count_tokens counts too; `marks`:
    with where its messages start, which only a read of it needs)."""
    body.refuse_unsupported()
    tools = template_tools(body, session.supports_tools)
    template = session.target.chat_template()
    family = tool_format(template)
    messages, begun = prefill(template_messages(body.messages))
    if family == GEMMA4:  # a tool's results go back into the calling turn
        messages = gemma_tool_responses(messages)
    try:
        variables = template_kwargs(body.template_variables())
    except TemplateKwargsError as e:
        raise ApiError(400, str(e), "chat_template_kwargs") from None
    params = {t.function.name: t.function.parameters or {} for t in body.tools or []}
    # Meta's built-in tools, called as it trained Llama 3.x to call them
    builtins = llama_builtins(params) if tools and family == LLAMA3 else []
    if builtins and "builtin_tools" in (template or ""):
        variables.setdefault("builtin_tools", builtins)
    try:
        # an answer begun goes on from its last character, in the turn the template opens
        text = session.prompt_text(messages, tools, variables) + (begun or "")
    except ModelError as e:
        raise ApiError(400, f"{e}; use /v1/completions", "messages") from None
    except (ValueError, TypeError, jinja2.TemplateError) as e:
        raise ApiError(400, f"the chat template refused the messages: {e}", "messages") from None
    fmt = family if tools else None
    tokens = session.tokenize_raw(text)
    starts = session.message_marks(messages, text, tokens, tools, variables) if marks else ()
    return ChatPrompt(text, tokens, template, fmt, params, bool(begun), starts)


def prepare_chat(body: ChatRequest, session: Session) -> Prepared:
    chat = render_chat(body, session)
    prediction = None
    if body.prediction is not None:
        predicted = content_text(body.prediction.content)
        prediction = session.target.tokenize(predicted, special=False) or None
    formatted = asked_json(body)[0] != "text"
    if chat.prefilled and (formatted or body.grammar is not None or forced_tools(body)):
        # the grammar would hold the continuation to a whole answer of its own
        raise ApiError(
            400,
            "an assistant message to continue (a prefill) cannot be combined with "
            "response_format, grammar or a forced tool call",
            "messages",
        )
    thinks = opens_thinking(chat.template, chat.text)
    thinking = None if body.reasoning_format == "none" else thinks
    config = generation_config(body, chat.tokens, session, None, "messages", thinking)
    if thinks is not None and body.reasoning_budget_tokens is not None:
        config = replace(config, grammar=thought_budget(body, session, thinks, config.grammar))
    markers = shown_markers(chat.template, chat.tools)
    config = replace(config, shown=shown_tokens(session.target, markers), marks=chat.marks)
    return Prepared(
        chat.tokens,
        config,
        prediction,
        tools=chat.tools,
        tool_params=chat.tool_params,
        after_result=body.messages[-1].role == "tool",
        thinking=thinking,
        fenced=formatted,
    )


def lazy_calls(
    body: GenerationBody, session: Session, thinking: Thinking | None
) -> Triggered | None:
    """The grammar a call the answer may make follows once it opens (`tool_choice`
    "auto" with tools, as llama-server's lazy grammar), in the model's call format; None
    where the format has no opening mark, or a tool's schema cannot be a grammar (the
    call is then read as written, as before)."""
    if not (isinstance(body, ChatRequest) and body.tools and body.tool_choice in (None, "auto")):
        return None
    target = session.target
    if not (session.supports_tools and isinstance(target, LlamaModel)):
        return None
    try:
        several = body.parallel_tool_calls is not False
        lazy = lazy_tool_grammar(body.tools, tool_format(target.chat_template()), several)
        if lazy is None:
            return None
        calls = LlamaGrammar(target, lazy.gbnf, style=CALL_STYLE)
    except GrammarError:
        return None
    if thinking is None:
        return Triggered(target, calls, lazy.trigger, reach=lazy.reach)
    start, end = thinking.block
    marks = (start.encode(), end.encode())
    return Triggered(target, calls, lazy.trigger, marks, thinking.opened, lazy.reach)


def thought_budget(
    body: ChatRequest, session: Session, thinking: Thinking, grammar: Grammar | None
) -> ThoughtBudget:
    """The request's reasoning budget over its grammar (as llama-server's, whatever the
    reasoning_format: it holds the model, not the reply)."""
    marks = thinking.block
    message = body.reasoning_budget_message or ""
    if marks[1] in message:
        raise ApiError(
            400,
            f"reasoning_budget_message holds {marks[1]!r}, which would end the reasoning",
            "reasoning_budget_message",
        )
    budget = body.reasoning_budget_tokens or 0
    return ThoughtBudget.of(session.target, marks, budget, message, thinking.opened, grammar)


def prepare_completion(
    body: CompletionRequest,
    session: Session,
    given: str | list[int] | None = None,
    anchors: Anchors | None = None,
) -> Prepared:
    """The request's prompt (or `given`, one of its batch) ready for the worker; a
    middle's laid out at a recent one's prefix where `anchors` has it (anchors.py)."""
    body.refuse_unsupported()
    given = body.prompts()[0] if given is None else given
    if body.suffix:  # OpenAI's fill-in-the-middle: the prompt before the cursor
        if not isinstance(given, str):
            raise ApiError(400, "a prompt with a suffix must be text, not token ids", "prompt")
        limit, n_ctx = body.token_limit() or COMPLETION_DEFAULT_TOKENS, session.target.n_ctx
        # the cursor's line opens the middle (infill.py), but a grammar of the request's
        # rules the middle from its start: then all of the prompt is prefix, as sent
        ruled = body.grammar is not None or asked_json(body)[0] != "text"
        line = len(given) if ruled else given.rfind("\n") + 1
        at = placed(None if ruled else anchors, (), given[:line], body.suffix)
        built = infill_prompt(
            session.target, at.prefix, body.suffix, [], given[line:], limit, n_ctx, at.written
        )
        config = generation_config(body, built.tokens, session, COMPLETION_DEFAULT_TOKENS)
        lines = InfillLines(body.suffix, written=at.written)
        return Prepared.infill(built, config, lines, session.target)
    prompt = prompt_tokens(given, session)
    config = generation_config(body, prompt, session, COMPLETION_DEFAULT_TOKENS)
    return templated_or_not(given, prompt, config, session, anchors)


def prepare_llama_completion(
    body: LlamaCompletionRequest, session: Session, anchors: Anchors | None = None
) -> Prepared:
    """llama-server's /completion: the prompt as given (text, or token ids)."""
    body.refuse_unsupported()
    prompt = prompt_tokens(body.prompt, session)
    config = generation_config(body, prompt, session, None)
    return templated_or_not(body.prompt, prompt, config, session, anchors)


def templated_or_not(
    given: str | list[int],
    prompt: list[int],
    config: GenerationConfig,
    session: Session,
    anchors: Anchors | None = None,
) -> Prepared:
    """A FIM prompt the client templated itself (Continue's autocomplete) is served as
    /infill's: the typed text opens the middle (laid out at a recent middle's prefix
    where `anchors` has one), the suffix and other files draft; where the request has a
    grammar of its own, and for any other prompt, as it is."""
    fim = templated_fim(session.target, given) if isinstance(given, str) else None
    if fim is None or config.grammar is not None:
        return Prepared(prompt, config)
    model = session.target
    at = placed(anchors, fim.context, fim.prefix, fim.tail)
    opening = at.written + fim.opening
    built = InfillPrompt(
        session.tokenize_raw(fim.context + at.prefix + fim.tail),
        False,
        model.tokenize(fim.source, special=False),
        opening,
        len(model.tokenize(opening, special=False)),
    )
    return Prepared.infill(built, config, None, model)


def prompt_tokens(given: str | list[int], session: Session) -> list[int]:
    """A raw prompt's tokens: its text's, or its token ids as given; a 400 for none."""
    if isinstance(given, str):
        prompt = session.tokenize_raw(given)
    else:
        prompt = token_ids(session.target, given, "prompt")
    if not prompt:
        raise ApiError(400, "the prompt is empty", "prompt")
    return prompt


def prepare_infill(
    body: InfillRequest, session: Session, anchors: Anchors | None = None
) -> Prepared:
    """llama-server's /infill, laid out at a recent middle's prefix where `anchors` has
    one this request's goes on from (anchors.py)."""
    extra = tuple((chunk.filename, chunk.text) for chunk in body.input_extra)
    # whole lines in `prompt` close the prefix (infill_prompt), where lines written after
    # an anchor would follow them out of order: such a request is laid out as sent
    at = placed(
        anchors if "\n" not in body.prompt else None, extra, body.input_prefix, body.input_suffix
    )
    built = infill_prompt(
        session.target,
        at.prefix,
        body.input_suffix,
        body.input_extra,
        body.prompt,
        body.n_predict,
        session.target.n_ctx,
        at.written,
    )
    room = room_for(built.tokens, session, "input_prefix")
    limit = room if body.n_predict < 0 else min(body.n_predict, room)
    lines = InfillLines(
        body.input_suffix, body.n_indent, body.t_max_predict_ms / 1e3, written=at.written
    )
    config = GenerationConfig(limit, body.sampling(), body.stops(), logprobs=body.logprob_count())
    return Prepared.infill(built, config, lines, session.target)


def placed(anchors: Anchors | None, key: Hashable, prefix: str, suffix: str) -> Placed:
    """Where a middle's prompt is laid out: at `anchors`' choice, or as sent."""
    return Placed(prefix, "") if anchors is None else anchors.place(key, prefix, suffix)


def room_for(prompt: list[int], session: Session, param: str) -> int:
    """Tokens the answer may take after `prompt`; a 400 where it leaves none."""
    room = session.engine.room(len(prompt))
    if room < 1:
        raise ApiError(
            400,
            f"the prompt has {len(prompt)} tokens; the context holds "
            f"{session.target.n_ctx} with room for the answer (`localspec serve --ctx` sets it)",
            param,
            "context_length_exceeded",
        )
    return room


def generation_config(
    body: GenerationBody,
    prompt: list[int],
    session: Session,
    default_tokens: int | None,
    prompt_param: str = "prompt",
    thinking: Thinking | None = None,
) -> GenerationConfig:
    """Sampling, stops, the token limit and the grammar (after the reasoning of a model
    that thinks the way `thinking` says); a 400 where the prompt leaves no room."""
    room = room_for(prompt, session, prompt_param)
    # beyond what fits, the answer stops where the context is full ("length"), as
    # llama-server's does: clients send their own model's limits (128k and more)
    # (a client's -1, llama-server's "no limit", asks for as much)
    asked = body.token_limit()
    asked = default_tokens if asked is None else asked
    limit = room if asked is None or asked == -1 else min(asked, room)
    try:
        sampling = body.sampling()
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    n_vocab = session.target.n_vocab
    if any(token >= n_vocab for token, _ in sampling.logit_bias):
        raise ApiError(
            400, f"logit_bias names a token beyond the vocabulary of {n_vocab}", "logit_bias"
        )
    if body.ignore_eos:  # as llama-server's: every end-of-generation token banned
        banned = tuple((token, BANNED) for token in session.target.eog_ids)
        sampling = replace(sampling, logit_bias=sampling.logit_bias + banned)
    return GenerationConfig(
        max_tokens=limit,
        sampling=sampling,
        stop=body.stops(),
        grammar=request_grammar(body, session, thinking),
        logprobs=body.logprob_count(),
    )


def asked_json(body: GenerationBody) -> tuple[str, Any, str]:
    """The JSON a request asks for: "text" (none asked), "json_object" (any object) or
    "json_schema" and its schema, and the parameter that asks (named in a 400). OpenAI's
    `response_format`, and llama-server's shapes of it: a `schema` beside the type
    (json_object's or json_schema's, as its README writes them), or `json_schema` on a
    chat's body; two of them that ask at once get a 400."""
    fmt = getattr(body, "response_format", None) or {}
    kind = fmt.get("type", "text")
    if kind not in ("text", "json_object", "json_schema"):
        raise ApiError(
            400,
            f"response_format {kind!r}: use text, json_object or json_schema",
            "response_format.type",
        )
    wrapped = fmt.get("json_schema") if kind == "json_schema" else None
    if isinstance(wrapped, dict) and "schema" in wrapped:
        asked = (kind, wrapped["schema"], body.SCHEMA_PARAM)
    elif "schema" in fmt and kind != "text":
        asked = ("json_schema", fmt["schema"], "response_format.schema")
    elif kind == "json_schema":
        raise ApiError(400, f"{body.SCHEMA_PARAM} must be a JSON schema object", body.SCHEMA_PARAM)
    else:
        asked = (kind, None, "response_format")
    # (/completion's own json_schema is its response_format already)
    own = body.json_schema if isinstance(body, ChatRequest | CompletionRequest) else None
    if own is None:
        return asked
    if kind != "text":
        raise ApiError(
            400, "response_format and json_schema name two schemas; send one", "json_schema"
        )
    return "json_schema", own, "json_schema"


def request_grammar(
    body: GenerationBody, session: Session, thinking: Thinking | None = None
) -> Grammar | None:
    """What the answer must follow: `response_format` (json_object, json_schema) or
    llama-server's `grammar` (GBNF), compiled for the target; a 400 naming what is wrong.
    A chat's JSON and forced calls come after the reasoning of a model that thinks
    (`Thinking.first`); llama-server's `grammar` holds from the first token, as there."""
    kind, schema, asked = asked_json(body)
    text, param, style, root, fresh = body.grammar, "grammar", b"", "root", b""
    forced = forced_tools(body) if isinstance(body, ChatRequest) else None
    if forced:  # tool_choice "required" or a named function: a call in the model's format
        if text is not None or kind != "text":
            raise ApiError(
                400, "tool_choice and response_format/grammar name two grammars", "tool_choice"
            )
        try:
            # "required" may be several calls where parallel calls are allowed (OpenAI's
            # default); a named function is one call of it
            several = (
                isinstance(body, ChatRequest)
                and body.tool_choice == "required"
                and body.parallel_tool_calls is not False
            )
            text = tool_grammar(forced, tool_format(session.target.chat_template()), several)
        except GrammarError as e:
            raise ApiError(400, f"a tool's parameters: {e}", "tools") from None
        param, style = "tools", CALL_STYLE
        if thinking is not None:
            fresh = thinking.answer_starts.encode()
            if thinking.marks != HARMONY:  # Harmony's call grammar holds its analysis
                text, root = thinking.first(text, root)
    if kind != "text":
        name = asked.split(".")[0]  # response_format, or json_schema
        if text is not None:
            raise ApiError(400, f"{name} and grammar name two grammars; send one", "grammar")
        if getattr(body, "tools", None):
            raise ApiError(400, f"{name} with tools is not supported: send one", name)
        param = asked
        if schema is None or schema == {}:  # llama-server's: an empty schema, any object
            text = json_object_grammar()
        elif not isinstance(schema, dict):
            raise ApiError(400, f"{param} must be a JSON schema object", param)
        else:
            try:
                text = schema_grammar(schema)
            except GrammarError as e:
                raise ApiError(400, str(e), param) from None
    if text is None:
        return lazy_calls(body, session, thinking)
    if not isinstance(session.target, LlamaModel):
        raise ApiError(400, "structured output needs a llama.cpp model", param)
    try:
        if kind != "text" and isinstance(body, ChatRequest):  # a chat's JSON: fenced, or not
            return chat_grammar(session.target, text, thinking)
        grammar = LlamaGrammar(session.target, text, root, style=style, fresh_after=fresh)
    except GrammarError as e:
        raise ApiError(400, str(e), param) from None
    return lazily(body, grammar, session.target) if param == "grammar" else grammar


def lazily(body: GenerationBody, grammar: Grammar, model: Model) -> Grammar:
    """llama-server's `grammar_lazy`: `grammar` holds from the first of the request's
    `grammar_triggers` on; as asked where none are sent (llama-server's too)."""
    if not body.grammar_lazy or body.grammar_triggers is None:
        return grammar
    tokens: set[int] = set()
    kinds: tuple[list[bytes], list[bytes], list[bytes]] = ([], [], [])  # words, patterns, whole
    for trigger in body.grammar_triggers:
        if trigger.type == 0:
            if trigger.token is None or not 0 <= trigger.token < model.n_vocab:
                raise ApiError(400, "a token trigger needs a token id of the model's", TRIGGERS)
            tokens.add(trigger.token)
        else:
            kinds[trigger.type - 1].append(trigger.value.encode())
    if not (tokens or any(kinds)) or not all(kinds[0]):
        raise ApiError(
            400,
            "grammar_lazy needs grammar_triggers: the words or patterns it holds from",
            TRIGGERS,
        )
    try:
        pattern = trigger_pattern(*kinds)
    except re.error as e:
        raise ApiError(400, f"grammar_triggers: {e}", TRIGGERS) from None
    reach = LONG_REACH if kinds[1] or kinds[2] else max(map(len, kinds[0]), default=1)
    return Triggered(model, grammar, pattern, reach=reach, tokens=frozenset(tokens))
