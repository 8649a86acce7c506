"""The divergence audit: a divergence is numerics only when the replayed passes reproduce
it. Toy models for the verdicts (a logic error, a broken cache cut, a genuine batched vs
one-token flip); the real pair for `--gamma auto` at temperature 0."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from localspec.backends.toy import ASSISTANT, ToyModel, scripted
from localspec.bench import audit, modes, runner
from localspec.bench.audit import Round, Trace
from localspec.bench.markdown import to_markdown
from localspec.bench.runner import BenchConfig
from localspec.bench.suite import BenchPrompt, load_prompts
from localspec.decoding import engine as engine_module
from localspec.session import Session, SessionConfig, make_engine

REPLY = "def add(a, b):\n    return a + b\n"
NEAR_REPLY = "def add(a, b):\n    return a - b\n"  # one token off: the draft gets rejected
PROMPT = (BenchPrompt("one", "code", "Write add."),)
FAST = BenchConfig(max_tokens=40, warmup=False, costs=False)
TIE_AT = 8  # the answer position where the toy target's runner-up trails by a hair


def near_tie(at: int = TIE_AT, runner_up: str = "X", margin: float = 0.25):
    """REPLY, but at answer position `at` the runner-up trails by only `margin`."""
    base = scripted(REPLY)

    def logits(context):
        out = np.array(base(context), dtype=np.float32)
        data = bytes(t for t in context if t < 256)
        if len(data) - data.rfind(ASSISTANT) - len(ASSISTANT) == at:
            out[ord(runner_up)] = out.max() - margin
        return out

    return logits


class BatchSkewed(ToyModel):
    """Like llama.cpp's kernels, a batched pass's logits differ a little from a one-token
    pass's: here 'X' gains 0.5 in every row of a multi-token pass, which flips only a tie
    closer than that."""

    def _decode(self, tokens, pos, n_logits):
        logits = np.array(super()._decode(tokens, pos, n_logits))
        if len(tokens) > 1:
            logits[:, ord("X")] += 0.5
        return logits


class UncutCache(ToyModel):
    """A backend whose partial cache cut fails silently, as a recurrent model's does
    (issue 20): the stale tokens stay in what it attends to."""

    def __init__(self, logits_fn) -> None:
        super().__init__(logits_fn, name="uncut")
        self.kv: list[int] = []

    def _decode(self, tokens, pos, n_logits):
        context = [*self.kv, *tokens]
        self.kv = context
        end = len(context)
        rows = [self.logits_fn(context[: end - n_logits + i + 1]) for i in range(n_logits)]
        return np.asarray(rows, dtype=np.float32)

    def _remove_from(self, pos: int) -> bool:
        if pos == 0:  # a whole clear works; a partial one does nothing, and says it worked
            self.kv = []
        return True

    def kv_len(self) -> int:
        return len(self.kv)


def plain_rounds(n: int) -> tuple[Round, ...]:
    """The rounds of plain decoding for an answer of n tokens: one token a pass."""
    return tuple(Round(start, (), 0) for start in range(1, n))


def run_draft_mode(target: ToyModel, draft: ToyModel | None = None):
    draft = draft or ToyModel(scripted(NEAR_REPLY), name="toy-draft")
    return runner.run_bench(target, draft, PROMPT, modes.parse_modes("draft"), FAST)


def test_first_difference():
    assert audit.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert audit.first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert audit.first_difference([1, 2, 3], [1, 2]) == 2  # one stopped early
    assert audit.first_difference([1, 2], [1, 2, 3]) == 2


def test_a_genuine_batched_flip_is_numerics():
    target = BatchSkewed(near_tie(), name="toy-target")
    found = run_draft_mode(target, ToyModel(scripted(REPLY), name="toy-draft"))
    agreement = found.result("one", "draft").agreement
    divergence = agreement.divergence
    assert divergence is not None and divergence.index == TIE_AT
    assert divergence.verdict == "numerics", divergence.why
    assert divergence.one_token_argmax == ord(REPLY[TIE_AT])
    assert divergence.batched_argmax == ord("X") and divergence.batch_size > 1
    assert divergence.why.endswith(
        "; 'X' trails by 0.25 in the first, 'a' by 0.25 in the second"
    ), divergence.why
    assert not found.defects() and "**DEFECT**" not in to_markdown(found)
    assert f"differs at {TIE_AT}: numerics (reproduced: plain" in to_markdown(found)


def test_the_same_tie_without_the_kernel_difference_is_identical():
    found = run_draft_mode(ToyModel(near_tie(), name="toy-target"))
    assert found.result("one", "draft").agreement.identical


def test_a_logic_error_is_a_defect_however_close_the_tie(monkeypatch):
    """An off-by-one in verification keeps the first wrong draft token: at the near-tie
    the draft's 'X' is the runner-up, 0.25 behind, which the old logit-gap rule called
    numerics. Replayed, the batch it was scored in picks the target's token."""
    original = engine_module.verify_greedy

    def keeps_one_too_many(draft, argmax):
        verdict = original(draft, argmax)
        if verdict.accepted >= len(draft):
            return verdict
        return dataclasses.replace(
            verdict, accepted=verdict.accepted + 1, token=int(argmax[verdict.accepted + 1])
        )

    monkeypatch.setattr(engine_module, "verify_greedy", keeps_one_too_many)
    draft = ToyModel(scripted(REPLY[:TIE_AT] + "X" + REPLY[TIE_AT + 1 :]), name="toy-draft")
    found = run_draft_mode(ToyModel(near_tie(), name="toy-target"), draft)
    divergence = found.result("one", "draft").agreement.divergence
    assert divergence is not None and divergence.index == TIE_AT
    assert divergence.verdict == "defect"
    assert divergence.batched_argmax == divergence.one_token_argmax == ord(REPLY[TIE_AT])
    assert "not numerics" in divergence.why and "as plain decoding does" in divergence.why
    assert found.defects() and "**DEFECT**" in to_markdown(found)


