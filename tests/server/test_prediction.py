"""The Predicted Outputs source on token lists: alignment, re-joining, and its place
among `auto`'s sources."""

from __future__ import annotations

import numpy as np

from localspec.backends.toy import ToyModel, scripted
from localspec.decoding.adaptive import AdaptiveDrafter, auto_engine
from localspec.decoding.drafters import NoDrafter, Outcome
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished
from localspec.decoding.prediction import Prediction, PredictionDrafter, prediction_usage
from localspec.decoding.sampling import SamplingParams

PROMPT = [900, 901, 902]
PREDICTED = list(range(100, 140))  # 40 distinct tokens


def answer(*tokens: int) -> list[int]:
    return [*PROMPT, *tokens]


def test_the_start_of_the_answer_proposes_the_start_of_the_prediction():
    p = Prediction(PREDICTED, len(PROMPT))
    assert p.match(answer(), 5) == (2, [100, 101, 102, 103, 104])


def test_an_answer_that_follows_the_prediction_gets_what_comes_next():
    p = Prediction(PREDICTED, len(PROMPT))
    n, tokens = p.match(answer(*range(100, 110)), 4)
    assert n == 10 and tokens == [110, 111, 112, 113]


def test_an_answer_that_departs_is_silent_until_it_rejoins():
    p = Prediction(PREDICTED, len(PROMPT))
    edited = [*range(100, 110), 7, 8]  # tokens 110, 111 replaced by an edit
    assert p.match(answer(*edited), 4) == (0, [])
    assert p.match(answer(*edited, 112), 4) == (0, [])  # one token: too short to trust
    n, tokens = p.match(answer(*edited, 112, 113), 4)
    assert n == 2 and tokens == [114, 115, 116, 117]


def test_a_repeated_stretch_aligns_where_the_answer_was_going():
    block = [50, 51, 52, 53]
    p = Prediction([*block, 60, 61, *block, 70, 71], len(PROMPT))
    assert p.match(answer(*block), 2)[1] == [60, 61]  # the first copy: it followed it
    assert p.match(answer(*block, 60, 61, *block), 2)[1] == [70, 71]


def test_the_longest_alignment_wins_over_the_nearest():
    p = Prediction([1, 2, 3, 9, 5, 2, 3, 8], len(PROMPT))
    assert p.match(answer(5, 2, 3), 1) == (3, [8])


def test_the_end_of_the_prediction_proposes_nothing():
    p = Prediction(PREDICTED, len(PROMPT))
    assert p.match(answer(*PREDICTED), 4) == (0, [])


def test_fixed_gamma_drafter_counts_what_the_prediction_drafted():
    p = Prediction(PREDICTED, len(PROMPT))
    d = PredictionDrafter(p, NoDrafter())
    rng = np.random.default_rng(0)
    draft = d.draft(answer(100, 101), 4, SamplingParams(), rng)
    assert draft.tokens == [102, 103, 104, 105] and draft.by == "prediction"
    d.accept(answer(100, 101, 102, 103, 9), Outcome(drafted=4, accepted=2, verify_s=0.01))
    assert (p.accepted, p.rejected) == (2, 2)
    assert d.draft(answer(5, 6, 7), 4, SamplingParams(), rng).tokens == []  # none: fallback


def text_model(reply: str) -> ToyModel:
    # passes cost booked time, extra tokens nearly free (as on a GPU): the policy decides
    # on these, not on the machine's load or the noise of a Python call's time
    return ToyModel(scripted(reply), n_vocab=258, pass_s=0.004, token_s=0.0001, sleep=False)


def generate(engine: Engine, prompt: list[int], prediction: str | None) -> Finished:
    drafter = engine.drafter
    if prediction is not None:
        assert isinstance(drafter, AdaptiveDrafter)
        drafter.predict(Prediction(list(prediction.encode()), len(prompt)))
    events = list(engine.generate(prompt, GenerationConfig(max_tokens=400)))
    done = events[-1]
    assert isinstance(done, Finished)
    return done


def test_auto_drafts_deep_from_a_good_prediction_and_output_is_unchanged():
    edited = "def var(xs):\n" + "".join(f"    line_{i} = {i} * xs\n" for i in range(12))
    original = edited.replace("var", "variance")
    target = text_model(edited)
    prompt = list(b"<|user|>edit\n<|assistant|>")
    plain = generate(auto_engine(target, None), prompt, None)
    engine = auto_engine(target, None)
    predicted = generate(engine, prompt, original)
    assert predicted.text == plain.text == edited
    assert engine.drafter.prediction.accepted > 0.8 * len(edited)  # type: ignore[attr-defined]
    assert predicted.stats.rounds < plain.stats.rounds / 3
    assert len(predicted.stats.drafted_per_position) > 8  # deeper than n-grams may go


def test_a_wrong_prediction_costs_little_and_changes_nothing():
    reply = "completely different text, nothing like the prediction at all." * 3
    target = text_model(reply)
    prompt = list(b"<|user|>x\n<|assistant|>")
    engine = auto_engine(target, None)
    done = generate(engine, prompt, "zzzz qqqq " * 20)
    assert done.text == reply
    prediction = engine.drafter.prediction  # type: ignore[attr-defined]
    assert prediction.rejected <= 4  # tried, and given up on


def test_prediction_usage_counts_the_prediction_tokens_that_appear_in_the_answer():
    predicted = list(range(100, 120))
    answer = [7, 8, *predicted[:5], 99, *predicted[6:15]]  # one changed, the end cut
    assert prediction_usage(predicted, answer) == (14, 6)
    assert prediction_usage(predicted, predicted) == (20, 0)
    assert prediction_usage(predicted, [1, 2, 3]) == (0, 20)


def test_prediction_usage_does_not_depend_on_which_source_drafted():
    """The suffix index knows an earlier answer: it drafts the edited file before the
    prediction gets a round, yet the prediction's tokens appeared in the answer."""
    edited = "def var(xs):\n" + "".join(f"    line_{i} = {i} * xs\n" for i in range(12))
    original = edited.replace("var", "variance")
    engine = auto_engine(text_model(edited), None)
    prompt = list(b"<|user|>edit\n<|assistant|>")
    generate(engine, prompt, None)  # the answer is in the suffix index now
    done = generate(engine, prompt, original)
    assert done.text == edited
    accepted, rejected = prediction_usage(list(original.encode()), done.tokens)
    assert accepted == len(original) - rejected
    assert accepted > 0.9 * len(original)
    # what the prediction itself drafted is less: the suffix index drafted some first
    assert engine.drafter.prediction.accepted < accepted  # type: ignore[attr-defined]
