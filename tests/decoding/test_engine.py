"""The loop's bookkeeping on deterministic toy models: caches, passes, stops."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from localspec.backends.base import ContextFull
from localspec.backends.toy import ToyModel, markov, scripted
from localspec.decoding.drafters import DraftModel, NgramDrafter, NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished, Piece, RoundEnd, StatsRecorder
from localspec.decoding.sampling import SamplingParams
from localspec.session import Session

REPLY = "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5 ✓"
NEAR_REPLY = "def add(a, b):\n    return a - b\n\nprint(add(2, 3))  # 5 ✓"  # one token off
USER = [{"role": "user", "content": "add two numbers"}]


def pair(gamma: int = 4, reply: str = REPLY, draft_reply: str = NEAR_REPLY):
    target = ToyModel(scripted(reply), name="target")
    draft = ToyModel(scripted(draft_reply), name="draft")
    return Session(Engine(target, DraftModel(draft, p_min=0.0), gamma)), target, draft


def test_answer_is_the_targets_and_rejections_happen():
    session, _, _ = pair()
    done = list(session.chat(USER))[-1]
    assert isinstance(done, Finished)
    assert done.text == REPLY and done.stop_reason == "eog"
    assert 0 < done.stats.accepted < done.stats.drafted


def test_caches_hold_exactly_the_accepted_text_after_every_round():
    session, target, draft = pair(gamma=5)
    prompt = session.render(USER)
    text = list(prompt)
    seen = []
    for event in session.engine.generate(prompt):
        if isinstance(event, Piece) and event.token >= 0:
            text.append(event.token)
        if isinstance(event, RoundEnd):
            seen.append((list(text), list(target.cached), list(draft.cached)))
    assert len(seen) > 5
    for text, target_kv, draft_kv in seen[:-1]:  # the last round also holds the EOS
        # the target holds all but the newest token (it opens the next batch)
        assert target_kv == text[:-1]
        assert draft_kv == text[: len(draft_kv)]  # a prefix: no rejected tail


def test_one_target_pass_per_round():
    session, target, _ = pair(gamma=4)
    done = list(session.chat(USER))[-1]
    assert target.decode_calls == done.stats.rounds + 1  # + the prefill


def test_multi_turn_reuses_the_cache_and_matches_a_fresh_session():
    session, target, _ = pair()
    first = list(session.chat(USER))[-1].text
    turn2 = [*USER, {"role": "assistant", "content": first}, {"role": "user", "content": "again"}]
    calls = target.decode_calls
    again = list(session.chat(turn2))[-1]
    fresh, _, _ = pair()
    assert again.text == list(fresh.chat(turn2))[-1].text == REPLY
    # the prefill of turn 2 evaluated only what turn 1 did not already hold
    assert target.decode_calls - calls == again.stats.rounds + 1


@pytest.mark.parametrize("drafter", [NoDrafter(), NgramDrafter()])
def test_every_drafter_gives_the_same_greedy_answer(drafter):
    target = ToyModel(scripted(REPLY))
    session = Session(Engine(target, drafter, 0 if isinstance(drafter, NoDrafter) else 3))
    assert list(session.chat(USER))[-1].text == REPLY


def test_each_reshaped_greedy_row_sees_the_drafted_tokens_before_it():
    """Penalties and a bias: row i of a verify pass is penalized with the context plus
    draft[:i], so speculation answers as plain decoding (toys: no numerics part them)."""
    fn = markov(8, seed=1)
    params = SamplingParams(
        frequency_penalty=1.0, presence_penalty=0.5, repeat_last_n=6, logit_bias=((3, -2.0),)
    )
    config = GenerationConfig(max_tokens=40, sampling=params)

    def answer(drafter, gamma: int) -> Finished:
        return list(Engine(ToyModel(fn, n_vocab=8), drafter, gamma).generate([1, 2], config))[-1]

    plain = answer(NoDrafter(), 0)
    spec = answer(DraftModel(ToyModel(fn, n_vocab=8), p_min=0.0), 4)
    unshaped = list(Engine(ToyModel(fn, n_vocab=8), NoDrafter(), 0).generate([1, 2]))[-1]
    assert plain.tokens != unshaped.tokens[: len(plain.tokens)]
    assert spec.tokens == plain.tokens
    assert spec.stats.accepted == spec.stats.drafted > 0  # the same model drafts: all right


def test_provenance_marks_accepted_draft_tokens():
    session, _, _ = pair(draft_reply=REPLY)  # a perfect draft
    pieces = [e for e in session.chat(USER) if isinstance(e, Piece)]
    assert pieces[0].source == "target"  # the prefill token
    assert sum(p.source == "draft" for p in pieces) > len(pieces) // 2


def test_stop_string_ends_the_answer_without_showing_it():
    session, _, _ = pair()
    events = list(session.chat(USER, GenerationConfig(stop=("\n\nprint",))))
    done = events[-1]
    assert done.stop_reason == "stop_string"
    assert done.text == "def add(a, b):\n    return a + b"
    assert "".join(e.text for e in events if isinstance(e, Piece)) == done.text


def test_max_tokens_cuts_inside_a_round():
    session, _, _ = pair(gamma=6)
    done = list(session.chat(USER, GenerationConfig(max_tokens=7)))[-1]
    assert done.stop_reason == "max_tokens" and len(done.tokens) == 7
    assert done.text == REPLY.encode()[:7].decode()


def test_full_context_ends_with_a_reason():
    target = ToyModel(scripted(REPLY), n_ctx=40)
    session = Session(Engine(target, DraftModel(ToyModel(scripted(REPLY)), p_min=0.0), 4))
    done = list(session.chat(USER))[-1]
    assert done.stop_reason == "context_full"
    assert len(session.render(USER)) + len(done.tokens) == 40


def test_prompt_longer_than_the_context_is_refused_before_generating():
    session, _, _ = pair()
    session.target.n_ctx = 10
    with pytest.raises(ContextFull, match="context"):
        next(session.chat(USER))


def test_cancel_ends_at_the_next_round():
    session, _, _ = pair(gamma=2)
    cancel = threading.Event()
    events = []
    for event in session.chat(USER, cancel=cancel):
        events.append(event)
        if isinstance(event, RoundEnd):
            cancel.set()
    done = events[-1]
    assert done.stop_reason == "cancelled" and 0 < len(done.tokens) < len(REPLY)
    assert REPLY.startswith(done.text)


def test_stats_count_what_happened():
    session, _, _ = pair(draft_reply=REPLY, gamma=4)
    done = list(session.chat(USER))[-1]
    s = done.stats
    assert s.acceptance_rate == 1.0
    assert s.tokens == len(REPLY.encode())
    assert s.mean_accepted_len == pytest.approx(1 + s.accepted / s.rounds)
    assert s.drafted_per_position[0] == s.rounds - 1 or s.drafted_per_position[0] >= 1
    assert sum(s.accepted_per_position) == s.accepted
    assert s.drafters == ("draft",)


def test_the_drafters_of_an_answer_are_named_the_most_first():
    """Not only the last round's (which may have drafted nothing), for the server's log."""
    recorder = StatsRecorder()
    for drafter, drafted in (("suffix", 3), ("draft", 4), ("suffix", 6), ("none", 0)):
        recorder.end_round(drafter, drafted, drafted, drafted, drafted + 1, "")
    stats = recorder.snapshot()
    assert stats.drafter == "none" and stats.drafters == ("suffix", "draft")


def test_plain_decoding_makes_one_token_a_round():
    """The round that makes the end-of-generation token shows no text but made a token:
    a plain answer is 1 token a round, not (n - 1) / n."""
    session = Session(Engine(ToyModel(scripted(REPLY)), NoDrafter(), 0))
    done = list(session.chat(USER))[-1]
    assert done.stop_reason == "eog"
    assert done.stats.mean_accepted_len == 1.0


def test_the_draft_model_stops_at_a_per_position_p_min():
    _, _, draft = pair()
    drafter = DraftModel(draft, p_min=[0.0, 0.0, 1.01])  # the third token needs certainty+
    context = draft.tokenize("<|assistant|>")
    params = GenerationConfig().sampling
    assert len(drafter.draft(context, 5, params, np.random.default_rng(0)).tokens) == 2
    drafter.p_min = [0.0]  # the last threshold holds for the positions after it
    assert len(drafter.draft(context, 5, params, np.random.default_rng(0)).tokens) == 5


def test_a_draft_model_far_behind_reads_its_sinks_and_a_window_and_stays_lossless():
    from localspec.decoding.drafters import SINKS

    target, draft = ToyModel(scripted(REPLY), name="target"), ToyModel(scripted(REPLY))
    drafter = DraftModel(draft, p_min=0.0, window=32)
    session = Session(Engine(target, drafter, 4))
    user = [{"role": "user", "content": "x" * 300}]
    prompt = session.render(user)
    done = list(session.chat(user))[-1]
    assert done.text == REPLY  # the target's answer, whatever the draft read
    assert draft.decoded < len(prompt)  # it never read the whole prompt
    # its cache: the first SINKS tokens, then the text from within the window's reach on
    text, tail = [*prompt, *done.tokens], draft.cached[SINKS : SINKS + 32]
    assert draft.cached[:SINKS] == text[:SINKS]
    start = next(s for s in range(SINKS + 1, len(text)) if text[s : s + len(tail)] == tail)
    assert len(prompt) - 32 <= start < len(prompt)
    # the window kept the assistant marker, so the draft still guessed right
    assert done.stats.accepted >= len(done.tokens) // 2


# --- a cache that cannot drop a suffix (recurrent and hybrid models) -----------------
def whole_text(n_vocab: int = 258):
    """Logits that depend on the whole text read (a recurrent model's state does): a
    cache that kept a rejected tail would give other logits."""

    def logits(context):
        out = np.zeros(n_vocab, dtype=np.float32)
        out[(sum(context) * 31 + len(context)) % 200 + 32] = 10.0
        return out

    return logits


def test_a_recurrent_cache_restarts_where_a_cut_fails_and_keeps_the_logits():
    """Two turns of a chat: the second keeps the first's prompt and drops the rest."""
    model = ToyModel(whole_text(), recurrent=True)
    fresh = ToyModel(whole_text())
    model.evaluate([1, 2, 3, 4], 1)
    got = model.evaluate([1, 2, 5, 6], 1)
    assert model.restarts == 1  # the cut to [1, 2] failed: it read all four again
    assert np.array_equal(got, fresh.evaluate([1, 2, 5, 6], 1))
    assert model.kv_len() == len(model.cached) == 4
    model.rollback([1, 2, 5])  # a rejected draft token
    assert model.restarts == 2 and model.cached == []
    assert np.array_equal(model.evaluate([1, 2, 5, 7], 1), fresh.evaluate([1, 2, 5, 7], 1))


def test_a_recurrent_target_decodes_plainly_and_says_why():
    target = ToyModel(scripted(REPLY), name="mamba", recurrent=True)
    draft = ToyModel(scripted(NEAR_REPLY), name="draft")
    engine = Engine(target, DraftModel(draft, p_min=0.0), 4)
    assert engine.notes == [
        "plain decoding: mamba is a recurrent or hybrid model, whose cache cannot drop "
        "a rejected draft"
    ]
    session = Session(engine)
    assert session.notes == engine.notes  # the session says it when it opens
    done = list(session.chat(USER))[-1]
    assert done.text == REPLY and done.stats.drafted == 0
    assert draft.decode_calls == 0


def test_speculation_over_a_cache_that_cannot_be_cut_stays_lossless():
    """Were a recurrent model speculated over anyway, each rejection makes its cache
    start over (slow), never the answer wrong."""
    fn = whole_text()
    plain = list(Engine(ToyModel(fn), NoDrafter(), 0).generate([65, 66], GenerationConfig(40)))
    target = ToyModel(fn, name="target", recurrent=True)
    draft = ToyModel(whole_text(), name="draft", recurrent=True)
    engine = Engine(target, NoDrafter(), 0)
    engine.drafter, engine.gamma = DraftModel(draft, p_min=0.0), 4  # past the switch
    # a draft that is right on every other token: rejections all the way
    draft.logits_fn = lambda ctx: fn(ctx) if len(ctx) % 2 else np.roll(fn(ctx), 1)
    done = list(engine.generate([65, 66], GenerationConfig(40)))[-1]
    assert done.tokens == plain[-1].tokens
    assert 0 < done.stats.accepted < done.stats.drafted
    assert target.restarts > 0 and draft.restarts > 0
    assert target.kv_len() == len(target.cached) and draft.kv_len() == len(draft.cached)


def test_a_draft_token_the_target_lacks_is_refused_unread():
    """A draft vocabulary larger than the target's: the target never reads the token
    (llama.cpp would refuse the batch), and rejects it."""
    target = ToyModel(scripted(REPLY), name="target", n_vocab=258)

    def draft_fn(ctx):
        out = np.zeros(300, dtype=np.float32)
        out[299 if len(ctx) % 3 == 0 else int(np.argmax(scripted(REPLY)(ctx)))] = 10.0
        return out

    draft = ToyModel(draft_fn, name="draft", n_vocab=300)
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, seed=1)):
        engine = Engine(target, DraftModel(draft, p_min=0.0), 4)
        done = list(Session(engine).chat(USER, GenerationConfig(sampling=sampling)))[-1]
        assert done.text == REPLY
        assert 0 < done.stats.accepted < done.stats.drafted
        assert max(target.state) < 258
