"""Structured output on the real default pair, through the `openai` SDK: a json_schema
answer that validates and equals constrained plain decoding, json_object, llama-server's
GBNF `grammar`, jump-forward drafts where the grammar forces the text, and one-line 400s
for what cannot be honoured."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import jsonschema
import numpy as np
import openai
import pytest
from decoding.test_real_engine import assert_lossless
from fastapi.testclient import TestClient
from server.test_lark_gbnf import PATCH

from localspec.backends.llama import LoadOptions
from localspec.backends.llama_grammar import LlamaGrammar, schema_grammar
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished, Piece, RoundEnd
from localspec.decoding.sampling import SamplingParams
from localspec.server import chat
from localspec.server.app import ServerOptions, create_app
from localspec.server.fence import Unfence, chat_grammar
from localspec.server.schemas import Tool
from localspec.session import Session, SessionConfig, open_session
from localspec.thinking import GEMMA, HARMONY, THINK, Thinking, excluding

pytestmark = pytest.mark.real

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
ASK = "Make up a programmer: their name, age and up to three languages they use."


@pytest.fixture(scope="module")
def session(real_paths) -> Iterator[Session]:
    load = LoadOptions(n_ctx=2048, n_threads=2)
    s = open_session(SessionConfig(str(real_paths[0]), str(real_paths[1]), "auto", load, load))
    yield s
    s.close()


@pytest.fixture(scope="module")
def http(session: Session) -> Iterator[TestClient]:
    """The app in-process (TestClient is an httpx.Client)."""
    with TestClient(create_app(session, ServerOptions("coder"))) as http:
        yield http


@pytest.fixture(scope="module")
def client(http: TestClient) -> openai.OpenAI:
    """The real SDK over the app in-process."""
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="x", max_retries=0, http_client=http
    )


def goes_through(grammar: LlamaGrammar, target, text: str) -> bool:
    """Whether the grammar takes every token of `text` and then lets the answer end."""
    state = grammar.start()
    for token in target.tokenize(text, special=False):
        if not state.allows(token):
            return False
        state.accept(token)
    return state.allows(target.special_ids[1])


def schema_format(schema: dict) -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": schema, "strict": True},
    }


def test_a_json_schema_answer_validates_and_equals_constrained_plain_decoding(
    session: Session, client: openai.OpenAI
):
    reply = client.chat.completions.create(
        model="coder",
        messages=[{"role": "user", "content": ASK}],
        response_format=schema_format(PERSON),  # type: ignore[arg-type]
        temperature=0,
        max_tokens=80,
        logprobs=True,  # each token's id: the fence's too, which the content leaves out
    )
    text = reply.choices[0].message.content or ""
    jsonschema.validate(json.loads(text), PERSON)
    assert reply.choices[0].finish_reason == "stop"
    ids = [e.model_extra["id"] for e in reply.choices[0].logprobs.content]  # type: ignore[union-attr]
    # the same prompt, decoded plainly under the same grammar: the model opens a fence
    prompt = session.tokenize_raw(session.prompt_text([{"role": "user", "content": ASK}], None))
    grammar = chat_grammar(session.target, schema_grammar(PERSON))
    config = GenerationConfig(80, SamplingParams(temperature=0), trace=True, grammar=grammar)
    events = list(Engine(session.target, NoDrafter(), 0).generate(prompt, config))
    plain = events[-1]
    assert isinstance(plain, Finished) and plain.text.startswith("```json")
    unfence = Unfence()
    unfenced = unfence.push(plain.text) + unfence.flush()
    assert plain.text.endswith("```") and unfenced.startswith("{") and unfenced.endswith("}")
    pieces = [e for e in events if isinstance(e, Piece)]
    if tuple(ids) != plain.tokens:  # a batched pass may move a near-tie, never a clear choice
        served = Finished(text, tuple(ids), plain.stop_reason, plain.stats)
        assert_lossless(served, pieces, plain)
    else:
        assert text == unfenced


def test_a_chats_json_may_come_fenced_and_the_client_gets_the_json_alone(
    session: Session, client: openai.OpenAI
):
    """As llama-server's grammar for a chat: the answer bare or in a ```json fence (which
    this model writes when it may), the fence never shown, streamed or not."""
    grammar = chat_grammar(session.target, schema_grammar(PERSON))
    person = '{"name": "Ada", "age": 36, "languages": ["C"]}'
    assert goes_through(grammar, session.target, person)
    assert goes_through(grammar, session.target, f"```json\n{person}\n```")
    assert not goes_through(grammar, session.target, f"```json\n{person}")
    assert not goes_through(grammar, session.target, f"```\n{person}\n```")
    # spaces where llama-server's converter puts them: not between a value and its comma
    assert goes_through(grammar, session.target, person.replace("[", "[\n  ").replace("]", "\n]"))
    assert not goes_through(grammar, session.target, person.replace('"Ada",', '"Ada"\n  ,'))
    # the grammar's guesses at the spaces it leaves open, before the answer shows its own
    # way: the fence's, over lines (the first token the model writes after it is "{\n")
    state = grammar.start()
    for token in session.target.tokenize("```json", special=False):
        state.accept(token)
    assert state.forced_text(16).startswith(b'\n{\n  "name": '), state.forced_text(16)
    asked = {
        "model": "coder",
        "messages": [{"role": "user", "content": ASK}],
        "response_format": schema_format(PERSON),
        "temperature": 0,
        "max_tokens": 80,
    }
    whole = client.chat.completions.create(**asked).choices[0].message.content or ""
    chunks = client.chat.completions.create(**asked, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole and whole.startswith("{") and "`" not in whole, (streamed, whole)
    jsonschema.validate(json.loads(whole), PERSON)


def test_a_thinking_model_may_think_before_its_json(session: Session):
    """As llama-server's grammar for a chat lets it: a block of reasoning in the model's
    own marks (or the rest of the one the prompt opened), then the JSON, bare or fenced;
    gpt-oss's analysis message, then its final one. On the real vocabulary."""
    person = '{"name": "Ada", "age": 36, "languages": ["C"]}'
    gbnf = schema_grammar(PERSON)
    qwen3 = chat_grammar(session.target, gbnf, Thinking(THINK))
    for text in (
        person,
        f"<think>\nA <b>name</b> </thin k>, an age.\n</think>\n\n```json\n{person}\n```",
        f"\n<think></think>{person}",
    ):
        assert goes_through(qwen3, session.target, text), text
    for text in (
        f"<think>\nA name. {person}",  # never closed: still thinking
        f"<think>\nA name.\n</think>\nSure! {person}",
        f"<think>\nA name.\n</think>\n</think>{person}",
        f"A name.\n</think>\n{person}",  # closes a block the prompt did not open
    ):
        assert not goes_through(qwen3, session.target, text), text
    opened = chat_grammar(session.target, gbnf, Thinking(THINK, opened=True))
    assert goes_through(opened, session.target, f"A name.\n</think>\n\n{person}")
    assert not goes_through(opened, session.target, person)
    gemma = chat_grammar(session.target, gbnf, Thinking(GEMMA))
    assert goes_through(gemma, session.target, f"<|channel>thought\nHm.<channel|>{person}")
    harmony = chat_grammar(session.target, gbnf, Thinking(HARMONY))
    final = f"<|channel|>final <|constrain|>json<|message|>{person}"
    for text in (final, f"<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant{final}"):
        assert goes_through(harmony, session.target, text), text
    assert not goes_through(harmony, session.target, person)  # not a Harmony message


