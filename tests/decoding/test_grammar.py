"""Speculation under a grammar, on toy Markov models with a two-state grammar: greedy
output is constrained plain decoding's for every drafter and γ, and sampled output follows
the constrained target's law (chi-square), the draft model drafting unconstrained."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from decoding.test_lossless_sampling import PARAMS, V, chi2, critical

from localspec.backends.toy import ToyModel, markov
from localspec.decoding.drafters import Drafter, DraftModel, NgramDrafter, NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.grammar import states_along
from localspec.decoding.sampling import SamplingParams, logits_to_probs

# after an even token only odd ones (and 7); otherwise anything but 0 and 7
ALLOWED = {0: [1, 2, 3, 4, 5, 6], 1: [1, 3, 7]}


class Parity:
    def __init__(self, state: int = 0) -> None:
        self.state = state

    def allows(self, token: int) -> bool:
        return token in ALLOWED[self.state]

    def mask(self, logits: np.ndarray) -> np.ndarray:
        out = np.full_like(logits, -np.inf)
        out[ALLOWED[self.state]] = logits[ALLOWED[self.state]]
        return out

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        return np.isin(tokens, ALLOWED[self.state])

    def accept(self, token: int) -> None:
        assert self.allows(token), (self.state, token)
        self.state = 1 if token % 2 == 0 else 0

    def clone(self) -> Parity:
        return Parity(self.state)

    def forced_text(self, limit: int) -> bytes:
        return b""

    def forced_tokens(self, limit: int) -> list[int]:
        return []

    free = False


class ParityGrammar:
    def start(self) -> Parity:
        return Parity()

    def within(self, other: object) -> bool:
        return isinstance(other, ParityGrammar)


def follows(tokens) -> bool:
    state = Parity()
    for t in tokens:
        if not state.allows(t):
            return False
        state.accept(t)
    return True


def test_states_along_a_draft_stop_at_a_refused_token():
    states = list(states_along(Parity(), [2, 3, 0, 5]))  # 0 is refused in state 0
    assert [s.state for s in states] == [0, 1, 0]


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("kind", ["draft_model", "ngram"])
def test_constrained_greedy_equals_constrained_plain_decoding(kind: str, gamma: int):
    target = ToyModel(markov(V, seed=1), n_vocab=V, name="target")
    config = GenerationConfig(40, SamplingParams(temperature=0), grammar=ParityGrammar())
    prompt = [3, 1, 4, 1, 5, 3, 1, 4, 1, 5, 3]
    plain = list(Engine(target, NoDrafter(), 0).generate(prompt, config))[-1]
    assert follows(plain.tokens) and len(plain.tokens) == 40
    unconstrained = list(
        Engine(target, NoDrafter(), 0).generate(
            prompt, GenerationConfig(40, SamplingParams(temperature=0))
        )
    )[-1]
    assert not follows(unconstrained.tokens)  # the grammar changes the answer here
    drafter: Drafter = (
        DraftModel(ToyModel(markov(V, seed=2), n_vocab=V), p_min=0.0)
        if kind == "draft_model"
        else NgramDrafter()
    )
    spec = list(Engine(target, drafter, gamma).generate(prompt, config))[-1]
    assert spec.tokens == plain.tokens
    assert spec.stats.drafted > 0
    if kind == "ngram":  # the constrained answer loops: its n-grams are accepted
        assert spec.stats.accepted > 0


def test_constrained_sampling_follows_the_constrained_law():
    target_fn = markov(V, seed=1)
    target = ToyModel(target_fn, n_vocab=V, name="target")
    drafter = DraftModel(ToyModel(markov(V, seed=2), n_vocab=V, name="draft"), p_min=0.0)
    params = SamplingParams(**PARAMS)
    prompt = [3]
    engine = Engine(target, drafter, gamma=3)
    grammar = ParityGrammar()

    def run(config):  # run_many's loop, with the grammar in the config
        counts = np.zeros((4, V))
        drafted = accepted = 0
        for seed in range(3000):
            done = list(engine.generate(prompt, config(seed)))[-1]
            for k, tok in enumerate(done.tokens):
                counts[k, tok] += 1
            drafted, accepted = drafted + done.stats.drafted, accepted + done.stats.accepted
        return counts, drafted, accepted

    counts, drafted, accepted = run(
        lambda seed: GenerationConfig(4, replace(params, seed=seed), grammar=grammar)
    )
    assert 0 < accepted < drafted
    # the constrained chain: the state after a token is its parity, so the law of the
    # k-th token follows from the first token's (state 0) and the masked transitions
    masked = np.array(
        [
            logits_to_probs(Parity(1 if a % 2 == 0 else 0).mask(target_fn([a])), params, [])
            for a in range(V)
        ]
    )
    law = logits_to_probs(Parity(0).mask(target_fn(prompt)), params, [])
    for k in range(4):
        if (law > 0).sum() == 1:  # one possible token: every answer has it
            assert counts[k][law > 0].sum() == counts[k].sum(), k
        else:
            assert chi2(counts[k], law) < critical(law), k
        law = law @ masked


def test_forced_text_is_drafted_as_the_answer_split_it_before():
    """Under a grammar the target splits a key as it pleases (`f` `i` `le`, where its
    favourite `filename` is refused): the next time the grammar forces that text, the
    draft splits it the same way; text never written before goes by the tokenizer."""
    from localspec.decoding.grammar import as_written

    f, i, le = 300, 301, 302  # tokens of several bytes, as a real vocabulary has them

    class Pieces(ToyModel):
        def token_bytes(self, token: int, special: bool = False) -> bytes:
            return {f: b"f", i: b"i", le: b"le"}.get(token) or super().token_bytes(token)

    model = Pieces(markov(V, seed=1), n_vocab=258)  # bytes, and three tokens more
    written = [*b'{"', f, i, le, *b'": 1, "']
    assert as_written(model, written, b'file": ') == ([f, i, le, *b'": '], b'file": ')
    assert as_written(model, written, b"fig") == ([f, i], b"fi")  # the start of it
    assert as_written(model, written, b"xyz") == ([], b"")


class Allowed:
    """A grammar state that allows a fixed set of ids, and counts its whole-row masks."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids, self.asked = ids, 0

    def allows(self, token: int) -> bool:
        return bool(np.isin(token, self.ids))

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        return np.isin(tokens, self.ids)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        self.asked += 1
        out = np.full_like(logits, -np.inf)
        out[self.ids] = logits[self.ids]
        return out


