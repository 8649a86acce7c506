"""The target's layers on other machines, through llama.cpp's RPC backend.

`rpc-server` (scripts/rpc_server.sh) serves one machine's device over TCP. `--rpc
host:port,...` adds each server's devices to the target's device list, the way
llama.cpp's own `--rpc` does: `ggml_backend_rpc_add_server`, reached through the backend
registry. The servers are not registered globally (llama.cpp's tools do that), so a
model loaded without an explicit device list, the draft, never sees them: it stays local.

llama.cpp aborts the whole process when a server cannot be reached, speaks another
protocol version, or stops answering (GGML_ABORT in ggml-rpc.cpp). So before llama.cpp
sees a server we connect to it ourselves, with a bounded time, and check its version;
a server that dies mid-answer still ends the process, with one line saying why
(`end_process_on_abort`; docs/rpc.md). A server whose machine vanishes (power, cable,
Wi-Fi) closes nothing, and llama.cpp's sockets would wait for its answer forever:
`keep_alive` has the kernel give up on it within DEAD_AFTER_S, which llama.cpp then
reports as any other failed server.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import stat
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from localspec.errors import LocalspecError

# ggml-rpc.h's RPC_PROTO_MAJOR_VERSION / MINOR for the vendored llama.cpp; a server built
# from another llama.cpp is refused here rather than aborting the process in ggml.
PROTO_MAJOR, PROTO_MINOR = 7, 0
CONNECT_TIMEOUT_S = 5.0
# A server that has not acknowledged anything for this long is gone: TCP keepalive
# probes (answered by a live machine's kernel, however busy its rpc-server) and a limit
# on unacknowledged data both say so within it.
DEAD_AFTER_S = 15
_KEEPALIVE_IDLE_S, _KEEPALIVE_PROBES = 5, 5  # then a probe every 2 s
_CMD_HELLO = 14
_CONN_CAPS_SIZE = 24  # transport.h: RPC_CONN_CAPS_SIZE
_HELLO_REPLY = struct.Struct("<BBBB")  # major, minor, patch, padding; then the caps

# enum ggml_backend_dev_type
_DEV_GPU, _DEV_IGPU = 1, 2

_AddServer = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_AbortCallback = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


@cache
def _ggml() -> ctypes.CDLL:
    """ggml as llama-cpp-python loaded it (the same library llama.cpp runs on), typed;
    loaded on first use so that parsing endpoints stays free of llama.cpp."""
    from llama_cpp._ggml import libggml

    lib = ctypes.CDLL(libggml._name)  # the same loaded library; its own typed functions
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_count.argtypes = []
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_memory.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_set_abort_callback.argtypes = [_AbortCallback]
    lib.ggml_set_abort_callback.restype = ctypes.c_void_p
    return lib


class RpcError(LocalspecError):
    """An RPC server that cannot be used: unreachable, refusing, or another version."""


@dataclass(frozen=True)
class RemoteDevice:
    """One device an rpc-server serves, as llama.cpp's registry sees it."""

    endpoint: str  # host:port
    name: str  # llama.cpp's name for it: RPC0, RPC1, ...
    free: int  # bytes
    total: int
    handle: int  # ggml_backend_dev_t


def parse_endpoints(text: str) -> tuple[str, ...]:
    """`host:port[,host:port...]` as a tuple of endpoints; a one-line error otherwise."""
    endpoints = tuple(part.strip() for part in text.split(",") if part.strip())
    if not endpoints:
        raise RpcError("--rpc wants host:port[,host:port...]")
    for endpoint in endpoints:
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RpcError(f"--rpc wants host:port[,host:port...], not {endpoint!r}")
    if len(set(endpoints)) < len(endpoints):
        raise RpcError(f"--rpc names a server twice: {text}")
    return endpoints


