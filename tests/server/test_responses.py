"""OpenAI's Responses API (what Codex CLI and the SDKs' `responses` send) over a toy model
(fast), through the real `openai` SDK: responses and their streams (accumulated by the
SDK), function calls and their outputs, reasoning, incomplete answers, and the 400s.
The real pair: test_server_real.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from fastapi.testclient import TestClient

from localspec.backends.toy import TEMPLATE, ToyModel, scripted
from localspec.decoding.adaptive import auto_engine
from localspec.server.app import ServerOptions, create_app
from localspec.session import Session

REPLY = "Hello from the toy model."
CALL = (
    'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}
# what Codex sends beside its functions: tools that run elsewhere, and are left out here
HOSTED = [{"type": "web_search"}, {"type": "local_shell"}]
# Codex's apply_patch: a custom tool, free text that follows a Lark grammar
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edits files. This is a FREEFORM tool, so do not wrap the patch in JSON.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" LF'},
}
PATCH = '*** Begin Patch\n*** Add File: hi.txt\n+say "hé" \U0001f600\\o/\n*** End Patch\n'
PATCH_CALL = (
    '<tool_call>\n{"name": "apply_patch", "arguments": '
    + json.dumps({"input": PATCH})
    + "}\n</tool_call>"
)
TOOLS_TEMPLATE = "{% if tools %}<|tools|>{{ tools | tojson }}\n{% endif %}" + TEMPLATE


class Tooled(ToyModel):
    """Renders the tools; thinks when asked to (`<think>` in its template)."""

    def chat_template(self) -> str | None:
        return TOOLS_TEMPLATE + "{# <think> #}"


def answers(prompt: bytes) -> str:
    if b"<|tool|>Sunny" in prompt:
        return "It is sunny in Paris."
    if b"<|tool|>Patched" in prompt:
        return "hi.txt is there."
    if b"<|user|>patch" in prompt:
        return PATCH_CALL
    if b"<|user|>think" in prompt:
        return "<think>\nThe user greets me.\n</think>\n\nHello!"
    if b"<|system|>Be brief." in prompt:
        return "Brief."
    if b"web_search" in prompt or b"local_shell" in prompt:
        return "a hosted tool reached the template"
    return CALL if b"<|tools|>" in prompt else REPLY


@pytest.fixture
def client() -> Iterator[TestClient]:
    model = Tooled(scripted(answers), n_vocab=258, n_ctx=2048)
    with TestClient(create_app(Session(auto_engine(model, None)), ServerOptions("toy"))) as c:
        yield c


@pytest.fixture
def sdk(client: TestClient) -> openai.OpenAI:
    base = f"{client.base_url}/v1"
    return openai.OpenAI(api_key="none", base_url=base, http_client=client, max_retries=0)


def test_a_response_and_its_stream_agree(sdk: openai.OpenAI, client: TestClient):
    response = sdk.responses.create(model="gpt-5-codex", input="hi")
    assert response.output_text == REPLY and response.status == "completed"
    assert response.model == "toy" and response.id.startswith("resp_")
    assert response.usage.output_tokens == len(REPLY) and response.usage.input_tokens > 0
    assert response.model_extra["localspec"]["rounds"] >= 1

    with sdk.responses.stream(model="gpt-5-codex", input="hi") as stream:
        names = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == REPLY and final.usage.output_tokens == len(REPLY)
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert set(names[4:-4]) == {"response.output_text.delta"}
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    r = client.post("/v1/responses", json={"input": "hi", "stream": True})
    blocks = r.text.strip().split("\n\n")
    numbers = [json.loads(b.split("\ndata: ")[1])["sequence_number"] for b in blocks]
    assert numbers == list(range(len(blocks)))  # each event named and numbered in order
    assert all(b.startswith("event: response.") for b in blocks) and "[DONE]" not in r.text


def test_a_response_says_the_temperature_it_was_sampled_with(sdk: openai.OpenAI):
    """The request's, else `serve --temperature`'s, else the API's 1.0 (Codex sends none)."""
    from localspec.server.defaults import SamplingDefaults

    assert sdk.responses.create(model="m", input="hi", temperature=0.3).temperature == 0.3
    plain = sdk.responses.create(model="m", input="hi")
    assert (plain.temperature, plain.top_p) == (1.0, 1.0)
    model = Tooled(scripted(answers), n_vocab=258, n_ctx=2048)
    options = ServerOptions("toy", sampling=SamplingDefaults(temperature=0.2))
    with TestClient(create_app(Session(auto_engine(model, None)), options)) as c:
        body = c.post("/v1/responses", json={"input": "hi"}).json()
    assert (body["temperature"], body["top_p"]) == (0.2, 1.0)


