"""A target's own MTP head (multi-token prediction, "nextn" layers) as a draft model.

Qwen3.5/3.6 and DeepSeek-style GGUFs carry extra decoder block(s) after the trunk,
trained to predict token p+1 from the embedding of token p and the trunk's hidden state
h_{p-1} (the state that predicted token p). llama.cpp runs them in a second context of
the same model (`LLAMA_CONTEXT_TYPE_MTP`) with a KV cache of its own, as its `draft-mtp`
does (common/speculative.cpp):

- every target pass outputs h for each of its tokens (`llama_set_embeddings_nextn`);
  `MtpHead` keeps the rows the head has not read yet, per sequence (serve's slots);
- before drafting, the head reads what it has not: token x_p with h_{p-1}, in one batch
  (its catch-up);
- a draft step reads the last token with h_{n-2}, predicts x_n, and goes on with its own
  output state in place of the trunk's for the tokens it drafted; those entries leave
  its cache after the round (the trunk's rows replace them once the target read them).

The head's context holds a sequence for each of the target's, so every slot of `serve`
drafts with it, each step over that slot's own cache; the steps of the slots drafting at
once go in one pass of the head (`decode_parts`, through serve's batcher).

The functions it needs are in llama.cpp's staging header (src/llama-ext.h), exported
with C++ names: bound here by those names.
"""

from __future__ import annotations

import ctypes
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp as ll
import numpy as np

from localspec.backends.base import LoadFailed, ModelError, SeqState, Tokens, shared_prefix
from localspec.backends.llama import LlamaModel
from localspec.backends.seq_layout import Part
from localspec.backends.seq_state import get_state, set_state

WINDOW = 512  # the most unread positions a catch-up reads (older ones are skipped)

_lib = ll.llama_cpp._lib  # type: ignore[attr-defined]
_set_nextn = _lib._Z26llama_set_embeddings_nextnP13llama_contextbb
_set_nextn.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
_set_nextn.restype = None
_nextn_rows = _lib._Z26llama_get_embeddings_nextnP13llama_context
_nextn_rows.argtypes = [ctypes.c_void_p]
_nextn_rows.restype = ctypes.POINTER(ctypes.c_float)
_nextn_row = _lib._Z30llama_get_embeddings_nextn_ithP13llama_contexti
_nextn_row.argtypes = [ctypes.c_void_p, ctypes.c_int32]
_nextn_row.restype = ctypes.POINTER(ctypes.c_float)


def mtp_layers(model: LlamaModel) -> int:
    """How many MTP heads the loaded GGUF has (0: none, or not loaded)."""
    return int(ll.llama_model_n_layer_nextn(model._model)) if model.mtp_loaded else 0


_HEADS: weakref.WeakKeyDictionary[LlamaModel, MtpHead] = weakref.WeakKeyDictionary()


def adopt(target: LlamaModel, head: MtpHead) -> None:
    """Make `head` (Gemma 4's assistant, loaded from its own file) `target`'s head."""
    _HEADS[target] = head


def head_of(target: LlamaModel) -> MtpHead | None:
    """The one MTP head of `target` (its own, made at the first call, or the one it was
    given), attached, or None where it has none: every engine over the target drafts
    with that one (each over its own sequence)."""
    head = _HEADS.get(target)
    if head is None and mtp_layers(target):
        head = _HEADS[target] = MtpHead(target)
    if head is not None:
        head.attach()
    return head


@dataclass
class SeqCache:
    """What the head's cache holds of one sequence: `tokens`, of which the positions
    before `start` were skipped (see `MtpHead.catch_up`)."""

    tokens: Tokens = field(default_factory=Tokens)
    start: int = 0


