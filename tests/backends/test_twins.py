"""The models people run now, without their weights: scripts/make_twin_gguf.py's random
twins of Qwen3.5-0.8B (hybrid: Gated DeltaNet + attention, one MTP head),
Qwen3-Coder-30B-A3B (MoE, 128 experts) and Gemma 4 12B (sliding-window and full
attention, with its "assistant" drafter of four blocks), at fewer layers, loaded by the
real llama.cpp.

Random weights make every drafter wrong, so the tests draft with an oracle too (plain
decoding's own tokens with one wrong in each round): rejections of every length, so
every rollback of the recurrent state is exercised. The vocabulary comes from the real
Qwen2.5-Coder 0.5B GGUF (tokenizer keys only): these are `real` tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import load_script
from test_tiny_gguf import vocab_reader

from localspec.backends.base import shared_prefix
from localspec.decoding.adaptive import AdaptiveDrafter, auto_engine
from localspec.decoding.drafters import Draft, DraftModel, MtpDrafter, NgramDrafter, NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished, Piece
from localspec.decoding.sampling import SamplingParams

pytestmark = pytest.mark.real

GAMMA = 4


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The hybrid twin at 4 layers (3 DeltaNet, 1 attention, + the MTP head), the MoE
    twin at 2, a 1-layer qwen2 draft for each vocabulary, a hybrid draft, and the Gemma 4
    twin at 2 layers with its assistant."""

    twin, tiny = load_script("make_twin_gguf"), load_script("make_tiny_gguf")
    out = tmp_path_factory.mktemp("twins")
    vocab = vocab_reader()
    hybrid_vocab = twin.Hybrid().n_vocab
    draft = replace(tiny.DRAFT, n_layer=1)
    return {
        "hybrid": twin.build("hybrid", vocab, out, layers=4),
        "moe": twin.build("moe", vocab, out, layers=2),
        "hybrid-draft": tiny.build(replace(draft, n_vocab=hybrid_vocab), vocab, out / "d1.gguf"),
        "moe-draft": tiny.build(draft, vocab, out / "d2.gguf"),
        # a hybrid draft model: another twin, other weights
        "hybrid-hybrid-draft": twin.build("hybrid", vocab, out / "other", layers=4, seed=1),
        # one sliding-window and one full-attention layer: what the assistant reads
        "gemma4": twin.build("gemma4", vocab, out, layers=2),
        "gemma4-assistant": twin.build("gemma4-assistant", vocab, out, layers=None),
    }


def load(path: Path, **options):
    from localspec.backends.llama import LlamaModel, LoadOptions

    return LlamaModel(path, LoadOptions(**{"n_ctx": 512, "n_threads": 2, **options}))


class Oracle:
    """Drafts the plain answer's next γ tokens with one of them wrong: the i-th round's
    mistake sits at position i mod (γ + 1), so every accepted length 0..γ comes up."""

    name = "oracle"
    busy_s = 0.0
    n_ctx = 1 << 30

    def __init__(self, prompt_len: int, answer: Sequence[int], n_vocab: int) -> None:
        self.at, self.answer, self.n_vocab, self.rounds = prompt_len, list(answer), n_vocab, 0

    def draft(self, context, gamma, params, rng, *, forced=0, grammar=None) -> Draft:
        done = len(context) - self.at
        tokens = self.answer[done : done + gamma]
        wrong = self.rounds % (gamma + 1)
        if wrong < len(tokens):
            tokens[wrong] = (tokens[wrong] + 1) % self.n_vocab
        self.rounds += 1
        return Draft(tokens, [None] * len(tokens))

    def accept(self, tokens, outcome) -> None:
        pass


def plain_answer(model, prompt: list[int], n: int) -> tuple[Finished, list[Piece]]:
    model.reset()
    events = list(Engine(model, NoDrafter(), 0).generate(prompt, GenerationConfig(n, trace=True)))
    model.reset()
    done = events[-1]
    assert isinstance(done, Finished)
    return done, [e for e in events if isinstance(e, Piece)]


def assert_plain(got: Sequence[int], want: Sequence[int], pieces: list[Piece]) -> None:
    """Equal, or different only from a numerical near-tie on (batched and one-token
    passes differ in the last bits)."""
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            assert pieces[i].margin is not None and pieces[i].margin < 1.0, (i, pieces[i])
            assert a == pieces[i].runner_up
            return
    assert list(got) == list(want)


# --- the hybrid twin: its state rolls back through llama.cpp's snapshots --------------
def test_the_hybrid_twin_is_what_it_claims(twins) -> None:
    import llama_cpp as ll

    model = load(twins["hybrid"], rollback=GAMMA)
    try:
        assert model.metadata("general.architecture") == "qwen35"
        assert ll.llama_model_is_hybrid(model._model)
        assert model.n_vocab == 248_320
        assert model.can_cut and model.cut_depth == GAMMA
        assert ll.llama_model_n_layer_nextn(model._model) == 1
    finally:
        model.close()
    plain = load(twins["hybrid"])  # no snapshots asked for: it cannot drop a draft
    try:
        assert not plain.can_cut and plain.cut_depth == 0
    finally:
        plain.close()


def test_a_rejected_draft_rolls_the_recurrent_state_back_exactly(twins) -> None:
    model, fresh = load(twins["hybrid"], rollback=GAMMA), load(twins["hybrid"])
    try:
        prompt = model.tokenize("def fib(n):\n    return")
        model.evaluate(prompt, 1)
        for drop in range(1, GAMMA + 1):  # a verify pass of γ+1 tokens, `drop` rejected
            model.evaluate([*prompt, 11, 22, 33, 44, 55], GAMMA + 1)
            keep = [*prompt, 11, 22, 33, 44, 55][: len(prompt) + GAMMA + 1 - drop]
            restarts = model.restarts
            model.rollback(keep)
            assert model.restarts == restarts and model.kv_len() == len(keep)
            got = model.evaluate([*keep, 77], 1)
            fresh.reset()
            assert np.allclose(got, fresh.evaluate([*keep, 77], 1), atol=1e-3)
            model.rollback(prompt)  # back to the prompt: past the last pass, so it re-reads
    finally:
        model.close()
        fresh.close()


def test_timing_a_hybrids_passes_re_reads_nothing(twins) -> None:
    """T(k) of a hybrid (the bench, scripts/gpu_twins.py) rolls each timed pass back to a
    copy of the state, as a rejected draft is: a re-read would time the prefix too."""
    from localspec.bench.costs import time_pass

    model = load(twins["hybrid"], rollback=GAMMA)
    try:
        prefix = model.tokenize("def fib(n):\n    return n if n < 2 else fib(n - 1)")
        for k in (1, GAMMA + 1):
            time_pass(model, prefix, k, reps=2)
        assert model.restarts == 0 and model.cached == prefix
    finally:
        model.close()


def test_a_cut_past_the_last_pass_re_reads_instead_of_using_a_stale_snapshot(twins) -> None:
    """llama.cpp accepts a rollback to a token of an earlier pass and reads a snapshot
    that does not hold it; the backend refuses that cut and re-reads."""
    model, fresh = load(twins["hybrid"], rollback=GAMMA), load(twins["hybrid"])
    try:
        prompt = model.tokenize("one two three")
        for extra in ([5], [5, 6], [5, 6, 7]):  # three one-token passes
            model.evaluate([*prompt, *extra], 1)
        got = model.evaluate([*prompt, 5, 9], 1)  # drops 6 and 7: two passes back
        assert model.restarts == 1
        assert np.allclose(got, fresh.evaluate([*prompt, 5, 9], 1), atol=1e-3)
    finally:
        model.close()
        fresh.close()


