"""Tool calls written other than as JSON in tags, turned into Qwen's tags as they are
written, so that one parser reads every family and streams the arguments (`rewriter`):
Llama 3.x's bare JSON and built-in tools' calls (`BareCall`) and Gemma 4's calls
(`GemmaCall`); gpt-oss's Harmony
messages go the same way through `thinking.HarmonySplit`. Also what these families need
around a call: Gemma 4's template reads a call's results from the calling message
(`gemma_tool_responses`), their control tokens must show in the text (`MARKERS`), and a
forced call is a grammar in their own syntax (`gemma_call_grammar`,
`harmony_call_grammar`).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from localspec.server.chat import (
    CLOSE,
    GEMMA4,
    GEMMA_OPEN,
    HERMES,
    LLAMA3,
    OPEN,
    JsonDepth,
    held_inputs,
    input_schema,
    loads_or_text,
    with_inputs,
)
from localspec.server.schemas import Tool
from localspec.thinking import CONTROL_MARKS, HARMONY_ANALYSIS, HARMONY_THOUGHT, held_prefix

GEMMA_CLOSE, QUOTE = "<tool_call|>", '<|"|>'  # a call's end; a string's both ends
# control tokens a format's parser reads, shown in the text where the template has them
# (Gemma 4's call marks, and the reasoning marks: its thought block's, Harmony's message
# end; llama.cpp already renders Harmony's <|channel|>, <|message|>, <|start|> and
# <|constrain|>)
MARKERS = ("<|tool_call>", GEMMA_CLOSE, QUOTE, *CONTROL_MARKS)


class Rewriter(Protocol):
    def push(self, text: str) -> str: ...

    def flush(self) -> str: ...


def rewriter(
    fmt: str | None, tools: Iterable[str] = (), after_result: bool = False
) -> Rewriter | None:
    """What turns `fmt`'s calls of the request's `tools` (their names) into Qwen's tags
    (None: they are written so). `after_result`: the answer follows a tool's result,
    where a call in doubled braces is the 1.5B echoing the call it made (DoubledCall)."""
    if fmt == LLAMA3:
        return BareCall.for_tools(tools)
    if fmt == GEMMA4:
        return GemmaCall()
    if fmt == HERMES:
        names = tuple(tools)
        wrapped = WrappedCall(names)
        return Chain(wrapped if after_result else Chain(wrapped, DoubledCall(names)), SplitCalls())
    return None


@dataclass
class Chain:
    """Two rewriters, the second reading what the first writes."""

    first: Rewriter
    second: Rewriter

    def push(self, text: str) -> str:
        return self.second.push(self.first.push(text))

    def flush(self) -> str:
        return self.second.push(self.first.flush()) + self.second.flush()


def shown_markers(template: str | None, fmt: str | None = None) -> list[str]:
    """The markers the answer shows: its format's (Llama 3.x's python tag only where the
    request has tools: it says a call follows)."""
    text = template or ""
    llama = [PYTHON_TAG] if fmt == LLAMA3 and PYTHON_TAG in text else []
    return [m for m in MARKERS if m in text] + llama


@dataclass
class GemmaCall:
    """Gemma 4's calls, `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>`
    (bare keys, strings between `<|"|>` marks, JSON's numbers, literals, objects and
    arrays), as `<tool_call>{"name": "NAME", "arguments": {"key": "text", "n": 3}}
    </tool_call>`, converted as they are written; other text passes as it is."""

    _held: str = ""
    _state: Literal["text", "name", "arguments"] = "text"
    _name: str = ""
    _open: list[str] = field(default_factory=list)  # the arguments' open "{" and "["
    _in_string: bool = False
    _at_key: bool = False

    def push(self, text: str) -> str:
        self._held += text
        out = ""
        while True:
            if self._state == "text":
                at = self._held.find(GEMMA_OPEN)
                if at < 0:
                    keep = held_prefix(self._held, GEMMA_OPEN)
                    cut = len(self._held) - keep
                    out, self._held = out + self._held[:cut], self._held[cut:]
                    return out
                out += self._held[:at]
                self._held, self._state, self._name = self._held[at + len(GEMMA_OPEN) :], "name", ""
            elif self._state == "name":
                at = self._held.find("{")
                if at < 0:
                    self._name, self._held = self._name + self._held, ""
                    return out
                self._name += self._held[:at]
                self._held, self._state = self._held[at:], "arguments"
                self._open, self._in_string, self._at_key = [], False, False
                out += f'{OPEN}{{"name": {json.dumps(self._name.strip())}, "arguments": '
            else:
                converted, done = self._convert()
                out += converted
                if not done:
                    return out

    def flush(self) -> str:
        """The end of the answer: an unclosed call closes here."""
        if self._state == "text":
            held, self._held = self._held, ""
            return held
        if self._state == "name":
            self._state, held, self._held = "text", self._held, ""
            return GEMMA_OPEN + self._name + held
        converted, _ = self._convert()
        self._state, held, self._held = "text", self._held, ""
        return converted + held + "}" + CLOSE

    def _convert(self) -> tuple[str, bool]:
        """The arguments held so far as JSON, up to what may be part of a mark or a key;
        True once the call's end was read."""
        text, out, i = self._held, [], 0
        while i < len(text):
            rest = text[i:]
            if rest.startswith(QUOTE):
                self._in_string = not self._in_string
                out.append('"')
                i += len(QUOTE)
                continue
            if not self._in_string and rest.startswith(GEMMA_CLOSE):
                self._held, self._state = text[i + len(GEMMA_CLOSE) :], "text"
                return "".join(out) + "}" + CLOSE, True
            if QUOTE.startswith(rest) or (not self._in_string and GEMMA_CLOSE.startswith(rest)):
                break  # part of a mark: wait for the rest
            if self._in_string:
                out.append(json.dumps(text[i])[1:-1])
            elif self._at_key and not text[i].isspace() and text[i] != "}":
                colon = text.find(":", i)
                if colon < 0:
                    break  # the key goes on
                out.append(json.dumps(text[i:colon].strip()))
                self._at_key, i = False, colon
                continue
            else:
                ch = text[i]
                if ch in "{[":
                    self._open.append(ch)
                elif ch in "}]" and self._open:
                    self._open.pop()
                self._at_key = ch == "{" or (ch == "," and self._open[-1:] == ["{"])
                out.append(ch)
            i += 1
        self._held = text[i:]
        return "".join(out), False


