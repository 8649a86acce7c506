"""The control tokens a chat format's parser reads (Gemma 4's call marks, Harmony's
message end; llama-server's preserved tokens), on real vocabularies: llama.cpp renders
them as nothing unless asked, `shown_tokens` finds exactly the markers that are control
tokens, and an answer shows the ones its request names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.decoding.engine import _Output
from localspec.decoding.text import TextStream
from localspec.session import shown_tokens

pytestmark = pytest.mark.real


@pytest.mark.parametrize("which", ["qwen", "gemma"])
def test_control_markers_show_only_where_asked(which, real_models, gemma_path: Path):
    if which == "qwen":
        model, markers = real_models[0], ["<|im_start|>", "<|im_end|>"]
    else:
        model = LlamaModel(str(gemma_path), LoadOptions(n_ctx=256, n_threads=2))
        markers = ["<start_of_turn>", "<end_of_turn>"]
    try:
        shown = shown_tokens(model, [*markers, "hello", "<not a token>"])
        assert len(shown) == len(markers)  # plain text is never a marker
        for token in shown:
            assert model.token_bytes(token) == b""
            assert model.token_bytes(token, special=True).decode() in markers
        start = next(t for t in shown if model.token_bytes(t, special=True) == markers[0].encode())
        out = _Output(model, TextStream(), 8, shown=frozenset({start}))
        logits = np.zeros((1, model.n_vocab), dtype=np.float32)
        [piece] = out.emit([start], 0, logits)
        assert piece.text == model.token_bytes(start, special=True).decode()
        hidden = _Output(model, TextStream(), 8)
        assert [p.text for p in hidden.emit([start], 0, logits)] == [""]
    finally:
        if which == "gemma":
            model.close()