def test_after_a_thought_the_grammar_guesses_the_answers_layout_afresh(session: Session):
    """The spaces the grammar leaves open are guessed from the answer's style (a draft),
    not from the reasoning's text before it: after the block, the fence's layout again."""
    thought = 'The user wants {"name" : "x"} on one line, say\n\t{ "name" : "Ada" }\n</think>\n\n'
    grammar = chat_grammar(session.target, schema_grammar(PERSON), Thinking(THINK, opened=True))
    state = grammar.start()
    for token in session.target.tokenize(thought + "```json", special=False):
        state.accept(token)
    assert state.forced_text(16).startswith(b'\n{\n  "name": '), state.forced_text(16)


def test_a_thought_holds_any_text_but_its_end_mark(session: Session):
    """`excluding`'s rules, through llama.cpp's grammar on the real vocabulary: any text
    made of the mark's pieces goes through unless it holds the mark."""
    rng = np.random.default_rng(0)
    pieces = ["<", "/", "t", "k", ">", "</", "</th", "ink", "</think", "</thin", "k>", "<<", " x"]
    grammar = LlamaGrammar(session.target, "\n".join(["root ::= t", *excluding("t", "</think>")]))
    held = 0
    for _ in range(300):
        text = "".join(rng.choice(pieces, size=rng.integers(1, 9)))
        held += "</think>" in text
        assert goes_through(grammar, session.target, text) == ("</think>" not in text), text
    assert held > 10


