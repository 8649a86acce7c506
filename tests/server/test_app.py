"""The HTTP layer over a toy model (fast): request validation, the error shape, the API
key, streaming framing, tool-call parsing, metrics. The real pair: test_server_real.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from localspec.backends.toy import ASSISTANT, ToyModel, scripted
from localspec.backends.toy import TEMPLATE as TOY_TEMPLATE
from localspec.decoding.adaptive import AdaptiveDrafter, auto_engine
from localspec.decoding.engine import GenerationConfig
from localspec.decoding.events import Stats
from localspec.server import slot_files
from localspec.server.app import ServerOptions, create_app
from localspec.server.chat import ToolCallStream
from localspec.server.defaults import SamplingDefaults
from localspec.server.errors import ApiError
from localspec.server.guard import Guard
from localspec.server.jobs import Failed, Job
from localspec.server.metrics import answer_line
from localspec.server.worker import Worker
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


IMAGE = [
    {"type": "text", "text": "What is in this picture?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
]


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


def test_an_assistant_message_at_the_end_is_continued(client: TestClient):
    """llama-server's assistant prefill: the answer goes on from the text begun, and holds
    only what the model added; an empty one is a fresh turn; no grammar on top of it."""
    begun = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello from"}]
    body = client.post("/v1/chat/completions", json=chat(messages=begun), headers=AUTH).json()
    assert body["choices"][0]["message"]["content"] == REPLY.removeprefix("Hello from")
    whole = client.post("/v1/chat/completions", json=chat(), headers=AUTH).json()
    assert body["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] + len("Hello from")

    fresh = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]
    body = client.post("/v1/chat/completions", json=chat(messages=fresh), headers=AUTH).json()
    assert body["choices"][0]["message"]["content"] == REPLY

    formatted = chat(messages=begun, response_format={"type": "json_object"})
    r = client.post("/v1/chat/completions", json=formatted, headers=AUTH)
    assert "prefill" in assert_error(r, 400, "messages")["message"]


def test_the_servers_sampling_fills_what_a_request_leaves_out():
    """`serve --temperature 0` makes requests that send none greedy (agents send none),
    through every API; a request's own temperature wins."""
    unsure = ToyModel(scripted(REPLY, confidence=1.0), n_vocab=258, n_ctx=512)
    greedy = SamplingDefaults(temperature=0.0)
    app = create_app(Session(auto_engine(unsure, None)), ServerOptions("toy", sampling=greedy))
    with TestClient(app) as c:
        answer = c.post("/v1/chat/completions", json=chat()).json()
        assert answer["choices"][0]["message"]["content"] == REPLY
        message = c.post("/v1/messages", json={"max_tokens": 64, "messages": chat()["messages"]})
        assert message.json()["content"][0]["text"] == REPLY
        hot = c.post("/v1/chat/completions", json=chat(temperature=1.0, seed=1)).json()
        assert hot["choices"][0]["message"]["content"] != REPLY  # near-uniform rows, sampled
        params = c.get("/props").json()["default_generation_settings"]["params"]
        assert (params["temperature"], params["top_k"]) == (0.0, 40)  # as /completion samples
        assert (params["repeat_last_n"], params["presence_penalty"]) == (64, 0.0)


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


def test_the_servers_max_tokens_caps_every_answer():
    """`serve --max-tokens` (llama-server's -n): an answer that asks no limit, or more,
    stops there as one that asked it would ("length", Anthropic's "max_tokens")."""
    session = Session(auto_engine(ToyModel(scripted(REPLY), n_vocab=258, n_ctx=512), None))
    with TestClient(create_app(session, ServerOptions("toy", max_tokens=4))) as c:
        for asked in ({}, {"max_tokens": 100}, {"max_tokens": -1}):
            body = c.post("/v1/chat/completions", json=chat(temperature=0, **asked)).json()
            assert body["choices"][0]["message"]["content"] == REPLY[:4]
            assert body["choices"][0]["finish_reason"] == "length"
        fewer = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).json()
        assert fewer["usage"]["completion_tokens"] == 2
        message = {"max_tokens": 64, "messages": chat()["messages"], "temperature": 0}
        assert c.post("/v1/messages", json=message).json()["stop_reason"] == "max_tokens"
        native = c.post("/completion", json={"prompt": "hi", "n_predict": 50}).json()
        assert native["tokens_predicted"] == 4 and native["stop_type"] == "limit"


def test_n_predict_as_llama_server_reads_it(client: TestClient):
    """llama-server's n_predict before max_tokens; 0 reads the prompt into a slot's cache
    and answers nothing (llama.vscode warms its chat up so)."""
    body = chat(temperature=0, n_predict=3, max_tokens=10)
    answer = client.post("/v1/chat/completions", json=body, headers=AUTH).json()
    assert answer["choices"][0]["message"]["content"] == REPLY[:3]
    warm = client.post("/v1/chat/completions", json=chat(n_predict=0), headers=AUTH).json()
    assert warm["choices"][0]["message"]["content"] == ""
    assert warm["usage"]["completion_tokens"] == 0 and warm["usage"]["prompt_tokens"] > 0
    again = client.post("/v1/chat/completions", json=chat(temperature=0), headers=AUTH).json()
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= warm["usage"]["prompt_tokens"] - 1


@pytest.mark.parametrize("cache_ram", [1 << 20, 0])
def test_a_conversation_after_another_in_its_slot_comes_back_from_ram(cache_ram: int):
    """One slot, a chat and an agent taking turns: with --cache-ram the chat's next turn
    gets its cache back from RAM and reads only what is new; without, it reads it all."""
    model = ToyModel(scripted(REPLY), n_vocab=258, n_ctx=2048)
    app = create_app(Session(auto_engine(model, None)), ServerOptions("toy", cache_ram=cache_ram))
    talks = [
        [{"role": "system", "content": "You review code. " * 30}],
        [{"role": "system", "content": "You write shell commands. " * 30}],
    ]
    first: list[int] = []
    with TestClient(app) as c:
        for who, ask in [(0, "a1"), (1, "b1"), (0, "a2"), (1, "b2")]:
            talks[who].append({"role": "user", "content": ask})
            body = {"messages": talks[who], "temperature": 0}
            usage = c.post("/v1/chat/completions", json=body).json()["usage"]
            talks[who].append({"role": "assistant", "content": REPLY})
            if len(first) < 2:
                first.append(usage["prompt_tokens"])
                continue
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            assert (cached >= first[who]) == bool(cache_ram), (who, cached, first[who])
        figures = {
            s.name: s.value
            for f in text_string_to_metric_families(c.get("/metrics").text)
            for s in f.samples
        }
    assert (figures["localspec_prompt_cache_tokens_total"] >= sum(first)) == bool(cache_ram)
    assert (figures["localspec_prompt_cache_bytes"] > 0) == bool(cache_ram)


def test_plain_completions(client: TestClient):
    body = client.post(
        "/v1/completions", json={"prompt": "<|assistant|>", "max_tokens": 5}, headers=AUTH
    ).json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == REPLY[:5]


@pytest.mark.parametrize(
    ("prompt", "error"),
    [
        (list(b"<|assistant|>"), None),  # token ids (the toy's tokens are its bytes)
        ([list(b"<|assistant|>")], None),  # a batch of one, as lm-eval's local-completions
        (["<|assistant|>"], None),
        ([], "the prompt is empty"),
        ([[1]] * 17, "17 prompts x n 1 asks for more than 16 answers"),
        ([1, 258], "prompt: token ids must be in [0, 258)"),
    ],
)
def test_a_completions_prompt_takes_openais_four_shapes(client: TestClient, prompt, error):
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 5}, headers=AUTH)
    if error is None:
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == REPLY[:5]
    else:
        assert assert_error(r, 400, "prompt")["message"] == error


