"""`localspec bench --suite json`: structured output as agents ask for it, against
llama.cpp's `llama-server` with the same schema.

A few schemas of what agents request (a tool call's arguments, extraction results, a
plan, a review), each with a request in words, sent to every server as OpenAI's
`response_format: json_schema`, greedy, streamed, case for case in a rotating order:
`localspec serve` decoding plainly under the grammar and with `--gamma auto` (its drafts
and the grammar's jump-forward drafts), and `llama-server` plainly, with the draft model
(`-md`) and with its `ngram-mod` drafter. Per mode: decode tok/s (client side, tokens
after the first over the time after it), TTFT, whether each answer parses and follows its
schema, and whether it equals localspec's constrained plain decoding; where it does not,
the first token where the two part, scored by the target (`audit_agreement`).

The tokens a rate counts are those of the text the client saw, as the target's tokenizer
splits it, the same count for every server (`shown_tokens`). A server's usage may count
more: both servers' grammars for a chat let the model open the JSON with a ```json fence
and close it with ``` (localspec.server.fence), which they decode but do not stream, so
their usage puts 5-12% more tokens into the same span of streamed text.
"""

from __future__ import annotations

import json
import statistics
import time
import zlib
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from localspec.bench.audit import JUDGED
from localspec.bench.servers import MODES, PairSetup, settle, start_pair_servers
from localspec.errors import LocalspecError
from localspec.paths import write_atomic

STRING = {"type": "string"}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "write_file": (
        "Write a Python module with a function that checks whether a string is a "
        "palindrome, and a test for it. Give the file to write.",
        {
            "type": "object",
            "properties": {"path": STRING, "content": STRING},
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    ),
    "extract_contact": (
        "Extract the contact: 'Hi, I'm Dana Whitfield, lead engineer at Norrland Robotics. "
        "Reach me at dana.w@norrland.example or +46 8 555 0199. I'm 41.'",
        {
            "type": "object",
            "properties": {
                "name": STRING,
                "company": STRING,
                "role": STRING,
                "email": STRING,
                "phone": STRING,
                "age": {"type": "integer"},
            },
            "required": ["name", "company", "role", "email", "phone", "age"],
            "additionalProperties": False,
        },
    ),
    "plan_steps": (
        "Plan how to add a --verbose flag to a Python command-line tool that uses argparse.",
        {
            "type": "object",
            "properties": {
                "goal": STRING,
                "steps": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"file": STRING, "change": STRING},
                        "required": ["file", "change"],
                        "additionalProperties": False,
                    },
                    "maxItems": 5,
                },
            },
            "required": ["goal", "steps"],
            "additionalProperties": False,
        },
    ),
    "review": (
        "Review this code: def avg(xs): return sum(xs) / len(xs)",
        {
            "type": "object",
            "properties": {
                "summary": STRING,
                "issues": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "severity": {"enum": ["low", "medium", "high"]},
                            "message": STRING,
                        },
                        "required": ["severity", "message"],
                        "additionalProperties": False,
                    },
                    "maxItems": 4,
                },
            },
            "required": ["summary", "issues"],
            "additionalProperties": False,
        },
    ),
    "http_call": (
        "Create the HTTP request that creates a GitHub issue titled 'Crash on start' in "
        "the repository octo/widgets.",
        {
            "type": "object",
            "properties": {
                "method": {"enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]},
                "url": STRING,
                "headers": {
                    "type": "object",
                    "properties": {"Accept": STRING, "Authorization": STRING},
                    "required": ["Accept", "Authorization"],
                    "additionalProperties": False,
                },
                "body": STRING,
            },
            "required": ["method", "url", "headers", "body"],
            "additionalProperties": False,
        },
    ),
    "classify": (
        'Which language is this, and how sure are you? fn main() { println!("hi"); }',
        {
            "type": "object",
            "properties": {
                "language": {"enum": ["python", "rust", "go", "c", "javascript", "other"]},
                "confidence": {"type": "number"},
                "evidence": STRING,
            },
            "required": ["language", "confidence", "evidence"],
            "additionalProperties": False,
        },
    ),
}


