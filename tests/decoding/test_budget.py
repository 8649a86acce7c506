"""A thinking model's reasoning budget (localspec.decoding.budget) on toy byte models:
the block closes after its budget, with or without a message, at once for a budget of 0,
never inside a character, not where the model closed it itself or never opened it; the
close is a free draft, and speculation keeps the budgeted target's output exactly
(greedy equal to plain decoding's for every drafter and γ, sampled by its law)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from decoding.test_lossless_sampling import chi2, critical

from localspec.backends.toy import EOS, ToyModel, markov
from localspec.decoding.budget import ThoughtBudget, whole_characters
from localspec.decoding.drafters import Drafter, DraftModel, NgramDrafter, NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished
from localspec.decoding.opening import Opening
from localspec.decoding.sampling import SamplingParams, logits_to_probs
from localspec.thinking import HARMONY, Thinking

V = 258
THINK = ("<think>", "</think>")
LETTERS = b"abcdefgh "
PROMPT = list(b"<|user|>why?\n<|assistant|><think>\n")


def letters(seed: int):
    """A Markov chain over a few letters and a space: it never writes a mark itself."""
    table = markov(V, seed)

    def fn(context: Sequence[int]) -> np.ndarray:
        row = np.full(V, -30.0)
        row[list(LETTERS)] = table(context)[list(LETTERS)]
        return row

    return fn


def scripted(script: bytes, prompt_len: int):
    """Writes `script`, then ends."""

    def fn(context: Sequence[int]) -> np.ndarray:
        i = len(context) - prompt_len
        row = np.zeros(V)
        row[script[i] if i < len(script) else EOS] = 30.0
        return row

    return fn


def answer(engine: Engine, grammar: ThoughtBudget, params=None, n: int = 30) -> Finished:
    params = params or SamplingParams(temperature=0)
    done = list(engine.generate(PROMPT, GenerationConfig(n, params, grammar=grammar)))[-1]
    assert isinstance(done, Finished)
    return done


def test_the_block_closes_after_its_budget_then_the_answer_goes_on():
    target = ToyModel(letters(1), n_vocab=V)
    budget = ThoughtBudget.of(target, THINK, 6, opened=True)
    plain = bytes(answer(Engine(target, NoDrafter(), 0), budget).tokens)
    assert plain[:6].strip(LETTERS) == b"" and plain[6:14] == b"</think>", plain
    assert plain[14:].strip(LETTERS) == b"" and len(plain) == 30
    free = bytes(answer(Engine(target, NoDrafter(), 0), None).tokens)  # type: ignore[arg-type]
    assert b"</think>" not in free


def test_a_message_goes_before_the_end_mark():
    target = ToyModel(letters(1), n_vocab=V)
    budget = ThoughtBudget.of(target, THINK, 4, "Time's up.", opened=True)
    text = bytes(answer(Engine(target, NoDrafter(), 0), budget).tokens)
    assert text[4:].startswith(b"Time's up.</think>"), text


def test_a_budget_of_zero_closes_the_block_at_once():
    target = ToyModel(letters(1), n_vocab=V)
    budget = ThoughtBudget.of(target, THINK, 0, opened=True)
    assert bytes(answer(Engine(target, NoDrafter(), 0), budget).tokens).startswith(b"</think>")


def test_only_a_block_that_opens_the_answer_is_counted():
    script = b" <think>abcdefgh</think>ok"
    target = ToyModel(scripted(script, len(PROMPT)), n_vocab=V)
    budget = ThoughtBudget.of(target, THINK, 3)  # the prompt did not open it
    text = bytes(answer(Engine(target, NoDrafter(), 0), budget).tokens)
    assert text.startswith(b" <think>abc</think>"), text  # (the script goes on by position)
    state = budget.start()
    for token in b" <thi":
        state.accept(token)
        assert state.phase == "before"
    state = budget.start()
    for token in b"ok <think>":
        state.accept(token)
    assert state.free  # an answer that did not open with the block: nothing to count


def test_gpt_oss_reasoning_is_its_analysis_message():
    script = b"<|channel|>analysis<|message|>abcdef<|end|><|start|>assistant"
    target = ToyModel(scripted(script, len(PROMPT)), n_vocab=V)
    budget = ThoughtBudget.of(target, Thinking(HARMONY).block, 3)
    text = bytes(answer(Engine(target, NoDrafter(), 0), budget, n=60).tokens)
    assert text.startswith(b"<|channel|>analysis<|message|>abc<|end|>"), text
    state = budget.start()
    for token in b"<|channel|>final<|message|>":
        state.accept(token)
    assert state.free  # the answer, with no analysis first


def test_a_block_the_model_ends_itself_is_left_as_written():
    script = b"hm</think>yes"
    target = ToyModel(scripted(script, len(PROMPT)), n_vocab=V)
    budget = ThoughtBudget.of(target, THINK, 12, opened=True)
    assert bytes(answer(Engine(target, NoDrafter(), 0), budget).tokens) == script
    state = budget.start()
    for token in script[:10]:
        assert state.allows(token) and not state.free
        state.accept(token)
    assert state.free and state.allows(EOS)

    # a block opened and ended in one token (a model's merged marks) is done at once
    merged = ToyModel(scripted(b"", len(PROMPT)), n_vocab=V)
    merged.token_bytes = lambda t, special=False: b"<think>hm</think>" if t == 0 else bytes([t])
    state = ThoughtBudget.of(merged, THINK, 1).start()
    state.accept(0)
    assert state.free


def test_a_mark_begun_when_the_budget_ends_is_finished_not_written_again():
    script = b"hm</think>yes"
    target = ToyModel(scripted(script, len(PROMPT)), n_vocab=V)
    budget = ThoughtBudget.of(target, THINK, 4, opened=True)  # "hm</" then the rest
    assert bytes(answer(Engine(target, NoDrafter(), 0), budget).tokens) == script
    budget = ThoughtBudget.of(target, THINK, 4, "Stop.", opened=True)  # a message: as is
    assert bytes(answer(Engine(target, NoDrafter(), 0), budget).tokens) == b"hm</Stop.</think>"


def test_a_grammar_that_refuses_the_close_rules():
    """The request's own grammar holds as well: where it refuses the close (the answer
    must open with "xyz"), nothing is forced, and nothing it refuses is taken."""
    target = ToyModel(letters(1), n_vocab=V)
    budget = ThoughtBudget.of(target, THINK, 0, opened=True, inner=Opening(target, "xyz"))
    text = bytes(answer(Engine(target, NoDrafter(), 0), budget).tokens)
    assert text.startswith(b"xyz") and b"</think>" not in text, text


def test_the_close_waits_for_a_whole_character():
    target = ToyModel(letters(1), n_vocab=V)
    state = ThoughtBudget.of(target, THINK, 1, opened=True).start()
    euro = "€".encode()
    for i, byte in enumerate(euro):
        assert state.phase == "thinking", i
        state.accept(byte)
    assert state.phase == "closing" and state.forced_tokens(3) == list(b"</t")
    assert state.allows(ord("<")) and not state.allows(ord("a")) and not state.allows(EOS)
    assert list(state.allowed(np.array([ord("<"), ord("a")]))) == [True, False]
    row = state.mask(np.zeros(V))
    assert np.isfinite(row).sum() == 1 and row[ord("<")] == 0
    assert whole_characters(b"a" + euro) and not whole_characters(euro[:2])


@pytest.mark.parametrize("gamma", [1, 3, 8])
@pytest.mark.parametrize("kind", ["draft_model", "ngram"])
def test_speculation_keeps_the_budgeted_greedy_answer(kind: str, gamma: int):
    target = ToyModel(letters(1), n_vocab=V, name="target")
    budget = ThoughtBudget.of(target, THINK, 7, "Done.", opened=True)
    plain = answer(Engine(target, NoDrafter(), 0), budget, n=40)
    drafter: Drafter = (
        DraftModel(ToyModel(letters(2), n_vocab=V, name="draft"), p_min=0.0)
        if kind == "draft_model"
        else NgramDrafter()
    )
    spec = answer(Engine(target, drafter, gamma), budget, n=40)
    assert spec.tokens == plain.tokens
    assert bytes(spec.tokens)[7:].startswith(b"Done.</think>")
    # the close is drafted for free: fewer rounds than tokens after it began
    assert spec.stats.drafted > 0 and spec.stats.accepted >= min(gamma, 13)


def test_sampled_answers_follow_the_budgeted_targets_law():
    fn = letters(1)
    target = ToyModel(fn, n_vocab=V, name="target")
    drafter = DraftModel(ToyModel(letters(2), n_vocab=V, name="draft"), p_min=0.0)
    engine = Engine(target, drafter, gamma=4)
    budget = ThoughtBudget.of(target, THINK, 2, opened=True)
    params = SamplingParams(temperature=0.9, top_k=6, top_p=0.97, min_p=0.02)
    after = np.zeros(V)
    first = np.zeros(V)
    for seed in range(1500):
        seeded = SamplingParams(**{**params.__dict__, "seed": seed})
        text = bytes(answer(engine, budget, seeded, n=11).tokens)
        assert text[2:10] == b"</think>", text
        first[text[0]] += 1
        after[text[10]] += 1
    law = logits_to_probs(fn(PROMPT), params, [])
    assert chi2(first, law) < critical(law)
    law = logits_to_probs(fn(list(b"</think>")), params, [])  # a Markov chain: its last
    assert chi2(after, law) < critical(law)
