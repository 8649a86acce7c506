"""OpenAI's Responses API (`POST /v1/responses`), the only one Codex CLI speaks (its
`wire_api = "chat"` is gone), and what the `openai` SDKs' `responses` send.

As llama-server does, the request becomes a chat request on the way in (`instructions`
and `input` items as messages, function tools, `text.format` as `response_format`), and
the chat's answer (or its stream of chunks) becomes the response's output items
(reasoning, message, function calls) and their stream of events on the way out
(localspec.server.responses_out). Nothing
is stored: `previous_response_id` gets a 400 that says to send the conversation.

A custom tool (free text in, as Codex's `apply_patch`, a Lark grammar beside it) is a
function of one string, `input`, to the model: its calls go out as `custom_tool_call`
items, the input decoded from the arguments' JSON as they are written. A call's input
follows its Lark grammar as a call's arguments follow a function's schema
(localspec.server.lark_gbnf), where GBNF can hold the grammar.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, model_validator

from localspec.server.errors import ApiError, validated
from localspec.server.schemas import (
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


class TextIn(Body):
    type: Literal["input_text", "output_text", "text"]
    text: str


class Refusal(Body):
    type: Literal["refusal"]
    refusal: str


Part = TextIn | Refusal | OtherPart


class MessageItem(Body):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Part]


class FunctionCallItem(Body):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class CustomCallItem(Body):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str


class FunctionOutputItem(Body):
    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str
    output: str | list[Part] | dict[str, Any] | None = None  # an object: as its JSON


class ReasoningItem(Body):
    """An earlier answer's reasoning, sent back with the output items after it (the
    model's template keeps it for the task in progress): its text, else its summary."""

    type: Literal["reasoning"]
    content: list[dict[str, Any]] | None = None
    summary: list[dict[str, Any]] | None = None

    def text(self) -> str:
        parts = self.content or self.summary or []
        return "\n\n".join(p["text"] for p in parts if isinstance(p.get("text"), str))


Item = MessageItem | FunctionCallItem | CustomCallItem | FunctionOutputItem | ReasoningItem
# the items served, by their type (a message's may be left out)
ITEMS: dict[str, type[Item]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "custom_tool_call": CustomCallItem,
    "function_call_output": FunctionOutputItem,
    "custom_tool_call_output": FunctionOutputItem,
    "reasoning": ReasoningItem,
}


class ToolIn(Body):
    type: str  # "function", "custom"; others (web_search, local_shell, mcp) run elsewhere
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    format: dict[str, Any] | None = None  # a custom tool's: text, or a grammar its input follows

    def as_function(self) -> Tool:
        if self.type == "function":
            return Tool.of(self.name or "", self.description, self.parameters)
        return Tool.custom(self.name or "", self.description, self.format)


class NamedToolIn(Body):
    type: str
    name: str | None = None


class FormatIn(Body):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(Body):
    format: FormatIn | None = None


class ReasoningIn(Body):
    effort: str | None = None


class ResponsesChat(ChatRequest):
    """A chat request made from a Responses request: a bad schema is named as sent."""

    SCHEMA_PARAM: ClassVar[str] = "text.format.schema"


