#!/usr/bin/env python3
"""`localspec serve` against llama.cpp's `llama-server`, as an editor sees them.

The same prompts, streamed one at a time through the `openai` SDK, against:
- `localspec serve` (the pair, `--gamma auto`), and in the chat suite the same server
  decoding plainly (`--draft none`: what `auto` gains, and our plain path against
  llama-server's);
- `llama-server -m T -md D` (llama.cpp's speculative server) and `llama-server -m T`
  (plain), built by `scripts/peer_speculative.sh build` from the vendored llama.cpp;
with the same models, threads and context, prompt for prompt. Client-side figures:
TTFT (request to first content) and tok/s (tokens after the first over the time after
it). With `--run`, also `localspec run --json` on each prompt, with the pair and
without the draft: the server's cost over it. `--no-peer` leaves llama-server out (a
machine without the peer build, such as a GPU one).
The editing suite (`--suite edit`) asks for small changes to a ~150-line file, with and
without `prediction` (= the original file), against `localspec serve` only.
Each server's request (or round) is timed alone: the bench waits until a server is idle
before the next one's (localspec's draft model reads ahead after answering; /health's
`reading_ahead`).

Many clients (`--suite clients --clients N`): N streaming chat clients at once, each
round N of the bench's prompts (`--specbench`: Spec-Bench's, one a category), against
`localspec serve --parallel N` and `llama-server -np N` with and without `-md` (the same
context per slot); the servers take turns, a different one first each round. Per round:
the aggregate tok/s (all tokens over the round's wall time) and each client's TTFT and
tok/s. "An editor beside a chat" (`--suite editor`): a 32-token code completion's
latency while a chat answer streams, over its latency alone (the servers started afresh
for the completions beside a chat: none drafts one from its own answer alone; with
`--paste-chars N`, beside a chat request carrying an N-character code paste, sent a
second before it, while the server reads the paste: an agent sending a file). Two
conversations taking turns (`--suite alternate`): each turn's TTFT, the second turns'
over the first's (does each find its context still cached?). New conversations with one
system prompt in one slot (`--suite newchat`): each one's TTFT, the later ones' over the
first's. An agent's next task (`--suite agent`, with a thinking model's template through
`--chat-template-file`): what its first request reads again after a task of tool calls,
and its TTFT, over the session's first read. A chat beside an index (`--suite index`): a
chat answer's tok/s while `/v1/embeddings` reads `--index-texts` chunks of the standard
library (8 a request, as an indexer sends them), over its tok/s alone, and the index's
time beside the chat over alone; llama-server serves embeddings when started with
`--embeddings --pooling mean`, which it is here.

    scripts/serve_bench.py --target T.gguf --draft D.gguf --threads 4 --prompts 10 \
        --out docs/bench/serve/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai

from localspec.bench import servers as bench_servers
from localspec.bench import specbench
from localspec.bench.servers import free_port, server
from localspec.bench.suite import BenchError

ROOT = Path(__file__).resolve().parent.parent
EDITS = (
    "Rename the method `area` to `surface_area` everywhere.",
    "Make `Circle.__init__` raise ValueError for a negative radius.",
    "Add a `__repr__` to `Rectangle` that shows its width and height.",
)


def edit_file() -> str:
    """A ~150-line Python module to edit (made here so the suite needs no data file)."""
    parts = ['"""Shapes and their measures."""', "", "import math", ""]
    shapes = [
        ("Circle", ["radius"], "math.pi * self.radius ** 2", "2 * math.pi * self.radius"),
        (
            "Rectangle",
            ["width", "height"],
            "self.width * self.height",
            "2 * (self.width + self.height)",
        ),
        ("Square", ["side"], "self.side ** 2", "4 * self.side"),
        (
            "Triangle",
            ["a", "b", "c"],
            "math.sqrt(self.s() * (self.s() - self.a) * (self.s() - self.b) * (self.s() - self.c))",
            "self.a + self.b + self.c",
        ),
        (
            "Ellipse",
            ["major", "minor"],
            "math.pi * self.major * self.minor",
            "math.pi * (3 * (self.major + self.minor) - math.sqrt((3 * self.major + self.minor)"
            " * (self.major + 3 * self.minor)))",
        ),
    ]
    for name, fields, area, perimeter in shapes:
        parts += ["", f"class {name}:", f'    """A {name.lower()}."""', ""]
        parts += [f"    def __init__(self, {', '.join(fields)}):"]
        parts += [f"        self.{f} = {f}" for f in fields]
        if name == "Triangle":
            parts += ["", "    def s(self):", "        return (self.a + self.b + self.c) / 2"]
        parts += ["", "    def area(self):", f"        return {area}"]
        parts += ["", "    def perimeter(self):", f"        return {perimeter}"]
        parts += ["", "    def scaled(self, k):", f"        return {name}("]
        parts += [f"            self.{f} * k," for f in fields] + ["        )", ""]
    parts += ["", "def total_area(shapes):", "    return sum(s.area() for s in shapes)", ""]
    parts += ["", "def largest(shapes):", "    return max(shapes, key=lambda s: s.area())", ""]
    return "\n".join(parts) + "\n"


def stream_one(base: str, messages: list[Any], max_tokens: int, **extra: Any) -> dict:
    """One streamed greedy request: client-side TTFT, tok/s, tokens, and the text."""
    client = openai.OpenAI(base_url=base, api_key="bench", max_retries=0, timeout=600)
    first = last = None
    text, usage, figures = "", None, None
    model = client.models.list().data[0].id  # a server may refuse other names
    started = time.perf_counter()
    cached = None
    for chunk in client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        **extra,
    ):
        now = time.perf_counter()
        delta = chunk.choices[0].delta if chunk.choices else None
        # a thinking model's first token is its reasoning's (both servers split it off)
        said = delta and (delta.content or (delta.model_extra or {}).get("reasoning_content"))
        if delta is not None and said:
            first = first or now
            last = now
            text += delta.content or ""
        if chunk.usage:
            usage = chunk.usage
        figures = (chunk.model_extra or {}).get("localspec", figures)
        # the prompt's tokens found cached: OpenAI's usage field, or llama-server's timings
        timings = (chunk.model_extra or {}).get("timings") or {}
        cached = timings.get("cache_n", cached)
    tokens = usage.completion_tokens if usage else 0
    span = (last or started) - (first or started)
    row = {
        "tokens": tokens,
        "ttft_s": (first or started) - started,
        "tokens_per_s": (tokens - 1) / span if span > 0 else 0.0,
        "text": text,
    }
    if usage is not None:
        row["prompt_tokens"] = usage.prompt_tokens
        found = getattr(usage, "prompt_tokens_details", None)
        if found is not None and found.cached_tokens is not None:
            cached = found.cached_tokens
    if cached is not None:
        row["cached_tokens"] = cached
    details = getattr(usage, "completion_tokens_details", None)
    if details is not None and details.accepted_prediction_tokens is not None:
        row["accepted_prediction"] = details.accepted_prediction_tokens
        row["rejected_prediction"] = details.rejected_prediction_tokens
    if figures:
        row["localspec"] = figures
    return row


def warm_up(base: str) -> None:
    """One short answer first, so no server's first figures include its warm-up."""
    stream_one(base, [{"role": "user", "content": "Say hello."}], 8)


