#!/usr/bin/env python3
"""Every kind of request at once against one real `localspec serve`, for a while: chats
(streamed, abandoned mid-stream, given up on before the answer), JSON under a schema,
tool calls, llama.vscode's /infill, completions, GET /slots and /metrics, and slots saved,
restored and erased, from several client threads. Checks what a user of a shared server
relies on: no 5xx and no error but a 429 (the queue is kept short on purpose), each
greedy answer equal to the same request answered alone before the load (cold or warm),
the server idle at the end with every slot free, and the same answers once more after
it. A greedy answer may part from its answer alone at a near-tie, where passes of other
shapes round the last bits otherwise: /infill's differences (its token ids are known)
are judged by the bench's audit (`localspec.bench.audit.judge`), the others listed to
audit by hand.

    .venv/bin/python scripts/serve_soak.py [--seconds 300] [--clients 6] [--parallel 3]

Exits 1 where something failed, with what and how often.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from localspec.bench.servers import free_port, server
from localspec.paths import models_dir

TIMEOUT = 300.0
N_CTX = 8192
CHATS = [
    f"Write a Python function that {what}. Be brief."
    for what in ("reverses a string", "checks for primes", "merges two sorted lists")
]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
PREFIX = (
    "import os\n\n\ndef python_files(root):\n"
    '    """Every .py file under root."""\n    out = []\n'
    "    for dirpath, _, files in os.walk(root):\n"
)
SUFFIX = "    return sorted(out)\n"


def chat(text: str, **more: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "temperature": 0, **more}


# what each greedy request is, and how its answer is read (compared with its answer alone)
GREEDY: dict[str, tuple[str, dict[str, Any]]] = {
    **{f"chat{i}": ("/v1/chat/completions", chat(t, max_tokens=48)) for i, t in enumerate(CHATS)},
    "json": (
        "/v1/chat/completions",
        chat(
            "Invent a person; answer in JSON.",
            max_tokens=40,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON, "strict": True},
            },
        ),
    ),
    "tools": ("/v1/chat/completions", chat("Weather in Paris?", max_tokens=60, tools=[WEATHER])),
    "completion": (
        "/v1/completions",
        {"prompt": "def fib(n):\n", "max_tokens": 32, "temperature": 0},
    ),
    "infill": (
        "/infill",
        {
            "input_prefix": PREFIX,
            "input_suffix": SUFFIX,
            "input_extra": [{"filename": "util.py", "text": "def helper():\n    return 1\n"}],
            "prompt": "",
            "n_predict": 24,
            "samplers": ["top_k", "top_p", "infill"],
            "cache_prompt": True,
            "t_max_predict_ms": 5000,
            "temperature": 0,
            "return_tokens": True,
        },
    ),
}
OTHERS = ("abandoned", "stream", "stream-left", "slots", "slot-file")


def answer(path: str, reply: dict[str, Any]) -> str:
    """The text (and tool calls) of a response, whatever its endpoint; /infill's with its
    token ids."""
    if path == "/infill":
        return json.dumps([reply["content"], reply["tokens"]])
    choice = reply["choices"][0]
    if path == "/v1/completions":
        return choice["text"]
    message = choice["message"]
    calls = [c["function"] for c in message.get("tool_calls") or []]
    return json.dumps([message.get("content"), calls])


class Soak:
    def __init__(self, base: str, alone: dict[str, set[str]], slots: int) -> None:
        self.base, self.alone, self.slots = base, alone, slots
        self.done: Counter[str] = Counter()
        self.failures: list[str] = []
        self.differ: set[tuple[str, str]] = set()  # (kind, answer) not among its answers alone
        self.lock = threading.Lock()

    def check(self, kind: str, got: str) -> None:
        if got not in self.alone[kind]:
            with self.lock:
                self.differ.add((kind, got))

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)

    def count(self, what: str) -> None:
        with self.lock:
            self.done[what] += 1

    def client(self, until: float, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=self.base, timeout=TIMEOUT) as http:
            while time.monotonic() < until:
                kind = rng.choice([*GREEDY, *OTHERS])
                try:
                    self.one(http, kind, rng)
                except httpx.HTTPError as e:
                    self.fail(f"{kind}: {e!r}")

    def one(self, http: httpx.Client, kind: str, rng: random.Random) -> None:
        if kind in GREEDY:
            path, body = GREEDY[kind]
            r = http.post(path, json=body)
            if self.ok(kind, r):
                self.check(kind, answer(path, r.json()))
        elif kind == "abandoned":  # a client that gives up before the answer comes
            body = chat("Write a long essay about compilers.", max_tokens=400)
            with contextlib.suppress(httpx.TimeoutException):
                http.post("/v1/chat/completions", json=body, timeout=rng.uniform(0.2, 3))
            self.count(kind)
        elif kind.startswith("stream"):  # read whole, or left after a few pieces
            body = chat(rng.choice(CHATS), max_tokens=48, stream=True)
            leave = rng.randrange(2, 10) if kind == "stream-left" else None
            with http.stream("POST", "/v1/chat/completions", json=body) as r:
                if not self.ok(kind, r):
                    return
                for n, _ in enumerate(r.iter_lines()):
                    if leave is not None and n >= leave:
                        break
        elif kind == "slots":
            self.ok(kind, http.get("/slots"))
            self.ok(kind, http.get("/metrics"))
        else:
            slot, action = rng.randrange(self.slots), rng.choice(["save", "restore", "erase"])
            named = {"filename": f"soak{slot}.bin"} if action != "erase" else None
            r = http.post(f"/slots/{slot}?action={action}", json=named)
            if action == "restore" and r.status_code == 400:  # no file saved yet: expected
                self.count("slot-restore-missing")
            else:
                self.ok(f"slot-{action}", r)

    def ok(self, kind: str, r: httpx.Response) -> bool:
        if r.status_code == 429:  # a full queue says so: expected under this load
            self.count("429")
            return False
        if r.status_code != 200:
            self.fail(f"{kind}: {r.status_code} {r.read()[:200]!r}")
            return False
        self.count(kind)
        return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    models = models_dir()
    p.add_argument("--target", default=str(models / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
    p.add_argument("--draft", default=str(models / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--parallel", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as saved:
        cmd = [sys.executable, "-m", "localspec", "serve", "-t", args.target, "-d", args.draft]
        cmd += ["--threads", str(args.threads), "--ctx", str(N_CTX)]
        cmd += ["--parallel", str(args.parallel), "--port", str(port)]
        cmd += ["--slot-save-path", saved, "--max-queue", "4"]
        with server(cmd, port, Path(saved) / "serve.log") as base:
            soak = run(base, args)
        if "Traceback" in (Path(saved) / "serve.log").read_text():
            soak.fail("log: the server's log holds a traceback")
    print("done:", ", ".join(f"{k} {n}" for k, n in sorted(soak.done.items())))
    audit(soak, args)
    failed = Counter(f.split(":")[0] for f in soak.failures)
    for f in soak.failures[:20]:
        print("FAILED", f)
    print("failed:", dict(failed) or "nothing")
    sys.exit(1 if failed else 0)


def run(base: str, args: argparse.Namespace) -> Soak:
    with httpx.Client(base_url=base, timeout=TIMEOUT) as http:
        # each alone twice: a cold read of its prompt and a cached one may part at a near-tie
        alone = {
            kind: {answer(path, http.post(path, json=body).json()) for _ in range(2)}
            for kind, (path, body) in GREEDY.items()
        }
        soak = Soak(base, alone, args.parallel)
        until = time.monotonic() + args.seconds
        clients = [
            threading.Thread(target=soak.client, args=(until, seed)) for seed in range(args.clients)
        ]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        deadline = time.monotonic() + 120  # an idle slot may read ahead a while
        while (health := http.get("/health").json())["queue_depth"] or health["reading_ahead"]:
            if time.monotonic() > deadline:
                soak.fail(f"end: still busy after the load: {health}")
                break
            time.sleep(0.1)
        if busy := [s["id"] for s in http.get("/slots").json() if s["is_processing"]]:
            soak.fail(f"end: slots {busy} still processing")
        for kind, (path, body) in GREEDY.items():  # the same answers after it all
            soak.check(kind, answer(path, http.post(path, json=body).json()))
    return soak


def audit(soak: Soak, args: argparse.Namespace) -> None:
    """Each answer that differs from its answers alone: /infill's judged on the target
    (a near-tie or the numerics of another pass's shape passes; else a defect), the
    others failed, to audit by hand."""
    if not soak.differ:
        return
    from localspec.backends.llama import LlamaModel, LoadOptions
    from localspec.bench.audit import judge
    from localspec.server.infill import ExtraChunk, infill_prompt

    body = GREEDY["infill"][1]
    model = LlamaModel(Path(args.target), LoadOptions(n_ctx=N_CTX, n_threads=args.threads))
    try:
        extra = [ExtraChunk(filename=c["filename"], text=c["text"]) for c in body["input_extra"]]
        built = infill_prompt(
            model, body["input_prefix"], body["input_suffix"], extra, "", body["n_predict"], N_CTX
        )
        for kind, got in sorted(soak.differ):
            if kind != "infill":
                soak.fail(f"{kind}: {got!r} against {sorted(soak.alone[kind])!r} alone")
                continue
            b = json.loads(got)[1]
            for a in (json.loads(one)[1] for one in soak.alone[kind]):
                verdict = judge(model, built.tokens, a, b)
                print(f"infill differs from an answer alone: {verdict}")
                if "DEFECT" in verdict:
                    soak.fail(f"infill: {verdict}")
    finally:
        model.close()


if __name__ == "__main__":
    main()
