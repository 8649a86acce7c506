"""Rejection sampling keeps the target's distribution exactly.

On toy Markov models (logits depend on the last token; batched and single passes agree
bit for bit), the law of the k-th generated token is known in closed form: e_a P^(k+1)
for prompt ending in token a, P the transformed transition matrix. Speculative output
must match the target's law (chi-square) and clearly differ from the draft's.
"""

from __future__ import annotations

import numpy as np
import pytest

from localspec.backends.toy import ToyModel, markov
from localspec.decoding.drafters import Drafter, DraftModel, NgramDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.sampling import SamplingParams, logits_to_probs

V = 8
CHI2_CRIT_DF7_P001 = 24.32  # chi-square critical value, 7 degrees of freedom, p = 0.001
PARAMS = dict(temperature=0.9, top_k=6, top_p=0.97, min_p=0.02)


def transition(fn, params: SamplingParams) -> np.ndarray:
    return np.array([logits_to_probs(fn([a]), params, []) for a in range(V)])


def law_at(P: np.ndarray, last: int, k: int) -> np.ndarray:
    return np.linalg.matrix_power(P, k + 1)[last]


def chi2(counts: np.ndarray, law: np.ndarray) -> float:
    expected = law * counts.sum()
    support = expected > 0
    assert counts[~support].sum() == 0, "a token outside the law's support was emitted"
    return float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())


def run_many(drafter: Drafter, target: ToyModel, prompt: list[int], n: int, positions: int):
    counts = np.zeros((positions, V))
    drafted = accepted = 0
    engine = Engine(target, drafter, gamma=3)
    for seed in range(n):
        sampling = SamplingParams(**PARAMS, seed=seed)
        config = GenerationConfig(max_tokens=positions, sampling=sampling)
        *_, done = engine.generate(prompt, config)
        for k, tok in enumerate(done.tokens):
            counts[k, tok] += 1
        drafted, accepted = drafted + done.stats.drafted, accepted + done.stats.accepted
    return counts, drafted, accepted


@pytest.mark.parametrize("drafter_kind", ["draft_model", "ngram"])
def test_speculative_sampling_follows_the_target_law(drafter_kind):
    target_fn, draft_fn = markov(V, seed=1), markov(V, seed=2)
    target = ToyModel(target_fn, n_vocab=V, name="target")
    if drafter_kind == "draft_model":
        drafter: Drafter = DraftModel(ToyModel(draft_fn, n_vocab=V, name="draft"), p_min=0.0)
        prompt = [3]
    else:
        drafter = NgramDrafter()
        prompt = [3, 1, 4, 1, 5, 3, 1, 4, 1, 5, 3]  # repetitive: n-grams match often
    params = SamplingParams(**PARAMS)
    P, Q = transition(target_fn, params), transition(draft_fn, params)
    counts, drafted, accepted = run_many(drafter, target, prompt, n=3000, positions=4)

    assert 0 < accepted < drafted  # both acceptance and rejection were exercised
    for k in range(1, 4):  # position 0 is the target's own prefill token
        assert chi2(counts[k], law_at(P, prompt[-1], k)) < CHI2_CRIT_DF7_P001
    if drafter_kind == "draft_model":
        assert chi2(counts[2], law_at(Q, prompt[-1], 2)) > 10 * CHI2_CRIT_DF7_P001


def test_seeded_runs_are_reproducible():
    target = ToyModel(markov(V, seed=1), n_vocab=V)
    draft = DraftModel(ToyModel(markov(V, seed=2), n_vocab=V), p_min=0.0)
    config = GenerationConfig(max_tokens=20, sampling=SamplingParams(**PARAMS, seed=7))
    engine = Engine(target, draft, gamma=4)
    first = list(engine.generate([1], config))[-1].tokens
    assert list(engine.generate([1], config))[-1].tokens == first
    other = GenerationConfig(max_tokens=20, sampling=SamplingParams(**PARAMS, seed=8))
    assert list(engine.generate([1], other))[-1].tokens != first
