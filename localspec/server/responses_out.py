"""The Responses API's answer (its request is read by localspec.server.responses): a chat
answer's message as the response's output items (reasoning, message, function and custom
calls) and its body, or its stream of chunks as the Responses API's named events."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from localspec.decoding.events import Finished
from localspec.server.blocks import Blocks, Close, Open, Step
from localspec.server.custom_calls import OpenCall, custom_input
from localspec.server.errors import ApiError
from localspec.server.responses import NamedToolIn, ResponsesChat, ResponsesRequest

PARTS = {"thinking": "reasoning_text", "text": "output_text"}  # a block's content part


def output_items(
    message: dict[str, Any], ids: ItemIds, custom: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """A chat answer's message as the response's output items (`custom`: the names of
    the custom tools, whose calls carry their input as it is)."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(ids.reasoning, message["reasoning_content"]))
    if message.get("content"):
        items.append(message_item(ids.message, message["content"]))
    for call in message.get("tool_calls") or []:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        if name in custom:
            items.append(custom_call_item(call["id"], name, custom_input(arguments)))
        else:
            items.append(call_item(call["id"], name, arguments))
    return items


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [] if text is None else [text_part(text)],
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": f"fc_{call_id}",
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def custom_call_item(
    call_id: str, name: str, text: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": f"ctc_{call_id}",
        "type": "custom_tool_call",
        "call_id": call_id,
        "name": name,
        "input": text,
        "status": status,
    }


@dataclass(frozen=True)
class ItemIds:
    """One response's id, its items' (its calls keep their own) and its creation time."""

    suffix: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def response(self) -> str:
        return f"resp_{self.suffix}"

    @property
    def message(self) -> str:
        return f"msg_{self.suffix}"

    @property
    def reasoning(self) -> str:
        return f"rs_{self.suffix}"


def response_body(
    ids: ItemIds,
    model: str,
    request: ResponsesRequest,
    output: list[dict[str, Any]],
    done: Finished | None,
    chat_usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """The response object; in progress while `done` is None. Where max tokens cut
    it, the item being written then is incomplete too (a call's arguments do not parse)."""
    incomplete = done is not None and done.cut
    status = "in_progress" if done is None else "incomplete" if incomplete else "completed"
    if incomplete and output:
        output = [*output[:-1], output[-1] | {"status": "incomplete"}]
    body: dict[str, Any] = {
        "id": ids.response,
        "object": "response",
        "created_at": ids.created,
        "status": status,
        "model": model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "tool_choice": "auto" if request.tool_choice is None else request.tool_choice,
        "tools": [t.model_dump(exclude_none=True) for t in request.tools or []],
        # as sampled: the API's defaults where neither the request nor `serve` set one
        "temperature": first(request.temperature, ResponsesChat.DEFAULTS.temperature),
        "top_p": first(request.top_p, ResponsesChat.DEFAULTS.top_p),
        "max_output_tokens": request.max_output_tokens,
        "previous_response_id": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "usage": None if chat_usage is None else usage(chat_usage),
    }
    if isinstance(body["tool_choice"], NamedToolIn):
        body["tool_choice"] = body["tool_choice"].model_dump(exclude_none=True)
    return body


def first(value: float | None, default: float) -> float:
    return default if value is None else value


def usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    details = chat_usage["completion_tokens_details"]
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": details["reasoning_tokens"]},
        "total_tokens": chat_usage["total_tokens"],
    }