def settle(base: str) -> None:
    """Wait until the server is idle (localspec's draft model reads ahead after an
    answer), so that its work is not timed on the next server's request."""
    with httpx.Client(timeout=30) as client:
        bench_servers.settle(client, base.removesuffix("/v1"))


def run_one(args: argparse.Namespace, prompt: str, draft: bool = True) -> dict:
    """`localspec run --json` on the same prompt: its own decode speed and TTFT."""
    cmd = [sys.executable, "-m", "localspec", "run", *model_args(args, draft), "--json"]
    cmd += ["-n", str(args.max_tokens), "--temperature", "0", prompt]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    return {"tokens": result["tokens"], **result["stats"], "text": result["text"]}


def model_args(args: argparse.Namespace, draft: bool = True) -> list[str]:
    """`localspec serve`'s model options; without the draft, it decodes plainly."""
    return [
        "--target",
        args.target,
        "--draft",
        args.draft if draft else "none",
        "--threads",
        str(args.threads),
        "--ctx",
        str(args.ctx),
    ]


def localspec_server(
    args: argparse.Namespace, port: int, draft: bool = True, parallel: int = 1
) -> list[str]:
    serve = [sys.executable, "-m", "localspec", "serve", *model_args(args, draft)]
    if getattr(args, "chat_template_file", None):
        serve += ["--chat-template-file", str(args.chat_template_file)]
    if getattr(args, "no_prompt_reader", False):
        serve += ["--no-prompt-reader"]
    return [*serve, "--port", str(port), "--parallel", str(parallel)]


def peer_draft(args: argparse.Namespace) -> Path:
    """The file localspec drafts with on this machine (its Q4_0 CPU copy of a draft on
    the CPU): llama-server gets the same one, so the two differ only in how they draft."""
    from localspec.backends import load_llama_library
    from localspec.backends.quantize import draft_to_load

    load_llama_library()
    return draft_to_load(Path(args.draft), on_gpu=args.gpu, target=Path(args.target))


def llama_server(args: argparse.Namespace, port: int, draft: bool, parallel: int = 1) -> list[str]:
    """llama-server with `parallel` slots of --ctx tokens each (its -c is their sum)."""
    threads = str(args.threads)
    cmd = [str(args.llama_server), "-m", args.target, "-t", threads, "-tb", threads]
    cmd += ["-c", str(args.ctx * parallel), "-np", str(parallel), "--port", str(port)]
    if getattr(args, "chat_template_file", None):
        cmd += ["--jinja", "--chat-template-file", str(args.chat_template_file)]
    if args.gpu:  # every layer on the GPU, as localspec's planner puts them where they fit
        cmd += ["-ngl", "999"] + (["-ngld", "999"] if draft else [])
    if not draft:
        return cmd
    cmd += ["-md", str(peer_draft(args)), "-td", threads, "--spec-type", "draft-simple"]
    return [*cmd, "--spec-draft-n-max", str(args.peer_n_max)]


def plain_pair(target: str, threads: int, ctx: int, parallel: int = 4) -> tuple[dict, dict]:
    """(commands, ports): `localspec serve --draft none` and `llama-server`, both decoding
    plainly with `parallel` slots of `ctx` tokens (scripts/slots_plain_ab.py and
    scripts/choices_bench.py: the two differ only in how they serve the slots)."""
    from localspec.bench.peer import default_bin_dir

    args = argparse.Namespace(
        target=target,
        draft=target,  # unused: neither server drafts
        threads=threads,
        ctx=ctx,
        llama_server=default_bin_dir() / "llama-server",
        gpu=False,
    )
    if not args.llama_server.exists():
        sys.exit(f"{args.llama_server} not found: run scripts/peer_speculative.sh build")
    ports = {"localspec": free_port(), "llama-server": free_port()}
    commands = {
        "localspec": localspec_server(args, ports["localspec"], draft=False, parallel=parallel),
        "llama-server": llama_server(args, ports["llama-server"], False, parallel),
    }
    return commands, ports


