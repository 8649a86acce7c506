"""`localspec serve` as an editor meets it: the real `openai` SDK against the real server
(a subprocess on a free loopback port) with the real default pair, loaded once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import numpy as np
import openai
import pytest
from decoding.test_real_engine import NEAR_TIE  # the near-tie rule
from helpers import free_port, wait_healthy
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.real

KEY = "sk-localspec-test"
MODEL = "qwen2.5-coder-1.5b-instruct"
ASK = [{"role": "user", "content": "Name three prime numbers, separated by commas."}]
STORY = "Write a very long story about a lighthouse."
FILE = """import argparse


def parse_args():
    parser = argparse.ArgumentParser(description="Serve files over HTTP.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--root", default=".")
    parser.add_argument("--verbose", action="store_true")
    return parser.parse_args()


def main():
    args = parse_args()
    print(f"serving {args.root} on {args.host}:{args.port}")


if __name__ == "__main__":
    main()
"""
EDIT = [
    {
        "role": "system",
        "content": "You edit code. Reply with the complete updated file in one code block.",
    },
    {
        "role": "user",
        "content": f"Change the default port to 9090:\n\n```python\n{FILE}```",
    },
]


RUN_GREEDY = ["--json", "-n", "16", "--temperature", "0", ASK[0]["content"]]


def model_args(real_paths: tuple[Path, Path]) -> list[str]:
    target, draft = real_paths
    return ["--target", str(target), "--draft", str(draft), "--threads", "2", "--ctx", "2048"]


@pytest.fixture(scope="module")
def server(real_paths: tuple[Path, Path], tmp_path_factory) -> Iterator[tuple[str, Path, int]]:
    """(base URL, the server's log file, its process id)."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    args = [*model_args(real_paths), "--port", str(port), "--max-queue", "3", "--parallel", "2"]
    args += ["--slot-save-path", str(log.parent / "slots"), "--model-name"]
    env = {**os.environ, "LOCALSPEC_API_KEY": KEY}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localspec", "serve", *args, MODEL],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, 300, log.read_text)
        yield base, log, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def client(server: tuple[str, Path, int]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key=KEY, max_retries=0, timeout=300)


def ask(client: openai.OpenAI, messages=ASK, **extra):
    return client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, **{"max_tokens": 16, **extra}
    )


def streamed(client: openai.OpenAI, messages=ASK, **extra) -> tuple[str, list]:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            **{"max_tokens": 16, **extra},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_the_server_runs_on_uvloop_and_httptools(server: tuple[str, Path, int]):
    """uvicorn falls back to asyncio and h11 without a word; they cost 4% of the
    streamed tok/s on 2 cores (docs/serve.md)."""
    libraries = Path(f"/proc/{server[2]}/maps").read_text()
    assert "/uvloop/loop." in libraries and "/httptools/parser/parser." in libraries


def test_chat_streamed_and_not_agree_and_count_their_tokens(client: openai.OpenAI):
    answer = ask(client)
    text = answer.choices[0].message.content
    assert text and answer.choices[0].finish_reason in ("stop", "length")
    if answer.choices[0].finish_reason == "length":
        assert answer.usage.completion_tokens == 16
    assert 0 < answer.usage.completion_tokens <= 16
    figures = answer.model_extra["localspec"]
    assert figures["rounds"] >= 1 and figures["drafter"]

    again, chunks = streamed(client)
    assert again == text
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == answer.usage.completion_tokens
    assert usage.prompt_tokens == answer.usage.prompt_tokens
    # the same greedy request again: its slot's last answer answers it (Engine.recall)
    assert chunks[-1].model_extra["localspec"]["recalled"] == usage.completion_tokens
    # other settings (a seed, which greedy decoding does not use) are decoded again
    decoded, chunks = streamed(client, seed=7)
    assert decoded == text and chunks[-1].model_extra["localspec"]["rounds"] >= 1
    assert chunks[-1].model_extra["localspec"]["recalled"] == 0


def test_a_prefilled_answer_goes_on_where_the_model_would(client: openai.OpenAI):
    """An assistant message at the end is continued (llama-server's assistant prefill):
    begun with the first words of the model's own greedy answer, the rest is the rest of
    that answer (a cut before a space keeps the tokens the model wrote)."""
    whole = ask(client, max_tokens=24).choices[0].message.content
    cut = whole.index(" ", whole.index(",") + 1)  # after the first number and its comma
    begun = [*ASK, {"role": "assistant", "content": whole[:cut]}]
    rest = ask(client, begun, max_tokens=24).choices[0].message.content
    assert whole[:cut] + rest == whole, (whole, rest)


