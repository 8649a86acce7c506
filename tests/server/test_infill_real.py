"""Fill-in-the-middle on the real default pair, as editors call it: llama.vscode's and
llama.vim's /infill bodies (from their sources), OpenAI's `suffix`, and a prompt the
client templated itself (Continue)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest
from decoding.test_real_engine import NEAR_TIE
from fastapi.testclient import TestClient

from localspec.backends.base import common_prefix
from localspec.backends.llama import LoadOptions
from localspec.backends.reader import reads_faster_plain
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished, Piece
from localspec.decoding.sampling import SamplingParams
from localspec.server.app import ServerOptions, create_app
from localspec.server.infill import (
    ExtraChunk,
    InfillLines,
    InfillRequest,
    Unopened,
    infill_prompt,
    middle_config,
)
from localspec.session import Session, SessionConfig, open_session

pytestmark = pytest.mark.real


PREFIX = '''import math


def circle_area(r):
    """The area of a circle of radius r."""
    return math.pi * r ** 2


def circle_perimeter(r):
    """The perimeter of a circle of radius r."""
'''
SUFFIX = '''


def square_area(a):
    """The area of a square of side a."""
    return a * a
'''
EXTRA = [
    {
        "text": "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
        "time": 1,
        "filename": "a.py",
    }
]


def vscode_body(prefix: str, suffix: str, typed: str, extra=EXTRA, **more) -> dict:
    """llama.vscode's request (src/llama-server.ts: createRequestPayload with its
    defaultRequestParams), greedy here so the answers can be compared."""
    return {
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": extra,
        "prompt": typed,
        "n_predict": 64,
        "top_k": 40,
        "top_p": 0.99,
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 10_000,
        "temperature": 0,
        **more,
    }


VIM_FIELDS = [
    "content",
    "timings/prompt_n",
    "timings/prompt_ms",
    "timings/prompt_per_token_ms",
    "timings/prompt_per_second",
    "timings/predicted_n",
    "timings/predicted_ms",
    "timings/predicted_per_token_ms",
    "timings/predicted_per_second",
    "truncated",
    "tokens_cached",
]


def vim_body(prefix: str, suffix: str, typed: str, indent: int) -> dict:
    """llama.vim's request (autoload/llama.vim, llama#fim)."""
    return {
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": [],
        "prompt": typed,
        "n_predict": 32,
        "n_indent": indent,
        "top_k": 40,
        "top_p": 0.99,
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 10_000,
        "response_fields": VIM_FIELDS,
        "temperature": 0,
    }


@pytest.fixture(scope="module")
def session(real_paths) -> Iterator[Session]:
    load = LoadOptions(n_ctx=4096, n_threads=2, n_seq=2)
    target_load = replace(load, prompt_reader=True)  # as serve loads it (reader.py)
    s = open_session(
        SessionConfig(str(real_paths[0]), str(real_paths[1]), "auto", target_load, load)
    )
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(session: Session) -> Iterator[TestClient]:
    with TestClient(create_app(session, ServerOptions("coder", parallel=2))) as c:
        yield c