def test_the_bench_counts_the_tokens_a_client_saw(session: Session, http: TestClient):
    """`bench --suite json` counts the tokens of the text a client saw (the target's
    tokenizer, so alike for every server): localspec's usage counts the fence's tokens
    too (```json, a newline, ```), which were decoded but not shown."""
    from localspec.bench.structured import ask, to_row

    # a seed of its own (greedy either way): decoded, not recalled from the answer to
    # the same request above (Engine.recall), which streams at once
    got = ask(http, "http://testserver", ASK, PERSON, 60, repeat=1)
    row = to_row(http, "http://testserver", "person", "localspec-auto", got, PERSON)
    assert row.valid and 10 < row.shown_tokens < got.tokens and got.span_s > 0, (row, got)
    assert row.shown_tokens == len(session.target.tokenize(got.text, special=False))
    assert row.tokens_per_s == pytest.approx((row.shown_tokens - 1) / got.span_s)


def grammar_rounds(session: Session, grammar: LlamaGrammar) -> tuple[list[RoundEnd], Finished]:
    """The engine with no drafter of its own (γ 8): only the grammar drafts."""
    prompt = session.tokenize_raw(session.prompt_text([{"role": "user", "content": ASK}], None))
    config = GenerationConfig(80, SamplingParams(temperature=0), grammar=grammar)
    events = list(Engine(session.target, NoDrafter(), 8).generate(prompt, config))
    rounds = [e for e in events if isinstance(e, RoundEnd) and e.drafter.startswith("grammar")]
    plain = list(Engine(session.target, NoDrafter(), 0).generate(prompt, config))[-1]
    done = events[-1]
    assert isinstance(done, Finished) and isinstance(plain, Finished)
    assert done.text == plain.text  # the drafts change nothing but the speed
    return rounds, done


def test_jump_forward_drafts_what_the_grammar_forces(session: Session):
    """Where the grammar forces the text (keys, quotes, separators), the target accepts
    what is drafted for it; where it leaves whitespace open (a schema's answer), the
    answer's style is a guess, mostly right."""
    forced = LlamaGrammar(
        session.target,
        r'root ::= "{\"name\": \"" [A-Za-z ]+ "\", \"age\": " [0-9]+ '
        r'", \"languages\": [\"" [A-Za-z+#]+ "\"]}"',
    )
    rounds, done = grammar_rounds(session, forced)
    drafted, accepted = sum(r.drafted for r in rounds), sum(r.accepted for r in rounds)
    assert drafted >= 6 and accepted >= 0.9 * drafted, (accepted, drafted, done.text)
    rounds, done = grammar_rounds(session, LlamaGrammar(session.target, schema_grammar(PERSON)))
    jsonschema.validate(json.loads(done.text), PERSON)
    drafted, accepted = sum(r.drafted for r in rounds), sum(r.accepted for r in rounds)
    assert accepted >= 6 and accepted >= 0.5 * drafted, (accepted, drafted, done.text)


def test_json_object_and_a_gbnf_grammar(client: openai.OpenAI):
    reply = client.chat.completions.create(
        model="coder",
        messages=[{"role": "user", "content": "Give me a JSON object with a key 'ok'."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=40,
    )
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
    reply = client.chat.completions.create(
        model="coder",
        messages=[{"role": "user", "content": "Is Python dynamically typed?"}],
        temperature=0.7,
        max_tokens=8,
        extra_body={"grammar": 'root ::= "yes" | "no"'},
    )
    assert reply.choices[0].message.content in ("yes", "no")


def test_what_cannot_be_honoured_gets_a_400_that_names_it(client: openai.OpenAI):
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="coder",
            messages=messages,
            extra_body={"grammar": "root ::= ("},  # type: ignore[arg-type]
        )
    assert "grammar" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="coder",
            messages=messages,  # type: ignore[arg-type]
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": []}},  # type: ignore[typeddict-item]
        )
    assert "json_schema.schema" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="coder",
            messages=messages,  # type: ignore[arg-type]
            response_format={"type": "yaml"},  # type: ignore[typeddict-item]
        )
    assert "yaml" in str(e.value)


@pytest.mark.parametrize(
    ("body", "asked"),
    [
        ({}, ("text", None, "response_format")),
        ({"response_format": {"type": "json_object"}}, ("json_object", None, "response_format")),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}},
            ("json_schema", PERSON, "response_format.json_schema.schema"),
        ),
        # llama-server's shapes (its README's): a schema beside the type, or on the body
        (
            {"response_format": {"type": "json_object", "schema": PERSON}},
            ("json_schema", PERSON, "response_format.schema"),
        ),
        (
            {"response_format": {"type": "json_schema", "schema": PERSON}},
            ("json_schema", PERSON, "response_format.schema"),
        ),
        ({"json_schema": PERSON}, ("json_schema", PERSON, "json_schema")),
        (
            {"response_format": {"type": "text"}, "json_schema": {}},
            ("json_schema", {}, "json_schema"),
        ),
    ],
)
def test_the_json_a_request_asks_for_in_openais_shape_or_llama_servers(body, asked):
    from localspec.server.prepare import asked_json
    from localspec.server.schemas import ChatRequest

    request = ChatRequest.model_validate({"messages": [{"role": "user", "content": "?"}]} | body)
    assert asked_json(request) == asked