def test_input_tokens_are_counted_as_the_response_is_charged(
    sdk: openai.OpenAI, client: TestClient
):
    """OpenAI's `responses.input_tokens.count` (and llama-server's count for a chat)."""
    asked = {"model": "x", "input": "hi", "instructions": "Be brief."}
    response = sdk.responses.create(**asked)
    counted = sdk.responses.input_tokens.count(**asked)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == response.usage.input_tokens > 0  # cached ones among them
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    r = client.post("/v1/chat/completions/input_tokens", json={"messages": chat})
    assert r.json() == {"object": "response.input_tokens", "input_tokens": counted.input_tokens}


def test_instructions_and_messages_reach_the_template(sdk: openai.OpenAI):
    assert sdk.responses.create(input="hi", model="x", instructions="Be brief.").output_text == (
        "Brief."
    )
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    ]
    # a developer message is the system's, as on the chat endpoint
    assert sdk.responses.create(input=items, model="x").output_text == "Brief."


def test_a_function_call_and_its_output_round_trip(sdk: openai.OpenAI):
    tools = [WEATHER, *HOSTED]
    response = sdk.responses.create(model="x", input="hi", tools=tools)
    message, call = response.output
    assert message.type == "message" and message.content[0].text == "Let me look."
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    assert json.loads(call.arguments) == {"city": "Paris"} and call.status == "completed"

    pieces = []
    with sdk.responses.stream(model="x", input="hi", tools=tools) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                pieces.append(event.delta)
        final = stream.get_final_response()
    assert len(pieces) > 2 and json.loads("".join(pieces)) == {"city": "Paris"}  # as written
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output[1].arguments == "".join(pieces)

    history = [
        {"role": "user", "content": "hi"},
        *[item.model_dump(exclude_none=True) for item in response.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"},
    ]
    reply = sdk.responses.create(model="x", input=history, tools=tools)
    assert reply.output_text == "It is sunny in Paris."
    chosen = sdk.responses.create(model="x", input="hi", tools=tools, tool_choice="none")
    assert chosen.output_text == REPLY  # no tools offered


def test_a_functions_output_in_each_shape_reaches_the_template():
    from localspec.server.responses import ResponsesRequest

    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    outputs = [
        "sunny",
        [{"type": "input_text", "text": "sun"}, {"type": "input_text", "text": "ny"}],
    ]
    seen = []
    for output in [*outputs, {"weather": "sunny"}, None]:
        item = {"type": "function_call_output", "call_id": "c1", "output": output}
        request = {"input": [{"role": "user", "content": "hi"}, call, item]}
        messages = ResponsesRequest.model_validate(request).chat().messages
        assert [m.role for m in messages] == ["user", "assistant", "tool"]
        seen.append(messages[-1].content)
    assert seen == ["sunny", "sun\n\nny", '{"weather": "sunny"}', ""]


def test_a_custom_tools_call_carries_its_input_as_written(sdk: openai.OpenAI):
    """Codex's apply_patch is a custom tool: the model sees a function of one string with
    the grammar in its description; its call goes out as a custom_tool_call whose input
    is that string, streamed decoded as the model writes it, and its output goes back."""
    from localspec.server.responses import ResponsesRequest
    from localspec.server.schemas import CUSTOM_PARAMETERS

    tools = [APPLY_PATCH, WEATHER, *HOSTED]
    response = sdk.responses.create(model="x", input="patch", tools=tools)
    (call,) = response.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch"
    assert call.input == PATCH and call.call_id

    deltas, done = [], None
    with sdk.responses.stream(model="x", input="patch", tools=tools) as stream:
        for event in stream:
            if event.type == "response.custom_tool_call_input.delta":
                deltas.append(event.delta)
            elif event.type == "response.custom_tool_call_input.done":
                done = event.input
        final = stream.get_final_response()
    assert len(deltas) > 10 and "".join(deltas) == done == PATCH  # as written, a token each
    assert [item.type for item in final.output] == ["custom_tool_call"]

    history = [
        {"role": "user", "content": "patch"},
        call.model_dump(exclude_none=True),
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Patched"},
    ]
    reply = sdk.responses.create(model="x", input=history, tools=tools)
    assert reply.output_text == "hi.txt is there."

    chat = ResponsesRequest.model_validate({"input": history, "tools": tools}).chat()
    patch, weather = chat.tools or []
    assert patch.function.parameters == CUSTOM_PARAMETERS
    assert 'lark grammar:\nstart: "*** Begin Patch" LF' in (patch.function.description or "")
    assert weather.function.name == "get_weather"
    sent = chat.messages[1].tool_calls[0].function  # type: ignore[index]
    assert json.loads(sent.arguments) == {"input": PATCH}
    named = {
        "input": "patch",
        "tools": tools,
        "tool_choice": {"type": "custom", "name": "apply_patch"},
    }
    assert ResponsesRequest.model_validate(named).chat().tool_choice.function.name == "apply_patch"  # type: ignore[union-attr]


def test_a_custom_calls_input_is_decoded_wherever_its_arguments_are_cut():
    from localspec.server.custom_calls import custom_input, input_so_far

    for ensure_ascii in (True, False):
        arguments = json.dumps({"input": PATCH}, ensure_ascii=ensure_ascii)
        seen = ""
        for cut in range(len(arguments) + 1):
            so_far = input_so_far(arguments[:cut])
            if so_far is None:  # before the string opens
                assert cut <= len('{"input": "') and not seen
                continue
            assert so_far.startswith(seen) and PATCH.startswith(so_far), (cut, so_far)
            seen = so_far
        assert seen == PATCH == custom_input(arguments)
    assert custom_input('{"path": "a"}') == '{"path": "a"}'  # written otherwise: as it is
    assert input_so_far('{"path": "a"}') is None


def test_reasoning_is_an_item_of_its_own(sdk: openai.OpenAI):
    response = sdk.responses.create(model="x", input="think")
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "\nThe user greets me.\n"
    assert message.content[0].text == "Hello!"
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    with sdk.responses.stream(model="x", input="think") as stream:
        deltas = [e.delta for e in stream if e.type == "response.reasoning_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == reasoning.content[0].text
    assert [item.type for item in final.output] == ["reasoning", "message"]


def test_an_answer_cut_by_max_output_tokens_is_incomplete(sdk: openai.OpenAI):
    response = sdk.responses.create(model="x", input="hi", max_output_tokens=5)
    assert response.output_text == REPLY[:5] and response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    with sdk.responses.stream(model="x", input="hi", max_output_tokens=5) as stream:
        names = [event.type for event in stream]
    assert names[-1] == "response.incomplete"
    assert response.output[-1].status == "incomplete"  # the item being written


def test_a_call_cut_by_the_token_limit_says_so_on_both_apis(sdk: openai.OpenAI):
    """max tokens ended the answer inside the call's arguments (Qwen's format, a byte a
    token): nothing calls, as agents check before they run a call with partial input."""
    cut = CALL.index("Paris")  # inside the arguments, once the stream sent the name
    ask = {"model": "x", "input": "hi", "tools": [WEATHER], "max_output_tokens": cut}
    response = sdk.responses.create(**ask)
    assert response.status == "incomplete" and response.output[-1].status == "incomplete"
    with sdk.responses.stream(**ask) as stream:
        *_, last = stream  # response.incomplete (the SDK's final response wants completed)
    final = last.response  # type: ignore[union-attr]
    call = final.output[-1]
    assert call.type == "function_call" and call.status == "incomplete", call
    assert final.status == "incomplete" and call.arguments == '{"city": "'

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    chat = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": cut}
    whole = sdk.chat.completions.create(**chat, tools=tools)  # type: ignore[call-overload]
    assert whole.choices[0].finish_reason == "length"
    chunks = list(sdk.chat.completions.create(**chat, tools=tools, stream=True))  # type: ignore[call-overload]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and "tool_calls" not in reasons
    assert any(c.choices[0].delta.tool_calls for c in chunks if c.choices)  # name sent first


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0]"),  # no call_id
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content"),
        ({"input": "hi", "tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "a"}}}, None),
        ({}, "input"),
        ({"input": []}, "messages"),  # nothing to answer
        ({"input": [{"type": "reasoning", "summary": []}]}, "messages"),
    ],
)
def test_what_cannot_be_served_gets_a_400_that_names_it(client: TestClient, body, param):
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"] and (param is None or error["param"] == param)