PYTHON_TAG = "<|python_tag|>"  # Llama 3.x: what follows is for the tool environment
# Meta's built-in tools, by the names llama-server knows them by: a request's tools of
# these names reach Llama 3.x's template as `builtin_tools`, and the model calls them as
# `<|python_tag|>NAME.call(key="value")`, or writes code after the tag (the code tools)
LLAMA_BUILTINS = ("brave_search", "web_search", "wolfram_alpha", "python", "code_interpreter")
CODE_TOOLS = ("python", "code_interpreter")


def llama_builtins(names: Iterable[str]) -> list[str]:
    """The request's tools that Llama 3.x's template knows as built-in."""
    return [name for name in names if name in LLAMA_BUILTINS]


@dataclass
class BareCall:
    """Llama 3.x's calls as Qwen's tags around JSON, so one parser reads both: the whole
    answer is `{"name": ..., "parameters": ...}` (after `<|python_tag|>` or not), held
    until that is sure, then passed on inside `<tool_call>` as it is written; with
    built-in tools, `<|python_tag|>brave_search.call(query="...")` (held to its end:
    Python's own parser reads it) or code after the tag, a call of the code tool whose
    `code` streams as it is written. Any other answer passes as it is (the tag left out)."""

    builtins: tuple[str, ...] = ()  # the request's built-in tools, called NAME.call(...)
    code_tool: str | None = None  # the request's tool that code after the tag calls
    _held: str = ""
    _mode: Literal["open", "text", "json", "builtin", "code"] = "open"  # open: not known

    @classmethod
    def for_tools(cls, names: Iterable[str]) -> BareCall:
        builtins = tuple(llama_builtins(names))
        code = next((name for name in builtins if name in CODE_TOOLS), None)
        return cls(builtins, code)

    def push(self, text: str) -> str:
        if self._mode in ("text", "json"):
            return text
        if self._mode == "code":
            return json_chars(text)
        self._held += text
        return "" if self._mode == "builtin" else self._decide()

    def _decide(self) -> str:
        held = self._held
        if STARTS_CALL.match(held):
            return self._to("json", OPEN + held)
        if (rest := after_tag(held)) is None:
            if MAY_START_CALL.fullmatch(held) or PYTHON_TAG.startswith(held.lstrip()):
                return ""
            return self._to("text", held)
        if STARTS_CALL.match(rest):
            return self._to("json", OPEN + rest)
        heads = [f"{name}.call(" for name in self.builtins]
        code = rest.lstrip()
        if any(code.startswith(head) for head in heads):
            self._mode = "builtin"
            return ""
        if MAY_START_CALL.fullmatch(rest) or any(head.startswith(code) for head in heads):
            return ""
        if self.code_tool is not None:
            head = f'{OPEN}{{"name": {json.dumps(self.code_tool)}, "arguments": {{"code": "'
            return self._to("code", head + json_chars(rest))
        return self._to("text", rest)

    def _to(self, mode: Literal["text", "json", "code"], out: str) -> str:
        self._mode, self._held = mode, ""
        return out

    def flush(self) -> str:
        mode, held, self._held = self._mode, self._held, ""
        if mode == "json":
            return CLOSE
        if mode == "code":
            return '"}}' + CLOSE
        rest = after_tag(held)
        rest = held if rest is None else rest
        if mode == "builtin" and (call := builtin_call(rest, self.builtins)) is not None:
            name, arguments = call
            return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE}"
        return rest