def test_llama_servers_schema_on_a_chats_body_is_followed(client: openai.OpenAI):
    """Once ignored (the answer free), now the schema holds; with response_format too: a
    400 that names both."""
    reply = client.chat.completions.create(
        model="coder",
        messages=[{"role": "user", "content": ASK}],
        temperature=0,
        max_tokens=80,
        extra_body={"json_schema": PERSON},
    )
    jsonschema.validate(json.loads(reply.choices[0].message.content or ""), PERSON)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="coder",
            messages=[{"role": "user", "content": ASK}],
            response_format={"type": "json_object"},
            extra_body={"json_schema": PERSON},
        )
    assert "response_format and json_schema" in str(e.value)


def test_logprobs_come_from_the_verify_pass_and_match_a_plain_pass(
    session: Session, client: openai.OpenAI
):

    # every token clear of its runner-up by 2 logits or more: "Name a prime number."
    # opens at a near-tie of 0.07 ("2" or "The"), which a batch of another size flips
    messages = [{"role": "user", "content": "Name the first prime number."}]
    reply = client.chat.completions.create(
        model="coder", messages=messages, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and len(content) == reply.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:  # greedy: the chosen token is the most likely one
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
    assert "".join(e.token for e in content) == reply.choices[0].message.content
    ids = [e.model_extra["id"] for e in content]  # llama-server's field: the token itself
    assert b"".join(session.target.token_bytes(t) for t in ids).decode() == "".join(
        e.token for e in content
    )
    prompt = session.tokenize_raw(session.prompt_text(messages, None))
    session.target.reset()
    row = session.target.evaluate(prompt, 1)[0].astype(np.float64)
    plain = row.max() - (row.max() + np.log(np.exp(row - row.max()).sum()))
    assert content[0].logprob == pytest.approx(plain, abs=1e-3)
    streamed = client.chat.completions.create(
        model="coder", messages=messages, temperature=0, max_tokens=8, logprobs=True, stream=True
    )
    entries = [
        e
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content or []
    ]
    assert [e.token for e in entries] == [e.token for e in content]


def test_a_control_token_is_not_text_a_grammar_takes(session: Session):
    """llama.cpp's grammar reads <|im_start|> as its eleven characters, which a JSON
    string takes; the client gets no text for it, so the grammar refuses it there. A
    grammar that names it (a format's marker) still takes it."""
    target = session.target
    im_start = target.tokenize("<|im_start|>", special=True)[-1]
    quote, x = target.tokenize('"', special=False), target.tokenize("x", special=False)
    state = LlamaGrammar(target, schema_grammar({"type": "string"})).start()
    state.accept(quote[0])  # inside the string
    assert state.allows(x[0]) and not state.allows(im_start)
    assert not state.allowed(np.array([im_start, x[0]], dtype=np.int32))[0]
    assert np.isneginf(state.mask(np.zeros(target.n_vocab, dtype=np.float32))[im_start])
    named = LlamaGrammar(target, 'root ::= "<|im_start|>" "x"').start()
    assert named.allows(im_start)


# --- a forced tool call: a grammar in the model's own format ---------------------------
def test_a_forced_call_grammar_takes_its_formats_call_and_forces_its_head(session) -> None:
    """On the real vocabulary: each format's canonical call goes through its grammar
    token by token, a call of another name does not, and with one tool named the head
    up to its arguments is forced (jump-forward drafts it for free)."""
    from localspec.server.chat import (
        CALL_STYLE,
        GEMMA4,
        HARMONY,
        HERMES,
        LLAMA3,
        XML,
        forced_tools,
        tool_grammar,
    )
    from localspec.server.schemas import ChatRequest

    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    named = {"type": "function", "function": {"name": "get_weather"}}
    request = ChatRequest.model_validate(
        {"model": "x", "messages": [{"role": "user", "content": "?"}], "tools": [tool]}
        | {"tool_choice": named}
    )
    forced = forced_tools(request)
    assert forced is not None
    target = session.target
    calls = {
        HERMES: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "\n</tool_call>",
        LLAMA3: '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        XML: "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis <3 x<y\n"
        "</parameter>\n</function>\n</tool_call>",
        GEMMA4: '<|tool_call>call:get_weather{city:<|"|>Paris, "old" {town}<|"|>}<tool_call|>',
        HARMONY: "<|channel|>analysis<|message|>The user asks.<|end|><|start|>assistant"
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": '
        '"Paris"}',
    }
    for fmt, text in calls.items():
        grammar = LlamaGrammar(target, tool_grammar(forced, fmt), style=CALL_STYLE)
        state = grammar.start()
        for token in target.tokenize(text, special=False):
            assert state.allows(token), (fmt, target.token_bytes(token))
            state.accept(token)
        assert state.allows(target.special_ids[1])  # complete: the end may come
        head = grammar.start().forced_text(64).decode()
        if fmt == XML:
            assert head.startswith("<tool_call>\n<function=get_weather>\n"), head
        elif fmt == GEMMA4:
            assert head == "<|tool_call>call:get_weather{", head
        elif fmt == HARMONY:  # it may think first
            assert head == "<|channel|>", head
        else:
            key = "arguments" if fmt == HERMES else "parameters"
            assert head.endswith(f'{{"name": "get_weather", "{key}": {{'), head
        wrong = grammar.start()
        for token in target.tokenize(text.replace("get_weather", "get_time"), special=False):
            if not wrong.allows(token):
                break
            wrong.accept(token)
        else:
            pytest.fail(f"{fmt}: another function's name went through")


def two_tools() -> list[Tool]:
    """`get_weather(city)` and `add(a)`, each argument required."""

    def tool(name: str, properties: dict) -> Tool:
        schema = {"type": "object", "properties": properties, "required": list(properties)}
        return Tool.model_validate(
            {"type": "function", "function": {"name": name, "parameters": schema}}
        )

    return [
        tool("get_weather", {"city": {"type": "string"}}),
        tool("add", {"a": {"type": "integer"}}),
    ]


# format -> a call of `add` with these arguments (JSON), as the format writes it
ADD_CALLS = {
    chat.HERMES: lambda args: f'<tool_call>\n{{"name": "add", "arguments": {args}}}\n</tool_call>',
    chat.LLAMA3: lambda args: f'{{"name": "add", "parameters": {args}}}',
    chat.XML: lambda args: (
        "<tool_call>\n<function=add>\n"
        + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in json.loads(args).items())
        + "</function>\n</tool_call>"
    ),
    chat.GEMMA4: lambda args: (
        "<|tool_call>call:add{"
        + ",".join(f"{k}:{json.dumps(v)}" for k, v in json.loads(args).items())
        + "}<tool_call|>"
    ),
    chat.HARMONY: lambda args: (
        f"<|channel|>commentary to=functions.add <|constrain|>json<|message|>{args}"
    ),
}


