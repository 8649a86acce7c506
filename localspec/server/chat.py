"""OpenAI chat messages and tools to what a chat template reads, and tool calls back.

Templates that support tools write a call one of five ways (`tool_format`): Qwen2.5's
and Hermes' as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in the answer;
Qwen3-Coder's and Qwen3.5's as XML in the same tags, `<function=NAME>` and a
`<parameter=KEY>` block of raw text for each argument (typed back by the tool's schema);
Llama 3.x's as the whole answer, `{"name": ..., "parameters": {...}}`, or for Meta's
built-in tools `<|python_tag|>brave_search.call(query="...")`; Gemma 4's as
`<|tool_call>call:NAME{key:<|"|>text<|"|>}<tool_call|>`; gpt-oss's as a Harmony message
addressed to the function. The last three are rewritten into the first shape as they
are written (`localspec.server.calls`, `thinking.HarmonySplit`). `ToolCallStream` splits
calls out of the answer, holding back text that may be the start of one, as stop
strings are held back; `ToolCallDeltas` streams them as OpenAI does: each call's id and
name as soon as the name is written, then its arguments in pieces as they are written.
`tool_choice: "required"` or a named function is a grammar in the model's own format
(`tool_grammar`): the target can write nothing else, and nothing of another family's
format is put into its prompt.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from localspec.decoding.schema_refs import has_local_refs, rebased
from localspec.server.errors import ApiError
from localspec.server.schemas import ChatMessageIn, ChatRequest, Tool, content_text
from localspec.thinking import CALL_CLOSE, CALL_OPEN, held_prefix

OPEN, CLOSE = CALL_OPEN, CALL_CLOSE
GEMMA_OPEN = "<|tool_call>call:"  # Gemma 4's call: the name, then its arguments object
CALL_GAP = "[ \\t\\n]{0,4}"  # GBNF: what may come between two calls in a row


def template_messages(messages: list[ChatMessageIn]) -> list[dict[str, Any]]:
    """Messages as chat templates read them: text content; an assistant's tool calls
    with their arguments as objects (templates write them out with `tojson`), and its
    reasoning where the client sent it back (Qwen3's and Qwen3.5's templates keep it
    after the last message from the user, gpt-oss's beside a call: the model sees what
    it thought before each call of the task in progress, as llama-server shows it)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        message: dict[str, Any] = {
            "role": "system" if m.role == "developer" else m.role,
            "content": content_text(m.content),
        }
        if m.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": loads_or_text(call.function.arguments),
                    },
                }
                for call in m.tool_calls
            ]
        if m.reasoning_content and m.role == "assistant":
            message["reasoning_content"] = m.reasoning_content
            # gpt-oss's template reads it as `thinking` beside a call, as llama.cpp passes
            # it, and refuses a call's message with both that and content
            if m.tool_calls and not message["content"]:
                message["thinking"] = m.reasoning_content
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        if m.name:
            message["name"] = m.name
        out.append(message)
    return out


