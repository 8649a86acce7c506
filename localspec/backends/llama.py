"""The llama.cpp backend, over llama-cpp-python's C API.

Hand-built batches carry a logits flag only on the positions being scored, so a
verification pass costs one batched decode and returns just γ+1 rows; rollback is
`llama_memory_seq_rm`. A recurrent or hybrid model's state cannot drop tokens, except
where llama.cpp keeps snapshots of it after each of the last tokens of a pass
(`n_rs_seq`, Qwen3.5/3.6, Nemotron-H, LFM2): `LoadOptions.rollback` asks for them, and a
rejected draft of at most that many tokens is rolled back exactly (see base.py for what
happens to a cut they do not cover). Nothing here samples: logits go back to the engine as numpy.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import llama_cpp as ll
import numpy as np

from localspec.backends import ram, reader, rpc, seq_state
from localspec.backends.base import (
    ContextFull,
    LoadFailed,
    Model,
    ModelError,
    SeqState,
    Tokens,
)
from localspec.backends.checkpoints import Checkpoints
from localspec.backends.gguf import GGUF_MAGIC
from localspec.backends.llama_vocab import LlamaVocab
from localspec.backends.seq_layout import Layout, Part

_SHOW_LOG = bool(os.environ.get("LOCALSPEC_LLAMA_LOG"))  # read once: this runs per decode


@ll.llama_log_callback
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    reader.hear_log(text)
    if _SHOW_LOG:
        print(text.decode("utf-8", "replace"), end="", flush=True)


def _init_backend() -> None:
    ll.llama_log_set(_quiet_log, ctypes.c_void_p(0))
    ll.llama_backend_init()


_init_backend()


@dataclass(frozen=True)
class LoadOptions:
    n_ctx: int = 4096  # 0 = the model's training context
    n_gpu_layers: int = -1  # -1 = all that llama.cpp can offload
    n_threads: int = 0  # 0 = physical cores
    n_batch: int = 512
    rpc: tuple[str, ...] = ()  # host:port of rpc-servers: the layers spread over them too
    n_seq: int = 1  # sequences (serve's slots), each with a cache of n_ctx tokens
    kv_unified: bool = False  # the sequences in one cache (see LlamaModel.__init__)
    # A recurrent/hybrid model's state snapshots (llama.cpp's n_rs_seq): a rejected draft
    # of up to this many tokens rolls back exactly. Each costs one more copy of the
    # recurrent state per sequence; 0 for plain decoding.
    rollback: int = 0
    mtp: bool = False  # load the GGUF's MTP head(s) too (localspec.backends.mtp drafts with them)
    cpu_moe: int = 0  # the first this many layers' routed experts in RAM (--n-cpu-moe)
    chat_template: str | None = None  # in place of the GGUF's (--chat-template-file)
    repack: bool = True  # weights repacked for llama.cpp's CPU kernels (False: --no-repack)
    # where they are, long prompt chunks read by a second load not repacked (reader.py)
    prompt_reader: bool = False


class _BuftOverride(ctypes.Structure):
    """llama.cpp's llama_model_tensor_buft_override: tensors matching `pattern` to `buft`."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def experts_in_ram(layers: int) -> ctypes.Array[_BuftOverride]:
    """Overrides that keep the routed experts of layers 0..layers-1 in host memory,
    as llama.cpp's --n-cpu-moe writes them (common/arg.cpp), ended by a null entry."""
    cpu = rpc.cpu_buffer_type()
    entries = (_BuftOverride * (layers + 1))()
    for i in range(layers):
        entries[i].pattern = rf"blk\.{i}\.ffn_(up|down|gate)_(ch|)exps".encode()
        entries[i].buft = cpu
    return entries


def default_threads() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def check_gguf(path: Path) -> None:
    """One-line errors for the common mistakes, before llama.cpp sees the file."""
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelError(f"not a file: {path}")
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelError(f"not a GGUF model file: {path}")


