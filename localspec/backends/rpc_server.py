"""llama.cpp's `rpc-server`, run from the library localspec already runs on.

Serves this machine's device to another machine's `localspec run --rpc HOST:PORT`
(scripts/rpc_server.sh). It does what llama.cpp's tools/rpc/rpc-server.cpp does, through
the backend registry (`ggml_backend_rpc_start_server`), with llama-cpp-python's ggml,
which scripts/setup.sh builds with GGML_RPC: both ends are then the same llama.cpp by
construction, and nothing is built a second time.

    python -m localspec.backends.rpc_server [--host 127.0.0.1] [--port 50052]
        [--device CUDA0[,CUDA1]] [--threads N] [--cache]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
from pathlib import Path

from localspec.backends import rpc

# enum ggml_backend_dev_type
_DEV_CPU, _DEV_ACCEL = 0, 3
_StartServer = ctypes.CFUNCTYPE(
    None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p
)


def devices(names: list[str]) -> list[int]:
    """The devices named, else rpc-server's choice: the GPUs, or the CPU where none."""
    lib = rpc._ggml()
    found = {}
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        found[(lib.ggml_backend_dev_name(dev) or b"").decode()] = dev
    if names:
        unknown = [name for name in names if name not in found]
        if unknown:
            raise rpc.RpcError(f"no device {unknown[0]!r} here (devices: {', '.join(found)})")
        return [found[name] for name in names]
    kinds = {dev: lib.ggml_backend_dev_type(dev) for dev in found.values()}
    gpus = [dev for dev, kind in kinds.items() if kind not in (_DEV_CPU, _DEV_ACCEL)]
    return gpus or [dev for dev, kind in kinds.items() if kind == _DEV_CPU]


def cache_dir() -> Path:
    """Where llama.cpp's rpc-server keeps received tensors (its fs_get_cache_directory)."""
    if os.environ.get("LLAMA_CACHE"):
        return Path(os.environ["LLAMA_CACHE"]) / "rpc"
    if sys.platform == "darwin":
        return Path.home() / "Library/Caches/llama.cpp/rpc"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "llama.cpp" / "rpc"


def serve(host: str, port: int, names: list[str], threads: int, cache: bool) -> None:
    """Serve until the process is ended (the server's loop is llama.cpp's)."""
    lib = rpc._ggml()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    address = reg and lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_start_server")
    if not address:
        raise rpc.RpcError("this llama-cpp-python has no RPC backend: rerun scripts/setup.sh")
    chosen = devices(names)
    if not chosen:
        raise rpc.RpcError("no device to serve")
    folder = None
    if cache:
        (where := cache_dir()).mkdir(parents=True, exist_ok=True)
        folder = str(where).encode()
    if host != "127.0.0.1":
        print(
            f"rpc-server: serving on {host}: the RPC protocol has no authentication",
            file=sys.stderr,
        )
    # Python's SIGINT handler would wait for the C loop to return, which it never does
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    start = _StartServer(address)
    start(f"{host}:{port}".encode(), folder, threads, len(chosen), rpc.device_list(chosen))
    # it returns only when it could not listen
    raise rpc.RpcError(f"cannot listen on {host}:{port}: in use, or not an address of this machine")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rpc_server", description="llama.cpp's rpc-server: this machine's device for --rpc"
    )
    parser.add_argument(
        "--host", "-H", default="127.0.0.1", help="address to bind (default: loopback)"
    )
    parser.add_argument("--port", "-p", type=int, default=50052, help="default: 50052")
    parser.add_argument(
        "--device",
        "-d",
        default="",
        help="devices to serve, e.g. CUDA0,CUDA1 (default: the GPUs, else the CPU)",
    )
    default_threads = max(1, (os.cpu_count() or 2) // 2)
    parser.add_argument(
        "--threads",
        "-t",
        type=int,
        default=default_threads,
        help=f"CPU threads (default: {default_threads})",
    )
    parser.add_argument(
        "--cache",
        "-c",
        action="store_true",
        help="keep received tensors on disk, so a model's next load skips the transfer",
    )
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536 or args.threads < 1:
        parser.error("--port wants 1-65535 and --threads at least 1")
    try:
        serve(
            args.host,
            args.port,
            [n for n in args.device.replace("/", ",").split(",") if n],
            args.threads,
            args.cache,
        )
    except rpc.RpcError as e:
        print(f"rpc-server: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