def test_n_answers_come_as_numbered_choices_with_one_usage(client: TestClient):
    """OpenAI's `n` (one slot here: the answers take turns in it), and a batch of prompts
    answered n times each: choice i * n + j is prompt i's answer j."""
    body = client.post("/v1/chat/completions", json=chat(n=3, seed=1), headers=AUTH).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert {c["message"]["content"] for c in body["choices"]} == {REPLY}
    one = client.post("/v1/chat/completions", json=chat(), headers=AUTH).json()["usage"]
    usage = body["usage"]
    assert usage["prompt_tokens"] == one["prompt_tokens"]  # one prompt, counted once
    assert usage["completion_tokens"] == 3 * one["completion_tokens"]
    batch = {"prompt": ["<|assistant|>", "x<|assistant|>"], "n": 2, "max_tokens": 5}
    body = client.post("/v1/completions", json=batch, headers=AUTH).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in body["choices"]] == [REPLY[:5]] * 4
    assert body["usage"]["prompt_tokens"] == len(b"<|assistant|>") * 2 + 1
    assert body["usage"]["completion_tokens"] == 20
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json=chat(n=2, stream=True, stream_options={"include_usage": True}),
        headers=AUTH,
    ) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    texts = ["", ""]
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["delta"].get("content") or ""
    assert texts == [REPLY, REPLY]
    assert len({c["id"] for c in chunks}) == 1
    usages = [c for c in chunks if not c["choices"]]
    assert len(usages) == 1 and usages[0]["usage"]["completion_tokens"] == 2 * len(REPLY)
    assert_error(client.post("/completion", json={"prompt": "x", "n": 2}, headers=AUTH), 400, "n")


def test_llama_servers_own_completion_endpoint(client: TestClient):
    """/completion as Continue's `llama.cpp` provider and llama-server's scripts send it:
    text or token ids, n_predict (max_tokens where it is not given), streamed pieces of
    `content` then the whole with stop: true and no [DONE]."""
    ask = {"prompt": "<|assistant|>", "n_predict": 5, "temperature": 0}
    body = client.post("/completion", json=ask, headers=AUTH).json()
    assert body["content"] == REPLY[:5] and body["stop"] is True
    assert body["tokens_predicted"] == 5 and body["stop_type"] == "limit"
    assert body["tokens_evaluated"] == body["timings"]["prompt_n"] > 0
    ids = list(b"<|assistant|>")  # the toy's tokens are its bytes
    by_ids = {"prompt": ids, "max_tokens": 3, "temperature": 0, "return_tokens": True}
    body = client.post("/completions", json=by_ids, headers=AUTH).json()
    assert body["content"] == REPLY[:3] and body["tokens"] == list(REPLY[:3].encode())
    whole = {"prompt": "<|assistant|>", "temperature": 0, "stream": True}
    with client.stream("POST", "/completion", json=whole, headers=AUTH) as r:
        lines = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line]
    assert "".join(c["content"] for c in lines) == REPLY
    assert [c["stop"] for c in lines] == [False] * (len(lines) - 1) + [True]
    assert lines[-1]["stop_type"] == "eos" and lines[-1]["stopping_word"] == ""
    worded = {"prompt": "<|assistant|>", "temperature": 0, "stop": ["model", "from"]}
    body = client.post("/completion", json=worded, headers=AUTH).json()
    assert body["content"] == "Hello " and body["stop_type"] == "word"
    assert body["stopping_word"] == "from"  # the one that ended it, as llama-server says
    # n_probs: each shown token's log-probability, none for the stop string's, streamed
    # or not; OpenAI's logprobs alike
    probed = worded | {"n_probs": 2}
    probs = client.post("/completion", json=probed, headers=AUTH).json()["completion_probabilities"]
    assert [p["token"] for p in probs] == list("Hello ")
    assert all(len(p["top_logprobs"]) == 2 and p["logprob"] <= 0 for p in probs)
    with client.stream("POST", "/completion", json=probed | {"stream": True}, headers=AUTH) as r:
        lines = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line]
    assert [p for c in lines for p in c.get("completion_probabilities", [])] == probs
    v1 = {"prompt": "<|assistant|>", "temperature": 0, "stop": ["from"], "logprobs": 1}
    logprobs = client.post("/v1/completions", json=v1, headers=AUTH).json()["choices"][0]
    assert logprobs["logprobs"]["tokens"] == list("Hello ")
    for bad, param in (({"prompt": [1, 999]}, "prompt"), ({"prompt": "x", "mirostat": 2}, None)):
        assert_error(client.post("/completion", json=bad, headers=AUTH), 400, param)


def test_llama_cpps_other_samplers_are_taken_off_and_refused_on(client: TestClient):
    """llama.vscode's chat sends DRY, XTC, typical-p and dynamic temperature switched off:
    served; a preset that switches one on gets a 400 naming it, not an answer without it."""
    off = {"typical_p": 1, "dry_multiplier": 0, "xtc_probability": 0, "dynatemp_range": 0}
    off |= {"top_n_sigma": -1, "mirostat": 0, "samplers": "edkypmxt"}
    r = client.post("/v1/chat/completions", json=chat(temperature=0, **off), headers=AUTH)
    assert r.json()["choices"][0]["message"]["content"] == REPLY
    on = {"typical_p": 0.9, "dry_multiplier": 0.8, "xtc_probability": 0.5}
    on |= {"dynatemp_range": 0.5, "top_n_sigma": 1.0, "mirostat": 2}
    for name, value in on.items():
        for path, body in (("/v1/chat/completions", chat()), ("/completion", {"prompt": "x"})):
            r = client.post(path, json={**body, name: value}, headers=AUTH)
            assert "not supported" in assert_error(r, 400, name)["message"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
        (json.dumps({"messages": []}).encode(), 400, "messages"),
        (json.dumps(chat(max_tokens=0)).encode(), 400, "max_tokens"),
        (json.dumps(chat(max_tokens=-2)).encode(), 400, "max_tokens"),
        (json.dumps(chat(temperature="hot")).encode(), 400, "temperature"),
        (json.dumps(chat(n=0)).encode(), 400, "n"),
        (json.dumps(chat(n=17)).encode(), 400, "n"),
        (json.dumps(chat(presence_penalty=2.5)).encode(), 400, "presence_penalty"),
        (json.dumps(chat(frequency_penalty="x")).encode(), 400, "frequency_penalty"),
        (json.dumps(chat(logit_bias={"hello": 1})).encode(), 400, "logit_bias"),
        (json.dumps(chat(logit_bias={"5": 101})).encode(), 400, "logit_bias"),
        (json.dumps(chat(logit_bias={"258": -100})).encode(), 400, "logit_bias"),
        (json.dumps(chat(repeat_last_n=-2)).encode(), 400, "repeat_last_n"),
        (json.dumps(chat(seed=-2)).encode(), 400, "seed"),
        (json.dumps(chat(stop=[1, 2])).encode(), 400, None),
        (json.dumps(chat(stop=[f"s{i}" for i in range(65)])).encode(), 400, "stop"),
        (json.dumps(chat(messages=[{"role": "user", "content": "x" * 600}])).encode(), 400, None),
        (json.dumps(chat(messages=[{"role": "wizard", "content": "x"}])).encode(), 400, None),
        (json.dumps(chat(messages=[{"role": "user", "content": IMAGE}])).encode(), 400, None),
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


def test_an_image_gets_a_one_line_400_that_says_the_model_takes_text(client: TestClient):
    body = chat(messages=[{"role": "user", "content": IMAGE}])
    error = assert_error(client.post("/v1/chat/completions", json=body, headers=AUTH), 400)
    assert error["message"] == "messages[0].content has an image: this model takes text only"
    text_parts = chat(messages=[{"role": "user", "content": IMAGE[:1]}], temperature=0)
    assert client.post("/v1/chat/completions", json=text_parts, headers=AUTH).status_code == 200


@pytest.mark.parametrize(
    ("field", "param", "message"),
    [
        ({"stop": [1, 2]}, "stop.0", "Input should be a valid string"),
        ({"stop": 5}, "stop", "Input should be a valid string, or a valid array"),
        ({"tool_choice": "maybe"}, "tool_choice", "'none', 'auto' or 'required', or an object"),
    ],
)
def test_a_field_of_several_shapes_says_what_it_takes(client: TestClient, field, param, message):
    """Not pydantic's path through its union ("stop.str", "stop.list[str].0")."""
    r = client.post("/v1/chat/completions", json=chat(**field), headers=AUTH)
    error = assert_error(r, 400, param)
    assert error["message"].startswith(f"{param}: ") and error["message"].endswith(message)


def test_another_model_name_is_served_by_the_loaded_one(client: TestClient):
    body = client.post("/v1/chat/completions", json=chat(model="gpt-4o-mini"), headers=AUTH)
    assert body.status_code == 200 and body.json()["model"] == "toy"


@pytest.mark.parametrize("limit", [10**9, -1])  # -1: llama-server's "no limit" (llama.vscode)
def test_max_tokens_beyond_the_context_is_clamped_not_refused(limit: int):
    # a reply that never ends: the answer runs until the context is full
    session = Session(auto_engine(ToyModel(scripted("ab" * 400), n_vocab=258, n_ctx=128), None))
    with TestClient(create_app(session, ServerOptions("toy"))) as c:
        r = c.post("/v1/chat/completions", json=chat(max_tokens=limit, temperature=0))
        plain = c.post("/v1/completions", json={"prompt": "a", "max_tokens": limit})
    for response, choice in ((r, "message"), (plain, "text")):
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["choices"][0]["finish_reason"] == "length", choice
        assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] == 128


