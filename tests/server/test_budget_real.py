"""A thinking model's reasoning budget from the server's default (`serve
--reasoning-budget`), Anthropic's `thinking.budget_tokens` and before a schema's JSON:
the real default pair behind a chat template that opens `<think>` (test_thinking_real's
session, made again for this module: one app per session, as `serve` has)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pytest
from fastapi.testclient import TestClient
from server.test_structured_real import PERSON
from server.test_thinking_real import BUDGET, MESSAGES, session  # noqa: F401 (a fixture)

from localspec.server.app import ServerOptions, create_app
from localspec.server.defaults import ReasoningDefaults
from localspec.session import Session

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def http(session: Session) -> Iterator[TestClient]:  # noqa: F811
    options = ServerOptions("coder", reasoning=ReasoningDefaults(BUDGET))
    with TestClient(create_app(session, options)) as client:
        yield client


def test_a_budget_from_anthropics_thinking_the_servers_default_and_before_json(
    session: Session,  # noqa: F811
    http: TestClient,
):
    def tokens(text: str) -> int:
        return len(session.target.tokenize(text.strip(), special=False))

    asked = {"model": "coder", "messages": MESSAGES, "temperature": 0, "max_tokens": 60}
    free = http.post("/v1/chat/completions", json=asked | {"reasoning_budget_tokens": 10_000})
    thought = free.json()["choices"][0]["message"]["reasoning_content"]
    reply = http.post(
        "/v1/messages",
        json={
            "model": "coder",
            "system": MESSAGES[0]["content"],
            "messages": MESSAGES[1:],
            "thinking": {"type": "enabled", "budget_tokens": BUDGET},
            "temperature": 0,
            "max_tokens": 60,
        },
    )
    blocks = reply.json()["content"]
    assert [b["type"] for b in blocks] == ["thinking", "text"], blocks
    assert blocks[1]["text"].strip(), blocks  # the answer after the forced close
    # BUDGET tokens of reasoning, where it would think longer (as whole text, read
    # again into tokens: a greedy answer here may part from another at a near-tie)
    assert 0 < tokens(blocks[0]["thinking"]) <= BUDGET + 1 < tokens(thought), blocks
    # the server's own budget where a request sets none (or -1), before a schema's JSON
    schema = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    for extra in ({}, {"thinking_budget_tokens": -1}):
        body = asked | extra | {"response_format": schema, "max_tokens": 120}
        message = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert 0 < tokens(message["reasoning_content"]) <= BUDGET + 1, (extra, message)
        jsonschema.validate(json.loads(message["content"]), PERSON)
    r = http.post(
        "/v1/chat/completions", json=asked | {"reasoning_budget_message": "Done </think>"}
    )
    assert r.status_code == 400 and "reasoning_budget_message" in r.json()["error"]["message"]
