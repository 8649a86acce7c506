"""Browser safety, as Ollama and llama-server learned it: any web page the user opens can
send requests to 127.0.0.1, and through DNS rebinding (a name of the page's that now
resolves to 127.0.0.1) read the answers too.

- Served on loopback, only a `Host` naming the loopback or the bound address (or one
  given with `--allowed-host`) is answered: a rebound name is not.
- A request with an `Origin` (a browser's, on every cross-site POST) is refused unless
  `--cors-origin` allows that origin; an allowed one gets CORS headers, and its preflight
  (`OPTIONS`) is answered.
Refusals are a 403 in OpenAI's error shape. A pure ASGI middleware, so a streamed answer
passes through untouched (and a client's disconnect still reaches it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localspec.server.errors import error_body

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
PREFLIGHT_MAX_AGE = "600"


@dataclass(frozen=True)
class Guard:
    """Which Host and Origin headers are answered. `hosts` None: any (served beyond
    loopback, where the API key is the guard)."""

    hosts: frozenset[str] | None
    origins: frozenset[str]  # "*": any

    @classmethod
    def for_address(
        cls, host: str, loopback: bool, allowed: Iterable[str] = (), origins: Iterable[str] = ()
    ) -> Guard:
        names = {h.lower().strip("[]") for h in (*LOOPBACK_HOSTS, host, *allowed)}
        return cls(frozenset(names) if loopback else None, frozenset(origins))

    def host_ok(self, header: str | None) -> bool:
        if self.hosts is None:
            return True
        if not header:
            return False
        return host_name(header) in self.hosts

    def origin_ok(self, origin: str) -> bool:
        return "*" in self.origins or origin.rstrip("/") in self.origins


def host_name(header: str) -> str:
    """A Host header's name, without its port: "localhost:8080" -> "localhost",
    "[::1]:8080" -> "::1"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class GuardMiddleware:
    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host, origin = headers.get("host"), headers.get("origin")
        if not self.guard.host_ok(host):
            await refuse(send, f"Host {host!r} is not served here (see --allowed-host)")
            return
        if origin is None:
            await self.app(scope, receive, send)
            return
        if not self.guard.origin_ok(origin):
            await refuse(send, f"requests from {origin} are refused (see --cors-origin)")
            return
        cors = [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"vary", b"Origin"),
        ]
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            asked = headers.get("access-control-request-headers", "")
            await send_json(
                send,
                204,
                None,
                [
                    *cors,
                    (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                    (b"access-control-allow-headers", asked.encode("latin-1")),
                    (b"access-control-max-age", PREFLIGHT_MAX_AGE.encode()),
                ],
            )
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *cors]
            await send(message)

        await self.app(scope, receive, send_with_cors)


async def refuse(send: Send, message: str) -> None:
    await send_json(send, 403, error_body(message, "permission_error", None, "forbidden"))


async def send_json(
    send: Send, status: int, body: dict | None, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    data = b"" if body is None else json.dumps(body).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*head, *headers]})
    await send({"type": "http.response.body", "body": data})
