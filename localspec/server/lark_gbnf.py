"""A custom tool's Lark grammar (Codex's `apply_patch`) as GBNF, so llama.cpp's grammar
engine holds a call's input to it, as `json_schema` holds an answer to its schema.

The grammar is read by Lark's own grammar of its syntax (lark/grammars/lark.lark), and
its terminals' regular expressions by Python's (`re`'s parser: a Lark terminal is a
Python regex). The input is written either as it is (an XML call's parameter) or inside
a JSON string (a JSON call's `"input"`), where a newline is `\\n`, a quote `\\"`. What
GBNF cannot hold here (`%ignore`, templates, lookarounds, anchors, back-references, regex
flags, left recursion, which llama.cpp's engine refuses) leaves the input unenforced: the
grammar is then only shown to the model, as before.
"""

from __future__ import annotations

import ast
import json
import re

# the stdlib's own regex parser and its opcodes (a Lark terminal is a Python regex)
import re._constants as sre
import re._parser as sre_parse
from functools import cache, lru_cache
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import LarkError

MAXREPEAT = int(sre.MAXREPEAT)
CONTROLS = range(0x20)  # raw in no JSON string: written as escapes
# the characters a JSON string writes escaped, and how (a control without a short form: \u00XX)
SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
CATEGORIES = {  # ASCII, as narrow as Python's (an input that matches here matches there)
    sre.CATEGORY_DIGIT: [(0x30, 0x39)],
    sre.CATEGORY_WORD: [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    sre.CATEGORY_SPACE: [(0x09, 0x0D), (0x20, 0x20)],
}
NEGATED = {
    sre.CATEGORY_NOT_DIGIT: sre.CATEGORY_DIGIT,
    sre.CATEGORY_NOT_WORD: sre.CATEGORY_WORD,
    sre.CATEGORY_NOT_SPACE: sre.CATEGORY_SPACE,
}


class Unsupported(Exception):
    """Part of a grammar GBNF cannot hold here."""


@cache
def meta_parser() -> Lark:
    return Lark.open_from_package("lark", "lark.lark", ("grammars",), parser="lalr")


@cache
def common_definitions() -> dict[str, Tree]:
    """lark/grammars/common.lark's terminals (what `%import common.X` names)."""
    import importlib.resources

    text = importlib.resources.files("lark").joinpath("grammars/common.lark").read_text()
    return definitions(meta_parser().parse(text))


@lru_cache(maxsize=64)  # an agent sends its tools with every request
def input_gbnf(syntax: str, definition: str, prefix: str, json_string: bool) -> str | None:
    """GBNF rules under `{prefix}root` for the text a custom tool's grammar allows (its
    syntax "lark" or "regex", as OpenAI's custom tools name them), written as is or as a
    JSON string's characters; None where GBNF cannot hold it here."""
    if syntax == "regex":
        try:
            body = Writer(prefix, json_string).regex(sre_parse.parse(definition))
        except (Unsupported, re.error):
            return None
        return f"{prefix}root ::= {body}\n"
    return lark_gbnf(definition, prefix, json_string) if syntax == "lark" else None


def lark_gbnf(definition: str, prefix: str, json_string: bool) -> str | None:
    """GBNF rules for the text `definition` (a Lark grammar, from `start`) allows, under
    `{prefix}root`, the text written as is or as a JSON string's characters; None where
    the grammar uses what GBNF cannot hold here (see the module's docstring)."""
    try:
        rules = definitions(meta_parser().parse(definition + "\n"))
        if "start" not in rules:
            return None
        writer = Writer(prefix, json_string)
        lines = [f"{prefix}root ::= {writer.name('start')}"]
        lines += [f"{writer.name(n)} ::= {writer.body(tree)}" for n, tree in rules.items()]
        check_not_left_recursive(rules)
    except (Unsupported, LarkError, re.error, ValueError, SyntaxError, KeyError):
        return None
    return "\n".join(lines) + "\n"


def definitions(tree: Tree) -> dict[str, Tree]:
    """Each rule's and terminal's expansions by name, imports from common.lark resolved
    (and what those name in turn)."""
    rules: dict[str, Tree] = {}
    wanted: dict[str, str] = {}  # a name used here -> its name in common.lark
    for item in tree.children:
        if not isinstance(item, Tree):
            continue
        if item.data in ("rule", "token"):
            name, params, *rest = item.children
            if params is not None and any(c is not None for c in params.children):
                raise Unsupported("templates")
            rules[str(name).lstrip("!?")] = rest[-1]  # the priority, if any, goes
        elif item.data == "import":
            path, alias = item.children
            parts = [str(p.children[0]) for p in path.children if isinstance(p, Tree)]
            if len(parts) != 2 or parts[0] != "common":
                raise Unsupported("an import from elsewhere than common.lark")
            wanted[str(alias.children[0]) if alias is not None else parts[1]] = parts[1]
        else:  # %ignore (which would put its terminal between any two), %declare, ...
            raise Unsupported(item.data)
    common = common_definitions() if wanted else {}
    while wanted:
        name, source = wanted.popitem()
        rules[name] = common[source]
        for used in referenced(common[source]):
            if used not in rules and used not in wanted.values():
                wanted[used] = used
    return rules


def leaf(tree: Tree) -> Token:
    token = tree.children[0]
    assert isinstance(token, Token)
    return token


def referenced(tree: Tree) -> set[str]:
    return {str(t.children[0]) for t in tree.iter_subtrees() if t.data == "name"}


class Writer:
    """Lark's expansions, and its terminals' regexes, as GBNF."""

    def __init__(self, prefix: str, json_string: bool) -> None:
        self.prefix, self.json_string = prefix, json_string

    def name(self, lark_name: str) -> str:
        # Lark's names differ by case (a rule `lf`, a terminal `LF`): GBNF's may not
        kind = "t-" if lark_name.lstrip("_")[:1].isupper() else ""
        return self.prefix + kind + lark_name.lower().replace("_", "-")

    def body(self, tree: Tree | Token) -> str:
        if isinstance(tree, Token):
            raise Unsupported(tree.type)
        kind = tree.data
        if kind == "expansions":
            return " | ".join(self.body(c) for c in tree.children)
        if kind == "alias":  # `-> name` shapes Lark's tree, not the text
            return self.body(tree.children[0])
        if kind == "expansion":
            return " ".join(group(self.body(c)) for c in tree.children) or '""'
        if kind == "maybe":
            return f"{group(self.body(tree.children[0]))}?"
        if kind == "expr":
            return group(self.body(tree.children[0])) + repeat(tree.children[1:])
        if kind == "name":
            return self.name(str(tree.children[0]))
        if kind == "literal":
            return self.literal(leaf(tree))
        if kind == "literal_range":
            lo, hi = (string_value(str(t)) for t in tree.children)
            if len(lo) != 1 or len(hi) != 1:
                raise Unsupported("a range of strings")
            return self.chars(False, [(ord(lo), ord(hi))])
        raise Unsupported(kind)

    def literal(self, token: Token) -> str:
        text = str(token)
        if token.type == "STRING":
            return self.text(string_value(text))
        pattern, _, flags = text[1:].rpartition("/")
        if flags:
            raise Unsupported(f"regex flags {flags}")
        return self.regex(sre_parse.parse(pattern.replace("\\/", "/")))

    def text(self, value: str) -> str:
        written = json.dumps(value, ensure_ascii=False)[1:-1] if self.json_string else value
        return gbnf_string(written)

    def regex(self, parsed: Any) -> str:
        return " ".join(self.node(op, arg) for op, arg in parsed) or '""'

    def node(self, op: Any, arg: Any) -> str:
        if op is sre.LITERAL:
            return self.text(chr(arg))
        if op is sre.NOT_LITERAL:
            return self.chars(True, [(arg, arg)])
        if op is sre.ANY:  # no DOTALL: any character but a newline
            return self.chars(True, [(0x0A, 0x0A)])
        if op is sre.IN:
            return self.char_class(arg)
        if op is sre.SUBPATTERN:
            _, add_flags, del_flags, inner = arg
            if add_flags or del_flags:
                raise Unsupported("inline regex flags")
            return group(self.regex(inner))
        if op is sre.BRANCH:
            return "(" + " | ".join(self.regex(p) for p in arg[1]) + ")"
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
            lo, hi, inner = arg
            return group(self.regex(inner)) + bounds(lo, None if hi == MAXREPEAT else hi)
        raise Unsupported(f"regex {op}")  # anchors, lookarounds, back-references, ...

    def char_class(self, items: list[tuple[Any, Any]]) -> str:
        negated, ranges = False, []
        for op, arg in items:
            if op is sre.NEGATE:
                negated = True
            elif op is sre.LITERAL:
                ranges.append((arg, arg))
            elif op is sre.RANGE:
                ranges.append(arg)
            elif op is sre.CATEGORY and arg in CATEGORIES:
                ranges += CATEGORIES[arg]
            elif op is sre.CATEGORY and arg in NEGATED and len(items) == 1:
                negated, ranges = True, CATEGORIES[NEGATED[arg]]
            else:
                raise Unsupported(f"regex class item {op}")
        return self.chars(negated, ranges)

    def chars(self, negated: bool, ranges: list[tuple[int, int]]) -> str:
        """A character of the set (its complement where `negated`), as it is written."""
        if not self.json_string:
            return char_set(negated, ranges)

        def member(c: int) -> bool:
            return any(lo <= c <= hi for lo, hi in ranges) != negated

        escaped = [c for c in [*CONTROLS, ord('"'), ord("\\")] if member(c)]
        if negated:  # everything else, raw, but what JSON writes escaped
            raw = char_set(True, [*ranges, (0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
        else:
            kept = split_out(ranges)
            raw = char_set(False, kept) if kept else ""
        forms = [raw] if raw else []
        forms += [gbnf_string(SHORT[chr(c)]) for c in escaped if chr(c) in SHORT]
        if member(ord("/")):  # JSON may escape a slash too
            forms.append(gbnf_string("\\/"))
        for high in (0, 1):  # the other controls as \u00XX, a class of their last digits
            digits = "".join(
                f"{c & 15:x}" for c in escaped if chr(c) not in SHORT and c >> 4 == high
            )
            if digits:
                upper = "".join(d.upper() for d in digits if d.isalpha())
                forms.append(f'"\\\\u00{high}" [{digits}{upper}]')
        return "(" + " | ".join(forms) + ")" if forms else '""'


# a GBNF term: a string, a class, a name, a parenthesis, or an operator's characters
TERM = re.compile(
    r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[a-zA-Z0-9-]+|[()]|[^\s"\[()a-zA-Z0-9-]+'
)


def group(body: str) -> str:
    """`body` as one term: in parentheses unless it is one already."""
    terms = [m[0] for m in TERM.finditer(body)]
    if len(terms) == 1 and terms[0] not in "()":
        return body
    depth = 0
    for i, term in enumerate(terms):
        depth += {"(": 1, ")": -1}.get(term, 0)
        if depth == 0:  # the first term closes here: the body is one group if it ends here
            return body if i == len(terms) - 1 and term == ")" else f"({body})"
    return f"({body})"


def split_out(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`ranges` without the characters a JSON string writes escaped."""
    out = []
    for lo, hi in ranges:
        lo = max(lo, 0x20)
        for cut in (0x22, 0x5C):
            if lo <= cut <= hi:
                if lo < cut:
                    out.append((lo, cut - 1))
                lo = cut + 1
        if lo <= hi:
            out.append((lo, hi))
    return out


def char_set(negated: bool, ranges: list[tuple[int, int]]) -> str:
    parts = "".join(hex_char(lo) + ("-" + hex_char(hi) if hi > lo else "") for lo, hi in ranges)
    return f"[{'^' if negated else ''}{parts}]"


def gbnf_string(text: str) -> str:
    """A GBNF string literal of `text` (its quotes, backslashes and unprintables escaped
    as llama.cpp's grammar parser reads them)."""
    escaped = {'"': '\\"', "\\": "\\\\"}
    body = "".join(escaped.get(c, c) if c.isprintable() else hex_char(ord(c)) for c in text)
    return f'"{body}"'


def hex_char(c: int) -> str:
    if chr(c).isalnum() and c < 0x80:
        return chr(c)
    return f"\\x{c:02X}" if c < 0x100 else f"\\u{c:04X}" if c < 0x10000 else f"\\U{c:08X}"


def string_value(token: str) -> str:
    if token.endswith("i"):
        raise Unsupported("a case-insensitive string")
    return str(ast.literal_eval(token))


def repeat(rest: list[Any]) -> str:
    """Lark's `?`, `*`, `+` or `~ n[..m]` as GBNF's."""
    if not rest or rest[0] is None:
        return ""
    if rest[0].type == "OP":
        return str(rest[0])
    lo = int(rest[0])
    hi = int(rest[1]) if len(rest) > 1 and rest[1] is not None else lo
    return bounds(lo, hi)


def bounds(lo: int, hi: int | None) -> str:
    if (lo, hi) == (0, None):
        return "*"
    if (lo, hi) == (1, None):
        return "+"
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo},}}" if hi is None else f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def check_not_left_recursive(rules: dict[str, Tree]) -> None:
    """llama.cpp's engine refuses a rule that can reach itself before reading a
    character; so is such a grammar refused here."""
    nullable: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, tree in rules.items():
            if name not in nullable and can_be_empty(tree, nullable):
                nullable.add(name)
                changed = True
    first = {name: leading_names(tree, nullable) for name, tree in rules.items()}
    for name in rules:
        seen, todo = set(), list(first[name])
        while todo:
            n = todo.pop()
            if n == name:
                raise Unsupported(f"left recursion in {name}")
            if n not in seen and n in first:
                seen.add(n)
                todo += first[n]


def can_be_empty(tree: Tree | Token, nullable: set[str]) -> bool:
    if isinstance(tree, Token):
        return False
    kind = tree.data
    if kind == "expansions":
        return any(can_be_empty(c, nullable) for c in tree.children)
    if kind == "alias":
        return can_be_empty(tree.children[0], nullable)
    if kind == "expansion":
        return all(can_be_empty(c, nullable) for c in tree.children)
    if kind == "maybe":
        return True
    if kind == "expr":
        optional = repeat(tree.children[1:]) in ("?", "*") or repeat(tree.children[1:])[:2] == "{0"
        return optional or can_be_empty(tree.children[0], nullable)
    if kind == "name":
        return str(tree.children[0]) in nullable
    if kind == "literal" and leaf(tree).type == "REGEXP":
        return re.fullmatch(str(leaf(tree))[1:].rpartition("/")[0], "") is not None
    return kind == "literal" and string_value(str(leaf(tree))) == ""


def leading_names(tree: Tree | Token, nullable: set[str]) -> set[str]:
    """The names that can come first in `tree`'s text."""
    if isinstance(tree, Token):
        return set()
    kind = tree.data
    if kind == "expansions":
        return set().union(*(leading_names(c, nullable) for c in tree.children))
    if kind in ("alias", "maybe", "expr"):
        return leading_names(tree.children[0], nullable)
    if kind == "expansion":
        out: set[str] = set()
        for child in tree.children:
            out |= leading_names(child, nullable)
            if not can_be_empty(child, nullable):
                break
        return out
    return {str(tree.children[0])} if kind == "name" else set()
