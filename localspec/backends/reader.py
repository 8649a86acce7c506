"""A second, not repacked load of a CPU target that reads its long prompt chunks.

llama.cpp repacks a CPU model's Q4_K weights into interleaved blocks (`use_extra_bufts`).
On the x86 CPUs measured here (an AVX-512 Xeon and an EPYC, docs/performance.md) the
repacked kernels decode a pass of a few tokens faster (up to 1.6x, at four), and read a
prompt 1.3-1.7x slower than the plain ones. Speculation lives on the first and completions on the
second, so the target is loaded both ways: the repacked model decodes, and this one
reads any pass of one sequence of at least READ_MIN tokens. A sequence's cache goes over
as llama.cpp's sequence state (~29 MB for 1,000 tokens of the 1.5B target: ~10 ms), in
when the reader does not hold it as it is, back after each of its passes
(`LlamaModel._take_back`). Only the
repacked tensors' file pages are extra in RAM (the rest is the same mmap), with one
sequence's cache.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import llama_cpp as ll
import numpy as np

from localspec.backends import ram
from localspec.backends.base import ContextFull, SeqState
from localspec.backends.seq_layout import Part
from localspec.backends.seq_state import get_state, restream, set_state
from localspec.models.hardware import x86_cpu

READ_MIN = 64  # the fewest tokens a pass reads through the reader: below, repacked is faster

_capture = threading.local()  # this thread's load's log lines (see `model_buffers`)


def hear_log(text: bytes) -> None:
    """llama.cpp's log line, kept where this thread is loading a model."""
    lines = getattr(_capture, "lines", None)
    if lines is not None:
        lines.append(text.decode("utf-8", "replace"))


def start_hearing() -> None:
    _capture.lines = []


def model_buffers() -> dict[str, float]:
    """The model buffers llama.cpp logged for the model this thread just loaded, by name,
    in MiB (`CPU_Mapped model buffer size = 1059.89 MiB`: the weights read from the
    file's pages; `CPU_REPACK ...`: those repacked into memory of their own); stops
    hearing."""
    lines, _capture.lines = getattr(_capture, "lines", None) or [], None
    sizes = {}
    for line in lines:
        if " model buffer size" in line:
            name = line.split(" model buffer size")[0].split()[-1]
            sizes[name] = float(line.split("=")[1].split()[0])
    return sizes


def reads_faster_plain() -> bool:
    """Where the plain kernels were measured to read prompts faster (x86)."""
    return x86_cpu()


def pays(repacked_mib: float) -> bool:
    """Whether a reader pays for a model of which llama.cpp repacked this many MiB."""
    return bool(repacked_mib) and reads_faster_plain()


def size_of(model: ctypes.c_void_p, repacked_mib: float, n_ctx: int) -> int:
    """What a reader of this llama.cpp model takes in RAM: the repacked tensors' file
    pages and one sequence's cache (f16 K and V)."""
    head = ll.llama_model_n_embd(model) // max(1, ll.llama_model_n_head(model))
    kv = 4 * ll.llama_model_n_layer(model) * ll.llama_model_n_head_kv(model) * head * n_ctx
    return int(repacked_mib * 2**20) + kv


def has_room(size: int) -> bool:
    """Whether RAM has `size` bytes free with 512 MiB to spare, beside the file pages
    the models loaded so far read (the draft's, the target's own)."""
    return ram.spare() >= size + 2**29


class PromptReader:
    """The target's file loaded again, not repacked, with a cache for one sequence of
    n_ctx tokens; it holds one of the main context's sequences (`holds`) at a time."""

    def __init__(self, path: Path, n_ctx: int, n_batch: int, n_threads: int, n_stream: int) -> None:
        self.n_stream = n_stream  # the main context's caches (one per slot, or one for all)
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.use_extra_bufts = False
        self._model = ll.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise MemoryError(f"could not load {path} again")
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = n_threads
        self.ctx = ll.llama_init_from_model(self._model, cparams)
        if not self.ctx:
            ll.llama_model_free(self._model)
            raise MemoryError("no room for the reader's cache")
        self._mem = ll.llama_get_memory(self.ctx)
        self._batch = ll.llama_batch_init(n_batch, 0, 1)
        self.holds: int | None = None  # the main context's sequence held here, as it is there
        self.reads = 0  # passes read here (tests and the bench ask)
        self.extra_bytes = 0  # RAM it takes beyond the repacked model's (as estimated)

    @staticmethod
    def wants(parts: list[Part]) -> bool:
        return len(parts) == 1 and len(parts[0].tokens) >= READ_MIN

    def forget(self, *ats: int) -> None:
        """The main context changed these sequences: what is held here is stale."""
        if self.holds in ats:
            self.holds = None

    def read(self, main: ctypes.c_void_p, at: int, part: Part) -> SeqState:
        """Decode `part` after the main context's sequence `at`: the sequence's state
        then, for the main context to take back (`LlamaModel._take_back`)."""
        if self.holds != at:
            ll.llama_memory_seq_rm(self._mem, 0, -1, -1)
            if ll.llama_memory_seq_pos_max(ll.llama_get_memory(main), at) >= 0:
                state = get_state(main, at)
                if state is None or not set_state(self.ctx, 0, restream(state, 1)):
                    raise ContextFull("the reader could not take the sequence's cache")
        self.holds = None  # till the main context has taken it back
        self._decode(part)
        self.reads += 1
        if (state := get_state(self.ctx, 0)) is None:
            raise ContextFull("llama.cpp could not copy the reader's cache out")
        return restream(state, self.n_stream)

    def _decode(self, part: Part) -> None:
        batch = self._batch
        first_scored = len(part.tokens) - part.n_logits
        for j, tok in enumerate(part.tokens):
            batch.token[j] = tok
            batch.pos[j] = part.pos + j
            batch.n_seq_id[j] = 1
            batch.seq_id[j][0] = 0
            batch.logits[j] = int(j >= first_scored)
        batch.n_tokens = len(part.tokens)
        if (rc := ll.llama_decode(self.ctx, batch)) != 0:
            self.holds = None
            raise ContextFull(f"llama_decode failed ({rc}): the reader's cache is full")

    def logits(self, n: int, n_vocab: int) -> np.ndarray:
        return np.ctypeslib.as_array(ll.llama_get_logits(self.ctx), shape=(n, n_vocab))

    def close(self) -> None:
        if self.ctx:
            ll.llama_batch_free(self._batch)
            ll.llama_free(self.ctx)
            ll.llama_model_free(self._model)
            self.ctx = None