def chat_suite(args: argparse.Namespace, logs: Path) -> list[dict]:
    prompts = json.loads((ROOT / "localspec/data/bench_prompts.json").read_text())
    chosen = list(prompts.items())[: args.prompts]
    names = ("localspec", "localspec-plain", "llama-spec", "llama-plain")
    ports = {name: free_port() for name in names}
    commands = {
        "localspec": localspec_server(args, ports["localspec"], parallel=args.parallel),
        # the same server decoding plainly: what `auto` gains over it, and how its plain
        # path compares with llama-server's
        "localspec-plain": localspec_server(args, ports["localspec-plain"], draft=False),
    }
    if args.peer:
        commands["llama-spec"] = llama_server(args, ports["llama-spec"], draft=True)
        commands["llama-plain"] = llama_server(args, ports["llama-plain"], draft=False)
    rows: list[dict] = []
    bases: dict[str, str] = {}
    stack = [server(commands[n], ports[n], logs / f"{n}.log") for n in commands]
    try:
        for name, ctx in zip(commands, stack, strict=True):
            bases[name] = ctx.__enter__() + "/v1"
            warm_up(bases[name])
        for pid, spec in chosen:
            messages = [{"role": "user", "content": spec["prompt"]}]
            for name, base in bases.items():  # prompt for prompt: the same machine state
                rows.append(
                    {
                        "suite": "chat",
                        "prompt": pid,
                        "server": name,
                        **stream_one(base, messages, args.max_tokens),
                    }
                )
                settle(base)
                print(summary(rows[-1]), flush=True)
            runs = (("localspec-run", True), ("localspec-plain-run", False)) if args.run else ()
            for name, draft in runs:
                row = {"suite": "chat", "prompt": pid, "server": name}
                rows.append(row | run_one(args, spec["prompt"], draft))
                print(summary(rows[-1]), flush=True)
    finally:
        for ctx in reversed(stack[: len(bases)]):
            ctx.__exit__(None, None, None)
    return rows


def edit_suite(args: argparse.Namespace, logs: Path) -> list[dict]:
    """Each edit three ways: `localspec serve` with the file as the prediction, without
    it (auto: draft model and n-grams), and plain decoding (llama-server, no draft).
    With and without go to two servers: `auto` drafts from what a server answered
    before (its suffix index), so one server would hand the second request of an edit
    the first one's answer."""
    source = edit_file()
    ports = {name: free_port() for name in ("localspec", "localspec-nopred", "llama-plain")}
    commands = {
        "localspec": localspec_server(args, ports["localspec"]),
        "localspec-nopred": localspec_server(args, ports["localspec-nopred"]),
    }
    prediction = {"prediction": {"type": "content", "content": source}}
    modes: list[tuple[str, str, dict[str, Any]]] = [
        ("prediction", "localspec", prediction),
        ("no-prediction", "localspec-nopred", {}),
    ]
    if args.peer:
        commands["llama-plain"] = llama_server(args, ports["llama-plain"], draft=False)
        modes.append(("llama-plain", "llama-plain", {}))
    rows: list[dict] = []
    bases: dict[str, str] = {}
    stack = [server(commands[n], ports[n], logs / f"{n}-edit.log") for n in commands]
    try:
        for name, ctx in zip(commands, stack, strict=True):
            bases[name] = ctx.__enter__() + "/v1"
            warm_up(bases[name])
        for i, change in enumerate(EDITS[: args.prompts]):
            messages = [
                {
                    "role": "system",
                    "content": "You edit code. Reply with the complete updated file only.",
                },
                {"role": "user", "content": f"{change}\n\n```python\n{source}```"},
            ]
            for mode, name, extra in modes:
                row = stream_one(bases[name], messages, args.edit_max_tokens, **extra)
                settle(bases[name])
                rows.append({"suite": "edit", "prompt": f"edit-{i}", "server": mode, **row})
                print(summary(rows[-1]), flush=True)
    finally:
        for ctx in reversed(stack[: len(bases)]):
            ctx.__exit__(None, None, None)
    return rows


@contextmanager
def servers(commands: dict[str, list[str]], ports: dict[str, int], logs: Path, tag: str):
    """Start every server (one at a time), warm each up, yield their base URLs."""
    bases: dict[str, str] = {}
    stack = [server(commands[n], ports[n], logs / f"{n}-{tag}.log") for n in commands]
    try:
        for name, ctx in zip(commands, stack, strict=True):
            bases[name] = ctx.__enter__() + "/v1"
            warm_up(bases[name])
        yield bases
    finally:
        for ctx in reversed(stack[: len(bases)]):
            ctx.__exit__(None, None, None)


def many_servers(args: argparse.Namespace, parallel: int) -> tuple[dict, dict]:
    """(commands, ports): localspec and llama-server (-md and plain), `parallel` slots;
    with --slots, localspec with that many slots instead, and with --one-slot-too also
    `localspec-1slot` (one slot: how requests were served before slots), with
    --plain-too `localspec-plain` (no drafts: the server's own cost, apart from auto's),
    with --no-ram-too `localspec-noram` (no prompts kept in RAM: `--cache-ram 0`), with
    --split-too `localspec-split` (a cache per slot: `--no-kv-unified`)."""
    names = (
        "localspec",
        "localspec-1slot",
        "localspec-plain",
        "localspec-noram",
        "localspec-split",
    )
    ports = {name: free_port() for name in (*names, "llama-spec", "llama-plain")}
    slots = args.slots or parallel
    commands = {"localspec": localspec_server(args, ports["localspec"], parallel=slots)}
    if args.no_ram_too:
        noram = localspec_server(args, ports["localspec-noram"], parallel=slots)
        commands["localspec-noram"] = [*noram, "--cache-ram", "0"]
    if args.one_slot_too:
        commands["localspec-1slot"] = localspec_server(args, ports["localspec-1slot"])
    if args.split_too:
        split = localspec_server(args, ports["localspec-split"], parallel=slots)
        commands["localspec-split"] = [*split, "--no-kv-unified"]
    if args.plain_too:
        commands["localspec-plain"] = localspec_server(
            args, ports["localspec-plain"], draft=False, parallel=slots
        )
    if args.peer:
        commands["llama-spec"] = llama_server(args, ports["llama-spec"], True, parallel)
        commands["llama-plain"] = llama_server(args, ports["llama-plain"], False, parallel)
    return commands, ports