def test_greedy_text_equals_localspec_run(client: openai.OpenAI, real_paths):
    run = subprocess.run(
        [sys.executable, "-m", "localspec", "run", *model_args(real_paths), *RUN_GREEDY],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    expected = json.loads(run.stdout)
    answer = ask(client)
    assert answer.choices[0].message.content == expected["text"]
    assert answer.usage.completion_tokens == expected["tokens"]


def test_stop_strings(client: openai.OpenAI):
    full = ask(client).choices[0].message.content
    assert "," in full
    stopped = ask(client, stop=[","])
    assert stopped.choices[0].message.content == full.split(",")[0]
    assert stopped.choices[0].finish_reason == "stop"


def test_predicted_outputs_accept_most_of_an_edit_and_change_nothing(client: openai.OpenAI):
    ask(client, EDIT, max_tokens=8)  # the same cache state for both answers below
    prediction = {"type": "content", "content": FILE}
    predicted = ask(client, EDIT, max_tokens=200, prediction=prediction)
    plain = ask(client, EDIT, max_tokens=200)
    assert predicted.choices[0].message.content == plain.choices[0].message.content
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > predicted.usage.completion_tokens / 2
    assert details.accepted_prediction_tokens > 3 * details.rejected_prediction_tokens
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0


def test_a_disconnect_lets_the_next_request_start_at_once(client: openai.OpenAI, server):
    story = [{"role": "user", "content": "Write a very long story about a lighthouse."}]
    stream = client.chat.completions.create(
        model=MODEL, messages=story, temperature=0, max_tokens=1500, stream=True
    )
    for _, _chunk in zip(range(4), stream, strict=False):
        pass
    stream.close()
    left = time.monotonic()
    next_answer, chunks = streamed(client, max_tokens=2)
    first_chunk_s = time.monotonic() - left
    assert next_answer and chunks[-1].usage.completion_tokens == 2
    # the long answer would take a minute or more; a round and a short prefill, seconds
    assert first_chunk_s < 20, first_chunk_s
    assert "cancelled: the client left" in server[1].read_text()


def test_concurrent_clients_all_get_complete_answers(client: openai.OpenAI):
    questions = [
        [{"role": "user", "content": f"What is {a} plus {b}? Answer with the number."}]
        for a, b in ((2, 3), (10, 5), (7, 8))
    ]
    alone = [ask(client, q, max_tokens=8).choices[0].message.content for q in questions]
    together: list[str | None] = [None] * len(questions)

    def one(i: int) -> None:  # a seed: decoded again, not recalled (Engine.recall)
        together[i] = ask(client, questions[i], max_tokens=8, seed=1).choices[0].message.content

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert together == alone


def test_bad_requests_get_4xx_in_the_error_shape(client: openai.OpenAI, server):
    base = server[0]
    auth = {"Authorization": f"Bearer {KEY}"}
    good = {"model": MODEL, "messages": ASK, "max_tokens": 2}
    bad = [
        (b"{", 400),
        (json.dumps({**good, "messages": 3}).encode(), 400),
        (json.dumps({**good, "max_tokens": 0}).encode(), 400),
        (json.dumps({**good, "n": 17}).encode(), 400),
        (
            json.dumps(
                {**good, "messages": [{"role": "user", "content": "word " * 3000}]}
            ).encode(),
            400,
        ),
        (b"x" * (9 << 20), 413),
    ]
    for body, status in bad:
        r = httpx.post(f"{base}/v1/chat/completions", content=body, headers=auth, timeout=120)
        assert r.status_code == status, (body[:80], r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert ask(client, max_tokens=2).choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="n must be between 1 and 16"):
        ask(client, n=0)


def test_the_api_key_is_enforced(server):
    no_key = openai.OpenAI(base_url=f"{server[0]}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        ask(no_key)
    r = httpx.get(f"{server[0]}/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_models_and_metrics(client: openai.OpenAI, server):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL] and models[0].model_extra["draft"]
    text = httpx.get(f"{server[0]}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    tokens = families["localspec_completion_tokens"].samples[0].value
    assert tokens > 0 and "localspec_queue_depth" in families
    assert families["localspec_ttft_seconds"].samples


def test_a_tool_call_round_trips(client: openai.OpenAI):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    answer = ask(client, messages, tools=tools, tool_choice=named, max_tokens=30)
    call = answer.choices[0].message.tool_calls[0]
    assert answer.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    _, chunks = streamed(client, messages, tools=tools, tool_choice="required", max_tokens=30)
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices]
    calls = [d[0] for d in deltas if d]
    assert calls and calls[0].function.name == "get_weather" and calls[0].id
    # then the arguments, in pieces as they were written
    arguments = "".join(c.function.arguments or "" for c in calls)
    assert len(calls) > 2 and json.loads(arguments) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"

    # "required" where parallel calls are allowed (OpenAI's default): a call per city,
    # streamed by index; with them off, one
    both = [{"role": "user", "content": "What is the weather in Paris and in Tokyo?"}]
    _, chunks = streamed(client, both, tools=tools, tool_choice="required", max_tokens=60)
    pieces: dict[int, str] = {}
    for delta in (d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []):
        pieces[delta.index] = pieces.get(delta.index, "") + (delta.function.arguments or "")
    assert {i: json.loads(text) for i, text in pieces.items()} == {
        0: {"city": "Paris"},
        1: {"city": "Tokyo"},
    }
    alone = ask(
        client, both, tools=tools, tool_choice="required", parallel_tool_calls=False, max_tokens=30
    )
    assert [json.loads(c.function.arguments) for c in alone.choices[0].message.tool_calls] == [
        {"city": "Paris"}
    ]

    # left to choose, the 1.5B writes its call as a ```json block, not in Qwen's tags
    chosen = ask(client, messages, tools=tools, max_tokens=40)
    assert chosen.choices[0].finish_reason == "tool_calls" and not chosen.choices[0].message.content
    [auto] = chosen.choices[0].message.tool_calls
    assert (auto.function.name, json.loads(auto.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )

    result = {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 °C"}
    follow = [*messages, answer.choices[0].message.model_dump(exclude_none=True), result]
    reply = ask(client, follow, tools=tools, max_tokens=20)
    assert reply.choices[0].message.content


def test_plain_completions(client: openai.OpenAI, server):
    answer = client.completions.create(
        model=MODEL, prompt="def add(a, b):\n", max_tokens=8, temperature=0, logprobs=3
    )
    assert answer.choices[0].text and answer.usage.completion_tokens <= 8
    # Continue's `llama.cpp` provider: llama-server's /completion, streamed, its fields
    continue_body = {
        "prompt": "def add(a, b):\n",
        "stream": True,
        "n_predict": 8,
        "stop": ["\n\n"],
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "temperature": 0,
        "n_probs": 3,
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    completion = f"{server[0]}/completion"  # httpx waits 5 s by default: a busy machine needs more
    with httpx.stream("POST", completion, json=continue_body, headers=headers, timeout=300) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == answer.choices[0].text.split("\n\n")[0]
    assert events[-1]["stop"] and events[-1]["tokens_predicted"] <= 8
    # n_probs: each token's log-probability and its 3 likeliest, as /v1/completions gives them
    probs = [p for e in events for p in e.get("completion_probabilities", [])]
    want = answer.choices[0].logprobs
    assert probs and [p["token"] for p in probs] == want.tokens[: len(probs)]  # type: ignore[union-attr]
    for p, logprob in zip(probs, want.token_logprobs, strict=False):  # type: ignore[union-attr]
        assert abs(p["logprob"] - logprob) < 0.05 and len(p["top_logprobs"]) == 3
    whole = continue_body | {"stream": False}  # the stop string's tokens left out, as streamed
    whole_probs = httpx.post(completion, json=whole, headers=headers, timeout=300).json()
    assert [p["token"] for p in whole_probs["completion_probabilities"]] == [
        p["token"] for p in probs
    ]
    refused = continue_body | {"stream": False, "post_sampling_probs": True}
    refused_reply = httpx.post(completion, json=refused, headers=headers)
    assert refused_reply.status_code == 400
    assert refused_reply.json()["error"]["param"] == "post_sampling_probs"
    # token counting as llama-server's clients do it: the prompt's tokens, and back
    url, prompt = server[0], continue_body["prompt"]
    ids = httpx.post(f"{url}/tokenize", json={"content": prompt}, headers=headers).json()
    assert len(ids["tokens"]) == answer.usage.prompt_tokens == events[-1]["tokens_evaluated"]
    back = httpx.post(f"{url}/detokenize", json=ids, headers=headers).json()
    assert back["content"] == prompt
    # llama-server's json_schema on /completion: the answer follows it
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    ask = {"prompt": "A JSON object with a number: ", "json_schema": schema, "n_predict": 24}
    shaped = httpx.post(completion, json=ask | {"temperature": 0}, headers=headers, timeout=300)
    assert isinstance(json.loads(shaped.json()["content"])["a"], int)
    bad = httpx.post(completion, json=ask | {"json_schema": {"type": "x"}}, headers=headers)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "json_schema"
    # llama-server's lazy grammar: the answer free until a trigger, then held from it on
    lazy = {
        "prompt": "def answer():\n    x = 6 * 7\n",
        "n_predict": 40,
        "temperature": 0,
        "grammar": 'root ::= "return 42\\n"',
        "grammar_lazy": True,
        "grammar_triggers": [{"type": 2, "value": "\\n\\s*(return)"}],
    }
    held = httpx.post(completion, json=lazy, headers=headers, timeout=300).json()
    assert held["content"].endswith("\n    return 42\n") and held["stop_type"] == "eos"
    for triggers in ([], [{"type": 2, "value": "(["}]):
        bad = httpx.post(completion, json=lazy | {"grammar_triggers": triggers}, headers=headers)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "grammar_triggers"
    # OpenAI's response_format on /v1/completions: followed too, not dropped
    shaped_v1 = client.completions.create(
        model=MODEL,
        prompt=ask["prompt"],
        max_tokens=24,
        temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}},
    )
    assert isinstance(json.loads(shaped_v1.choices[0].text)["a"], int)


def assert_alike(got: list, want: list) -> None:
    """Greedy answers' tokens (their logprobs entries) alike: the same, or parting where
    the answer alone scored `got`'s token within NEAR_TIE of its own (test_real_engine's
    rule: answers decoded beside others go through passes of other shapes, and where a
    repeating list flattens the law, more than two tokens can be that close)."""
    for g, w in zip(got, want, strict=False):
        if g.token != w.token:
            top = w.top_logprobs[0]
            near = {t.token for t in w.top_logprobs if top.logprob - t.logprob < NEAR_TIE}
            assert g.token in near, (g.token, w.top_logprobs)
            return
    assert len(got) == len(want)


def test_n_answers_and_a_batch_of_prompts(client: openai.OpenAI, server):
    """OpenAI's `n` and a batch of prompts, through the SDK: greedy, each choice is the
    answer alone (up to a near-tie); the second of n copies the prompt the first read
    (the log says so). A prompt no other test asks (a slot that holds it already has
    nothing to copy); the first may have ended by then (its answer is drafted from the
    one alone)."""
    rivers = [{"role": "user", "content": "List twenty rivers of Europe, one per line."}]
    shown = {"max_tokens": 48, "logprobs": True, "top_logprobs": 5}
    alone = ask(client, rivers, **shown).choices[0].logprobs.content
    both = ask(client, rivers, n=2, **shown)
    assert [c.index for c in both.choices] == [0, 1]
    for choice in both.choices:
        assert_alike(choice.logprobs.content, alone)
    assert both.usage.prompt_tokens == ask(client, rivers, max_tokens=1).usage.prompt_tokens
    assert both.usage.completion_tokens == sum(len(c.logprobs.content) for c in both.choices)
    assert "tokens of its prompt copied from chat" in server[1].read_text()
    streams: list[list] = [[], []]
    for chunk in client.chat.completions.create(
        model=MODEL, messages=rivers, temperature=0, n=2, stream=True, **shown
    ):
        for choice in chunk.choices:
            streams[choice.index] += choice.logprobs.content if choice.logprobs else []
    for stream in streams:
        assert_alike(stream, alone)
    prompts = ["def add(a, b):\n", "def sub(a, b):\n"]
    batch = client.completions.create(model=MODEL, prompt=prompts, max_tokens=8, temperature=0)
    each = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0)
        for p in prompts
    ]
    assert [c.text for c in batch.choices] == [e.choices[0].text for e in each]
    assert batch.usage.prompt_tokens == sum(e.usage.prompt_tokens for e in each)


def test_a_logit_bias_and_penalties_shape_the_answer(client: openai.OpenAI, server):
    """OpenAI's logit_bias bans a token (-100), its penalties are applied, as llama-server's."""
    ask = {"model": MODEL, "messages": ASK, "temperature": 0, "max_tokens": 3}
    tokenize, auth = f"{server[0]}/tokenize", {"Authorization": f"Bearer {KEY}"}

    def first_token(**shaping) -> int:
        text = client.chat.completions.create(**ask, **shaping).choices[0].message.content
        return httpx.post(tokenize, json={"content": text}, headers=auth).json()["tokens"][0]

    plain = first_token()
    banned = {str(plain): -100}
    assert first_token(logit_bias=banned, presence_penalty=1.0, frequency_penalty=0.5) != plain


def test_ignore_eos_runs_the_answer_to_its_limit(client: openai.OpenAI):
    """llama-server's `ignore_eos` (benchmarks send it for answers of equal length): the
    end-of-generation tokens are banned, so a two-word answer runs on to max_tokens."""
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Reply with the single word: yes"}],
        "temperature": 0,
        "max_tokens": 24,
    }
    short = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 8
    long = client.chat.completions.create(**ask, extra_body={"ignore_eos": True})  # type: ignore[call-overload]
    assert long.choices[0].finish_reason == "length" and long.usage.completion_tokens == 24
    assert (long.choices[0].message.content or "").startswith(short.choices[0].message.content)


def test_beyond_the_queue_a_429_with_retry_after(client: openai.OpenAI, server):
    story = [{"role": "user", "content": "Write a very long story about a lighthouse."}]
    busy = [
        client.chat.completions.create(
            model=MODEL, messages=story, temperature=0, max_tokens=1500, stream=True
        )
        for _ in range(2)
    ]
    for stream in busy:
        chunks = iter(stream)
        for _ in range(4):  # both slots decode now, a few rounds in
            next(chunks)
    slots = httpx.get(f"{server[0]}/slots", headers=AUTH).json()  # llama-server's figures
    assert [s["is_processing"] for s in slots] == [True, True]
    assert all(s["next_token"][0]["n_decoded"] >= 1 for s in slots)
    assert all(s["params"]["temperature"] == 0 and s["speculative"] for s in slots)
    assert httpx.get(f"{server[0]}/slots?fail_on_no_slot=1", headers=AUTH).status_code == 503
    waiting = [
        threading.Thread(target=ask, args=(client,), kwargs={"max_tokens": 1}) for _ in range(3)
    ]
    for t in waiting:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while httpx.get(f"{server[0]}/health").json()["queue_depth"] < 5:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        r = httpx.post(
            f"{server[0]}/v1/chat/completions",
            json={"model": MODEL, "messages": ASK, "max_tokens": 1},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
    finally:
        for stream in busy:
            stream.close()
        for t in waiting:
            t.join(timeout=300)


AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {"max_tokens": 1500, "ignore_eos": True}  # an answer that runs for minutes


def give_up(url: str, body: dict, after_s: float) -> None:
    """A client that waits `after_s` for an answer, then leaves while it is written."""
    try:
        answer = httpx.post(url, json=body, headers=AUTH, timeout=after_s)
    except httpx.TimeoutException:
        return
    pytest.fail(f"answered within {after_s} s: {answer.status_code} {answer.text[:400]}")


def wait_idle(base: str, within_s: float) -> float:
    """Seconds until nothing waits or decodes; fails past `within_s`."""
    started = time.monotonic()
    while httpx.get(f"{base}/health").json()["queue_depth"]:
        assert time.monotonic() - started < within_s, "the engine was not freed"
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_client_that_gives_up_on_a_whole_answer_frees_its_slot(client: openai.OpenAI, server):
    story = {"model": MODEL, "messages": [{"role": "user", "content": STORY}]}
    ask_long = {**story, "max_tokens": 1500, "temperature": 0}
    give_up(f"{server[0]}/v1/chat/completions", ask_long, 8)
    wait_idle(server[0], within_s=10)  # the answer would run on for minutes
    assert "cancelled: the client left" in server[1].read_text()
    # it asks again (for less): what was answered before it gave up comes back at once,
    # from its slot's last answer (Engine.recall)
    retry = client.chat.completions.create(
        model=MODEL, messages=story["messages"], temperature=0, max_tokens=8
    )
    assert retry.model_extra["localspec"]["recalled"] == 8
    assert retry.choices[0].finish_reason == "length" and retry.choices[0].message.content


def test_abandoned_requests_during_streams_never_fill_the_queue(client: openai.OpenAI, server):
    """An editor's completions, each given up as the user types on, while both slots
    stream: the queue (3 places) keeps none of them, and the next live one is served."""
    story = [{"role": "user", "content": "Write a very long story about a lighthouse."}]
    busy = [
        client.chat.completions.create(
            model=MODEL, messages=story, temperature=0, max_tokens=1500, stream=True
        )
        for _ in range(2)
    ]
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "prompt": "def add(a, b):\n", "max_tokens": 8}
    try:
        for stream in busy:
            next(iter(stream))
        for _ in range(30):
            with pytest.raises(httpx.TimeoutException):
                httpx.post(f"{server[0]}/v1/completions", json=body, headers=auth, timeout=0.3)
        live: list[httpx.Response] = []
        waiter = threading.Thread(
            target=lambda: live.append(
                httpx.post(f"{server[0]}/v1/completions", json=body, headers=auth, timeout=300)
            )
        )
        waiter.start()
        time.sleep(1)
    finally:
        for stream in busy:
            stream.close()
    waiter.join(timeout=300)
    assert live and live[0].status_code == 200, live and live[0].text
    assert "cancelled while waiting" in server[1].read_text()


def test_a_client_that_gives_up_on_n_answers_frees_every_slot(client: openai.OpenAI, server):
    """Three answers on two slots (the third waits): a client that leaves, streamed or
    not, ends all three within a round, the waiting one included."""
    story = {"model": MODEL, "messages": [{"role": "user", "content": STORY}], "n": 3}
    ask_long = {**story, "max_tokens": 1500, "temperature": 0.7}
    give_up(f"{server[0]}/v1/chat/completions", {**ask_long, **LONG}, 6)
    wait_idle(server[0], within_s=10)
    streamed = client.chat.completions.create(**ask_long, stream=True, extra_body=LONG)
    next(iter(streamed))
    streamed.close()
    wait_idle(server[0], within_s=10)
    log = server[1].read_text()
    assert "(3 of 3) cancelled while waiting" in log
    assert log.count("cancelled: the client left") >= 4


def test_another_model_name_is_served_and_max_tokens_clamped(client: openai.OpenAI):
    answer = client.chat.completions.create(
        model="gpt-4o-mini", messages=ASK, temperature=0, max_tokens=2
    )
    assert answer.model == MODEL and answer.choices[0].message.content
    beyond = ask(client, max_tokens=10**7, stop=["\n"])  # more than the context holds
    assert beyond.choices[0].message.content


def test_web_pages_cannot_drive_the_server(server):
    """Browser safety on the real server: a rebound Host, a foreign Origin."""
    base, auth = server[0], {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "messages": ASK, "max_tokens": 1}
    rebound = httpx.post(
        f"{base}/v1/chat/completions", json=body, headers={**auth, "Host": "evil.example"}
    )
    assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "forbidden"
    page = httpx.post(
        f"{base}/v1/chat/completions", json=body, headers={**auth, "Origin": "https://evil.ex"}
    )
    assert page.status_code == 403
    port = base.rsplit(":", 1)[1]
    local = httpx.post(
        f"{base}/v1/chat/completions",
        json=body,
        headers={**auth, "Host": f"localhost:{port}"},
        timeout=300,
    )
    assert local.status_code == 200


PRIMES = {  # a schema for the answer to ASK
    "type": "object",
    "properties": {"primes": {"type": "array", "items": {"type": "integer"}}},
    "required": ["primes"],
    "additionalProperties": False,
}


def test_claude_codes_requests_through_anthropics_sdk(client: openai.OpenAI, server):
    """Anthropic's Messages API as Claude Code sends it (system blocks with its billing
    stamp, tools with JSON Schema's `$schema`, `x-api-key`): greedy text equal to the chat
    completion's, a forced tool call streamed as tool_use with its input in pieces, its
    result answered, and count_tokens equal to what the message was charged."""
    sdk = anthropic.Anthropic(base_url=server[0], api_key=KEY, max_retries=0, timeout=300)
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.1; cch=a5145;"},
        {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
    ]
    chat = ask(client, [{"role": "system", "content": "You are terse."}, *ASK])
    # today's SDK has no temperature (Claude Code sends none); older clients send it
    greedy = {"temperature": 0}
    message = sdk.messages.create(
        model="claude-local", max_tokens=16, system=system, messages=ASK, extra_body=greedy
    )
    assert message.content[0].text == chat.choices[0].message.content
    assert message.usage.output_tokens == chat.usage.completion_tokens
    counted = sdk.messages.count_tokens(model="claude-local", system=system, messages=ASK)
    charged = message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert counted.input_tokens == charged == chat.usage.prompt_tokens

    weather = {
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
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = {"type": "tool", "name": "get_weather"}
    pieces = []
    with sdk.messages.stream(
        model="claude-local",
        max_tokens=30,
        messages=asked,
        tools=[weather],
        tool_choice=forced,
        extra_body=greedy,
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                pieces.append(event.delta.partial_json)
        called = stream.get_final_message()
    assert called.stop_reason == "tool_use" and len(pieces) > 2
    call = called.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.input == json.loads("".join(pieces)) == {"city": "Paris"}

    result = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 °C"}
    turns = [*asked, {"role": "assistant", "content": called.content}]
    reply = sdk.messages.create(
        model="claude-local",
        max_tokens=20,
        messages=[*turns, {"role": "user", "content": [result]}],
        tools=[weather],
        extra_body=greedy,
    )
    assert reply.content[0].type == "text" and reply.content[0].text

    # structured output as today's API asks for it, greedy as the chat's json_schema
    schema = PRIMES
    structured = sdk.messages.create(
        model="claude-local",
        max_tokens=40,
        messages=ASK,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        extra_body=greedy,
    )
    as_chat = ask(
        client,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
    )
    assert structured.content[0].text == as_chat.choices[0].message.content
    assert isinstance(json.loads(structured.content[0].text)["primes"], list)


def test_codexs_requests_through_the_responses_api(client: openai.OpenAI):
    """OpenAI's Responses API as Codex CLI sends it (instructions, message items with
    parts, function tools beside hosted ones, streamed): greedy text equal to the chat
    completion's, a forced function call streamed in pieces and its output answered, and
    `text.format` equal to the chat's `response_format`."""
    chat = ask(client, [{"role": "system", "content": "You are terse."}, *ASK])
    items = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": ASK[0]["content"]}],
        }
    ]
    with client.responses.stream(
        model="gpt-5-codex",
        instructions="You are terse.",
        input=items,
        max_output_tokens=16,
        temperature=0,
    ) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == final.output_text == chat.choices[0].message.content
    assert final.usage.output_tokens == chat.usage.completion_tokens
    assert final.usage.input_tokens == chat.usage.prompt_tokens

    weather = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    }
    tools = [weather, {"type": "web_search"}]
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    pieces = []
    with client.responses.stream(
        model="gpt-5-codex",
        input=asked,
        tools=tools,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=30,
        temperature=0,
    ) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                pieces.append(event.delta)
        called = stream.get_final_response()
    call = called.output[-1]
    assert call.type == "function_call" and call.name == "get_weather" and len(pieces) > 2
    assert json.loads(call.arguments) == json.loads("".join(pieces)) == {"city": "Paris"}
    history = [
        *asked,
        *[item.model_dump(exclude_none=True) for item in called.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 °C"},
    ]
    reply = client.responses.create(
        model="gpt-5-codex", input=history, tools=tools, max_output_tokens=20, temperature=0
    )
    assert reply.output_text

    schema = PRIMES
    structured = client.responses.create(
        model="gpt-5-codex",
        input=ASK,
        max_output_tokens=40,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "p", "schema": schema, "strict": True}},
    )
    as_chat = ask(
        client,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
    )
    assert structured.output_text == as_chat.choices[0].message.content