def test_a_forced_calls_arguments_follow_its_own_functions_schema(session) -> None:
    """With two tools, a call of one with the other's arguments is refused in every
    format; with its own, it goes through (on the real vocabulary)."""
    from localspec.server.chat import CALL_STYLE, tool_grammar

    tools = two_tools()
    target = session.target
    for fmt, call in ADD_CALLS.items():
        grammar = LlamaGrammar(target, tool_grammar(tools, fmt), style=CALL_STYLE)
        assert goes_through(grammar, target, call('{"a": 2}')), fmt
        assert not goes_through(grammar, target, call('{"city": "Paris"}')), fmt


# a patch of each kind (moved, with context, quotes, a backslash, a tab, an empty line,
# the end of a file; a deletion; an addition with an empty line), and texts that are not
PATCHES = [
    "*** Begin Patch\n*** Update File: src/app.py\n*** Move to: src/main.py\n@@ def greet():\n"
    "-    print(\"Hi\\there\")\n+\tprint('Hello')\n \n*** End of File\n"
    "*** Delete File: old.txt\n*** Add File: notes/a b.txt\n+\n+x\n*** End Patch\n",
    "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch",
]
NOT_PATCHES = [
    PATCH,  # the grammar itself, as the 1.5B wrote it where it was only shown
    "*** Begin Patch\n*** End Patch\n",  # no file
    "*** Begin Patch\n*** Add File: a.txt\n+x\n*** End of File\n*** End Patch\n",
    "*** Update File: a.py\n@@\n-x\n+y\n*** End Patch\n",  # no beginning
]
# format -> a call of apply_patch with this input, as the format writes it
PATCH_CALLS = {
    chat.HERMES: lambda text: ADD_CALLS[chat.HERMES](json.dumps({"input": text})).replace(
        '"add"', '"apply_patch"'
    ),
    chat.LLAMA3: lambda text: json.dumps({"name": "apply_patch", "parameters": {"input": text}}),
    chat.XML: lambda text: (
        f"<tool_call>\n<function=apply_patch>\n<parameter=input>\n{text}\n</parameter>\n"
        "</function>\n</tool_call>"
    ),
    chat.HARMONY: lambda text: (
        "<|channel|>commentary to=functions.apply_patch <|constrain|>json<|message|>"
        + json.dumps({"input": text})
    ),
    chat.GEMMA4: lambda text: f'<|tool_call>call:apply_patch{{input:<|"|>{text}<|"|>}}<tool_call|>',
}