def assert_plain_text(got: str, pieces: list[Piece]) -> None:
    """An answer's text equal to plain decoding's `pieces`, or parting from it at a token
    that was a numerical near-tie (assert_plain, for a server's text)."""
    at = 0
    for piece in pieces:
        if not got.startswith(piece.text, at):
            assert piece.margin is not None and piece.margin < 1.0, (got, piece)
            return
        at += len(piece.text)
    assert got == "".join(p.text for p in pieces)


def next_turn(model, prompt: list[int], answer: Sequence[int]) -> list[int]:
    """The next turn's prompt as a thinking model's template writes it: the history
    drops the reasoning that followed the last prompt's assistant header, so the new
    prompt parts from the old one 2 tokens before its end."""
    return [*prompt[:-2], *answer, *model.tokenize(" and then?", special=False)]


def test_a_hybrids_next_turn_reads_on_from_a_checkpoint_before_the_last_prompts_end(
    twins,
) -> None:
    """A recurrent state cannot drop the last answer, so a next turn that parts from
    the text before it used to read the whole conversation again. The prompt's read
    keeps a lasting checkpoint 4 tokens before its end (llama-server's), and the next
    turn reads on from there; its answer is plain decoding's."""
    from localspec.backends.base import CHECKPOINT_TAIL

    model, alone = load(twins["hybrid"], rollback=GAMMA), load(twins["hybrid"])
    try:
        engine = Engine(model, NgramDrafter(), GAMMA)
        prompt = model.tokenize("def fibonacci(n):\n    if n < 2:\n        return n\n" * 4)
        first = list(engine.generate(prompt, GenerationConfig(12)))[-1]
        assert isinstance(first, Finished)
        for _ in range(2):  # the second turn from the first's checkpoint, the third from its own
            last, prompt = prompt, next_turn(model, prompt, first.tokens)
            read = model.decoded
            list(engine.generate(prompt, GenerationConfig(0)))  # the prompt only
            assert model.decoded - read == len(prompt) - (len(last) - CHECKPOINT_TAIL)
            first = list(engine.generate(prompt, GenerationConfig(12)))[-1]
            assert isinstance(first, Finished)
            assert model.restarts == 0
            want, pieces = plain_answer(alone, prompt, 12)
            assert_plain(first.tokens, want.tokens, pieces)
    finally:
        model.close()
        alone.close()


def test_a_hybrid_draft_models_catch_up_within_an_answer_keeps_no_lasting_copy(twins) -> None:
    """A draft model that sat rounds out (`auto` drafting otherwise) catches up within
    the answer: that read is no prompt's, and its copies would push the prompt's out.
    The next turn, parting from the prompt before its end, reads on from the prompt's."""
    from localspec.backends.base import CHECKPOINT_TAIL
    from localspec.decoding.drafters import Outcome

    model = load(twins["hybrid-hybrid-draft"], rollback=GAMMA)
    try:
        drafter, greedy = DraftModel(model, p_min=0.0), SamplingParams()
        rng = np.random.default_rng(0)
        prompt = model.tokenize("def fibonacci(n):\n    return n\n" * 4)
        sat_out = model.tokenize(" one two three four five six seven eight" * 3)[:20]
        text = list(prompt)
        drafter.draft(text, GAMMA, greedy, rng)  # the prompt's read
        drafter.accept(text, Outcome(GAMMA, 0, 0.0))
        for _ in range(2):  # twenty rounds without it, then a catch-up and a draft
            for token in sat_out:
                text.append(token)
                drafter.accept(text, Outcome(0, 0, 0.0))
            drafter.draft(text, GAMMA, greedy, rng)
            drafter.accept(text, Outcome(GAMMA, 0, 0.0))
        lasting = [k.pos for k in model._checkpoints.by_seq[0] if k.lasting]
        assert lasting == [len(prompt) - CHECKPOINT_TAIL]
        nxt = [*prompt[:-2], *sat_out[:5], *prompt[:20]]
        drafter.draft(nxt, 1, greedy, rng)
        assert model.restarts == 0
        assert model.cached[: len(nxt)] == nxt
    finally:
        model.close()


def test_a_hybrids_checkpoints_are_the_earliest_and_latest_and_the_last_draft_round(
    twins,
) -> None:
    """What the backend keeps of a sequence's state (each copy costs its size in RAM):
    a round's copy replaces the last round's; of the lasting ones, the earliest in the
    text (a system prompt's end), those at the reading prompt's message starts and the
    latest stay; a cut forgets those past it, and a return comes back to the latest at
    or before the cut, its state a fresh read's."""
    from localspec.backends.gguf import gguf_info
    from localspec.drafting import LASTING_CHECKPOINTS
    from localspec.models.memory import Weights

    model, fresh = load(twins["hybrid"], rollback=GAMMA), load(twins["hybrid"])
    try:
        text = model.tokenize("one two three four five six seven eight nine ten " * 3)
        assert len(text) > 26 and LASTING_CHECKPOINTS == 4

        def kept() -> list[tuple[int, bool]]:
            return sorted((k.pos, k.lasting) for k in model._checkpoints.by_seq[0])

        ends = ((5, True), (8, False), (11, True), (14, False), (17, True), (20, True), (23, True))
        for end, lasting in ends:
            model.evaluate(text[:end], 1)
            model.checkpoint(lasting)
        assert kept() == [(5, True), (14, False), (17, True), (20, True), (23, True)]
        model.evaluate(text[:26], 1)
        model.checkpoint()
        assert kept() == [(5, True), (17, True), (20, True), (23, True), (26, False)]
        assert model.remove_from(0, 26 - 2)  # a snapshot takes back 2 of the last pass
        assert kept() == [(5, True), (17, True), (20, True), (23, True)]
        model.rollback(text[:19])  # past every snapshot: back to 17
        assert model.cached == text[:17] and model.restarts == 0
        got = model.evaluate([*text[:17], 7, 8], 1)
        assert np.allclose(got, fresh.evaluate([*text[:17], 7, 8], 1), atol=1e-3)
        model.rollback(text[:12])
        assert model.cached == text[:5] and kept() == [(5, True)]
        # a prompt's message starts (`held`) stay while its read makes new copies
        for end in (8, 11, 14):
            model.evaluate(text[:end], 1)
            model.checkpoint(lasting=True)
        model.evaluate(text[:17], 1)
        model.checkpoint(lasting=True, held=(8,))
        assert [pos for pos, _ in kept()] == [5, 8, 14, 17]  # 11 went, not 8
        # the planner counts them in RAM, each the size of llama.cpp's copy
        weights = Weights.from_gguf(gguf_info(twins["hybrid"]))
        copy = len(model._checkpoints.by_seq[0][0].state)
        assert abs(weights.kept - (1 + LASTING_CHECKPOINTS) * copy) < 0.01 * weights.kept
    finally:
        model.close()
        fresh.close()