def test_codexs_apply_patch_a_custom_tool_is_called_with_its_text(client: openai.OpenAI):
    """Codex CLI sends apply_patch as a custom tool (free text, a Lark grammar beside
    it): forced, the real model's call comes back as a custom_tool_call whose input is
    plain text (not the JSON it was written in), streamed in pieces, and its output
    reaches the next turn."""
    apply_patch = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edits files. This is a FREEFORM tool, so do not wrap the patch in JSON.",
        "format": {
            "type": "grammar",
            "syntax": "lark",
            "definition": 'start: "*** Begin Patch" LF hunk+ "*** End Patch" LF?\n'
            'hunk: "*** Add File: " /(.+)/ LF ("+" /(.*)/ LF)+\n%import common.LF\n',
        },
    }
    tools = [apply_patch, {"type": "web_search"}]
    asked = [{"role": "user", "content": "Create hello.txt containing the line: hi"}]
    deltas, events = [], []
    with client.responses.stream(
        model="gpt-5-codex",
        input=asked,
        tools=tools,
        tool_choice={"type": "custom", "name": "apply_patch"},
        max_output_tokens=60,
        temperature=0,
    ) as stream:
        for event in stream:
            events.append(event)
            if event.type == "response.custom_tool_call_input.delta":
                deltas.append(event.delta)
    final = events[-1].response  # type: ignore[union-attr]  # completed, or cut at 60
    call = final.output[-1]
    assert call.type == "custom_tool_call" and call.name == "apply_patch", final.output
    assert len(deltas) > 2 and "".join(deltas) == call.input
    assert call.input.strip() and not call.input.lstrip().startswith("{")
    history = [
        *asked,
        call.model_dump(exclude_none=True),
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done."},
    ]
    reply = client.responses.create(
        model="gpt-5-codex", input=history, tools=tools, max_output_tokens=12, temperature=0
    )
    assert reply.status in ("completed", "incomplete") and reply.output


