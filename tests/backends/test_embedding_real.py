"""Embeddings from the real target's weights (localspec.backends.embedding), against
llama.cpp's own pooling of the same text in one pass."""

from __future__ import annotations

import ctypes

import llama_cpp as ll
import numpy as np
import pytest

from localspec.backends.embedding import CHUNK, Embedder, embed_all
from localspec.backends.llama import LlamaModel

pytestmark = pytest.mark.real

TEXT = "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n" * 10


def run(embedder: Embedder, texts: list[list[int]], n: int = CHUNK) -> list[np.ndarray]:
    """As serve's batcher runs it: passes of at most n tokens."""
    work = embed_all(embedder, texts)
    next(work)
    while True:
        try:
            work.send(n)
        except StopIteration as done:
            return done.value


def llama_cpps_mean(model: LlamaModel, tokens: list[int]) -> np.ndarray:
    """llama.cpp's MEAN pooling: the whole text in one micro-batch, as llama-server
    --embeddings --pooling mean reads it."""
    cparams = ll.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = len(tokens)
    cparams.embeddings = True
    cparams.pooling_type = ll.LLAMA_POOLING_TYPE_MEAN
    cparams.n_threads = cparams.n_threads_batch = 2
    ctx = ll.llama_init_from_model(model._model, cparams)
    batch = ll.llama_batch_init(len(tokens), 0, 1)
    try:
        for j, token in enumerate(tokens):
            batch.token[j], batch.pos[j], batch.n_seq_id[j] = token, j, 1
            batch.seq_id[j][0], batch.logits[j] = 0, 1
        batch.n_tokens = len(tokens)
        assert ll.llama_decode(ctx, batch) == 0
        n_embd = ll.llama_model_n_embd_out(model._model)
        ptr = ctypes.cast(ll.llama_get_embeddings_seq(ctx, 0), ctypes.POINTER(ctypes.c_float))
        vector = np.ctypeslib.as_array(ptr, shape=(n_embd,)).copy()
    finally:
        ll.llama_batch_free(batch)
        ll.llama_free(ctx)
    return vector / np.linalg.norm(vector)


def test_a_text_read_in_chunks_embeds_as_llama_cpp_pools_it_in_one_pass(real_models):
    target, _draft = real_models
    embedder = Embedder(target)
    try:
        tokens = target.tokenize(TEXT)
        assert 200 < len(tokens) < 250  # passes of 50: five, the last one short
        short = target.tokenize("print('hello')")
        long_vector, short_vector, again = run(embedder, [tokens, short, tokens], 50)
        assert long_vector.shape == (1536,) and long_vector.dtype == np.float32
        assert np.linalg.norm(long_vector) == pytest.approx(1.0, abs=1e-5)
        # the same text twice: the cache was cleared between texts
        np.testing.assert_allclose(again, long_vector, atol=1e-6)
        # cut otherwise (chunks of the most a pass takes, and one of 1000 capped so)
        (other_cut,) = run(embedder, [tokens], 1000)
        assert float(other_cut @ long_vector) > 0.9999
        reference = llama_cpps_mean(target, tokens)
        # batched kernels differ in the last bits: the same vector, not the same floats
        assert float(long_vector @ reference) > 0.9999
        assert float(short_vector @ llama_cpps_mean(target, short)) > 0.9999
        assert float(short_vector @ long_vector) < 0.99  # and another text is another vector
    finally:
        embedder.close()
    assert embedder.close not in target.on_close
