"""A prompt tokenized piece by piece between control tokens equals llama.cpp's tokens
for the whole text (localspec.backends.pieces), on real vocabularies."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.backends.llama_vocab import PIECES_FROM
from localspec.backends.pieces import PieceTokenizer, splitters

pytestmark = pytest.mark.real


def whole(model: LlamaModel, text: str) -> list[int]:
    """llama.cpp's tokens for the whole text, as LlamaModel read it before pieces."""
    return model._tokenize(text, not model._starts_with_bos(text), True)


def pool(model: LlamaModel, seps: list[str]) -> list[str]:
    """What fuzzed texts are made of: control tokens, halves of them, other special
    tokens, spaces, code and characters of several scripts, where splitting could go
    wrong."""
    specials = model.special_tokens()
    assert specials is not None
    others = [text for _, text, _ in random.Random(0).sample(specials, min(20, len(specials)))]
    parts = [*seps, *seps, *[s[: len(s) // 2] for s in seps], *[s[len(s) // 2 :] for s in seps]]
    parts += [*others, " ", "  ", "\n", "\n\n", "\t", "\r\n", "def f(x):\n    return x"]
    return [*parts, "héllo wörld", "日本語", "🙂", "<", ">", "|", "'s", " 123", "1234567", "user"]


def fuzzed(parts: list[str], rng: random.Random) -> str:
    return "".join(rng.choice(parts) for _ in range(rng.randrange(25)))


def test_the_default_targets_pieces_are_tokenized_as_the_whole_text(real_models: tuple) -> None:
    target = real_models[0]
    pieces = target._pieces
    assert pieces is not None
    seps = sorted(pieces._ids)
    assert {"<|im_start|>", "<|im_end|>"} <= set(seps)
    rng, parts = random.Random(0), pool(target, seps)
    for _ in range(2000):
        text = fuzzed(parts, rng)
        add = not target._starts_with_bos(text)
        assert pieces.tokenize(text, add) == whole(target, text), repr(text)


def test_a_sentencepiece_vocabulary_too(gemma_path: Path) -> None:
    """Gemma 3 (SentencePiece: a raw fragment after a special token gets a space prefix;
    this base model has no chat template, so its turn tokens are named here)."""
    model = LlamaModel(gemma_path, LoadOptions(n_ctx=256, n_threads=2))
    try:
        specials = model.special_tokens()
        assert specials is not None
        found = splitters(specials, "<start_of_turn>user\n<end_of_turn>\n<bos>")
        assert set(found) == {"<start_of_turn>", "<end_of_turn>", "<bos>"}
        pieces = PieceTokenizer(lambda text, add: model._tokenize(text, add, True), found)
        rng, parts = random.Random(1), pool(model, sorted(found))
        for _ in range(1000):
            text = fuzzed(parts, rng)
            add = not model._starts_with_bos(text)
            assert pieces.tokenize(text, add) == whole(model, text), repr(text)
    finally:
        model.close()


def test_a_conversation_that_grows_has_only_its_new_turn_tokenized(real_models: tuple) -> None:
    target = real_models[0]
    calls: list[str] = []
    tokenize = target._pieces._tokenize
    target._pieces._tokenize = lambda text, add: calls.append(text) or tokenize(text, add)
    try:
        turns = [{"role": "user", "content": f"Question {i}: " + "text " * 600} for i in range(4)]
        first = target.tokenize(
            "".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in turns[:3])
        )
        calls.clear()
        text = "".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in turns)
        assert len(text) >= PIECES_FROM
        tokens = target.tokenize(text)
        assert calls == ["", "user\n" + turns[3]["content"]]  # the opening, the new turn
        assert tokens == whole(target, text)
        assert tokens[: len(first)] == first
    finally:
        target._pieces._tokenize = tokenize