@pytest.mark.parametrize(
    ("kind", "drafter"),
    # the MoE twin, like Qwen3-Coder-30B-A3B, has no MTP head
    [
        *((k, d) for k in ("hybrid", "moe") for d in ("oracle", "ngram", "draft")),
        ("hybrid", "mtp"),
        ("hybrid", "auto"),  # the MTP head and the free sources, as `auto` picks them
    ],
)
def test_greedy_speculation_on_the_twins_is_plain_decoding(twins, kind: str, drafter: str) -> None:
    from localspec.backends.mtp import MtpHead

    with_head = drafter in ("mtp", "auto")
    target = load(twins[kind], rollback=GAMMA, mtp=with_head)
    draft = load(twins[f"{kind}-draft"]) if drafter == "draft" else None
    head = MtpHead(target) if with_head else None
    try:
        prompt = target.tokenize("def fibonacci(n):\n    if n < 2:\n        return n\n")
        want, pieces = plain_answer(target, prompt, 32)
        made = {
            "oracle": lambda: Oracle(len(prompt), want.tokens, target.n_vocab),
            "ngram": NgramDrafter,
            "draft": lambda: DraftModel(draft, p_min=0.0),
            "mtp": lambda: MtpDrafter(head, p_min=0.0),
            "auto": lambda: AdaptiveDrafter(head=MtpDrafter(head)),
        }[drafter]()
        got = list(Engine(target, made, GAMMA).generate(prompt, GenerationConfig(32)))[-1]
        assert isinstance(got, Finished)
        assert_plain(got.tokens, want.tokens, pieces)
        assert target.restarts == 0  # every rejection rolled back in place
        if drafter in ("oracle", "mtp", "draft"):
            assert got.stats.drafted >= 16
        if drafter == "oracle":
            assert 0 < got.stats.accepted < got.stats.drafted
    finally:
        if head is not None:
            head.close()
        target.close()
        if draft is not None:
            draft.close()


# --- the MTP head ------------------------------------------------------------------
def test_the_mtp_heads_time_lasts_until_its_logits_are_ready(twins, monkeypatch) -> None:
    """On a GPU llama_process returns before the pass ends; reading its logits waits for
    it. The head's time must include that wait (an H200 run read c = 0.06 T(1) where the
    head cost about half a pass, and auto kept drafting with it). The wait is simulated
    here, where llama.cpp's CPU passes end before they return."""
    import time

    import localspec.backends.mtp as mtp

    target = load(twins["hybrid"], rollback=GAMMA, mtp=True)
    head = mtp.MtpHead(target)
    try:
        prompt = target.tokenize("import os\n")
        target.evaluate(prompt[:-1], 1)
        entries = head.catch_up(prompt)
        logits_ith = mtp.ll.llama_get_logits_ith

        def pass_still_running(ctx, i):
            time.sleep(0.05)
            return logits_ith(ctx, i)

        monkeypatch.setattr(mtp.ll, "llama_get_logits_ith", pass_still_running)
        before = head.busy_s
        head.step(entries)
        assert head.busy_s - before >= 0.05
    finally:
        head.close()
        target.close()


def test_the_mtp_heads_caches_after_rejections_equal_a_fresh_read(twins) -> None:
    """Two sequences (serve's slots) drafting with the head in turns, round by round:
    after rejected drafts, the head's next draft step in each sees what a head that reads
    that sequence's whole text at once sees: its cache of each followed the target's, the
    drafted entries (read with its own states) left it, and neither touched the other's."""
    from localspec.backends.mtp import MtpHead
    from localspec.server.batching import Batcher, SlotModel

    target = load(twins["hybrid"], rollback=GAMMA, mtp=True, n_seq=2, kv_unified=True)
    batcher = Batcher()  # one slot's calls run at once
    head = MtpHead(target)
    try:
        views = [SlotModel(target, seq, batcher) for seq in (0, 1)]
        prompts = [target.tokenize(t) for t in ("import os\nimport sys\n", "def f(x):\n")]
        answers = [
            Engine(view, MtpDrafter(head, p_min=0.0, seq=seq), GAMMA).generate(
                prompt, GenerationConfig(24)
            )
            for seq, (view, prompt) in enumerate(zip(views, prompts, strict=True))
        ]
        ends: list[Finished] = []
        for pair in itertools.zip_longest(*answers):  # an event of each in turn
            ends += [e for e in pair if isinstance(e, Finished)]
        assert len(ends) == 2 and all(e.stats.drafted > e.stats.accepted for e in ends)
        texts = [[*prompt, *end.tokens] for prompt, end in zip(prompts, ends, strict=True)]
        following = []
        for seq, (view, text) in enumerate(zip(views, texts, strict=True)):
            view.evaluate(text[:-1], 1)  # the target has read all but the last token
            entries = head.catch_up(text, seq)
            assert len(entries) < 5  # it had read almost all of it already
            following.append(head.step(entries, seq)[0].copy())
            head.settle(text, seq)

        head.close()
        head = MtpHead(target)  # a fresh head: reads each whole text in one catch-up
        for seq, (view, text) in enumerate(zip(views, texts, strict=True)):
            view.reset()
            view.evaluate(text[:-1], 1)
            entries = head.catch_up(text, seq)
            assert len(entries) == len(text)
            fresh, _ = head.step(entries, seq)
            assert np.allclose(following[seq], fresh, atol=1e-2), seq
    finally:
        batcher.stop()
        head.close()
        target.close()


@pytest.mark.parametrize("kind", ["hybrid", "gemma4"])
def test_one_pass_of_the_head_over_two_slots_gives_each_what_its_own_pass_does(
    twins, kind: str
) -> None:
    """serve's slots drafting at once step the head in one pass (`decode_parts`): each
    slot's logits and the head's state there equal those of a pass of its own, for the
    catch-up of the MTP head (parts of unequal lengths) and Gemma 4's assistant's step."""
    from localspec.backends.mtp import AssistantHead, MtpHead
    from localspec.server.batching import Batcher, SlotModel

    if kind == "hybrid":
        target = load(twins["hybrid"], rollback=GAMMA, mtp=True, n_seq=2, kv_unified=True)
    else:
        target = load(twins["gemma4"], n_seq=2, kv_unified=True)
    batcher = Batcher()
    views = [SlotModel(target, seq, batcher) for seq in (0, 1)]
    texts = [target.tokenize(t) for t in ("import os\nimport sys\n", "def f(x):\n")]

    def first_steps(together: bool) -> list[tuple[np.ndarray, np.ndarray]]:
        head = (
            MtpHead(target)
            if kind == "hybrid"
            else AssistantHead(target, twins[kind + "-assistant"])
        )
        try:
            for view, text in zip(views, texts, strict=True):
                view.reset()
                view.evaluate(text[:-1], 1)  # heard by the head: its rows of h
            parts = [head.part(head.catch_up(text, seq), seq) for seq, text in enumerate(texts)]
            assert kind != "hybrid" or len({len(p.tokens) for p in parts}) == 2
            if together:
                rows = head.decode_parts(parts)
            else:
                rows = [head.decode_parts([part])[0] for part in parts]
            return [head.split(row[0]) for row in rows]  # copies: the next pass overwrites
        finally:
            head.close()

    try:
        alone, together = first_steps(False), first_steps(True)
        for (logits, state), (logits_t, state_t) in zip(alone, together, strict=True):
            assert np.allclose(logits, logits_t, atol=1e-2)
            assert np.allclose(state, state_t, atol=1e-2)
        assert not np.allclose(alone[0][0], alone[1][0], atol=1e-2)  # two texts, two answers
    finally:
        batcher.stop()
        target.close()