def test_a_custom_tools_grammar_holds_its_input_in_each_format(session) -> None:
    """Codex's apply_patch: a forced call's input follows the tool's Lark grammar, in a
    JSON string (Qwen2.5's, Llama 3.x's, gpt-oss's calls) or as is (Qwen3.5's XML,
    between Gemma 4's string marks), on
    the real vocabulary: every patch goes through, nothing else does."""
    from localspec.server.chat import CALL_STYLE, tool_grammar
    from localspec.server.responses import ToolIn

    custom = {"type": "grammar", "syntax": "lark", "definition": PATCH}
    tools = [ToolIn(type="custom", name="apply_patch", format=custom).as_function()]
    target = session.target
    for fmt, call in PATCH_CALLS.items():
        grammar = LlamaGrammar(target, tool_grammar(tools, fmt), style=CALL_STYLE)
        for text in PATCHES:
            assert goes_through(grammar, target, call(text)), (fmt, text)
        for text in NOT_PATCHES:
            assert not goes_through(grammar, target, call(text)), (fmt, text)
    # a raw newline is no JSON (the grammar's LF is the JSON string's \n)
    raw = PATCH_CALLS[chat.HERMES](PATCHES[1]).replace("\\n", "\n")
    assert not goes_through(LlamaGrammar(target, tool_grammar(tools, chat.HERMES)), target, raw)


def test_codexs_patches_follow_apply_patchs_grammar(client: openai.OpenAI):
    """Through the Responses API, as Codex asks: the 1.5B, asked to call apply_patch
    with its grammar only shown, had copied the grammar into the input (two asks of
    three) or written End Patch before the file; held to it, each input is a patch.
    Left to choose (`auto`, what Codex sends), it writes the call in a ```json block,
    which is held too once it names the tool. Through Chat Completions (streamed, the
    tool nested as it nests tools), the same."""
    apply_patch = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool.",
        "format": {"type": "grammar", "syntax": "lark", "definition": PATCH},
    }
    forced = {"type": "custom", "name": "apply_patch"}
    hello, renew = (
        "Create hello.txt containing the line: hi",
        "Delete the file old.txt and create new.txt with the text: fresh start",
    )
    for ask, choice in ((hello, forced), (hello, "auto")):
        reply = client.responses.create(
            model="gpt-5-codex",
            input=[{"role": "user", "content": ask}],
            tools=[apply_patch],  # type: ignore[list-item]
            tool_choice=choice,  # type: ignore[arg-type]
            max_output_tokens=120,
            temperature=0,
        )
        call = reply.output[-1]
        assert reply.status == "completed" and call.type == "custom_tool_call", reply.output
        assert PATCH_FORMAT.fullmatch(call.input), call.input

    grammar = {"type": "grammar", "grammar": {"syntax": "lark", "definition": PATCH}}
    tool = {"type": "custom", "custom": {"name": "apply_patch", "format": grammar}}
    tool["custom"]["description"] = apply_patch["description"]
    pieces, names = [], []
    for chunk in client.chat.completions.create(
        model="gpt-5-codex",
        messages=[{"role": "user", "content": renew}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "custom", "custom": {"name": "apply_patch"}},
        max_tokens=120,
        temperature=0,
        stream=True,
    ):
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            custom = (delta.model_extra or {})["custom"]
            names += [custom["name"]] if "name" in custom else []
            pieces.append(custom["input"])
    assert names == ["apply_patch"] and len(pieces) > 2
    assert PATCH_FORMAT.fullmatch("".join(pieces)), pieces


# the patch format, as a regex of its own: what the grammar allows, checked apart from it
PATCH_FORMAT = re.compile(
    r"\*\*\* Begin Patch\n(?:\*\*\* Add File: .+\n(?:\+.*\n)+|\*\*\* Delete File: .+\n"
    r"|\*\*\* Update File: .+\n(?:\*\*\* Move to: .+\n)?"
    r"(?:(?:(?:@@|@@ .+|[-+ ].*)\n)+(?:\*\*\* End of File\n)?)?)+\*\*\* End Patch\n?"
)


