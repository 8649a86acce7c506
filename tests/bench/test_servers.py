"""The benches' wait for an idle server, against scripted /health answers."""

from __future__ import annotations

import httpx
import pytest

from localspec.bench import servers
from localspec.errors import LocalspecError


def scripted(answers: list[dict | None]) -> tuple[httpx.Client, list[str]]:
    """A client whose /health gives `answers` in turn (None: the connection drops, as
    llama-server may drop one after a stream), then the last one for good."""
    asked: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if answer is None:
            raise httpx.RemoteProtocolError("Server disconnected", request=request)
        return httpx.Response(200, json=answer)

    return httpx.Client(transport=httpx.MockTransport(handle)), asked


def test_a_server_is_settled_once_nothing_decodes_or_reads_ahead():
    client, asked = scripted(
        [
            {"status": "ok", "queue_depth": 1, "reading_ahead": 0},  # the answer's end
            None,
            {"status": "ok", "queue_depth": 0, "reading_ahead": 1},  # its draft model reads
            {"status": "ok", "queue_depth": 0, "reading_ahead": 0},
        ]
    )
    servers.settle(client, "http://server")
    assert asked == ["/health"] * 4


def test_llama_servers_health_is_settled_at_once():
    client, asked = scripted([{"status": "ok"}])
    servers.settle(client, "http://server")
    assert asked == ["/health"]


def test_a_server_that_stays_busy_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(servers, "SETTLE_S", 0.2)
    client, _ = scripted([{"status": "ok", "queue_depth": 0, "reading_ahead": 1}])
    with pytest.raises(LocalspecError, match="still busy after"):
        servers.settle(client, "http://server")


def test_no_repack_goes_to_localspecs_servers_only(tmp_path):
    setup = servers.PairSetup(tmp_path / "t.gguf", tmp_path / "d.gguf", None, 2, 4096,
                              tmp_path / "llama-server", repack=False)  # fmt: skip
    commands = servers.pair_servers(setup, dict.fromkeys(servers.MODES, 8080))
    assert {m for m, c in commands.items() if "--no-repack" in c} == {
        "localspec-plain",
        "localspec-auto",
    }