def test_a_catch_up_of_several_tokens_hands_on_the_heads_state_at_the_last(twins) -> None:
    """The head's output state after a catch-up of several tokens (the accepted ones of
    the last round) is its state at the last one, the next draft step's input: as after
    reading all but the last, then the last alone. (It had been the first one's: llama.cpp
    keeps a pass's states of its scored tokens only unless asked for all, and a catch-up
    scores its last token only; the second drafted token on drafted from a wrong state.)"""
    from localspec.backends.mtp import MtpHead

    target = load(twins["hybrid"], rollback=GAMMA, mtp=True)
    text = target.tokenize("import os\nimport sys\n")
    results = []
    try:
        for split in (False, True):
            target.reset()
            head = MtpHead(target)
            try:
                target.evaluate(text[:-1], 1)  # heard by the head: its rows of h
                entries = head.catch_up(text)
                assert len(entries) > 2
                if split:
                    head.step(entries[:-1])
                    entries = entries[-1:]
                logits, state = head.step(entries)
                results.append((logits.copy(), state.copy()))
            finally:
                head.close()
    finally:
        target.close()
    (logits, state), (logits_split, state_split) = results
    assert np.allclose(logits, logits_split, atol=1e-2)
    assert np.allclose(state, state_split, atol=1e-2)


def test_the_head_drafts_after_a_prompt_longer_than_a_pass_holds(twins) -> None:
    """Its first catch-up after a long prompt reads the prompt's last positions in one
    pass of at most n_batch entries (it had asked for 513 of a pass of 512)."""
    from localspec.backends.mtp import MtpHead

    target = load(twins["hybrid"], n_ctx=1024, rollback=GAMMA, mtp=True)
    head = MtpHead(target)
    try:
        prompt = target.tokenize("x = [1, 2, 3]\n" * 60)
        assert len(prompt) > target.n_batch + 1
        assert head.unread(prompt) == target.n_batch
        engine = Engine(target, MtpDrafter(head, p_min=0.0), GAMMA)
        done = list(engine.generate(prompt, GenerationConfig(8)))[-1]
        assert isinstance(done, Finished) and done.stats.drafted > 0
    finally:
        head.close()
        target.close()


def test_a_draft_cut_short_by_a_client_that_left_forgets_that_slots_head_cache(twins) -> None:
    """A slot's head step waits for a shared pass; where its client leaves meanwhile, the
    head forgets that slot's cache (its entries are not known: the next catch-up reads the
    text again) and keeps the other slot's."""
    import threading

    import llama_cpp as ll

    from localspec.backends.base import Cancelled
    from localspec.backends.mtp import MtpHead
    from localspec.server.batching import Batcher, SlotHead, SlotModel

    target = load(twins["hybrid"], rollback=GAMMA, mtp=True, n_seq=2, kv_unified=True)
    batcher = Batcher()
    head = MtpHead(target)
    try:
        views = [SlotModel(target, seq, batcher) for seq in (0, 1)]
        drafters = [
            MtpDrafter(head, p_min=0.0, seq=seq, steps=SlotHead(head, view))
            for seq, view in enumerate(views)
        ]
        prompt = target.tokenize("import os\n")
        greedy, rng = SamplingParams(), np.random.default_rng(0)
        for view, drafter in zip(views, drafters, strict=True):
            view.evaluate(prompt[:-1], 1)  # as a round leaves it: all but the last token
            assert len(drafter.draft(prompt, GAMMA, greedy, rng).tokens) == GAMMA
        last = [ll.llama_memory_seq_pos_max(head._mem, seq) for seq in (0, 1)]
        assert last == [len(prompt) - 1] * 2  # the text, not the drafted tokens

        views[1].cancel = threading.Event()
        views[1].cancel.set()  # its client left
        with pytest.raises(Cancelled):
            drafters[1].draft([*prompt, prompt[0]], GAMMA, greedy, rng)
        assert set(head.caches) == {0}
        assert ll.llama_memory_seq_pos_max(head._mem, 1) == -1
        assert ll.llama_memory_seq_pos_max(head._mem, 0) == len(prompt) - 1
    finally:
        batcher.stop()
        head.close()
        target.close()


def test_a_sampled_mtp_draft_reports_the_law_it_was_drawn_from(twins) -> None:
    from localspec.backends.mtp import MtpHead

    target = load(twins["hybrid"], rollback=GAMMA, mtp=True)
    head = MtpHead(target)
    try:
        prompt = target.tokenize("Hello")
        target.evaluate(prompt[:-1], 1)
        sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
        drafted = MtpDrafter(head, p_min=0.0).draft(prompt, 3, sampling, np.random.default_rng(0))
        assert len(drafted.tokens) == 3
        for token, q in zip(drafted.tokens, drafted.q, strict=True):
            assert q is not None and q[token] > 0 and abs(float(q.sum()) - 1) < 1e-4
    finally:
        head.close()
        target.close()


# --- Gemma 4's assistant: a drafter over the target's own cache -------------------------
@pytest.mark.parametrize("drafter", ["assistant", "oracle", "auto"])
def test_greedy_speculation_on_the_gemma4_twin_is_plain_decoding(twins, drafter: str) -> None:
    from localspec.backends.mtp import AssistantHead

    target = load(twins["gemma4"])
    head = AssistantHead(target, twins["gemma4-assistant"])
    try:
        assert target.metadata("general.architecture") == "gemma4"
        prompt = target.tokenize("def fibonacci(n):\n    if n < 2:\n        return n\n")
        want, pieces = plain_answer(target, prompt, 32)
        assert len(set(want.tokens)) > 8  # varied text, not one token again and again
        made = {
            "assistant": lambda: MtpDrafter(head, p_min=0.0),
            "oracle": lambda: Oracle(len(prompt), want.tokens, target.n_vocab),
            "auto": lambda: AdaptiveDrafter(head=MtpDrafter(head)),
        }[drafter]()
        got = list(Engine(target, made, GAMMA).generate(prompt, GenerationConfig(32)))[-1]
        assert isinstance(got, Finished)
        assert_plain(got.tokens, want.tokens, pieces)
        if drafter != "auto":
            assert got.stats.drafted >= 16
    finally:
        head.close()
        target.close()


def test_the_assistant_sees_the_accepted_text_only(twins) -> None:
    """After rounds of rejected drafts, the assistant's first step sees what it sees over
    a target that read the text at once: the rejected tokens left the target's cache,
    which is the assistant's, and each step drafted in place without writing to it."""
    from localspec.backends.mtp import AssistantHead

    target, fresh = load(twins["gemma4"]), load(twins["gemma4"])
    heads = [AssistantHead(target, twins["gemma4-assistant"])]
    try:
        prompt = target.tokenize("import os\nimport sys\n")
        engine = Engine(target, MtpDrafter(heads[0], p_min=0.0), GAMMA)
        done = list(engine.generate(prompt, GenerationConfig(16)))[-1]
        assert isinstance(done, Finished) and done.stats.drafted > done.stats.accepted
        text = [*prompt, *done.tokens]
        target.evaluate(text[:-1], 1)  # reads the last accepted token, as a round would
        assert heads[0].unread(text) == 1
        following, state = heads[0].step(heads[0].catch_up(text))
        following = following.copy()

        heads.append(AssistantHead(fresh, twins["gemma4-assistant"]))
        fresh.evaluate(text[:-1], 1)
        again, state_again = heads[1].step(heads[1].catch_up(text))
        assert np.allclose(following, again, atol=1e-2)
        assert np.allclose(state, state_again, atol=1e-2)
    finally:
        for head in heads:
            head.close()
        target.close()
        fresh.close()


