"""Rejection sampling keeps the target's distribution exactly.

On toy Markov models (logits depend on the last token; batched and single passes agree
bit for bit), the law of the k-th generated token is known in closed form: e_a P^(k+1)
for prompt ending in token a, P the transformed transition matrix. Speculative output
must match the target's law (chi-square) and clearly differ from the draft's. With a
repetition penalty the law depends on the whole history: it is enumerated exactly.

The chi-square test passes a drafter that reports a q other than the one it sampled
from (its statistic stays small), so that is checked on its own: drafts sampled at a
fixed context must follow the q reported with them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from localspec.backends.toy import LogitsFn, ToyModel, markov
from localspec.decoding.adaptive import auto_engine
from localspec.decoding.drafters import Draft, Drafter, DraftModel, NgramDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import RoundEnd
from localspec.decoding.grammar import GrammarState
from localspec.decoding.prediction import Prediction
from localspec.decoding.sampling import Probs, SamplingParams, logits_to_probs, sample

V = 8
CHI2_CRIT_DF7_P001 = 24.32  # chi-square critical value, 7 degrees of freedom, p = 0.001
# by degrees of freedom, p = 0.001
CHI2_CRIT_P001 = dict(enumerate([10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88], 1))
PARAMS = dict(temperature=0.9, top_k=6, top_p=0.97, min_p=0.02)


def transition(fn, params: SamplingParams, n: int = V) -> np.ndarray:
    return np.array([logits_to_probs(fn([a]), params, []) for a in range(n)])


def critical(law: np.ndarray) -> float:
    """The p = 0.001 critical value for a chi-square against `law` (df = support - 1)."""
    return CHI2_CRIT_P001[int((law > 0).sum()) - 1]


def law_at(P: np.ndarray, last: int, k: int) -> np.ndarray:
    return np.linalg.matrix_power(P, k + 1)[last]


def chi2(counts: np.ndarray, law: np.ndarray) -> float:
    expected = law * counts.sum()
    support = expected > 0
    assert counts[~support].sum() == 0, "a token outside the law's support was emitted"
    return float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())


def run_many(
    drafter: Drafter,
    target: ToyModel,
    prompt: list[int],
    n: int,
    positions: int,
    params: SamplingParams = SamplingParams(**PARAMS),
    engine: Engine | None = None,
    rounds: Counter[str] | None = None,
    first: int = 0,
):
    """Token counts per position over n seeded answers (seeds first..), and the
    drafted/accepted totals; `rounds` counts the rounds by who drafted them."""
    counts = np.zeros((positions, target.n_vocab))
    drafted = accepted = 0
    engine = engine or Engine(target, drafter, gamma=3)
    for seed in range(first, first + n):
        config = GenerationConfig(max_tokens=positions, sampling=replace(params, seed=seed))
        *events, done = engine.generate(prompt, config)
        for k, tok in enumerate(done.tokens):
            counts[k, tok] += 1
        drafted, accepted = drafted + done.stats.drafted, accepted + done.stats.accepted
        if rounds is not None:
            rounds.update(e.drafter for e in events if isinstance(e, RoundEnd) and e.drafted)
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


@pytest.mark.parametrize(("n_target", "n_draft"), [(10, 8), (8, 10)])
def test_unequal_vocabularies_keep_the_target_law(n_target: int, n_draft: int):
    """Vocabularies of different sizes (llama.cpp pairs them up to 128 apart): q is zero
    past the draft's vocabulary, and a drafted token the target lacks is refused."""
    target_fn, draft_fn = markov(n_target, seed=1), markov(n_draft, seed=2)
    target = ToyModel(target_fn, n_vocab=n_target, name="target")
    drafter = DraftModel(ToyModel(draft_fn, n_vocab=n_draft, name="draft"), p_min=0.0)
    params = SamplingParams(**PARAMS)
    P = transition(target_fn, params, n_target)
    Q = transition(draft_fn, params, n_draft)
    if n_draft > n_target:  # the draft often proposes what the target cannot emit
        assert Q[:, n_target:].sum(axis=1).mean() > 0.1
    else:  # the target often emits what the draft cannot read
        assert P[:, n_draft:].sum(axis=1).mean() > 0.1
    prompt = [3]
    counts, drafted, accepted = run_many(drafter, target, prompt, n=3000, positions=4)

    assert 0 < accepted < drafted
    for k in range(1, 4):
        law = law_at(P, prompt[-1], k)
        assert chi2(counts[k], law) < critical(law)