FENCE = re.compile(r"\s*```(?:json)?[ \t]*\n")
FENCE_END = "```"
# the other wrappers llama.cpp's Hermes parser reads a call in (`<tool_call>` is Qwen's own)
WRAP_TAGS = ("<function_call>", "<tool>", "<tools>", "<response>", "<json>", "<xml>", "<JSON>")
OPENERS = (FENCE_END, *WRAP_TAGS)
CALL_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


@dataclass
class WrappedCall:
    """Calls wrapped otherwise than in Qwen's tags, as small models write them, read as
    llama.cpp's Hermes parser reads them: in a Markdown JSON block (Qwen2.5-Coder 1.5B,
    asked by Claude Code to write a file, answered "To create the file: ```json {"name":
    "Write", "arguments": {...}} ```") or in one of WRAP_TAGS (asked by Codex, it wrote
    `<tools>{"name": "exec_command", ...}</tools>`, the tag its prompt lists tools in). A
    wrapper whose object names one of the request's tools passes on in Qwen's tags as it
    is written. Other text and other blocks pass as they are, a wrapper's start held only
    while it may still be a call."""

    tools: tuple[str, ...]
    _held: str = ""
    _mode: Literal["text", "open", "call", "block"] = "text"  # open: a wrapper, not yet known
    _opener: str = FENCE_END  # the wrapper held or passing: how it opens
    _closer: str = FENCE_END  # and how it ends

    def push(self, text: str) -> str:
        self._held += text
        out = ""
        while True:
            held = self._held
            if self._mode == "open":
                decided = self._decide()
                if decided is None:
                    return out
                out += decided
                continue
            if self._mode == "text":
                found = [(i, o) for o in OPENERS if (i := held.find(o)) >= 0]
                if not found:  # all but what may start a wrapper
                    n = len(held) - max(held_prefix(held, o) for o in OPENERS)
                    out, self._held = out + held[:n], held[n:]
                    return out
                i, self._opener = min(found)
                self._closer = FENCE_END if self._opener == FENCE_END else f"</{self._opener[1:]}"
                out, self._held, self._mode = out + held[:i], held[i:], "open"
                continue
            end = held.find(self._closer)
            if end < 0:  # all but what may start its end
                n = len(held) - held_prefix(held, self._closer)
                out, self._held = out + held[:n], held[n:]
                return out
            close = CLOSE if self._mode == "call" else self._closer
            out += held[:end] + close
            self._held, self._mode = held[end + len(self._closer) :], "text"

    def _decide(self) -> str | None:
        """What the held wrapper's start turns out to be (None: not known yet)."""
        held = self._held
        start = len(self._opener)
        if self._opener == FENCE_END:
            if (fence := FENCE.match(held)) is None:
                if "\n" not in held and len(held) < 16:
                    return None
                return self._enter("block", held[:start], start)
            start = fence.end()
        body = held[start:]
        if (name := CALL_NAME.match(body)) is None:
            compact = re.sub(r"\s+", "", body)
            if len(body) < 64 and '{"name":"'.startswith(compact[:9]):
                return None
            return self._enter("block", held[:start], start)
        if loads_or_text(f'"{name.group(1)}"') not in self.tools:
            return self._enter("block", held[:start], start)
        return self._enter("call", OPEN, start)

    def _enter(self, mode: Literal["call", "block"], out: str, n: int) -> str:
        self._mode, self._held = mode, self._held[n:]
        return out

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held + CLOSE if self._mode == "call" else held


