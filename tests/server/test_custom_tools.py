"""OpenAI's custom tools (free text in, a grammar beside it) on Chat Completions, over the
Responses API's toy model (fast), through the real `openai` SDK: the call as a custom
call, streamed as its input is decoded, sent back; a custom tool named, allowed tools,
one call at most.
The Responses API's custom calls: test_responses.py; the real pair:
test_structured_real.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import openai
import pytest
from fastapi.testclient import TestClient
from server.test_responses import APPLY_PATCH, PATCH, WEATHER, Tooled, answers

from localspec.backends.toy import scripted
from localspec.decoding.adaptive import auto_engine
from localspec.server.app import ServerOptions, create_app
from localspec.server.custom_calls import as_custom_call_chunks
from localspec.server.responses import ResponsesRequest
from localspec.server.schemas import CUSTOM_PARAMETERS, ChatRequest, NamedToolChoice
from localspec.session import Session

# Chat Completions nests a tool's definition under its type
PATCH_TOOL = {
    "type": "custom",
    "custom": {
        "name": "apply_patch",
        "description": APPLY_PATCH["description"],
        "format": {"type": "grammar", "grammar": APPLY_PATCH["format"]},
    },
}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


@pytest.fixture
def sdk() -> Iterator[openai.OpenAI]:
    model = Tooled(scripted(answers), n_vocab=258, n_ctx=2048)
    with TestClient(create_app(Session(auto_engine(model, None)), ServerOptions("toy"))) as c:
        base = f"{c.base_url}/v1"
        yield openai.OpenAI(api_key="none", base_url=base, http_client=c, max_retries=0)


def test_a_custom_tools_call_comes_back_as_one_streamed_and_sent_again(sdk: openai.OpenAI):
    tools: Any = [PATCH_TOOL, WEATHER_TOOL]
    asked: Any = [{"role": "user", "content": "patch"}]
    reply = sdk.chat.completions.create(model="x", messages=asked, tools=tools)
    (call,) = reply.choices[0].message.tool_calls or []
    assert call.type == "custom" and call.custom.name == "apply_patch"
    assert call.custom.input == PATCH and call.id.startswith("call_")
    assert reply.choices[0].finish_reason == "tool_calls"

    pieces, opened = [], []
    for chunk in sdk.chat.completions.create(model="x", messages=asked, tools=tools, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            assert delta.index == 0 and delta.function is None
            custom = (delta.model_extra or {})["custom"]  # the SDK's chunk has no field
            if delta.id is not None:
                opened.append((delta.type, custom["name"]))
            pieces.append(custom["input"])
    assert opened == [("custom", "apply_patch")]
    assert len(pieces) > 10 and "".join(pieces) == PATCH  # as written, a token or so each

    history = [*asked, reply.choices[0].message.model_dump(exclude_none=True)]
    history.append({"role": "tool", "tool_call_id": call.id, "content": "Patched"})
    again = sdk.chat.completions.create(model="x", messages=history, tools=tools)
    assert again.choices[0].message.content == "hi.txt is there."


def test_a_custom_tool_is_a_function_of_one_string_held_to_its_grammar():
    chat = ChatRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "patch"}],
            "tools": [PATCH_TOOL, WEATHER_TOOL],
            "tool_choice": {"type": "custom", "custom": {"name": "apply_patch"}},
        }
    )
    patch, weather = chat.tools or []
    assert patch.function.parameters == CUSTOM_PARAMETERS
    assert patch._input_grammar == ("lark", APPLY_PATCH["format"]["definition"])
    assert 'lark grammar:\nstart: "*** Begin Patch" LF' in (patch.function.description or "")
    assert chat.custom_names() == {"apply_patch"} and not weather._custom
    assert chat.tool_choice == NamedToolChoice.of("apply_patch")
    free = {"type": "custom", "custom": {"name": "note", "format": {"type": "text"}}}
    (note,) = ChatRequest.model_validate({"messages": asked(), "tools": [free]}).tools or []
    assert note._custom and note._input_grammar is None


def test_allowed_tools_leave_the_others_out_under_their_mode():
    only_patch = [{"type": "custom", "custom": {"name": "apply_patch"}}]
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": only_patch}}
    body = {"messages": asked(), "tools": [PATCH_TOOL, WEATHER_TOOL], "tool_choice": allowed}
    chat = ChatRequest.model_validate(body)
    assert [t.function.name for t in chat.tools or []] == ["apply_patch"]
    assert chat.tool_choice == "required"
    responses = ResponsesRequest.model_validate(
        {
            "input": "patch",
            "tools": [APPLY_PATCH, WEATHER],
            "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [WEATHER]},
        }
    ).chat()
    assert [t.function.name for t in responses.tools or []] == ["get_weather"]
    assert responses.tool_choice == "auto"


def test_a_custom_call_written_otherwise_goes_whole_at_its_end_after_a_function_call():
    """The chunks of a function call, then of a custom call whose arguments are not its
    one string: the function's pieces as they are, the custom input once it ends."""
    first = {"index": 0, "id": "call_a", "type": "function"}
    second = {"index": 1, "id": "call_b", "type": "function"}
    deltas: list[dict[str, Any]] = [
        {"tool_calls": [first | {"function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
        {"tool_calls": [second | {"function": {"name": "apply_patch", "arguments": ""}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": '{"patch": "x"}'}}]},
    ]

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        for delta in [*deltas, {}]:
            reason = None if delta else "tool_calls"
            yield {"choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}

    async def converted() -> list[dict[str, Any]]:
        return [c async for c in as_custom_call_chunks(chunks(), frozenset({"apply_patch"}))]

    out = [c["choices"][0]["delta"].get("tool_calls") for c in anyio.run(converted)]
    assert out[:3] == [d["tool_calls"] for d in deltas[:3]]  # a function's call: as it is
    opened = {"index": 1, "id": "call_b", "type": "custom"}
    assert out[3:] == [
        [opened | {"custom": {"name": "apply_patch", "input": ""}}],
        [{"index": 1, "custom": {"input": '{"patch": "x"}'}}],
    ]
    assert json.loads(out[-1][0]["custom"]["input"]) == {"patch": "x"}


def asked() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "patch"}]


def test_custom_tools_sent_wrong_get_a_400_that_says_their_shape(sdk: openai.OpenAI):
    tools: Any = [PATCH_TOOL, WEATHER_TOOL]
    unnamed = {"type": "custom", "custom": {"description": "no name"}}
    none_allowed = {"mode": "required", "tools": [{"type": "function", "function": {"name": "g"}}]}
    for fields, param, says in (
        ({"tools": [unnamed]}, "tools.0", "{type: custom, custom: {name, description, format}}"),
        ({"tool_choice": {"type": "custom", "custom": {}}}, "tool_choice", "custom: {name}"),
        (
            {"tool_choice": {"type": "allowed_tools", "allowed_tools": none_allowed}},
            "tool_choice",
            "names none of the request's tools",
        ),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.chat.completions.create(model="x", messages=asked(), **{"tools": tools} | fields)
        error = refused.value.body
        assert isinstance(error, dict) and error["param"] == param and says in error["message"]


def test_one_call_at_most_is_asked_as_each_api_asks_it():
    """`parallel_tool_calls: false` (Chat Completions, the Responses API: Codex sends it),
    Anthropic's `disable_parallel_tool_use`: the chat request's parallel_tool_calls, which
    ends the lazy call grammar after one call (test_structured_real.py)."""
    from localspec.server.anthropic import MessagesRequest

    chat = ChatRequest.model_validate({"messages": asked(), "parallel_tool_calls": False})
    assert chat.parallel_tool_calls is False
    one = {"input": "patch", "tools": [WEATHER], "parallel_tool_calls": False}
    assert ResponsesRequest.model_validate(one).chat().parallel_tool_calls is False
    tool = {"name": "get_weather", "input_schema": {"type": "object"}}
    messages = {"model": "x", "max_tokens": 8, "messages": asked(), "tools": [tool]}
    for choice, parallel in (
        ({"type": "auto", "disable_parallel_tool_use": True}, False),
        (None, True),
    ):
        request = MessagesRequest.model_validate(messages | {"tool_choice": choice})
        assert request.chat().parallel_tool_calls is parallel
