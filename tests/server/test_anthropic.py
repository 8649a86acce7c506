"""Anthropic's Messages API (what Claude Code and Anthropic's SDKs send) over a toy model
(fast), through the real `anthropic` SDK: messages and their streams, stop reasons,
tool use and its results, thinking, token counting, errors in Anthropic's shape. The
real pair: test_server_real.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import pytest
from fastapi.testclient import TestClient

from localspec.backends.toy import TEMPLATE, ToyModel, scripted
from localspec.decoding.adaptive import auto_engine
from localspec.server.app import ServerOptions, create_app
from localspec.session import Session

KEY = "sk-test-key"
REPLY = "Hello from the toy model."
CALL = (
    'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
HI = [{"role": "user", "content": "hi"}]
# tools, and each message's role and content, as a template with tools renders them
TOOLS_TEMPLATE = "{% if tools %}<|tools|>{{ tools | tojson }}\n{% endif %}" + TEMPLATE


class Tooled(ToyModel):
    def chat_template(self) -> str | None:
        return TOOLS_TEMPLATE


def answers(prompt: bytes) -> str:
    """The toy's reply: a tool call, unless the prompt holds the call's result; the
    system prompt's words, where asked."""
    if b"<|tool|>Sunny" in prompt:
        return "It is sunny in Paris."
    if b"<|user|>You are a toy.\n\nwho are you?" in prompt:
        return "in the user's turn"
    if b"<|user|>who are you?" in prompt:
        return prompt.split(b"<|system|>")[1].split(b"\n")[0].decode()
    if b"<|user|>Notes\n\nThe sky is green.\n\nWhat colour is the sky?" in prompt:
        return "green, says the document"
    if b"<|user|>think" in prompt:
        return "<think>\nThe user greets me.\n</think>\n\nHello!"
    return CALL if b"<|tools|>" in prompt else REPLY


@pytest.fixture
def client() -> Iterator[TestClient]:
    model = Tooled(scripted(answers), n_vocab=258, n_ctx=512)
    app = create_app(Session(auto_engine(model, None)), ServerOptions("toy", api_key=KEY))
    with TestClient(app) as c:
        yield c


@pytest.fixture
def sdk(client: TestClient) -> anthropic.Anthropic:
    """Anthropic's SDK, sending its key as `x-api-key` as Claude Code does."""
    return anthropic.Anthropic(
        api_key=KEY, base_url=str(client.base_url), http_client=client, max_retries=0
    )


def events(client: TestClient, body: dict) -> list[tuple[str, dict]]:
    """The stream's events as (name, data), each name checked against its data's type."""
    r = client.post("/v1/messages", json={**body, "stream": True}, headers={"x-api-key": KEY})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in r.text.strip().split("\n\n"):
        name, data = block.split("\n")
        parsed = json.loads(data.removeprefix("data: "))
        assert name == f"event: {parsed['type']}"
        out.append((parsed["type"], parsed))
    return out


def test_a_message_and_its_stream_agree(sdk: anthropic.Anthropic, client: TestClient):
    message = sdk.messages.create(model="claude-local", max_tokens=64, messages=HI)
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == REPLY and message.stop_reason == "end_turn"
    assert message.model == "toy" and message.id.startswith("msg_") and message.role == "assistant"
    assert message.usage.output_tokens == len(REPLY)
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 0
    assert message.model_extra["localspec"]["rounds"] >= 1

    with sdk.messages.stream(model="claude-local", max_tokens=64, messages=HI) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == REPLY and [b.text for b in final.content] == [REPLY]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == len(REPLY)

    names = [name for name, _ in events(client, {"max_tokens": 64, "messages": HI})]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}


def test_a_prefilled_answer_is_continued(sdk: anthropic.Anthropic):
    """An assistant message at the end is an answer begun: the model goes on from it, and
    the message holds what it added (as Anthropic's API answers a prefill)."""
    begun = [*HI, {"role": "assistant", "content": "Hello from"}]
    message = sdk.messages.create(model="claude-local", max_tokens=64, messages=begun)
    assert message.content[0].text == REPLY.removeprefix("Hello from")
    assert message.stop_reason == "end_turn"
    with sdk.messages.stream(model="claude-local", max_tokens=64, messages=begun) as stream:
        assert "".join(stream.text_stream) == REPLY.removeprefix("Hello from")
    # an answer may not be held to a format it has already begun outside of
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    with pytest.raises(anthropic.BadRequestError, match="prefill"):
        sdk.messages.create(
            model="claude-local",
            max_tokens=8,
            messages=begun,
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}},
        )


def test_stop_sequences_and_token_limits_say_why_the_message_ended(sdk: anthropic.Anthropic):
    stopped = sdk.messages.create(
        model="toy", max_tokens=64, messages=HI, stop_sequences=["toy", "from"]
    )
    assert stopped.content[0].text == "Hello "
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "from")
    short = sdk.messages.create(model="toy", max_tokens=3, messages=HI)
    assert (short.content[0].text, short.stop_reason) == ("Hel", "max_tokens")
    with sdk.messages.stream(model="toy", max_tokens=64, messages=HI, stop_sequences=["m"]) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "m")


