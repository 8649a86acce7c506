"""RAM really spare beside the models this process loaded.

llama.cpp maps a model's file (mmap) and reads the weights it keeps on the CPU from the
file's pages. The kernel counts those as cache it may drop, so `available` holds them as
free while every pass reads them, and before a model's first pass they are not in RAM at
all. Either way they are taken, so what a later allocation (the prompt reader, serve's
kept prompts) is weighed against is what is available less the pages each loaded model
reads (`hold`). Its caches and repacked weights are RAM of their own: `available` has
them already.
"""

from __future__ import annotations

import threading

_held: dict[int, int] = {}  # id of a holder -> bytes of file pages it reads
_lock = threading.Lock()


def hold(owner: object, size: int) -> None:
    """`owner` reads `size` bytes of a file's pages (0: none) till `release`."""
    with _lock:
        if size > 0:
            _held[id(owner)] = size
        else:
            _held.pop(id(owner), None)


def release(owner: object) -> None:
    with _lock:
        _held.pop(id(owner), None)


def held(owner: object | None = None) -> int:
    """Bytes of file pages the loaded models read (`owner`'s only, where named)."""
    with _lock:
        return sum(_held.values()) if owner is None else _held.get(id(owner), 0)


def spare() -> int:
    """RAM available for more, the loaded models' file pages counted as taken."""
    import psutil

    return max(0, psutil.virtual_memory().available - held())
