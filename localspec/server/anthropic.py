"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), as Claude
Code (`ANTHROPIC_BASE_URL=http://127.0.0.1:8080`) and Anthropic's SDKs send it.

The request becomes a chat request on the way in, and the chat's answer (or its stream
of chunks) becomes Anthropic's message (or its stream of events) on the way out, as
llama-server does: tool calls in each model family's format, thinking, stop sequences,
the slots and speculation all work as on /v1/chat/completions. Errors on these paths
are in Anthropic's shape ({"type": "error", "error": {type, message}}).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, Literal

from pydantic import Field

from localspec.decoding.events import Finished
from localspec.server.blocks import Blocks, Fill, Open, Step
from localspec.server.errors import ApiError, validated
from localspec.server.schemas import (
    EFFORTS,
    Body,
    ChatMessageIn,
    ChatRequest,
    FunctionCall,
    NamedToolChoice,
    OtherPart,
    Tool,
    ToolCallIn,
    ToolChoice,
    refuse_parts,
)

# Claude Code's first system block: its version and a stamp for Anthropic's billing that
# changes from one conversation to the next (`cc_version=2.1.328.a87`, then `.ce7`; in
# some versions with every request, `cch=`), nothing the model needs. Left in, it would
# change the prompt's first tokens, and the long system prompt after it would be read
# again instead of found in a slot's cache
BILLING_HEADER = "x-anthropic-billing-header:"
Finish = Callable[[bool], tuple[str, str | None]]  # (called a tool) -> (reason, sequence)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


class TextBlock(Body):
    type: Literal["text"]
    text: str


class TextSource(Body):
    type: Literal["text"]
    data: str


class ContentSource(Body):
    type: Literal["content"]
    content: str | list[TextBlock]


class DocumentBlock(Body):
    """A document given as text (a plain-text or a content source), read as its text;
    a PDF or an image stays a 400 (this model takes text only)."""

    type: Literal["document"]
    source: TextSource | ContentSource
    title: str | None = None
    context: str | None = None

    @property
    def text(self) -> str:
        source = self.source
        if isinstance(source, TextSource):
            body = source.data
        elif isinstance(source.content, str):
            body = source.content
        else:
            body = "\n\n".join(b.text for b in source.content)
        return "\n\n".join(part for part in (self.title, self.context, body) if part)


Texts = TextBlock | DocumentBlock  # what reaches the model as text


class ToolUseBlock(Body):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(Body):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | DocumentBlock | OtherPart] | None = None


class ThinkingBlock(Body):
    """An earlier answer's reasoning, sent back to the model's template (which keeps it
    for the task in progress); a redacted one has none to send."""

    type: Literal["thinking", "redacted_thinking"]
    thinking: str | None = None


Block = TextBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | OtherPart


class MessageIn(Body):
    # "system": what Claude Code says mid-conversation (its environment, after the first
    # user turn), a system message where it stands
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class ToolIn(Body):
    type: str | None = None  # "custom"; else a tool Anthropic's servers run (web search)
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ToolChoiceIn(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False  # one call at most


class ThinkingIn(Body):
    type: str  # "enabled", "disabled" (and "adaptive")
    budget_tokens: int | None = Field(None, ge=0)  # the reasoning's most tokens, where enabled


class OutputFormat(Body):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Body):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class AnthropicChat(ChatRequest):
    """A chat request made from a message request: a bad schema is named as sent."""

    SCHEMA_PARAM: ClassVar[str] = "output_config.format.schema"