def looping(seed: int, noise: float) -> LogitsFn:
    """Markov logits that favour the short loop 5 -> 6 -> 5 (and 0 -> 1 -> ... -> 5), where
    the free sources match often; `noise` on top of one shared table makes a draft that
    mostly agrees with its target."""
    table = np.random.default_rng(1).normal(0.0, 1.0, size=(V, V))
    table += np.random.default_rng(seed).normal(0.0, noise, size=(V, V))
    table[np.arange(V), [1, 2, 3, 4, 5, 6, 5, 0]] += 4.0

    def logits(context: Sequence[int]) -> np.ndarray:
        return table[context[-1]]

    return logits


def test_auto_gamma_keeps_the_target_law():
    """`--gamma auto`: n-gram and suffix matches, the draft model, a free source and the
    draft model in one round (after a short prediction, which ends where the draft model
    goes on), plain rounds, the draft model's p_min per position, all chosen anew each
    round. The passes' costs are booked, not slept, so the choices are the same on any
    machine."""
    target_fn = looping(seed=1, noise=0.0)
    target = ToyModel(target_fn, n_vocab=V, name="target", pass_s=0.01, sleep=False)
    draft_fn = looping(seed=2, noise=1.0)
    draft = ToyModel(draft_fn, n_vocab=V, name="draft", pass_s=0.001, sleep=False)
    engine = auto_engine(target, draft)
    prompt = [0, 1, 2, 3, 4, 5]  # the way into the loop
    engine.drafter.predict(Prediction([6, 5], len(prompt)))  # for every answer
    P = transition(target_fn, SamplingParams(**PARAMS))
    by: Counter[str] = Counter()
    counts, drafted, accepted = run_many(
        engine.drafter, target, prompt, n=3000, positions=6, engine=engine, rounds=by
    )

    assert 0 < accepted < drafted
    # Every kind of round carries enough of the sample: a free source alone (n-gram or
    # suffix match), the draft model alone, and both in one round.
    free_only = by["ngram"] + by["suffix"]
    both = by["ngram+draft"] + by["suffix+draft"] + by["prediction+draft"]
    assert min(free_only, by["draft"], both) > 100, by
    # both free sources, alone or with the draft model going on after them
    assert min(by["ngram"] + by["ngram+draft"], by["suffix"] + by["suffix+draft"]) > 20, by
    for k in range(1, 6):
        law = law_at(P, prompt[-1], k)
        assert chi2(counts[k], law) < critical(law)


def exact_laws(fn, params: SamplingParams, prompt: list[int], positions: int) -> np.ndarray:
    """The law of each generated token, enumerated over every history (the repetition
    penalty makes each step depend on all of it)."""
    laws = np.zeros((positions, V))
    paths = {(): 1.0}
    for k in range(positions):
        longer: dict[tuple[int, ...], float] = {}
        for path, weight in paths.items():
            history = [*prompt, *path]
            step = logits_to_probs(fn(history), params, history)
            laws[k] += weight * step
            for tok in np.flatnonzero(step):
                longer[(*path, int(tok))] = weight * step[tok]
        paths = longer
    return laws


