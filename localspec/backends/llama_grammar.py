"""llama.cpp's grammar engine as a `Grammar` (localspec.decoding.grammar): GBNF parsed by
libllama (`llama_sampler_init_grammar`), JSON schemas turned into GBNF by llama.cpp's own
converter (the Python port shipped with llama-cpp-python), the state advanced and
cloned by the sampler's accept and clone."""

from __future__ import annotations

import ctypes
import json
import re
from typing import Any

import llama_cpp.llama_cpp as ll
import numpy as np
from llama_cpp.llama_grammar import JSON_GBNF, RESERVED_NAMES, json_schema_to_gbnf

from localspec.backends.llama import LlamaModel
from localspec.decoding.schema_refs import flat_refs, plain_subschemas
from localspec.errors import LocalspecError

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data
TAIL = 256  # bytes of the answer a state keeps, for its style
SPACE = ord(" ")
WHITESPACE = frozenset(b" \t\n")


def in_style(tail: bytes, allowed: set[int], style: bytes = b"") -> int | None:
    """Where the grammar leaves the whitespace between a JSON answer's parts open (or
    the one character after it), a guess in the answer's own style: on a new line, its
    indentation (`line_indent`), then the character; after other whitespace, the character;
    after a character, the whitespace the answer put between the two characters the
    time before (in `style`, the grammar's layout, where the answer has not shown it: a
    fence's close, once a long answer's tail no longer holds its opening), or after the
    same character where JSON went on (where it has not come before: a space after ':',
    ',', '{' and '['), or the one character without space. None where no guess is
    allowed."""
    solid = allowed - WHITESPACE
    line = tail.rfind(b"\n")
    if line >= 0 and not tail[line + 1 :].strip():  # in a new line's indentation
        indent = line_indent(tail[: line + 1], solid)
        at = len(tail) - line - 1
        if indent is None:
            return None
        if at < len(indent):
            return indent[at] if indent[at] in allowed else None
        return min(solid) if len(solid) == 1 else None
    if tail and tail[-1] in WHITESPACE:
        return min(solid) if len(solid) == 1 else None
    gap = gap_before(tail, min(solid)) if len(solid) == 1 else None
    if gap is None and style and len(solid) == 1:
        gap = gap_before(style + tail[-1:], min(solid))
    if gap is None:
        gap = gap_after(tail)
    if gap:
        return gap[0] if gap[0] in allowed else None
    if gap == b"" and len(solid) == 1:
        return min(solid)
    if SPACE in allowed and gap is None and tail[-1:] in (b":", b",", b"{", b"["):
        return SPACE  # none yet: a space after a separator or opener, none before one
    return min(solid) if len(solid) == 1 else None


def last_gap(tail: bytes, following: bytes) -> bytes | None:
    """The whitespace the answer last put between its last character and what matches
    the pattern `following`, before now; None where it has not yet."""
    gaps = re.findall(re.escape(tail[-1:]) + rb"([ \t\n]*)" + following, tail[:-1])
    return gaps[-1] if gaps else None


def gap_before(tail: bytes, char: int) -> bytes | None:
    """The whitespace the answer last put between its last character and `char` (a
    model that writes `"x" , "y"` does so at every comma), None where it has not yet."""
    return last_gap(tail, re.escape(bytes([char]))) if tail else None


def line_indent(text: bytes, solid: set[int]) -> bytes | None:
    """The indentation of the line after `text` (which ends a line): the last line's,
    one step deeper after a '{' or '[' and one step shallower before a '}' or ']', the
    step as the answer took it before (None where it has not yet: no guess)."""
    lines = text[:-1].split(b"\n")
    indents = [ln[: len(ln) - len(ln.lstrip())] for ln in lines]
    indent = indents[-1]
    opens = [i for i, ln in enumerate(lines[:-1]) if ln.rstrip()[-1:] in (b"{", b"[")]
    steps = [indents[i + 1][len(indents[i]) :] for i in opens]
    step = next((s for s in reversed(steps) if s), b"")
    if lines[-1].rstrip()[-1:] in (b"{", b"["):
        return indent + step if step else None
    if solid and solid <= {ord("}"), ord("]")}:
        return indent[: len(indent) - len(step)] if step and indent.endswith(step) else None
    return indent


# where a JSON value or key starts, or an object or array ends: the whitespace before it
# is the answer's layout (a ':' inside a string, as in a URL, says nothing of it)
STRUCTURE = rb"[\"{\[\]}0-9tfn\-]"