class MessagesRequest(Body):
    model: str | None = None
    messages: list[MessageIn] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    # required by Anthropic (0: only read the prompt into the cache, as Anthropic's
    # pre-warming); without it, as llama-server: as much as the context holds
    max_tokens: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingIn | None = None
    output_config: OutputConfig | None = None

    def chat(self) -> ChatRequest:
        """The same request as OpenAI's chat completion."""
        kwargs, budget = None, None
        if self.thinking is not None and self.thinking.type in ("enabled", "disabled"):
            kwargs = {"enable_thinking": self.thinking.type == "enabled"}  # Qwen3's switch
            if self.thinking.type == "enabled":
                budget = self.thinking.budget_tokens
        output = self.output_config or OutputConfig()
        effort = EFFORTS.get(output.effort or "", output.effort)
        schema = None
        if output.format is not None:
            schema = {"type": "json_schema", "json_schema": {"schema": output.format.schema_}}
        return validated(
            AnthropicChat,
            {
                "model": self.model,
                "messages": self.chat_messages(),
                "max_tokens": self.max_tokens or None,
                "n_predict": 0 if self.max_tokens == 0 else None,
                "stop": self.stop_sequences,
                "temperature": self.temperature,
                "top_p": self.top_p,
                "top_k": self.top_k,
                "tools": self.chat_tools(),
                "tool_choice": self.chat_tool_choice(),
                "parallel_tool_calls": not (
                    self.tool_choice and self.tool_choice.disable_parallel_tool_use
                ),
                "chat_template_kwargs": kwargs,
                "reasoning_effort": effort,  # gpt-oss's
                "reasoning_budget_tokens": budget,
                "response_format": schema,
            },
        )

    def chat_messages(self) -> list[ChatMessageIn]:
        system = self.system if isinstance(self.system, list) else [self.system or ""]
        texts = [b.text if isinstance(b, TextBlock) else b for b in system]
        kept = "\n\n".join(t for t in texts if t and not t.startswith(BILLING_HEADER))
        out = [ChatMessageIn(role="system", content=kept)] if kept else []
        for i, message in enumerate(self.messages):
            for turn in chat_turn(message, f"messages[{i}].content"):
                out = within_user_turn(out, turn)
        return out

    def chat_tools(self) -> list[Tool] | None:
        """The client's own tools (those Anthropic's servers run cannot run here)."""
        tools = [
            Tool.of(t.name, t.description, t.input_schema)
            for t in self.tools or []
            if t.type in (None, "custom")
        ]
        return tools or None

    def chat_tool_choice(self) -> ToolChoice | None:
        choice = self.tool_choice
        if choice is None:
            return None
        if choice.type == "tool":
            if not choice.name:
                raise ApiError(400, "tool_choice of type 'tool' needs a name", "tool_choice.name")
            return NamedToolChoice.of(choice.name)
        return {"auto": "auto", "any": "required", "none": "none"}[choice.type]  # type: ignore[return-value]

    def asked_tokens(self) -> int | None:
        return self.max_tokens


def chat_turn(message: MessageIn, where: str) -> list[ChatMessageIn]:
    """One Anthropic turn as chat messages: a user turn's tool results become tool
    messages (before its text, as Anthropic orders them), an assistant's tool_use blocks
    its tool calls and its thinking blocks its reasoning."""
    if isinstance(message.content, str):
        return [ChatMessageIn(role=message.role, content=message.content)]
    refuse_parts([b for b in message.content if isinstance(b, OtherPart)], where)
    text = "\n\n".join(b.text for b in message.content if isinstance(b, Texts))
    if message.role == "system":
        return [ChatMessageIn(role="system", content=text)] if text else []
    if message.role == "assistant":
        calls = [
            ToolCallIn(id=b.id, function=FunctionCall(name=b.name, arguments=json.dumps(b.input)))
            for b in message.content
            if isinstance(b, ToolUseBlock)
        ]
        if not text and not calls:
            return []
        thought = "\n\n".join(
            b.thinking for b in message.content if isinstance(b, ThinkingBlock) and b.thinking
        )
        return [
            ChatMessageIn(
                role="assistant",
                content=text,
                tool_calls=calls or None,
                reasoning_content=thought or None,
            )
        ]
    out = [
        ChatMessageIn(role="tool", tool_call_id=b.tool_use_id, content=result_text(b, where))
        for b in message.content
        if isinstance(b, ToolResultBlock)
    ]
    if text or not out:
        out.append(ChatMessageIn(role="user", content=text))
    return out


def within_user_turn(out: list[ChatMessageIn], turn: ChatMessageIn) -> list[ChatMessageIn]:
    """`out` with `turn` after it; a system message that follows a user's message goes
    into that message, before the user's words. Local models' templates put a system
    prompt first, and a system turn after the user's reads to a small model as the text
    to answer: the 1.5B default repeated Claude Code's environment block back to it."""
    last = out[-1] if out else None
    if turn.role != "system" or last is None or last.role != "user":
        return [*out, turn]
    return [*out[:-1], ChatMessageIn(role="user", content=f"{turn.content}\n\n{last.content}")]