def test_a_session_drafts_with_the_gemma4_assistant_it_is_given(twins) -> None:
    """`--draft` naming an assistant's file loads it beside the target as its head (not
    as a draft model: it cannot run alone), as it is (no CPU copy); `run` names it."""
    from localspec.backends.gguf import gguf_info
    from localspec.backends.llama import LoadOptions
    from localspec.backends.mtp import AssistantHead
    from localspec.cli.run import models
    from localspec.server.worker import Worker
    from localspec.session import SessionConfig, open_session, with_cpu_draft

    load_options = LoadOptions(n_ctx=512, n_threads=2)
    assistant = str(twins["gemma4-assistant"])
    config = SessionConfig(str(twins["gemma4"]), draft=assistant, gamma=3, target_load=load_options)
    assert with_cpu_draft(config, print) == config
    session = open_session(config)
    try:
        assert isinstance(session.head, AssistantHead) and session.draft_model is None
        assert isinstance(session.engine.drafter, MtpDrafter)
        assert models(session)["draft"] == twins["gemma4-assistant"].stem
        prompt = session.target.tokenize("x = 1\n")
        done = list(session.engine.generate(prompt, GenerationConfig(12)))[-1]
        assert isinstance(done, Finished) and done.stats.drafted > 0
        # it keeps no cache of its own: serve's prompts kept in RAM come back whole
        assert Worker(session, cache_ram=1 << 28).prompt_cache is not None
    finally:
        session.close()
    assert gguf_info(twins["gemma4-assistant"]).kv_heads == 0  # none for the planner either


def test_serves_slots_each_draft_with_the_assistant_and_answer_as_plain_decoding(twins) -> None:
    """Every slot drafts with the assistant, which keeps no cache of its own, over its
    own sequence of the target's cache, their steps in shared passes of it; rounds that
    meet in one pass still answer as each would alone."""
    from server.test_slots_real import Loop

    from localspec.backends.llama import LoadOptions
    from localspec.server.worker import Worker
    from localspec.session import SessionConfig, open_session

    load_options = LoadOptions(n_ctx=512, n_threads=2, n_seq=2, kv_unified=True)
    assistant = str(twins["gemma4-assistant"])
    config = SessionConfig(str(twins["gemma4"]), draft=assistant, gamma=3, target_load=load_options)
    session, loop = open_session(config), Loop()
    worker = Worker(session, parallel=2)
    drafters = [slot.engine.drafter for slot in worker.slots]
    assert all(isinstance(d, MtpDrafter) and d.head is session.head for d in drafters)
    assert [d.seq for d in drafters] == [0, 1]
    worker.start()
    try:
        prompts = [session.target.tokenize(t) for t in ("import os\n", "def main():\n")]
        jobs = [loop.job(p, 20, f"slot {i}") for i, p in enumerate(prompts)]
        for job in jobs:
            worker.submit(job)
        ends = [loop.wait(job) for job in jobs]
        assert worker.batcher.log.shared > 0  # the rounds met in passes
        assert session.head is not None
        steps = [r for r in worker.batcher.log.recent if r.model == session.head.name]
        assert any(len(r.reads) == 2 for r in steps)  # both slots' steps in one pass
    finally:
        worker.stop()
        loop.close()
        session.close()
    plain = load(twins["gemma4"])
    try:
        for prompt, end in zip(prompts, ends, strict=True):
            assert isinstance(end, Finished), end
            assert end.stats.drafted >= 10  # with the assistant, in either slot
            want, pieces = plain_answer(plain, prompt, 20)
            assert_plain(end.tokens, want.tokens, pieces)
    finally:
        plain.close()


def test_an_assistant_for_another_model_is_refused_in_one_line(twins) -> None:
    from localspec.backends.base import ModelError
    from localspec.backends.mtp import AssistantHead

    target = load(twins["moe"])  # another architecture (llama.cpp would abort on it)
    try:
        with pytest.raises(ModelError, match="for a Gemma 4 model, not qwen3moe") as refused:
            AssistantHead(target, twins["gemma4-assistant"])
        assert "\n" not in str(refused.value)
    finally:
        target.close()


# --- sessions: what a user gets ------------------------------------------------------
def test_a_session_on_a_target_with_an_mtp_head_drafts_with_it(twins) -> None:
    from localspec.backends.llama import LoadOptions
    from localspec.cli.options import has_mtp_head
    from localspec.session import SessionConfig, open_session

    assert has_mtp_head(str(twins["hybrid"])) and not has_mtp_head(str(twins["moe"]))
    load_options = LoadOptions(n_ctx=512, n_threads=2)
    config = SessionConfig(str(twins["hybrid"]), draft="mtp", gamma=4, target_load=load_options)
    session = open_session(config)
    try:
        assert session.head is not None and session.notes == []
        assert isinstance(session.engine.drafter, MtpDrafter)
        assert session.target.cut_depth == 8  # GAMMA_MAX snapshots
        prompt = session.target.tokenize("x = 1\n")
        done = list(session.engine.generate(prompt, GenerationConfig(12)))[-1]
        assert isinstance(done, Finished) and done.stats.drafted > 0
    finally:
        session.close()


def test_a_hybrid_draft_model_comes_back_to_its_checkpoint_after_a_rejection(twins) -> None:
    """A hybrid draft model drafts a token a pass, so no snapshot takes a rejected draft
    back; it keeps its state from before its draft and comes back to it, re-reading the
    accepted tokens in one batch, never the whole text."""
    from localspec.backends.llama import LoadOptions
    from localspec.session import SessionConfig, open_session

    load_options = LoadOptions(n_ctx=512, n_threads=2)
    config = SessionConfig(
        str(twins["hybrid"]),
        draft=str(twins["hybrid-hybrid-draft"]),
        gamma=GAMMA,
        target_load=load_options,
        draft_load=load_options,
        draft_quant="keep",
        p_min=0.0,
    )
    session = open_session(config)
    alone = load(twins["hybrid"])
    try:
        assert session.notes == [] and isinstance(session.engine.drafter, DraftModel)
        prompt = session.target.tokenize("def f(x):\n")
        want, pieces = plain_answer(alone, prompt, 24)
        done = list(session.engine.generate(prompt, GenerationConfig(24)))[-1]
        assert isinstance(done, Finished)
        assert_plain(done.tokens, want.tokens, pieces)
        assert done.stats.drafted > done.stats.accepted  # rejections, which it came back from
        draft = session.draft_model
        assert draft is not None and draft.restarts == 0 and session.target.restarts == 0
    finally:
        alone.close()
        session.close()


# --- the MoE twin: experts placed where the planner says -----------------------------
def llama_log(path: Path, monkeypatch: pytest.MonkeyPatch, capsys, **options) -> str:
    """What llama.cpp logs while loading `path` (its own accounting of buffers)."""
    import localspec.backends.llama as llama

    monkeypatch.setattr(llama, "_SHOW_LOG", True)
    capsys.readouterr()
    load(path, **options).close()
    return capsys.readouterr().out