def turns(names: list[str], r: int) -> list[str]:
    """The servers in round r's order: each goes first in turn (the machine warms)."""
    k = r % len(names)
    return names[k:] + names[:k]


def clients_prompts(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """The clients suite's prompts: the bench's own, or with --specbench one of each
    Spec-Bench category (seed 0), as (name, {"prompt": ...})."""
    if not args.specbench:
        return list(json.loads((ROOT / "localspec/data/bench_prompts.json").read_text()).items())
    try:
        sample = specbench.load_sample(None, specbench.Sample(per_category=1))
    except BenchError as e:
        sys.exit(str(e))
    return [(q.name, {"prompt": q.prompt}) for q in sample]


def clients_suite(args: argparse.Namespace, logs: Path) -> list[dict]:
    prompts = clients_prompts(args)
    n = args.clients
    commands, ports = many_servers(args, n)
    rows: list[dict] = []
    with servers(commands, ports, logs, f"clients{n}") as bases:
        for r in range(args.rounds):
            chosen = [prompts[(r * n + i) % len(prompts)] for i in range(n)]
            for name in turns(list(bases), r):
                messages = [[{"role": "user", "content": spec["prompt"]}] for _, spec in chosen]
                started = time.perf_counter()
                with ThreadPoolExecutor(n) as pool:
                    answers = list(
                        pool.map(
                            lambda m, b=bases[name]: stream_one(b, m, args.max_tokens), messages
                        )
                    )
                wall = time.perf_counter() - started
                settle(bases[name])
                for (pid, _), answer in zip(chosen, answers, strict=True):
                    rows.append(
                        {"suite": f"clients{n}", "prompt": f"r{r}-{pid}", "server": name, **answer}
                    )
                total = sum(a["tokens"] for a in answers)
                rows.append(
                    {
                        "suite": f"clients{n}-round",
                        "prompt": f"r{r}",
                        "server": name,
                        "tokens": total,
                        "tokens_per_s": total / wall,
                        "ttft_s": max(a["ttft_s"] for a in answers),
                        "wall_s": wall,
                    }
                )
                print(summary(rows[-1]), flush=True)
    return rows


# the chat beside each completion: a new one each time, as the completion is
CHATS_BESIDE = (
    "Write a very long story about a lighthouse keeper and a storm.",
    "Write a very long story about a baker who opens a shop on the moon.",
    "Write a very long story about two rival chess clubs in a small town.",
    "Write a very long story about a robot that learns to garden.",
    "Write a very long story about a ferry crossing in thick fog.",
    "Write a very long story about a violin found in an attic.",
)
PASTE_AFTER_S = 1.0  # --paste-chars: the completion comes this long after the paste
COMPLETIONS = (
    'def fibonacci(n):\n    """The n-th Fibonacci number."""\n',
    "import json\n\n\ndef load_config(path):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n",
    "def is_prime(n: int) -> bool:\n",
    "def read_lines(path):\n    with open(path) as f:\n",
    "def merge_sorted(a, b):\n    out = []\n",
)


def complete_one(base: str, prompt: str, max_tokens: int, seed: int = 0) -> float:
    """Seconds for one whole (not streamed) greedy completion, as an editor waits for it.
    A request sent again is computed again only with other settings: localspec answers
    the same greedy request from its last answer (Engine.recall), so a repeat that
    should be timed as work carries a seed of its own (greedy either way)."""
    client = openai.OpenAI(base_url=base, api_key="bench", max_retries=0, timeout=600)
    started = time.perf_counter()
    client.completions.create(
        model="x", prompt=prompt, max_tokens=max_tokens, temperature=0, seed=seed
    )
    return time.perf_counter() - started


def paste(seed: int, chars: int) -> str:
    """An agent's request carrying a file: the first `chars` of the standard library's
    textwrap.py, headed by `seed` so that no cache holds it."""
    code = Path(textwrap.__file__).read_text()[:chars]
    return f"# paste {seed}\n{code}\n\nWhat does this module do?"


def chat_beside(seed: int) -> str:
    return CHATS_BESIDE[seed % len(CHATS_BESIDE)]


def beside_a_chat(
    base: str, prompt: str, max_tokens: int, seed: int = 1, paste_chars: int = 0
) -> float:
    """complete_one's time while a chat answer streams (from its first token on); both
    with `seed` (see complete_one), the chat's cut short the time before. With
    `paste_chars`, the chat carries a paste that long, and the completion comes
    PASTE_AFTER_S after it, while the server reads it."""
    streaming, stop = threading.Event(), threading.Event()
    opened: list[Any] = []
    content = paste(seed, paste_chars) if paste_chars else chat_beside(seed)

    def chat() -> None:
        client = openai.OpenAI(base_url=base, api_key="bench", max_retries=0, timeout=600)
        try:
            stream = client.chat.completions.create(
                model="x",
                messages=[{"role": "user", "content": content}],
                max_tokens=1024,
                temperature=0,
                seed=seed,
                stream=True,
            )
            opened.append(stream)
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    streaming.set()
                if stop.is_set():
                    break
            stream.close()
        except (httpx.HTTPError, openai.APIError):
            pass  # closed from outside while the server read the paste
        streaming.set()

    thread = threading.Thread(target=chat)
    thread.start()
    if paste_chars:
        time.sleep(PASTE_AFTER_S)
    else:
        streaming.wait(timeout=600)
    try:
        return complete_one(base, prompt, max_tokens, seed)
    finally:
        stop.set()
        for stream in opened:  # a paste still being read has sent no chunk to stop at
            stream.close()
        thread.join(timeout=600)
        time.sleep(1)  # the cancelled chat leaves its slot


def editor_suite(args: argparse.Namespace, logs: Path) -> list[dict]:
    """Each completion alone, then (servers started afresh) each beside a chat: a server
    that had answered the same completion would draft it from its own last answer (a
    slot's suffix index), where an editor asks for a new one."""
    commands, ports = many_servers(args, max(2, args.clients))
    chosen = list(enumerate(COMPLETIONS[: args.prompts]))
    alone: dict[tuple[int, str], float] = {}
    with servers(commands, ports, logs, "editor-alone") as bases:
        for i, prompt in chosen:
            for name in turns(list(bases), i):
                alone[i, name] = complete_one(bases[name], prompt, args.completion_tokens)
                settle(bases[name])
    rows: list[dict] = []
    with servers(commands, ports, logs, "editor-beside") as bases:
        for i, prompt in chosen:
            for name in turns(list(bases), i):
                during = beside_a_chat(
                    bases[name], prompt, args.completion_tokens, i + 1, args.paste_chars
                )
                settle(bases[name])
                before = alone[i, name]
                rows.append(
                    {
                        "suite": "editor",
                        "prompt": f"completion-{i}",
                        "server": name,
                        "alone_s": before,
                        "during_s": during,
                        "slowdown": during / before,
                        "beside": (
                            f"a {args.paste_chars}-char paste being read"
                            if args.paste_chars
                            else "a streaming chat"
                        ),
                        "tokens": args.completion_tokens,
                        "tokens_per_s": 0.0,
                        "ttft_s": during,
                    }
                )
                print(
                    f"editor completion-{i} {name:12} alone {before:.2f}s beside a chat "
                    f"{during:.2f}s ({during / before:.2f}x)",
                    flush=True,
                )
    return rows


def alternate_suite(args: argparse.Namespace, logs: Path) -> list[dict]:
    """Two conversations taking turns (a chat panel and an agent), each with a long
    context of its own: the second turn's TTFT over the first's, per server; in a slot
    each (--alternate-slots 2), or in one they share (1), where each turn's conversation
    comes back from RAM (localspec's and llama-server's --cache-ram) or is read again."""
    commands, ports = many_servers(args, args.alternate_slots)
    source = edit_file()
    systems = [
        f"You review this module. Be brief.\n\n```python\n{source}```",
        f"You write tests for this module. Be brief.\n\n{source.replace('self', 'obj')}",
    ]
    asks = [("Any bug in area()?", "And in scaled()?"), ("Test Circle.", "Test Square.")]
    rows: list[dict] = []
    with servers(commands, ports, logs, "alternate") as bases:
        for name, base in bases.items():
            talks = [[{"role": "system", "content": system}] for system in systems]
            for turn in range(2):
                for who in range(2):
                    talks[who].append({"role": "user", "content": asks[who][turn]})
                    row = stream_one(base, talks[who], 24)
                    settle(base)  # a turn comes after the reader's pause
                    talks[who].append({"role": "assistant", "content": row["text"]})
                    rows.append(
                        {"suite": "alternate", "prompt": f"c{who}-t{turn}", "server": name, **row}
                    )
                    print(summary(rows[-1]), flush=True)
    return rows


def newchat_suite(args: argparse.Namespace, logs: Path) -> list[dict]:
    """New conversations with one system prompt (an agent's next task, a new chat), in
    one slot: each one's TTFT, the later ones' over the first's (does the system prompt
    stay read? a hybrid target's state needs a copy kept where it ends)."""
    commands, ports = many_servers(args, 1)
    system = f"You review this module. Be brief.\n\n```python\n{edit_file()}```"
    asks = ["Any bug in area()?", "What does scaled() return?", "Is total_area() right?"]
    rows: list[dict] = []
    with servers(commands, ports, logs, "newchat") as bases:
        for name, base in bases.items():
            for i, ask in enumerate(asks):
                messages = [{"role": "system", "content": system}, {"role": "user", "content": ask}]
                row = stream_one(base, messages, 24)
                settle(base)
                rows.append({"suite": "newchat", "prompt": f"n{i}", "server": name, **row})
                print(summary(rows[-1]), flush=True)
    return rows


def agent_suite(args: argparse.Namespace, logs: Path) -> list[dict]:
    """An agent's session in one slot: a greeting, then two tasks of three tool calls
    (each call's reasoning and result sent back, as agents send them), then the next
    task. The messages are scripted, not the models' own, so every server reads the same
    prompts. In a thinking model's format (--chat-template-file: Qwen3.5's keeps the
    reasoning after the last message from the user only) a task's first prompt parts
    from the last one where the last task's first call begins: what is read again, and
    the TTFT, of the next task against the first request's (the system prompt, read
    whole); each task before the last adds to what a read from the start would cost."""
    commands, ports = many_servers(args, 1)
    source = edit_file()
    system = f"You fix this module with the tools you have. Be brief.\n\n```python\n{source}```"
    tasks = [
        (
            "Fix area() in circle.py.",
            [
                ("read_file", "The user wants area() fixed: read it first.", source[:900]),
                ("edit_file", "area() multiplies by the radius once: square it.", "written"),
                ("run_tests", "Check that the tests pass after the edit.", "12 passed"),
            ],
            "Fixed: area() squares the radius.",
        ),
        (
            "Now make scaled() keep the position too.",
            [
                ("read_file", "Read scaled() and what calls it.", source[900:1800]),
                ("edit_file", "Pass x and y through to the new shape.", "written"),
                ("run_tests", "Run the tests again.", "13 passed"),
            ],
            "Done: scaled() keeps x and y.",
        ),
    ]
    talk: list[dict] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Hi, can you help me with this module today?"},
    ]
    requests = [("r0", list(talk))]
    talk.append({"role": "assistant", "content": "Yes: what should I do?"})
    for t, (ask, steps, done) in enumerate(tasks):
        talk.append({"role": "user", "content": ask})
        requests.append((f"task{t + 1}", list(talk)))
        for i, (name, thought, result) in enumerate(steps):
            call_id = f"c{t}{i}"
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": "{}"},
            }
            talk += [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [call],
                    "reasoning_content": thought,
                },
                {"role": "tool", "tool_call_id": call_id, "content": result},
            ]
            requests.append((f"task{t + 1}-step{i + 1}", list(talk)))
        talk.append({"role": "assistant", "content": done, "reasoning_content": "The tests pass."})
    talk.append({"role": "user", "content": "Last: add a docstring to Square."})
    requests.append(("next-task", list(talk)))
    rows: list[dict] = []
    with servers(commands, ports, logs, "agent") as bases:
        for name, base in bases.items():
            for label, messages in requests:
                row = stream_one(base, messages, 16)
                settle(base)
                rows.append({"suite": "agent", "prompt": label, "server": name, **row})
                print(summary(rows[-1]), "cached", rows[-1].get("cached_tokens"), flush=True)
    return rows


