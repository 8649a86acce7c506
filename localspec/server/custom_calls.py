"""OpenAI's custom tools (free text in, as Codex's `apply_patch`, a grammar beside it)
on the way out. To the model a custom tool is a function of one string, `input`
(schemas.Tool.custom); its call's input is decoded from the arguments' JSON as they are
written. The Responses API sends it as `custom_tool_call` items (responses_out); Chat
Completions as `tool_calls` of type "custom", here.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

# the start of a custom call's arguments, and of the escapes in its input that are whole
# (a surrogate pair only as a pair)
_INPUT_OPENS = re.compile(r'\s*\{\s*"input"\s*:\s*"')
_WHOLE = re.compile(
    r'(?:[^"\\]|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[0-9a-fA-F]{4}'
    r"|\\u(?![dD][89abAB])[0-9a-fA-F]{4}|\\[^u])*"
)


def input_so_far(arguments: str) -> str | None:
    """The input that arguments written so far as `{"input": "...` hold, decoded up to
    their last whole escape; None where they are written otherwise."""
    opened = _INPUT_OPENS.match(arguments)
    if opened is None:
        return None
    whole = _WHOLE.match(arguments, opened.end())
    try:
        return json.loads(f'"{whole.group() if whole else ""}"', strict=False)
    except ValueError:
        return None


def custom_input(arguments: str) -> str:
    """A custom call's input from its arguments (written otherwise: as they are)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    so_far = input_so_far(arguments)  # cut by max tokens
    return arguments if so_far is None else so_far


def as_custom_calls(body: dict[str, Any], custom: frozenset[str]) -> dict[str, Any]:
    """A chat answer whose calls of the `custom` tools are custom calls
    (`{id, type: custom, custom: {name, input}}`)."""
    for choice in body["choices"]:
        calls = choice["message"].get("tool_calls") or []
        for i, call in enumerate(calls):
            function = call["function"]
            if function["name"] in custom:
                input_ = custom_input(function["arguments"])
                custom_call = {"name": function["name"], "input": input_}
                calls[i] = {"id": call["id"], "type": "custom", "custom": custom_call}
    return body


@dataclass
class OpenCall:
    """A streamed custom call: its arguments as they came, and its input as sent."""

    index: int = 0  # among the answer's calls (Chat Completions' chunks)
    written: str = ""
    sent: str = ""

    def more(self, arguments: str) -> str:
        """The input these arguments add to what was sent."""
        self.written += arguments
        return self.beyond(input_so_far(self.written) or "")

    def close(self) -> str:
        return self.beyond(custom_input(self.written))

    def beyond(self, text: str) -> str:
        """What of the input `text` was not sent yet, now sent ('' where it does not
        extend what was: a call written otherwise goes whole, at its end)."""
        if not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent) :], text
        return piece


async def as_custom_call_chunks(
    chunks: AsyncIterator[dict[str, Any]], custom: frozenset[str]
) -> AsyncIterator[dict[str, Any]]:
    """A streamed chat answer whose calls of the `custom` tools stream as custom calls:
    `{index, id, type: custom, custom: {name, input}}`, then `{index, custom: {input}}`
    with the input's next piece, as it is decoded from the arguments."""
    open_calls: dict[int, OpenCall] = {}  # by choice
    async for chunk in chunks:
        for choice in chunk["choices"]:
            delta, at = choice["delta"], choice["index"]
            out: list[dict[str, Any]] = []
            for call in delta.get("tool_calls") or []:
                open_call = open_calls.get(at)
                if open_call is not None and ("id" in call or call["index"] != open_call.index):
                    add_input(out, open_call.index, open_calls.pop(at).close())  # the next began
                    open_call = None
                function = call.get("function", {})
                if "id" in call and function.get("name") in custom:
                    open_call = open_calls[at] = OpenCall(call["index"])
                    opened = {"name": function["name"], "input": ""}
                    out.append({"index": call["index"], "id": call["id"], "type": "custom"})
                    out[-1]["custom"] = opened
                if open_call is None:  # a function's call: as it is
                    out.append(call)
                else:
                    add_input(out, open_call.index, open_call.more(function.get("arguments", "")))
            if choice["finish_reason"] is not None and at in open_calls:
                open_call = open_calls.pop(at)
                add_input(out, open_call.index, open_call.close())
            if out:
                delta["tool_calls"] = out
            else:
                delta.pop("tool_calls", None)
        if not chunk["choices"] or any(c["delta"] or c["finish_reason"] for c in chunk["choices"]):
            yield chunk


def add_input(out: list[dict[str, Any]], index: int, piece: str) -> None:
    """A piece of a custom call's input, in the chunk's last delta of that call where
    there is one."""
    if not piece:
        return
    if out and out[-1]["index"] == index and "custom" in out[-1]:
        out[-1]["custom"]["input"] += piece
    else:
        out.append({"index": index, "custom": {"input": piece}})