def test_the_moe_twin_keeps_the_experts_the_plan_names_in_ram(twins, monkeypatch, capsys) -> None:
    """--n-cpu-moe 1 as the planner sets it: llama.cpp overrides the buffer of exactly the
    first layer's routed experts, and their size is what the planner moved."""
    import re

    from localspec.backends.gguf import gguf_info
    from localspec.models.memory import Weights

    log = llama_log(twins["moe"], monkeypatch, capsys, cpu_moe=1)
    moved = re.findall(
        r"tensor (blk\.\d+\.\w+\.weight) \(([\d.]+) MiB \w+\) buffer type overridden", log
    )
    assert sorted(name for name, _ in moved) == [
        f"blk.0.ffn_{kind}_exps.weight" for kind in ("down", "gate", "up")
    ]
    weights = Weights.from_gguf(gguf_info(twins["moe"]))
    logged = sum(float(mib) for _, mib in moved) * 2**20
    assert abs(logged - weights.experts[0]) / weights.experts[0] < 0.05  # logged in whole MiB
    assert weights.experts[1] == weights.experts[0] and weights.expert_share == 8 / 128


def test_the_planners_accounting_matches_llama_cpps_for_the_moe_twin(
    twins, monkeypatch, capsys
) -> None:
    """The weights, the KV cache and the compute buffer as llama.cpp reports them (on a
    CPU; on a GPU, docs/gpu.md's split). Its model buffers count Q4_0 twice on a CPU (the
    file mapped, and the repacked copy its kernels read), so the file size stands in."""
    import re

    from localspec.backends.gguf import gguf_info
    from localspec.models.memory import Weights, compute_bytes

    log = llama_log(twins["moe"], monkeypatch, capsys, n_ctx=4096)

    def mib(pattern: str) -> float:
        found = re.search(pattern + r"\s*=\s*([\d.]+) MiB", log)
        assert found, pattern
        return float(found.group(1)) * 2**20

    weights = Weights.from_gguf(gguf_info(twins["moe"]))
    kv = 4096 * weights.kv_per_token_layer * len(weights.layers)
    assert abs(weights.total - mib(r"file size")) / weights.total < 0.01
    assert abs(kv - mib(r"CPU KV buffer size")) / kv < 0.05
    compute = compute_bytes(weights, 4096)
    assert 1.0 <= compute / mib(r"CPU compute buffer size") < 1.15  # never under


def test_auto_on_the_moe_twin_prices_passes_by_the_experts_they_read(twins) -> None:
    from localspec.session import verify_growth

    target, dense = load(twins["moe"]), load(twins["moe-draft"])
    try:
        growth = verify_growth(target)
        assert growth[0] == pytest.approx(1.0) and list(growth) == sorted(growth)
        assert growth[1] > 1.05  # two tokens: ~1.9x the experts of one
        assert verify_growth(dense) == ()
    finally:
        target.close()
        dense.close()


def test_a_moe_targets_draft_is_priced_by_the_experts_a_token_reads(twins) -> None:
    """c / T(1) before c is timed is the draft's bytes over the bytes a target's token
    reads: by file sizes a draft beside a MoE looked nearly free (auto tried it on every
    prompt of the 8-layer twin on this CPU, and paid the draft model's catch-up: 0.79x
    plain decoding; priced by what a token reads, 0.97x)."""
    from localspec.backends.gguf import gguf_info
    from localspec.models.memory import Weights

    target, dense = load(twins["moe"]), load(twins["moe-draft"])
    try:
        experts = sum(Weights.from_gguf(gguf_info(twins["moe"])).experts)
        unread = experts * (1 - 8 / 128)  # the twin's experts: 8 of 128 read per token
        assert target.read_bytes == pytest.approx(target.size_bytes - unread, rel=0.02)
        assert dense.read_bytes == dense.size_bytes
        drafter = auto_engine(target, dense).drafter
        assert drafter.cost_ratio == pytest.approx(dense.size_bytes / target.read_bytes)
    finally:
        target.close()
        dense.close()


def test_the_planner_counts_the_hybrids_state_and_its_snapshots_as_llama_cpp_does(
    twins, monkeypatch, capsys
) -> None:
    """A sequence's recurrent state and the GAMMA_MAX snapshots a drafting session asks
    for, for each sequence: what llama.cpp allocates ("RS buffer"), from the file or,
    before a download, the catalog."""
    import re

    from localspec.backends.gguf import gguf_info
    from localspec.drafting import GAMMA_MAX
    from localspec.models.memory import Weights, footprint

    weights = Weights.from_gguf(gguf_info(twins["hybrid"]))
    for seqs in (1, 4):  # serve's slots: a state each (memory.footprint's `seqs`)
        log = llama_log(twins["hybrid"], monkeypatch, capsys, rollback=GAMMA_MAX, n_seq=seqs)
        found = re.search(r"CPU RS buffer size\s*=\s*([\d.]+) MiB", log)
        assert found
        _, ram = footprint(weights, 512, 0, seqs=seqs)
        _, alone = footprint(replace(weights, state=0, kept=0), 512, 0, seqs=seqs)
        state = ram - alone - seqs * weights.kept
        assert abs(state / 2**20 - float(found.group(1))) < 0.01 * state / 2**20
    # before a download, the catalog's Qwen3.5-0.8B (whose shape the twin has) sizes
    # each of its 18 DeltaNet layers' state as the file does each of the twin's 3
    from localspec.models.catalog_file import default_catalog

    model = default_catalog().model("qwen3.5-0.8b")
    estimate = Weights.estimate(model, model.quant())
    assert estimate.state // 18 == weights.state // 3 and estimate.kept // 18 == weights.kept // 3


# --- serve's slots on the hybrid twin: each sequence's state rolls back on its own -----
def test_serve_slots_on_the_hybrid_twin_answer_as_plain_decoding(twins) -> None:
    """Two requests share llama.cpp's passes on a hybrid target, each slot drafting with
    the target's MTP head over its own sequence of the head's cache, their steps in shared
    passes of the head; each rollback restores its own sequence's state, so each answer
    is plain decoding's (on a model of its own)."""
    from server.test_slots_real import Loop

    from localspec.backends.llama import LoadOptions
    from localspec.server.worker import Worker
    from localspec.session import SessionConfig, open_session

    load_options = LoadOptions(n_ctx=512, n_threads=2, n_seq=2, kv_unified=True)
    config = SessionConfig(
        str(twins["hybrid"]), "mtp", GAMMA, load_options, load_options, p_min=0.0
    )
    session = open_session(config)
    worker, loop = Worker(session, max_queue=4, parallel=2), Loop()
    drafters = [slot.engine.drafter for slot in worker.slots]
    assert all(isinstance(d, MtpDrafter) and d.head is session.head for d in drafters)
    assert [d.seq for d in drafters] == [0, 1]
    worker.start()
    alone = load(twins["hybrid"])
    try:
        prompts = [session.target.tokenize(t) for t in ("def f(x):\n", "one two one two")]
        jobs = [loop.job(prompt, 24) for prompt in prompts]
        for job in jobs:
            worker.submit(job)
        ends = [loop.wait(job) for job in jobs]
        assert worker.batcher.log.shared > 5  # the rounds really met
        assert all(v.restarts == 0 for s in worker.slots for v in s.views)  # none re-read
        assert session.head is not None and set(session.head.caches) == {0, 1}
        steps = [r for r in worker.batcher.log.recent if r.model == session.head.name]
        assert any(len(r.reads) == 2 for r in steps)  # both slots' steps in one pass
        for prompt, end in zip(prompts, ends, strict=True):
            assert isinstance(end, Finished), end
            # the head drafts every round in either slot (p_min 0)
            assert end.stats.drafter == "mtp" and end.stats.drafted >= 10
            want, pieces = plain_answer(alone, prompt, 24)
            assert_plain(end.tokens, want.tokens, pieces)
    finally:
        worker.stop()
        loop.close()
        alone.close()
        session.close()


