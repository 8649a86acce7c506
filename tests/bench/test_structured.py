"""The structured-output suite's checks and report, without servers (the real runs:
`localspec bench --suite json`; the engine under a grammar:
tests/server/test_structured_real.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import pytest

from localspec.bench.structured import CASES, JsonReport, JsonRow, check, to_markdown


def test_every_case_has_a_schema_the_converter_takes():
    from localspec.backends.llama_grammar import schema_grammar

    for prompt, schema in CASES.values():
        assert prompt and "root ::=" in schema_grammar(schema)


def test_answers_are_checked_against_their_schema():
    _, schema = CASES["classify"]
    assert check('{"language": "rust", "confidence": 0.9, "evidence": "fn main"}', schema)[0]
    ok, why = check('{"language": "cobol", "confidence": 0.9, "evidence": ""}', schema)
    assert not ok and "cobol" in why
    assert check("{", schema) == (
        False,
        "not JSON: Expecting property name enclosed in double quotes",
    )


def test_the_report_gives_ratios_to_plain_and_to_llama_server():
    rows = [
        JsonRow(
            case,
            mode,
            50,
            0.5,
            rate,
            "{}",
            True,
            agrees=None if mode == "localspec-plain" else True,
        )
        for case in CASES
        for mode, rate in (
            ("localspec-plain", 10.0),
            ("localspec-auto", 15.0),
            ("llama-server", 12.0),
        )
    ]
    md = to_markdown(JsonReport({}, rows))
    auto = next(line for line in md.splitlines() if line.startswith("| localspec-auto"))
    cells = [c.strip() for c in auto.split("|")[1:-1]]
    assert cells[1:4] == ["15.00", "1.50x", "1.25x"]
    assert cells[5] == f"{len(CASES)}/{len(CASES)}" and cells[6] == f"{len(CASES)}/{len(CASES)}"
    assert "greedy" in md.splitlines()[0]
    # sampled: said in the title, and no answer is held to plain decoding's
    sampled = [replace(r, agrees=None) for r in rows]
    md = to_markdown(JsonReport({"temperature": "0.7"}, sampled))
    assert "sampled at temperature 0.7" in md.splitlines()[0]
    auto = next(line for line in md.splitlines() if line.startswith("| localspec-auto"))
    assert auto.split("|")[-2].strip() == "-"


def test_strings_refuse_control_characters_as_llama_cpps_converter_does():
    """The Python port's `char` let a raw newline into a string (not JSON)."""
    from localspec.backends.llama_grammar import schema_grammar

    gbnf = schema_grammar({"type": "object", "properties": {"a": {"type": "string"}}})
    assert r'char ::= [^"\\\x7F\x00-\x1F] |' in gbnf


def test_spaces_stand_where_llama_servers_converter_puts_them():
    """After `{`, `[`, `:` and `,` and before `}` and `]`, never after a value (the C++
    converter's; the Python port put one after every value, so before a comma)."""
    from localspec.backends.llama_grammar import schema_grammar

    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "number"},
            "s": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["n", "s"],
    }
    rules = dict(line.split(" ::= ", 1) for line in schema_grammar(schema).splitlines())
    assert not rules["number"].endswith("space") and rules["string"] == '"\\"" char* "\\""'
    assert rules["root"] == '"{" space n-kv "," space s-kv space "}"'
    assert rules["s"].startswith('"[" space ') and rules["s"].endswith(' space "]"')
    empty = schema_grammar({"type": "object", "properties": {}})
    assert 'root ::= "{" space  "}"' in empty  # one `space` between, not two


