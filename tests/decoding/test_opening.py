"""The opening grammar (a middle that opens with the typed text): which tokens may spell
it, and speculation under it (greedy output is constrained plain decoding's)."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.backends.toy import ToyModel, markov
from localspec.decoding.drafters import DraftModel, NgramDrafter, NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished
from localspec.decoding.opening import Opening, Pieces
from localspec.decoding.sampling import SamplingParams

PIECES = [b"", b"    ", b"   ", b" ", b" s", b" self", b"s", b"se", b"self", b"elf", b"x"]


class Vocabulary:
    """A model's vocabulary only: what Opening reads (token 0 a control token)."""

    n_vocab = len(PIECES)

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        return PIECES[token]


def ids(*pieces: bytes) -> list[int]:
    return sorted(PIECES.index(p) for p in pieces)


def test_the_tokens_that_may_spell_what_is_left_of_the_opening():
    state = Opening(Vocabulary(), "    s").start()  # type: ignore[arg-type]
    # a start of it, or a token that runs past its end; never a control token
    assert state.spelling().tolist() == ids(b"    ", b"   ", b" ")
    assert not state.allows(0) and not state.allows(PIECES.index(b" self"))
    state.accept(PIECES.index(b"   "))
    assert state.spelling().tolist() == ids(b" ", b" s", b" self")
    row = state.mask(np.zeros(len(PIECES)))
    assert np.flatnonzero(np.isfinite(row)).tolist() == ids(b" ", b" s", b" self")
    twin = state.clone()
    twin.accept(PIECES.index(b" self"))  # past the opening's end: the answer is free
    assert twin.spelling() is None and twin.allows(0) and twin.forced_text(8) == b""
    assert state.forced_text(8) == b" s"  # the clone moved alone
    asked = np.array([PIECES.index(b"x"), PIECES.index(b" s")])
    assert state.allowed(asked).tolist() == [False, True]


class Bytes:
    """A vocabulary of random byte strings, 0xff and duplicates among them."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        alphabet = [b" ", b"a", b"b", b"\xfe", b"\xff"]
        self.pieces = [
            b"".join(alphabet[i] for i in rng.integers(0, len(alphabet), rng.integers(0, 5)))
            for _ in range(400)
        ]
        self.n_vocab = len(self.pieces)

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        return self.pieces[token]


@pytest.mark.parametrize("seed", range(3))
def test_the_spelling_tokens_are_found_as_by_checking_every_token(seed: int):
    """A run of the sorted pieces, not a scan of the vocabulary: a text of one space
    starts 53k of Qwen's 152k tokens, and each scan took ~130 ms of a completion."""
    vocabulary = Bytes(seed)
    pieces = Pieces(vocabulary)  # type: ignore[arg-type]
    texts = {p for p in vocabulary.pieces if p} | {b" ", b"a ", b"\xff", b"\xff\xff", b"b\xff"}
    for text in sorted(texts):
        want = [
            t
            for t, p in enumerate(vocabulary.pieces)
            if p and (p.startswith(text) or (text.startswith(p) and p != text))
        ]
        assert pieces.spelling(text).tolist() == want, text


def test_an_opening_no_token_spells_forces_nothing():
    state = Opening(Vocabulary(), "q").start()  # type: ignore[arg-type]
    assert state.spelling() is None and state.allows(PIECES.index(b"x"))


@pytest.mark.parametrize("make", ["none", "ngram", "draft"])
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_speculation_under_an_opening_is_constrained_plain_decoding(make, gamma):
    target = ToyModel(markov(258, seed=3), n_vocab=258)
    draft = ToyModel(markov(258, seed=3, scale=1.5), n_vocab=258)
    drafters = {"none": NoDrafter(), "ngram": NgramDrafter(), "draft": DraftModel(draft)}
    prompt = list(b"def f(x):\n")
    config = GenerationConfig(24, SamplingParams(temperature=0), grammar=Opening(target, "  ret"))
    plain = list(Engine(target, NoDrafter(), 0).generate(prompt, config))[-1]
    spec = list(Engine(target, drafters[make], gamma).generate(prompt, config))[-1]
    assert isinstance(plain, Finished) and isinstance(spec, Finished)
    assert bytes(plain.tokens[:5]) == b"  ret"  # one byte a token here
    assert spec.tokens == plain.tokens


def test_once_the_opening_is_written_the_answer_goes_on_without_its_grammar():
    """Its masks would only cost time: the drafters draft, and the target's rows are
    read, unconstrained."""
    target = ToyModel(markov(258, seed=3), n_vocab=258)
    told: list[tuple[int, bool]] = []  # per round: tokens written before it, grammar or not

    class Told(NgramDrafter):
        def draft(self, context, gamma, params, rng, *, forced=0, grammar=None):
            told.append((len(context) - forced, grammar is not None))
            return super().draft(context, gamma, params, rng, forced=forced, grammar=grammar)

    prompt = list(b"def f(x):\n")
    config = GenerationConfig(24, SamplingParams(temperature=0), grammar=Opening(target, "  ret"))
    done = list(Engine(target, Told(), 2).generate(prompt, config))[-1]
    assert isinstance(done, Finished) and bytes(done.tokens[:5]) == b"  ret"
    assert told[0][1]  # while it is written
    after = [grammar for written, grammar in told if written >= len(prompt) + 5]
    assert after and not any(after)
