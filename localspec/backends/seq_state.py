"""A llama.cpp sequence's cache as bytes (`llama_state_seq_get/set_data`): what serve
keeps in RAM (--cache-ram), what moves a slot's cache between sequences, and what the
prompt reader hands between its context and the target's (reader.py)."""

from __future__ import annotations

import ctypes

import llama_cpp as ll

from localspec.backends.base import SeqState


def c_bytes(buf: bytearray) -> ctypes.Array[ctypes.c_uint8]:
    """`buf` as llama.cpp's uint8_t array, not copied."""
    return (ctypes.c_uint8 * len(buf)).from_buffer(buf)


def get_state(ctx: ctypes.c_void_p, at: int) -> SeqState | None:
    """llama.cpp sequence `at`'s state in context `ctx`; None where it could not copy it."""
    size = ll.llama_state_seq_get_size(ctx, at)
    state = SeqState(size)
    return state if ll.llama_state_seq_get_data(ctx, c_bytes(state), size, at) == size else None


def set_state(ctx: ctypes.c_void_p, at: int, state: bytearray) -> bool:
    """Sequence `at` as `state` says (llama.cpp drops what it held first); False where it
    could not (no room in one block of cells, or another layout)."""
    return bool(ll.llama_state_seq_set_data(ctx, c_bytes(state), len(state), at))


def restream(state: SeqState, n_stream: int) -> SeqState:
    """A sequence's state as a context of `n_stream` caches reads it. llama.cpp writes
    a header (magic, version), its context's cache count, then a cell count and the
    cells for each cache (0 and nothing where the sequence has none), and reads it only
    where the counts agree; the cells go to the sequence's own cache whatever their
    place."""
    head, had = state[:8], int.from_bytes(state[8:12], "little")
    if had == n_stream:
        return state
    zero, lead = bytes(4), 0
    while lead < had and state[12 + 4 * lead : 16 + 4 * lead] == zero:
        lead += 1
    cells = state[12 + 4 * lead : len(state) - 4 * (had - 1 - lead)] if lead < had else zero
    return SeqState(head + n_stream.to_bytes(4, "little") + cells + zero * (n_stream - 1))