def test_the_best_allowed_token_is_found_from_a_shortlist_as_from_the_whole_row():
    """masked_argmax checks the row's best tokens before its whole vocabulary: the same
    token as the masked row's argmax, whether the allowed ones rank high, low, or tie."""
    from localspec.decoding.grammar import masked_argmax

    rng = np.random.default_rng(0)
    n = 5000
    for trial in range(200):
        row = rng.standard_normal(n).astype(np.float32)
        if trial % 4 == 0:
            row = np.round(row, 1)  # many ties
        size = [1, 3, 50, 2500][trial % 4]
        state = Allowed(rng.choice(n, size, replace=False))
        expected = int(np.argmax(Allowed(state.ids).mask(row)))
        assert masked_argmax(state, row) == expected
    # where one of the best 64 is allowed, the vocabulary is not masked
    row = np.arange(n, dtype=np.float32)
    state = Allowed(np.array([n - 10, 3]))
    assert masked_argmax(state, row) == n - 10 and state.asked == 0
    # nor where one of the best 1024 is (the best allowed of a JSON answer's rows ranked
    # up to ~800 where none of the best 64 was)
    state = Allowed(np.array([n - 800, 3]))
    assert masked_argmax(state, row) == n - 800 and state.asked == 0
    state = Allowed(np.array([3, 7]))
    assert masked_argmax(state, row) == 7 and state.asked == 1
    # ties with the last of a shortlist are in it: the lowest id of the best allowed
    row = np.zeros(n, dtype=np.float32)
    row[[10, 20]] = 1.0
    state = Allowed(np.array([4000, 5]))
    assert masked_argmax(state, row) == 5 and state.asked == 0