def test_schemas_with_refs_as_pydantic_writes_them(session) -> None:
    """`$defs` and `$ref`s (pydantic's, zod's): a recursive model at the root, and two
    tools each with a definition of the same name, in a forced call of either."""
    from localspec.server.chat import CALL_STYLE, HERMES, LLAMA3, tool_grammar
    from localspec.server.schemas import Tool

    target = session.target

    def uses_addr(fields: dict) -> dict:
        addr = {"type": "object", "properties": fields, "required": list(fields)}
        return {
            "$defs": {"Addr": addr},
            "type": "object",
            "properties": {"at": {"$ref": "#/$defs/Addr"}},
            "required": ["at"],
        }

    tree = {  # pydantic's schema of `class Tree(BaseModel): label: str; kids: list["Tree"]`
        "$defs": {
            "Tree": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/Tree"}},
                },
                "required": ["label", "kids"],
            }
        },
        "$ref": "#/$defs/Tree",
    }
    answer = LlamaGrammar(target, schema_grammar(tree))
    assert goes_through(answer, target, '{"label": "a", "kids": [{"label": "b", "kids": []}]}')
    assert not goes_through(answer, target, '{"label": "a", "kids": [{"name": "b"}]}')
    # pydantic's `list[Any]` and `Any` (the converter read `items: {}` as no items at all)
    loose = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {}}, "extra": True},
        "required": ["tags", "extra"],
    }
    answer = LlamaGrammar(target, schema_grammar(loose))
    assert goes_through(answer, target, '{"tags": [1, "a", null], "extra": {"x": [true]}}')
    assert not goes_through(answer, target, '{"tags": 1, "extra": 2}')

    def tool(name: str, schema: dict) -> Tool:
        return Tool.model_validate(
            {"type": "function", "function": {"name": name, "parameters": schema}}
        )

    tools = [
        tool("visit", uses_addr({"city": {"type": "string"}})),
        tool("post", uses_addr({"street": {"type": "integer"}})),
        tool("plant", tree),
    ]
    calls = {
        HERMES: lambda name, args: (
            f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
        ),
        LLAMA3: lambda name, args: f'{{"name": "{name}", "parameters": {args}}}',
    }
    for fmt, call in calls.items():
        grammar = LlamaGrammar(target, tool_grammar(tools, fmt), style=CALL_STYLE)
        assert goes_through(grammar, target, call("visit", '{"at": {"city": "Oslo"}}')), fmt
        assert goes_through(grammar, target, call("post", '{"at": {"street": 5}}')), fmt
        assert not goes_through(grammar, target, call("post", '{"at": {"city": "Oslo"}}')), fmt
        assert goes_through(grammar, target, call("plant", '{"label": "a", "kids": []}')), fmt


FORECAST = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}