def answer(worker, loop, prompt: list[int], max_tokens: int) -> Finished:
    job = loop.job(prompt, max_tokens)
    worker.submit(job)
    end = loop.wait(job)
    assert isinstance(end, Finished), end
    return end


def assert_reads_on_from_the_checkpoint(
    worker, loop, view, alone, last, prompt, then: Callable[[], None] = lambda: None
) -> None:
    """The next turn `prompt` (after `last`) is read from the checkpoint 4 tokens before
    `last`'s end, by `view` (a slot's target), and answered as plain decoding answers it
    (`then` checks what it likes between the read and the answer)."""
    from localspec.backends.base import CHECKPOINT_TAIL

    read, job = view.decoded, loop.job(prompt, 0)  # the prompt only
    worker.submit(job)
    assert isinstance(loop.wait(job), Finished)
    assert view.decoded - read == len(prompt) - (len(last) - CHECKPOINT_TAIL)
    assert job.cached_tokens == len(last) - CHECKPOINT_TAIL  # what usage says it found
    then()
    end = answer(worker, loop, prompt, 12)
    want, pieces = plain_answer(alone, prompt, 12)
    assert_plain(end.tokens, want.tokens, pieces)


def test_a_conversations_next_turn_on_a_hybrid_slot_reads_on_from_its_checkpoint(twins) -> None:
    """Through serve's slots, with the target's MTP head and with a hybrid draft model:
    the next turn of a conversation (parting from the last prompt before its end) is
    read from the slot's checkpoint in the target and in the draft model, not again
    from the start, and its answer is plain decoding's."""
    from server.test_slots_real import Loop

    from localspec.backends.llama import LoadOptions
    from localspec.server.worker import Worker
    from localspec.session import SessionConfig, open_session

    load_options = LoadOptions(n_ctx=512, n_threads=2, n_seq=2, kv_unified=True)
    alone = load(twins["hybrid"])
    for draft in ("mtp", str(twins["hybrid-hybrid-draft"])):
        config = SessionConfig(
            str(twins["hybrid"]), draft, GAMMA, load_options, load_options, p_min=0.0
        )
        session = open_session(config)
        worker, loop = Worker(session, max_queue=4, parallel=2), Loop()
        worker.start()
        try:
            prompt = session.target.tokenize("def fibonacci(n):\n    return n\n" * 6)
            end = answer(worker, loop, prompt, 12)
            last, prompt = prompt, next_turn(session.target, prompt, end.tokens)
            slot = next(s for s in worker.slots if s.views[0].cached[: len(last)] == last)
            assert_reads_on_from_the_checkpoint(worker, loop, slot.views[0], alone, last, prompt)
            assert all(v.restarts == 0 for s in worker.slots for v in s.views), draft
        finally:
            worker.stop()
            loop.close()
            session.close()
    alone.close()


def test_a_hybrids_saved_cache_comes_back_with_its_checkpoints_not_its_snapshots(twins) -> None:
    """`--cache-ram` for a hybrid: the saved state carries its lasting checkpoints, and
    the snapshots left in llama.cpp (another text's by then) are never used for it."""
    from localspec.backends.base import CHECKPOINT_TAIL

    model, fresh = load(twins["hybrid"], rollback=GAMMA), load(twins["hybrid"])
    try:
        text = model.tokenize("one two three four five six seven eight nine ten " * 3)
        other = model.tokenize("SELECT name FROM users WHERE id = 1;" * 3)
        model.evaluate(text, 1, checkpoint=True)
        state = model.save_state()
        assert state is not None
        model.evaluate(other, 1)
        model.evaluate([*other, 1, 2, 3, 4, 5], GAMMA + 1)  # snapshots of this text
        assert model.load_state(text, state)
        model.rollback(text[:-2])  # within a snapshot's reach, had it been this text's
        assert model.cached == text[: len(text) - CHECKPOINT_TAIL] and model.restarts == 0
        got = model.evaluate([*text[:-2], 7], 1)
        assert np.allclose(got, fresh.evaluate([*text[:-2], 7], 1), atol=1e-3)
    finally:
        model.close()
        fresh.close()


@pytest.mark.parametrize("drafter", ["ngram", "mtp"])
def test_a_hybrid_conversation_whose_slot_went_to_another_comes_back_from_ram(
    twins, drafter: str
) -> None:
    """One slot, two conversations (`--cache-ram`): the first's cache goes to RAM with its
    checkpoints while the second takes the slot, and its next turn (parting from its
    last prompt before that prompt's end) loads it and reads on from the checkpoint: no
    restart, its answer plain decoding's. With the target's own MTP head, the head's
    cache and the trunk's rows it drafts from come back too: its next draft reads the new
    tokens only, as if the other conversation had never come."""
    from server.test_slots_real import Loop

    from localspec.backends.llama import LoadOptions
    from localspec.server.worker import Worker
    from localspec.session import SessionConfig, open_session

    load_options = LoadOptions(n_ctx=1024, n_threads=2)
    config = SessionConfig(
        str(twins["hybrid"]), drafter, GAMMA, load_options, load_options, p_min=0.0
    )
    session, alone = open_session(config), load(twins["hybrid"], n_ctx=1024)
    worker, loop = Worker(session, max_queue=4, parallel=1, cache_ram=1 << 30), Loop()
    worker.start()
    target, head = session.target, session.head
    try:
        first = target.tokenize("def fibonacci(n):\n    return n\n" * 40)
        end = answer(worker, loop, first, 12)
        drafted = None if head is None else (list(head.caches[0].tokens), dict(head._rows[0]))
        other = target.tokenize("SELECT name FROM users;\n" * 40)
        answer(worker, loop, other, 12)
        assert worker.prompt_cache is not None and worker.prompt_cache.entries()
        prompt = next_turn(target, first, end.tokens)

        def head_came_back() -> None:
            if head is None or drafted is None:
                return
            tokens, rows = drafted
            assert head.caches[0].tokens == tokens
            unread = len(prompt) - shared_prefix(tokens, prompt)
            assert head.unread(prompt) == unread < 30 < len(first)
            kept = head._rows[0]
            assert all(np.array_equal(kept[p], r) for p, r in rows.items() if p < len(first) - 4)

        if head is not None:
            assert head.caches[0].tokens[:8] == other[:8]  # the other's, meanwhile
        assert_reads_on_from_the_checkpoint(
            worker, loop, target, alone, first, prompt, head_came_back
        )
        assert target.restarts == 0
    finally:
        worker.stop()
        loop.close()
        session.close()
        alone.close()