@dataclass(frozen=True)
class Streamed:
    """One streamed answer as its client saw it."""

    tokens: int  # as the server's usage counts them
    ttft_s: float
    span_s: float  # from the first piece of text to the last
    text: str


@dataclass
class JsonRow:
    case: str
    mode: str
    tokens: int  # as the server's usage counts them
    ttft_s: float
    tokens_per_s: float  # shown tokens after the first over the time after it
    text: str
    valid: bool
    why: str = ""  # why it is not valid
    agrees: bool | None = None  # equal to localspec-plain's answer
    audit: str = ""  # where it is not: the first difference, scored by the target
    token_ids: list[int] | None = None  # asked for where it is audited ([]: could not be)
    shown_tokens: int = 0  # the text's, as the target splits it (0: a report of before)


@dataclass
class JsonReport:
    setup: dict[str, Any]
    rows: list[JsonRow] = field(default_factory=list)


def check(text: str, schema: dict[str, Any]) -> tuple[bool, str]:
    """Whether `text` is JSON that follows `schema` (jsonschema where installed, else
    parsing only)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return False, f"not JSON: {e.msg}"
    try:
        import jsonschema
    except ImportError:
        return True, ""
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        return False, e.message
    return True, ""


def ask(
    client: httpx.Client,
    base: str,
    prompt: str,
    schema: dict[str, Any],
    n: int,
    temperature: float = 0.0,
    repeat: int = 0,
) -> Streamed:
    """One streamed request with the schema, greedy or sampled (the same sampler settings
    and seed on every server). A greedy repeat carries a seed of its own: localspec
    answers the same greedy request from its last answer (Engine.recall), where asking
    one server again is meant to time the work again."""
    body = {
        "model": "any",
        "messages": [{"role": "user", "content": prompt}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        "temperature": temperature,
        "max_tokens": n,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if temperature:
        body |= {"top_p": 1.0, "top_k": 40, "min_p": 0.05, "seed": zlib.crc32(prompt.encode())}
    elif repeat:
        body["seed"] = repeat
    started = time.perf_counter()
    first = last = None
    text, tokens = "", 0
    with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            raise LocalspecError(f"{base} answered {r.status_code}: {r.text[:200]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            now = time.perf_counter()
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first, last = first or now, now
                    text += piece
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return Streamed(
        tokens, (first or started) - started, (last or started) - (first or started), text
    )


def shown_tokens(client: httpx.Client, base: str, text: str) -> int:
    """How many tokens the target splits `text` into (`base`'s /tokenize)."""
    r = client.post(f"{base}/tokenize", json={"content": text})
    if r.status_code != 200:
        raise LocalspecError(f"{base}/tokenize answered {r.status_code}: {r.text[:200]}")
    return len(r.json()["tokens"])


def to_row(
    client: httpx.Client, base: str, case: str, mode: str, got: Streamed, schema: dict[str, Any]
) -> JsonRow:
    """The report's row of `got`: its rate over the tokens shown, counted by `base`."""
    shown = shown_tokens(client, base, got.text)
    rate = (shown - 1) / got.span_s if got.span_s > 0 else 0.0
    valid, why = check(got.text, schema)
    return JsonRow(
        case, mode, got.tokens, got.ttft_s, rate, got.text, valid, why, shown_tokens=shown
    )


def run_json(
    setup: PairSetup,
    max_tokens: int,
    logs: Path,
    repeats: int = 1,
    progress: Callable[[str], None] = lambda _: None,
    temperature: float = 0.0,
) -> JsonReport:
    """Every case on every server, in a rotating order; greedy answers are compared with
    localspec's constrained plain decoding (sampled ones differ by design)."""
    shown = {"max_tokens": max_tokens, "temperature": temperature}
    report = JsonReport({k: str(v) for k, v in asdict(setup).items()} | shown)
    with httpx.Client(timeout=600) as client:
        for r in range(repeats):
            # each repeat from servers started afresh: asked the same greedy question
            # again, a server drafts from what it kept of its last answer (localspec's
            # suffix index, ngram-mod's n-gram pool), and the repeat would time that memory
            with ExitStack() as stack:
                bases = start_pair_servers(
                    stack,
                    setup,
                    logs / f"repeat-{r + 1}" if repeats > 1 else logs,
                    lambda base: ask(client, base, "Say hi.", {"type": "object"}, 8),
                    progress,
                )
                ask_cases(client, bases, report, r, max_tokens, temperature, progress)
                if r == repeats - 1 and not temperature:  # asked again while they are up
                    mark_agreement(report)
                    progress("asking again for the tokens of the answers that differ")
                    ask_tokens(client, bases, report, max_tokens)
    return report


def mark_agreement(report: JsonReport) -> None:
    """Whether each greedy answer is localspec's constrained plain decoding's."""
    plain = {row.case: row.text for row in report.rows if row.mode == "localspec-plain"}
    for row in report.rows:
        if row.mode != "localspec-plain" and row.case in plain:
            row.agrees = row.text == plain[row.case]


def ask_cases(
    client: httpx.Client,
    bases: dict[str, str],
    report: JsonReport,
    r: int,
    max_tokens: int,
    temperature: float,
    progress: Callable[[str], None],
) -> None:
    """Repeat r: every case on every server, each case starting at another server."""
    names = list(bases)
    for i, (case, (prompt, schema)) in enumerate(CASES.items()):
        k = (i + r) % len(names)
        for mode in names[k:] + names[:k]:
            progress(f"{case}: {mode}")
            got = ask(client, bases[mode], prompt, schema, max_tokens, temperature, r)
            settle(client, bases[mode])  # not on the next server's time
            report.rows.append(to_row(client, bases["localspec-plain"], case, mode, got, schema))


def token_ids(
    client: httpx.Client, base: str, prompt: str, schema: dict[str, Any], n: int
) -> tuple[str, list[int]]:
    """The greedy answer again, not streamed, with each token's id (its logprobs entry's
    `id`, which both servers give): the text and the tokens."""
    body = {
        "model": "any",
        "messages": [{"role": "user", "content": prompt}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        "temperature": 0.0,
        "max_tokens": n,
        "logprobs": True,
    }
    r = client.post(f"{base}/v1/chat/completions", json=body)
    if r.status_code != 200:
        raise LocalspecError(f"{base} answered {r.status_code}: {r.text[:200]}")
    choice = r.json()["choices"][0]
    entries = (choice.get("logprobs") or {}).get("content") or []
    return choice["message"]["content"] or "", [int(e["id"]) for e in entries]


def ask_tokens(
    client: httpx.Client, bases: dict[str, str], report: JsonReport, max_tokens: int
) -> None:
    """For each answer that is not localspec-plain's, both answers' tokens, asked again
    with logprobs after the timed rounds. Asked again, a server may answer otherwise (a
    warm cache splits its passes otherwise, and so rounds otherwise at a near-tie): then
    the answer audited is the one it gave again, and the audit says so."""
    plain = {r.case: r for r in report.rows if r.mode == "localspec-plain"}
    for row in report.rows:
        base = plain.get(row.case)
        if base is None or row.agrees is not False:
            continue
        prompt, schema = CASES[row.case]
        if base.token_ids is None:
            text, ids = token_ids(client, bases[base.mode], prompt, schema, max_tokens)
            base.token_ids = ids if text == base.text else []
        text, row.token_ids = token_ids(client, bases[row.mode], prompt, schema, max_tokens)
        if text == base.text:
            row.audit = "asked again, it answered as localspec-plain"
        elif text != row.text:
            row.audit = "asked again, it answered otherwise; that answer: "


def audit_agreement(report: JsonReport, setup: PairSetup) -> None:
    """Where a greedy answer differs from localspec-plain's, judge the first token where
    they part (audit.judge, under the grammar a chat's schema makes), on the target loaded
    afresh."""
    from localspec.backends.llama import LlamaModel, LoadOptions
    from localspec.backends.llama_grammar import schema_grammar
    from localspec.bench.audit import judge
    from localspec.server.fence import chat_grammar
    from localspec.session import SessionConfig, open_session

    plain = {r.case: r for r in report.rows if r.mode == "localspec-plain"}
    differ = [r for r in report.rows if r.agrees is False and r.case in plain]
    if not differ:
        return
    load = LoadOptions(n_ctx=setup.n_ctx, n_threads=setup.threads)
    session = open_session(SessionConfig(str(setup.target), "none", 1, load, load))
    try:
        model = session.target
        assert isinstance(model, LlamaModel)  # a GGUF file's
        for row in differ:
            a, b = plain[row.case].token_ids, row.token_ids
            if row.audit.startswith("asked again, it answered as"):
                continue
            if not a or not b:
                row.audit = "not audited: its tokens could not be had"
                continue
            ask, schema = CASES[row.case]
            prompt = session.tokenize_raw(session.prompt_text([{"role": "user", "content": ask}]))
            state = chat_grammar(model, schema_grammar(schema)).start()
            other = not row.mode.startswith("localspec")
            row.audit += judge(model, prompt, a, b, state, other_grammar=other)
    finally:
        session.close()


DIFFERENCES = (
    "Differences from localspec-plain's answer (each asked again for its tokens; the first "
    "token where the two part, judged on the target: a token the schema's grammar refuses, "
    "or another server's token where the target's clear choice is one ours allows, is "
    f"another grammar; {JUDGED}):"
)


def to_markdown(report: JsonReport) -> str:
    modes = [m for m in MODES if any(r.mode == m for r in report.rows)]
    ref = "llama-server" if "llama-server" in modes else "localspec-plain"

    def rate(mode: str) -> float:
        return statistics.median(r.tokens_per_s for r in report.rows if r.mode == mode)

    temperature = float(report.setup.get("temperature", 0))
    how = f"sampled at temperature {temperature:g}" if temperature else "greedy"
    lines = [
        f"# Structured output (response_format json_schema): {len(CASES)} schemas, {how}",
        "",
        "Decode tok/s: client side, streamed, median over the cases: the tokens of the "
        "text shown (the target's tokenizer; the same count for every server) after the "
        "first, over the time after it. Valid: parses and "
        "follows its schema. = plain: the same text as localspec's constrained plain "
        "decoding (greedy runs only).",
        "",
        f"| mode | tok/s | / localspec-plain | / {ref} | TTFT p50 s | valid | = plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in modes:
        mine = [r for r in report.rows if r.mode == m]
        agree = [r.agrees for r in mine if r.agrees is not None]
        lines.append(
            f"| {m} | {rate(m):.2f} | {rate(m) / rate('localspec-plain'):.2f}x "
            f"| {rate(m) / rate(ref):.2f}x | {statistics.median(r.ttft_s for r in mine):.2f} "
            f"| {sum(r.valid for r in mine)}/{len(mine)} "
            f"| {f'{sum(agree)}/{len(agree)}' if agree else '-'} |"
        )
    cells = []
    for case in CASES:
        rates = {r.mode: r.tokens_per_s for r in report.rows if r.case == case}
        cells.append(f"- {case}: " + ", ".join(f"{m} {rates[m]:.1f}" for m in modes if m in rates))
    bad = [f"- {r.case} {r.mode}: {r.why}" for r in report.rows if not r.valid]
    audits = [f"- {r.case} {r.mode}: {r.audit}" for r in report.rows if r.audit]
    return (
        "\n".join(
            [
                *lines,
                "",
                "tok/s by case:",
                *cells,
                *(["", "Invalid:", *bad] if bad else []),
                *(["", DIFFERENCES, *audits] if audits else []),
            ]
        )
        + "\n"
    )


def write(report: JsonReport, out: Path) -> list[Path]:
    data = {"setup": report.setup, "rows": [asdict(r) for r in report.rows]}
    paths = [out / "json.json", out / "json.md"]
    write_atomic(paths[0], json.dumps(data, indent=1))
    write_atomic(paths[1], to_markdown(report))
    return paths
