import numpy as np
import pytest

from localspec.decoding.sampling import (
    SamplingParams,
    logits_to_probs,
    penalize,
    recent,
    sample,
    top2,
)

LOGITS = np.log(np.array([0.5, 0.25, 0.15, 0.06, 0.04]))


def probs(**kw) -> np.ndarray:
    return logits_to_probs(
        LOGITS,
        SamplingParams(**{"temperature": 1.0, "min_p": 0.0, "top_p": 1.0, "top_k": 0, **kw}),
        [],
    )


def test_plain_softmax_recovers_the_distribution():
    np.testing.assert_allclose(probs(), np.exp(LOGITS) / np.exp(LOGITS).sum())


def test_top_k_top_p_min_p_cut_and_renormalize():
    np.testing.assert_allclose(probs(top_k=2), [2 / 3, 1 / 3, 0, 0, 0])
    # 0.5 + 0.25 = 0.75 < 0.8, so the third token is needed too
    np.testing.assert_allclose(probs(top_p=0.8), np.array([0.5, 0.25, 0.15, 0, 0]) / 0.9)
    np.testing.assert_allclose(probs(min_p=0.2), np.array([0.5, 0.25, 0.15, 0, 0]) / 0.9)


def test_a_row_mostly_at_minus_infinity_keeps_the_law_of_its_other_tokens():
    """A grammar's row (most of it at -inf) is sampled over its candidates only: the
    same law as the row with a hopeless finite logit there, for every setting."""
    rng = np.random.default_rng(0)
    for trial in range(60):
        row = np.full(3000, -np.inf, dtype=np.float32)
        allowed = rng.choice(3000, [1, 5, 30, 200][trial % 4], replace=False)
        row[allowed] = rng.standard_normal(len(allowed)) * 2
        hopeless = np.where(np.isneginf(row), np.float32(-1e30), row)
        params = SamplingParams(
            temperature=[0.5, 1.0, 1.5][trial % 3],
            top_k=[0, 10, 40][trial % 3 - 1],
            top_p=[1.0, 0.9][trial % 2],
            min_p=[0.0, 0.05][trial // 2 % 2],
            repeat_penalty=[1.0, 1.3][trial // 4 % 2],
        )
        history = [int(allowed[0]), 7]
        expected = logits_to_probs(hopeless, params, history)
        np.testing.assert_allclose(logits_to_probs(row, params, history), expected)


def test_temperature_sharpens():
    assert probs(temperature=0.5)[0] > probs()[0]


def test_repetition_penalty_follows_llama_cpp_sign_rule():
    logits = np.array([2.0, -2.0, 1.0])
    out = penalize(logits, SamplingParams(repeat_penalty=2.0), [0, 1])
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0])


def test_frequency_and_presence_penalties_follow_openai_and_llama_cpp():
    """logit - count * frequency - (count > 0) * presence, over the window, after the
    repeat penalty (llama.cpp's penalties sampler)."""
    logits = np.array([2.0, -2.0, 1.0, 0.5])
    params = SamplingParams(
        repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25, repeat_last_n=4
    )
    out = penalize(logits, params, [3, 0, 0, 1, 0])  # the window: 0, 0, 1, 0
    np.testing.assert_allclose(out, [1.0 - 1.5 - 0.25, -4.0 - 0.5 - 0.25, 1.0, 0.5])
    whole = SamplingParams(presence_penalty=1.0, repeat_last_n=-1)
    np.testing.assert_allclose(penalize(logits, whole, [3, 0]), [1.0, -2.0, 1.0, -0.5])
    off = SamplingParams(presence_penalty=1.0, repeat_last_n=0)
    assert penalize(logits, off, [3, 0]) is logits


def test_a_logit_bias_is_added_first_and_a_shorter_row_keeps_its_own_tokens():
    logits = np.array([2.0, -2.0, 1.0], dtype=np.float32)
    params = SamplingParams(logit_bias=((1, 5.0), (2, -100.0), (3, 9.0)))
    out = penalize(logits, params, [])  # token 3: beyond this (draft's) vocabulary
    np.testing.assert_allclose(out, [2.0, 3.0, -99.0])
    np.testing.assert_array_equal(logits, [2.0, -2.0, 1.0])  # left as it was
    assert params.reshapes_logits and not SamplingParams(repeat_penalty=1.0).reshapes_logits


def test_top2_gives_the_argmax_and_its_share_of_the_top_two():
    logits = LOGITS.astype(np.float32)
    token, confidence = top2(logits)
    assert token == 0 and confidence == pytest.approx(0.5 / 0.75, rel=1e-6)
    np.testing.assert_array_equal(logits, LOGITS.astype(np.float32))  # left as it was


def test_sample_follows_probs():
    rng = np.random.default_rng(0)
    p = np.array([0.7, 0.0, 0.3])
    draws = np.bincount([sample(p, rng) for _ in range(4000)], minlength=3) / 4000
    assert draws[1] == 0
    assert abs(draws[0] - 0.7) < 0.03


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -1},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"top_p": 0},
        {"top_p": float("nan")},
        {"min_p": 1.0},
        {"min_p": float("nan")},
        {"top_k": -1},
        {"repeat_penalty": 0},
        {"repeat_penalty": float("nan")},
        {"repeat_penalty": float("inf")},
        {"frequency_penalty": float("nan")},
        {"presence_penalty": float("inf")},
        {"repeat_last_n": -2},
        {"logit_bias": ((1, float("nan")),)},
        {"seed": -1},
    ],
)
def test_bad_params_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(repeat_penalty=1.3),
        SamplingParams(repeat_penalty=1.3, repeat_last_n=3),
        SamplingParams(frequency_penalty=0.5, repeat_last_n=-1),
        SamplingParams(presence_penalty=0.5, repeat_last_n=0),
        SamplingParams(logit_bias=((2, 5.0),)),
        SamplingParams(),
    ],
)
def test_a_rows_recent_text_penalizes_as_the_whole_text_does(params):
    """A verify row's penalties read the context and the draft before it through
    `recent`, not a copy of the whole context: the same penalized logits."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=50).astype(np.float32)
    context = rng.integers(0, 50, size=200).tolist()
    for drafted in ([], [1], [4, 4, 7], list(range(5)) * 14):
        whole = penalize(logits, params, context + drafted)
        assert np.array_equal(penalize(logits, params, recent(params, context, drafted)), whole)