def test_a_new_conversation_on_a_hybrid_reads_on_from_the_system_prompts_end(twins) -> None:
    """Through serve's chat endpoint on a hybrid target: a first read keeps a checkpoint
    where the first user message begins, so the next conversation with the same system
    prompt (an agent's next task, a new chat) reads its own messages only, and an edited
    last message reads from that message's start; `cached_tokens` says so, and the
    answers are plain decoding's."""
    from fastapi.testclient import TestClient

    from localspec.backends.llama import LoadOptions
    from localspec.server.app import ServerOptions, create_app
    from localspec.session import SessionConfig, open_session

    load_options = LoadOptions(n_ctx=1024, n_threads=2)
    config = SessionConfig(
        str(twins["hybrid"]), "ngram", GAMMA, load_options, load_options, p_min=0.0
    )
    session, alone = open_session(config), load(twins["hybrid"], n_ctx=1024)
    target = session.target
    system = {"role": "system", "content": "You review Python code. Be brief. " * 20}
    talks = [
        [system, {"role": "user", "content": "What does len([]) return?"}],
        [system, {"role": "user", "content": "Name a sorting algorithm."}],
        [
            system,
            {"role": "user", "content": "What does len([]) return?"},
            {"role": "assistant", "content": "0"},
            {"role": "user", "content": "And len('ab')?"},
        ],
        [
            system,
            {"role": "user", "content": "What does len([]) return?"},
            {"role": "assistant", "content": "0"},
            {"role": "user", "content": "And len('abc')?"},  # the last message edited
        ],
    ]
    try:
        with TestClient(create_app(session, ServerOptions("hybrid"))) as client:
            for i, messages in enumerate(talks):
                prompt = session.render(messages)
                marks = session.message_marks(messages, session.prompt_text(messages), prompt)
                body = {"messages": messages, "temperature": 0, "max_tokens": 8}
                reply = client.post("/v1/chat/completions", json=body).json()
                cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
                if i == 1:  # the system prompt, and the next message's header
                    assert cached == marks[0] > len(target.tokenize(system["content"]))
                if i == 3:  # up to the edited message
                    assert cached == marks[-1] > marks[0]
                assert target.restarts == 0
                _want, pieces = plain_answer(alone, prompt, 8)
                assert_plain_text(reply["choices"][0]["message"]["content"], pieces)
    finally:
        session.close()
        alone.close()


def test_an_agents_next_task_on_a_hybrid_reads_from_the_last_tasks_start(
    twins, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's task through serve on a hybrid target with Qwen3.5's chat format: its
    calls' reasoning, sent back, stays in the prompt while the task is in progress; the
    next message from the user drops it, so that prompt parts from the last one where
    the task's first call begins. The copy the task's own prompt kept (4 tokens before
    its end) survives the task's reads (they keep the copies at their own marks), so the
    next task reads from there, not from the conversation's first message; the answers
    are plain decoding's."""
    from fastapi.testclient import TestClient

    from localspec.backends.base import CHECKPOINT_TAIL
    from localspec.backends.llama import LoadOptions
    from localspec.server.app import ServerOptions, create_app
    from localspec.session import SessionConfig, open_session

    template = (Path(__file__).parent.parent / "data/templates/qwen3.5-wire.jinja").read_text()
    load_options = LoadOptions(n_ctx=1024, n_threads=2)
    config = SessionConfig(
        str(twins["hybrid"]), "ngram", GAMMA, load_options, load_options, p_min=0.0
    )
    session, alone = open_session(config), load(twins["hybrid"], n_ctx=1024)
    monkeypatch.setattr(session.target, "chat_template", lambda: template)

    def called(name: str, thought: str) -> dict:
        call = {"id": name, "type": "function", "function": {"name": name, "arguments": "{}"}}
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [call],
            "reasoning_content": thought,
        }

    def result(name: str, text: str) -> dict:
        return {"role": "tool", "tool_call_id": name, "content": text}

    talk = [
        {"role": "system", "content": "You fix Python code with the tools you have. " * 6},
        {"role": "user", "content": "Hi there, I need some help today."},
    ]
    steps = [
        [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Fix a.py."}],
        [
            called("read", "Read the file first."),
            result("read", "def f(x):\n    return x + 1\n" * 3),
        ],
        [called("edit", "Change the sum to a product."), result("edit", "a.py written: 6 lines")],
        [called("test", "Run the tests to be sure."), result("test", "3 passed in 0.01 s")],
        [
            {"role": "assistant", "content": "Fixed.", "reasoning_content": "All pass."},
            {"role": "user", "content": "Now add a docstring to f."},
        ],
    ]
    try:
        with TestClient(create_app(session, ServerOptions("hybrid"))) as client:
            for i in range(len(steps) + 1):
                messages = [*talk, *(m for step in steps[:i] for m in step)]
                prompt = session.render(messages)
                marks = session.message_marks(messages, session.prompt_text(messages), prompt)
                # the answer as written (the prompt opens a thought: all of it is one)
                body = {"messages": messages, "temperature": 0, "max_tokens": 8}
                reply = client.post(
                    "/v1/chat/completions", json={**body, "reasoning_format": "none"}
                ).json()
                cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
                if i == 1:  # "Fix a.py.": the read keeps a copy 4 tokens before its end
                    asked = len(prompt) - CHECKPOINT_TAIL
                if i == len(steps):  # the next task: the calls' reasoning is dropped
                    assert "Read the file first." not in session.prompt_text(messages)
                    assert cached == asked > marks[0]
                assert session.target.restarts == 0
                _want, pieces = plain_answer(alone, prompt, 8)
                assert reply["choices"][0]["message"]["content"]
                assert_plain_text(reply["choices"][0]["message"]["content"], pieces)
    finally:
        session.close()
        alone.close()


def test_the_chats_draft_model_setting_drafts_with_the_targets_mtp_head(twins) -> None:
    """In the chat, "draft model" is the target's own head where it has no other."""
    from localspec.backends.llama import LoadOptions
    from localspec.decoding.adaptive import AdaptiveDrafter
    from localspec.models.pairing import PairSpec
    from localspec.session import SessionConfig, open_session
    from localspec.settings import Settings
    from tui.pair import LoadedPair

    load_options = LoadOptions(n_ctx=512, n_threads=2)
    base = open_session(SessionConfig(str(twins["hybrid"]), "mtp", "auto", load_options))
    pair = LoadedPair(PairSpec(str(twins["hybrid"]), "mtp"), base)
    try:
        assert pair.has_draft_model and pair.drafter_for(Settings()) == "model"
        auto = pair.session_for(Settings()).engine.drafter
        assert isinstance(auto, AdaptiveDrafter) and isinstance(auto.model, MtpDrafter)
        fixed = pair.session_for(Settings(gamma=3)).engine.drafter
        assert isinstance(fixed, MtpDrafter) and fixed.head is base.head
    finally:
        pair.close()


def test_a_hybrids_embeddings_read_in_chunks_are_its_one_pass_ones(twins) -> None:
    """serve's /v1/embeddings on a hybrid target: its recurrent state goes on from chunk
    to chunk, as in one pass, and starts over for the next text."""
    from test_embedding_real import llama_cpps_mean, run

    from localspec.backends.embedding import Embedder

    model = load(twins["hybrid"], rollback=GAMMA)
    embedder = Embedder(model)
    try:
        text = list(range(100, 400))
        whole, again = run(embedder, [text, text], 64)
        assert float(whole @ llama_cpps_mean(model, text)) > 0.9999
        np.testing.assert_allclose(again, whole, atol=1e-6)
    finally:
        embedder.close()
        model.close()
