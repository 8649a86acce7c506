"""Embeddings of texts by the loaded model's own weights (`/v1/embeddings`), as
llama-server gives them when started with `--embeddings --pooling mean`: one vector a
text, the mean of the model's last hidden states (after its output norm) over the
text's tokens, scaled to unit length as OpenAI's are. A GGUF that declares another
pooling (an embedding model's `{arch}.pooling_type`: the first or the last token) gets
that one.

They come from a llama.cpp context of their own over the same weights (no second copy),
made at the first request. It reads a text in chunks, whose per-token states are pooled
here rather than by llama.cpp (which pools a text only within one micro-batch): so a
long text needs no batch of its length, and between two chunks the slots' rounds go on
(serve runs each chunk as a pass of its own between theirs). A causal model's states
do not depend on how its text was cut, so the vector is the one-pass one (up to the
last bits that batched kernels differ in).
"""

from __future__ import annotations

import ctypes
from collections.abc import Generator

import llama_cpp as ll
import numpy as np

from localspec.backends.base import ModelError
from localspec.backends.llama import LlamaModel

# a pass's most tokens: every token is an output, whose logits llama.cpp keeps too
# (n_vocab floats each: 155 MB at 256 for Qwen's vocabulary)
CHUNK = 256
MAX_TOKENS = 2048  # a text's most: its KV cache, made once beside the slots' own
POOLINGS = {"1": "mean", "2": "cls", "3": "last"}  # llama_pooling_type, as GGUFs store it


def embedding_size(model: LlamaModel) -> int:
    return int(ll.llama_model_n_embd_out(model._model))


def embedding_limit(model: LlamaModel) -> int:
    """A text's most tokens."""
    return min(MAX_TOKENS, model.n_ctx)


class Embedder:
    """Pooled, unit-length embeddings of token lists, from `model`'s weights."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.max_tokens = embedding_limit(model)
        arch = model.metadata("general.architecture") or ""
        self.pooling = POOLINGS.get(model.metadata(f"{arch}.pooling_type") or "", "mean")
        self.n_embd = embedding_size(model)
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = self.max_tokens
        cparams.n_batch = cparams.n_ubatch = CHUNK
        cparams.n_seq_max = 1
        cparams.embeddings = True
        cparams.pooling_type = ll.LLAMA_POOLING_TYPE_NONE  # each token's state: pooled here
        threads = ll.llama_n_threads(model._ctx)
        cparams.n_threads = cparams.n_threads_batch = threads
        self._ctx = ll.llama_init_from_model(model._model, cparams)
        if not self._ctx:
            raise ModelError(f"not enough memory to embed texts with {model.name}")
        self._mem = ll.llama_get_memory(self._ctx)
        self._batch = ll.llama_batch_init(CHUNK, 0, 1)
        self._last_read = 0  # tokens in the last pass
        model.on_close.append(self.close)

    def passes(self, tokens: list[int]) -> Generator[int, int, np.ndarray]:
        """`tokens`' embedding, read a pass at a time: before each, it yields how many
        tokens the last pass read (this text's or the one before's) and waits for this
        pass's most (sent; the caller runs others' passes between). At most
        `max_tokens`, at least one."""
        assert 0 < len(tokens) <= self.max_tokens
        ll.llama_memory_clear(self._mem, True)
        total = np.zeros(self.n_embd, dtype=np.float64)
        first = last = total
        done = 0
        while done < len(tokens):
            n = yield self._last_read
            states = self._read(tokens[done : done + max(1, min(n, CHUNK))], done)
            if done == 0:
                first = states[0].copy()
            total += states.sum(axis=0, dtype=np.float64)
            last = states[-1].copy()
            self._last_read = len(states)
            done += len(states)
        pooled = {"mean": total / len(tokens), "cls": first, "last": last}[self.pooling]
        norm = float(np.linalg.norm(pooled))
        return (pooled / norm if norm > 0 else pooled).astype(np.float32)

    def _read(self, chunk: list[int], pos: int) -> np.ndarray:
        """One pass over `chunk` at pos..: each token's last hidden state (a view, till
        the next pass)."""
        batch = self._batch
        for j, token in enumerate(chunk):
            batch.token[j] = token
            batch.pos[j] = pos + j
            batch.n_seq_id[j] = 1
            batch.seq_id[j][0] = 0
            batch.logits[j] = 1
        batch.n_tokens = len(chunk)
        rc = ll.llama_decode(self._ctx, batch)
        if rc != 0:
            raise ModelError(f"llama_decode failed ({rc}) while embedding a text")
        ptr = ll.llama_get_embeddings(self._ctx)
        return np.ctypeslib.as_array(
            ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(len(chunk), self.n_embd)
        )

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            if self.close in self.model.on_close:
                self.model.on_close.remove(self.close)
            ll.llama_batch_free(self._batch)
            ll.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        self.close()


def embed_all(embedder: Embedder, texts: list[list[int]]) -> Generator[int, int, list[np.ndarray]]:
    """Each token list's embedding, read as `Embedder.passes` reads one."""
    vectors = []
    for tokens in texts:
        vectors.append((yield from embedder.passes(tokens)))
    return vectors