def index_texts(n: int) -> list[str]:
    """`n` chunks of ~600 characters of the standard library's modules (about 150
    tokens each), as an indexer cuts a codebase."""
    texts: list[str] = []
    for path in sorted(Path(textwrap.__file__).parent.glob("*.py")):
        source = path.read_text(errors="replace")
        texts += [source[i : i + 600] for i in range(0, min(len(source), 2400), 600)]
        if len(texts) >= n:
            break
    return texts[:n]


def embed_texts(base: str, texts: list[str], per_request: int = 8) -> float:
    """Seconds to embed `texts`, `per_request` a request, one request at a time."""
    started = time.perf_counter()
    with httpx.Client(timeout=1200) as client:
        for i in range(0, len(texts), per_request):
            body = {"model": "x", "input": texts[i : i + per_request]}
            client.post(f"{base}/embeddings", json=body).raise_for_status()
    return time.perf_counter() - started


def index_suite(args: argparse.Namespace, logs: Path) -> list[dict]:
    texts = index_texts(args.index_texts)
    slots = args.slots or max(2, args.clients)
    ports = {name: free_port() for name in ("localspec", "llama-spec", "llama-plain")}
    commands = {"localspec": localspec_server(args, ports["localspec"], parallel=slots)}
    if args.peer:
        embeddings = ["--embeddings", "--pooling", "mean"]
        spec = llama_server(args, ports["llama-spec"], True, slots)
        plain = llama_server(args, ports["llama-plain"], False, slots)
        commands |= {"llama-spec": [*spec, *embeddings], "llama-plain": [*plain, *embeddings]}
    prompts = clients_prompts(args)
    rows: list[dict] = []
    with servers(commands, ports, logs, "index") as bases:
        for r in range(args.rounds):
            chat = [{"role": "user", "content": prompts[r % len(prompts)][1]["prompt"]}]
            for name in turns(list(bases), r):
                base = bases[name]
                alone = stream_one(base, chat, args.max_tokens, seed=r)
                settle(base)
                index_alone = embed_texts(base, texts)
                settle(base)
                with ThreadPoolExecutor(1) as pool:
                    indexing = pool.submit(embed_texts, base, texts)
                    time.sleep(1)  # the index is being read when the chat comes
                    beside = stream_one(base, chat, args.max_tokens, seed=r + 1000)  # not recalled
                    index_beside = indexing.result()
                settle(base)
                row = {
                    "suite": "index",
                    "prompt": f"r{r}",
                    "server": name,
                    "texts": len(texts),
                    "chat_alone_tokens_per_s": alone["tokens_per_s"],
                    "chat_beside_tokens_per_s": beside["tokens_per_s"],
                    "chat_beside_ttft_s": beside["ttft_s"],
                    "index_alone_s": index_alone,
                    "index_beside_s": index_beside,
                    "tokens": beside["tokens"],
                    "tokens_per_s": beside["tokens_per_s"],
                    "ttft_s": beside["ttft_s"],
                }
                rows.append(row)
                print(
                    f"index r{r} {name:12} chat {alone['tokens_per_s']:.1f} tok/s alone, "
                    f"{beside['tokens_per_s']:.1f} beside the index (TTFT "
                    f"{beside['ttft_s']:.2f}s); index {index_alone:.1f}s alone, "
                    f"{index_beside:.1f}s beside the chat",
                    flush=True,
                )
    return rows