def prefill(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """An assistant message that ends the conversation is an answer begun for the model
    to continue (a prefill, as llama-server and Anthropic's API read it): the messages
    before it and its text; None where the conversation ends otherwise. An assistant
    turn with tool calls is a whole turn, not a beginning."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return messages, None
    return messages[:-1], last.get("content") or ""


def loads_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def template_tools(request: ChatRequest, supports_tools: bool) -> list[dict[str, Any]] | None:
    """The tools to render, None for none; a 400 where the template has no place for them."""
    if not request.tools or request.tool_choice == "none":
        return None
    if not supports_tools:
        raise ApiError(400, "this model's chat template does not support tools", "tools")
    return [tool.model_dump(exclude_none=True) for tool in request.tools]


HERMES, XML, LLAMA3, GEMMA4, HARMONY = "hermes", "xml", "llama3", "gemma4", "harmony"
# how both formats' templates space a call's JSON, for the grammar's guesses of it
CALL_STYLE = b'{"name": "f", "arguments": {"a": 1, "b": [2, {"c": 3}]}}'


def tool_format(template: str | None) -> str:
    """How a chat template has the model write a tool call: HERMES (Qwen2.5/3, Hermes:
    tagged calls within the answer), XML (Qwen3-Coder, Qwen3.5), LLAMA3 (Llama 3.x: the
    answer is the call), GEMMA4 (`<|tool_call>call:NAME{...}`) or HARMONY (gpt-oss: a
    message addressed to the function)."""
    text = template or ""
    if GEMMA_OPEN in text:
        return GEMMA4
    if "<|channel|>" in text:
        return HARMONY
    if "<function=" in text:
        return XML
    if OPEN in text:
        return HERMES
    if "<|python_tag|>" in text or '"parameters": ' in text:
        return LLAMA3
    return HERMES


def forced_tools(request: ChatRequest) -> list[Tool] | None:
    """The tools the answer must call one of (`tool_choice` "required" or a named
    function), None where it may answer in text; a 400 for a name not among the tools."""
    choice, tools = request.tool_choice, request.tools or []
    if choice is None or isinstance(choice, str):
        return tools if choice == "required" and tools else None
    named = [t for t in tools if t.function.name == choice.function.name]
    if not named:
        raise ApiError(
            400, f"tool_choice names {choice.function.name!r}, not among the tools", "tool_choice"
        )
    return named


def call_schema(tools: list[Tool], fmt: str, inputs: Collection[int] = ()) -> dict[str, Any]:
    """A JSON schema of one call of any of `tools`, in the keys `fmt` writes: the name
    first (streaming sends it first), then the arguments the function's schema allows
    (the `inputs` tools': their input's place, which `with_inputs` fills)."""
    key = "parameters" if fmt == LLAMA3 else "arguments"
    calls, homes = [], {}
    for i, tool in enumerate(tools):
        params = input_schema(i) if i in inputs else tool.function.parameters or {"type": "object"}
        if has_local_refs(params):  # "#/$defs/X" meant its own root: it gets one of its own
            home = f"tool-{i}-parameters"
            homes[home] = rebased(params, f"#/$defs/{home}")
            params = {"$ref": f"#/$defs/{home}"}
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool.function.name}, key: params},
                "required": ["name", key],
                "additionalProperties": False,
            }
        )
    schema = calls[0] if len(calls) == 1 else {"oneOf": calls}
    return {**schema, "$defs": homes} if homes else schema


def tool_grammar(tools: list[Tool], fmt: str, several: bool = False) -> str:
    """GBNF for an answer that is one call of any of `tools`, written as `fmt` writes it
    (GrammarError for a function schema the converter cannot take); `several`: one or
    more in a row, where the format writes several (`tool_choice` "required" with
    `parallel_tool_calls`; Llama 3.x's and gpt-oss's answers hold one)."""
    from localspec.backends.llama_grammar import schema_grammar

    if fmt == XML:
        one = xml_call_grammar(tools)
    elif fmt in (GEMMA4, HARMONY):
        from localspec.server.calls import gemma_call_grammar, harmony_call_grammar

        one = gemma_call_grammar(tools) if fmt == GEMMA4 else harmony_call_grammar(tools)
    elif fmt == LLAMA3:
        inputs = held_inputs(tools, json_string=True)
        return with_inputs(schema_grammar(call_schema(tools, fmt, inputs)), inputs)
    else:
        one = f'root ::= "{OPEN}\\n" tool-call "\\n{CLOSE}"\n{tagged_call(tools)}'
    if not several or fmt == HARMONY:
        return one
    return f"root ::= one-call ({CALL_GAP} one-call)*\n{renamed_root(one, 'one-call')}"


def renamed_root(gbnf: str, name: str) -> str:
    """`gbnf` with its root rule called `name` (to go inside another root)."""
    return re.sub(r"^root ::=", f"{name} ::=", gbnf, count=1, flags=re.M)


def tagged_call(tools: list[Tool]) -> str:
    """GBNF rules of a Qwen call's object (`tool-call`), to go inside its tags."""
    from localspec.backends.llama_grammar import schema_grammar

    inputs = held_inputs(tools, json_string=True)
    gbnf = with_inputs(schema_grammar(call_schema(tools, HERMES, inputs)), inputs)
    return re.sub(r"^root ::=", "tool-call ::=", gbnf, count=1, flags=re.M)


def held_inputs(tools: list[Tool], json_string: bool) -> dict[int, str]:
    """By a custom tool's index, GBNF rules (`input-{i}-root`) of the text its grammar
    allows, where GBNF can hold that grammar (as is, or as a JSON string's characters)."""
    from localspec.server.lark_gbnf import input_gbnf

    held = {}
    for i, tool in enumerate(tools):
        if tool._input_grammar is not None:
            gbnf = input_gbnf(*tool._input_grammar, f"input-{i}-", json_string)
            if gbnf is not None:
                held[i] = gbnf
    return held


def input_schema(i: int) -> dict[str, Any]:
    """A held input's arguments, its string a constant that marks its place."""
    marker = {"const": input_marker(i)}
    return {"type": "object", "properties": {"input": marker}, "required": ["input"]}


def input_marker(i: int) -> str:
    return f"localspecinput{i}"


def with_inputs(gbnf: str, inputs: dict[int, str]) -> str:
    """`gbnf` (of `input_schema`s) with each held input's string its grammar's text."""
    for i, rules in inputs.items():
        marker = json.dumps(json.dumps(input_marker(i)))  # the constant, in GBNF
        gbnf = gbnf.replace(marker, f'"\\"" input-{i}-root "\\""') + rules
    return gbnf


class LazyCalls(NamedTuple):
    """The calls an answer makes once it opens one: their GBNF, what opens one (a mark,
    or a pattern whose matches are at most `reach` bytes long)."""

    gbnf: str
    trigger: bytes | re.Pattern[bytes]
    reach: int = 0


def lazy_tool_grammar(tools: list[Tool], fmt: str, several: bool = True) -> LazyCalls | None:
    """GBNF of the calls an answer makes once it opens one (`tool_choice` "auto", as
    llama-server's lazy grammar: localspec.decoding.lazy), several in a row (or one, then
    the answer ends: `parallel_tool_calls` false), and the mark
    that opens one; None for a format whose calls open with no mark of their own (Llama
    3.x's bare JSON, gpt-oss's messages). Qwen's tags may hold spaces as they please.
    Qwen's calls in the other wrappers its parser reads (`calls.WrappedCall`: a ```json
    block, as the 1.5B writes them, or a tag such as `<tools>`) are held too, once their
    object names a tool: before that, a block may be any JSON."""
    if fmt not in (HERMES, XML, GEMMA4):
        return None
    spaces = CALL_GAP
    root = f"root ::= lazy-call ({spaces} lazy-call)*" if several else "root ::= lazy-call"
    if fmt in (XML, GEMMA4):
        one = renamed_root(tool_grammar(tools, fmt), "lazy-call")
        mark = OPEN if fmt == XML else GEMMA_OPEN.split("call:")[0]
        return LazyCalls(f"{root}\n{one}", mark.encode())
    from localspec.server.calls import WRAP_TAGS

    gap = "[ \\t\\n]{0,8}"
    wrapped = [f'"```" "json"? [ \\t]{{0,4}} "\\n" {gap} tool-call {gap} "```"'] + [
        f'"{tag}" {gap} tool-call {gap} "</{tag[1:]}"' for tag in WRAP_TAGS
    ]
    one = f'"{OPEN}" {spaces} tool-call {spaces} "{CLOSE}" | {" | ".join(wrapped)}'
    names = [json.dumps(t.function.name)[1:-1].encode() for t in tools]
    opens = b"|".join([rb"```(?:json)?[ \t]{0,4}\n", *(re.escape(t.encode()) for t in WRAP_TAGS)])
    named = rb'[ \t\n]{0,8}\{[ \t\n]{0,8}"name"[ \t\n]{0,4}:[ \t\n]{0,4}"(?:%s)"' % b"|".join(
        re.escape(n) for n in names
    )
    trigger = re.compile(re.escape(OPEN.encode()) + b"|(?:" + opens + b")" + named)
    gbnf = f"{root}\nlazy-call ::= {one}\n{tagged_call(tools)}"
    return LazyCalls(gbnf, trigger, 64 + max(map(len, names), default=0))


def xml_call_grammar(tools: list[Tool]) -> str:
    """GBNF of one XML call: a function's name, then any of its parameters, each a block
    of text that does not hold `</` (where the parameter block would end)."""
    calls, rules = [], []
    inputs = held_inputs(tools, json_string=False)
    for i, tool in enumerate(tools):
        keys = list(((tool.function.parameters or {}).get("properties") or {}).keys())
        key = " | ".join(json.dumps(k) for k in keys) or "[a-zA-Z0-9_]+"
        name = json.dumps(f"<function={tool.function.name}>\n")
        if i in inputs:  # a custom tool's one parameter, as its grammar allows
            param = f'"<parameter=input>\\n" input-{i}-root "\\n</parameter>\\n"'
            rules += [f"call-{i} ::= {name} {param}", inputs[i].rstrip("\n")]
        else:
            param = f'"<parameter=" key-{i} ">\\n" value "\\n</parameter>\\n"'
            rules += [f"call-{i} ::= {name} ({param})*", f"key-{i} ::= {key}"]
        calls.append(f"call-{i}")
    return "\n".join(
        [
            f'root ::= "{OPEN}\\n" ({" | ".join(calls)}) "</function>\\n{CLOSE}"',
            *rules,
            'value ::= ([^<] | "<" [^/])*',
        ]
    )


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def as_dict(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


def parse_call(body: str, params: dict[str, Any] | None = None) -> ToolCall | None:
    """The call inside `<tool_call>...</tool_call>` (JSON, or XML typed by `params`, the
    tools' parameter schemas by name), or None where it is not one."""
    if XML_HEAD.match(body):
        return parse_xml_call(body, params or {})
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", data.get("parameters")) or {}  # null and "" as no arguments
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", data["name"], text)


XML_HEAD = re.compile(r"\s*<function=([^>\n]+)>")
XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def parse_xml_call(body: str, params: dict[str, Any]) -> ToolCall | None:
    """`<function=NAME>` and its `<parameter=KEY>` blocks; a value goes back to JSON by its
    schema's type (text for a string or an unknown key, as Qwen's own parser does)."""
    head = XML_HEAD.match(body)
    if head is None or "</function>" not in body:
        return None
    name = head.group(1).strip()
    schema = ((params.get(name) or {}).get("properties")) or {}
    arguments = {
        key.strip(): typed(value, schema.get(key.strip(), {}))
        for key, value in XML_PARAMETER.findall(body[head.end() :])
    }
    text = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", name, text)


def typed(value: str, schema: dict[str, Any]) -> Any:
    """A parameter's text as its schema's type: JSON where that is not a string and the
    text parses, else the text."""
    kind = schema.get("type")
    if kind == "string" or (kind is None and not value.strip().startswith(("{", "["))):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


@dataclass
class ToolCallStream:
    """Feed the answer's text as it streams; get back the content to show and the tool
    calls completed so far. A call that does not parse is shown as text."""

    params: dict[str, Any] = field(default_factory=dict)  # parameter schemas by name (XML)
    _held: str = ""
    _in_call: bool = False
    calls: list[ToolCall] = field(default_factory=list)

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        self._held += text
        content, calls = "", list[ToolCall]()
        while True:
            if self._in_call:
                end = self._held.find(CLOSE)
                if end < 0:
                    return content, calls
                body, self._held = self._held[:end], self._held[end + len(CLOSE) :]
                self._in_call = False
                call = parse_call(body, self.params)
                if call is None:
                    content += OPEN + body + CLOSE
                else:
                    calls.append(call)
                    self.calls.append(call)
                continue
            start = self._held.find(OPEN)
            if start >= 0:
                content += self._held[:start]
                self._held = self._held[start + len(OPEN) :]
                self._in_call = True
                continue
            keep = held_prefix(self._held)
            content += self._held[: len(self._held) - keep]
            self._held = self._held[len(self._held) - keep :]
            return content, calls

    def flush(self) -> tuple[str, list[ToolCall]]:
        """The end of the answer: an unclosed call counts if it parses, else it is text."""
        held, self._held = self._held, ""
        if not self._in_call:
            return held, []
        self._in_call = False
        call = parse_call(held, self.params)
        if call is None:
            return OPEN + held, []
        self.calls.append(call)
        return "", [call]


# a call's head as Qwen's and Hermes' templates have it written: its name, then its
# arguments object
HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*\{'
)


@dataclass
class JsonDepth:
    """How deep a JSON text is in its objects and arrays, read a character at a time;
    braces and brackets inside strings do not count."""

    depth: int = 0
    _in_string: bool = False
    _escaped: bool = False

    def step(self, c: str) -> int:
        """The depth after `c` (below 0: `c` closed what the text did not open)."""
        if self._escaped:
            self._escaped = False
        elif self._in_string:
            self._escaped, self._in_string = c == "\\", c != '"'
        elif c == '"':
            self._in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
        return self.depth


@dataclass
class ToolCallDeltas:
    """Feed the streamed answer's text; get OpenAI's chunk deltas back: `content`, and
    for each call first `{index, id, type, function: {name, arguments: ""}}` once its
    name is written, then `{index, function: {arguments: piece}}` as the arguments
    object is written (its end found by depth, outside strings). A call written another
    way (the arguments first, or not an object) goes out whole at its close, one that
    does not parse as text; an XML call, its name as soon as it is written and its
    arguments (typed by `params`) at its close. `calls` counts the calls begun."""

    params: dict[str, Any] = field(default_factory=dict)  # parameter schemas by name (XML)
    _held: str = ""
    _body: str | None = None  # the open call's text so far (None: outside a call)
    _sent: int = 0  # how much of the body's arguments went out
    _json: JsonDepth = field(default_factory=JsonDepth)  # of the arguments
    _started: bool = False
    _done: bool = False  # the arguments object closed
    _xml: bool = False  # the open call is XML: its arguments go at its close
    calls: int = 0

    def push(self, text: str) -> list[dict[str, Any]]:
        self._held += text
        out: list[dict[str, Any]] = []
        while True:
            if self._body is None:
                start = self._held.find(OPEN)
                if start < 0:
                    keep = held_prefix(self._held)
                    shown, self._held = (
                        self._held[: len(self._held) - keep],
                        self._held[len(self._held) - keep :],
                    )
                    return out + ([{"content": shown}] if shown else [])
                if start:
                    out.append({"content": self._held[:start]})
                self._held = self._held[start + len(OPEN) :]
                self._open()
                continue
            end = self._held.find(CLOSE)
            upto = end if end >= 0 else len(self._held) - held_prefix(self._held, CLOSE)
            self._body += self._held[:upto]
            self._held = self._held[upto:]
            out += self._advance()
            if end < 0:
                return out
            self._held = self._held[len(CLOSE) :]
            out += self._close()

    def flush(self) -> list[dict[str, Any]]:
        """The end of the answer: an unclosed call ends here."""
        if self._body is None:
            held, self._held = self._held, ""
            return [{"content": held}] if held else []
        self._body += self._held
        self._held = ""
        return self._advance() + self._close(closed=False)

    def _open(self) -> None:
        self._body, self._sent, self._json = "", 0, JsonDepth()
        self._started = self._done = self._xml = False

    def _advance(self) -> list[dict[str, Any]]:
        assert self._body is not None
        out: list[dict[str, Any]] = []
        if not self._started and (xml := XML_HEAD.match(self._body)):
            self._started = self._xml = self._done = True
            call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function"}
            function = {"name": xml.group(1).strip(), "arguments": ""}
            out.append({"tool_calls": [{"index": self.calls, **call, "function": function}]})
            self.calls += 1
        if not self._started:
            head = HEAD.match(self._body)
            if head is None:
                return out
            self._started, self._sent = True, head.end() - 1  # from the arguments' "{"
            call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function"}
            function = {"name": json.loads(head.group(1)), "arguments": ""}
            out.append({"tool_calls": [{"index": self.calls, **call, "function": function}]})
            self.calls += 1
        if self._done:
            return out
        end = self._sent
        for i in range(self._sent, len(self._body)):
            end = i + 1
            if self._json.step(self._body[i]) == 0:
                self._done = True
                break
        piece, self._sent = self._body[self._sent : end], end
        if piece:
            out.append(
                {"tool_calls": [{"index": self.calls - 1, "function": {"arguments": piece}}]}
            )
        return out

    def _close(self, closed: bool = True) -> list[dict[str, Any]]:
        """The call's end: its close tag, or the answer's end (`closed` False: a call cut
        by max_tokens, whose text goes out as it was written, with no tag added)."""
        body, self._body = self._body or "", None
        if self._xml:  # its arguments, whole: they are JSON only once typed
            parsed = parse_xml_call(body, self.params)
            arguments = parsed.arguments if parsed else "{}"
            return [
                {"tool_calls": [{"index": self.calls - 1, "function": {"arguments": arguments}}]}
            ]
        if self._started:
            return []
        call = parse_call(body, self.params)
        if call is None:
            return [{"content": OPEN + body + (CLOSE if closed else "")}]
        self.calls += 1
        return [{"tool_calls": [call.as_dict(self.calls - 1)]}]
