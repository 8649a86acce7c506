"""A server whose machine vanishes mid-answer, for test_rpc.py: run under `unshare -rn`,
so the loopback here is this namespace's own. An rpc-server on it holds the target,
`localspec run` starts answering, and then the loopback goes down, as a cable pulled out:
nothing closes, packets just stop. Prints {rc, stderr, seconds} as JSON: rc null if the
run still hung after HANG_S.

    unshare -rn python rpc_vanish.py TARGET.gguf DRAFT.gguf
"""

from __future__ import annotations

import fcntl
import json
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from localspec.backends.rpc import RpcError, probe

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 90
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def set_loopback(up: bool) -> None:
    """`ip link set lo up/down`, without needing iproute2."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        flags = flags | _IFF_UP if up else flags & ~_IFF_UP
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags))


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server_args = ["--host", "127.0.0.1", "--port", str(port), "--device", "CPU"]
    args = [sys.executable, "-m", "localspec.backends.rpc_server", *server_args]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    server = subprocess.Popen([*args, "--threads", "1"], **quiet)
    endpoint = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            probe(endpoint, timeout=2)
            return server, endpoint
        except RpcError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main(target: str, draft: str) -> dict[str, object]:
    set_loopback(True)
    server, endpoint = start_server()
    try:
        pair = ["--target", target, "--draft", draft, "--ctx", "1024", "--threads", "2"]
        pair += ["--rpc", endpoint, "-n", "400"]
        run = subprocess.Popen(
            [sys.executable, "-m", "localspec", "run", *pair, "Write a long story."],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        assert run.stdout is not None
        if not run.stdout.read(1):  # the answer has started: the target is remote
            return {"rc": run.wait(), "stderr": run.stderr.read().decode(), "seconds": 0}
        set_loopback(False)
        pulled = time.monotonic()
        try:
            _, stderr = run.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            run.kill()
            return {"rc": None, "stderr": "", "seconds": HANG_S}
        took = time.monotonic() - pulled
        return {"rc": run.returncode, "stderr": stderr.decode(), "seconds": took}
    finally:
        server.kill()


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:3])))