def test_a_slots_cache_kept_in_a_file_comes_back(client: openai.OpenAI, server):
    """POST /slots/{id}?action=save|erase|restore (--slot-save-path): the slot that read
    a long prompt keeps its caches (the target's and the draft model's) in a file; erased,
    then restored from it, the same request reads its last token only and answers as
    before."""
    base, slots_dir = server[0], server[1].parent / "slots"
    system = "You review Python code for a careful team. " + Path(__file__).read_text()[:1500]
    messages = [{"role": "system", "content": system}, *ASK]
    first = ask(client, messages, max_tokens=8)
    slot = max(httpx.get(f"{base}/slots", headers=AUTH).json(), key=lambda s: s.get("id_task", -1))
    act = f"{base}/slots/{slot['id']}?action="
    saved = httpx.post(act + "save", json={"filename": "review.bin"}, headers=AUTH).json()
    assert saved["n_saved"] > first.usage.prompt_tokens
    assert saved["n_written"] == (slots_dir / "review.bin").stat().st_size
    assert httpx.post(act + "erase", headers=AUTH).json()["n_erased"] == saved["n_saved"]

    def cached() -> int:
        return httpx.get(f"{base}/slots", headers=AUTH).json()[slot["id"]]["n_cached"]

    assert cached() == 0
    back = httpx.post(act + "restore", json={"filename": "review.bin"}, headers=AUTH).json()
    assert back["n_restored"] == saved["n_saved"] == cached()
    again = ask(client, messages, max_tokens=8)
    assert again.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content