def test_the_prompt_beyond_the_context_is_named(client: TestClient):
    long = chat(messages=[{"role": "user", "content": "x" * 600}])
    error = assert_error(client.post("/v1/chat/completions", json=long, headers=AUTH), 400)
    assert error["code"] == "context_length_exceeded" and "serve --ctx" in error["message"]


def test_the_api_key_is_enforced(client: TestClient):
    assert_error(client.post("/v1/chat/completions", json=chat()), 401)
    wrong = {"Authorization": "Bearer sk-wrong"}
    assert_error(client.post("/v1/chat/completions", json=chat(), headers=wrong), 401)
    assert_error(client.get("/v1/models"), 401)
    assert client.get("/health").status_code == 200  # a liveness probe needs no key
    models = client.get("/v1/models", headers=AUTH).json()
    assert models["data"][0]["id"] == "toy" and models["data"][0]["draft"] == "ngram"


def test_the_sdks_retrieve_the_loaded_model_by_any_name(client: TestClient):
    """`client.models.retrieve(name)` (OpenAI's and Anthropic's SDKs): the loaded model,
    as a request naming another model is served by it; behind the key like the list."""
    import openai

    assert_error(client.get("/v1/models/toy"), 401)
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=client)
    assert sdk.models.retrieve("toy").id == "toy"
    assert sdk.models.retrieve("Qwen/gpt-4o-mini").id == "toy"  # a name with a slash too
    assert client.get("/models/x", headers=AUTH).json()["draft"] == "ngram"


def test_apply_template_gives_the_prompt_a_chat_is_answered_from(client: TestClient):
    """llama-server's /apply-template: the messages through the chat template, as text."""
    messages = [{"role": "user", "content": "hi"}]
    prompt = client.post("/apply-template", json={"messages": messages}, headers=AUTH).json()
    counted = client.post(
        "/v1/chat/completions/input_tokens", json={"messages": messages}, headers=AUTH
    ).json()["input_tokens"]
    assert "hi" in prompt["prompt"] and len(prompt["prompt"].encode()) == counted  # bytes
    assert_error(client.post("/apply-template", json={"messages": []}, headers=AUTH), 400)


def test_the_paths_without_v1_are_served_as_llama_servers_are(client: TestClient):
    """Clients given the bare address (Codex with base_url http://host:port) leave it out."""
    body = client.post("/chat/completions", json=chat(temperature=0), headers=AUTH).json()
    assert body["choices"][0]["message"]["content"] == REPLY
    answer = client.post("/responses", json={"input": "hi", "temperature": 0}, headers=AUTH)
    assert answer.json()["output"][0]["content"][0]["text"] == REPLY
    assert client.get("/models", headers=AUTH).json()["data"][0]["id"] == "toy"
    health = client.get("/v1/health").json()
    assert health["status"] == "ok" and health["queue_depth"] == health["reading_ahead"] == 0


def test_unknown_routes_use_the_error_shape_and_say_what_is_served(client: TestClient):
    speech = {"input": "x", "voice": "alloy"}  # an OpenAI endpoint not served
    error = assert_error(client.post("/v1/audio/speech", json=speech, headers=AUTH), 404)
    assert error["message"].startswith("no POST /v1/audio/speech here; served: ")
    assert "/v1/chat/completions" in error["message"] and "/infill" in error["message"]
    assert "/v1/embeddings" in error["message"]
    assert "/v1/models/{name}," in error["message"]  # not starlette's {name:path}
    error = assert_error(client.get("/v1/chat/completions", headers=AUTH), 405)
    assert error["message"] == "/v1/chat/completions does not take GET"


def test_the_address_opened_in_a_browser_says_what_is_served(client: TestClient):
    page = client.get("/")  # no key: it says no more than /health
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
    assert "serving toy" in page.text and f"{client.base_url}/v1" in page.text


def test_llama_servers_tokenize_detokenize_and_props(client: TestClient):
    """For clients that count tokens, or read the context size, as llama-server serves them."""
    ids = client.post("/tokenize", json={"content": "hi <|assistant|>"}, headers=AUTH).json()
    assert ids["tokens"] == list(b"hi <|assistant|>")  # the toy's tokens are its bytes
    pieces = client.post("/tokenize", json={"content": "é", "with_pieces": True}, headers=AUTH)
    assert pieces.json()["tokens"] == [{"id": 0xC3, "piece": [0xC3]}, {"id": 0xA9, "piece": [0xA9]}]
    text = client.post("/detokenize", json={"tokens": ids["tokens"]}, headers=AUTH).json()
    assert text == {"content": "hi <|assistant|>"}
    assert_error(client.post("/detokenize", json={"tokens": [999]}, headers=AUTH), 400, "tokens")
    props = client.get("/props", headers=AUTH).json()
    assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 1
    assert props["build_info"].startswith("localspec ")


