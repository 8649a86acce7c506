"""A thinking model asked for JSON or a forced call thinks first, then answers, as
llama-server lets it: the real default pair behind a chat template that opens a
`<think>` block in the prompt (as Qwen3.5's and Qwen3.6's do; no thinking model is
reachable offline). Its reasoning goes to `reasoning_content`, the answer is the
schema's JSON or the call, greedy output equals constrained plain decoding's."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest
from decoding.test_real_engine import assert_lossless
from fastapi.testclient import TestClient
from server.test_structured_real import PERSON

from localspec.backends.llama import LoadOptions
from localspec.backends.llama_grammar import schema_grammar
from localspec.decoding.budget import ThoughtBudget
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished, Piece
from localspec.decoding.sampling import SamplingParams
from localspec.server.app import ServerOptions, create_app
from localspec.server.fence import chat_grammar
from localspec.session import Session, SessionConfig, open_session
from localspec.thinking import THINK, Thinking

pytestmark = pytest.mark.real

MESSAGES = [
    {"role": "system", "content": "Think it over briefly between <think> and </think>."},
    {"role": "user", "content": "Make up a programmer: their name, age and languages."},
]
OPENING = "{{- '<|im_start|>assistant\\n' }}\n{%- endif %}"


@pytest.fixture(scope="module")
def session(real_paths) -> Iterator[Session]:
    load = LoadOptions(n_ctx=2048, n_threads=2)
    s = open_session(SessionConfig(str(real_paths[0]), str(real_paths[1]), "auto", load, load))
    template = s.target.chat_template() or ""
    assert template.endswith(OPENING + "\n"), template[-80:]
    thinking = template.replace(OPENING, OPENING.replace("\\n'", "\\n<think>\\n'"))
    s.target.chat_template = lambda: thinking  # type: ignore[method-assign]
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(session: Session) -> Iterator[openai.OpenAI]:
    with TestClient(create_app(session, ServerOptions("coder"))) as http:
        yield openai.OpenAI(
            base_url="http://testserver/v1", api_key="x", max_retries=0, http_client=http
        )


def test_it_thinks_then_writes_the_schemas_json(session: Session, client: openai.OpenAI):
    asked = {
        "model": "coder",
        "messages": MESSAGES,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        "temperature": 0,
        "max_tokens": 160,
        "logprobs": True,
    }
    reply = client.chat.completions.create(**asked)  # type: ignore[call-overload]
    message, usage = reply.choices[0].message, reply.usage
    reasoning = message.model_extra["reasoning_content"]  # type: ignore[index]
    assert reasoning.strip() and "</think>" not in reasoning, reasoning
    jsonschema.validate(json.loads(message.content or ""), PERSON)
    assert reply.choices[0].finish_reason == "stop"
    details = usage.completion_tokens_details  # type: ignore[union-attr]
    assert 0 < details.reasoning_tokens < usage.completion_tokens  # type: ignore[union-attr,operator]
    # constrained plain decoding of the same prompt under the same grammar
    text = session.prompt_text(MESSAGES, None)
    assert text.endswith("<think>\n")
    prompt = session.tokenize_raw(text)
    grammar = chat_grammar(session.target, schema_grammar(PERSON), Thinking(THINK, opened=True))
    config = GenerationConfig(160, SamplingParams(temperature=0), trace=True, grammar=grammar)
    events = list(Engine(session.target, NoDrafter(), 0).generate(prompt, config))
    plain = events[-1]
    assert isinstance(plain, Finished) and "</think>" in plain.text
    ids = tuple(e.model_extra["id"] for e in reply.choices[0].logprobs.content)  # type: ignore[union-attr]
    served = Finished(plain.text, ids, plain.stop_reason, plain.stats)
    assert_lossless(served, [e for e in events if isinstance(e, Piece)], plain)
    # streamed: the same reasoning, then the same JSON, no mark or fence in either (the
    # same tokens: without logprobs, recalled from the answer above, Engine.recall)
    asked.pop("logprobs")
    chunks = list(client.chat.completions.create(**asked, stream=True))  # type: ignore[call-overload]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert streamed == reasoning
    assert "".join(d.content or "" for d in deltas) == message.content


def test_it_thinks_then_makes_the_call_it_must(client: openai.OpenAI):
    tool = {
        "type": "function",
        "function": {
            "name": "save_person",
            "description": "Save a programmer's record.",
            "parameters": PERSON,
        },
    }
    reply = client.chat.completions.create(
        model="coder",
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=[tool],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_tokens=160,
    )
    message = reply.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content", "").strip()
    [call] = message.tool_calls or []
    assert call.function.name == "save_person"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), PERSON)  # type: ignore[union-attr]
    assert reply.choices[0].finish_reason == "tool_calls"


BUDGET = 6  # reasoning tokens: the greedy thought above runs longer


def test_a_reasoning_budget_closes_the_thought_and_the_answer_follows(
    session: Session, client: openai.OpenAI
):
    budgeted = {"reasoning_budget_tokens": BUDGET, "reasoning_budget_message": " Enough."}
    reply = client.chat.completions.create(
        model="coder",
        messages=MESSAGES,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=60,
        logprobs=True,
        extra_body=budgeted,
    )
    message = reply.choices[0].message
    reasoning = (message.model_extra or {})["reasoning_content"]
    assert reasoning.endswith(" Enough."), message  # (then this model ends its answer)
    ids = tuple(e.model_extra["id"] for e in reply.choices[0].logprobs.content)  # type: ignore[union-attr,index]
    budget = ThoughtBudget.of(session.target, THINK, BUDGET, " Enough.", opened=True)
    assert ids[BUDGET : BUDGET + len(budget.close)] == budget.close, ids
    assert b"</think>" not in b"".join(session.target.token_bytes(t) for t in ids[:BUDGET])
    # plain decoding under the same budget: the same answer
    prompt = session.tokenize_raw(session.prompt_text(MESSAGES, None))
    config = GenerationConfig(60, SamplingParams(temperature=0), trace=True, grammar=budget)
    events = list(Engine(session.target, NoDrafter(), 0).generate(prompt, config))
    plain = events[-1]
    assert isinstance(plain, Finished)
    served = Finished(plain.text, ids, plain.stop_reason, plain.stats)
    assert_lossless(served, [e for e in events if isinstance(e, Piece)], plain)