def gap_after(tail: bytes) -> bytes | None:
    """The whitespace the answer last put after its last character where JSON went on
    (a first ',' of an answer laid out over lines: as after its '{'); None where it has
    not yet."""
    if not tail:
        return None
    if (gap := last_gap(tail, STRUCTURE)) is not None or tail[-1:] != b",":
        return gap
    opened = re.findall(rb"[{\[]([ \t\n]*)" + STRUCTURE, tail)
    return opened[-1] if opened and b"\n" in opened[-1] else None


class GrammarError(LocalspecError):
    """A grammar or schema llama.cpp cannot use; one line that says what."""


# The Python port's string character lets control characters through (a raw newline in
# a string: not JSON); llama.cpp's C++ converter, llama-server's, refuses them.
PORT_CHAR, CPP_CHAR = r'char ::= [^"\\] |', r'char ::= [^"\\\x7F\x00-\x1F] |'
# and its `space` lets the parts of an answer stand on lines of their own, as models write
# JSON (held to one optional space, they write worse: a review answer ran on in a string)
PORT_SPACE, CPP_SPACE = 'space ::= " "?', r'space ::= | " " | "\n"{1,2} [ \t]{0,20}'


def schema_grammar(schema: Any) -> str:
    """GBNF for a JSON schema, by llama.cpp's converter (its Python port, with the C++
    one's string characters and spaces: llama-server's grammar); a GrammarError naming
    what it could not convert."""
    try:
        plain = flat_refs(plain_subschemas(schema), frozenset(RESERVED_NAMES))
        gbnf = json_schema_to_gbnf(json.dumps(plain))
    except Exception as e:  # the converter raises bare Exceptions and ValueErrors
        raise GrammarError(f"the JSON schema cannot be turned into a grammar: {e}") from None
    return spaced_as_cpp(gbnf.replace(PORT_CHAR, CPP_CHAR).replace(PORT_SPACE, CPP_SPACE))


CLOSER = re.compile(r'(\S+)(\s+)("[}\]]")')  # what comes before a closing brace or bracket


def spaced_as_cpp(gbnf: str) -> str:
    """The port's spaces where the C++ converter puts them: after `{`, `[`, `:` and `,`
    and before `}` and `]`, never after a value (the port's `space` after every value let
    a model write `100` and its comma on the next line, where llama-server's grammar goes
    on with the number)."""
    lines = []
    for line in gbnf.splitlines():
        name, sep, body = line.partition(" ::= ")
        if sep and name != "space":
            body = re.sub(r" space$", "", body)
            body = CLOSER.sub(lambda m: m[0] if m[1] == "space" else f"{m[1]} space {m[3]}", body)
        lines.append(name + sep + body)
    return "\n".join(lines) + "\n"


def json_object_grammar() -> str:
    """Any JSON object (OpenAI's response_format json_object)."""
    return JSON_GBNF


class LlamaGrammar:
    """GBNF compiled for `model`'s vocabulary."""

    def __init__(
        self,
        model: LlamaModel,
        gbnf: str,
        root: str = "root",
        style: bytes = b"",
        fresh_after: bytes = b"",
    ) -> None:
        """`style`: text written as the answer will be, for `forced_text`'s guesses where
        the answer has not shown its own yet (a tool call's, as its template writes it);
        `fresh_after`: a mark after which the answer starts (a thinking model's reasoning
        ends), its guesses from `style` again rather than from the reasoning's text."""
        self.model = model
        self.style = style[-TAIL:]
        self.fresh_after = fresh_after
        self.gbnf, self.root = gbnf.encode(), root.encode()
        # llama.cpp's grammar reads a control token as its name, so `<|im_start|>` would
        # pass as eleven characters of a JSON string; but the client gets no text for
        # it, and the grammar would follow text that is not the answer's. Refused,
        # unless the grammar names it (a format's own marker).
        self.hidden = np.zeros(model.n_vocab, dtype=bool)
        self.hidden[[t for t in model.control_ids if model.token_text(int(t)) not in gbnf]] = True
        LlamaGrammarState(self)  # parse it now: a bad grammar is the request's error
        self._bytes: list[int] | None = None

    def start(self) -> LlamaGrammarState:
        return LlamaGrammarState(self, tail=self.style)

    def within(self, other: object) -> bool:
        """The same grammar for the same model (`style` guesses, it allows nothing)."""
        return isinstance(other, LlamaGrammar) and (other.model, other.gbnf, other.root) == (
            self.model,
            self.gbnf,
            self.root,
        )

    def byte_tokens(self) -> list[int]:
        """token id of each printable ASCII character (-1: none), for forced_text."""
        if self._bytes is None:
            ids = [-1] * 128
            for c in range(32, 127):
                found = self.model.tokenize(chr(c), special=False)
                if len(found) == 1:
                    ids[c] = found[0]
            for c in (9, 10):  # tab, newline
                found = self.model.tokenize(chr(c), special=False)
                ids[c] = found[0] if len(found) == 1 else -1
            self._bytes = ids
        return self._bytes