def test_a_cache_cut_that_failed_is_a_defect():
    found = run_draft_mode(UncutCache(scripted(REPLY)))
    divergence = found.result("one", "draft").agreement.divergence
    assert divergence is not None and divergence.is_defect
    assert "a cut failed" in divergence.why


def test_a_runs_record_replays_to_its_own_answer_at_every_position():
    target = ToyModel(scripted(REPLY), name="toy-target")
    draft = ToyModel(scripted(NEAR_REPLY), name="toy-draft")
    engine = modes.build_engine(modes.Mode("draft", "draft", 4), target, draft)
    prompt = target.tokenize("<|user|>Write add.\n<|assistant|>")
    record = runner.run_once(engine, target, draft, prompt, 40)
    trace = record.trace
    assert trace is not None and any(r.accepted < len(r.drafted) for r in trace.rounds)
    for i, token in enumerate(trace.answer):
        row, step = audit.rescore(target, trace, i)
        assert int(np.argmax(row)) == token
        assert step.first <= i < step.first + step.emitted


def test_passes_are_the_prompt_then_one_batch_a_round():
    trace = Trace((1, 2), (5, 6, 7, 8), "max_tokens", (Round(1, (6, 9), 1), Round(3, (), 0)))
    got = [(s.tokens, s.size, s.n_logits, s.first, s.emitted) for s in audit.passes(trace)]
    assert got == [
        ((1, 2), 2, 1, 0, 1),  # the prompt: its last row gives the first token
        ((1, 2, 5, 6, 9), 3, 3, 1, 2),  # [5] + draft (6, 9): 6 accepted, then the target's 7
        ((1, 2, 5, 6, 7), 1, 1, 3, 1),  # plain round: 7 alone, gives 8
    ]


def test_a_run_that_stopped_for_another_reason_cannot_be_proven_numerics():
    target = ToyModel(scripted(REPLY), name="toy-target")
    prompt = tuple(target.tokenize("<|user|>hi\n<|assistant|>"))
    whole = tuple(REPLY.encode())
    plain = Trace(prompt, whole, "max_tokens", plain_rounds(len(whole)))
    short = Trace(prompt, whole[:5], "context_full", plain_rounds(5))
    found = audit.audit(target, plain, short)
    assert found is not None and found.is_defect and "(context_full)" in found.why