def test_slots_tell_what_each_slot_does_as_llama_servers(client: TestClient):
    """GET /slots, llama-server's shape: a slot's context and whether it drafts, and of
    the request it ran the sampling and the tokens read and decoded (no text of either);
    behind the key; `?fail_on_no_slot=1` a 503 while every slot is busy."""
    assert_error(client.get("/slots"), 401)
    (fresh,) = client.get("/slots", headers=AUTH).json()
    assert fresh == {
        "id": 0,
        "n_ctx": 512,
        "speculative": True,
        "is_processing": False,
        "n_cached": 0,
    }
    body = client.post(
        "/v1/chat/completions", json=chat(temperature=0, max_tokens=100, seed=7), headers=AUTH
    ).json()
    (slot,) = client.get("/slots", headers=AUTH).json()
    used = body["usage"]
    assert slot["id_task"] == 0 and not slot["is_processing"]
    assert slot["n_prompt_tokens"] == used["prompt_tokens"]
    assert (
        slot["n_prompt_tokens_processed"] + slot["n_prompt_tokens_cache"] == used["prompt_tokens"]
    )
    assert slot["params"]["temperature"] == 0 and slot["params"]["seed"] == 7
    assert slot["params"]["n_predict"] == 100
    (token,) = slot["next_token"]
    assert token == {
        "has_next_token": False,
        "n_remain": 100 - used["completion_tokens"],
        "n_decoded": used["completion_tokens"],
    }
    assert slot["drafting"]["drafted"] >= slot["drafting"]["accepted"] >= 0
    assert REPLY not in json.dumps(slot) and "hi" not in json.dumps(slot["params"])
    assert client.get("/slots?fail_on_no_slot=1", headers=AUTH).status_code == 200
    worker = client.app.state.worker  # type: ignore[attr-defined]
    worker.slots[0].job = worker.slots[0].last  # busy, as while an answer is written
    try:
        assert_error(client.get("/slots?fail_on_no_slot=1", headers=AUTH), 503)
        assert client.get("/slots", headers=AUTH).json()[0]["is_processing"] is True
    finally:
        worker.slots[0].job = None
    with worker.holding(0):  # a save or restore has it: no request could start there
        assert_error(client.get("/slots?fail_on_no_slot=1", headers=AUTH), 503)
    assert client.get("/slots?fail_on_no_slot=1", headers=AUTH).status_code == 200


def saving_app(tmp_path: Path) -> TestClient:
    session = Session(auto_engine(ToyModel(scripted(REPLY), n_vocab=258, n_ctx=512), None))
    return TestClient(create_app(session, ServerOptions("toy", slot_save_path=tmp_path)))


def test_a_slots_cache_saved_to_a_file_comes_back_in_another_server(tmp_path: Path):
    """llama-server's POST /slots/{id}?action=save|restore|erase: the cache written to a
    file of --slot-save-path (whole: no temporary file left), restored in a server
    started afresh, where the same prompt then reads nothing again."""
    long_chat = chat(messages=[{"role": "user", "content": "a long system prompt " * 8}])
    with saving_app(tmp_path) as first:
        read = first.post("/v1/chat/completions", json=long_chat).json()["usage"]
        saved = first.post("/slots/0?action=save", json={"filename": "agent.bin"}).json()
    assert saved["id_slot"] == 0 and saved["filename"] == "agent.bin"
    assert saved["n_saved"] >= read["prompt_tokens"] and saved["timings"]["save_ms"] >= 0
    assert [f.name for f in tmp_path.iterdir()] == ["agent.bin"]
    assert saved["n_written"] == (tmp_path / "agent.bin").stat().st_size
    with saving_app(tmp_path) as second:
        back = second.post("/slots/0?action=restore", json={"filename": "agent.bin"}).json()
        assert back["n_restored"] == saved["n_saved"] and back["n_read"] == saved["n_written"]
        again = second.post("/v1/chat/completions", json=long_chat).json()["usage"]
        assert again["prompt_tokens_details"]["cached_tokens"] == read["prompt_tokens"] - 1
        erased = second.post("/slots/0?action=erase").json()
        assert erased == {"id_slot": 0, "n_erased": saved["n_saved"]}  # the same answer again
        fresh = second.post("/v1/chat/completions", json=long_chat).json()["usage"]
        assert fresh["prompt_tokens_details"]["cached_tokens"] == 0


def test_slot_actions_refuse_what_they_cannot_do(tmp_path: Path):
    with saving_app(tmp_path) as c:
        assert_error(c.post("/slots/0?action=save", json={"filename": "../x"}), 400, "filename")
        assert_error(c.post("/slots/0?action=save", json={"filename": ""}), 400, "filename")
        assert_error(c.post("/slots/0?action=save", json={}), 400)
        assert_error(c.post("/slots/1?action=save", json={"filename": "x"}), 400)
        assert_error(c.post("/slots/0?action=copy", json={"filename": "x"}), 400, "action")
        missing = assert_error(c.post("/slots/0?action=restore", json={"filename": "nope"}), 400)
        assert "no saved slot 'nope'" in missing["message"]
        (tmp_path / "junk.bin").write_bytes(b"not a slot")
        junk = assert_error(c.post("/slots/0?action=restore", json={"filename": "junk.bin"}), 400)
        assert "is not a slot localspec saved" in junk["message"]
        c.post("/v1/chat/completions", json=chat())
        c.post("/slots/0?action=save", json={"filename": "whole.bin"})
        (tmp_path / "cut.bin").write_bytes((tmp_path / "whole.bin").read_bytes()[:-1])
        cut = assert_error(c.post("/slots/0?action=restore", json={"filename": "cut.bin"}), 400)
        assert "cut short" in cut["message"]
        (tmp_path / "odd.bin").write_bytes(slot_files.MAGIC + b'{"tokens": [], "parts": []}\n')
        odd = assert_error(c.post("/slots/0?action=restore", json={"filename": "odd.bin"}), 400)
        assert "is not a slot localspec saved" in odd["message"]  # not a 500
    with TestClient(
        create_app(Session(auto_engine(ToyModel(scripted(REPLY)), None)), ServerOptions("toy"))
    ) as off:
        assert "--slot-save-path" in assert_error(off.post("/slots/0?action=erase"), 501)["message"]


def test_a_slot_that_does_not_fit_back_is_left_empty(tmp_path: Path, monkeypatch):
    """Where llama.cpp finds no room for a part (a shared cache's scattered cells), no
    part stays half restored: the slot is emptied, and the 400 says so."""
    with saving_app(tmp_path) as c:
        c.post("/v1/chat/completions", json=chat())
        c.post("/slots/0?action=save", json={"filename": "s.bin"})
        monkeypatch.setattr(ToyModel, "load_state", lambda self, tokens, state: False)
        refused = assert_error(c.post("/slots/0?action=restore", json={"filename": "s.bin"}), 400)
        assert "no room for 's.bin'" in refused["message"] and "empty now" in refused["message"]
        assert c.get("/slots").json()[0]["n_cached"] == 0


def test_a_slot_saved_for_other_models_is_refused(tmp_path: Path):
    with saving_app(tmp_path) as c:
        c.post("/v1/chat/completions", json=chat())
        c.post("/slots/0?action=save", json={"filename": "s.bin"})
    other = Session(auto_engine(ToyModel(scripted(REPLY), name="other", n_ctx=512), None))
    with TestClient(create_app(other, ServerOptions("toy", slot_save_path=tmp_path))) as c:
        refused = assert_error(c.post("/slots/0?action=restore", json={"filename": "s.bin"}), 400)
        assert "holds the caches of toy, not of other" in refused["message"]


def test_no_slots_turns_the_endpoint_off():
    session = Session(auto_engine(ToyModel(scripted(REPLY), n_vocab=258, n_ctx=512), None))
    app = create_app(session, ServerOptions("toy", slots_endpoint=False))
    with TestClient(app) as c:
        assert "off (--no-slots)" in assert_error(c.get("/slots"), 501)["message"]


def test_metrics_parse_and_count(client: TestClient):
    client.post("/v1/chat/completions", json=chat(temperature=0), headers=AUTH)
    client.post("/v1/chat/completions", json=chat(n=17), headers=AUTH)
    for i in range(3):  # a scanner's paths: one series, not one each
        client.post(f"/wp-admin/{i}.php", headers=AUTH)
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
    endpoints = {s.labels["endpoint"] for s in families["localspec_requests"].samples}
    assert endpoints == {"/v1/chat/completions", "unknown"}
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


# Qwen2.5-Coder 1.5B's answer to Claude Code's "create hello.py" (its Write tool offered)
FENCED = (
    '```json\n{\n  "name": "Write",\n  "arguments": {\n    "file_path": "/w/hello.py",\n'
    '    "content": "print(\'hello\')"\n  }\n}\n```'
)


# and its answer to Codex's "call exec_command" (sampled at temperature 1, two runs of six)
TAGGED = (
    '<tools>\n{"name": "exec_command", "arguments": {"cmd": "echo hi > hello.txt", '
    '"shell": "bash"}}\n</tools>'
)