def index_report(rows: list[dict]) -> str:
    """Medians over the rounds, per server."""
    lines = [
        "### A chat beside an index being built (`/v1/embeddings`)",
        "",
        "| server | chat tok/s alone | beside the index | ratio | TTFT beside s | "
        "index s alone | beside the chat |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in dict.fromkeys(r["server"] for r in rows):
        mine = [r for r in rows if r["server"] == name]

        def med(key: str, mine: list[dict] = mine) -> float:
            return statistics.median(r[key] for r in mine)

        alone, beside = med("chat_alone_tokens_per_s"), med("chat_beside_tokens_per_s")
        lines.append(
            f"| {name} | {alone:.1f} | {beside:.1f} | {beside / alone:.2f} | "
            f"{med('chat_beside_ttft_s'):.2f} | {med('index_alone_s'):.1f} | "
            f"{med('index_beside_s'):.1f} |"
        )
    return "\n".join(lines)


def many_report(rows: list[dict]) -> str:
    """The clients' and the editor's figures: medians, p95, and side-by-side ratios."""
    lines = []
    for suite in sorted({r["suite"] for r in rows if r["suite"].endswith("-round")}):
        per = suite.removesuffix("-round")
        lines += [
            f"### {per}: aggregate and per client",
            "",
            "| server | aggregate tok/s (median of rounds) | client tok/s p50 | "
            "TTFT p50 s | TTFT p95 s |",
            "|---|---:|---:|---:|---:|",
        ]
        names = list(dict.fromkeys(r["server"] for r in rows if r["suite"] == suite))
        agg = {
            name: {
                r["prompt"]: r["tokens_per_s"]
                for r in rows
                if (r["suite"], r["server"]) == (suite, name)
            }
            for name in names
        }
        for name in names:
            clients = [r for r in rows if (r["suite"], r["server"]) == (per, name)]
            ttfts = sorted(r["ttft_s"] for r in clients)
            p95 = ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))]
            lines.append(
                f"| {name} | {statistics.median(agg[name].values()):.2f} | "
                f"{statistics.median(r['tokens_per_s'] for r in clients):.2f} | "
                f"{statistics.median(ttfts):.2f} | {p95:.2f} |"
            )
        lines.append("")
        for other in names[1:]:
            ratios_ = [
                agg["localspec"][k] / agg[other][k] for k in agg["localspec"] if k in agg[other]
            ]
            if ratios_:
                lines.append(
                    f"- localspec over {other}, aggregate tok/s round for round: median "
                    f"{statistics.median(ratios_):.2f}x, min {min(ratios_):.2f}x "
                    f"({len(ratios_)} rounds)"
                )
        lines.append("")
    talks = [r for r in rows if r["suite"] == "alternate"]
    if talks:
        times: dict[str, tuple[list[float], list[float]]] = {}
        for name in dict.fromkeys(r["server"] for r in talks):
            ttft = {r["prompt"]: r["ttft_s"] for r in talks if r["server"] == name}
            times[name] = ([ttft["c0-t0"], ttft["c1-t0"]], [ttft["c0-t1"], ttft["c1-t1"]])
        heads = ("first turns", "second turns", "second over first")
        lines += ttft_table("two conversations taking turns: TTFT of each turn", heads, times)
    agent = [r for r in rows if r["suite"] == "agent"]
    if agent:
        lines += [
            "### an agent's next task, one slot: what it reads, over the first read",
            "",
            "| server | first request: prompt, TTFT | next task: prompt, read again, TTFT "
            "| TTFT over the first |",
            "|---|---:|---:|---:|",
        ]
        for name in dict.fromkeys(r["server"] for r in agent):
            by_prompt = {r["prompt"]: r for r in agent if r["server"] == name}
            first, last = by_prompt["r0"], by_prompt["next-task"]
            read = last.get("prompt_tokens", 0) - last.get("cached_tokens", 0)
            lines.append(
                f"| {name} | {first.get('prompt_tokens', '?')} tokens, {first['ttft_s']:.2f} s "
                f"| {last.get('prompt_tokens', '?')} tokens, {read} read, {last['ttft_s']:.2f} s "
                f"| {last['ttft_s'] / first['ttft_s']:.2f}x |"
            )
        lines.append("")
    chats = [r for r in rows if r["suite"] == "newchat"]
    if chats:
        times = {}
        for name in dict.fromkeys(r["server"] for r in chats):
            ttfts = [r["ttft_s"] for r in chats if r["server"] == name]
            times[name] = (ttfts[:1], ttfts[1:])
        title = "new conversations with one system prompt, one slot: TTFT of each"
        lines += ttft_table(title, ("first", "later", "later over first"), times)
    editor = [r for r in rows if r["suite"] == "editor"]
    if editor:
        lines += [
            f"### an editor beside a chat: a {editor[0]['tokens']}-token completion",
            "",
            f"| server | alone s (median) | beside {editor[0]['beside']} s | slowdown (median) "
            "| worst |",
            "|---|---:|---:|---:|---:|",
        ]
        for name in dict.fromkeys(r["server"] for r in editor):
            mine = [r for r in editor if r["server"] == name]
            lines.append(
                f"| {name} | {statistics.median(r['alone_s'] for r in mine):.2f} | "
                f"{statistics.median(r['during_s'] for r in mine):.2f} | "
                f"{statistics.median(r['slowdown'] for r in mine):.2f}x | "
                f"{max(r['slowdown'] for r in mine):.2f}x |"
            )
    return "\n".join(lines)


