"""Thinking models: their reasoning goes to `reasoning_content`, as llama-server and vLLM
send it, the rest to `content`. Three ways of writing it (`Thinking`, read from the chat
template): Qwen3 and the like write a `<think>…</think>` block before their answer,
Gemma 4 a `<|channel>thought…<channel|>` one; where the chat template opens the block
itself (the prompt ends in its opening), the answer starts inside it and only closes it.
gpt-oss writes OpenAI's Harmony messages (`HarmonySplit`): `<|channel|>analysis` is its
reasoning, `final` its answer, and a message addressed `to=functions.NAME` a tool call."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

THINK = ("<think>", "</think>")  # Qwen3, DeepSeek-R1, QwQ
GEMMA = ("<|channel>thought", "<channel|>")  # Gemma 4
HARMONY = ("<|channel|>", "<|message|>")  # gpt-oss: a message's header, then its body
State = Literal["start", "think", "content"]
# reasoning marks that are control tokens, which llama.cpp renders as nothing unless
# asked (Gemma 4's thought block; Harmony's message end: its other marks it renders)
CONTROL_MARKS = ("<|channel>", "<channel|>", "<|end|>")
# Qwen's tags: the shape every family's tool calls are passed on in, to one parser
# (localspec.server.chat); Harmony's calls too
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


def held_prefix(text: str, mark: str = CALL_OPEN) -> int:
    """Length of the longest suffix of `text` that begins `mark`."""
    for n in range(min(len(mark) - 1, len(text)), 0, -1):
        if text.endswith(mark[:n]):
            return n
    return 0


# a chat grammar's rules for the reasoning before the answer (`Thinking.first`)
FIRST, THOUGHT, SPACES = "thought-first", "thought-text", "thought-spaces"
# gpt-oss's analysis message, which a grammar for its answer lets come first
HARMONY_ANALYSIS = '("<|channel|>analysis<|message|>" harmony-thought "<|end|><|start|>assistant")?'
HARMONY_THOUGHT = 'harmony-thought ::= ([^<] | "<" [^|])*'
CLASS_ESCAPES = {c: "\\" + c for c in "\\]^-["}  # what a GBNF character class escapes


def excluding(name: str, mark: str) -> list[str]:
    """GBNF rules: `name` matches any text that does not hold `mark` (llama.cpp's chat
    parser's `until`, written as its grammar writes it: the automaton that reads the
    text for `mark`, a rule for each state, named by how much of `mark` the text ends
    with; the character that would complete `mark` has no way on)."""

    def state(k: int) -> str:
        return name if k == 0 else f"{name}-{k}"

    def after(k: int, char: str) -> int:  # how much of `mark` ends `mark[:k] + char`
        text = mark[:k] + char
        ends = (n for n in range(min(len(text), len(mark)), 0, -1) if text.endswith(mark[:n]))
        return next(ends, 0)

    rules = []
    for k in range(len(mark)):
        ways, named = [""], []
        for char in sorted(set(mark)):
            if (d := after(k, char)) == 0:
                continue
            named.append(char)
            if d < len(mark):
                ways.append(f"{json.dumps(char)} {state(d)}")
        ways.append(f"[^{''.join(CLASS_ESCAPES.get(c, c) for c in named)}] {state(0)}")
        rules.append(f"{state(k)} ::= {' | '.join(ways).lstrip()}")
    return rules


class Split(Protocol):
    """Feed the answer's text as it streams; get (reasoning, content) back. `state` is
    "think" while the text is reasoning (its tokens count as reasoning tokens)."""

    state: State

    def push(self, text: str) -> tuple[str, str]: ...

    def flush(self) -> tuple[str, str]: ...


@dataclass(frozen=True)
class Thinking:
    """How a model writes its reasoning, and whether the prompt opened the block."""

    marks: tuple[str, str] = THINK
    opened: bool = False

    def split(self) -> Split:
        if self.marks == HARMONY:
            return HarmonySplit()
        return ThinkSplit(self.marks, "think" if self.opened else "start")

    @property
    def block(self) -> tuple[str, str]:
        """The reasoning block's opening and end, as llama.cpp's reasoning budget reads
        them: gpt-oss's is its analysis message."""
        return (HARMONY[0] + "analysis" + HARMONY[1], END) if self.marks == HARMONY else self.marks

    @property
    def answer_starts(self) -> str:
        """The mark after which the answer starts: the block's end, or a Harmony
        message's header's."""
        return HARMONY[1] if self.marks == HARMONY else self.marks[1]

    def first(self, gbnf: str, root: str) -> tuple[str, str]:
        """`gbnf` (from `root`) as the answer after the reasoning the model may write
        first, and its root: a grammar for a chat lets a thinking model think, as
        llama-server's does (its chat parser's reasoning rule): a block between the
        marks, or the rest of the one the prompt opened, then a few spaces. gpt-oss's
        answer is its final message, after any analysis (a call's grammar is already a
        whole Harmony answer: localspec.server.calls)."""
        if self.marks == HARMONY:
            head = f'{HARMONY_ANALYSIS} "<|channel|>final" (" <|constrain|>json")? "<|message|>"'
            return "\n".join([gbnf, f"{FIRST} ::= {head} {root}", HARMONY_THOUGHT]), FIRST
        start, end = (json.dumps(m) for m in self.marks)
        block = f"{THOUGHT} {end}" if self.opened else f"({SPACES} {start} {THOUGHT} {end})?"
        rules = [f"{FIRST} ::= {block} {SPACES} {root}", f"{SPACES} ::= [ \\t\\n]{{0,4}}"]
        return "\n".join([gbnf, *rules, *excluding(THOUGHT, self.marks[1])]), FIRST


