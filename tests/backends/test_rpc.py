"""The target over llama.cpp's RPC backend: two real rpc-servers on 127.0.0.1.

The real tests start llama.cpp's rpc-server (`python -m localspec.backends.rpc_server`, on
the ggml localspec runs on) on free loopback ports, split the real target across the
two, and compare greedy answers with local decoding. The fast tests drive the endpoint
parsing and the handshake against small fake servers.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import free_port, localspec, tmux, wait_for

from localspec.backends import rpc
from localspec.backends.rpc import RpcError, parse_endpoints, probe
from localspec.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "In two paragraphs: why do cats purr?"  # a chat answer: the draft is often wrong
N_TOKENS = 32


# --- fast: parsing and the handshake -------------------------------------------------


def test_endpoints_are_parsed_and_checked():
    assert parse_endpoints("127.0.0.1:50052, host.lan:1") == ("127.0.0.1:50052", "host.lan:1")
    for bad in ("", "host", "host:", ":50052", "host:port", "host:0", "host:70000", "a:1,a:1"):
        with pytest.raises(RpcError):
            parse_endpoints(bad)


def test_the_rpc_setting_takes_endpoints_or_nothing():
    assert Settings(rpc="10.0.0.2:50052").rpc == "10.0.0.2:50052"
    assert Settings().rpc == ""
    with pytest.raises(SettingsError, match="host:port"):
        Settings(rpc="10.0.0.2")


def fake_server(reply: bytes | None) -> tuple[str, threading.Event]:
    """A TCP server on 127.0.0.1 that reads one HELLO and sends `reply` (None: nothing)."""
    srv = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn, srv:
            conn.recv(1 + 8 + 24)
            if reply is not None:
                conn.sendall(reply)
            done.wait(10)

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{srv.getsockname()[1]}", done


def hello_reply(major: int, minor: int) -> bytes:
    return struct.pack("<Q", 28) + bytes([major, minor, 0, 0]) + bytes(24)


def test_probe_refused_port_is_one_line():
    with pytest.raises(RpcError, match=r"cannot reach the RPC server at 127\.0\.0\.1:\d+"):
        probe(f"127.0.0.1:{free_port()}")


def test_probe_is_bounded_when_the_server_never_answers():
    endpoint, done = fake_server(None)
    start = time.monotonic()
    with pytest.raises(RpcError, match=r"did not answer within 0\.5 s"):
        probe(endpoint, timeout=0.5)
    done.set()
    assert time.monotonic() - start < 5


def test_probe_refuses_another_protocol_version():
    endpoint, done = fake_server(hello_reply(rpc.PROTO_MAJOR - 1, 0))
    with pytest.raises(RpcError, match=r"speaks protocol 6\.0\.0"):
        probe(endpoint, timeout=5)
    done.set()


def test_probe_refuses_what_is_not_an_rpc_server():
    endpoint, done = fake_server(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    with pytest.raises(RpcError, match="does not answer like"):
        probe(endpoint, timeout=5)
    done.set()


def test_probe_accepts_this_protocol():
    endpoint, done = fake_server(hello_reply(rpc.PROTO_MAJOR, rpc.PROTO_MINOR))
    assert probe(endpoint, timeout=5)[:2] == (rpc.PROTO_MAJOR, rpc.PROTO_MINOR)
    done.set()


def test_keep_alive_sets_dead_peer_timeouts_on_connections_to_the_servers_only():
    srv, other = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    ours = socket.create_connection(srv.getsockname())
    theirs = socket.create_connection(other.getsockname())
    with srv, other, ours, theirs:
        endpoint = f"localhost:{srv.getsockname()[1]}"  # a name resolves to the address
        assert rpc.keep_alive((endpoint,)) == 1
        assert ours.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert theirs.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            timeout = ours.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
            assert timeout == rpc.DEAD_AFTER_S * 1000


def test_the_rpc_server_says_in_one_line_what_it_cannot_serve():
    server = socket.create_server(("127.0.0.1", 0))  # the port is taken
    with server:
        port = str(server.getsockname()[1])
        taken = subprocess.run([*RPC_SERVER, "--port", port], capture_output=True, text=True)
    unknown = subprocess.run([*RPC_SERVER, "--device", "GPU9"], capture_output=True, text=True)
    assert taken.returncode == 1 and unknown.returncode == 1
    assert taken.stderr.splitlines()[-1] == (
        f"rpc-server: cannot listen on 127.0.0.1:{port}: in use, or not an address of this machine"
    )
    assert re.fullmatch(r"rpc-server: no device 'GPU9' here \(devices: .*CPU\)\n", unknown.stderr)


# --- real: two rpc-servers, the target split across them -------------------------------


RPC_SERVER = [sys.executable, "-m", "localspec.backends.rpc_server"]


class RpcServer:
    """One rpc-server process serving this machine's CPU on a free loopback port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RpcServer:
        args = [*RPC_SERVER, "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*args, "--device", "CPU", "--threads", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:  # ready when it answers the handshake
            try:
                probe(self.endpoint, timeout=2)
                return self
            except RpcError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def two_servers() -> Iterator[tuple[RpcServer, RpcServer]]:
    pair = RpcServer(), RpcServer()
    try:
        yield pair[0].start(), pair[1].start()
    finally:
        for server in pair:
            server.kill()


# An rpc-server serves one client at a time, and `remote_target` holds these two for the
# whole module: a test that runs another process against rpc-servers starts its own.
servers = pytest.fixture(scope="module")(two_servers)
own_servers = pytest.fixture(scope="function")(two_servers)


@pytest.fixture(scope="module")
def remote_target(real_paths, servers):
    from localspec.backends.llama import LlamaModel, LoadOptions

    endpoints = tuple(s.endpoint for s in servers)
    target = LlamaModel(real_paths[0], LoadOptions(n_ctx=2048, n_threads=2, rpc=endpoints))
    yield target
    target.close()


def greedy(target, draft, gamma: int):
    from localspec.decoding.drafters import DraftModel, NoDrafter
    from localspec.decoding.engine import Engine, GenerationConfig
    from localspec.decoding.events import Piece
    from localspec.session import Session

    drafter = NoDrafter() if draft is None else DraftModel(draft)
    session = Session(Engine(target, drafter, gamma))
    messages = [{"role": "user", "content": PROMPT}]
    config = GenerationConfig(max_tokens=N_TOKENS, trace=True)
    events = list(session.chat(messages, config))  # type: ignore[arg-type]
    return events[-1], [e for e in events if isinstance(e, Piece)]


@pytest.mark.real
def test_remote_devices_report_their_memory_and_stay_out_of_the_registry(servers):
    before = rpc._ggml().ggml_backend_dev_count()
    devices = rpc.remote_devices(tuple(s.endpoint for s in servers))
    assert [d.endpoint for d in devices] == [s.endpoint for s in servers]
    assert all(d.name.startswith("RPC") and 0 < d.free <= d.total for d in devices)
    # not registered: a model loaded without a device list (the draft) stays local
    assert rpc._ggml().ggml_backend_dev_count() == before
    assert not any(d.handle in rpc.local_devices() for d in devices)


@pytest.mark.real
def test_greedy_over_rpc_equals_local_plain_and_speculative(real_models, remote_target):
    """The rpc-servers run llama.cpp's plain CPU kernels where the local target runs
    repacked ones, so the logits differ in the last bits: at a near-tie the answers may
    part, and only there (test_real_engine's rule, NEAR_TIE)."""
    from decoding.test_real_engine import assert_lossless

    target, draft = real_models
    local_plain, local_plain_pieces = greedy(target, None, 0)
    local_spec, _ = greedy(target, draft, 4)
    remote_plain, remote_plain_pieces = greedy(remote_target, None, 0)
    remote_spec, _ = greedy(remote_target, draft, 4)
    assert len(local_plain.tokens) == N_TOKENS
    assert_lossless(remote_plain, local_plain_pieces, local_plain)
    assert_lossless(local_spec, local_plain_pieces, local_plain)
    # the remote target's cache is rolled back after every rejection, like the local one
    assert remote_spec.stats.drafted > remote_spec.stats.accepted > 0
    assert_lossless(remote_spec, remote_plain_pieces, remote_plain)
    assert_lossless(remote_spec, local_plain_pieces, local_plain)


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localspec", "run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.mark.real
def test_closed_port_is_one_line_error(real_paths):
    out = run_cli(
        "--target", str(real_paths[0]), "--draft", "none", "--rpc", f"127.0.0.1:{free_port()}",
        "-n", "4", "hi",
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.startswith("localspec: cannot reach the RPC server at 127.0.0.1:")
    assert len(out.stderr.strip().splitlines()) == 1
    assert out.stdout == ""


@pytest.mark.real
def test_server_killed_mid_answer_ends_it_with_one_line(real_paths):
    """llama.cpp aborts the process on an RPC failure; localspec turns the abort into
    `localspec: ...` and exit 1 after the answer so far (docs/rpc.md)."""
    server = RpcServer().start()
    try:
        pair = ["--target", str(real_paths[0]), "--draft", str(real_paths[1]), "--ctx", "1024"]
        pair += ["--rpc", server.endpoint, "--threads", "2"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "localspec", "run", *pair, "-n", "400", "Write a long story."],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        assert proc.stdout is not None
        first = proc.stdout.read(1)  # the answer has started: the target is remote
        assert first, proc.stderr.read() if proc.stderr else ""
        server.kill()
        stdout, stderr = proc.communicate(timeout=60)
        lines = stderr.decode().strip().splitlines()
        assert proc.returncode == 1
        assert lines[-1].startswith("localspec: an RPC server stopped answering (ggml-rpc.cpp:")
        assert "Traceback" not in stderr.decode()
        assert len(first + stdout) > 0
        server.start()  # back on the same port: the next run uses it again
        again = run_cli(*pair, "-n", "4", "hi")
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip()
    finally:
        server.kill()


def network_namespaces() -> bool:
    """Whether this user can make a network namespace of its own (`unshare -rn`)."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0


@pytest.mark.real
def test_a_server_that_vanishes_mid_answer_ends_it_with_one_line(real_paths):
    """A server whose machine vanishes (cable pulled, power cut) closes nothing, and
    llama.cpp would wait for its answer forever; with `rpc.keep_alive` the kernel gives
    up within DEAD_AFTER_S and the run ends as for a killed server. The loopback that
    goes down is a namespace's own (tests/backends/rpc_vanish.py)."""
    if not network_namespaces():
        pytest.skip("this kernel does not let this user make a network namespace (unshare -rn)")
    driver = Path(__file__).with_name("rpc_vanish.py")
    args = [str(real_paths[0]), str(real_paths[1])]
    out = subprocess.run(
        ["unshare", "-rn", sys.executable, str(driver), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["rc"] is not None, "the answer hung after the server vanished"
    lines = result["stderr"].strip().splitlines()
    assert result["rc"] == 1, result["stderr"]
    assert lines[-1].startswith("localspec: an RPC server stopped answering (ggml-rpc.cpp:")
    assert "Traceback" not in result["stderr"]
    assert result["seconds"] < rpc.DEAD_AFTER_S + 20


@pytest.mark.real
def test_the_bench_runs_over_rpc_through_the_latency_relay(real_paths, own_servers, tmp_path):
    """`localspec bench --rpc ... --rpc-rtt-ms`: the target's layers on both servers,
    each behind a relay; auto's answer is plain decoding's, and the report says where
    the target ran."""
    endpoints = ",".join(s.endpoint for s in own_servers)
    out = subprocess.run(
        [
            sys.executable, "-m", "localspec", "bench",
            "--target", str(real_paths[0]), "--draft", str(real_paths[1]),
            "--draft-quant", "keep", "--threads", "2", "--ctx", "2048",
            "--rpc", endpoints, "--rpc-rtt-ms", "2",
            "--only", "code-lru-cache", "--modes", "baseline,auto", "-n", "24",
            "--no-chart", "--no-costs", "--out", str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))
    placement = report["info"]["placement"]
    assert "on 2 rpc-server(s)" in placement and "2 ms round-trip time added" in placement
    assert all(e in placement for e in endpoints.split(","))  # the servers, not the relays
    assert report["defects"] == []
    (auto,) = [r for r in report["results"] if r["mode"] == "auto"]
    assert auto["tokens"] == 24 and auto["runs"][0]["drafted"] > 0
    assert placement in (tmp_path / "bench.md").read_text(encoding="utf-8")


@pytest.mark.real
def test_plan_counts_the_servers_memory_for_the_target(own_servers):
    """`plan --rpc`: the servers' free memory (as they report it) holds the target's
    layers, so a machine with little RAM is planned a bigger target than alone."""
    from localspec.models.catalog_file import default_catalog

    endpoints = ",".join(s.endpoint for s in own_servers)
    what_if = ["plan", "--json", "--gpu", "none", "--ram", "8GiB", "--min-speed", "0"]
    alone, split = localspec(*what_if), localspec(*what_if, "--rpc", endpoints)
    assert alone.returncode == 0 and split.returncode == 0, alone.stderr + split.stderr
    alone_plan, split_plan = json.loads(alone.stdout), json.loads(split.stdout)
    assert [d["endpoint"] for d in split_plan["rpc_devices"]] == endpoints.split(",")
    assert all(0 < d["free"] <= d["total"] for d in split_plan["rpc_devices"])
    memory = split_plan["memory"]
    assert 0 < memory["remote_estimate"] <= memory["remote_budget"]
    assert alone_plan["memory"]["remote_estimate"] == 0
    catalog = default_catalog()
    params = [catalog.model(p["target"]["id"]).params for p in (alone_plan, split_plan)]
    assert params[1] > params[0]
    assert any("layers on the rpc-servers" in r for r in split_plan["reasons"])


@pytest.mark.real
@pytest.mark.tui
def test_the_chat_survives_a_server_killed_mid_answer(real_paths, tmp_path):
    """llama.cpp ends the process; the chat starts itself again on the same
    conversation (the answer so far kept), says why, and answers again once the server
    is back and Ctrl+R has reloaded the pair (tui/recovery.py)."""
    from localspec.conversations import ConversationStore

    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed (apt-get install tmux)")
    target, draft = real_paths
    server = RpcServer().start()
    exe = Path(sys.executable).with_name("localspec")
    command = shlex.join([
        str(exe), "chat", "--target", str(target), "--draft", str(draft), "--rpc",
        server.endpoint, "--ctx", "1024", "--threads", "2", "--max-tokens", "400",
    ])  # fmt: skip
    name = f"localspec-rpc-{uuid.uuid4().hex[:8]}"
    tmux(
        "new-session", "-d", "-s", name, "-x", "140", "-y", "45",
        "-e", f"LOCALSPEC_HOME={tmp_path}", "-e", "TERM=xterm-256color",
        # the size the app reads (from pytest it laid out 80x24, shutil's fallback,
        # where the stats panel this test reads is hidden)
        "-e", "COLUMNS=140", "-e", "LINES=45",
        f"{command}; echo EXITED $?; sleep 60",
    )  # fmt: skip

    def screen() -> str:
        return tmux("capture-pane", "-p", "-t", name)

    def loaded(s: str) -> bool:  # the stats panel names the pair once it is loaded
        return "target " in s and "loading" not in s and "not loaded" not in s

    store = ConversationStore(tmp_path / "conversations")
    try:
        wait_for(screen, loaded, timeout=120)
        tmux("send-keys", "-t", name, "-l", "Write a long story about a lighthouse.")
        tmux("send-keys", "-t", name, "Enter")
        wait_for(lambda: answer_so_far(store), lambda a: len(a) > 40, timeout=120)
        server.kill()
        # restarted on the same conversation; the pair cannot load while the server is down
        text = wait_for(
            screen, lambda s: "The chat restarted" in s and "not loaded" in s, timeout=120
        )
        assert "EXITED" not in text and "Traceback" not in text, text
        said = answer_so_far(store)
        assert "Write a long story" in text and said.split()[0] in text, text
        server.start()  # back on the same port
        tmux("send-keys", "-t", name, "C-r")
        wait_for(screen, loaded, timeout=120)
        tmux("send-keys", "-t", name, "-l", "Now say hi.")
        tmux("send-keys", "-t", name, "Enter")
        wait_for(screen, lambda s: re.search(r"(done|max tokens) · \d+ tokens", s), timeout=180)
        tmux("send-keys", "-t", name, "C-q")
        text = wait_for(screen, lambda s: "EXITED" in s, timeout=30)
        assert "EXITED 0" in text and "Traceback" not in text, text
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
        server.kill()
    (info,) = store.list()
    messages = store.load(info.id).messages
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[1].content.startswith(said)  # the answer so far, kept
    assert messages[3].content.strip()


def answer_so_far(store) -> str:
    """The first answer's text as saved so far ('' before there is one)."""
    conversations = store.list()
    if not conversations:
        return ""
    messages = store.load(conversations[0].id).messages
    return messages[1].content if len(messages) > 1 else ""