def test_ctrl_c_ends_the_answers_in_flight_and_exits_cleanly(real_paths, tmp_path):
    """A server of its own (one slot): Ctrl-C while a stream decodes and a request waits
    tells both clients why (the stream's error event, a 503) and exits at once, without
    a traceback, where uvicorn alone would wait minutes for the story to end."""
    port = free_port()
    log = tmp_path / "serve.log"
    args = [*model_args(real_paths), "--port", str(port), "--parallel", "1", "--draft", "none"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localspec", "serve", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, proc, 300, log.read_text)
        story = {"messages": [{"role": "user", "content": STORY}], "max_tokens": 1500}
        waited: list[httpx.Response] = []
        with httpx.stream(
            "POST", f"{base}/v1/chat/completions", json={**story, "stream": True}, timeout=60
        ) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            waiter = threading.Thread(
                target=lambda: waited.append(
                    httpx.post(f"{base}/v1/chat/completions", json=story, timeout=60)
                )
            )
            waiter.start()
            while httpx.get(f"{base}/health").json()["queue_depth"] < 2:  # it waits
                assert waiter.is_alive(), waited
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            last = [line for line in lines if line.startswith("data:")][-1]
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    waiter.join(timeout=30)
    said = log.read_text()
    assert "Traceback" not in said, said
    assert json.loads(last.removeprefix("data:"))["error"]["code"] == "shutting_down"
    assert waited[0].status_code == 503, waited[0].text
    assert "cancelled while waiting: the server is shutting down" in said, said


def test_embeddings_from_the_models_own_weights(client: openai.OpenAI, server):
    """As the openai SDK asks (base64 floats), for several texts, token ids, and floats."""
    texts = ["def add(a, b):\n    return a + b", "def sum_two(x, y):\n    return x + y"]
    texts.append("The weather in Paris is rainy in autumn.")
    got = client.embeddings.create(model=MODEL, input=texts)
    vectors = np.array([d.embedding for d in got.data])
    assert vectors.shape == (3, 1536) and [d.index for d in got.data] == [0, 1, 2]
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    # two functions that add are closer to each other than to the weather
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2
    ids = httpx.post(f"{server[0]}/tokenize", json={"content": texts[0]}, headers=AUTH)
    tokens = ids.json()["tokens"]
    as_ids = client.embeddings.create(model=MODEL, input=[tokens], encoding_format="float")
    assert as_ids.data[0].embedding == pytest.approx(vectors[0].tolist(), abs=1e-6)
    assert as_ids.usage.prompt_tokens == len(tokens) and got.usage.prompt_tokens > 3 * 8
    for bad, says in [
        ("", "an empty text has no embedding"),
        ("word " * 2100, "embeds at most 2,048 a text"),
        ([[1, 2], [10**9]], r"input\[1\]: token ids must be in"),
    ]:
        with pytest.raises(openai.BadRequestError, match=says):
            client.embeddings.create(model=MODEL, input=bad)
    with pytest.raises(openai.BadRequestError, match="1536 dimensions, not 256"):
        client.embeddings.create(model=MODEL, input="x", dimensions=256)


def test_an_index_being_built_neither_holds_back_a_completion_nor_outlives_its_client(
    client: openai.OpenAI, server
):
    """A long text is embedded in passes between the slots' steps: an editor's
    completion that comes meanwhile is answered while it is read; its client gives up,
    and the reading stops."""
    long_text = "x = compute(x, y) + 1\n" * 180  # 1,980 tokens: 16 s or more on 2 cores
    failed: list[BaseException] = []

    def index() -> None:  # its client gives up after 8 s
        try:
            give_up(f"{server[0]}/v1/embeddings", {"input": long_text}, 8)
        except BaseException as e:  # pytest.fail: it was answered before
            failed.append(e)

    embedding = threading.Thread(target=index)
    embedding.start()
    time.sleep(1)
    done = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=8)
    assert done.choices[0].text and embedding.is_alive()  # answered while it was read
    embedding.join(timeout=60)
    assert not failed, failed
    short = client.embeddings.create(model=MODEL, input="def add(a, b):")
    assert len(short.data[0].embedding) == 1536
    log = server[1].read_text()
    assert "embeddings cancelled: the client left" in log
    assert "embeddings: 1 text, 1980 tokens" not in log  # its reading was not finished
