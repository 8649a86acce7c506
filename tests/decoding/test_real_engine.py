"""The engine on the real Qwen2.5-Coder pair through llama.cpp.

Greedy speculation must reproduce plain decoding token for token. llama.cpp's batched
and one-token kernels differ in the last bits, so at a numerical near-tie the two runs may
take different branches. The divergence audit (localspec.bench.audit) proves such a
divergence: it replays plain decoding's one-token passes and the speculative run's batched
passes up to it, and calls it numerics only when the two replays pick the two runs'
tokens; anything else is a defect. Where a run cannot be replayed from a cold cache (a
chat turn that reused the last one's cache), the weaker rule is used: plain decoding's
top-2 margin there was under NEAR_TIE and speculation took its runner-up.
"""

from __future__ import annotations

import numpy as np
import pytest

from localspec.backends.base import Model, ModelError, check_compatible, common_prefix
from localspec.bench import audit, runner
from localspec.bench.runner import Record
from localspec.decoding.drafters import DraftModel, NgramDrafter, NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished, Piece, RoundEnd
from localspec.session import Session

pytestmark = pytest.mark.real

NEAR_TIE = 1.0  # logits: twice the largest batched-vs-single difference measured here
PROMPTS = {
    "code": "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "edit": "Rename the variable x to count everywhere and return only the code:\n\n"
    "def total(items):\n    x = 0\n    for item in items:\n        x += item.price\n"
    "    return x\n",
    "chat": "In two sentences: why do cats purr?",
}
MAX_TOKENS = 40


def user(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


@pytest.fixture(scope="module")
def plain_runs(real_models) -> dict[str, tuple[list[int], Record]]:
    """Each prompt's tokens and plain decoding's record (one-token passes, greedy)."""
    target, _ = real_models
    session = Session(Engine(target, NoDrafter(), 0))
    runs = {}
    for name, prompt in PROMPTS.items():
        tokens = session.render(user(prompt))
        runs[name] = (tokens, runner.run_once(session.engine, target, None, tokens, MAX_TOKENS))
    return runs


def assert_audited(target: Model, plain: Record, spec: Record) -> None:
    """Identical answers, or a first divergence the audit reproduces as numerics."""
    assert plain.trace is not None and spec.trace is not None
    divergence = audit.audit(target, plain.trace, spec.trace)
    assert divergence is None or not divergence.is_defect, divergence and divergence.label()


def assert_lossless(spec: Finished, plain_pieces: list[Piece], plain: Finished) -> None:
    """The weaker rule, for runs the audit cannot replay (see the module's docstring)."""
    for i, (got, want) in enumerate(zip(spec.tokens, plain.tokens, strict=False)):
        if got != want:
            here = plain_pieces[i]
            assert here.margin is not None and here.margin < NEAR_TIE, (
                f"token {i}: speculation chose {got}, plain decoding {want} "
                f"with a clear margin of {here.margin:.2f}: a logic error, not numerics"
            )
            assert got == here.runner_up, f"token {i}: {got} is not plain decoding's runner-up"
            return
    assert len(spec.tokens) == len(plain.tokens)
    assert spec.stop_reason == plain.stop_reason


# each drafter at a depth where it rejects often, and the draft model at both ends too
@pytest.mark.parametrize(
    ("drafter_kind", "gamma"), [("draft", 1), ("draft", 6), ("ngram", 6), ("draft-window", 3)]
)
def test_greedy_speculation_equals_plain_decoding(real_models, plain_runs, drafter_kind, gamma):
    target, draft = real_models
    drafter = {  # draft-window: it reads its sinks and the last 16 tokens of each prompt
        "draft": lambda: DraftModel(draft),
        "draft-window": lambda: DraftModel(draft, window=16),
        "ngram": NgramDrafter,
    }[drafter_kind]()
    engine = Engine(target, drafter, gamma)
    drafted = 0
    for tokens, plain in plain_runs.values():
        spec = runner.run_once(engine, target, draft, tokens, MAX_TOKENS)
        assert_audited(target, plain, spec)
        drafted += spec.figures.drafted
        if drafter_kind == "draft-window":
            assert draft.kv_len() == len(draft.cached) < len(tokens) + spec.figures.tokens
    assert drafted > 0


def test_caches_follow_the_accepted_text_across_rounds(real_models):
    target, draft = real_models
    session = Session(Engine(target, DraftModel(draft, p_min=0.0), 5))
    # prose: many rejections
    prompt = session.render(user("Explain in one paragraph how a hash map handles collisions."))
    text = list(prompt)
    seen = []
    for event in session.engine.generate(prompt, GenerationConfig(max_tokens=48)):
        if isinstance(event, Piece):
            text.append(event.token)
        elif isinstance(event, RoundEnd):
            # llama.cpp's own KV cache holds exactly the tokens we think it does
            assert target.kv_len() == len(target.cached)
            assert draft.kv_len() == len(draft.cached)
            seen.append((event, list(text), list(target.cached), list(draft.cached)))
    for _, text, target_kv, draft_kv in seen[:-1]:  # the last round may also hold an EOS
        assert target_kv == text[:-1]
        assert draft_kv == text[: len(draft_kv)]
    rounds = len(seen)
    rejections = sum(e.accepted < e.drafted for e, *_ in seen)
    assert rounds > 5 and rejections > 0


def test_multi_turn_chat_reuses_caches_and_matches_a_fresh_start(real_models):
    target, draft = real_models
    session = Session(Engine(target, DraftModel(draft), 4))
    config = GenerationConfig(max_tokens=24, trace=True)
    first = list(session.chat(user("Name a sorting algorithm."), config))[-1]
    turn2 = [
        *user("Name a sorting algorithm."),
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "What is its time complexity?"},
    ]
    first_prompt = session.render(turn2[:1])
    before, decoded = list(target.cached), target.decoded
    events = session.chat(turn2, config)
    next(events)  # the prefill has run
    prompt = session.render(turn2)
    reused_len = common_prefix(before, prompt)
    assert reused_len > len(first_prompt)  # all of turn 1 stayed in the cache
    assert target.decoded - decoded == len(prompt) - reused_len  # only the new part ran
    reused = list(events)[-1]

    target.reset()
    draft.reset()
    plain_events = list(Session(Engine(target, NoDrafter(), 0)).chat(turn2, config))
    plain_pieces = [e for e in plain_events if isinstance(e, Piece)]
    assert_lossless(reused, plain_pieces, plain_events[-1])