def test_max_tokens_0_only_reads_the_prompt_into_the_cache(sdk: anthropic.Anthropic):
    """Anthropic's pre-warming: the next request finds the prompt cached."""
    warm = sdk.messages.create(model="toy", max_tokens=0, messages=HI)
    assert warm.content == [] and warm.stop_reason == "max_tokens"
    assert warm.usage.output_tokens == 0
    message = sdk.messages.create(model="toy", max_tokens=64, messages=HI)
    # all but the last token, read again for the first answer token's logits
    assert message.usage.cache_read_input_tokens == warm.usage.input_tokens - 1


def test_todays_output_config_becomes_the_chats_fields():
    from localspec.server.anthropic import MessagesRequest

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    config = {"effort": "max", "format": {"type": "json_schema", "schema": schema}}
    chat = MessagesRequest.model_validate({"messages": HI, "output_config": config}).chat()
    assert chat.reasoning_effort == "high"
    assert chat.response_format == {"type": "json_schema", "json_schema": {"schema": schema}}
    assert chat.SCHEMA_PARAM == "output_config.format.schema"  # what a bad schema's 400 names


def test_a_limit_beyond_the_context_ends_as_the_context_window():
    model = ToyModel(scripted("x" * 400), n_vocab=258, n_ctx=96)
    with TestClient(create_app(Session(auto_engine(model, None)), ServerOptions("toy"))) as c:
        body = c.post("/v1/messages", json={"max_tokens": 32000, "messages": HI}).json()
    assert body["stop_reason"] == "model_context_window_exceeded"
    assert 0 < body["usage"]["output_tokens"] < 96


def test_a_tool_use_cut_by_max_tokens_ends_as_max_tokens(client: TestClient):
    """Inside the call's input, streamed (the tool_use block was open) or not: the
    message ends as `max_tokens`, not `tool_use`, whose input would be partial."""
    body = {"max_tokens": CALL.index("Paris"), "messages": HI, "tools": [WEATHER]}
    whole = client.post("/v1/messages", json=body, headers={"x-api-key": KEY}).json()
    assert whole["stop_reason"] == "max_tokens"
    streamed = events(client, body)
    assert [b["content_block"]["type"] for n, b in streamed if n == "content_block_start"] == [
        "text",
        "tool_use",
    ]
    assert [e["delta"]["stop_reason"] for n, e in streamed if n == "message_delta"] == [
        "max_tokens"
    ]