def rewritten(rewrite, text: str, size: int) -> tuple[str, list]:
    """`text`, fed `size` characters at a time through `rewrite` (calls.rewriter's), as
    the whole answer's content and calls."""
    stream, content, calls = ToolCallStream(), "", []
    for piece in [text[i : i + size] for i in range(0, len(text), size)] + [None]:
        shown, done = stream.push(rewrite.push(piece) if piece is not None else rewrite.flush())
        content, calls = content + shown, calls + done
    rest, more = stream.flush()
    return content + rest, calls + more


def rewritten_deltas(rewrite, text: str, size: int) -> list[dict]:
    """The same, streamed: OpenAI's chunk deltas."""
    from localspec.server.chat import ToolCallDeltas

    stream, out = ToolCallDeltas(), []
    for i in range(0, len(text), size):
        out += stream.push(rewrite.push(text[i : i + size]))
    return out + stream.push(rewrite.flush()) + stream.flush()


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_a_small_models_call_in_a_json_block_or_other_tags_is_read_as_a_call(size: int):
    from localspec.server.calls import WrappedCall

    def run(text: str, tools: tuple[str, ...] = ("Write", "Read")) -> tuple[str, list]:
        return rewritten(WrappedCall(tools), text, size)

    content, calls = run(FENCED)
    assert content == "" and [c.name for c in calls] == ["Write"]
    assert json.loads(calls[0].arguments) == {
        "file_path": "/w/hello.py",
        "content": "print('hello')",
    }
    # sampled, it said what it would do first (and may go on after the block)
    content, calls = run(f"To create it:\n\n{FENCED}\nDone.")
    assert content == "To create it:\n\n\nDone." and [c.name for c in calls] == ["Write"]
    # a block naming no tool of the request, other blocks and plain text stay text
    code = "Run:\n```python\nprint('```')\n```\nor ```json\n{}\n```, or `x`"
    for text in (FENCED.replace('"Write"', '"Delete"'), "Hello", code, "``", '```json\n{"na'):
        assert run(text) == (text, [])
    assert run(FENCED, ()) == (FENCED, [])  # no tools: no calls

    # the tags llama.cpp's Hermes parser also reads a call in
    content, calls = run(f"Sure.\n{TAGGED}", ("exec_command",))
    assert content == "Sure.\n" and [c.name for c in calls] == ["exec_command"]
    assert json.loads(calls[0].arguments)["cmd"] == "echo hi > hello.txt"
    unoffered = TAGGED.replace("<tools>", "<json>").replace("</tools>", "</json>")
    assert run(unoffered) == (unoffered, [])  # exec_command not offered here
    for text in ("<response>Hello</response>", "a <tool> tag", "<tools>[1]</tools>", "<to"):
        assert run(text) == (text, [])


# Qwen2.5-Coder 1.5B's call as its template shows the format, in doubled braces, no tags
DOUBLED = '{{"name": "get_weather", "arguments": {"city": "Paris", "note": "a } and {{ \\" x"}}}'


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_a_call_in_qwen_2_5s_doubled_braces_is_read_as_the_call_inside(size: int):
    from localspec.server.calls import rewriter
    from localspec.server.chat import HERMES

    def run(text: str) -> tuple[str, list]:
        return rewritten(rewriter(HERMES, ("get_weather", "now")), text, size)

    content, calls = run(DOUBLED)
    assert content == "" and [c.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].arguments) == {"city": "Paris", "note": 'a } and {{ " x'}
    content, calls = run('\n{{"name": "now"}}\nDone.')  # no arguments; words after it
    assert content == "\nDone." and [(c.name, c.arguments) for c in calls] == [("now", "{}")]
    for text in (
        DOUBLED.replace("get_weather", "delete_all"),  # not offered
        "{{ name }} is Jinja's",
        "{{",
        '{"name": "now"}',  # single braces, no tags: this format's text
        "Write {{name}} here",
    ):
        assert run(text) == (text, [])

    echo = rewriter(HERMES, ("get_weather",), after_result=True)  # the call made, again
    assert echo is not None and echo.push(DOUBLED) + echo.flush() == DOUBLED

    out = rewritten_deltas(rewriter(HERMES, ("get_weather",)), DOUBLED, size)
    assert not any(d.get("content") for d in out)  # streamed as a call, name first
    first, *pieces = [c for d in out for c in d["tool_calls"]]
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    arguments = "".join(p["function"]["arguments"] for p in pieces)
    assert json.loads(arguments) == {"city": "Paris", "note": 'a } and {{ " x'}


# Qwen2.5-Coder 1.5B asked "Check the weather in Oslo and in Rome." (greedy): one block
TWO_IN_ONE = (
    '<tool_call>{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Oslo"\n  }\n}\n'
    '{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Rome"\n  }\n}\n</tool_call>'
)


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_several_calls_in_one_block_are_each_a_call(size: int):
    from localspec.server.calls import rewriter
    from localspec.server.chat import HERMES

    def whole(text: str) -> tuple[str, list]:
        return rewritten(rewriter(HERMES, ("get_weather",)), text, size)

    def cities(calls: list) -> list[str]:
        return [json.loads(c.arguments)["city"] for c in calls]

    content, calls = whole(f"Checking.{TWO_IN_ONE}")
    assert content == "Checking." and cities(calls) == ["Oslo", "Rome"]
    commas = TWO_IN_ONE.replace("}\n{", "},\n{")  # as a list's items, without the brackets
    assert cities(whole(commas)[1]) == ["Oslo", "Rome"]
    trailing = commas.replace("}\n</tool_call>", "},\n</tool_call>")  # and after the last
    assert cities(whole(trailing)[1]) == ["Oslo", "Rome"]
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert cities(whole(one)[1]) == ["Oslo"]
    for text in ("<tool_call>not json</tool_call> and {}", "a } b { c", "<tool_c"):
        assert whole(text) == (text, [])
    null = '<tool_call>{"name": "get_weather", "arguments": null}</tool_call>'
    assert [c.arguments for c in whole(null)[1]] == ["{}"]  # an object, as clients parse it

    out = rewritten_deltas(rewriter(HERMES, ("get_weather",)), TWO_IN_ONE, size)
    pieces = [c for d in out for c in d.get("tool_calls", [])]
    assert not "".join(d.get("content", "") for d in out).strip()
    assert [p["index"] for p in pieces if "id" in p] == [0, 1]
    for index, city in enumerate(("Oslo", "Rome")):
        text = "".join(p["function"]["arguments"] for p in pieces if p["index"] == index)
        assert json.loads(text) == {"city": city}


# --- browser safety -------------------------------------------------------------------
@pytest.fixture
def guarded() -> Iterator[TestClient]:
    """Served on loopback as `serve` does it, one web origin allowed."""
    session = Session(auto_engine(ToyModel(scripted(REPLY), n_vocab=258, n_ctx=512), None))
    guard = Guard.for_address("127.0.0.1", True, ["mybox.lan"], ["http://localhost:3000"])
    app = create_app(session, ServerOptions("toy", guard=guard))
    with TestClient(app, base_url="http://127.0.0.1:8080") as c:
        yield c


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8080", "localhost:8080", "[::1]:8080", "localhost", "mybox.lan:8080"]
)
def test_loopback_and_allowed_host_names_are_answered(guarded: TestClient, host: str):
    r = guarded.post("/v1/chat/completions", json=chat(temperature=0), headers={"Host": host})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("host", ["evil.example:8080", "attacker.com", "127.0.0.1.nip.io:8080"])
def test_a_foreign_host_is_refused_dns_rebinding(guarded: TestClient, host: str):
    r = guarded.post("/v1/chat/completions", json=chat(), headers={"Host": host})
    error = assert_error(r, 403)
    assert error["type"] == "permission_error" and "--allowed-host" in error["message"]


