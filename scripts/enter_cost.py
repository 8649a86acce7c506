"""What Enter costs an editor with llama.vim's window (256 lines before the cursor, 64
after): a middle in a long file of the standard library, then its first line written
and Enter pressed, served in process with the layout at the last middle's prefix
(server/anchors.py) and, for comparison, laid out as sent (the anchors switched off):
the prompt tokens read again and the latency of the request after Enter.

    .venv/bin/python scripts/enter_cost.py --target $M/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import sysconfig
import time
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

from fastapi.testclient import TestClient

from localspec.backends.llama import LoadOptions
from localspec.server.anchors import Anchors, Placed
from localspec.server.app import ServerOptions, create_app
from localspec.session import SessionConfig, open_session

N_PREFIX, N_SUFFIX = 256, 64  # llama.vim's defaults


def body(lines: list[str], y: int, typed: str) -> dict:
    """llama.vim's /infill body with the cursor at the end of `typed` on line y."""
    return {
        "input_prefix": "".join(lines[max(0, y - N_PREFIX) : y]),
        "input_suffix": "\n" + "".join(lines[y + 1 : y + 1 + N_SUFFIX]),
        "input_extra": [],
        "prompt": typed,
        "n_predict": 32,
        "n_indent": len(typed) - len(typed.lstrip()),
        "temperature": 0,
        "top_k": 40,
        "top_p": 0.99,
        "cache_prompt": True,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--file", default="argparse.py", help="under the standard library")
    ap.add_argument("--line", type=int, default=1803, help="the cursor's line (0-based)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    source = Path(sysconfig.get_paths()["stdlib"], args.file).read_text().splitlines(True)
    y = args.line
    indent = source[y][: len(source[y]) - len(source[y].lstrip())]
    # the cursor's line empty but for its indentation; then its author's line, and Enter
    lines = [*source[:y], indent + "\n", *source[y + 1 :]]
    after = [*source[: y + 1], indent + "\n", *source[y + 1 :]]
    load = LoadOptions(n_ctx=8192, n_threads=args.threads)
    session = open_session(SessionConfig(args.target, "none", 0, load, load))
    as_sent = mock.patch.object(Anchors, "place", lambda self, key, p, s: Placed(p, ""))
    try:
        for name in ("anchored", "as sent"):
            app = create_app(session, ServerOptions("x", parallel=1))
            with as_sent if name == "as sent" else nullcontext(), TestClient(app) as client:
                first = client.post("/infill", json=body(lines, y, indent)).json()
                started = time.perf_counter()
                enter = client.post("/infill", json=body(after, y + 1, indent)).json()
                took = time.perf_counter() - started
            t = enter["timings"]
            print(
                f"{name}: first request read {first['timings']['prompt_n']} tokens; after "
                f"Enter {t['prompt_n']} of {enter['tokens_evaluated']} read again "
                f"({t['prompt_ms']:.0f} ms), {took:.2f} s in all for a middle of "
                f"{t['predicted_n']} tokens ({t.get('recalled_n', 0)} recalled): "
                f"{enter['content'][:40]!r}"
            )
    finally:
        session.close()


if __name__ == "__main__":
    main()