def opens_thinking(template: str | None, prompt_text: str) -> Thinking | None:
    """How the model thinks, by its template (None: it does not)."""
    text = template or ""
    for marks in (HARMONY, GEMMA, THINK):
        if marks[0] in text:
            opened = marks != HARMONY and prompt_text.rstrip().endswith(marks[0])
            return Thinking(marks, opened)
    return None


# llama-server's --reasoning: a thinking model thinks, answers at once, or as its template
# has it by default (Qwen3's thinks, Gemma 4's does not)
Switch = Literal["auto", "on", "off"]
SWITCHES: tuple[Switch, ...] = get_args(Switch)


def switched(switch: Switch) -> dict[str, Any]:
    """The template variable that turns thinking `switch` where the template has the switch:
    `enable_thinking` (Qwen3's, Qwen3.5's, Gemma 4's), as llama-server passes it."""
    return {} if switch == "auto" else {"enable_thinking": switch == "on"}


def without_reasoning(template: str | None, answer: str) -> str:
    """A saved answer as the next turn's prompt shows it: its content, the reasoning left
    out, as the templates want it (gpt-oss's refuses Harmony's channels in a message's
    content; Qwen3's drops a `<think>` block itself)."""
    thinking = opens_thinking(template, "")
    if thinking is None:
        return answer
    return split_answer(written_thinking(answer, (thinking.marks,)) or thinking, answer)[1]


def written_thinking(
    answer: str, families: tuple[tuple[str, str], ...] = (HARMONY, GEMMA, THINK)
) -> Thinking | None:
    """How a whole answer holds its reasoning, read from its own marks (a saved answer,
    where the template is not at hand): an answer whose block the prompt had opened
    holds only its end. None: no reasoning in it."""
    for marks in families:
        start, end = marks
        if marks == HARMONY:
            if start in answer:
                return Thinking(HARMONY)
        elif start in answer or end in answer:
            return Thinking(marks, opened=start not in answer)
    return None


def split_answer(thinking: Thinking, answer: str) -> tuple[str, str]:
    """A whole answer's (reasoning, content)."""
    split = thinking.split()
    reasoning, content = split.push(answer)
    more, rest = split.flush()
    return reasoning + more, content + rest