def ttft_table(
    title: str, heads: tuple[str, str, str], times: dict[str, tuple[list[float], list[float]]]
) -> list[str]:
    """A report's table of times to first token: per server (first, later) lists, and
    the later ones' mean over the first ones'."""
    lines = [f"### {title}", "", f"| server | {heads[0]} s | {heads[1]} s | {heads[2]} |"]
    lines.append("|---|---|---|---:|")
    for name, (first, later) in times.items():
        ratio = statistics.mean(later) / statistics.mean(first)
        shown = [", ".join(f"{t:.2f}" for t in ts) for ts in (first, later)]
        lines.append(f"| {name} | {shown[0]} | {shown[1]} | {ratio:.2f}x |")
    return [*lines, ""]


def summary(row: dict) -> str:
    extra = ""
    if "accepted_prediction" in row:
        extra = f", prediction {row['accepted_prediction']}/{row['rejected_prediction']}"
    return (
        f"{row['suite']:5} {row['prompt']:22} {row['server']:14} {row['tokens']:4} tok "
        f"{row['tokens_per_s']:7.2f} tok/s  TTFT {row['ttft_s']:.2f}s{extra}"
    )


RATIOS = (  # (suite, server, over server): the medians of prompt-for-prompt tok/s ratios
    ("chat", "localspec", "llama-spec"),
    ("chat", "localspec", "llama-plain"),
    ("chat", "llama-spec", "llama-plain"),
    ("chat", "localspec", "localspec-run"),
    ("chat", "localspec-plain", "localspec-plain-run"),
    ("chat", "localspec", "localspec-plain"),
    ("chat", "localspec-plain", "llama-plain"),
    ("edit", "prediction", "llama-plain"),
    ("edit", "prediction", "no-prediction"),
    ("edit", "no-prediction", "llama-plain"),
)