def test_the_constrained_law_is_computed_from_a_shortlist_exactly_as_from_the_whole_row():
    """masked_probs gives logits_to_probs(state.mask(row)) for every sampler setting,
    allowed set and row shape, and masks the whole row only where the shortlist cannot
    decide: the law of sampled constrained decoding is unchanged, its cost is not."""
    from localspec.decoding.grammar import masked_probs

    rng = np.random.default_rng(0)
    n, history = 5000, [5, 9, 4000]
    settings = [
        SamplingParams(temperature=1.0, top_k=40, top_p=1.0, min_p=0.05),  # OpenAI's defaults
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=2.0, top_k=0, top_p=0.9, min_p=0.1),
        SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
        SamplingParams(temperature=0.5, top_k=10, top_p=0.5, repeat_penalty=1.3),
    ]
    shortlisted = 0
    for trial in range(400):
        params = settings[trial % len(settings)]
        row = (rng.standard_normal(n) * [1, 4][trial % 2]).astype(np.float32)
        size = [1, 3, 50, 2500][trial // 5 % 4]
        state = Allowed(rng.choice(n, size, replace=False))
        if trial % 3 == 0:  # the allowed ones among the best, as at a forced spot
            row[state.ids] += 8.0
        expected = logits_to_probs(Allowed(state.ids).mask(row), params, history)
        got = masked_probs(state, row, params, history)
        assert np.allclose(got, expected, rtol=1e-9, atol=1e-12), (trial, params)
        shortlisted += state.asked == 0
    # whole-row masks where the shortlist cannot decide: neither top-k nor min-p, or
    # the allowed tokens ranking low (random rows: unlike a model's under its grammar)
    assert shortlisted >= 100, shortlisted
    # a forced spot under OpenAI's defaults: one allowed token well ahead, no whole mask
    row = rng.standard_normal(n).astype(np.float32)
    state = Allowed(np.array([17]))
    row[17] = 9.0
    assert masked_probs(state, row, settings[0], [])[17] == 1.0 and state.asked == 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_draft_model_drafts_within_the_grammar(temperature: float):
    """A draft token the grammar refuses is a sure rejection: under a grammar the draft
    model drafts what it allows (greedy and sampled; the sampled q is the law it drew
    from, which the chi-square test above holds the answers to)."""
    draft = DraftModel(ToyModel(markov(V, seed=2), n_vocab=V), p_min=0.0)
    params = SamplingParams(temperature=temperature, seed=1)
    rng = np.random.default_rng(1)
    context = [3, 1, 4, 1, 5]
    state = Parity()
    for t in context:
        state.accept(t)
    free = draft.draft(list(context), 12, params, rng)
    within = draft.draft(list(context), 12, params, rng, grammar=state.clone())
    start = state.state
    assert not follows_from(start, free.tokens)  # this draft model strays, unconstrained
    assert len(within.tokens) == 12 and follows_from(start, within.tokens)
    if temperature:
        for q, x in zip(within.q, within.tokens, strict=True):
            assert q is not None and q[x] > 0 and q[0] == 0.0  # never a refused token


def follows_from(state: int, tokens) -> bool:
    here = Parity(state)
    for t in tokens:
        if not here.allows(t):
            return False
        here.accept(t)
    return True


def test_the_round_drafts_as_much_of_the_forced_text_as_the_drafter_keeps():
    """A drafter may keep only part of the grammar's forced tokens (`Draft.lead`: a
    sampled answer's forced split is a bet); the pass then holds that part, no more."""
    from localspec.decoding.drafters import Draft, Outcome

    class Always:
        """Allows every token, and forces `xyz` after each."""

        def allows(self, token: int) -> bool:
            return True

        def allowed(self, tokens: np.ndarray) -> np.ndarray:
            return np.ones(len(tokens), dtype=bool)

        def mask(self, logits: np.ndarray) -> np.ndarray:
            return logits.copy()

        def accept(self, token: int) -> None:
            pass

        def clone(self) -> Always:
            return self

        def forced_text(self, limit: int) -> bytes:
            return b"xyz"[:limit]

        def forced_tokens(self, limit: int) -> list[int]:
            return []

        free = False

    class Keeps(NoDrafter):
        def __init__(self, keep: int | None) -> None:
            self.keep = keep
            self.told: int | None = None  # forced tokens before its draft this round
            self.rounds: list[tuple[int, int]] = []  # (told, in the pass), where asked

        def draft(self, context, gamma, params, rng, *, forced=0, grammar=None) -> Draft:
            self.told = forced
            return Draft(lead=self.keep)

        def accept(self, tokens, outcome: Outcome) -> None:
            if self.told is not None:  # (a lead that fills the round asks no drafter)
                self.rounds.append((self.told, outcome.forced))
            self.told = None

    class AlwaysGrammar:
        def start(self) -> Always:
            return Always()

        def within(self, other: object) -> bool:
            return other is self

    target = ToyModel(markov(258, seed=1), name="target")
    config = GenerationConfig(8, SamplingParams(temperature=1.0, seed=0), grammar=AlwaysGrammar())
    for keep in (None, 1, 0):
        drafter = Keeps(keep)
        done = list(Engine(target, drafter, 4).generate([5, 6], config))[-1]
        assert (2, 2 if keep is None else keep) in drafter.rounds  # x y (z may merge)
        assert all(kept == (told if keep is None else keep) for told, kept in drafter.rounds)
        assert done.stats.drafted >= sum(kept for _, kept in drafter.rounds)


class Chain:
    """Anything but 0 next, except that 2 is always followed by 5 and then 6 (forced)."""

    def __init__(self, pending: tuple[int, ...] = ()) -> None:
        self.pending = pending

    def allows(self, token: int) -> bool:
        return token == self.pending[0] if self.pending else token != 0

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        return np.array([self.allows(int(t)) for t in tokens], dtype=bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        return np.where(self.allowed(np.arange(len(logits))), logits, -np.inf)

    def accept(self, token: int) -> None:
        assert self.allows(token), (self.pending, token)
        self.pending = self.pending[1:] if self.pending else ((5, 6) if token == 2 else ())

    def clone(self) -> Chain:
        return Chain(self.pending)

    def forced_text(self, limit: int) -> bytes:
        return b""

    def forced_tokens(self, limit: int) -> list[int]:
        return list(self.pending[:limit])

    free = False


class ChainGrammar:
    def start(self) -> Chain:
        return Chain()

    def within(self, other: object) -> bool:
        return isinstance(other, ChainGrammar)


class Counted(ToyModel):
    """A toy model that counts its passes."""

    passes = 0

    def evaluate(self, tokens, n_logits, checkpoint=False, marks=()):  # type: ignore[no-untyped-def]
        self.passes += 1
        return super().evaluate(tokens, n_logits, checkpoint, marks)


def test_the_draft_model_jumps_over_what_the_grammar_forces_mid_draft():
    """Where the grammar forces tokens within a draft (a JSON answer's `", "key": "`
    after a string), the draft model drafts them without a step each: certain (q one-hot),
    read with its next step. Greedy output stays constrained plain decoding's."""
    model = Counted(markov(V, seed=2), n_vocab=V)
    draft = DraftModel(model, p_min=0.0)
    context = [3, 1, 4, 1, 5]
    state = Chain()
    for t in context:
        state.accept(t)
    drafted = draft.draft(
        list(context), 12, SamplingParams(temperature=0), np.random.default_rng(0), grammar=state
    )
    tokens = drafted.tokens
    jumped = [i for i, t in enumerate(tokens[:-2]) if t == 2]
    assert jumped, tokens  # the draft model's favourites go through 2 here
    for i in jumped:
        assert tokens[i + 1 : i + 3] == [5, 6] and drafted.q[i + 1 : i + 3] == [None, None]
    assert len(tokens) == 12 and model.passes == 12 - 2 * len(jumped), (tokens, model.passes)


@pytest.mark.parametrize("gamma", [3, 6])
def test_greedy_with_jumps_within_drafts_equals_constrained_plain_decoding(gamma: int, monkeypatch):
    import localspec.decoding.drafters as drafters

    jump_forward, jumps = drafters.jump_forward, []

    def counted(*args):  # each jump the draft model takes, counted
        jumps.append(jump_forward(*args))
        return jumps[-1]

    monkeypatch.setattr(drafters, "jump_forward", counted)
    target = ToyModel(markov(V, seed=7), n_vocab=V, name="target")
    config = GenerationConfig(40, SamplingParams(temperature=0), grammar=ChainGrammar())
    prompt = [3, 1, 4, 1, 5, 3, 1, 4, 1, 5, 3]
    plain = list(Engine(target, NoDrafter(), 0).generate(prompt, config))[-1]
    assert plain.tokens.count(2) > 3  # the grammar forces tokens all through this answer
    drafter = DraftModel(ToyModel(markov(V, seed=2), n_vocab=V), p_min=0.0)
    spec = list(Engine(target, drafter, gamma).generate(prompt, config))[-1]
    assert spec.tokens == plain.tokens and spec.stats.drafted > 0
    assert any(jumps)  # the draft model went through 2 and jumped over 5, 6
