"""Recall (Engine.recall): a greedy request that the engine's last answer answers too
takes its tokens again without a pass, and still answers exactly what a fresh engine
would; what the last answer cannot vouch for is decoded as before."""

from __future__ import annotations

from localspec.backends.toy import ToyModel, markov
from localspec.decoding.drafters import NgramDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished
from localspec.decoding.opening import Opening
from localspec.decoding.sampling import SamplingParams

PROMPT = list(b"def f(x):\n")
GREEDY = SamplingParams(temperature=0)


def engine(seed: int = 3) -> Engine:
    return Engine(ToyModel(markov(258, seed=seed), n_vocab=258), NgramDrafter(), 3)


def answer(engine: Engine, prompt: list[int], config: GenerationConfig) -> Finished:
    done = list(engine.generate(prompt, config))[-1]
    assert isinstance(done, Finished)
    return done


def test_the_same_greedy_request_again_is_answered_without_a_pass():
    e = engine()
    config = GenerationConfig(24, GREEDY)
    first = answer(e, PROMPT, config)
    calls = e.target.decode_calls  # type: ignore[attr-defined]
    again = answer(e, PROMPT, config)
    assert again.tokens == first.tokens and again.stop_reason == "max_tokens"
    assert e.target.decode_calls == calls  # type: ignore[attr-defined]
    assert again.stats.recalled == 24 and again.stats.drafted == 0


def test_a_longer_answer_goes_on_from_what_it_recalls_as_a_fresh_engine_would():
    e = engine()
    answer(e, PROMPT, GenerationConfig(24, GREEDY))
    longer = answer(e, PROMPT, GenerationConfig(40, GREEDY))
    fresh = answer(engine(), PROMPT, GenerationConfig(40, GREEDY))
    assert longer.tokens == fresh.tokens and longer.stats.recalled == 24
    assert e.target.cached == [*PROMPT, *longer.tokens[:-1]]  # the cache followed


def test_a_prompt_that_runs_into_the_last_answer_recalls_the_rest_of_it():
    """A client that sends the answer so far back (a continuation, a retry's prefix)."""
    e = engine()
    first = answer(e, PROMPT, GenerationConfig(24, GREEDY))
    prompt = PROMPT + list(first.tokens[:10])
    rest = answer(e, prompt, GenerationConfig(14, GREEDY))
    assert rest.tokens == first.tokens[10:] and rest.stats.recalled == 14


def test_the_next_keystroke_of_a_middle_recalls_the_last_middle():
    """The typed text opens the middle (localspec.decoding.opening): one more character
    typed, as the last middle began, allows fewer tokens, and the last middle's are
    among them; a character it did not begin with recalls nothing."""
    e = engine(seed=4)  # whose middle begins with a character one can type
    first = answer(e, PROMPT, GenerationConfig(24, GREEDY, grammar=Opening(e.target, "  ")))
    typed = bytes(first.tokens[:3])  # one byte a token here
    assert typed.startswith(b"  ") and typed.isascii()
    config = GenerationConfig(24, GREEDY, grammar=Opening(e.target, typed.decode()))
    calls = e.target.decode_calls  # type: ignore[attr-defined]
    again = answer(e, PROMPT, config)
    assert again.tokens == first.tokens == answer(engine(seed=4), PROMPT, config).tokens
    assert again.stats.recalled == 24 and e.target.decode_calls == calls  # type: ignore[attr-defined]

    other = bytes([typed[2] ^ 1]).decode()  # a character the middle did not begin with
    config = GenerationConfig(24, GREEDY, grammar=Opening(e.target, "  " + other))
    elsewhere = answer(e, PROMPT, config)
    assert elsewhere.stats.recalled == 0
    assert elsewhere.tokens == answer(engine(seed=4), PROMPT, config).tokens
    # nor does a shorter opening (a character deleted): the last answer's was narrower
    config = GenerationConfig(24, GREEDY, grammar=Opening(e.target, " "))
    assert answer(e, PROMPT, config).stats.recalled == 0


def test_what_the_last_answer_cannot_vouch_for_is_decoded():
    e = engine()
    answer(e, PROMPT, GenerationConfig(24, GREEDY))
    sampled = GenerationConfig(24, SamplingParams(temperature=1.0, seed=1))
    assert answer(e, PROMPT, sampled).stats.recalled == 0  # and a sampled answer is not kept
    answer(e, PROMPT, GenerationConfig(24, GREEDY))
    assert answer(e, PROMPT, GenerationConfig(24, GREEDY, logprobs=2)).stats.recalled == 0
    penalized = SamplingParams(temperature=0, repeat_penalty=1.3)
    assert answer(e, PROMPT, GenerationConfig(24, penalized)).stats.recalled == 0
    other = answer(e, PROMPT[:-1], GenerationConfig(24, GREEDY))  # not where it began
    assert other.stats.recalled == 0