@dataclass
class DoubledCall:
    """A whole answer that is a call in doubled braces, `{{"name": ..., "arguments":
    ...}}`, read as the call inside them. Qwen2.5's template shows the model its call
    format so (a format string's escaped braces, kept in the rendered prompt), and
    Qwen2.5-Coder 1.5B writes it back so, without the tags, where a tool takes no
    parameters and it samples (5 answers of 5 at temperature 1 here; none at 0, nor
    of 20 where the tools had parameters). The outer braces become Qwen's tags, found by
    counting JSON's own braces outside strings; the call streams as it is written. Any
    other answer passes as it is, held only while it may still start such a call. Not
    after a tool's result: there the 1.5B writes the call it made again so, as an echo
    (greedy, in both round trips of tests/server/test_server_real.py), and an agent
    would call it again and again."""

    tools: tuple[str, ...]
    _held: str = ""
    _mode: Literal["open", "call", "text"] = "open"
    _json: JsonDepth = field(default_factory=JsonDepth)  # of the call inside

    def push(self, text: str) -> str:
        if self._mode == "text":
            return text
        if self._mode == "call":
            return self._scan(text)
        self._held += text
        held = self._held.lstrip()
        if held.startswith("{{") and (name := CALL_NAME.match(held[1:])) is not None:
            if loads_or_text(f'"{name.group(1)}"') not in self.tools:
                return self._to_text()
            self._mode, self._held = "call", ""
            return OPEN + self._scan(held[1:])
        if len(held) < 64 and '{{"name":"'.startswith(re.sub(r"\s+", "", held)[:10]):
            return ""
        return self._to_text()

    def _to_text(self) -> str:
        held, self._held, self._mode = self._held, "", "text"
        return held

    def _scan(self, text: str) -> str:
        """`text` of the call with its end, the outer brace that closes at depth 0, made
        the tag's; whatever follows it passes as text."""
        for i, c in enumerate(text):
            if self._json.step(c) < 0:
                self._mode = "text"
                return text[:i] + CLOSE + text[i + 1 :]
        return text

    def flush(self) -> str:
        held, self._held = self._held, ""
        return CLOSE if self._mode == "call" else held


@dataclass
class SplitCalls:
    """Several calls in one block of Qwen's tags, `<tool_call>{...}\n{...}</tool_call>`
    (Qwen2.5-Coder 1.5B, asked for the weather in two cities, wrote both so), as a
    block each: where one object ends and another begins, the block closes and a new one
    opens; the commas and spaces between them go. A block of one object, or of anything
    but objects, passes as it is."""

    _held: str = ""
    _mode: Literal["text", "call", "pass"] = "text"  # pass: a body that is not objects
    _json: JsonDepth = field(default_factory=JsonDepth)  # of the object being written
    _objects: int = 0  # the objects of the open block so far
    _gap: str = ""  # what followed the last object, held until what comes next is known

    def push(self, text: str) -> str:
        held, out, i = self._held + text, [], 0
        while i < len(held):
            if self._mode != "call":
                mark = OPEN if self._mode == "text" else CLOSE
                j = held.find(mark, i)
                if j < 0:
                    n = len(held) - held_prefix(held[i:], mark)
                    out.append(held[i:n])
                    i = n
                    break
                out.append(held[i : j + len(mark)])
                i, self._mode = j + len(mark), "call" if self._mode == "text" else "text"
                self._json, self._objects, self._gap = JsonDepth(), 0, ""
                continue
            if self._json.depth == 0:  # between objects, or before the first
                if held.startswith(CLOSE, i):  # a comma after the last object goes too
                    out.append(self._gap.replace(",", "") + CLOSE)
                    i, self._mode, self._gap = i + len(CLOSE), "text", ""
                elif CLOSE.startswith(held[i:]):
                    break  # may be the close: wait for more
                elif held[i].isspace() or (held[i] == "," and self._objects):
                    self._gap += held[i]
                    i += 1
                elif held[i] == "{":
                    out.append(CLOSE + OPEN if self._objects else self._gap)
                    self._gap = ""
                    self._json.step("{")
                    out.append("{")
                    i += 1
                else:
                    out.append(self._gap)
                    self._gap, self._mode = "", "pass"
                continue
            self._objects += self._json.step(held[i]) == 0  # back at 0: an object ended
            out.append(held[i])
            i += 1
        self._held = held[i:]
        return "".join(out)

    def flush(self) -> str:
        held, gap, self._held, self._gap = self._held, self._gap, "", ""
        return gap + held


def after_tag(text: str) -> str | None:
    """What follows `<|python_tag|>` at the start of `text` (None: it does not start so)."""
    body = text.lstrip()
    return body[len(PYTHON_TAG) :] if body.startswith(PYTHON_TAG) else None


def builtin_call(text: str, names: Sequence[str]) -> tuple[str, dict[str, Any]] | None:
    """`NAME.call(key="value", n=3)` as NAME and its arguments, for NAME among `names`
    (None where it is not such a call, with literal arguments only)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "call"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in names
            and not node.args
        ):
            return None
        arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    except (SyntaxError, ValueError):
        return None
    return node.func.value.id, arguments


def json_chars(text: str) -> str:
    """`text` as it reads inside a JSON string."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


