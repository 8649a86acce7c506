#!/usr/bin/env python3
"""What a slot saved to a file saves after a restart (`serve --slot-save-path`): a long
system prompt read cold, the slot saved, the server started afresh, the slot restored,
and the same request again.

    .venv/bin/python scripts/slot_restore.py [--target T] [--draft D] [--chars 12000]

Prints the prompt's tokens, the cold request's time, the file's size, the save's and the
restore's times, and the request's time after the restore.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

from localspec.bench.servers import server
from localspec.paths import models_dir

REPO = Path(__file__).resolve().parent.parent


def serve_command(args: argparse.Namespace, save_dir: str) -> list[str]:
    cmd = [sys.executable, "-m", "localspec", "serve", "--target", args.target]
    cmd += ["--draft", args.draft, "--threads", str(args.threads), "--ctx", "8192"]
    return [*cmd, "--parallel", "1", "--port", str(args.port), "--slot-save-path", save_dir]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--target", default=str(models_dir() / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    )
    p.add_argument("--draft", default=str(models_dir() / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--chars", type=int, default=12000, help="of a source file, as the system prompt"
    )
    p.add_argument("--port", type=int, default=8971)
    args = p.parse_args()
    system = (REPO / "localspec/server/worker.py").read_text()[: args.chars]
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Which class holds a job?"},
    ]
    body = {"model": "any", "messages": messages, "max_tokens": 1, "temperature": 0}
    client = httpx.Client(timeout=600, base_url=f"http://127.0.0.1:{args.port}")
    with tempfile.TemporaryDirectory() as save_dir:
        command, log = serve_command(args, save_dir), Path(save_dir) / "serve.log"
        with server(command, args.port, log):
            t = time.perf_counter()
            usage = client.post("/v1/chat/completions", json=body).json()["usage"]
            cold = time.perf_counter() - t
            saved = client.post("/slots/0?action=save", json={"filename": "system.bin"}).json()
        with server(command, args.port, log):  # a restart
            back = client.post("/slots/0?action=restore", json={"filename": "system.bin"}).json()
            t = time.perf_counter()
            again = client.post("/v1/chat/completions", json=body).json()["usage"]
            warm = time.perf_counter() - t
    restore_s = back["timings"]["restore_ms"] / 1e3
    print(f"prompt {usage['prompt_tokens']} tokens: cold request {cold:.2f} s")
    print(
        f"saved {saved['n_saved']} tokens, {saved['n_written'] / 1e6:.0f} MB "
        f"in {saved['timings']['save_ms']:.0f} ms"
    )
    print(
        f"after a restart: restored in {restore_s * 1e3:.0f} ms, the request in {warm:.2f} s "
        f"({again['prompt_tokens_details']['cached_tokens']} tokens cached): "
        f"{cold / (restore_s + warm):.1f}x sooner than cold"
    )


if __name__ == "__main__":
    main()
