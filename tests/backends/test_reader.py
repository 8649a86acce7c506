"""The reader's plain parts: a sequence's state between contexts of other cache counts,
and the repacked weights' size from llama.cpp's load log."""

from __future__ import annotations

from localspec.backends import reader, seq_state
from localspec.backends.base import SeqState

HEAD = bytes.fromhex("d83c14af01000000")  # llama.cpp's magic and version, kept as they are


def state(n_stream: int, at: int, cells: bytes) -> SeqState:
    """A sequence's state as a context of n_stream caches writes it, its cells in `at`."""
    counts = [
        len(cells).to_bytes(4, "little") + cells if s == at else bytes(4) for s in range(n_stream)
    ]
    return SeqState(HEAD + n_stream.to_bytes(4, "little") + b"".join(counts))


def test_a_sequences_cells_go_between_cache_counts_unchanged():
    cells = bytes(range(1, 40))
    one = state(1, 0, cells)
    for n_stream in (2, 3, 4):
        for at in range(n_stream):
            many = state(n_stream, at, cells)
            assert seq_state.restream(many, 1) == one
            back = seq_state.restream(one, n_stream)
            assert back[:12] == HEAD + n_stream.to_bytes(4, "little")
            assert seq_state.restream(back, 1) == one  # the cells first, where llama.cpp reads them


def test_an_empty_sequence_stays_empty():
    empty = SeqState(HEAD + (3).to_bytes(4, "little") + bytes(12))
    assert seq_state.restream(empty, 1) == SeqState(HEAD + (1).to_bytes(4, "little") + bytes(4))


def test_the_repacked_size_is_heard_from_this_threads_load_only():
    reader.hear_log(b"load_tensors:   CPU_REPACK model buffer size =   596.53 MiB\n")
    reader.start_hearing()
    reader.hear_log(b"load_tensors:   CPU_Mapped model buffer size =  1059.89 MiB\n")
    reader.hear_log(b"load_tensors:   CPU_REPACK model buffer size =   596.53 MiB\n")
    assert reader.repacked_mib() == 596.53
    reader.hear_log(b"load_tensors:   CPU_REPACK model buffer size =   12.00 MiB\n")
    assert reader.repacked_mib() == 0.0  # stopped hearing: nothing since