class LlamaModel(LlamaVocab, Model):
    """A GGUF model loaded by llama.cpp, with one context. The Model interface runs its
    sequence 0; `decode_parts` runs several sequences in one pass (serve's slots)."""

    def __init__(self, path: str | Path, options: LoadOptions = LoadOptions()) -> None:
        super().__init__()
        path = Path(path)
        check_gguf(path)
        self.path = path
        self.name = path.stem
        self.options = options
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = options.n_gpu_layers if options.n_gpu_layers >= 0 else 999
        mparams.load_mtp = self.mtp_loaded = options.mtp
        mparams.use_extra_bufts = options.repack
        if options.rpc:  # llama.cpp reads the list while loading: keep it alive till then
            devices = rpc.target_devices(options.rpc)
            mparams.devices = ctypes.cast(devices, ctypes.c_void_p)
        if options.cpu_moe:  # the same: alive till loaded
            overrides = experts_in_ram(options.cpu_moe)
            mparams.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
        reader.start_hearing()
        self._model = ll.llama_model_load_from_file(str(path).encode(), mparams)
        buffers = reader.model_buffers()  # MiB, as llama.cpp logs them
        self.repacked_mib = repacked_mib = buffers.get("CPU_REPACK", 0.0)
        if not self._model:
            raise LoadFailed(f"llama.cpp could not load {path} (out of memory, or a corrupt file)")
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.n_vocab = ll.llama_vocab_n_tokens(self._vocab)
        threads = self._threads = options.n_threads or default_threads()
        cparams = ll.llama_context_default_params()
        # Beyond its training context a model degrades, and llama.cpp would still try to
        # allocate the cache for it: cap it there (0 asks for exactly that).
        trained = ll.llama_model_n_ctx_train(self._model)
        n_ctx = min(options.n_ctx or trained, trained) if trained > 0 else options.n_ctx
        cparams.n_ctx = n_ctx * options.n_seq
        cparams.n_batch = cparams.n_ubatch = options.n_batch
        cparams.n_seq_max = options.n_seq
        # Several sequences (serve's slots): a cache each, or one for all of n_seq * n_ctx
        # cells (each held to n_ctx by the slots themselves). With a cache each, llama.cpp
        # cuts a pass whose sequences bring unequal token counts (one slot's round of 5,
        # three of 1) into several micro-batches, so speculation under load costs a pass
        # more (F16 1.5B, 4 slots, 2 cores: 15.3 tok/s in one cache against 11.4); in one
        # cache each token attends over every slot's cells, kept conversations included
        # (4 slots decoding plainly: 21.5 tok/s against 24.9). serve.py chooses.
        cparams.kv_unified = options.kv_unified and options.n_seq > 1
        cparams.n_threads = cparams.n_threads_batch = threads
        self._recurrent = bool(
            ll.llama_model_is_recurrent(self._model) or ll.llama_model_is_hybrid(self._model)
        )
        cparams.n_rs_seq = options.rollback if self._recurrent else 0
        # no recurrent state or MTP head to carry over, no experts placed: a plain CPU load
        plain = self.on_cpu and not (self._recurrent or options.mtp or options.cpu_moe)
        wanted = options.prompt_reader and plain and reader.pays(repacked_mib)
        # In one cache for all slots the reader's state goes back into a spare sequence
        # first: llama.cpp reads a state into contiguous cells only, which a shared cache
        # may not have, and the slot's cache is kept till it has (`_take_back`).
        self._spare = options.n_seq if wanted and cparams.kv_unified else None
        cparams.n_seq_max = options.n_seq + (self._spare is not None)
        self._ctx = ll.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            ll.llama_model_free(self._model)
            raise LoadFailed(
                f"not enough memory for a context of {cparams.n_ctx} tokens", cparams.n_ctx
            )
        # the file pages its CPU weights are read from (the repacked ones' are not, after)
        ram.hold(self, int((buffers.get("CPU_Mapped", 0.0) - repacked_mib) * 2**20))
        if options.rpc:  # the connections are open now: have them notice a vanished server
            rpc.keep_alive(options.rpc)
        self.n_ctx = ll.llama_n_ctx(self._ctx) // options.n_seq  # each sequence's share
        self.n_seq = options.n_seq
        self.kv_unified = bool(cparams.kv_unified)
        self.n_batch = ll.llama_n_batch(self._ctx)  # llama.cpp caps it at the context
        self._mem = ll.llama_get_memory(self._ctx)
        self._batch = ll.llama_batch_init(self.n_batch, 0, 1)
        self._piece_cache: dict[int, bytes] = {}
        # One state for the whole text (Mamba, RWKV; Qwen3.5, Jamba: partly): it rolls back
        # only through llama.cpp's snapshots, which it keeps for the architectures that
        # support them (0 for the others, Mamba among them).
        self._snapshots = ll.llama_n_rs_seq(self._ctx) if self._recurrent else 0
        self._last_pass: dict[int, int] = {}  # sequence -> tokens its last pass decoded
        # a sequence's cache lives in llama.cpp's sequence layout.where[seq] (moved to
        # close gaps between slots); every call into llama.cpp names that one (`_at`)
        self.layout = Layout(options.n_seq, self.kv_unified, self._recurrent, self.n_batch)
        self.on_pass: list[Callable[[list[Part]], None]] = []  # hears of each pass (MTP)
        self.on_close: list[Callable[[], None]] = []  # contexts of this model to free first
        self.one_token_s: deque[float] = deque(maxlen=256)  # the last one-token passes' times
        # sequence -> copies of its recurrent state, oldest first: see `keep_state`
        self._checkpoints = Checkpoints()
        # the slots' threads change their sequences' entries between passes, maybe at
        # once: llama.cpp's cache bookkeeping (one for all in a unified cache) is not
        # for two threads
        self._mem_lock = threading.RLock()
        # sized against the RAM left once the slots' caches took theirs (GiBs at 8k tokens
        # each for a 14B target): a second copy that pushed them into swap would not pay
        size = reader.size_of(self._model, repacked_mib, self.n_ctx) if wanted else 0
        self.reader = self._open_reader(size) if size and reader.has_room(size) else None
        self.reader_left_out = size if self.reader is None else 0  # RAM it would have taken
        if self.reader is None:
            self._spare = None
        self._read_last = False  # the last pass's logits are the reader's

    def _open_reader(self, extra_bytes: int) -> reader.PromptReader | None:
        n_stream = 1 if self.kv_unified else self.n_seq  # the main context's caches
        try:
            found = reader.PromptReader(
                self.path, self.n_ctx, self.n_batch, self._threads, n_stream
            )
        except MemoryError:
            return None
        found.extra_bytes = extra_bytes
        ram.hold(found, int(self.repacked_mib * 2**20))  # the repacked weights' pages again
        return found

    def _take_back(self, seq: int, state: SeqState) -> bool:
        """Sequence `seq`'s cache as the reader hands it back; False (the cache as it
        was) where a shared cache has no room for it in one block."""
        at = self._at(seq)
        if self._spare is None:  # its own cache, emptied: room enough
            ll.llama_memory_seq_rm(self._mem, at, -1, -1)
            if not self._set_state(at, state):
                raise ContextFull("the prompt reader's cache did not fit back into the context")
            return True
        if not self._set_state(self._spare, state):
            ll.llama_memory_seq_rm(self._mem, self._spare, -1, -1)
            return False
        ll.llama_memory_seq_rm(self._mem, at, -1, -1)
        self.layout.where[seq], self._spare = self._spare, at
        return True

    # --- the cache ------------------------------------------------------------------
    def _decode(self, tokens: list[int], pos: int, n_logits: int) -> np.ndarray:
        if pos + len(tokens) > self.n_ctx:
            raise ContextFull(f"context of {self.n_ctx} tokens is full")
        for start in range(0, len(tokens), self.n_batch):
            self.stop_if_cancelled(start)
            chunk = tokens[start : start + self.n_batch]
            scored = max(0, min(len(chunk), n_logits - (len(tokens) - start - len(chunk))))
            self._run([Part(0, chunk, pos + start, scored)])
        return self._logits(n_logits)

    def decode_parts(self, parts: list[Part]) -> list[np.ndarray]:
        """One pass over several sequences' tokens (at most n_batch in all); each part's
        logits rows, copied where the pass had several (the next pass overwrites them).
        The parts go in by llama.cpp sequence, and a gap between those is closed where it
        lasts, else filled or padded for the pass (seq_layout.py)."""
        for part in parts:
            if part.pos + len(part.tokens) > self.n_ctx:
                raise ContextFull(f"context of {self.n_ctx} tokens is full")
        if len(parts) > 1 and (alone := self._read_alone(parts)):
            return self._split(parts, alone)
        self._close_gaps(parts)
        ordered = self.layout.order(parts)
        fillers = self.layout.fill(ordered, self.seq_len, self.n_ctx)
        try:
            took = self._run(self.layout.order(ordered + fillers))
        finally:
            for filler in fillers:
                self.remove_from(filler.seq, filler.pos)
        self.layout.count_gap_cost(ordered, took)
        logits = self._logits(sum(p.n_logits for p in ordered))
        if len(parts) == 1:
            return [logits]
        rows: dict[int, np.ndarray] = {}
        end = 0
        for part in ordered:
            rows[id(part)] = logits[end : end + part.n_logits].copy()
            end += part.n_logits
        return [rows[id(part)] for part in parts]

    def _read_alone(self, parts: list[Part]) -> list[Part]:
        """The parts the reader reads in a pass each: prompts' chunks beside other slots'
        rounds (its kernels read a chunk of 128 ~1.4x faster, more than the pass it adds
        costs: the rounds' own, ~T(k) of a few tokens)."""
        if self.reader is None or self.on_pass:
            return []
        return [p for p in parts if self.reader.wants([p])]

    def _split(self, parts: list[Part], alone: list[Part]) -> list[np.ndarray]:
        """`parts` as passes: the rest in one here, then each of `alone` by the reader."""
        rows: dict[int, np.ndarray] = {}
        taken = {id(p) for p in alone}
        if rest := [p for p in parts if id(p) not in taken]:
            rows |= zip(map(id, rest), (r.copy() for r in self.decode_parts(rest)), strict=True)
        for part in alone:
            (rows[id(part)],) = (r.copy() for r in self.decode_parts([part]))
        return [rows[id(part)] for part in parts]

    def _close_gaps(self, parts: list[Part]) -> None:
        """Move caches where the layout says a lasting gap has lost more than that costs
        (not where MTP hears the passes: its own caches would not follow)."""
        if self.on_pass:
            return
        with self._mem_lock:
            moves = self.layout.moves(parts, self._state_size)
            if moves is None:
                return
            started = time.perf_counter()
            for a, b in moves.swaps:
                if not self._swap(a, b):
                    return
            self.layout.moved(moves, time.perf_counter() - started)

    def _forget(self, *ats: int) -> None:
        if self.reader is not None:
            self.reader.forget(*ats)

    def _at(self, seq: int) -> int:
        """The llama.cpp sequence that holds sequence `seq`'s cache."""
        return self.layout.where[seq]

    def _state_size(self, at: int) -> int:
        return ll.llama_state_seq_get_size(self._ctx, at) if self._has(at) else 0

    def _swap(self, a: int, b: int) -> bool:
        """Exchange the caches of llama.cpp's sequences a and b, and who they belong to;
        False (nothing changed) where llama.cpp could not copy one out."""
        states = [self._get_state(s) if self._has(s) else bytearray() for s in (a, b)]
        if None in states:
            return False
        self._forget(a, b)
        for s in (a, b):
            ll.llama_memory_seq_rm(self._mem, s, -1, -1)
        for s, state in zip((b, a), states, strict=True):
            if state and not self._set_state(s, state):
                raise ModelError("llama.cpp could not move a sequence's cache")
        self.layout.swapped(a, b)
        return True

    def _run(self, parts: list[Part]) -> float:
        """One llama_decode of `parts` (in this order); its time."""
        self._read_last = bool(self.reader and not self.on_pass and self.reader.wants(parts))
        if self.reader is not None:
            if self._read_last:  # it replaces the sequence's cache: as the slots' edits do
                with self._mem_lock:
                    started, (part,) = time.perf_counter(), parts
                    state = self.reader.read(self._ctx, self._at(part.seq), part)
                    if self._take_back(part.seq, state):
                        self.reader.holds = self._at(part.seq)
                        return time.perf_counter() - started
                    self._read_last = False  # read here after all
            self.reader.forget(*(self._at(p.seq) for p in parts))
        batch, i = self._batch, 0
        for part in parts:
            self._last_pass[part.seq] = len(part.tokens)
            first_scored = len(part.tokens) - part.n_logits
            for j, tok in enumerate(part.tokens):
                batch.token[i] = tok
                batch.pos[i] = part.pos + j
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = self._at(part.seq)
                batch.logits[i] = int(j >= first_scored)
                i += 1
        batch.n_tokens = i
        started = time.perf_counter()
        rc = ll.llama_decode(self._ctx, batch)
        if rc != 0:
            raise ContextFull(f"llama_decode failed ({rc}): KV cache full")
        took = time.perf_counter() - started
        self.layout.observe(parts, took)
        if i == 1:
            self.one_token_s.append(took)
        for hear in self.on_pass:
            hear(parts)
        return took

    def _logits(self, n: int) -> np.ndarray:
        if n == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        if self._read_last and self.reader is not None:
            return self.reader.logits(n, self.n_vocab)
        ptr = ll.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_vocab))

    def remove_from(self, seq: int, pos: int) -> bool:
        """Drop sequence `seq`'s cache entries at positions >= pos. A recurrent state
        rolls back to a snapshot only: once between passes, to a token of the last pass
        (a snapshot older than that pass says nothing; llama.cpp would still accept it)."""
        with self._mem_lock:
            if self._recurrent and pos > 0:
                drop = self.seq_len(seq) - pos
                if drop <= 0:
                    return True
                if drop > self._snapshots or drop >= self._last_pass.get(seq, 0):
                    return False
                self._last_pass[seq] = 0  # a snapshot is used once
            self._forget(self._at(seq))
            if not ll.llama_memory_seq_rm(self._mem, self._at(seq), pos, -1):
                return False
            self._checkpoints.forget(seq, pos)
            return True

    def keep_state(self, seq: int, lasting: bool = False, held: Sequence[int] = ()) -> None:
        """A copy of sequence `seq`'s recurrent state as it is now (its attention entries
        stay in the cache), for `back_to_state`: a draft round's, or a `lasting` one (see
        checkpoints.py)."""
        with self._mem_lock:
            if not self._recurrent:
                return
            flags = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # the recurrent part only
            size = ll.llama_state_seq_get_size_ext(self._ctx, self._at(seq), flags)
            kept = self._checkpoints.take(seq, self.seq_len(seq), lasting, size, held)
            ll.llama_state_seq_get_data_ext(self._ctx, kept.state, size, self._at(seq), flags)

    def back_to_state(self, seq: int, pos: int) -> int | None:
        """Restore the latest copy `keep_state` took at or before `pos`, and drop the
        entries after it; its position, or None."""
        with self._mem_lock:
            if (best := self._checkpoints.latest(seq, pos)) is None:
                return None
            flags, at = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, self._at(seq)
            size = len(best.state)
            if not ll.llama_state_seq_set_data_ext(self._ctx, best.state, size, at, flags):
                return None
            ll.llama_memory_seq_rm(self._mem, at, best.pos, -1)  # the attention layers' entries
            self._last_pass[seq] = 0
            self._checkpoints.forget(seq, best.pos)
            return best.pos

    def save_seq(self, seq: int) -> SeqState | None:
        """Sequence `seq`'s cache entries (llama.cpp's sequence state), copied once; a
        recurrent model's with its lasting checkpoints (its snapshots stay behind: they
        are the last pass's, of whatever text the sequence holds by then)."""
        with self._mem_lock:
            state = self._get_state(self._at(seq))
            if state is not None and self._recurrent:
                state.kept = self._checkpoints.lasting(seq)
                state.kept_bytes = sum(len(k.state) for k in state.kept)
            return state

    def _has(self, at: int) -> bool:
        return ll.llama_memory_seq_pos_max(self._mem, at) >= 0

    def _get_state(self, at: int) -> SeqState | None:
        return seq_state.get_state(self._ctx, at)

    def _set_state(self, at: int, state: bytearray) -> bool:
        return seq_state.set_state(self._ctx, at, state)

    def load_seq(self, seq: int, state: bytearray) -> bool:
        """Sequence `seq`'s cache as `save_seq` saw it; False (and the sequence empty)
        where llama.cpp could not (no room in a shared cache)."""
        with self._mem_lock:
            at = self._at(seq)
            self._forget(at)
            ll.llama_memory_seq_rm(self._mem, at, -1, -1)
            self._checkpoints.forget(seq, -1)
            self._last_pass[seq] = 0  # no snapshot holds this text
            if self._set_state(at, state):
                if isinstance(state, SeqState) and state.kept:
                    self._checkpoints.put(seq, state.kept)
                return True
            ll.llama_memory_seq_rm(self._mem, at, -1, -1)
            return False

    def copy_seq(self, src: int, dst: int, n: int) -> int | None:
        """Sequence `src`'s first n cache entries as sequence `dst`'s, its own dropped:
        how many it holds then; None (`dst` as it was) where `src` cannot be copied out
        or cut there (a recurrent model)."""
        with self._mem_lock:
            state = None if self._recurrent else self.save_seq(src)
            if state is None:
                return None
            if not self.load_seq(dst, state):
                return 0
            ll.llama_memory_seq_rm(self._mem, self._at(dst), n, -1)
            return min(n, self.seq_len(dst))

    def save_state(self) -> bytearray | None:
        return self.save_seq(0)

    def load_state(self, tokens: Sequence[int], state: bytearray) -> bool:
        loaded = self.load_seq(0, state)
        self.cached = Tokens(tokens if loaded else ())
        return loaded

    def checkpoint(self, lasting: bool = False, held: Sequence[int] = ()) -> None:
        self.keep_state(0, lasting, held)

    def _restore(self, pos: int) -> int | None:
        return self.back_to_state(0, pos)

    def seq_len(self, seq: int) -> int:
        with self._mem_lock:
            return ll.llama_memory_seq_pos_max(self._mem, self._at(seq)) + 1

    def move(self, seq: int, gap: tuple[int, int], chunk: tuple[int, int]) -> bool:
        """Drop sequence `seq`'s entries at positions [gap) and move those at [chunk)
        back by the gap's width (RoPE re-applied by llama.cpp); False where the cache
        cannot shift (a recurrent model, M-RoPE)."""
        with self._mem_lock:
            if self._recurrent or not ll.llama_memory_can_shift(self._mem):
                return False
            at = self._at(seq)
            self._forget(at)
            if not ll.llama_memory_seq_rm(self._mem, at, *gap):
                return False
            ll.llama_memory_seq_add(self._mem, at, *chunk, gap[0] - gap[1])
            return True

    def _move(self, gap: tuple[int, int], chunk: tuple[int, int]) -> bool:
        return self.move(0, gap, chunk)

    def _remove_from(self, pos: int) -> bool:
        return self.remove_from(0, pos)

    @property
    def can_cut(self) -> bool:
        return not self._recurrent or self._snapshots > 0

    @property
    def cut_depth(self) -> int | None:
        return self._snapshots if self._recurrent else None

    def kv_len(self) -> int:
        return self.seq_len(0)

    @property
    def size_bytes(self) -> int:
        return int(ll.llama_model_size(self._model))

    @cached_property
    def control_ids(self) -> np.ndarray:
        """The vocabulary's control tokens that do not end a generation (<|im_start|>,
        <|fim_prefix|>): they have no text of their own."""
        ids = [
            t
            for t in range(self.n_vocab)
            if ll.llama_vocab_get_attr(self._vocab, t) & ll.LLAMA_TOKEN_ATTR_CONTROL
            and not ll.llama_vocab_is_eog(self._vocab, t)
        ]
        return np.array(ids, dtype=np.int32)

    @cached_property
    def read_bytes(self) -> int:
        from localspec.models.memory import read_share

        return int(self.size_bytes * read_share(Path(self.path)))

    @property
    def on_gpu(self) -> bool:
        """Some of its layers offloaded to this machine's GPU."""
        return self.options.n_gpu_layers != 0 and supports_gpu_offload()

    @property
    def on_cpu(self) -> bool:
        """Every layer on this machine's CPU (no GPU offload, no rpc-servers)."""
        return not self.on_gpu and not self.options.rpc

    @property
    def cold_passes(self) -> int:
        """Passes of a new batch shape that run slower than the next ones: on a GPU
        llama.cpp runs the shape once without its CUDA graph, then captures the graph
        (`ggml_backend_cuda_graph_compute`'s warm-up); none on a CPU."""
        return GRAPH_WARMUP if self.on_gpu else 0

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            for close in list(self.on_close):
                close()
            if (prompt_reader := getattr(self, "reader", None)) is not None:  # (made last)
                prompt_reader.close()
                ram.release(prompt_reader)
            ram.release(self)
            ll.llama_batch_free(self._batch)
            ll.llama_free(self._ctx)
            ll.llama_model_free(self._model)
            self._ctx = None

    def __del__(self) -> None:
        self.close()


GRAPH_WARMUP = 2  # passes of a new batch shape that llama.cpp's CUDA backend runs cold


def supports_gpu_offload() -> bool:
    """Whether this machine has a GPU llama.cpp can offload to. Not
    `llama_supports_gpu_offload()`: with the RPC backend built in, that is true
    everywhere, and a CPU machine would be planned as a GPU one."""
    return bool(rpc.local_devices())