def test_a_tool_use_and_its_result_round_trip(sdk: anthropic.Anthropic, client: TestClient):
    message = sdk.messages.create(model="toy", max_tokens=200, messages=HI, tools=[WEATHER])
    assert message.stop_reason == "tool_use"
    text, call = message.content
    assert text.type == "text" and text.text == "Let me look."
    assert call.type == "tool_use" and call.name == "get_weather" and call.id
    assert call.input == {"city": "Paris"}

    with sdk.messages.stream(model="toy", max_tokens=200, messages=HI, tools=[WEATHER]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[1].input == {"city": "Paris"}
    streamed = events(client, {"max_tokens": 200, "messages": HI, "tools": [WEATHER]})
    starts = [e["content_block"] for name, e in streamed if name == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use"]
    assert starts[1]["name"] == "get_weather" and starts[1]["input"] == {}
    pieces = [
        e["delta"]["partial_json"]
        for name, e in streamed
        if name == "content_block_delta" and e["index"] == 1
    ]
    assert len(pieces) > 2 and json.loads("".join(pieces)) == {"city": "Paris"}  # as written
    # each block closed before the next one opens
    opened = [(n, e["index"]) for n, e in streamed if n.startswith("content_block_")]
    assert opened.index(("content_block_stop", 0)) < opened.index(("content_block_start", 1))

    result = {
        "type": "tool_result",
        "tool_use_id": call.id,
        "content": [{"type": "text", "text": "Sunny"}],
    }
    turns = [
        *HI,
        {"role": "assistant", "content": message.content},
        {"role": "user", "content": [result]},
    ]
    reply = sdk.messages.create(model="toy", max_tokens=64, messages=turns, tools=[WEATHER])
    assert reply.content[0].text == "It is sunny in Paris." and reply.stop_reason == "end_turn"

    plain = sdk.messages.create(
        model="toy", max_tokens=64, messages=HI, tools=[WEATHER], tool_choice={"type": "none"}
    )
    assert plain.content[0].text == REPLY  # no tools offered


def test_the_system_prompt_arrives_and_claude_codes_billing_stamp_does_not(
    sdk: anthropic.Anthropic,
):
    ask = [{"role": "user", "content": "who are you?"}]

    def system(stamp: str) -> list[dict]:
        return [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.1; cch={stamp};"},
            {"type": "text", "text": "You are a toy.", "cache_control": {"type": "ephemeral"}},
        ]

    message = sdk.messages.create(model="toy", max_tokens=64, messages=ask, system=system("a5145"))
    assert message.content[0].text == "You are a toy."
    counts = {
        sdk.messages.count_tokens(model="toy", messages=ask, system=system(s)).input_tokens
        for s in ("a5145", "0c1d2")
    }
    # Claude Code sends its environment as a system message after the user's turn: it
    # goes into that turn, before the user's words (small models answered it otherwise)
    later = [*ask, {"role": "system", "content": [{"type": "text", "text": "You are a toy."}]}]
    assert sdk.messages.create(model="toy", max_tokens=64, messages=later).content[0].text == (
        "in the user's turn"
    )
    plain = sdk.messages.count_tokens(model="toy", messages=ask, system="You are a toy.")
    assert counts == {plain.input_tokens}  # one prompt: its cache is reused across requests
    assert plain.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


def test_counting_a_prompts_tokens_renders_it_once(monkeypatch: pytest.MonkeyPatch):
    """count_tokens (and llama-server's /apply-template) read nothing: the messages'
    starts, which a hybrid target's read stops at, are not worked out (two more renders
    of the template each)."""
    model = Tooled(scripted(answers), n_vocab=258, n_ctx=512)
    session = Session(auto_engine(model, None))

    def refuse(*args: object, **kwargs: object) -> tuple[int, ...]:
        raise AssertionError("marks worked out for a prompt no one reads")

    monkeypatch.setattr(session, "message_marks", refuse)
    app = create_app(session, ServerOptions("toy", api_key=KEY))
    ask = {"messages": [{"role": "user", "content": "who are you?"}]}
    with TestClient(app) as c:
        headers = {"x-api-key": KEY}
        counted = c.post("/v1/messages/count_tokens", json={"model": "toy", **ask}, headers=headers)
        assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
        rendered = c.post("/apply-template", json=ask, headers=headers)
        assert rendered.status_code == 200 and "who are you?" in rendered.json()["prompt"]


def test_thinking_comes_first_in_its_own_block(sdk: anthropic.Anthropic, client: TestClient):
    class Thinker(Tooled):
        def chat_template(self) -> str | None:
            return TEMPLATE + "{# <think> #}"

    model = Thinker(scripted(answers), n_vocab=258, n_ctx=512)
    ask = [{"role": "user", "content": "think"}]
    with TestClient(create_app(Session(auto_engine(model, None)), ServerOptions("toy"))) as c:
        body = c.post("/v1/messages", json={"max_tokens": 64, "messages": ask}).json()
        streamed = events(c, {"max_tokens": 64, "messages": ask})
    assert body["content"] == [
        {"type": "thinking", "thinking": "\nThe user greets me.\n", "signature": ""},
        {"type": "text", "text": "Hello!"},
    ]
    deltas = [e["delta"] for name, e in streamed if name == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "\nThe user greets me.\n"
    assert next(d["type"] for d in deltas if d["type"] != "thinking_delta") == "signature_delta"
    assert "".join(d.get("text", "") for d in deltas) == "Hello!"


def test_a_text_document_is_read_as_text_and_a_pdf_is_refused(sdk: anthropic.Anthropic):
    """A document block with a plain-text or a content source (what the API's citations
    take) reaches the model as its title and text, before the question; a PDF, a 400."""
    plain = {"type": "text", "media_type": "text/plain", "data": "The sky is green."}
    blocks = {"type": "content", "content": [{"type": "text", "text": "The sky is green."}]}
    for source in (plain, blocks):
        content = [
            {"type": "document", "source": source, "title": "Notes"},
            {"type": "text", "text": "What colour is the sky?"},
        ]
        message = sdk.messages.create(
            model="toy", max_tokens=64, messages=[{"role": "user", "content": content}]
        )
        assert message.content[0].text == "green, says the document"
    pdf = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}
    with pytest.raises(anthropic.BadRequestError, match="'document' part: this model takes text"):
        sdk.messages.create(
            model="toy",
            max_tokens=5,
            messages=[{"role": "user", "content": [{"type": "document", "source": pdf}]}],
        )


def test_errors_come_in_anthropics_shape(sdk: anthropic.Anthropic, client: TestClient):
    def error(r) -> dict:
        body = r.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        return body["error"]

    headers = {"x-api-key": KEY}
    missing = error(client.post("/v1/messages", json={"max_tokens": 5}, headers=headers))
    assert missing["type"] == "invalid_request_error" and "messages" in missing["message"]
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
    }
    r = client.post(
        "/v1/messages",
        json={"max_tokens": 5, "messages": [{"role": "user", "content": [image]}]},
        headers=headers,
    )
    assert r.status_code == 400 and "takes text only" in error(r)["message"]
    wrong = client.post("/v1/messages", json={"messages": HI}, headers={"x-api-key": "nope"})
    assert wrong.status_code == 401 and error(wrong)["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        sdk.messages.create(
            model="toy",
            max_tokens=5,
            messages=HI,
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "x"},
        )
    only_thinking = [{"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}]
    r = client.post("/v1/messages", json={"messages": only_thinking}, headers=headers)
    assert r.status_code == 400 and error(r)["type"] == "invalid_request_error"  # nothing to answer
    # the OpenAI routes keep OpenAI's shape
    assert "error" in client.post("/v1/chat/completions", json={}, headers=headers).json()
