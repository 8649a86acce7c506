"""A grammar that holds from a trigger on (localspec.decoding.lazy), on toy byte models:
free before the trigger, held from its first character (written over several tokens, or
in a token with more after it), not in the reasoning block (however its tokens cut it),
let go where the text from the trigger on does not fit it; speculation keeps the answer
exactly."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from localspec.backends.toy import EOS, ToyModel
from localspec.decoding.drafters import Drafter, DraftModel, NgramDrafter, NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished
from localspec.decoding.lazy import LONG_REACH, Triggered, trigger_pattern
from localspec.decoding.opening import Opening
from localspec.decoding.sampling import SamplingParams
from localspec.thinking import BlockReader

V = 261
CALL = "<call>ab</call>"  # the one call the held grammar takes (then the answer is free)
PROMPT = list(b"<|user|>go\n<|assistant|>")
JOINED = {258: b"l>a", 259: b"l>z"}  # tokens that end the trigger and go on
WHOLE = 260  # a reasoning block and the trigger's start, in one token
JOINED[WHOLE] = b"<think>hm</think>\n<ca"


class Joined(ToyModel):
    """A byte model with two tokens of several bytes."""

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        return JOINED.get(token) or super().token_bytes(token, special)


def scripted(script: bytes):
    def fn(context: Sequence[int]) -> np.ndarray:
        i = len(context) - len(PROMPT)
        row = np.zeros(V)
        row[script[i] if i < len(script) else EOS] = 30.0
        return row

    return fn


def lazy(model: ToyModel, reasoning: bool = False) -> Triggered:
    marks = (b"<think>", b"</think>") if reasoning else None
    return Triggered(model, Opening(model, CALL), b"<call>", marks, opened=reasoning)


def fed(state, text: bytes | list[int]):
    for token in text:
        state.accept(token)
    return state


def test_free_until_the_trigger_then_held_from_its_first_character():
    model = Joined(scripted(b""), n_vocab=V)
    state = fed(lazy(model).start(), b"I'll call it. <ca")
    assert state.allows(ord("z")) and not state.free and state.phase == "watching"
    assert fed(state, b"ll>").phase == "held"
    assert state.allows(ord("a")) and not state.allows(ord("z"))
    assert state.forced_text(4) == b"ab</"
    assert fed(state, b"ab</call>").free  # the call written: the answer goes on free


def test_a_token_that_ends_the_trigger_and_goes_on_is_read_from_the_trigger():
    model = Joined(scripted(b""), n_vocab=V)
    held = fed(lazy(model).start(), [*b"so <cal", 258])  # `l>a`: the call's first letter too
    assert held.phase == "held" and held.allows(ord("b")) and not held.allows(ord("a"))
    wrong = fed(lazy(model).start(), [*b"so <cal", 259])  # `l>z`: no call the grammar takes
    assert wrong.free and wrong.allows(ord("q"))


def test_a_trigger_in_the_reasoning_is_not_a_call():
    model = Joined(scripted(b""), n_vocab=V)
    state = fed(lazy(model, reasoning=True).start(), b"maybe <call>zz</call>? ")
    assert state.phase == "thinking" and state.allows(ord("z"))
    assert fed(state, b"</think>\n<call>").phase == "held"
    # a model whose answer opens without its reasoning block is watched from the start
    state = fed(
        Triggered(model, Opening(model, CALL), b"<call>", (b"<think>", b"</think>")).start(),
        b"<call>",
    )
    assert state.phase == "held"


def test_the_reasoning_is_read_however_its_tokens_cut_it():
    model = Joined(scripted(b""), n_vocab=V)
    marks = (b"<think>", b"</think>")
    for cut in ([*JOINED[WHOLE]], [WHOLE]):  # byte by byte, or in one token
        state = fed(Triggered(model, Opening(model, CALL), b"<call>", marks).start(), cut)
        assert state.phase == "watching" and fed(state, b"ll>").phase == "held", cut
    reader = BlockReader(marks)
    assert [reader.read(bytes([b])) for b in b" \n<th"] == [None] * 5
    assert reader.read(b"ink>") is None and reader.phase == "thinking"
    assert reader.read(b"a</thi") is None and reader.read(b"nk>ok") == b"ok"
    assert reader.phase == "after" and reader.read(b"!") == b"!"
    reader = BlockReader(marks)
    assert reader.read(b"\n") is None and reader.read(b"<a") == b"\n<a"  # no block
    assert reader.phase == "none"


def test_llama_cpps_triggers_words_patterns_whole_answers_and_tokens():
    """llama-server's `grammar_triggers`: a word as written; a pattern anywhere, held
    from its first group that matched (else the match); a pattern the whole answer so
    far matches; a token by its id (not its text written by others)."""
    model = Joined(scripted(b""), n_vocab=V)

    def held(pattern: bytes, text: bytes | list[int], tokens: frozenset[int] = frozenset()):
        rule = Triggered(model, Opening(model, CALL), pattern, reach=LONG_REACH, tokens=tokens)
        return fed(rule.start(), text).phase

    word = trigger_pattern([b"<call>"], [], [])
    assert held(word, b"so <call>") == "held" and held(word, b"so <cal") == "watching"
    grouped = trigger_pattern([], [rb"then:\s*(<call>)"], [])  # held from its group
    assert held(grouped, b"then: <call>a") == "held"
    assert held(trigger_pattern([], [rb"then: <call>"], []), b"then: <call>a") == "free"
    whole = trigger_pattern([], [], [rb"^\s*(<call>.*)$"])  # the whole answer, not a part
    assert held(whole, b"  <call>") == "held" and held(whole, b"x <call>") == "watching"
    none = trigger_pattern([], [], [])  # only tokens trigger it
    assert held(none, b"so <c", frozenset({ord("<")})) == "held"  # from the token on
    assert held(none, [WHOLE], frozenset({ord("<")})) == "watching"  # `<` in another token


@pytest.mark.parametrize("gamma", [2, 5])
@pytest.mark.parametrize("kind", ["draft_model", "ngram"])
def test_speculation_keeps_the_held_answer(kind: str, gamma: int):
    script = b"Let me see. <call>zz</call> and <call>zz</call>"
    target = ToyModel(scripted(script), n_vocab=V, name="target")
    config = GenerationConfig(60, SamplingParams(temperature=0), grammar=lazy(target))
    plain = list(Engine(target, NoDrafter(), 0).generate(PROMPT, config))[-1]
    assert isinstance(plain, Finished)
    assert bytes(plain.tokens).startswith(b"Let me see. <call>ab</call>"), bytes(plain.tokens)
    drafter: Drafter = (
        DraftModel(ToyModel(scripted(script), n_vocab=V, name="draft"), p_min=0.0)
        if kind == "draft_model"
        else NgramDrafter()
    )
    spec = list(Engine(target, drafter, gamma).generate(PROMPT, config))[-1]
    assert isinstance(spec, Finished) and spec.tokens == plain.tokens