@pytest.mark.parametrize(
    "reshaping",
    [
        {"repeat_penalty": 1.8, "repeat_last_n": 3},
        {"frequency_penalty": 1.5, "presence_penalty": 1.0, "repeat_last_n": 3},
        {"logit_bias": ((2, 1.5), (5, -3.0))},
    ],
    ids=["repeat", "frequency-presence", "logit-bias"],
)
def test_a_penalty_or_bias_keeps_the_target_law(reshaping):
    target_fn, draft_fn = markov(V, seed=1), markov(V, seed=2)
    target = ToyModel(target_fn, n_vocab=V, name="target")
    drafter = DraftModel(ToyModel(draft_fn, n_vocab=V, name="draft"), p_min=0.0)
    params = SamplingParams(**PARAMS, **reshaping)
    prompt = [3, 1, 4]
    laws = exact_laws(target_fn, params, prompt, positions=4)
    no_penalty = exact_laws(target_fn, SamplingParams(**PARAMS), prompt, positions=4)
    assert np.abs(laws - no_penalty).sum(axis=1).min() > 0.2  # the reshaping matters here
    counts, drafted, accepted = run_many(drafter, target, prompt, 3000, 4, params)

    assert 0 < accepted < drafted
    for k in range(4):
        assert chi2(counts[k], laws[k]) < critical(laws[k])
    assert chi2(counts[2], no_penalty[2]) > 3 * CHI2_CRIT_DF7_P001


class SoftmaxReportingDraft(DraftModel):
    """A faulty drafter: it samples from the transformed q but reports the raw softmax."""

    def draft(
        self,
        context: Sequence[int],
        gamma: int,
        params: SamplingParams,
        rng: np.random.Generator,
        p_min: float | Sequence[float] | None = None,
        *,
        forced: int = 0,
        grammar: GrammarState | None = None,
    ) -> Draft:
        tokens: list[int] = []
        qs: list[Probs | None] = []
        seq = list(context)
        for _ in range(gamma):
            logits = self.model.evaluate(seq, 1)[0].astype(np.float64)
            x = sample(logits_to_probs(logits, params, seq), rng)
            raw = np.exp(logits - logits.max())
            qs.append(raw / raw.sum())
            tokens.append(x)
            seq.append(x)
        return Draft(tokens, qs)


def reported_q_mismatch(drafter: Drafter, context: list[int], params: SamplingParams) -> float:
    """Chi-square of 4000 drafts at one context against the q reported with them: at the
    first position, and at the second after the most frequent first token."""
    rng = np.random.default_rng(0)
    first: Counter[int] = Counter()
    second: dict[int, Counter[int]] = {}
    q1: dict[int, Probs] = {}
    q2: dict[int, Probs] = {}
    for _ in range(4000):
        draft = drafter.draft(context, 2, params, rng)
        x1, x2 = draft.tokens
        first[x1] += 1
        second.setdefault(x1, Counter())[x2] += 1
        q1[0], q2[x1] = draft.q[0], draft.q[1]  # type: ignore[assignment]
    top = first.most_common(1)[0][0]
    as_array = [np.array([c[t] for t in range(V)], dtype=float) for c in (first, second[top])]
    return max(chi2(as_array[0], q1[0]), chi2(as_array[1], q2[top]))


@pytest.mark.parametrize("penalty", [1.0, 1.5])
def test_a_draft_reports_the_law_it_sampled_from(penalty: float):
    params = SamplingParams(**PARAMS, repeat_penalty=penalty)
    draft = ToyModel(markov(V, seed=2), n_vocab=V, name="draft")
    assert reported_q_mismatch(DraftModel(draft, p_min=0.0), [3, 1], params) < critical(np.ones(V))


def test_the_q_check_catches_a_draft_reporting_another_law():
    params = SamplingParams(temperature=0.7, top_k=4, top_p=0.95, min_p=0.05)
    draft = ToyModel(markov(V, seed=2), n_vocab=V, name="draft")
    faulty = SoftmaxReportingDraft(draft, p_min=0.0)
    assert reported_q_mismatch(faulty, [3, 1], params) > 10 * CHI2_CRIT_DF7_P001
