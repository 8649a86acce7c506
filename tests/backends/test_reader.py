"""The reader's plain parts: a sequence's state between contexts of other cache counts,
the model buffers' sizes from llama.cpp's load log, and the RAM it is weighed against."""

from __future__ import annotations

from localspec.backends import ram, reader, seq_state
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


def test_the_buffer_sizes_are_heard_from_this_threads_load_only():
    reader.hear_log(b"load_tensors:   CPU_REPACK model buffer size =   596.53 MiB\n")
    reader.start_hearing()
    reader.hear_log(b"load_tensors:   CPU_Mapped model buffer size =  1059.89 MiB\n")
    reader.hear_log(b"load_tensors:   CPU_REPACK model buffer size =   596.53 MiB\n")
    assert reader.model_buffers() == {"CPU_Mapped": 1059.89, "CPU_REPACK": 596.53}
    reader.hear_log(b"load_tensors:   CPU_REPACK model buffer size =   12.00 MiB\n")
    assert reader.model_buffers() == {}  # stopped hearing: nothing since


def test_what_loaded_models_read_from_their_files_is_not_spare(monkeypatch):
    """psutil counts a mapped file's pages as available (the kernel may drop them): the
    reader's room and serve's kept prompts leave out what loaded models hold."""
    import psutil

    from localspec.cli.serve import cache_ram_bytes

    before = ram.held()  # models other tests left loaded
    free = psutil.virtual_memory()._replace(available=before + (4 << 30))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: free)
    draft, target = object(), object()
    ram.hold(draft, 1 << 30)
    ram.hold(target, 1 << 30)
    try:
        assert ram.held() - before == 2 << 30 and ram.spare() == 2 << 30
        assert reader.has_room((3 << 30) - (1 << 29)) is False  # it would have fit
        assert reader.has_room((2 << 30) - (1 << 29)) is True
        assert cache_ram_bytes(None) == (2 << 30) // 4
        assert cache_ram_bytes(100) == 100 << 20  # as asked
        ram.hold(target, 0)  # nothing read in place (all on a GPU, or read into RAM)
        assert ram.held(target) == 0 and ram.spare() == 3 << 30
    finally:
        ram.release(draft)
        ram.release(target)
    assert ram.held() == before