def test_a_foreign_origin_is_refused(guarded: TestClient):
    for origin in ("https://evil.example", "null", "http://localhost:3001"):
        r = guarded.post("/v1/chat/completions", json=chat(), headers={"Origin": origin})
        assert "--cors-origin" in assert_error(r, 403)["message"]
        preflight = guarded.options(
            "/v1/chat/completions",
            headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 403
    assert guarded.get("/health", headers={"Origin": "https://evil.example"}).status_code == 403


def test_an_allowed_origin_gets_cors_headers_and_its_preflight(guarded: TestClient):
    origin = "http://localhost:3000"
    preflight = guarded.options(
        "/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == origin
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
    r = guarded.post("/v1/chat/completions", json=chat(temperature=0), headers={"Origin": origin})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    request = chat(temperature=0, stream=True)
    with guarded.stream(
        "POST", "/v1/chat/completions", json=request, headers={"Origin": origin}
    ) as streamed:
        lines = [line for line in streamed.iter_lines() if line]
        assert streamed.headers["access-control-allow-origin"] == origin
    assert lines[-1] == "data: [DONE]"


def test_beyond_loopback_any_host_is_answered():
    guard = Guard.for_address("0.0.0.0", False)
    assert guard.host_ok("my-server.example:8080") and guard.host_ok(None)


def test_the_log_line_compares_with_plain_decoding_only_where_drafts_ran():
    """An answer that drafted nothing was plain decoding: a ratio of its rate to the
    bare T(1) would show only the sampling and streaming plain decoding pays too."""
    worker = Worker(Session(auto_engine(ToyModel(scripted(REPLY)), None)))
    drafter = worker.slots[0].engine.drafter
    assert isinstance(drafter, AdaptiveDrafter)
    drafter.verify.observe(1, 0.04)
    plain = Stats(tokens=20, tokens_per_s=22.0, rounds=19)
    assert answer_line(plain, "eog", 0.0, worker.plain_round_s()).endswith("drafted by none")
    drafted = replace(plain, tokens_per_s=40.0, drafted=12, accepted=9, drafters=("ngram",))
    line = answer_line(drafted, "eog", 0.0, worker.plain_round_s())
    assert line.endswith(", ≈1.60x plain decoding")


# --- the queue ------------------------------------------------------------------------
def toy_job(loop: asyncio.AbstractEventLoop) -> Job:
    return Job("chat", [1, 2, 3], GenerationConfig(max_tokens=4), loop)


def test_the_queue_counts_only_clients_still_there_and_0_means_no_waiting():
    """The slot threads are not started: the first job holds the one slot."""
    session = Session(auto_engine(ToyModel(scripted(REPLY), n_vocab=258, n_ctx=512), None))
    loop = asyncio.new_event_loop()
    try:
        no_wait = Worker(session, max_queue=0)
        no_wait.submit(toy_job(loop))  # an idle slot: served, though nothing may wait
        with pytest.raises(ApiError) as refused:
            no_wait.submit(toy_job(loop))
        assert refused.value.status == 429

        worker = Worker(session, max_queue=2)
        worker.submit(toy_job(loop))
        gone = [toy_job(loop) for _ in range(30)]
        for job in gone:  # an editor's completions, each abandoned as the user types on
            worker.submit(job)
            worker.withdraw(job)
        assert worker.depth() == 1
        live = [toy_job(loop), toy_job(loop)]
        for job in live:
            worker.submit(job)
        assert worker.depth() == 3
        with pytest.raises(ApiError):
            worker.submit(toy_job(loop))
        assert all(job.inbox.qsize() == 0 for job in live)
    finally:
        loop.close()


async def test_an_idle_slots_draft_model_reads_ahead_what_its_cache_holds():
    """A completion does not pay its draft model's catch-up of a new prompt (its middle
    is a few rounds long); once it is answered and nothing else runs, the draft model
    reads the slot's text, so the next keystroke's request finds it caught up."""
    from localspec.backends.base import common_prefix

    target = ToyModel(scripted(REPLY), pass_s=0.02, token_s=0.0002)
    draft = ToyModel(scripted(REPLY), pass_s=0.001, token_s=0.0001)
    worker = Worker(Session(auto_engine(target, draft)))
    worker.start()
    try:
        prompt = list(b"x = compute(1)\n" * 20 + ASSISTANT)  # within the draft's window
        loop = asyncio.get_running_loop()
        job = Job("infill", prompt, GenerationConfig(max_tokens=8), loop, source=list(b"y"))
        worker.submit(job)
        events = [e async for e in job.events()]
        assert events and not any(isinstance(e, Failed) for e in events)
        for _ in range(200):
            if common_prefix(draft.cached, target.cached) >= len(prompt):
                break
            await asyncio.sleep(0.02)
        assert common_prefix(draft.cached, target.cached) >= len(prompt)
    finally:
        worker.stop()


def test_fill_in_the_middle_with_a_model_without_fim_tokens_is_a_400(client: TestClient):
    body = {"input_prefix": "def f(x):\n", "input_suffix": "\n", "n_predict": 8}
    error = assert_error(client.post("/infill", json=body, headers=AUTH), 400)
    assert "no fill-in-the-middle tokens" in error["message"] and "\n" not in error["message"]
    suffixed = {"prompt": "def f(x):\n", "suffix": "\n", "max_tokens": 8}
    assert_error(client.post("/v1/completions", json=suffixed, headers=AUTH), 400)


def replay_deltas(text: str, step: int = 3) -> tuple[str, list[dict]]:
    from localspec.server.chat import ToolCallDeltas

    stream, deltas = ToolCallDeltas(), []
    for i in range(0, len(text), step):
        deltas += stream.push(text[i : i + step])
    deltas += stream.flush()
    content = "".join(d.get("content", "") for d in deltas)
    return content, [c for d in deltas for c in d.get("tool_calls", [])]


def test_a_streamed_call_sends_its_name_first_then_its_arguments_as_written():
    args = {"path": "a.py", "content": 'print("}{")\n' * 5, "n": [1, {"x": 2}]}
    text = 'Writing it.<tool_call>\n{"name": "write_file", "arguments": '
    text += json.dumps(args) + "}\n</tool_call>"
    content, calls = replay_deltas(text)
    assert content == "Writing it."
    first, *pieces = calls
    assert first["function"] == {"name": "write_file", "arguments": ""} and first["id"]
    assert len(pieces) > 10  # the arguments came in pieces, as they were written
    assert all(p["index"] == 0 and "name" not in p["function"] for p in pieces)
    assert json.loads("".join(p["function"]["arguments"] for p in pieces)) == args


def test_streamed_calls_are_indexed_and_other_shapes_go_out_whole_or_as_text():
    text = (
        '<tool_call>{"name": "a", "arguments": {"q": "\\"x\\""}}</tool_call>'
        '<tool_call>{"arguments": {"y": 1}, "name": "b"}</tool_call>'
        "<tool_call>not json</tool_call> done"
    )
    content, calls = replay_deltas(text, step=5)
    assert content == "<tool_call>not json</tool_call> done"
    starts = [c for c in calls if "id" in c]
    assert [(c["index"], c["function"]["name"]) for c in starts] == [(0, "a"), (1, "b")]
    a_args = "".join(c["function"]["arguments"] for c in calls if c["index"] == 0)
    assert json.loads(a_args) == {"q": '"x"'}
    assert json.loads(starts[1]["function"]["arguments"]) == {"y": 1}  # whole, at its close


def test_a_call_cut_before_its_arguments_is_the_text_written_streamed_or_not():
    """max_tokens ended a forced call (`tool_choice` "required") before its arguments
    began: both paths show what the model wrote, and no close tag it did not write."""
    text = '<tool_call>\n{"name": "read_file", "arguments":'
    assert replay_deltas(text) == (text, [])
    stream = ToolCallStream()
    shown, calls = stream.push(text)
    rest, more = stream.flush()
    assert (shown + rest, calls + more) == (text, [])


# --- thinking models --------------------------------------------------------------------
THOUGHT = "<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!"


class Thinker(ToyModel):
    """A toy model whose template knows `<think>` (as Qwen3's does)."""

    def chat_template(self) -> str | None:
        return TOY_TEMPLATE + "{# <think> #}"


@pytest.fixture
def thinker() -> Iterator[TestClient]:
    session = Session(auto_engine(Thinker(scripted(THOUGHT), n_vocab=258, n_ctx=512), None))
    with TestClient(create_app(session, ServerOptions("toy"))) as c:
        yield c


def test_a_thinking_models_block_goes_to_reasoning_content(thinker: TestClient):
    body = thinker.post("/v1/chat/completions", json=chat(temperature=0)).json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "\nThe user greets me.\nI greet back.\n"
    assert message["content"] == "Hello!"
    reasoning = body["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert reasoning == len("<think>\nThe user greets me.\nI greet back.\n</think>")
    r = thinker.post("/v1/chat/completions", json=chat(temperature=0, stream=True))
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == "Hello!"


def test_the_split_holds_marks_back_and_knows_a_block_the_prompt_opened():
    from localspec.thinking import ThinkSplit

    for inside, text in ((False, THOUGHT), (True, THOUGHT[len("<think>") :])):
        split, reasoning, content = ThinkSplit.opened(inside), "", ""
        for i in range(0, len(text), 2):
            r, c = split.push(text[i : i + 2])
            reasoning, content = reasoning + r, content + c
            assert "<" not in r + c  # no part of a mark ever shows
        r, c = split.flush()
        assert (reasoning + r, content + c) == ("\nThe user greets me.\nI greet back.\n", "Hello!")
    split = ThinkSplit.opened(False)  # a model that does not think this time
    assert split.push("Hi") == ("", "Hi") and split.push(" there") == ("", " there")


# --- Llama 3.x's tool calls: the whole answer is the call --------------------------------
LLAMA_TEMPLATE = (
    Path(__file__).parent.parent / "data/templates/meta-llama-Llama-3.1-8B-Instruct.jinja"
).read_text()  # as Meta ships it (copied from llama.cpp's models/templates)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


class Llama(ToyModel):
    def chat_template(self) -> str | None:
        return LLAMA_TEMPLATE


@pytest.fixture
def llama() -> Iterator[TestClient]:
    turn = b"assistant<|end_header_id|>\n\n"  # the reply follows Llama's assistant header
    model = Llama(scripted(LLAMA_CALL, marker=turn), n_vocab=258, n_ctx=2048)
    session = Session(auto_engine(model, None))
    with TestClient(create_app(session, ServerOptions("toy"))) as c:
        yield c


def test_a_llama_3_tool_call_is_read_from_its_own_format(llama: TestClient):
    from localspec.server.chat import LLAMA3, tool_format

    assert tool_format(LLAMA_TEMPLATE) == LLAMA3 and tool_format(TOY_TEMPLATE) != LLAMA3
    ask = chat(temperature=0, tools=[WEATHER])
    body = llama.post("/v1/chat/completions", json=ask).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}

    r = llama.post("/v1/chat/completions", json={**ask, "stream": True})
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    pieces = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert pieces[0]["function"]["name"] == "get_weather" and pieces[0]["id"]
    assert len(pieces) > 2  # the arguments in pieces, as written
    assert json.loads("".join(p["function"]["arguments"] for p in pieces)) == {"city": "Paris"}
    assert not "".join(d.get("content") or "" for d in deltas)  # none of it shown as text


def test_the_deprecated_functions_api_is_answered_in_its_own_shape(llama: TestClient):
    """`functions` and `function_call` (older LangChain, scripts of 2023): the call comes
    back as `message.function_call`, whole and streamed, and a past call with its
    `function` result reaches the template as a tool call and its result."""
    ask = chat(temperature=0, functions=[WEATHER["function"]], function_call="auto")
    choice = llama.post("/v1/chat/completions", json=ask).json()["choices"][0]
    assert choice["finish_reason"] == "function_call" and "tool_calls" not in choice["message"]
    call = choice["message"]["function_call"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}

    r = llama.post("/v1/chat/completions", json={**ask, "stream": True})
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert not any("tool_calls" in d for d in deltas)
    pieces = [d["function_call"] for d in deltas if d.get("function_call")]
    assert pieces[0] == {"name": "get_weather", "arguments": ""} and len(pieces) > 2
    assert json.loads("".join(p["arguments"] for p in pieces)) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "function_call"

    from localspec.server.schemas import ChatRequest, NamedToolChoice

    named = ChatRequest.model_validate({**ask, "function_call": {"name": "get_weather"}})
    assert named.tool_choice == NamedToolChoice.of("get_weather")  # forced, as tool_choice is
    assert named.parallel_tool_calls is False  # its answer has room for one call

    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "function_call": call},
        {"role": "function", "name": "get_weather", "content": "sunny, 21 C"},
    ]
    prompt = llama.post("/apply-template", json={**ask, "messages": history}).json()["prompt"]
    assert '"city": "Paris"' in prompt
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"sunny, 21 C"' in prompt

    both = llama.post("/v1/chat/completions", json={**ask, "tools": [WEATHER]})
    assert "not both" in assert_error(both, 400)["message"]


