"""Tool calls and reasoning of the catalog's Gemma 4 and gpt-oss models, through their
chat templates' wire formats with a scripted toy model (no such model is reachable
offline): each call read back, streamed as OpenAI streams it (the name first, the
arguments in pieces), the results of a call rendered as the family reads them, and the
reasoning split out. The control tokens these formats need shown: test_tool_markers_real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from localspec.backends.toy import ASSISTANT, THINKING_TEMPLATE, ToyModel, scripted
from localspec.decoding.adaptive import auto_engine
from localspec.server.app import ServerOptions, create_app
from localspec.server.calls import GemmaCall, gemma_tool_responses
from localspec.server.chat import GEMMA4, HARMONY, ToolCallStream, tool_format
from localspec.session import Session
from localspec.thinking import GEMMA, HarmonySplit, opens_thinking
from localspec.thinking import HARMONY as HARMONY_MARKS

TEMPLATES = Path(__file__).parent.parent / "data/templates"
GEMMA_TEMPLATE = (TEMPLATES / "gemma4-wire.jinja").read_text()
HARMONY_TEMPLATE = (TEMPLATES / "gpt-oss-wire.jinja").read_text()
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
ARGUMENTS = {"city": 'Paris, "the" {old} town:\n1', "days": 3}
GEMMA_CALL = (
    'Let me check.<|tool_call>call:get_weather{city:<|"|>Paris, "the" {old} town:\n1<|"|>,'
    "days:3}<tool_call|>"
)
HARMONY_CALL = (
    "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant"
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": '
    + json.dumps(ARGUMENTS["city"])
    + ', "days": 3}'
)


def in_pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_a_gemma_call_becomes_json_in_tags_as_it_is_written(size: int):
    rewrite = GemmaCall()
    out = "".join(rewrite.push(piece) for piece in in_pieces(GEMMA_CALL, size)) + rewrite.flush()
    calls = ToolCallStream()
    content, found = calls.push(out)
    rest, more = calls.flush()
    assert content + rest == "Let me check."
    [call] = found + more
    assert call.name == "get_weather" and json.loads(call.arguments) == ARGUMENTS


def test_gemma_values_nest_and_other_text_passes():
    text = (
        'call:x <|tool_call>call:f{a:{b:[1,<|"|>x<|"|>,true],c:null},d:-2.5e3}<tool_call|>'
        "<|tool_call>call:g{}<tool_call|> done"
    )
    rewrite = GemmaCall()
    out = "".join(rewrite.push(c) for c in text) + rewrite.flush()
    calls = ToolCallStream()
    content, found = calls.push(out)
    rest, more = calls.flush()
    assert content + rest == "call:x  done"
    first, second = found + more
    assert json.loads(first.arguments) == {"a": {"b": [1, "x", True], "c": None}, "d": -2500.0}
    assert (second.name, json.loads(second.arguments)) == ("g", {})
    plain = GemmaCall()  # no call at all: every character comes back
    assert "".join(plain.push(c) for c in "a <|tool x") + plain.flush() == "a <|tool x"


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_harmony_messages_split_into_reasoning_content_and_calls(size: int):
    for answer, reasoning, content in (
        (HARMONY_CALL, "The user wants the weather.", None),
        # <|end|> as llama.cpp renders it when not shown: nothing
        (HARMONY_CALL.replace("<|end|>", ""), "The user wants the weather.", None),
        (
            "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
            "<|message|>Paris is sunny.",
            "Easy.",
            "Paris is sunny.",
        ),
    ):
        split, r, c = HarmonySplit(), "", ""
        for piece in in_pieces(answer, size):
            dr, dc = split.push(piece)
            r, c = r + dr, c + dc
        dr, dc = split.flush()
        r, c = r + dr, c + dc
        assert r == reasoning
        if content is not None:
            assert c == content
        else:
            calls = ToolCallStream()
            shown, found = calls.push(c)
            rest, more = calls.flush()
            [call] = found + more
            assert not (shown + rest).strip()
            assert call.name == "get_weather" and json.loads(call.arguments) == ARGUMENTS


def test_each_template_is_known_by_its_format_and_its_reasoning_marks():
    assert tool_format(GEMMA_TEMPLATE) == GEMMA4 and tool_format(HARMONY_TEMPLATE) == HARMONY
    gemma = opens_thinking(GEMMA_TEMPLATE, "<|turn>model\n<|channel>thought\n<channel|>")
    assert gemma is not None and gemma.marks == GEMMA and not gemma.opened
    harmony = opens_thinking(HARMONY_TEMPLATE, "<|start|>assistant")
    assert harmony is not None and harmony.marks == HARMONY_MARKS


def toy(template: str, reply="x", marker: bytes = ASSISTANT) -> ToyModel:  # reply: str | fn
    return ToyModel(scripted(reply, marker=marker), n_vocab=258, template=template)


def served(template: str, reply, marker: bytes = ASSISTANT, **variables) -> TestClient:
    session = Session(auto_engine(toy(template, reply, marker), None))
    session.template_kwargs = variables  # serve --chat-template-kwargs
    return TestClient(create_app(session, ServerOptions("toy")))


def ask(**extra) -> dict:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    request = {"model": "x", "messages": messages, "tools": [WEATHER], "max_tokens": 400}
    return request | {"temperature": 0, **extra}


def streamed(client: TestClient, request: dict) -> list[dict]:
    r = client.post("/v1/chat/completions", json={**request, "stream": True})
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("tool_calls", "stop")
    return [c["choices"][0]["delta"] for c in chunks if c["choices"]]


@pytest.mark.parametrize(
    ("template", "reply", "marker", "content", "reasoning"),
    [
        (GEMMA_TEMPLATE, GEMMA_CALL, b"<channel|>", "Let me check.", None),
        # (the marker: the generation prompt after the question, which the reply repeats)
        (HARMONY_TEMPLATE, HARMONY_CALL, b"Paris?<|end|><|start|>assistant", None, "The user"),
    ],
    ids=["gemma4", "gpt-oss"],
)
def test_a_call_round_trips_whole_and_streamed(template, reply, marker, content, reasoning):
    with served(template, reply, marker) as client:
        choice = client.post("/v1/chat/completions", json=ask()).json()["choices"][0]
        message = choice["message"]
        assert choice["finish_reason"] == "tool_calls" and message["content"] == content
        assert (message.get("reasoning_content") or "").startswith(reasoning or "")
        call = message["tool_calls"][0]["function"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == ARGUMENTS

        deltas = streamed(client, ask())
        pieces = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
        assert pieces[0]["function"]["name"] == "get_weather" and pieces[0]["id"]
        assert len(pieces) > 2  # the arguments in pieces, as written
        arguments = "".join(p["function"].get("arguments") or "" for p in pieces)
        assert json.loads(arguments) == ARGUMENTS
        shown = "".join(d.get("content") or "" for d in deltas)
        assert shown.strip() == (content or "") and "<|" not in shown
        thought = "".join(d.get("reasoning_content") or "" for d in deltas)
        assert thought.startswith(reasoning or "")

        # the call and its result go back in the family's own shapes
        history = ask()["messages"] + [
            {"role": "assistant", "content": "", "tool_calls": [message["tool_calls"][0]]},
            {
                "role": "tool",
                "tool_call_id": message["tool_calls"][0]["id"],
                "content": '{"c": 21}',
            },
        ]
        again = client.post("/v1/chat/completions", json=ask(messages=history))
        assert again.status_code == 200, again.text


def test_the_results_of_a_call_are_read_where_each_family_reads_them():
    from localspec.server.chat import template_messages
    from localspec.server.schemas import ChatRequest

    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
    ]
    messages = template_messages(ChatRequest.model_validate(ask(messages=history)).messages)
    gemma = Session(auto_engine(toy(GEMMA_TEMPLATE), None)).prompt_text(
        gemma_tool_responses(messages), [WEATHER]
    )
    assert gemma.endswith(
        '<|turn>model\n<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
        "<|tool_response>response:get_weather{celsius:21}<tool_response|>"
        "<|channel>thought\n<channel|>"
    )  # the model goes on in its own turn, after the result
    harmony = Session(auto_engine(toy(HARMONY_TEMPLATE), None)).prompt_text(messages, [WEATHER])
    assert harmony.endswith(
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":'
        ' "Paris"}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary'
        '<|message|>"{\\"celsius\\": 21}"<|end|><|start|>assistant'
    )


def test_a_harmony_answer_without_tools_is_reasoning_then_content():
    reply = (
        "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final"
        "<|message|>Hello!"
    )
    with served(HARMONY_TEMPLATE, reply, b"hi<|end|><|start|>assistant") as client:
        request = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
        body = client.post("/v1/chat/completions", json=request).json()
        message = body["choices"][0]["message"]
        assert message["content"] == "Hello!" and message["reasoning_content"] == "Simple."
        assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def test_a_chat_shows_the_next_turn_its_answers_without_their_reasoning():
    """The chat saves each answer as it streamed; gpt-oss's template refuses Harmony's
    channels in a message's content, so the next turn's prompt holds the final text."""
    from localspec.thinking import without_reasoning

    saved = (
        "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final"
        "<|message|>Hello!"
    )
    session = Session(auto_engine(toy(HARMONY_TEMPLATE), None))
    conversation = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": saved},
        {"role": "user", "content": "and?"},
    ]
    with pytest.raises(ValueError, match="channel"):
        session.prompt_text(conversation)
    shown = session.prompt_text(session.history(conversation))
    assert "<|channel|>final<|message|>Hello!<|end|><|start|>user<|message|>and?" in shown
    assert "Simple." not in shown
    for template, answer, content in (
        (GEMMA_TEMPLATE, "<|channel>thought\nHmm.<channel|>Hi!", "Hi!"),
        ("{{ '<think>' }}", "<think>\nHmm.\n</think>\n\nHi!", "Hi!"),
        ("{{ '<think>' }}", "Hmm.\n</think>\n\nHi!", "Hi!"),  # the prompt opened the block
        ("{{ messages }}", "<think>kept</think> Hi!", "<think>kept</think> Hi!"),
    ):
        assert without_reasoning(template, answer) == content


@pytest.mark.parametrize(
    ("answer", "reasoning", "content"),
    [
        ("<think>\nHmm.\n</think>\n\nHi!", "\nHmm.\n", "Hi!"),
        ("Hmm.\n</think>\n\nHi!", "Hmm.\n", "Hi!"),  # the prompt had opened the block
        ("<think>\nstill thinking", "\nstill thinking", ""),  # stopped while thinking
        ("<|channel>thought\nHmm.<channel|>Hi!", "\nHmm.", "Hi!"),
        (
            "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final"
            "<|message|>Hello!",
            "Simple.",
            "Hello!",
        ),
    ],
)
def test_a_saved_answer_splits_by_its_own_marks(answer, reasoning, content):
    """The chat shows a saved answer without its template at hand (tui.widgets)."""
    from localspec.thinking import split_answer, written_thinking

    thinking = written_thinking(answer)
    assert thinking is not None
    assert split_answer(thinking, answer) == (reasoning, content)
    assert written_thinking("Plain, with think and channel words.") is None


def test_the_chat_template_gets_the_servers_and_the_requests_variables():
    """llama-server's and vLLM's `chat_template_kwargs`, OpenAI's `reasoning_effort`
    (which gpt-oss's template reads), and `serve --chat-template-kwargs` beneath them."""
    effort = (
        "{% if reasoning_effort is defined %}<|system|>effort {{ reasoning_effort }}\n{% endif %}"
    )

    def echo(prompt: bytes) -> str:
        said = prompt.split(b"effort ")
        return "effort " + (said[1].split(b"\n")[0].decode() if len(said) > 1 else "none")

    def answer(client: TestClient, **extra) -> str:
        r = client.post("/v1/chat/completions", json=ask(tools=None, **extra))
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    with served(effort + THINKING_TEMPLATE, echo) as client:
        assert answer(client) == "effort none"
        assert answer(client, reasoning_effort="high") == "effort high"
        assert answer(client, chat_template_kwargs={"reasoning_effort": "low"}) == "effort low"
    with served(effort + THINKING_TEMPLATE, echo, reasoning_effort="medium") as client:
        assert answer(client) == "effort medium"
        assert answer(client, reasoning_effort="high") == "effort high"  # the request's wins
        r = client.post(
            "/v1/chat/completions", json=ask(tools=None, chat_template_kwargs={"messages": []})
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"
        assert "messages" in r.json()["error"]["message"]


def test_thinking_turned_off_by_the_template_and_reasoning_left_in_the_content():
    plain = ask(tools=None)
    with served(THINKING_TEMPLATE, "<think>\nHmm.\n</think>\n\nHi!") as client:
        message = client.post("/v1/chat/completions", json=plain).json()["choices"][0]["message"]
        assert (message["content"], message["reasoning_content"].strip()) == ("Hi!", "Hmm.")
        r = client.post("/v1/chat/completions", json=plain | {"reasoning_format": "none"})
        assert r.json()["choices"][0]["message"]["content"] == "<think>\nHmm.\n</think>\n\nHi!"
    # Qwen3's template writes an empty block where thinking is off; the model goes on after
    with served(THINKING_TEMPLATE, "<think>\n\n</think>\n\nHi!") as client:
        off = {"chat_template_kwargs": {"enable_thinking": False}}
        r = client.post("/v1/chat/completions", json=plain | off)
        assert r.json()["choices"][0]["message"]["content"] == "Hi!"
        assert r.json()["usage"]["completion_tokens"] == len("Hi!")  # the block is the prompt's
        # OpenAI's reasoning_effort "none" turns it off too, as in llama-server
        r = client.post("/v1/chat/completions", json=plain | {"reasoning_effort": "none"})
        assert r.json()["usage"]["completion_tokens"] == len("Hi!")
        r = client.post("/v1/chat/completions", json=plain | {"reasoning_effort": "low"})
        assert r.json()["usage"]["completion_tokens"] > len("Hi!")  # the model wrote the block
    # serve --reasoning off: every request's default, which a request may turn back on
    with served(THINKING_TEMPLATE, "<think>\n\n</think>\n\nHi!", enable_thinking=False) as client:
        r = client.post("/v1/chat/completions", json=plain)
        assert r.json()["usage"]["completion_tokens"] == len("Hi!")
        on = {"chat_template_kwargs": {"enable_thinking": True}}
        r = client.post("/v1/chat/completions", json=plain | on)
        assert r.json()["usage"]["completion_tokens"] > len("Hi!")


@pytest.mark.parametrize(
    ("template", "switch", "off", "on"),
    [
        ("gemma4-wire.jinja", True, None, None),  # it thinks only when asked
        ("gpt-oss-wire.jinja", False, "no switch for thinking: it thinks anyway", None),
        ("Qwen3-Coder.jinja", False, "does not think", "does not think"),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", False, "does not think", "does not think"),
    ],
)
def test_which_templates_switch_thinking(template, switch, off, on):
    """`--reasoning`'s switch, `enable_thinking`, read from the families' own templates,
    and the line said where it has nothing to switch."""
    session = Session(auto_engine(toy((TEMPLATES / template).read_text()), None))
    assert session.thinking_switch is switch
    for value, words in (("off", off), ("on", on)):
        said = session.switch_note(value)
        assert said is None if words is None else words in (said or ""), (value, said)


QWEN35_TEMPLATE = (TEMPLATES / "qwen3.5-wire.jinja").read_text()


def test_reasoning_sent_back_reaches_the_template_for_the_task_in_progress():
    """OpenAI's `reasoning_content`, Anthropic's thinking blocks and the Responses API's
    reasoning items go back to the template, as llama-server passes them: Qwen3.5's keeps
    them after the last message from the user (the model sees what it thought before
    each call of the task in progress) and drops the earlier ones."""
    from localspec.server.anthropic import MessagesRequest
    from localspec.server.prepare import render_chat
    from localspec.server.responses import ResponsesRequest
    from localspec.server.schemas import ChatRequest

    session = Session(auto_engine(ToyModel(scripted("ok"), template=QWEN35_TEMPLATE), None))
    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    openai = {
        "messages": [
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Hello.", "reasoning_content": "A greeting."},
            {"role": "user", "content": "Fix a.py."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call],
                "reasoning_content": "Read it.",
            },
            {"role": "tool", "tool_call_id": "c1", "content": "x = 1"},
        ]
    }
    thinking = [{"type": "thinking", "thinking": "Read it.", "signature": "s"}]
    anthropic = {
        "model": "x",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "Hi."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "A greeting."},
                    {"type": "text", "text": "Hello."},
                ],
            },
            {"role": "user", "content": "Fix a.py."},
            {
                "role": "assistant",
                "content": [
                    *thinking,
                    {"type": "tool_use", "id": "c1", "name": "read", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "x = 1"}],
            },
        ],
    }
    reasoning = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "Read it."}],
    }
    responses = {
        "input": [
            {"role": "user", "content": "Hi."},
            {**reasoning, "content": [{"type": "reasoning_text", "text": "A greeting."}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
            {"role": "user", "content": "Fix a.py."},
            reasoning,
            {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "x = 1"},
        ]
    }
    chats = (
        ChatRequest.model_validate(openai),
        MessagesRequest.model_validate(anthropic).chat(),
        ResponsesRequest.model_validate(responses).chat(),
    )
    prompts = [render_chat(chat, session).text for chat in chats]
    task = "<|im_start|>assistant\n<think>\nRead it.\n</think>\n\n<tool_call>\n<function=read>"
    assert task in prompts[0] and "A greeting." not in prompts[0]
    assert prompts[1] == prompts[2] == prompts[0]


def test_gpt_oss_reads_the_reasoning_sent_back_with_a_call_as_its_analysis():
    """As llama.cpp passes it: `thinking` beside a call, the analysis message before it;
    a call's message with content too keeps its content there (gpt-oss's template refuses
    both)."""
    from localspec.server.chat import template_messages
    from localspec.server.schemas import ChatRequest

    session = Session(auto_engine(toy(HARMONY_TEMPLATE), None))
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    for content, analysis in (("", "It needs the weather."), ("Checking.", "Checking.")):
        history = [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [call],
                "reasoning_content": "It needs the weather.",
            },
            {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
        ]
        messages = template_messages(ChatRequest.model_validate({"messages": history}).messages)
        prompt = session.prompt_text(messages, [WEATHER])
        assert f"<|channel|>analysis<|message|>{analysis}<|end|><|start|>assistant to=" in prompt
