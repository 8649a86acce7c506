"""A custom tool's grammar (Lark, or a regex) as GBNF: what is translated, how its text
is written inside a JSON string, and what is left unenforced. Whether llama.cpp's engine
takes the result on the real vocabulary: test_structured_real.py."""

from __future__ import annotations

import pytest

from localspec.server.chat import HERMES, XML, tool_grammar
from localspec.server.lark_gbnf import input_gbnf, lark_gbnf
from localspec.server.responses import ResponsesRequest, ToolIn

# the patch format Codex's apply_patch takes, written here as its own Lark grammar
PATCH = r"""
start: "*** Begin Patch" LF op+ "*** End Patch" LF?
op: add | remove | update
add: "*** Add File: " path LF ("+" text LF)+
remove: "*** Delete File: " path LF
update: "*** Update File: " path LF ("*** Move to: " path LF)? edits?
edits: (anchor | edit)+ ("*** End of File" LF)?
anchor: ("@@" | "@@ " /(.+)/) LF
edit: ("+" | "-" | " ") text LF -> line
path: /(.+)/
text: /(.*)/
%import common.LF
"""


def rules(gbnf: str) -> dict[str, str]:
    return dict(line.split(" ::= ", 1) for line in gbnf.splitlines())


def test_the_patch_grammar_is_written_as_is_or_in_a_json_string():
    raw, in_json = (
        rules(lark_gbnf(PATCH, "p-", False) or ""),
        rules(lark_gbnf(PATCH, "p-", True) or ""),
    )
    assert raw["p-root"] == in_json["p-root"] == "p-start"
    assert raw["p-start"].startswith('"*** Begin Patch" p-t-lf (p-op+) "*** End Patch"')
    # Lark's rule `path` and a terminal `LF` keep apart in GBNF's one namespace
    assert raw["p-t-lf"] == '"\\x0A"' and in_json["p-t-lf"] == '"\\\\n"'
    assert raw["p-path"] == "([^\\x0A]+)"  # `.`: any character but a newline
    # in a JSON string: no raw control character, quote or backslash; each as its escape
    # (\n left out with the newline), the rest of the controls as \u00XX
    path = in_json["p-path"]
    assert "[^\\x0A\\x00-\\x1F\\x22\\x5C]" in path and '"\\\\n"' not in path
    assert all(f'"{e}"' in path for e in ('\\\\\\"', "\\\\\\\\", "\\\\t", "\\\\r"))
    assert '"\\\\u000" [01234567befBEF]' in path and '"\\\\u001" [0123456789abcdefABCDEF]' in path
    assert set(raw) == set(in_json) and len(raw) == 12  # root, 10 rules, LF


@pytest.mark.parametrize(
    "grammar",
    [
        'start: WORD ("," WORD)*\n%import common.WORD\n%ignore " "',  # between any two
        'start: list\nlist: list "," "x" | "x"',  # left recursion: llama.cpp refuses it
        'start: e\ne: "(" e ")" | opt e "!"\nopt: "?"?',  # left recursion, past an empty rule
        'start: pair{"a"}\npair{x}: x x',  # templates
        "start: /a(?=b)/",  # a lookahead
        "start: /abc/i",  # regex flags
        'start: "abc"i',  # a case-insensitive string
        "start: NAME\n%import python.NAME",  # a grammar other than common.lark
        "start: x\n%declare x",
        "item: 'x'",  # no start
        "start: (",  # not Lark
    ],
)
def test_what_gbnf_cannot_hold_leaves_the_input_unenforced(grammar):
    assert lark_gbnf(grammar, "p-", True) is None


def test_a_regex_and_common_terminals():
    gbnf = rules(input_gbnf("regex", r'\d{3}-[^\s]+"?', "r-", False) or "")
    assert gbnf["r-root"] == '[0-9]{3} "-" [^\\x09-\\x0D\\x20]+ "\\""?'
    number = rules(
        lark_gbnf("start: SIGNED_NUMBER\n%import common.SIGNED_NUMBER", "n-", False) or ""
    )
    # what common.lark's terminal names in turn comes along
    assert {"n-t-signed-number", "n-t-number", "n-t-float", "n-t-int", "n-t-digit"} <= set(number)
    assert input_gbnf("regex", "(unclosed", "r-", False) is None
    assert input_gbnf("grammar-of-another-kind", "x", "r-", False) is None


def test_a_custom_tools_grammar_rides_on_its_tool_into_the_chat():
    """From the Responses API's custom tool to the chat request's tool, and into the
    forced call's grammar: the JSON call's input as a JSON string, the XML call's as is."""
    custom = {
        "type": "custom",
        "name": "apply_patch",
        "format": {"type": "grammar", "syntax": "lark", "definition": PATCH},
    }
    plain = {"type": "custom", "name": "note", "format": {"type": "text"}}
    request = ResponsesRequest.model_validate({"input": "edit it", "tools": [custom, plain]})
    tools = request.chat().tools or []
    assert tools[0]._input_grammar == ("lark", PATCH) and tools[1]._input_grammar is None
    assert ToolIn.model_validate(custom).as_function()._input_grammar == ("lark", PATCH)
    hermes, xml = rules(tool_grammar(tools, HERMES)), rules(tool_grammar(tools, XML))
    # this tool's input ...
    assert hermes["alternative-0-arguments-input"] == '"\\"" input-0-root "\\""'
    assert "localspecinput" not in tool_grammar(tools, HERMES)
    assert hermes["input-0-t-lf"] == '"\\\\n"' and xml["input-0-t-lf"] == '"\\x0A"'
    assert hermes["alternative-1-arguments-input-kv"].endswith(" string")  # the other's: any
    assert xml["call-0"].endswith('"<parameter=input>\\n" input-0-root "\\n</parameter>\\n"')


def test_strings_are_written_as_llama_cpp_reads_them():
    """A quote, a backslash and unprintables in a Lark string or regex: escaped for
    GBNF as they are, and as a JSON string writes them inside one."""
    grammar = r'start: "say \"a\\b\"\n\x08" /x\ty/'
    raw, in_json = (rules(lark_gbnf(grammar, "p-", j) or "")["p-start"] for j in (False, True))
    assert raw == r'"say \"a\\b\"\x0A\x08" ("x" "\x09" "y")'
    assert in_json == r'"say \\\"a\\\\b\\\"\\n\\b" ("x" "\\t" "y")'