def test_every_openai_reasoning_effort_reaches_the_template_as_it_takes_them():
    from localspec.server.schemas import ChatRequest

    efforts = ("none", "minimal", "low", "medium", "high", "xhigh")
    given = [ChatRequest.model_validate(chat(reasoning_effort=e)) for e in efforts]
    taken = [r.template_variables()["reasoning_effort"] for r in given]
    assert taken == ["low", "low", "low", "medium", "high", "high"]  # gpt-oss's three


def test_a_llama_3_answer_in_text_stays_text():
    from localspec.server.calls import BareCall

    for text in ("Paris is sunny.", '{"answer": 42}', "  {}"):
        bare = BareCall()
        out = "".join(bare.push(text[i : i + 3]) for i in range(0, len(text), 3)) + bare.flush()
        assert out == text
    bare = BareCall()  # a character at a time: held until `{"name"` is whole
    out = "".join(bare.push(c) for c in " " + LLAMA_CALL) + bare.flush()
    assert out == "<tool_call> " + LLAMA_CALL + "</tool_call>"


SEARCH = {
    "type": "function",
    "function": {
        "name": "brave_search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}
PYTHON = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
    },
}
CODE = 'import math\nprint("r =", math.sqrt(2))\n'


@pytest.mark.parametrize("size", [1, 4, 1000])
@pytest.mark.parametrize(
    ("answer", "call"),
    [
        (
            '<|python_tag|>brave_search.call(query="Paris, \\"old\\" town")',
            {"name": "brave_search", "arguments": {"query": 'Paris, "old" town'}},
        ),
        ("<|python_tag|>" + CODE, {"name": "code_interpreter", "arguments": {"code": CODE}}),
        ("<|python_tag|>" + LLAMA_CALL, json.loads(LLAMA_CALL)),
    ],
    ids=["builtin", "code", "json-after-tag"],
)
def test_llama_3_builtin_tools_calls_become_json_in_tags(answer: str, call: dict, size: int):
    """Meta's built-in tools: `<|python_tag|>NAME.call(...)`, or code after the tag for
    its code tool; read as the JSON calls are, whatever the pieces' sizes."""
    from localspec.server.calls import BareCall
    from localspec.server.chat import ToolCallStream

    bare = BareCall.for_tools(["get_weather", "brave_search", "code_interpreter"])
    pieces = [answer[i : i + size] for i in range(0, len(answer), size)]
    out = "".join(bare.push(p) for p in pieces) + bare.flush()
    stream = ToolCallStream()
    content, found = stream.push(out)
    rest, more = stream.flush()
    [read] = found + more
    assert not (content + rest).strip() and read.name == call["name"]
    assert json.loads(read.arguments) == call.get("arguments", call.get("parameters"))