class MtpHead:
    """The MTP head of `target` (loaded with `LoadOptions.mtp`), drafting for each of its
    sequences: `caches[seq]` is what its KV cache holds of that one."""

    in_place = False  # a draft step after the first goes one position further
    # a KV cache of its own, which a saved state of the target's lacks (see `save_seq`)
    own_cache = True
    from_file = False  # part of the target's GGUF, not a file of its own (named by it)
    window = WINDOW  # the trunk's rows kept of each pass, for a catch-up to read

    def __init__(self, target: LlamaModel) -> None:
        if mtp_layers(target) == 0:
            raise ModelError(
                f"--draft mtp: {target.name} has no MTP head (its GGUF has no nextn layers; "
                "unsloth's *-MTP-GGUF files keep them): use --draft ngram or a draft model"
            )
        self.target = target
        self.name = f"{target.name} (MTP head)"
        self._open(target._model)
        # c / T(1) before it is timed: one decoder block and the output head, over the
        # trunk's layers and its output head (weights read, a pass's cost on a GPU; a
        # MoE's active experts only)
        share = target.read_bytes / max(1, target.size_bytes)
        n_params = max(1, int(ll.llama_model_n_params(target._model) * share))
        head_params = target.n_vocab * self.n_embd
        self.cost_ratio = 1 / max(1, ll.llama_model_n_layer(target._model)) + head_params / n_params

    def _open(self, model: ctypes.c_void_p, other: ctypes.c_void_p | None = None) -> None:
        """The head's context over `model` (the target's own, or a drafter's that reads
        the target's context `other`), sized as the target's, and its bookkeeping."""
        target = self.target
        self.n_embd = int(ll.llama_model_n_embd_out(target._model))
        cparams = ll.llama_context_default_params()
        cparams.ctx_type = ll.LLAMA_CONTEXT_TYPE_MTP
        cparams.n_ctx = ll.llama_n_ctx(target._ctx)
        cparams.n_batch = cparams.n_ubatch = target.n_batch
        cparams.n_seq_max = target.n_seq
        cparams.kv_unified = target.kv_unified
        cparams.ctx_other = other
        threads = ll.llama_n_threads(target._ctx)
        cparams.n_threads = cparams.n_threads_batch = threads
        self._ctx = ll.llama_init_from_model(model, cparams)
        if not self._ctx:
            raise ModelError(f"llama.cpp could not make a context for {self.name}")
        # serve's slots keep their sequences' caches from their own threads (their steps
        # go through the shared passes, which run while every slot waits)
        self.lock = threading.Lock()
        self.n_batch = target.n_batch
        # the most positions a catch-up reads before the last token: all in one pass
        self.reach = min(WINDOW, self.n_batch - 1)
        self.shared_pass = False  # its own steps are its own passes (see SlotHead)
        self._mem = ll.llama_get_memory(self._ctx)
        self._batch = ll.llama_batch_ext_init(self._ctx)
        # its output state at every token, by batch position: a catch-up scores its last
        # token only, and llama.cpp's "masked" rows (of scored tokens) came out wrong there
        _set_nextn(self._ctx, True, False)
        self.caches: dict[int, SeqCache] = {}  # sequence -> what its cache holds
        # sequence -> position -> the trunk's h there, unread
        self._rows: dict[int, dict[int, np.ndarray]] = {}
        self._zeros = np.zeros(self.n_embd, dtype=np.float32)
        self.busy_s = 0.0
        self.n_ctx = target.n_ctx
        target.on_close.append(self.close)
        self.attach()

    def attach(self) -> None:
        """Have every target pass output h for each of its tokens (not only the scored
        ones; it costs the last layer over a prompt's every token) and keep it."""
        if self._keep_rows not in self.target.on_pass:
            _set_nextn(self.target._ctx, True, False)
            self.target.on_pass.append(self._keep_rows)

    def detach(self) -> None:
        """Leave the target's passes as plain decoding has them (the bench's baseline);
        what the target reads meanwhile is missing from the head's input later."""
        if self._keep_rows in self.target.on_pass:
            self.target.on_pass.remove(self._keep_rows)
            _set_nextn(self.target._ctx, False, False)
            self._rows.clear()

    # --- the trunk's rows -------------------------------------------------------------
    def _keep_rows(self, parts: Sequence[Part]) -> None:
        """After a target pass: keep h of each sequence's tokens (copies: the next pass
        overwrites them). A filler's rows (seq_layout) sit past its sequence's text,
        where a real pass writes again before a catch-up reads them."""
        ptr, offset = _nextn_rows(self.target._ctx), 0
        for part in parts:
            n = len(part.tokens)
            rows = np.ctypeslib.as_array(ptr, shape=(offset + n, self.n_embd))
            kept = self._rows.setdefault(part.seq, {})
            for j in range(max(0, n - self.window - 1), n):
                kept[part.pos + j] = rows[offset + j].copy()
            if len(kept) > 2 * self.window:  # what a catch-up would skip anyway
                newest = max(kept)
                self._rows[part.seq] = {p: r for p, r in kept.items() if p >= newest - self.window}
            offset += n

    def row(self, pos: int, seq: int = 0) -> np.ndarray:
        """h_pos of sequence `seq`, or zeros where no pass of this text kept it (the
        head's input there is then poorer: its drafts may be worse, the output is the
        target's either way)."""
        return self._rows.get(seq, {}).get(pos, self._zeros) if pos >= 0 else self._zeros

    # --- the head's cache -------------------------------------------------------------
    def _held(self, context: Sequence[int], seq: int) -> int:
        """How much of context[:-1] the cache holds of sequence `seq` (none where they
        part before the end of a skipped stretch: the entries after it were read after
        other text)."""
        cache = self.caches.get(seq)
        if cache is None or not cache.tokens:
            return 0
        n = min(shared_prefix(cache.tokens, context), len(context) - 1)
        return n if n >= cache.start else 0

    def unread(self, context: Sequence[int], seq: int = 0) -> int:
        """Positions the first draft step after `context` reads (its catch-up and the last
        token)."""
        last = len(context) - 1
        return last + 1 - max(self._held(context, seq), last - self.reach)

    def catch_up(self, context: Sequence[int], seq: int = 0) -> list[tuple[int, int, np.ndarray]]:
        """The first draft step's entries after `context` (of sequence `seq`): each token
        the cache does not hold with the trunk's h before it, the last token last (the
        cache keeps what it can of context[:-1]; of a longer stretch than `reach`
        (WINDOW, or less where a pass holds less), the last `reach` are read)."""
        start = self._keep(context, seq)
        return [(context[p], p, self.row(p - 1, seq)) for p in range(start, len(context))]

    def _keep(self, context: Sequence[int], seq: int) -> int:
        """Cut sequence `seq`'s cache to what it can keep of context[:-1]; the first
        position to read."""
        last = len(context) - 1
        held, cache = self._held(context, seq), self.caches.setdefault(seq, SeqCache())
        start = max(held, last - self.reach)
        if start > held:  # skip: the cache goes on from `start`, with nothing before
            held, cache.start = 0, start
        elif held == 0:
            cache.start = 0
        if held < len(cache.tokens) or held == 0:
            ll.llama_memory_seq_rm(self._mem, self._seq_id(seq), held, -1)
        del cache.tokens[held:]
        cache.tokens.extend(context[held:start])  # context[:start], as what it kept
        return start

    def step(
        self, entries: Sequence[tuple[int, int, np.ndarray]], seq: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """One pass of the head over (token, position, h) entries of sequence `seq`, the
        last scored: its logits there and its own output state (the next step's h)."""
        (idx,) = self._process([self.part(entries, seq)])
        assert idx is not None
        return self._logits(idx), self._state(idx).copy()  # the logits until the next pass

    def part(self, entries: Sequence[tuple[int, int, np.ndarray]], seq: int) -> Part:
        """A step's entries (at positions one after another) as a part of a pass."""
        pos = entries[0][1]
        assert all(p == pos + j for j, (_t, p, _h) in enumerate(entries))
        return Part(seq, [t for t, _p, _h in entries], pos, 1, tuple(h for _t, _p, h in entries))

    def decode_parts(self, parts: list[Part]) -> list[np.ndarray]:
        """One pass of the head over several sequences' parts (serve's slots drafting at
        once), each scored at its last token: per part, a row of its logits followed by
        the head's output state there (`split` parts them); copies, as the next pass
        overwrites llama.cpp's."""
        width = self.target.n_vocab + self.n_embd
        return [
            np.empty((0, width), dtype=np.float32)  # a catch-up's chunk before its last
            if idx is None
            else np.concatenate([self._logits(idx), self._state(idx)])[None, :]
            for idx in self._process(parts)
        ]

    def _process(self, parts: list[Part]) -> list[int | None]:
        """One llama.cpp pass over `parts`; per part, its scored token's place in the
        batch (None where it scores none)."""
        batch, pos = self._batch, (ll.llama_pos * 4)()
        ll.llama_batch_ext_clear(batch)
        outputs: list[int | None] = []
        for part in parts:
            at, scored = self._seq_id(part.seq), None
            for j, (token, h) in enumerate(zip(part.tokens, part.embd, strict=True)):
                idx = ll.llama_batch_ext_add_token(batch, at, token)
                if idx < 0:  # a step holds at most n_batch entries (see `reach`)
                    raise ModelError(f"the MTP head's batch is full ({self.n_batch} entries)")
                pos[0] = part.pos + j
                ll.llama_batch_ext_set_pos(batch, idx, pos)
                ptr = h.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
                ll.llama_batch_ext_set_embd_token(batch, idx, ll.llama_embd(ptr, 1, self.n_embd))
                if j == len(part.tokens) - 1 and part.n_logits:
                    ll.llama_batch_ext_set_output_logits(batch, idx, True)
                    scored = idx
            outputs.append(scored)
        started = time.perf_counter()
        rc = ll.llama_process(self._ctx, 1, batch)  # LLAMA_PROCESS_TYPE_DECODE
        scored = [i for i in outputs if i is not None]
        if rc == 0 and scored:
            # the pass runs asynchronously on a GPU: its time ends where its logits are ready
            ll.llama_get_logits_ith(self._ctx, scored[-1])
        self.busy_s += time.perf_counter() - started
        if rc != 0:
            raise ModelError(f"the MTP head's pass failed ({rc})")
        return outputs

    def _logits(self, idx: int) -> np.ndarray:
        ptr = ll.llama_get_logits_ith(self._ctx, idx)
        return np.ctypeslib.as_array(ptr, shape=(self.target.n_vocab,))

    def _state(self, idx: int) -> np.ndarray:
        return np.ctypeslib.as_array(_nextn_row(self._ctx, idx), shape=(self.n_embd,))

    def split(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A part's row of `decode_parts`: its logits, and the head's output state."""
        return row[: self.target.n_vocab], row[self.target.n_vocab :]

    @property
    def size_bytes(self) -> int:
        """What a step of it reads, about: it runs before the target's pass (Batcher)."""
        return int(self.cost_ratio * self.target.read_bytes)

    def _seq_id(self, seq: int) -> int:
        return seq  # its own cache's sequence for the target's `seq`

    def settle(self, context: Sequence[int], seq: int = 0) -> None:
        """After drafting after `context` (of sequence `seq`): the cache holds it; the
        drafted tokens' entries, read with the head's own states instead of the trunk's,
        go."""
        ll.llama_memory_seq_rm(self._mem, self._seq_id(seq), len(context), -1)
        self.caches.setdefault(seq, SeqCache()).tokens.follow(context)

    def drop(self, seq: int = 0) -> None:
        """Forget what the cache holds of sequence `seq`: a draft cut short (a client that
        left while its step waited for a shared pass) leaves its entries unknown, and the
        next catch-up reads the text again."""
        ll.llama_memory_seq_rm(self._mem, self._seq_id(seq), -1, -1)
        self.caches.pop(seq, None)

    # --- a sequence kept in RAM (serve's --cache-ram) ----------------------------------
    def save_seq(self, seq: int) -> SeqState | None:
        """Sequence `seq`'s cache (llama.cpp's bytes), with what it holds and the trunk's
        rows kept of it, which come back with it (`load_seq`): once another text took the
        sequence, the rows at its positions are that text's."""
        if (state := get_state(self._ctx, self._seq_id(seq))) is None:
            return None
        cache = self.caches.get(seq, SeqCache())
        rows = dict(self._rows.get(seq, {}))  # its arrays are replaced, never written to
        state.kept = (SeqCache(Tokens(cache.tokens), cache.start), rows)
        state.kept_bytes = sum(row.nbytes for row in rows.values())
        return state

    def load_seq(self, seq: int, state: bytearray) -> bool:
        """Sequence `seq` as `save_seq` saw it; False (and nothing held of it) where
        llama.cpp could not."""
        self.drop(seq)
        self._rows.pop(seq, None)
        at = self._seq_id(seq)
        if not set_state(self._ctx, at, state):
            self.drop(seq)
            return False
        if isinstance(state, SeqState) and state.kept:
            cache, rows = state.kept
            self.caches[seq] = SeqCache(Tokens(cache.tokens), cache.start)
            self._rows[seq] = dict(rows)
        return True

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            self.detach()
            if self.close in self.target.on_close:
                self.target.on_close.remove(self.close)
            ll.llama_batch_ext_free(self._batch)
            ll.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        self.close()


class AssistantHead(MtpHead):
    """Gemma 4's drafter, its "assistant" (GGUF arch `gemma4-assistant`, a file of its
    own): four blocks that read the target's KV cache (its last sliding-window and last
    full-attention layers) instead of keeping one, and the target's final state h_{n-2}
    (after its output norm) with the last token x_{n-1}. Every step drafts in place, at
    x_{n-1}'s position, its own output state standing in for the target's (transformers'
    gemma4_assistant; llama.cpp's draft-mtp over shared memory). It has nothing to catch
    up: the target's cache, which holds the text up to x_{n-1} between rounds, is its own.
    """

    in_place = True
    own_cache = False  # it reads the target's, which a saved state of the target's holds
    from_file = True
    window = 16  # a draft reads h of the last accepted token only: of the last pass

    def __init__(self, target: LlamaModel, path: Path) -> None:
        self.target = target
        self.name = path.stem
        params = ll.llama_model_default_params()
        params.n_gpu_layers = 999 if target.on_gpu else 0  # beside the cache it reads
        self._model = ll.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise LoadFailed(f"llama.cpp could not load {path} (out of memory, or a corrupt file)")
        try:
            self._check(path)
            self._open(self._model, target._ctx)
        except BaseException:
            ll.llama_model_free(self._model)
            self._model = None
            raise
        # c / T(1) before it is timed: its weights over what a target pass reads
        self.cost_ratio = path.stat().st_size / max(1, target.read_bytes)

    def _check(self, path: Path) -> None:
        ours, theirs = self.target._model, self._model
        if (arch := self.target.metadata("general.architecture")) != "gemma4":
            raise ModelError(f"{path.name} drafts for a Gemma 4 model, not {arch}")
        if ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(theirs)) != self.target.n_vocab:
            raise ModelError(f"{path.name} drafts for another vocabulary than {self.target.name}'s")
        if ll.llama_model_n_embd_out(theirs) != ll.llama_model_n_embd_out(ours):
            raise ModelError(
                f"{path.name} reads a model of width {ll.llama_model_n_embd_out(theirs)}, "
                f"not {self.target.name} ({ll.llama_model_n_embd_out(ours)}): "
                "use the assistant made for this Gemma 4 size"
            )

    def _keep_rows(self, parts: Sequence[Part]) -> None:
        """After a target pass: keep the last rows of h of each sequence's tokens."""
        ptr, offset = _nextn_rows(self.target._ctx), 0
        for part in parts:
            n = len(part.tokens)
            if part.n_logits:  # not a filler, nor a prompt's chunk before its last
                rows = np.ctypeslib.as_array(ptr, shape=(offset + n, self.n_embd))
                kept = self._rows.setdefault(part.seq, {})
                kept.clear()  # a draft reads a row of its sequence's last pass only
                for j in range(max(0, n - self.window), n):
                    kept[part.pos + j] = rows[offset + j].copy()
            offset += n

    def unread(self, context: Sequence[int], seq: int = 0) -> int:
        return 1

    def catch_up(self, context: Sequence[int], seq: int = 0) -> list[tuple[int, int, np.ndarray]]:
        last = len(context) - 1
        return [(context[last], last, self.row(last - 1, seq))]

    def _seq_id(self, seq: int) -> int:
        return self.target.layout.where[seq]  # the target's cache of that sequence

    def settle(self, context: Sequence[int], seq: int = 0) -> None:
        pass  # its steps wrote nothing: it keeps no cache

    def drop(self, seq: int = 0) -> None:
        pass  # the cache it reads is the target's

    def close(self) -> None:
        super().close()  # its context first: it is over this model
        if getattr(self, "_model", None):
            ll.llama_model_free(self._model)
            self._model = None
