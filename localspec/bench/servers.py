"""Servers the benches talk to over HTTP: `localspec serve` and llama.cpp's `llama-server`,
each started as a process on a free port and stopped when done."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from localspec.errors import LocalspecError

STARTUP_S = 600  # loading a big model from a cold disk takes minutes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server(command: list[str], port: int, log: Path) -> Iterator[str]:
    """Start a server, wait for its /health, yield its base URL, stop it."""
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if proc.poll() is not None:
                raise LocalspecError(f"{Path(command[0]).name} exited: see {log}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise LocalspecError(f"{Path(command[0]).name} did not come up: see {log}")
            time.sleep(1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


SETTLE_S = 120  # an idle draft model reads at most a context ahead


def settle(client: httpx.Client, base: str) -> None:
    """Wait until the server at `base` does nothing: after an answer localspec's idle
    slots read ahead with the draft model (for the next request), which would slow
    another server's request timed meanwhile (llama-server's /health has no such
    figures: it is idle once it has answered)."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        try:
            health = client.get(f"{base}/health").json()
        except httpx.TransportError:  # llama-server may close a connection after a stream
            health = {"queue_depth": 1}
        if not health.get("queue_depth") and not health.get("reading_ahead"):
            return
        time.sleep(0.05)
    raise LocalspecError(f"the server at {base} was still busy after {SETTLE_S} s")


@dataclass(frozen=True)
class PairSetup:
    """The pair and the machine both servers get: the same files, threads and context."""

    target: Path
    draft: Path | None  # as localspec is given it
    peer_draft: Path | None  # the file localspec drafts with: llama-server gets the same
    threads: int
    n_ctx: int
    llama_server: Path | None  # None: leave llama-server out
    repack: bool = True  # False: localspec's target --no-repack (llama-server's as it is)
    prompt_reader: bool = True  # False: localspec's --no-prompt-reader


def pair_servers(setup: PairSetup, ports: dict[str, int]) -> dict[str, list[str]]:
    """Each mode's server command (MODES; llama-server's left out without its binary):
    `localspec serve` plainly and with `auto`, llama-server plainly, with the draft model
    and with its ngram-mod drafter, on one slot each."""
    t = str(setup.threads)
    ours = [sys.executable, "-m", "localspec", "serve", "--target", str(setup.target)]
    ours += ["--threads", t, "--ctx", str(setup.n_ctx), "--parallel", "1"]
    ours += [] if setup.repack else ["--no-repack"]
    ours += [] if setup.prompt_reader else ["--no-prompt-reader"]
    out = {"localspec-plain": [*ours, "--draft", "none", "--port", str(ports["localspec-plain"])]}
    if setup.draft is not None:
        out["localspec-auto"] = [*ours, "--draft", str(setup.draft), "--port"]
    else:
        out["localspec-auto"] = [*ours, "--draft", "ngram", "--port"]
    out["localspec-auto"].append(str(ports["localspec-auto"]))
    if setup.llama_server is None:
        return out
    peer = [str(setup.llama_server), "-m", str(setup.target), "-t", t, "-tb", t]
    peer += ["-c", str(setup.n_ctx), "-np", "1"]
    out["llama-server"] = [*peer, "--port", str(ports["llama-server"])]
    if setup.peer_draft is not None:
        out["llama-server-md"] = [
            *peer,
            *("-md", str(setup.peer_draft), "-td", t, "--spec-type", "draft-simple"),
            *("--port", str(ports["llama-server-md"])),
        ]
    out["llama-server-ngram-mod"] = [
        *peer,
        *("--spec-type", "ngram-mod", "--port", str(ports["llama-server-ngram-mod"])),
    ]
    return out


MODES = (
    "localspec-plain",
    "localspec-auto",
    "llama-server",
    "llama-server-md",
    "llama-server-ngram-mod",
)


def start_pair_servers(
    stack: ExitStack,
    setup: PairSetup,
    logs: Path,
    warm: Callable[[str], object],
    progress: Callable[[str], None],
) -> dict[str, str]:
    """Every mode's server started (stopped with `stack`) and warmed up by `warm(base)`
    (a first request pays for what a server sets up lazily): mode -> base URL."""
    ports = {m: free_port() for m in MODES}
    logs.mkdir(parents=True, exist_ok=True)
    bases = {}
    for mode, cmd in pair_servers(setup, ports).items():
        progress(f"starting {mode}")
        bases[mode] = stack.enter_context(server(cmd, ports[mode], logs / f"{mode}.log"))
        warm(bases[mode])
    return bases