# --- the real pair -----------------------------------------------------------------------
@pytest.mark.real
def test_auto_at_temperature_0_is_plain_decoding_up_to_proven_numerics(real_models):
    """`--gamma auto` (the session's engine: draft model and n-grams, adaptive γ) gives
    plain decoding's tokens; any divergence is one the audit reproduces as numerics."""
    target, draft = real_models
    names = ("code-binary-search", "chat-git-rebase")  # drafts accepted; rejected
    prompts = [p for p in load_prompts() if p.name in names]
    render = Session(make_engine(target, None, SessionConfig(target.name))).render
    drafted = 0
    for p in prompts:
        tokens = render([{"role": "user", "content": p.prompt}])
        plain_engine = make_engine(target, None, SessionConfig(target.name, draft="none"))
        auto_engine = make_engine(
            target, draft, SessionConfig(target.name, draft=draft.name, gamma="auto")
        )
        plain = runner.run_once(plain_engine, target, draft, tokens, 48)
        auto = runner.run_once(auto_engine, target, draft, tokens, 48)
        assert plain.trace is not None and auto.trace is not None
        drafted += auto.figures.drafted
        divergence = audit.audit(target, plain.trace, auto.trace)
        assert divergence is None or divergence.verdict == "numerics", (p.name, divergence)
        if divergence is None:  # the replay is the run: it gives the answer's last token
            last = len(auto.trace.answer) - 1
            assert (
                int(np.argmax(audit.rescore(target, auto.trace, last)[0]))
                == (auto.trace.answer[last])
            )
    assert drafted > 0  # the target scored drafts in batches: there was something to prove


class Skewed(ToyModel):
    """A batched pass that favours 'X' by 2 logits: past NEAR_TIE, as far as llama.cpp's
    passes part where an answer has lost its way."""

    def _decode(self, tokens, pos, n_logits):
        logits = np.array(super()._decode(tokens, pos, n_logits))
        if len(tokens) > 1:
            logits[:, ord("X")] += 2.0
        return logits


def test_judge_tells_a_near_tie_numerics_a_defect_and_a_shorter_answer():
    """`judge` knows a server's answer by its tokens only: a near-tie in plain decoding's
    own passes; numerics where only one pass over the same tokens takes the other token;
    a defect where neither does, or where plain decoding's passes do not take its own
    (but narrowly, as another prompt split may round)."""
    prompt = list(b"Write add." + ASSISTANT)
    plain = list(REPLY.encode())
    other = [*plain[:TIE_AT], ord("X"), *plain[TIE_AT + 1 :]]
    tie = ToyModel(near_tie(margin=0.25), n_vocab=258)
    assert audit.judge(tie, prompt, plain, other).startswith(f"near-tie: token {TIE_AT}, ")
    # a plain run whose prompt was read in other passes (after a cached part) may have
    # taken the near-tie's other side: the replay picks the server's token, narrowly
    swapped = audit.judge(tie, prompt, other, plain)
    assert swapped.startswith(f"near-tie: token {TIE_AT}, the replayed passes pick")
    skewed = Skewed(near_tie(margin=1.5), n_vocab=258)
    assert audit.judge(skewed, prompt, plain, other).startswith(f"numerics: token {TIE_AT}:")
    sure = ToyModel(scripted(REPLY), n_vocab=258)  # 'X' trails by 20 logits in every pass
    assert audit.judge(sure, prompt, plain, other).startswith(f"DEFECT: token {TIE_AT}, ")
    # plain decoding's tokens that its own passes would not take: not a near-tie at all
    assert "its passes replayed pick" in audit.judge(sure, prompt, other, plain)
    assert audit.judge(sure, prompt, plain, plain[:5]) == (
        f"the same tokens, stopped elsewhere ({len(plain)} vs 5)"
    )