def probe(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> tuple[int, int, int]:
    """Connect and say HELLO as ggml-rpc does; the server's protocol version.

    Raises RpcError, within about `timeout` seconds, for a server that is unreachable,
    refuses, is busy (rpc-server serves one client at a time), is not an rpc-server,
    or speaks another protocol version."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CONN_CAPS_SIZE) + bytes(_CONN_CAPS_SIZE))
            size = struct.unpack("<Q", _recv_exactly(sock, 8, endpoint))[0]
            if size != _HELLO_REPLY.size + _CONN_CAPS_SIZE:
                raise RpcError(f"{endpoint} does not answer like llama.cpp's rpc-server {_want()}")
            major, minor, patch, _ = _HELLO_REPLY.unpack(
                _recv_exactly(sock, _HELLO_REPLY.size, endpoint)
            )
    except TimeoutError:
        raise RpcError(
            f"the RPC server at {endpoint} did not answer within {timeout:g} s "
            "(unreachable, or busy with another client)"
        ) from None
    except OSError as e:
        reason = e.strerror or str(e)
        raise RpcError(f"cannot reach the RPC server at {endpoint}: {reason}") from None
    if major != PROTO_MAJOR or minor > PROTO_MINOR:
        raise RpcError(
            f"the RPC server at {endpoint} speaks protocol {major}.{minor}.{patch}, "
            f"this llama.cpp {_want()}: build both from the same llama.cpp"
        )
    return major, minor, patch


def _want() -> str:
    return f"{PROTO_MAJOR}.{PROTO_MINOR}"


def _recv_exactly(sock: socket.socket, n: int, endpoint: str) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise RpcError(
                f"{endpoint} closed the connection: not llama.cpp's rpc-server {_want()}"
            )
        data += chunk
    return data


def remote_devices(endpoints: tuple[str, ...]) -> list[RemoteDevice]:
    """The devices the servers at `endpoints` serve, each server probed first."""
    for endpoint in endpoints:
        probe(endpoint)
    add_server = _add_server_function()
    devices = []
    for endpoint in endpoints:
        reg = add_server(endpoint.encode())
        if not reg:
            raise RpcError(f"the RPC server at {endpoint} serves no device")
        for i in range(_ggml().ggml_backend_reg_dev_count(reg)):
            dev = _ggml().ggml_backend_reg_dev_get(reg, i)
            free, total = device_memory(dev)
            name = (_ggml().ggml_backend_dev_name(dev) or b"").decode()
            devices.append(RemoteDevice(endpoint, name, free, total, dev))
    return devices


def _add_server_function() -> Callable[[bytes], int | None]:
    reg = _ggml().ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RpcError("this llama-cpp-python was built without RPC: rerun scripts/setup.sh")
    address = _ggml().ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not address:
        raise RpcError("llama.cpp's RPC backend has no ggml_backend_rpc_add_server")
    return _AddServer(address)


def device_memory(dev: int) -> tuple[int, int]:
    """(free, total) bytes of a device; an RPC device asks its server."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _ggml().ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def cpu_buffer_type() -> int:
    """ggml's host buffer type: where --n-cpu-moe keeps tensors (llama.cpp's choice)."""
    lib = _ggml()
    lib.ggml_backend_cpu_buffer_type.argtypes = []
    lib.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    return int(lib.ggml_backend_cpu_buffer_type())


def local_devices() -> list[int]:
    """The local GPUs llama.cpp would offload to by default (its rule: discrete GPUs,
    else integrated ones); the CPU is not in the list, llama.cpp adds it itself."""
    gpus, igpus = [], []
    for i in range(_ggml().ggml_backend_dev_count()):
        dev = _ggml().ggml_backend_dev_get(i)
        reg = _ggml().ggml_backend_dev_backend_reg(dev)
        if reg and _ggml().ggml_backend_reg_name(reg) == b"RPC":
            continue
        kind = _ggml().ggml_backend_dev_type(dev)
        if kind == _DEV_GPU:
            gpus.append(dev)
        elif kind == _DEV_IGPU:
            igpus.append(dev)
    return gpus or igpus


def device_list(devices: list[int]) -> ctypes.Array[ctypes.c_void_p]:
    """A NULL-terminated ggml_backend_dev_t array, for llama_model_params.devices."""
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


def target_devices(endpoints: tuple[str, ...]) -> ctypes.Array[ctypes.c_void_p]:
    """The remote devices first (llama.cpp's order: fewer transfers), then the local
    GPUs; installs the one-line message for an RPC failure llama.cpp aborts on."""
    remote = remote_devices(endpoints)
    end_process_on_abort()
    return device_list([d.handle for d in remote] + local_devices())


def keep_alive(endpoints: tuple[str, ...]) -> int:
    """Have the kernel notice, within DEAD_AFTER_S, a server on llama.cpp's connections
    to `endpoints` that vanished without closing them; llama.cpp's next read or write
    then fails, and it aborts as for a killed server (a line, or the chat's restart).
    The connections are llama.cpp's own sockets, found among this process's open files;
    returns how many were set."""
    peers = {addr for endpoint in endpoints for addr in _addresses(endpoint)}
    count = 0
    for fd in _open_sockets():
        with socket.socket(fileno=os.dup(fd)) as sock:  # a duplicate: closing it is ours
            try:
                peer = sock.getpeername()
            except OSError:
                continue
            if sock.type == socket.SOCK_STREAM and tuple(peer[:2]) in peers:
                _set_dead_peer_timeouts(sock)
                count += 1
    return count


def _addresses(endpoint: str) -> set[tuple[str, int]]:
    host, _, port = endpoint.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), proto=socket.IPPROTO_TCP)
    except OSError:
        return set()
    return {(str(info[4][0]), int(info[4][1])) for info in infos}