def test_llama_3_text_after_the_tag_that_is_no_call_stays_text():
    from localspec.server.calls import BareCall

    # no code tool among the request's: the code is text; a call of a tool it lacks too
    for answer in ("<|python_tag|>print(1)", '<|python_tag|>wolfram_alpha.call(q="x")'):
        bare = BareCall.for_tools(["brave_search"])
        out = "".join(bare.push(c) for c in answer) + bare.flush()
        assert out == answer.removeprefix("<|python_tag|>")
    bare = BareCall.for_tools(["brave_search"])  # not literal arguments: nothing lost
    assert bare.push('<|python_tag|>brave_search.call(query=x + "y")') == ""
    assert bare.flush() == 'brave_search.call(query=x + "y")'


def test_llama_3_builtin_tools_reach_its_template_and_round_trip():
    """A request with Meta's built-in tools: the template gets `builtin_tools` (its
    system prompt lists them), the call comes back as OpenAI's, whole and streamed, and
    goes back into the prompt as the template writes it."""
    turn = b"assistant<|end_header_id|>\n\n"
    reply = '<|python_tag|>brave_search.call(query="weather in Paris")'

    def answer(prompt: bytes) -> str:  # only a template that lists the tool gets the call
        return reply if b"Tools: brave_search\n" in prompt else "not told"

    model = Llama(scripted(answer, marker=turn), n_vocab=258, n_ctx=4096)
    with TestClient(create_app(Session(auto_engine(model, None)), ServerOptions("toy"))) as c:
        ask = chat(temperature=0, tools=[WEATHER, SEARCH], max_tokens=200)
        choice = c.post("/v1/chat/completions", json=ask).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"]
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "brave_search"
        assert json.loads(call["function"]["arguments"]) == {"query": "weather in Paris"}

        r = c.post("/v1/chat/completions", json={**ask, "stream": True})
        chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
        deltas = [ch["choices"][0]["delta"] for ch in chunks if ch["choices"]]
        pieces = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
        assert pieces[0]["function"]["name"] == "brave_search" and pieces[0]["id"]
        arguments = "".join(p["function"].get("arguments") or "" for p in pieces)
        assert json.loads(arguments) == {"query": "weather in Paris"}
        assert not "".join(d.get("content") or "" for d in deltas)

    from localspec.server.chat import template_messages
    from localspec.server.schemas import ChatRequest

    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
    ]
    messages = template_messages(ChatRequest.model_validate(chat(messages=history)).messages)
    session = Session(auto_engine(model, None))
    tools = [WEATHER, SEARCH]
    text = session.prompt_text(messages, tools, {"builtin_tools": ["brave_search"]})
    assert '<|python_tag|>brave_search.call(query="weather in Paris")<|eom_id|>' in text


def test_llama_servers_seed_minus_one_is_a_random_one():
    """What clients made for llama-server send (its default), not a 400."""
    from localspec.server.infill import InfillRequest
    from localspec.server.schemas import ChatRequest

    assert ChatRequest.model_validate(chat(seed=-1)).sampling().seed is None
    assert ChatRequest.model_validate(chat(seed=7)).sampling().seed == 7
    infill = {"input_prefix": "a", "input_suffix": "b", "seed": -1}
    assert InfillRequest.model_validate(infill).sampling().seed is None


def test_a_past_calls_arguments_may_be_an_object():
    """OpenAI sends them as JSON text; Ollama's clients as the object: both read alike."""
    from localspec.server.schemas import ChatRequest

    def past(arguments) -> str:
        call = {"id": "c1", "function": {"name": "get_weather", "arguments": arguments}}
        history = [{"role": "assistant", "content": None, "tool_calls": [call]}]
        [message] = ChatRequest.model_validate(chat(messages=history)).messages
        return message.tool_calls[0].function.arguments  # type: ignore[index]

    assert json.loads(past({"city": "Paris"})) == json.loads(past('{"city": "Paris"}'))


def test_a_forced_call_is_a_grammar_in_the_models_own_format():
    """tool_choice "required" or a named function: no Qwen tags in a Llama answer."""
    from localspec.server.chat import HERMES, LLAMA3, call_schema, forced_tools, tool_grammar
    from localspec.server.schemas import ChatRequest

    request = ChatRequest.model_validate(chat(tools=[WEATHER], tool_choice="required"))
    forced = forced_tools(request)
    assert forced is not None and [t.function.name for t in forced] == ["get_weather"]
    assert list(call_schema(forced, LLAMA3)["properties"]) == ["name", "parameters"]
    assert list(call_schema(forced, HERMES)["properties"]) == ["name", "arguments"]
    llama_gbnf, hermes_gbnf = tool_grammar(forced, LLAMA3), tool_grammar(forced, HERMES)
    assert "<tool_call>" not in llama_gbnf and "\nroot ::= " in llama_gbnf
    assert hermes_gbnf.startswith('root ::= "<tool_call>\\n" tool-call "\\n</tool_call>"')
    auto = ChatRequest.model_validate(chat(tools=[WEATHER], tool_choice="auto"))
    assert forced_tools(auto) is None
    other = {"type": "function", "function": {"name": "nope"}}
    with pytest.raises(ApiError):
        forced_tools(ChatRequest.model_validate(chat(tools=[WEATHER], tool_choice=other)))


# --- Qwen3-Coder's and Qwen3.5's XML calls ------------------------------------------------
CODER_TEMPLATE = (Path(__file__).parent.parent / "data/templates/Qwen3-Coder.jinja").read_text()
FORECAST = {
    "type": "function",
    "function": {
        "name": "get_forecast",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "note": {"type": "string"},
            },
        },
    },
}
XML_CALL = (
    "Let me look.\n<tool_call>\n<function=get_forecast>\n<parameter=city>\nParis\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=note>\n42\nor so\n"
    "</parameter>\n</function>\n</tool_call>"
)


class Coder(ToyModel):
    def chat_template(self) -> str | None:
        return CODER_TEMPLATE


def test_an_xml_tool_call_is_read_and_typed_by_the_tools_schema():
    from localspec.server.chat import XML, tool_format

    assert tool_format(CODER_TEMPLATE) == XML
    model = Coder(scripted(XML_CALL, marker=b"<|im_start|>assistant\n"), n_vocab=258, n_ctx=4096)
    session = Session(auto_engine(model, None))
    with TestClient(create_app(session, ServerOptions("toy"))) as c:
        ask = chat(temperature=0, tools=[FORECAST])
        message = c.post("/v1/chat/completions", json=ask).json()["choices"][0]["message"]
        assert message["content"] == "Let me look."
        call = message["tool_calls"][0]["function"]
        assert call["name"] == "get_forecast"
        # days is an integer by its schema; note stays text though it starts as a number
        assert json.loads(call["arguments"]) == {"city": "Paris", "days": 3, "note": "42\nor so"}

        r = c.post("/v1/chat/completions", json={**ask, "stream": True})
        lines = r.text.splitlines()
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        deltas = [ch["choices"][0]["delta"] for ch in chunks if ch["choices"]]
        pieces = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
        assert pieces[0]["function"]["name"] == "get_forecast" and pieces[0]["id"]
        streamed = "".join(p["function"].get("arguments") or "" for p in pieces)
        assert json.loads(streamed) == json.loads(call["arguments"])
        assert "".join(d.get("content") or "" for d in deltas).strip() == "Let me look."
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