def test_speculation_accepts_most_draft_tokens_on_code(real_models):
    target, draft = real_models
    session = Session(Engine(target, DraftModel(draft), 4))
    done = list(session.chat(user(PROMPTS["code"]), GenerationConfig(max_tokens=40)))[-1]
    assert done.stats.acceptance_rate > 0.6
    assert done.stats.mean_accepted_len > 2.0


def test_a_draft_with_another_vocabulary_is_refused(real_models, gemma_path):
    from localspec.backends.llama import LlamaModel, LoadOptions

    target, _ = real_models
    gemma = LlamaModel(gemma_path, LoadOptions(n_ctx=256, n_threads=2))
    try:
        with pytest.raises(ModelError, match=r"cannot be paired|vocabular"):
            check_compatible(target, gemma)
    finally:
        gemma.close()


def test_the_real_pair_is_compatible(real_models):
    check_compatible(*real_models)


def test_seeded_sampling_is_reproducible_with_the_real_pair(real_models):
    from localspec.decoding.sampling import SamplingParams

    target, draft = real_models
    engine = Engine(target, DraftModel(draft), 3)
    prompt = Session(engine).render(user(PROMPTS["chat"]))

    def run(seed: int) -> Finished:
        sampling = SamplingParams(temperature=0.9, seed=seed)
        return list(engine.generate(prompt, GenerationConfig(max_tokens=24, sampling=sampling)))[-1]

    first = run(5)
    assert first.stats.drafted > 0 and first.text
    assert run(5).tokens == first.tokens


def test_penalties_and_a_logit_bias_speculate_as_plain_decoding(real_models):
    """Each row of a verify pass is biased and penalized with its own history (the
    drafted tokens before it included), as plain decoding's one row per token is."""
    from localspec.decoding.sampling import SamplingParams, penalize

    target, draft = real_models
    prompt = Session(Engine(target, NoDrafter(), 0)).render(user(PROMPTS["code"]))

    def run(drafter, gamma: int, params: SamplingParams) -> Finished:
        config = GenerationConfig(max_tokens=24, sampling=params)
        return list(Engine(target, drafter, gamma).generate(prompt, config))[-1]

    unbiased = run(NoDrafter(), 0, SamplingParams())
    banned = unbiased.tokens[1]
    params = SamplingParams(
        frequency_penalty=1.0, presence_penalty=1.5, logit_bias=((banned, -100.0),)
    )
    plain = run(NoDrafter(), 0, params)
    spec = run(DraftModel(draft), 4, params)
    assert banned not in plain.tokens and plain.tokens != unbiased.tokens
    assert spec.stats.drafted > 0
    for i, (got, want) in enumerate(zip(spec.tokens, plain.tokens, strict=True)):
        if got != want:  # only a near-tie of the reshaped row may part them
            history = [*prompt, *plain.tokens[:i]]
            target.reset()
            row = penalize(target.evaluate(history, 1)[0], params, history)
            top, runner_up = (int(t) for t in np.argsort(row)[::-1][:2])
            assert (want, got) == (top, runner_up), f"token {i}: not plain decoding's top two"
            assert row[top] - row[runner_up] < NEAR_TIE, f"token {i}: a clear margin"
            return


def test_the_cpu_draft_copy_speculates_losslessly(
    real_models, plain_runs, tmp_path_factory, monkeypatch
):
    """The Q4_0 copy localspec drafts with on a CPU: still the target's greedy output,
    and still a good guesser on code."""
    from localspec.backends import quantize
    from localspec.backends.llama import LlamaModel, LoadOptions

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.setattr(quantize, "repacks_q4_0", lambda: True)
    target, draft = real_models
    copy = quantize.cpu_draft(draft.path)
    assert copy != draft.path
    fast = LlamaModel(copy, LoadOptions(n_ctx=2048, n_threads=2))
    try:
        check_compatible(target, fast)
        tokens, plain = plain_runs["code"]  # the other prompts: the tests above
        spec = runner.run_once(
            Engine(target, DraftModel(fast), 4), target, fast, tokens, MAX_TOKENS
        )
        assert_audited(target, plain, spec)
        assert spec.figures.acceptance_rate > 0.6
    finally:
        fast.close()