def result_text(block: ToolResultBlock, where: str) -> str:
    if block.content is None or isinstance(block.content, str):
        return block.content or ""
    refuse_parts([b for b in block.content if isinstance(b, OtherPart)], where)
    return "\n\n".join(b.text for b in block.content if isinstance(b, Texts))


# --- the answer, as Anthropic shapes it ----------------------------------------------
def ending(
    done: Finished, called: bool, asked: int | None, limit: int, capped: bool = False
) -> tuple[str, str | None]:
    """Why the message ended, and the stop sequence that ended it: `asked` tokens (None:
    no limit asked) against the `limit` the context left (a limit beyond it was clamped);
    `capped`: the server's own limit was lower still."""
    if called and not done.cut:
        return "tool_use", None  # a call that was cut ends as the cut: its input is partial
    if done.stop_reason == "stop_string" and done.stop_string is not None:
        return "stop_sequence", done.stop_string
    if done.stop_reason == "context_full" or (
        done.stop_reason == "max_tokens" and not capped and (asked is None or asked > limit)
    ):
        return "model_context_window_exceeded", None
    return ("max_tokens" if done.stop_reason == "max_tokens" else "end_turn"), None


def message_body(
    message_id: str, chat: dict[str, Any], ended: tuple[str, str | None]
) -> dict[str, Any]:
    """The whole message, from the chat completion's body."""
    message = chat["choices"][0]["message"]
    content: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": message["reasoning_content"]})
        content[-1]["signature"] = ""  # nothing to sign it with here (llama-server's too)
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        content.append(tool_use(call["id"], call["function"]["name"]))
        content[-1]["input"] = arguments(call["function"]["arguments"])
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": chat["model"],
        "content": content,
        "stop_reason": ended[0],
        "stop_sequence": ended[1],
        "usage": usage(chat["usage"]),
        "localspec": chat["localspec"],
    }


def usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's usage: input_tokens are those not read from the cache."""
    cached = chat_usage["prompt_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": chat_usage["prompt_tokens"] - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": chat_usage["completion_tokens"],
    }


def tool_use(call_id: str, name: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": {}}


def arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class MessageStream:
    """Anthropic's stream events from the chat's chunks: message_start, then each
    content block (thinking, text, each tool call) opened, filled and closed in turn,
    then message_delta (stop reason, usage) and message_stop."""

    def __init__(self, message_id: str, model: str, prompt_tokens: int) -> None:
        self.id, self.model, self.prompt_tokens = message_id, model, prompt_tokens
        self.blocks = Blocks()
        self.index = -1  # the open block's

    async def events(
        self, chunks: AsyncIterator[dict[str, Any]], finish: Finish
    ) -> AsyncIterator[dict[str, Any]]:
        """`finish(called)`: the stop reason and stop sequence, once the chunks ended."""
        yield self.start()
        yield {"type": "ping"}
        async for step in self.blocks.steps(chunks):
            for event in self.render(step):
                yield event
        last = self.blocks.last
        for step in self.blocks.close():
            for event in self.render(step):
                yield event
        reason, sequence = finish(self.blocks.calls > 0)
        yield {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage(last["usage"]),
            "localspec": last["localspec"],
        }
        yield {"type": "message_stop"}

    def start(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        }
        return {"type": "message_start", "message": message}

    def render(self, step: Step) -> list[dict[str, Any]]:
        if isinstance(step, Open):
            self.index += 1
            opening = {
                "thinking": {"type": "thinking", "thinking": "", "signature": ""},
                "text": {"type": "text", "text": ""},
                "call": tool_use(step.call_id, step.name),
            }[step.kind]
            return [{"type": "content_block_start", "index": self.index, "content_block": opening}]
        if isinstance(step, Fill):
            delta = {
                "thinking": {"type": "thinking_delta", "thinking": step.text},
                "text": {"type": "text_delta", "text": step.text},
                "call": {"type": "input_json_delta", "partial_json": step.text},
            }[step.kind]
            return [self.piece(delta)]
        stop = {"type": "content_block_stop", "index": self.index}
        if step.kind == "thinking":  # Anthropic's clients expect a signature before the end
            return [self.piece({"type": "signature_delta", "signature": ""}), stop]
        return [stop]

    def piece(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}


def error_body(e: ApiError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(e.status, "invalid_request_error" if e.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}