STARTS_CALL = re.compile(r'\s*\{\s*"name"')
# what may still become that: the start of it, or nothing but space yet
MAY_START_CALL = re.compile(r'\s*(\{\s*("(n(a(m(e)?)?)?)?)?)?')


def gemma_tool_responses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's `tool` messages as Gemma 4's template reads them: the results of a call,
    `tool_responses` of the message that called (by the called function's name), so the
    model reads them in its own turn and goes on there."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            names[call["id"]] = call["function"]["name"]
        if message["role"] == "tool" and out and out[-1].get("tool_calls"):
            name = message.get("name") or names.get(message.get("tool_call_id", ""), "unknown")
            response = {"name": name, "response": loads_or_text(message["content"])}
            out[-1] = {**out[-1], "tool_responses": [*out[-1].get("tool_responses", []), response]}
            continue
        out.append(message)
    return out


# Gemma 4's values: JSON's, with strings between <|"|> marks and bare keys
GEMMA_VALUES = "\n".join(
    [
        'value ::= string | number | "true" | "false" | "null" | object | array',
        'string ::= "<|\\"|>" ([^<] | "<" [^|])* "<|\\"|>"',
        'number ::= "-"? [0-9]+ ("." [0-9]+)? ([eE] [-+]? [0-9]+)?',
        'object ::= "{" (pair ("," pair)*)? "}"',
        'pair ::= [a-zA-Z_] [a-zA-Z0-9_]* ":" value',
        'array ::= "[" (value ("," value)*)? "]"',
    ]
)


def gemma_call_grammar(tools: list[Tool]) -> str:
    """GBNF of one Gemma 4 call of any of `tools`: its name, then an arguments object
    of the function's keys (their values as Gemma writes any value); a custom tool's
    one string as its grammar allows, between Gemma's string marks."""
    calls, rules = [], []
    inputs = held_inputs(tools, json_string=False)
    for i, tool in enumerate(tools):
        keys = list(((tool.function.parameters or {}).get("properties") or {}).keys())
        key = " | ".join(json.dumps(k) for k in keys) or "[a-zA-Z_] [a-zA-Z0-9_]*"
        name = json.dumps(tool.function.name + "{")
        if i in inputs:
            opened, closed = json.dumps(f"input:{QUOTE}"), json.dumps(QUOTE + "}")
            rules += [
                f"call-{i} ::= {name} {opened} input-{i}-root {closed}",
                inputs[i].rstrip("\n"),
            ]
        else:
            rules += [
                f'call-{i} ::= {name} (arg-{i} ("," arg-{i})*)? "}}"',
                f'arg-{i} ::= ({key}) ":" value',
            ]
        calls.append(f"call-{i}")
    root = f'root ::= "<|tool_call>call:" ({" | ".join(calls)}) "{GEMMA_CLOSE}"'
    return "\n".join([root, *rules, GEMMA_VALUES])


def harmony_call_grammar(tools: list[Tool]) -> str:
    """GBNF of a gpt-oss answer that calls one of `tools`: its reasoning if it writes
    any, then a commentary message to a function, whose body is JSON by that function's
    schema."""
    from localspec.backends.llama_grammar import schema_grammar

    calls, bodies = [], []
    inputs = held_inputs(tools, json_string=True)
    for i, tool in enumerate(tools):
        schema = input_schema(i) if i in inputs else tool.function.parameters or {"type": "object"}
        # each schema's rules under a prefix of their own: two schemas' rules (named after
        # their keys) and the root's own rules cannot collide
        body = prefixed(schema_grammar(schema), f"harmony-{i}-")
        bodies.append(with_inputs(body, {i: inputs[i]}) if i in inputs else body)
        head = json.dumps(f"{tool.function.name} <|constrain|>json<|message|>")
        calls.append(f"{head} harmony-{i}-root")
    call = f'"<|channel|>commentary to=functions." ({" | ".join(calls)})'
    root = f"root ::= {HARMONY_ANALYSIS} {call}"
    return "\n".join([root, HARMONY_THOUGHT, *bodies])


# a GBNF rule body's parts: a string literal, a character class, or a name
GBNF_PART = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[a-zA-Z0-9-]+')


def prefixed(gbnf: str, prefix: str) -> str:
    """`gbnf` with each of its rules renamed `prefix` + name, wherever it is named."""
    names = set(re.findall(r"^([a-zA-Z0-9-]+) ::=", gbnf, flags=re.M))
    return GBNF_PART.sub(lambda m: prefix + m[0] if m[0] in names else m[0], gbnf)