def test_a_call_the_model_opens_follows_its_tools_schema(session, client: openai.OpenAI):
    """tool_choice "auto": the answer is free until it opens a call (`<tool_call>`), then
    held to its tools' schemas, as llama-server's lazy grammar holds it. The 1.5B writes
    its calls in a ```json block, not in Qwen's tags: a bias on the tag's token makes it
    open them, and at temperature 1 it then wrote no call a tool takes in 7 of 8 seeds
    without the grammar (calls cut short, a tag in the middle of an argument)."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_forecast",
                "description": "The weather forecast for a city",
                "parameters": FORECAST,
            },
        }
    ]
    [tag] = session.target.tokenize("<tool_call>", special=True)
    asked = "What will the weather be like in Oslo for a week, in fahrenheit?"
    complete = 0
    for seed in range(6):
        reply = client.chat.completions.create(
            model="coder",
            messages=[{"role": "user", "content": asked}],
            tools=tools,  # type: ignore[list-item]
            temperature=1.0,
            seed=seed,
            max_tokens=100,
            logit_bias={str(tag): 20},
        )
        choice = reply.choices[0]
        for call in choice.message.tool_calls or []:
            assert call.function.name == "get_forecast"  # type: ignore[union-attr]
            jsonschema.validate(json.loads(call.function.arguments), FORECAST)  # type: ignore[union-attr]
            complete += 1
        if choice.finish_reason != "length":  # no call opened and left (cut short only)
            assert "<tool_call>" not in (choice.message.content or ""), choice
    assert complete >= 3, complete  # (6 and 9 in two runs here; 3 without the grammar)


def test_a_lazy_call_grammar_holds_each_formats_calls_from_their_mark(session) -> None:
    """On the real vocabulary: in each format with a call mark, text, then two calls go
    through (held from the mark), a call of one tool with the other's arguments does not,
    and text with no mark is never held; Llama 3.x's and gpt-oss's calls have no mark."""
    tools = two_tools()
    target = session.target
    for fmt in (chat.HERMES, chat.XML, chat.GEMMA4):
        call = ADD_CALLS[fmt]
        fed = lazy_feeder(target, tools, fmt)
        two, other = call('{"a": 2}') + "\n" + call('{"a": 3}'), call('{"city": "Paris"}')
        both = fed("Adding it up.\n" + two)
        assert both is not None and both.phase == "held", fmt
        assert both.allows(target.special_ids[1]), fmt  # complete: the end may come
        assert fed("Adding.\n" + other) is None, fmt
        prose = fed("No call here: <tool or <|tool, but no mark.")
        assert prose is not None and prose.phase == "watching", fmt
    assert (
        chat.lazy_tool_grammar(tools, chat.LLAMA3) is None
        and chat.lazy_tool_grammar(tools, chat.HARMONY) is None
    )


def lazy_feeder(target, tools: list[Tool], fmt: str, several: bool = True):
    """A function of a text: the state of the lazy call grammar of `tools` in `fmt`
    after it, or None where it refuses a token of it."""
    from localspec.decoding.lazy import Triggered

    lazy = chat.lazy_tool_grammar(tools, fmt, several)
    assert lazy is not None
    inner = LlamaGrammar(target, lazy.gbnf, style=chat.CALL_STYLE)
    grammar = Triggered(target, inner, lazy.trigger, reach=lazy.reach)

    def fed(text: str):
        state = grammar.start()
        for token in target.tokenize(text, special=False):
            if not state.allows(token):
                return None
            state.accept(token)
        return state

    return fed


def test_a_call_in_a_wrapper_is_held_once_it_names_a_tool(session) -> None:
    """Qwen's calls in the wrappers its parser reads as calls (a ```json block, as the
    1.5B writes them; a tag such as `<tools>`) are held from the wrapper's start once the
    object names a tool, on the real vocabulary; a block whose object names none is any
    JSON, and its text after it free."""
    target = session.target
    fed = lazy_feeder(target, two_tools(), chat.HERMES)
    fenced = '```json\n{\n  "name": "add",\n  "arguments": {ARGS}\n}\n```'
    tagged = '<tools>{"name": "add", "arguments": {ARGS}}</tools>'
    for call in (fenced, tagged):
        held = fed("To add them up:\n" + call.replace("{ARGS}", '{"a": 2}'))
        assert held is not None and held.phase == "held", call
        assert held.allows(target.special_ids[1])  # complete: the end may come
        assert fed("To add them up:\n" + call.replace("{ARGS}", '{"city": "Paris"}')) is None
        # a wrong shape after the name: refused from where the grammar holds
        assert fed(call.replace("{ARGS}", '{"a": 2}').replace('"arguments"', '"args"')) is None
    block = fed('For example:\n```json\n{"name": "Ada", "born": 1815}\n```\nThat is JSON.')
    assert block is not None and block.phase == "watching"


def test_parallel_tool_calls_false_ends_the_answer_after_one_call(session) -> None:
    """`parallel_tool_calls: false` (what Codex sends): once one call is complete, only
    the answer's end may follow (else a second call may), in each format with a mark."""
    target, end = session.target, session.target.special_ids[1]
    one = {
        chat.HERMES: ADD_CALLS[chat.HERMES]('{"a": 2}'),
        chat.XML: ADD_CALLS[chat.XML]('{"a": 2}'),
        chat.GEMMA4: ADD_CALLS[chat.GEMMA4]('{"a": 2}'),
    }
    for fmt, call in one.items():
        alone = lazy_feeder(target, two_tools(), fmt, several=False)
        done = alone("Adding:\n" + call)
        assert done is not None and done.allows(end), fmt
        assert alone("Adding:\n" + call + "\n" + call) is None, fmt
        twice = lazy_feeder(target, two_tools(), fmt)("Adding:\n" + call + "\n" + call)
        assert twice is not None and twice.allows(end), fmt


def test_required_calls_are_one_or_several_as_parallel_calls_are_allowed(session) -> None:
    """`tool_choice: "required"` holds the answer to calls: one or more in a row where
    parallel calls are allowed (OpenAI's default), one where they are not, in each
    format that writes several; Llama 3.x's and gpt-oss's answers hold one either way."""
    from localspec.server.chat import CALL_STYLE, tool_grammar

    target, tools = session.target, two_tools()
    for fmt in (chat.HERMES, chat.XML, chat.GEMMA4, chat.LLAMA3, chat.HARMONY):
        call = ADD_CALLS[fmt]('{"a": 2}')
        one, several = (
            LlamaGrammar(target, tool_grammar(tools, fmt, n), style=CALL_STYLE)
            for n in (False, True)
        )
        assert goes_through(one, target, call) and goes_through(several, target, call), fmt
        twice = call + "\n" + ADD_CALLS[fmt]('{"a": 3}')
        assert not goes_through(one, target, twice), fmt
        writes_several = fmt not in (chat.LLAMA3, chat.HARMONY)
        assert goes_through(several, target, twice) == writes_several, fmt
        assert not goes_through(several, target, call + "\nDone."), fmt  # calls only