class ResponsesRequest(Body):
    model: str | None = None
    input: str | list[dict[str, Any]]  # items, each read by its type (`item`)
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: list[ToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolIn | None = None
    parallel_tool_calls: bool | None = None  # Codex sends false: one call a turn
    text: TextConfig | None = None
    reasoning: ReasoningIn | None = None
    stream: bool = False
    previous_response_id: str | None = None
    top_logprobs: int | None = None

    @model_validator(mode="before")
    @classmethod
    def allowed_tools_only(cls, data: Any) -> Any:
        """`tool_choice: {type: allowed_tools, mode, tools}`: the tools it lists, under
        its mode (auto or required)."""
        choice = data.get("tool_choice") if isinstance(data, dict) else None
        if not (isinstance(choice, dict) and choice.get("type") == "allowed_tools"):
            return data
        names = {t.get("name") for t in choice.get("tools") or [] if isinstance(t, dict)}
        names -= {None}
        tools = [
            t for t in data.get("tools") or [] if isinstance(t, dict) and t.get("name") in names
        ]
        if not tools:
            raise ApiError(400, "allowed_tools names none of the request's tools", "tool_choice")
        return data | {"tools": tools, "tool_choice": choice.get("mode", "auto")}

    def chat(self) -> ChatRequest:
        """The same request as a chat completion."""
        if self.previous_response_id:
            raise ApiError(
                400,
                "responses are not stored here: send the whole conversation in input",
                "previous_response_id",
            )
        if self.top_logprobs:
            raise ApiError(400, "top_logprobs is not supported on /v1/responses", "top_logprobs")
        effort = (self.reasoning.effort if self.reasoning else None) or None
        return validated(
            ResponsesChat,
            {
                "model": self.model,
                "messages": self.chat_messages(),
                "max_tokens": self.max_output_tokens,
                "temperature": self.temperature,
                "top_p": self.top_p,
                "tools": self.chat_tools(),
                "tool_choice": self.chat_tool_choice(),
                "parallel_tool_calls": self.parallel_tool_calls,
                "response_format": self.chat_format(),
                "reasoning_effort": effort,
            },
        )

    def chat_messages(self) -> list[ChatMessageIn]:
        out = [ChatMessageIn(role="system", content=self.instructions)] if self.instructions else []
        if isinstance(self.input, str):
            return [*out, ChatMessageIn(role="user", content=self.input)]
        thought = None  # a reasoning item's, for the assistant's message or calls after it
        for i, raw in enumerate(self.input):
            where = f"input[{i}]"
            item = read_item(raw, where)
            last = out[-1] if out else None
            if isinstance(item, ReasoningItem):
                thought = item.text() or None
            elif isinstance(item, MessageItem):
                text = item_text(item.content, f"{where}.content")
                said = thought if item.role == "assistant" else None
                out.append(ChatMessageIn(role=item.role, content=text, reasoning_content=said))
                thought = None
            elif isinstance(item, FunctionCallItem | CustomCallItem):
                arguments = (
                    item.arguments
                    if isinstance(item, FunctionCallItem)
                    else json.dumps({"input": item.input})
                )
                call = ToolCallIn(
                    id=item.call_id, function=FunctionCall(name=item.name, arguments=arguments)
                )
                if last is not None and last.role == "assistant" and thought is None:
                    last.tool_calls = [*(last.tool_calls or []), call]  # the same turn's calls
                else:
                    out.append(
                        ChatMessageIn(
                            role="assistant",
                            content="",
                            tool_calls=[call],
                            reasoning_content=thought,
                        )
                    )
                thought = None
            elif isinstance(item, FunctionOutputItem):
                output = item.output
                if not isinstance(output, str | list):
                    output = "" if output is None else json.dumps(output)
                text = item_text(output, f"{where}.output")
                out.append(ChatMessageIn(role="tool", tool_call_id=item.call_id, content=text))
        return out

    def chat_tools(self) -> list[Tool] | None:
        """The function and custom tools (a hosted tool runs elsewhere, and is left out)."""
        tools = [
            t.as_function() for t in self.tools or [] if t.type in ("function", "custom") and t.name
        ]
        return tools or None

    def custom_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tools or [] if t.type == "custom" and t.name)

    def chat_tool_choice(self) -> ToolChoice | None:
        choice = self.tool_choice
        if choice is None or isinstance(choice, str):
            return choice
        if choice.type not in ("function", "custom") or not choice.name:
            raise ApiError(
                400, "tool_choice names a function: {type: function, name}", "tool_choice"
            )
        return NamedToolChoice.of(choice.name)

    def chat_format(self) -> dict[str, Any] | None:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return {"type": "json_object"}
        schema = {"name": fmt.name or "answer", "schema": fmt.schema_, "strict": fmt.strict}
        return {"type": "json_schema", "json_schema": schema}


def read_item(raw: dict[str, Any], where: str) -> Item:
    """One input item as its type's model; a 400 naming the item and what is wrong."""
    kind = raw.get("type", "message")
    if kind not in ITEMS:
        raise ApiError(400, f"{where} is a {kind!r} item: not served here", where)
    try:
        return ITEMS[kind].model_validate(raw)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        at = ".".join(str(part) for part in first["loc"])
        raise ApiError(400, f"{where}: {at}: {first['msg']}", where) from None


def item_text(content: str | list[Part], where: str) -> str:
    if isinstance(content, str):
        return content
    refuse_parts([p for p in content if isinstance(p, OtherPart)], where)
    # parts are sections of their own (Codex sends its permissions and its environment so)
    return "\n\n".join(
        p.text if isinstance(p, TextIn) else p.refusal
        for p in content
        if not isinstance(p, OtherPart)
    )
