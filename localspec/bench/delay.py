"""Added network latency for the RPC bench: a TCP relay on 127.0.0.1 that holds every
chunk for half the added round-trip time in each direction.

A real network between the target's machines makes every target pass pay round trips,
and that is where speculation should pay most. The kernel's way to add them (`tc
netem` on a veth pair in a network namespace) needs the netem qdisc, which not every
kernel ships (this machine's does not); this relay needs nothing and touches no
interface. It adds latency only, not a bandwidth limit, and its threads share the CPU
with the models, as a NIC's interrupts would.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Iterator

CHUNK = 1 << 16


class DelayRelay:
    """Listens on 127.0.0.1 (an ephemeral port) and relays each connection to
    `upstream` (host:port), every chunk delivered `rtt_s / 2` after it was read, in
    order, in each direction."""

    def __init__(self, upstream: str, rtt_s: float) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.one_way_s = rtt_s / 2
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="delay-accept").start()

    @property
    def endpoint(self) -> str:
        """host:port to give the client in place of the upstream's."""
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()  # the upstream refused: so does the relay
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as rpc-server does
            with self._lock:
                self._sockets += [client, server]
            self._pipe(client, server)
            self._pipe(server, client)

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        """One direction: a reader stamps each chunk with when it is due, a writer sends
        it then (a queue keeps the order, and reading never waits on the delay)."""
        due: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

        def read() -> None:
            try:
                while chunk := source.recv(CHUNK):
                    due.put((time.perf_counter() + self.one_way_s, chunk))
            except OSError:
                pass
            due.put((0.0, b""))  # end of stream

        def write() -> None:
            try:
                while True:
                    at, chunk = due.get()
                    if not chunk:
                        break
                    if (wait := at - time.perf_counter()) > 0:
                        time.sleep(wait)
                    sink.sendall(chunk)
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                with contextlib.suppress(OSError):
                    source.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=read, daemon=True, name="delay-read").start()
        threading.Thread(target=write, daemon=True, name="delay-write").start()


@contextlib.contextmanager
def delayed(endpoints: tuple[str, ...], rtt_s: float) -> Iterator[tuple[str, ...]]:
    """The endpoints to use instead of `endpoints`, each `rtt_s` further away (as they
    are where rtt_s is 0)."""
    if rtt_s <= 0:
        yield endpoints
        return
    relays = [DelayRelay(e, rtt_s) for e in endpoints]
    try:
        yield tuple(r.endpoint for r in relays)
    finally:
        for r in relays:
            r.close()