def test_llama_vscode_gets_a_middle_with_llama_servers_fields(client: TestClient):
    r = client.post("/infill", json=vscode_body(PREFIX, SUFFIX, "    return"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert "math.pi" in body["content"] and body["stop"] is True
    assert body["tokens_evaluated"] > 50 and body["tokens_predicted"] >= 1
    assert body["truncated"] is False
    for key in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second"):
        assert key in body["timings"]


def test_llama_vim_gets_the_response_fields_it_asks_for(client: TestClient):
    r = client.post("/infill", json=vim_body(PREFIX, SUFFIX, "    return", 4))
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == set(VIM_FIELDS)
    assert "math.pi" in body["content"] and body["timings/predicted_n"] >= 1


def test_a_warm_up_reads_the_extra_context_and_the_next_keystroke_little(
    session: Session, client: TestClient
):
    """llama.vscode's warm-up (n_predict 0, only input_extra), then a completion, then the
    same completion one keystroke later: each reads only from where its prompt changed
    (the typed text opens the middle: at a keystroke on the line, the prompt is the same)."""
    extra = [{"text": "def lerp(a, b, t):\n    return a + (b - a) * t\n" * 8, "filename": "m.py"}]
    warm = vscode_body("", "", "", extra, n_predict=0, samplers=[], t_max_predict_ms=1)
    r = client.post("/infill", json=warm)
    assert r.status_code == 200 and r.json()["content"] == ""
    read = r.json()  # what llama.vscode shows of it: the reading, and what is now cached
    assert read["timings"]["prompt_ms"] > 0 and read["timings"]["predicted_ms"] == 0
    assert read["tokens_cached"] == read["tokens_evaluated"] > 100
    if reads_faster_plain():  # x86: that long a read went through the reader (reader.py)
        assert session.target.reader is not None and session.target.reader.reads > 0
    first = client.post("/infill", json=vscode_body(PREFIX, SUFFIX, "    ret", extra)).json()
    again = client.post("/infill", json=vscode_body(PREFIX, SUFFIX, "    retu", extra)).json()
    # the slot holds the prompt, the typed text's tokens (not sent back) and the middle
    opened = first["tokens_cached"] - first["tokens_evaluated"] - first["tokens_predicted"]
    assert 1 <= opened <= 3, first
    assert first["timings"]["cache_n"] > 100  # the extra chunks were read by the warm-up
    chunks = [ExtraChunk(text=c["text"], filename=c["filename"]) for c in extra]
    before, after = (
        infill_prompt(session.target, PREFIX, SUFFIX, chunks, typed, 64, 4096).tokens
        for typed in ("    ret", "    retu")
    )
    assert before == after  # the typed text is not in the prompt
    assert again["timings"]["cache_n"] == len(after) - 1, again["timings"]
    assert again["timings"]["prompt_n"] == 1  # the last token again, for its logits
    # typed as the middle began: the slot's last middle answers it (Engine.recall), from
    # the cache that holds it, with no pass but the one for what comes after it
    assert again["timings"]["recalled_n"] > 0, again["timings"]
    assert again["content"].startswith(first["content"][1:]), (first, again)
    # a typo, then the typo deleted: the last middle (the typo's) cannot vouch for the
    # middle after "    ret" again, but the slot's suffix index holds the first one: drafted
    # there, and counted as llama-server counts it
    client.post("/infill", json=vscode_body(PREFIX, SUFFIX, "    retx", extra))
    back = client.post("/infill", json=vscode_body(PREFIX, SUFFIX, "    ret", extra)).json()
    timings = {"draft_n": 0, "draft_n_accepted": 0} | back["timings"]  # none if none drafted
    assert "recalled_n" not in timings
    shared = common_prefix(
        *(session.target.tokenize(c, special=False) for c in (first["content"], back["content"]))
    )
    assert timings["draft_n"] >= timings["draft_n_accepted"] >= shared // 3 > 0, (
        timings,
        first["content"],
        back["content"],
    )
    assert "draft_n" not in read["timings"]  # nothing was drafted: as llama-server, no counts


def test_the_typed_text_opens_the_middle_but_its_whole_lines_close_the_prefix(session):
    """Only the cursor's line opens the middle: lines a client sends in `prompt` before
    it are read as llama-server reads them, where the line rule cannot drop them."""
    built = infill_prompt(session.target, PREFIX, SUFFIX, [], "    x = 1\n    ret", 8, 4096)
    fim = session.target.fim_tokens()
    lines = session.target.tokenize("    x = 1\n", special=False)
    before_suffix = built.tokens[: built.tokens.index(fim.suf)]
    assert built.opening == "    ret" and before_suffix[-len(lines) :] == lines
    assert built.tokens[-1] == fim.mid
    # so such a request is laid out as sent, even where its prefix goes on from a recent
    # one's (the written lines would open the middle after the prompt's own lines)
    from localspec.server.anchors import Anchors
    from localspec.server.prepare import prepare_infill

    anchors = Anchors()
    prepare_infill(InfillRequest(**vim_body(PREFIX, SUFFIX, "    ", 4)), session, anchors)
    body = vim_body(PREFIX + "    y = 2\n", SUFFIX, "    x = 1\n    ret", 4)
    laid = prepare_infill(InfillRequest(**body), session, anchors)
    sent = infill_prompt(session.target, body["input_prefix"], SUFFIX, [], body["prompt"], 32, 4096)
    assert laid.prompt == sent.tokens and laid.opening == "    ret"
    # OpenAI's suffix with a grammar of the request's: the prompt is all prefix, as sent,
    # and no layout is kept for the next request to go on from
    from localspec.server.prepare import prepare_completion
    from localspec.server.schemas import CompletionRequest

    anchors = Anchors()
    ruled = {"prompt": PREFIX + "    ret", "suffix": SUFFIX, "grammar": 'root ::= "urn 1"'}
    prepared = prepare_completion(CompletionRequest(**ruled), session, anchors=anchors)
    assert prepared.opening == "" and prepared.config.grammar is not None
    assert anchors.place((), PREFIX + "    x = 1\n", SUFFIX).written == ""


def test_every_kind_of_middle_is_a_short_request(session):
    """An editor waits on a middle, whatever it asks for (llama.vim's default n_predict
    is 128): its job goes first in a full pass, as a request for a few tokens does."""
    import asyncio

    from localspec.server.jobs import Job
    from localspec.server.prepare import prepare_completion, prepare_infill
    from localspec.server.schemas import CompletionRequest

    fim = "<|fim_prefix|>" + PREFIX + "<|fim_suffix|>" + SUFFIX + "<|fim_middle|>"
    middles = [
        prepare_infill(
            InfillRequest(**vim_body(PREFIX, SUFFIX, "", 4) | {"n_predict": 128}), session
        ),
        prepare_completion(
            CompletionRequest(prompt=PREFIX, suffix=SUFFIX, max_tokens=128), session
        ),
        prepare_completion(CompletionRequest(prompt=fim, max_tokens=128), session),
    ]
    story = prepare_completion(
        CompletionRequest(prompt="Once upon a time", max_tokens=128), session
    )
    loop = asyncio.new_event_loop()
    try:
        jobs = [Job("x", p.prompt, p.config, loop, middle=p.middle) for p in [*middles, story]]
    finally:
        loop.close()
    assert [job.short for job in jobs] == [True, True, True, False]


def test_a_streamed_middle_is_the_whole_one_without_the_typed_text(client: TestClient):
    """llama-server's /infill stream: {content} pieces, then the whole response with empty
    content; the pieces make the middle's line that the unstreamed request gets (the two
    read the prompt in other passes, so a near-tie further on may part them), and none
    of them repeats what was typed."""
    body = vscode_body(PREFIX, SUFFIX, "    retu", n_predict=16)
    whole = client.post("/infill", json=body).json()
    with client.stream("POST", "/infill", json=body | {"stream": True}) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert chunks[-1]["stop"] is True and chunks[-1]["content"] == ""
    assert {c["id_slot"] for c in chunks} == {chunks[-1]["id_slot"]}  # its slot, throughout
    streamed = "".join(c["content"] for c in chunks[:-1])
    line = whole["content"].split("\n")[0]
    assert line.startswith("rn") and streamed.split("\n")[0] == line, (streamed, whole)
    assert chunks[-1]["tokens_predicted"] >= 1
    # llama-server's n_probs: the middle's tokens' log-probabilities, not the typed text's
    probed = client.post("/infill", json=body | {"n_probs": 2}).json()
    probs = probed["completion_probabilities"]
    assert probs and all(len(p["top_logprobs"]) == 2 for p in probs)
    spelled = "".join(p["token"] for p in probs)  # its first token may hold typed text
    typed_part = len(spelled) - len(probed["content"])
    assert spelled.endswith(probed["content"]) and typed_part < len("    retu"), probs


def test_each_middle_names_the_slot_that_wrote_it(client: TestClient):
    """llama-server's id_slot: two unrelated middles one after the other go to both
    slots (the second to the one used least recently), each named in its answer as
    GET /slots names it."""
    used = set()
    for name in ("alpha", "omega"):
        prefix = f"def {name}_total(items):\n    return "
        body = client.post("/infill", json=vscode_body(prefix, "\n", "", [], n_predict=4)).json()
        ran = max(client.get("/slots").json(), key=lambda s: s["id_task"])
        assert body["id_slot"] == ran["id"]
        used.add(body["id_slot"])
    assert used == {0, 1}


def test_openai_suffix_and_a_client_templated_prompt(client: TestClient):
    r = client.post(
        "/v1/completions",
        json={
            "prompt": PREFIX + "    return",
            "suffix": SUFFIX,
            "max_tokens": 16,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    assert "math.pi" in r.json()["choices"][0]["text"]
    # Continue's autocomplete: its Qwen-Coder template and stop strings (the template's,
    # then its multi-line and common ones: core/autocomplete/templating), streamed
    templated = f"<|fim_prefix|>{PREFIX}    return<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    tokens = ["endoftext", "fim_prefix", "fim_middle", "fim_suffix", "fim_pad", "repo_name"]
    tokens += ["file_sep", "im_start", "im_end"]
    stops = [f"<|{t}|>" for t in tokens] + ["\n\n", "\r\n\r\n", "/src/", "#- coding: utf-8", "```"]
    body = {"prompt": templated, "max_tokens": 16, "temperature": 0, "stop": stops}
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
    text = "".join(json.loads(line)["choices"][0]["text"] for line in lines)
    assert "math.pi" in text and "<|" not in text


def test_a_client_templated_keystroke_reads_one_token(client: TestClient):
    """Continue's autocomplete templates the prompt itself, the typed text at the end of
    the prefix: served as /infill's, the typed text opens the middle (not sent back), so
    the next keystroke's prompt is the last one's; llama.vscode's OpenAI mode too, to
    llama-server's /completion."""

    def complete(path: str, typed: str) -> tuple[str, dict]:
        templated = f"<|fim_prefix|>{PREFIX}{typed}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
        body = {"prompt": templated, "max_tokens": 8, "temperature": 0}
        answer = client.post(path, json=body).json()
        if path == "/completion":
            return answer["content"], answer["timings"]
        usage = answer["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        return answer["choices"][0]["text"], {"prompt_n": usage["prompt_tokens"] - cached}

    for path in ("/v1/completions", "/completion"):
        first, _ = complete(path, "    ret")
        again, read = complete(path, "    retu")
        assert first.startswith("urn") and again.startswith("rn"), (first, again)
        assert read["prompt_n"] == 1, read


STATS_PREFIX = '''import statistics


def mean_and_spread(xs):
    """The mean of xs and the standard deviation around it."""
'''
STATS_SUFFIX = (
    '''

def median(xs):
    """The middle value of xs."""
    return statistics.median(xs)
'''
    * 4
)


def test_after_enter_the_text_after_the_cursor_is_not_read_again(client: TestClient):
    """The middle's first line written, then Enter, as llama.vim sends it: the line joins
    the prefix, which comes before the suffix in a FIM prompt, so laid out as sent the
    suffix is read again. Laid out at the last middle's prefix, the line opening the new
    middle (server/anchors.py), the prompt is the one the slot holds: one token is read
    (for its logits), and a line written as the last middle suggested it is answered
    from that middle, with no pass. So too for a prompt the client templated itself."""

    def infill(prefix: str, typed: str) -> dict:
        body = vim_body(prefix, STATS_SUFFIX, typed, len(typed) - len(typed.lstrip())) | {
            "n_predict": 48
        }
        r = client.post("/infill", json=body | {"response_fields": None})
        assert r.status_code == 200, r.text
        return r.json()

    first = infill(STATS_PREFIX, "    n")
    line, _, rest = first["content"].partition("\n")
    assert rest.startswith("    ") and len(rest) > 12, first["content"]  # lines to come
    enter = infill(STATS_PREFIX + "    n" + line + "\n", "    ")
    assert enter["tokens_evaluated"] == first["tokens_evaluated"]  # the same prompt
    assert enter["timings"]["prompt_n"] == 1, enter["timings"]
    assert enter["timings"]["recalled_n"] > 0, enter["timings"]
    later = rest[4:]  # the last middle after the line and the indentation typed
    assert enter["content"].startswith(later) or later.startswith(enter["content"]), (
        first["content"],
        enter["content"],
    )
    assert enter["content"], enter
    # a line the last middle did not suggest: read as the middle's opening, nothing else
    other = infill(STATS_PREFIX + "    count = len(xs)\n", "    ")
    assert other["timings"]["prompt_n"] == 1 and "count = len" not in other["content"], other

    def templated(head: str) -> dict:
        prompt = f"<|fim_prefix|>{head}<|fim_suffix|>{STATS_SUFFIX}<|fim_middle|>"
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
        return client.post("/v1/completions", json=body).json()

    templated(STATS_PREFIX + "    total")
    usage = templated(STATS_PREFIX + "    total = sum(xs)\n    ")["usage"]
    assert usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"] == 1, usage
    # Continue cuts the prefix's first lines to fit its budget: still the same layout
    cut = STATS_PREFIX.split("\n", 1)[1] + "    total = sum(xs)\n    n = len(xs)\n    "
    usage = templated(cut)["usage"]
    assert usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"] == 1, usage


def test_the_middle_stops_where_it_rejoins_the_suffix(client: TestClient):
    prefix = "def add(a, b):\n    "
    suffix = "\n\ndef sub(a, b):\n    return a - b\n"
    body = client.post("/infill", json=vscode_body(prefix, suffix, "", [], n_predict=48)).json()
    assert "def sub" not in body["content"], body["content"]  # the suffix's line, not twice
    assert body["content"].strip()


def test_t_max_predict_ms_stops_at_the_first_line_end_after_it(client: TestClient):
    prefix = "def numbers():\n    return [\n"
    body = vscode_body(prefix, "    ]\n", "", [], n_predict=64, t_max_predict_ms=1)
    answer = client.post("/infill", json=body).json()
    assert answer["stop_type"] == "limit" and answer["content"].count("\n") == 1
    assert answer["content"].endswith("\n")


def test_greedy_middle_equals_plain_decoding(session: Session, client: TestClient, real_models):
    """The served middle (the suffix and extra chunks drafting, in a slot) against plain
    decoding of the same prompt on a model of its own, token for token."""
    body = vscode_body(PREFIX, SUFFIX, "    return", n_predict=24, return_tokens=True)
    served = client.post("/infill", json=body).json()["tokens"]
    target, _ = real_models
    chunks = [ExtraChunk(text=c["text"], filename=c["filename"]) for c in EXTRA]
    built = infill_prompt(target, PREFIX, SUFFIX, chunks, "    return", 24, 4096)
    config = GenerationConfig(
        24, SamplingParams(temperature=0), trace=True, lines=InfillLines(SUFFIX, 0, 10.0)
    )
    config = middle_config(built, config, target)  # the typed text opens the middle
    events = list(Engine(target, NoDrafter(), 0).generate(built.tokens, config))
    opened = events[-1]
    assert isinstance(opened, Finished) and served
    done = Unopened(built.opening, target.token_bytes).finished(opened)  # as the client's
    pieces = [e for e in events if isinstance(e, Piece) and e.token >= 0]
    pieces = pieces[len(opened.tokens) - len(done.tokens) :]
    for i, (got, want) in enumerate(zip(served, done.tokens, strict=False)):
        if got != want:  # a batched pass may move a near-tie, never a clear choice
            margin = pieces[i].margin
            assert margin is not None and margin < NEAR_TIE, (i, got, want, margin)
            assert got == pieces[i].runner_up
            return
    assert list(served) == list(done.tokens)


def test_llama_vscodes_chat_edit_warm_up_reads_and_answers_nothing(client: TestClient):
    """llama.vscode's chat edit (src/llama-server.ts: createChatEditRequestPayload): its
    warm-up, n_predict 0, reads the context into a slot and answers at once; the edit that
    follows finds it cached (it asks max_tokens -1, "no limit": here 16 so the test is short)."""
    context = "def area(r):\n    return 3.14159 * r * r\n" * 6
    system = {"role": "system", "content": "You are an expert coder."}
    messages = [system, {"role": "user", "content": context}]
    warm = {"messages": messages, "n_predict": 0, "samplers": [], "cache_prompt": True}
    warm |= {"t_max_prompt_ms": 500, "t_max_predict_ms": 1}
    answer = client.post("/v1/chat/completions", json=warm).json()
    assert answer["choices"][0]["message"]["content"] == ""
    assert answer["usage"]["completion_tokens"] == 0
    edit = {"messages": messages, "stream": False, "samplers": "edkypmxt", "temperature": 0}
    edit |= {"dynatemp_range": 0, "typical_p": 1, "xtc_probability": 0, "dry_multiplier": 0}
    edit |= {"repeat_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0}
    edit |= {"max_tokens": -1, "n_predict": 16, "timings_per_token": False}
    after = client.post("/v1/chat/completions", json=edit).json()
    assert after["usage"]["completion_tokens"] <= 16
    cached = after["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= answer["usage"]["prompt_tokens"] - 1