def test_parts_of_an_answer_may_stand_on_lines_of_their_own_as_in_llama_server():
    from localspec.backends.llama_grammar import schema_grammar

    gbnf = schema_grammar({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert r'space ::= | " " | "\n"{1,2} [ \t]{0,20}' in gbnf


def test_whitespace_is_guessed_in_the_answers_own_style():
    from localspec.backends.llama_grammar import in_style

    ws = set(b' \n\t"')
    assert in_style(b'{ "a": 1, "b": 2,', ws) == ord(" ")  # on one line: as the last ","
    assert in_style(b'{"a": 1,"b": 2,', ws) == ord('"')
    assert in_style(b'{"a": 1,', ws) == ord(" ")  # a first ",": a space
    assert in_style(b'{\n  "a": 1,\n  "b": 2,', ws) == ord("\n")  # over lines
    assert in_style(b'{\n  "a": 1,\n', ws) == ord(" ")  # the last line's indentation
    assert in_style(b'{\n  "a": 1,\n  ', ws) == ord('"')  # then the key
    # '"' is not allowed here: the one character there is, without a space
    assert in_style(b'{"a":"x","b":', set(b" \n\t1")) == ord("1")
    assert in_style(b'{"a":"x","b":', set(b" \n\t12")) is None  # two: no guess
    # a fence's close, once a long answer's tail no longer holds its opening: as the
    # grammar's layout has it, not as the answer's "}," had it
    from localspec.server.fence import STYLE

    tail, fence = b'  "b": {"c": 1},\n  "d": 2\n}', set(b" \n\t`")
    assert in_style(tail, fence) == ord("`") and in_style(tail, fence, STYLE) == ord("\n")
    # a model that writes a space before its commas does so at each one
    comma = set(b" \n\t,")
    assert in_style(b'{ "a": "x" , "b": "y"', comma) == ord(" ")
    assert in_style(b'{ "a": "x" , "b": "y" ', comma) == ord(",")
    assert in_style(b'{ "a": "x", "b": "y"', comma) == ord(",")
    assert in_style(b'{ "a": "x"\n, "b": "y"', comma) == ord("\n")
    # what followed a ':' inside a string (a URL's) says nothing of the layout
    colon = set(b" \n\t{")
    assert in_style(b'{"url": "https://x", "headers":', colon) == ord(" ")
    assert in_style(b'{"url":"https://x","headers":', colon) == ord("{")
    # a first ',' of an answer laid out over lines: a new line, as after its '{'
    key = set(b' \n\t"')
    assert in_style(b'{\n  "method": "POST",', key) == ord("\n")
    assert in_style(b'{\n  "method"', set(b" \n\t:")) == ord(":")  # before a ':', no space
    # a new line after an opener: one step deeper, before a closer one shallower, the
    # step as the answer took it; before any step is known, no guess
    assert in_style(b"{\n", key) is None
    nested = b'{\n  "h": {\n'
    assert [in_style(nested + b" " * n, key) for n in range(5)] == [32, 32, 32, 32, 34]
    close = set(b" \n\t}")
    done = b'{\n  "h": {\n    "a": "x"\n'
    assert [in_style(done + b" " * n, close) for n in range(3)] == [32, 32, ord("}")]


@pytest.mark.real
def test_a_difference_from_plain_decoding_is_scored_by_the_target(real_paths, real_models):
    """The audit's verdicts, on the real target: an answer that picks another enum value
    is a defect (the target is sure of its choice); one that opens with a new line
    (llama-server's grammar allows one, localspec's a code fence only) has another
    grammar; one that stops early
    "stopped elsewhere"; one whose tokens could not be had is not audited."""
    from localspec.bench.servers import PairSetup
    from localspec.bench.structured import audit_agreement

    tok = real_models[0].tokenize
    answer = '{ "language": "%s", "confidence": 0.9, "evidence": "fn main"}'
    rust, python = tok(answer % "rust", False), tok(answer % "python", False)
    spaced = tok("\n" + answer % "rust", False)
    row = partial(JsonRow, "classify", tokens=20, ttft_s=0.1, tokens_per_s=10.0, valid=True)
    rows = [
        row(mode="localspec-plain", text="r", token_ids=rust),
        row(mode="localspec-auto", text="p", agrees=False, token_ids=python),
        row(mode="llama-server", text="s", agrees=False, token_ids=rust[:9]),
        row(mode="llama-server-md", text="x", agrees=False, token_ids=[]),
        row(mode="llama-server-ngram-mod", text="f", agrees=False, token_ids=spaced),
        row(mode="llama-server-md", text="y", agrees=False, token_ids=python),
    ]
    setup = PairSetup(real_paths[0], None, None, 2, 2048, None)
    audit_agreement(JsonReport({}, rows), setup)
    at = next(i for i, (a, b) in enumerate(zip(rust, python, strict=False)) if a != b)
    assert rows[1].audit.startswith(f"DEFECT: token {at}, "), rows[1].audit
    assert float(rows[1].audit.rsplit(" ", 1)[1]) > 1.0  # the target wrote "rust"
    assert rows[2].audit == f"the same tokens, stopped elsewhere ({len(rust)} vs 9)"
    assert rows[3].audit.startswith("not audited")
    assert rows[4].audit.startswith("another grammar: token 0, "), rows[4].audit
    # another server leaving the target's clear choice: its grammar, not a defect of ours
    assert rows[5].audit.startswith(f"another grammar: token {at}, "), rows[5].audit
    assert "its grammar refuses the target's choice, " in rows[5].audit
    md = to_markdown(JsonReport({}, rows))
    assert f"- classify localspec-auto: DEFECT: token {at}" in md


def test_a_rate_counts_the_tokens_shown_not_those_decoded_out_of_sight():
    """llama-server's grammar lets Qwen open the JSON with a ```json fence it decodes but
    does not stream: its usage counts the fence, the client's span does not hold it."""
    import httpx

    from localspec.bench.structured import Streamed, to_row

    def tokenize(request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["content"]
        return httpx.Response(200, json={"tokens": list(range(len(text.split())))})

    http = httpx.Client(transport=httpx.MockTransport(tokenize))
    _, schema = CASES["classify"]
    text = '{"language": "rust", "confidence": 1, "evidence": "fn main"}'  # 7 words
    fenced = Streamed(tokens=12, ttft_s=0.5, span_s=1.5, text=text)
    row = to_row(http, "http://tokenizer", "classify", "llama-server", fenced, schema)
    assert row.shown_tokens == 7 and row.tokens == 12
    assert row.tokens_per_s == pytest.approx(6 / 1.5) and row.valid


def test_each_repeat_asks_servers_started_afresh(monkeypatch, tmp_path):
    """Asked the same greedy question again, a server answers from what it kept of its
    last answer (localspec's suffix index, llama-server's ngram-mod n-grams: a repeat read
    2.9x and 4.3x constrained plain decoding, one case 9,627 tok/s), so each repeat
    starts its servers anew, in a log folder of its own; the audit asks the last ones."""
    from localspec.bench import structured
    from localspec.bench.servers import MODES, PairSetup

    events: list[tuple[str, str]] = []

    def start(stack, setup, logs, warm, progress):
        n = str(sum(kind == "start" for kind, _ in events) + 1)
        events.append(("start", logs.name))
        stack.callback(events.append, ("stop", n))
        return {mode: f"http://{mode}/{n}" for mode in MODES}

    def ask(client, base, prompt, schema, n, temperature=0.0, repeat=0):
        events.append(("ask", base.rsplit("/", 1)[1]))
        return structured.Streamed(8, 0.1, 1.0, "{}")

    def audit(client, bases, report, max_tokens):
        events.append(("audit", next(iter(bases.values())).rsplit("/", 1)[1]))

    monkeypatch.setattr(structured, "start_pair_servers", start)
    monkeypatch.setattr(structured, "ask", ask)
    monkeypatch.setattr(structured, "settle", lambda client, base: None)
    monkeypatch.setattr(structured, "shown_tokens", lambda client, base, text: 8)
    monkeypatch.setattr(structured, "ask_tokens", audit)
    setup = PairSetup(tmp_path / "t.gguf", None, None, 2, 4096, None)
    report = structured.run_json(setup, 8, tmp_path, repeats=2)
    asks = len(CASES) * len(MODES)
    assert events == [
        ("start", "repeat-1"),
        *[("ask", "1")] * asks,
        ("stop", "1"),
        ("start", "repeat-2"),
        *[("ask", "2")] * asks,
        ("audit", "2"),
        ("stop", "2"),
    ]
    assert len(report.rows) == 2 * asks
