"""The HTTP layer over a toy model (fast): request validation, the error shape, the API
key, streaming framing, tool-call parsing, metrics. The real pair: test_server_real.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from localspec.backends.toy import ToyModel, scripted
from localspec.decoding.adaptive import auto_engine
from localspec.server.app import ServerOptions, create_app
from localspec.server.chat import ToolCallStream
from localspec.session import Session

KEY = "sk-test-key"
REPLY = "Hello from the toy model."
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def client() -> Iterator[TestClient]:
    session = Session(auto_engine(ToyModel(scripted(REPLY), n_vocab=258, n_ctx=512), None))
    app = create_app(session, ServerOptions("toy", "ngram", api_key=KEY, max_body_bytes=4096))
    with TestClient(app) as c:
        yield c


def chat(**extra) -> dict:
    return {"model": "toy", "messages": [{"role": "user", "content": "hi"}], **extra}


def assert_error(response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def test_a_chat_answer_has_usage_and_the_engine_figures(client: TestClient):
    body = client.post("/v1/chat/completions", json=chat(temperature=0), headers=AUTH).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": REPLY}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == len(REPLY.encode())
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + len(REPLY)
    assert {"acceptance_rate", "tokens_per_s", "ttft_s", "drafter", "gamma"} <= set(
        body["localspec"]
    )


def test_a_stream_is_sse_chunks_then_done(client: TestClient):
    request = chat(temperature=0, stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/chat/completions", json=request, headers=AUTH) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == REPLY
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(REPLY)
    assert "localspec" in chunks[-1]


def test_stop_strings_and_max_tokens(client: TestClient):
    body = client.post("/v1/chat/completions", json=chat(stop="toy"), headers=AUTH).json()
    assert body["choices"][0]["message"]["content"] == "Hello from the "
    body = client.post("/v1/chat/completions", json=chat(max_tokens=5), headers=AUTH).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5


def test_plain_completions(client: TestClient):
    body = client.post(
        "/v1/completions", json={"prompt": "<|assistant|>", "max_tokens": 5}, headers=AUTH
    ).json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == REPLY[:5]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
        (json.dumps({"messages": []}).encode(), 400, "messages"),
        (json.dumps(chat(model="gpt-4")).encode(), 404, "model"),
        (json.dumps(chat(max_tokens=0)).encode(), 400, "max_tokens"),
        (json.dumps(chat(max_tokens=10**9)).encode(), 400, "max_tokens"),
        (json.dumps(chat(temperature="hot")).encode(), 400, "temperature"),
        (json.dumps(chat(n=2)).encode(), 400, "n"),
        (json.dumps(chat(presence_penalty=0.5)).encode(), 400, "presence_penalty"),
        (json.dumps(chat(frequency_penalty=1)).encode(), 400, "frequency_penalty"),
        (json.dumps(chat(stop=[1, 2])).encode(), 400, None),
        (json.dumps(chat(messages=[{"role": "user", "content": "x" * 600}])).encode(), 400, None),
        (json.dumps(chat(messages=[{"role": "wizard", "content": "x"}])).encode(), 400, None),
        (json.dumps(chat(messages=[{"role": "user", "content": "x" * 5000}])).encode(), 413, None),
        (
            json.dumps(chat(tools=[{"type": "function", "function": {"name": "f"}}])).encode(),
            400,
            "tools",
        ),
    ],
)
def test_each_bad_request_gets_its_4xx_and_the_server_goes_on(
    client: TestClient, body: bytes, status: int, param: str | None
):
    r = client.post("/v1/chat/completions", content=body, headers=AUTH)
    assert_error(r, status, param)
    good = client.post("/v1/chat/completions", json=chat(temperature=0), headers=AUTH)
    assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] == REPLY


def test_the_prompt_beyond_the_context_is_named(client: TestClient):
    long = chat(messages=[{"role": "user", "content": "x" * 600}])
    error = assert_error(client.post("/v1/chat/completions", json=long, headers=AUTH), 400)
    assert error["code"] == "context_length_exceeded"


def test_the_api_key_is_enforced(client: TestClient):
    assert_error(client.post("/v1/chat/completions", json=chat()), 401)
    wrong = {"Authorization": "Bearer sk-wrong"}
    assert_error(client.post("/v1/chat/completions", json=chat(), headers=wrong), 401)
    assert_error(client.get("/v1/models"), 401)
    assert client.get("/health").status_code == 200  # a liveness probe needs no key
    models = client.get("/v1/models", headers=AUTH).json()
    assert models["data"][0]["id"] == "toy" and models["data"][0]["draft"] == "ngram"


def test_unknown_routes_use_the_error_shape(client: TestClient):
    assert_error(client.get("/v1/nothing", headers=AUTH), 404)
    assert_error(client.get("/v1/chat/completions", headers=AUTH), 405)


def test_metrics_parse_and_count(client: TestClient):
    client.post("/v1/chat/completions", json=chat(temperature=0), headers=AUTH)
    client.post("/v1/chat/completions", json=chat(n=3), headers=AUTH)
    text = client.get("/metrics", headers=AUTH).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {
        "localspec_requests",
        "localspec_completion_tokens",
        "localspec_drafted_tokens",
        "localspec_accepted_tokens",
        "localspec_acceptance_rate",
        "localspec_queue_depth",
        "localspec_ttft_seconds",
        "localspec_tokens_per_second",
    } <= set(families)
    statuses = {
        s.labels["status"]: s.value
        for s in families["localspec_requests"].samples
        if s.name.endswith("_total") and s.labels["endpoint"] == "/v1/chat/completions"
    }
    assert statuses == {"200": 1.0, "400": 1.0}
    tokens = [
        s for s in families["localspec_completion_tokens"].samples if s.name.endswith("total")
    ]
    assert tokens[0].value == len(REPLY)


def test_tool_calls_are_split_out_of_a_stream():
    stream = ToolCallStream()
    text = 'Let me look.<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)]
    content, calls = "", []
    for piece in pieces:
        shown, done = stream.push(piece)
        content, calls = content + shown, calls + done
    rest, more = stream.flush()
    assert content + rest == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls + more] == [("f", {"x": 1})]


def test_a_tool_call_that_does_not_parse_is_text():
    stream = ToolCallStream()
    shown, calls = stream.push("a <tool_call>not json</tool_call> b <tool_")
    rest, more = stream.flush()
    assert shown + rest == "a <tool_call>not json</tool_call> b <tool_" and not calls + more