def _open_sockets() -> list[int]:
    """This process's open file descriptors that are sockets (Linux and macOS)."""
    fds = []
    for name in os.listdir("/dev/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                fds.append(int(name))
        except (OSError, ValueError):
            continue  # the listing's own descriptor, closed by now
    return fds


def _set_dead_peer_timeouts(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    interval = (DEAD_AFTER_S - _KEEPALIVE_IDLE_S) // _KEEPALIVE_PROBES
    options = {  # each where this platform has it (macOS names the idle time KEEPALIVE)
        "TCP_KEEPIDLE": _KEEPALIVE_IDLE_S,
        "TCP_KEEPALIVE": _KEEPALIVE_IDLE_S,
        "TCP_KEEPINTVL": interval,
        "TCP_KEEPCNT": _KEEPALIVE_PROBES,
        "TCP_USER_TIMEOUT": DEAD_AFTER_S * 1000,  # Linux: unacknowledged data, in ms
    }
    for name, value in options.items():
        if hasattr(socket, name):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


# Called with the one-line reason before the process ends; the chat sets one that
# starts it again (tui/recovery.py). It may not return (exec); if it does, the process
# ends as without it.
_abort_handler: Callable[[str], None] | None = None


def set_abort_handler(handler: Callable[[str], None] | None) -> None:
    """What to do, before the process ends, when llama.cpp aborts (see end_process_on_abort)."""
    global _abort_handler
    _abort_handler = handler


def _on_abort(message: bytes | None) -> None:
    text = (message or b"").decode("utf-8", "replace").strip()
    where, sep, what = text.partition(": ")  # "/long/build/path/ggml-rpc.cpp:566: ..."
    text = f"{where.replace(chr(92), '/').rsplit('/', 1)[-1]}{sep}{what}"
    with contextlib.suppress(Exception):  # nothing may stop the message below
        sys.stdout.flush()  # the answer so far stays on the screen
        _leave_full_screen()
    why = "an RPC server stopped answering" if "RPC" in text else "llama.cpp failed"
    line = f"{why} ({text})"
    if _abort_handler is not None:
        with contextlib.suppress(Exception):
            _abort_handler(line)
    os.write(2, f"\nlocalspec: {line}; llama.cpp ends the process here\n".encode())
    os._exit(1)  # llama.cpp calls abort() after this callback: exit as the CLI does instead


def _leave_full_screen() -> None:
    """The chat (Textual) holds the terminal in its alternate screen, raw, with mouse
    reporting on: undo that, or the message is lost and the shell left unusable."""
    if "textual" not in sys.modules or not os.isatty(1):
        return
    os.write(1, b"\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?2004l\x1b[?25h\x1b[?1049l")
    import termios

    attrs = termios.tcgetattr(0)
    attrs[0] |= termios.ICRNL
    attrs[1] |= termios.OPOST
    attrs[3] |= termios.ECHO | termios.ICANON | termios.ISIG | termios.IEXTEN
    termios.tcsetattr(0, termios.TCSANOW, attrs)


_ABORT_CALLBACK = _AbortCallback(_on_abort)  # kept alive: ggml holds a raw pointer


def end_process_on_abort() -> None:
    """When llama.cpp aborts (an RPC server gone mid-answer), flush the answer so far,
    print one `localspec: ...` line and exit 1 instead of abort()'s core dump."""
    _ggml().ggml_set_abort_callback(_ABORT_CALLBACK)