def ratios(rows: list[dict]) -> str:
    """Prompt-for-prompt tok/s ratios: the median, and the smallest."""
    lines = ["| suite | tok/s of | over | median | min | prompts |", "|---|---|---|---|---|---|"]
    rate = {(r["suite"], r["prompt"], r["server"]): r["tokens_per_s"] for r in rows}
    for suite, a, b in RATIOS:
        found = [
            rate[s, p, a] / rate[s, p, b]
            for (s, p, name) in rate
            if s == suite and name == a and rate.get((s, p, b), 0) > 0
        ]
        if found:
            lines.append(
                f"| {suite} | {a} | {b} | {statistics.median(found):.2f}x | "
                f"{min(found):.2f}x | {len(found)} |"
            )
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    """Median tok/s and TTFT per suite and server."""
    lines = ["| suite | server | median tok/s | median TTFT s |", "|---|---|---|---|"]
    keys = dict.fromkeys((r["suite"], r["server"]) for r in rows)
    for suite, name in keys:
        mine = [r for r in rows if (r["suite"], r["server"]) == (suite, name)]
        rate = statistics.median(r["tokens_per_s"] for r in mine)
        ttft = statistics.median(r["ttft_s"] for r in mine)
        lines.append(f"| {suite} | {name} | {rate:.2f} | {ttft:.2f} |")
    return "\n".join(lines)


def main() -> None:
    from localspec.bench.peer import default_bin_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--edit-max-tokens", type=int, default=2048)
    p.add_argument("--prompts", type=int, default=10, help="prompts (or edits) per suite")
    p.add_argument(
        "--suite",
        choices=(
            "chat",
            "edit",
            "all",
            "clients",
            "editor",
            "alternate",
            "newchat",
            "agent",
            "index",
        ),
        default="all",
    )
    p.add_argument("--clients", type=int, default=4, help="concurrent clients (clients suite)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of N clients (clients suite)")
    p.add_argument("--completion-tokens", type=int, default=32, help="editor suite")
    p.add_argument("--index-texts", type=int, default=48, help="texts embedded (index suite)")
    p.add_argument(
        "--paste-chars",
        type=int,
        default=0,
        help="editor suite: the chat carries a code paste this long, and the completion "
        "comes while it is read (an agent's file beside an editor)",
    )
    p.add_argument(
        "--parallel", type=int, default=1, help="localspec's slots in the chat suite (default 1)"
    )
    p.add_argument("--slots", type=int, help="localspec's slots in the clients and editor suites")
    p.add_argument("--one-slot-too", action="store_true", help="and localspec with one slot")
    p.add_argument(
        "--alternate-slots", type=int, default=2, help="every server's slots (alternate suite)"
    )
    p.add_argument("--no-ram-too", action="store_true", help="and localspec with --cache-ram 0")
    p.add_argument(
        "--no-prompt-reader", action="store_true", help="localspec's servers without it (A/B)"
    )
    p.add_argument(
        "--split-too", action="store_true", help="and localspec with --no-kv-unified (clients)"
    )
    p.add_argument(
        "--plain-too", action="store_true", help="and localspec without drafts (clients suite)"
    )
    p.add_argument(
        "--specbench",
        action="store_true",
        help="clients suite: Spec-Bench's first turns, one of each category (seed 0), "
        "instead of the bench's prompts",
    )
    p.add_argument(
        "--chat-template-file",
        type=Path,
        help="every server's chat template in place of the GGUF's (the agent suite: "
        "a thinking model's, such as tests/data/templates/qwen3.5-wire.jinja)",
    )
    p.add_argument("--run", action="store_true", help="also `localspec run` on each prompt")
    p.add_argument(
        "--peer-n-max", type=int, default=3, help="llama-server's draft length (its default: 3)"
    )
    p.add_argument("--llama-server", type=Path, help="default: scripts/peer_speculative.sh's")
    p.add_argument("--no-peer", dest="peer", action="store_false", help="leave llama-server out")
    p.add_argument(
        "--gpu", action="store_true", help="llama-server offloads both models (-ngl, -ngld)"
    )
    p.add_argument("--out", type=Path, default=ROOT / "docs/bench/serve/results.json")
    args = p.parse_args()
    if args.peer:
        args.llama_server = args.llama_server or default_bin_dir() / "llama-server"
    if args.peer and not args.llama_server.exists():
        sys.exit(f"{args.llama_server} not found: run scripts/peer_speculative.sh build")
    have = len(clients_prompts(args))
    if args.suite == "clients" and args.clients * args.rounds > have:
        # a prompt asked again would be drafted from its earlier answer (the slots' suffix
        # index keeps it), which llama-server's drafters do not do: not a fair round
        sys.exit(
            f"--clients {args.clients} x --rounds {args.rounds} needs "
            f"{args.clients * args.rounds} prompts and the bench has {have} (one asked twice "
            f"is drafted from its first answer): use at most {have // args.clients} rounds"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logs = args.out.parent / "logs"
    logs.mkdir(exist_ok=True)
    rows: list[dict] = []
    if args.suite in ("chat", "all"):
        rows += chat_suite(args, logs)
    if args.suite in ("edit", "all"):
        rows += edit_suite(args, logs)
    if args.suite == "clients":
        rows += clients_suite(args, logs)
    if args.suite == "editor":
        rows += editor_suite(args, logs)
    if args.suite == "alternate":
        rows += alternate_suite(args, logs)
    if args.suite == "newchat":
        rows += newchat_suite(args, logs)
    if args.suite == "agent":
        rows += agent_suite(args, logs)
    if args.suite == "index":
        rows += index_suite(args, logs)
    args.out.write_text(
        json.dumps(
            {
                "args": vars(args)
                | {
                    "out": str(args.out),
                    "llama_server": str(args.llama_server),
                    "chat_template_file": str(args.chat_template_file or ""),
                },
                "rows": rows,
            },
            indent=1,
        )
    )
    many = args.suite in ("clients", "editor", "alternate", "newchat", "agent")
    text = f"{many_report(rows)}\n" if many else f"{table(rows)}\n\n{ratios(rows)}\n"
    if args.suite == "index":
        text = f"{index_report(rows)}\n"
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