@dataclass
class ThinkSplit:
    """A block of reasoning between two marks, then the answer; what may be the start
    of a mark is held back."""

    marks: tuple[str, str] = THINK
    state: State = "start"
    _held: str = ""
    _content_began: bool = False

    @classmethod
    def opened(cls, inside: bool) -> ThinkSplit:
        return cls(THINK, "think" if inside else "start")

    def push(self, text: str) -> tuple[str, str]:
        start, end = self.marks
        self._held += text
        reasoning = ""
        if self.state == "start":
            stripped = self._held.lstrip()
            if stripped.startswith(start):
                self.state, self._held = "think", stripped[len(start) :]
            elif start.startswith(stripped):
                return "", ""  # maybe the block's opening, still coming
            else:
                self.state = "content"
        if self.state == "think":
            at = self._held.find(end)
            if at < 0:
                keep = held_prefix(self._held, end)
                reasoning, self._held = (
                    self._held[: len(self._held) - keep],
                    self._held[len(self._held) - keep :],
                )
                return reasoning, ""
            reasoning, self._held = self._held[:at], self._held[at + len(end) :]
            self.state = "content"
        return reasoning, self._content()

    def flush(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        if self.state == "think":
            return held, ""
        return "", held if self._content_began or self.state == "content" else held.lstrip()

    def _content(self) -> str:
        if not self._content_began:  # the blank lines after the block are not content
            self._held = self._held.lstrip()
            self._content_began = bool(self._held)
        out, self._held = self._held, ""
        return out


Reading = Literal["before", "thinking", "after", "none"]


@dataclass
class BlockReader:
    """Where an answer stands with its opening reasoning block, read from the bytes its
    tokens render (ThinkSplit's reading without the split, for the rules a thinking
    model decodes under: the reasoning budget, the lazy grammar, which watch the answer
    token by token). `after`: past the block; `none`: the answer opened without one."""

    marks: tuple[bytes, bytes]
    phase: Reading = "before"
    text: bytes = b""  # what a mark may still complete, and the thought's last bytes

    def read(self, piece: bytes) -> bytes | None:
        """Read the next token's bytes: where the answer is past the block with them (or
        has opened without one), its bytes from there on; None while it is not."""
        start, end = self.marks
        self.text += piece
        if self.phase == "before":
            said = self.text.lstrip()
            if said.startswith(start):
                self.phase, self.text = "thinking", said[len(start) :]
            elif start.startswith(said):
                return None  # maybe the block's opening, still coming
            else:
                self.phase, rest, self.text = "none", self.text, b""
                return rest
        if self.phase == "thinking":
            at = self.text.find(end)
            if at < 0:
                self.text = self.text[-(len(end) + 8) :]  # (a character's bytes, whole)
                return None
            self.phase, rest, self.text = "after", self.text[at + len(end) :], b""
            return rest
        self.text = b""
        return piece


# Harmony's markers as llama.cpp renders them: <|channel|>, <|message|>, <|start|> and
# <|constrain|> always, <|end|> where the request shows it (`Prepared.shown`); <|call|>
# and <|return|> end the generation and never reach the text.
START, END, CALL, RETURN = "<|start|>", "<|end|>", "<|call|>", "<|return|>"
BODY_ENDS = (END, START, CALL, RETURN)
RECIPIENT = re.compile(r"\bto=([^\s<]+)")


@dataclass
class HarmonySplit:
    """gpt-oss's answer, message by message: a header (`<|channel|>analysis`, or
    `<|start|>assistant to=functions.get_weather<|channel|>commentary json`) up to
    `<|message|>`, then a body up to `<|end|>`, the next `<|start|>` or the end. An
    analysis body is reasoning; a body addressed to a function is a tool call, passed on
    in Qwen's tags (`<tool_call>{"name": ..., "arguments": BODY}</tool_call>`) so that
    the same parsers read it and stream its arguments as they are written; any other
    body (final, a commentary preamble) is content."""

    state: State = "start"
    _held: str = ""
    _header: str | None = ""  # the open message's header so far (None: in its body)
    _call: bool = False

    def push(self, text: str) -> tuple[str, str]:
        self._held += text
        reasoning, content = "", ""
        while True:
            if self._header is not None:
                header, self._held = self._header + self._held, ""
                at = header.find(HARMONY[1])
                if at < 0:
                    self._header = header
                    return reasoning, content
                self._held = header[at + len(HARMONY[1]) :]
                content += self._open(header[:at])
                self._header = None
                continue
            upto, mark = self._body_end()
            body, self._held = self._held[:upto], self._held[upto:]
            if self.state == "think":
                reasoning += body
            else:
                content += body
            if not mark:
                return reasoning, content
            self._held = self._held.removeprefix(END)  # the next <|start|> opens a header
            content += self._close()
            self._header = ""

    def _body_end(self) -> tuple[int, str]:
        """Where the open body ends in the held text, and the mark that ends it; where
        none is there yet, how much of it is surely body (the rest may begin a mark)."""
        found = [(self._held.find(m), m) for m in BODY_ENDS if m in self._held]
        if found:
            return min(found)
        return len(self._held) - max(held_prefix(self._held, m) for m in BODY_ENDS), ""

    def flush(self) -> tuple[str, str]:
        """The end of the answer (at `<|call|>` or `<|return|>`): an open body ends."""
        reasoning, content = self.push("")
        held, self._held = self._held, ""
        if self._header is not None:  # a header with no body: nothing to show, unless
            # the model wrote no Harmony at all
            header, self._header = self._header, ""
            return reasoning, content + (header if HARMONY[0] not in header else "")
        if self.state == "think":
            reasoning += held
        else:
            content += held
        return reasoning, content + self._close()

    def _open(self, header: str) -> str:
        """A message's header read: where its body goes."""
        channel = header.split(HARMONY[0])[-1].split()[0] if HARMONY[0] in header else ""
        recipient = RECIPIENT.search(header)
        if recipient is not None and not recipient.group(1).startswith("assistant"):
            self.state, self._call = "content", True
            name = recipient.group(1).removeprefix("functions.")
            return f'{CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": '
        self.state = "think" if channel == "analysis" else "content"
        return ""

    def _close(self) -> str:
        if not self._call:
            return ""
        self._call = False
        return f"}}{CALL_CLOSE}"