class LlamaGrammarState:
    free = False  # a grammar of llama.cpp's holds to the answer's end

    def __init__(
        self, grammar: LlamaGrammar, sampler: ctypes.c_void_p | None = None, tail: bytes = b""
    ) -> None:
        self.grammar = grammar
        self.tail = tail  # the answer's last bytes: its style of optional spaces
        if sampler is None:
            sampler = ll.llama_sampler_init_grammar(
                grammar.model._vocab, grammar.gbnf, grammar.root
            )
            if not sampler:
                raise GrammarError("llama.cpp could not parse the grammar (GBNF)")
        self._sampler = sampler

    def _apply(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """The logits of `ids` after the grammar's mask (-inf: refused)."""
        data = np.empty(len(ids), dtype=TOKEN_DATA)
        data["id"], data["logit"], data["p"] = ids, logits, 0.0
        array = ll.llama_token_data_array(
            data=data.ctypes.data_as(ll.llama_token_data_p),
            size=len(ids),
            selected=-1,
            sorted=False,
        )
        ll.llama_sampler_apply(self._sampler, ctypes.byref(array))
        data["logit"][self.grammar.hidden[ids]] = -np.inf
        return data["logit"]

    def allows(self, token: int) -> bool:
        return bool(np.isfinite(self._apply(np.array([token]), np.zeros(1)))[0])

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        """(A draft model's token past the grammar's vocabulary: refused, never asked.)"""
        ok = tokens < self.grammar.model.n_vocab
        out = np.zeros(len(tokens), dtype=bool)
        out[ok] = np.isfinite(self._apply(tokens[ok].astype(np.int32), np.zeros(int(ok.sum()))))
        return out

    def mask(self, logits: np.ndarray) -> np.ndarray:
        n = len(logits)
        return self._apply(np.arange(n, dtype=np.int32), logits).astype(logits.dtype)

    def accept(self, token: int) -> None:
        ll.llama_sampler_accept(self._sampler, token)
        self.tail = (self.tail + self.grammar.model.token_bytes(token))[-TAIL:]
        mark = self.grammar.fresh_after
        if mark and (at := self.tail.rfind(mark)) >= 0:
            self.tail = (self.grammar.style + self.tail[at + len(mark) :])[-TAIL:]

    def clone(self) -> LlamaGrammarState:
        sampler = ll.llama_sampler_clone(self._sampler)
        return LlamaGrammarState(self.grammar, sampler, self.tail)

    def forced_text(self, limit: int) -> bytes:
        """Probed one character at a time over the single-character tokens (a byte-level
        vocabulary has one for each): where exactly one is allowed and the grammar is not
        complete, that character is forced. Where the choice is only whitespace or the
        one character it precedes (`space` between a JSON answer's parts), the answer's
        own style guesses (`in_style`): a draft, not a certainty, that the target checks."""
        table = self.grammar.byte_tokens()
        ids = np.array([t for t in table if t >= 0], dtype=np.int32)
        chars = [c for c, t in enumerate(table) if t >= 0]
        eog = self.grammar.model.special_ids[1]
        here, out = self.clone(), bytearray()
        while len(out) < limit:
            found = np.flatnonzero(np.isfinite(here._apply(ids, np.zeros(len(ids)))))
            allowed = {chars[i] for i in found}
            if not allowed or here.allows(eog):
                break
            solid = allowed - WHITESPACE
            if len(allowed) == 1:
                char: int | None = allowed.pop()
            elif len(solid) <= 1:
                char = in_style(here.tail, allowed, self.grammar.style)
            else:
                break
            if char is None:
                break
            out.append(char)
            here.accept(int(table[char]))
        return bytes(out)

    def forced_tokens(self, limit: int) -> list[int]:
        return []  # text only: `forced_text`

    def __del__(self) -> None:
        if getattr(self, "_sampler", None):
            ll.llama_sampler_free(self._sampler)
            self._sampler = None
