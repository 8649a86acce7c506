"""The RPC bench's latency relay (localspec/bench/delay.py), against a loopback echo
server: every byte arrives, in order, and no sooner than the added round trip."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from helpers import assert_one_line_error, localspec

from localspec.bench.delay import DelayRelay, delayed


def echo_server() -> tuple[str, socket.socket]:
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(1 << 16):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{srv.getsockname()[1]}", srv


def round_trip(endpoint: str, payload: bytes) -> tuple[bytes, float]:
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        start = time.perf_counter()
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = s.recv(1 << 16)
            assert chunk, "the relay closed early"
            got += chunk
        return got, time.perf_counter() - start


def test_every_byte_comes_back_in_order_and_no_sooner_than_the_added_round_trip():
    upstream, srv = echo_server()
    relay = DelayRelay(upstream, rtt_s=0.05)
    try:
        payload = os.urandom(3 << 20)  # many chunks, both ways
        got, took = round_trip(relay.endpoint, payload)
        assert got == payload
        assert took >= 0.05
        small, took = round_trip(relay.endpoint, b"hello")  # a second connection
        assert small == b"hello" and took >= 0.05
    finally:
        relay.close()
        srv.close()


def test_a_refused_upstream_closes_the_client_and_zero_adds_nothing():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    with delayed((closed,), 0.01) as (endpoint,):
        host, port = endpoint.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as c:
            assert c.recv(1) == b""  # closed: as the upstream would have
    with delayed((closed,), 0.0) as endpoints:
        assert endpoints == (closed,)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--rpc-rtt-ms", "1"], "--rpc-rtt-ms adds latency to RPC servers: pass them with --rpc"),
        (["--rpc", "127.0.0.1:1", "--rpc-rtt-ms", "-1"], "--rpc-rtt-ms must be between 0 and 1000"),
        (["--rpc", "127.0.0.1"], "host:port"),
        (["--peer-rpc", "127.0.0.1:2"], "--peer-rpc is the peer's copy of --rpc's servers"),
        (
            ["--rpc", "127.0.0.1:1", "--peer-rpc", "127.0.0.1:2,127.0.0.1:3"],
            "--peer-rpc names 2 server(s) and --rpc 1",
        ),
        (["--rpc", "127.0.0.1:1", "--peer-rpc", "127.0.0.1:1"], "is in both --rpc and --peer-rpc"),
    ],
)
def test_bad_rpc_bench_options_are_one_line(args, error):
    out = localspec("bench", *args)
    assert_one_line_error(out.returncode, out.stderr, error)


@pytest.mark.real
def test_the_peer_over_rpc_needs_servers_of_its_own(real_paths, tmp_path):
    """An rpc-server serves one client at a time and localspec holds --rpc's: the peer
    on the same servers would wait forever, so it is refused before anything loads."""
    out = localspec(
        "bench", "--target", str(real_paths[0]), "--draft", str(real_paths[1]),
        "--rpc", "127.0.0.1:1", "--modes", "baseline,peer", "--out", str(tmp_path),
    )  # fmt: skip
    assert_one_line_error(out.returncode, out.stderr, "need servers of their own (--peer-rpc)")