class ResponseStream:
    """The Responses API's stream events from the chat's chunks: response.created, then
    each output item (reasoning, message, function call) added, filled and done in turn,
    then response.completed (or .incomplete) with the whole response; each event numbered."""

    def __init__(self, ids: ItemIds, model: str, request: ResponsesRequest) -> None:
        self.ids, self.model, self.request = ids, model, request
        self.blocks = Blocks()
        self.output: list[dict[str, Any]] = []  # the items done
        self.item: dict[str, Any] = {}  # the open one
        self.custom = request.custom_names()
        self.call = OpenCall()  # the open custom call's
        self.sequence = 0
        self.closing = "completed"  # the status of items that close as they are done

    async def events(
        self, chunks: AsyncIterator[dict[str, Any]], done: Callable[[], Finished | None]
    ) -> AsyncIterator[dict[str, Any]]:
        """`done()`: the Finished event, once the chunks ended."""
        created = response_body(self.ids, self.model, self.request, [], None, None)
        yield self.event("response.created", response=created)
        yield self.event("response.in_progress", response=created)
        async for step in self.blocks.steps(chunks):
            for event in self.render(step):
                yield event
        last = self.blocks.last
        ended = done()
        self.closing = "incomplete" if ended is not None and ended.cut else "completed"
        for step in self.blocks.close():
            for event in self.render(step):
                yield event
        body = response_body(self.ids, self.model, self.request, self.output, done(), last["usage"])
        name = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        yield self.event(name, response=body | {"localspec": last["localspec"]})

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def render(self, step: Step) -> list[dict[str, Any]]:
        at: dict[str, Any] = {"output_index": len(self.output)}
        if isinstance(step, Open):
            return self.add(step, at)
        at["item_id"] = self.item["id"]
        if isinstance(step, Close):
            return self.finish(step, at)
        if step.kind == "call" and self.item["type"] == "custom_tool_call":
            return self.input_delta(self.call.more(step.text), at)
        if step.kind == "call":
            return [self.event("response.function_call_arguments.delta", delta=step.text, **at)]
        part = PARTS[step.kind]
        return [self.event(f"response.{part}.delta", delta=step.text, **at, **self.text_at(part))]

    def add(self, step: Open, at: dict[str, Any]) -> list[dict[str, Any]]:
        self.item = {
            "thinking": reasoning_item(self.ids.reasoning, "", "in_progress"),
            "text": message_item(self.ids.message, None, "in_progress"),
            "call": (
                custom_call_item(step.call_id, step.name, "", "in_progress")
                if step.name in self.custom
                else call_item(step.call_id, step.name, "", "in_progress")
            ),
        }[step.kind]
        self.call = OpenCall()
        events = [self.event("response.output_item.added", item=self.item, **at)]
        if step.kind != "call":
            at |= {"item_id": self.item["id"], "content_index": 0}
            part = {"type": PARTS[step.kind], "text": ""}
            events.append(self.event("response.content_part.added", part=part, **at))
        return events

    def finish(self, step: Close, at: dict[str, Any]) -> list[dict[str, Any]]:
        status = self.closing
        if step.kind == "call" and self.item["type"] == "custom_tool_call":
            text = custom_input(step.text)
            item = custom_call_item(self.item["call_id"], self.item["name"], text, status)
            events = [
                *self.input_delta(self.call.beyond(text), at),
                self.event("response.custom_tool_call_input.done", input=text, **at),
            ]
        elif step.kind == "call":
            item = call_item(self.item["call_id"], self.item["name"], step.text, status)
            events = [
                self.event("response.function_call_arguments.done", arguments=step.text, **at)
            ]
        else:
            part = PARTS[step.kind]
            if step.kind == "thinking":
                item = reasoning_item(self.ids.reasoning, step.text, status)
            else:
                item = message_item(self.ids.message, step.text, status)
            events = [
                self.event(f"response.{part}.done", text=step.text, **at, **self.text_at(part)),
                self.event(
                    "response.content_part.done", part=item["content"][0], **at, content_index=0
                ),
            ]
        self.output.append(item)
        del at["item_id"]
        return [*events, self.event("response.output_item.done", item=item, **at)]

    def input_delta(self, piece: str, at: dict[str, Any]) -> list[dict[str, Any]]:
        """A custom call's next piece of input, where there is one."""
        if not piece:
            return []
        return [self.event("response.custom_tool_call_input.delta", delta=piece, **at)]

    @staticmethod
    def text_at(part: str) -> dict[str, Any]:
        """Where a text's pieces go (the item's one part); output text carries logprobs."""
        return {"content_index": 0} | ({"logprobs": []} if part == "output_text" else {})


def error_event(e: ApiError) -> dict[str, Any]:
    """A failure mid-stream, as the Responses API streams it."""
    return {"type": "error", "code": e.code, "message": e.message, "param": e.param}
