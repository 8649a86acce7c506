"""A chat's JSON answer (`response_format`) may come in a ```json fence, as
llama-server's grammar lets it (its chat parser): Qwen's models write one when asked for
JSON, and held to a bare value from the first token they write worse. On the json
bench's six schemas the 1.5B Q4_K_M target's greedy answers to two ran on to the token
limit bare, and all six finished fenced. The client gets the JSON alone (`Unfence`); the
fence's tokens count in `usage` and `logprobs`, as they were decoded."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from localspec.backends.llama import LlamaModel
from localspec.backends.llama_grammar import LlamaGrammar
from localspec.thinking import Thinking

OPEN = "```json"
ROOT = "json-fenced-answer"  # the wrapped grammar's root: the schema's own stays `root`
RULES = f"""
{ROOT} ::= "{OPEN}" json-fence-space root json-fence-space "```" | root
json-fence-space ::= [ \\t\\n]{{0,4}}
"""
# how a chat's JSON is written where the answer has not shown its own way yet (the
# grammar's guesses at the spaces it leaves open: `LlamaGrammar`'s style): in a fence,
# over lines, indented by two, as Qwen's models write it
STYLE = b'```json\n{\n  "key": "value",\n  "list": [\n    1\n  ]\n}\n```'
# what may still turn out to be the closing fence: spaces, then up to three backticks
CLOSING = re.compile(r"[ \t\n]*`{0,3}\Z")


def fenced(gbnf: str) -> str:
    """`gbnf` (whose root is `root`) with ROOT: its answer bare, or in a fence."""
    return gbnf + RULES


def chat_grammar(model: LlamaModel, gbnf: str, thinking: Thinking | None = None) -> LlamaGrammar:
    """The grammar a chat's JSON answer follows (served, audited, measured alike): `gbnf`
    bare or fenced, after the reasoning a thinking model may write first (`Thinking.first`),
    its open spaces guessed in the fence's layout (STYLE)."""
    text, root, fresh = fenced(gbnf), ROOT, b""
    if thinking is not None:
        text, root = thinking.first(text, root)
        fresh = thinking.answer_starts.encode()
    return LlamaGrammar(model, text, root, style=STYLE, fresh_after=fresh)


@dataclass
class Unfence:
    """The answer's text as the client gets it: without the fence and the spaces inside
    it. Text that may be the fence is held back until the next piece tells (a backtick
    in a JSON string goes out with what follows it)."""

    state: Literal["start", "open", "fenced", "bare"] = "start"
    held: str = ""

    def push(self, text: str) -> str:
        held, self.held = self.held + text, ""
        if self.state == "start":
            if len(held) < len(OPEN) and OPEN.startswith(held):
                self.held = held
                return ""
            if not held.startswith(OPEN):
                self.state = "bare"
                return held
            self.state, held = "open", held[len(OPEN) :]
        if self.state == "open":
            held = held.lstrip(" \t\n")
            if not held:
                return ""
            self.state = "fenced"
        if self.state == "fenced":
            end = CLOSING.search(held)
            cut = end.start() if end else len(held)
            self.held = held[cut:]
            return held[:cut]
        return held

    def flush(self) -> str:
        """The answer's end: a fenced answer's held text is its closing fence (or, cut
        short, spaces and backticks no JSON value ends with)."""
        held, self.held = self.held, ""
        return held if self.state in ("start", "bare") else ""
