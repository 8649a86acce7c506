"""The suffix index on token lists: longest match, continuation by majority, history."""

from __future__ import annotations

import numpy as np

from localspec.backends.toy import ToyModel, scripted
from localspec.decoding.adaptive import AdaptiveDrafter, auto_engine
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished, RoundEnd
from localspec.decoding.suffix import (
    MAX_RUN,
    MIN_PROB,
    RETIRE_MIN,
    SEP,
    SuffixIndex,
    SuffixMatch,
    continuation,
    suffix_key,
)


def longest_run(corpus: list[int], tail: list[int], k_min: int = 2) -> int:
    """By brute force: the longest run of `tail`'s last tokens that ends in `corpus` before
    its last token (0 below k_min)."""
    best = 0
    for end in range(len(corpus) - 1):
        run = 0
        while run < min(len(tail), MAX_RUN, end + 1) and corpus[end - run] == tail[-1 - run]:
            run += 1
        best = max(best, run)
    return best if best >= k_min else 0


def test_the_longest_run_wins_over_the_latest_short_match():
    # "1 2 3 4" was followed by 5; later "9 3 4" by 7: the longer match decides
    context = [1, 2, 3, 4, 5, 6, 9, 3, 4, 7, 8, 1, 2, 3, 4]
    m = SuffixIndex().match(context, 3)
    assert (m.run, m.tokens) == (4, [5, 6, 9])


def test_the_run_found_is_the_longest_a_scan_finds_as_the_context_grows():
    rng = np.random.default_rng(1)
    context = rng.integers(0, 5, size=400).tolist()  # small alphabet: many repeats
    index = SuffixIndex()
    for end in range(1, len(context)):
        m = index.match(context[:end], 4)
        assert m.run == longest_run(context[:end], context[:end]), end
        assert len(m.tokens) <= 4


def test_the_continuation_is_what_most_runs_went_on_with():
    # "1 2" went on with 3 twice and with 9 once: 3, with a share of 2/3
    context = [1, 2, 3, 0, 1, 2, 9, 0, 1, 2, 3, 0, 5, 1, 2]
    m = SuffixIndex().match(context, 1)
    assert m.tokens == [3] and m.shares == [2 / 3]


def test_a_tie_goes_to_the_latest():
    context = [1, 2, 3, 0, 1, 2, 9, 0, 5, 1, 2]
    assert SuffixIndex().match(context, 1).tokens == [9]


def test_an_unsure_continuation_stops_the_draft():
    # after "1 2": 3, then 4, 5, 6 or 7 (a quarter each): the product falls below MIN_PROB
    context = [7, 1, 2, 3, 4, 8, 1, 2, 3, 5, 9, 1, 2, 3, 6, 0, 1, 2, 3, 7, 6, 1, 2]
    m = SuffixIndex().match(context, 4)
    assert (m.run, m.tokens, m.shares) == (2, [3], [1.0])


def test_a_single_run_drafts_to_the_end_of_its_text():
    context = [*range(10, 30), 7, *range(10, 20)]
    m = SuffixIndex().match(context, 16)
    assert m.run == 10 and m.tokens == [*range(20, 30), 7, *range(10, 15)]


def test_a_run_into_the_end_of_the_context_repeats_its_period():
    assert SuffixIndex().match([9, *[5] * 12], 6).tokens == [5] * 6  # not one a round
    m = SuffixIndex().match([9, *[1, 2, 3] * 4, 1, 2], 5)
    assert m.tokens == [3, 1, 2, 3, 1] and m.shares == [1.0] * 5
    # a document of the history ends where it ends: no text goes on after it there
    index = SuffixIndex()
    index.match([7, *range(40, 60)], 2)
    assert index.match([8, 9, *range(50, 58)], 6).tokens == [58, 59]


def test_empty_and_short_contexts_propose_nothing():
    index = SuffixIndex()
    assert index.match([], 4).tokens == []
    assert index.match([5], 4).tokens == []
    assert index.match([5, 6], 4).tokens == []
    assert index.match([5, 6, 5, 6], 0).tokens == []
    assert index.match([5, 6, 7, 8], 4).run == 0  # nothing repeats


def test_appended_tokens_are_found_at_once():
    index = SuffixIndex()
    text = [40, 41, 42, 43]
    assert index.match(text, 2).tokens == []
    text += [44, 45, 40, 41]
    assert index.match(text, 2).tokens == [42, 43]
    text += [42, 43, 44, 45, 99, 40, 41, 42, 43]
    m = index.match(text, 3)
    assert m.run == 4 and m.tokens == [44, 45, 99] and m.shares == [1, 1, 0.5]
    text += [44, 45]
    assert index.match(text, 1) == SuffixMatch(6, [99], [0.5])  # a tie: the latest


def test_a_new_request_keeps_the_old_tail_as_history():
    template = [1, 2, 3]
    answer = list(range(100, 100 + RETIRE_MIN + 4))
    index = SuffixIndex()
    index.match([*template, 50, *answer], 2)
    # another conversation: the same template, then text that repeats the old answer
    new = [*template, 60, 61, *answer[:6]]
    m = index.match(new, 3)
    assert m.run == 6 and m.tokens == answer[6:9]
    assert index.history.n > 0 and index.context.tokens == new


def test_the_context_outvotes_its_own_copy_in_the_history():
    old = list(range(100, 120))
    index = SuffixIndex()
    index.remember([*old, 7])  # an earlier answer went on with 7 ...
    # ... and the current context holds it too, now edited to go on with 8
    context = [*old, 8, 0, *old[-5:]]
    assert index.match(context, 1).tokens == [8]


def test_history_longer_runs_count():
    index = SuffixIndex()
    index.remember([*range(100, 120), 7])
    context = [5, 5, 105, 106, 107, 108, 109, 110]
    m = index.match(context, 2)
    assert m.run == 6 and m.tokens == [111, 112]


def test_the_history_keeps_its_latest_documents_within_its_budget():
    index = SuffixIndex(history_tokens=50)
    for start in range(0, 200, 20):
        index.remember(range(1000 + start, 1020 + start))
    assert index.history.n <= 50
    assert index.match([5, 1180, 1181], 2).tokens == [1182, 1183]  # the latest is kept
    assert index.match([5, 1000, 1001], 2).tokens == []  # the oldest is gone


def test_a_truncated_context_forgets_its_dropped_kgrams():
    index = SuffixIndex()
    index.match([1, 2, 3, 4, 1, 2, 3], 2)
    index.match([1, 2, 7], 2)  # another text, short tail: not kept as history
    assert index.match([1, 2, 7, 9, 1, 2], 1).tokens == [7]


def test_suffix_keys_bucket_run_lengths():
    assert [suffix_key(n) for n in (0, 2, 3, 4, 9, 16, 60)] == [
        "suffix2",
        "suffix2",
        "suffix2",
        "suffix4",
        "suffix8",
        "suffix16",
        "suffix16",
    ]


# --- as one of `auto`'s sources, on a scripted target --------------------------------

FUNCTION = "def mean(xs):\n" + "".join(f"    total_{i} = sum(xs) * {i}\n" for i in range(10))
HINTED = FUNCTION.replace("mean(xs)", "mean(xs: list[float]) -> float")
TURN1 = f"<|user|>write mean\n<|assistant|>{FUNCTION}<|user|>add type hints\n<|assistant|>"


def toy_target(reply: str) -> ToyModel:
    # passes cost booked time, extra tokens nearly free (as on a GPU): the policy decides
    # on these, not on the machine's load or the noise of a Python call's time
    return ToyModel(scripted(reply), n_vocab=258, pass_s=0.004, token_s=0.0001, sleep=False)


def run(engine: Engine, prompt: str) -> tuple[Finished, list[RoundEnd]]:
    events = list(engine.generate(list(prompt.encode()), GenerationConfig(max_tokens=400)))
    done = events[-1]
    assert isinstance(done, Finished)
    return done, [e for e in events if isinstance(e, RoundEnd)]


def without_suffix(engine: Engine) -> Engine:
    assert isinstance(engine.drafter, AdaptiveDrafter)
    engine.drafter.suffix = None
    return engine


def test_auto_drafts_an_edited_answer_deep_from_the_earlier_one_and_output_is_unchanged():
    target = toy_target(HINTED)
    plain, plain_rounds = run(without_suffix(auto_engine(target, None)), TURN1)
    done, rounds = run(auto_engine(target, None), TURN1)
    assert done.text == plain.text == HINTED
    by_suffix = [e for e in rounds if e.drafter == "suffix"]
    assert sum(e.accepted for e in by_suffix) > 0.7 * len(HINTED)
    assert max(e.drafted for e in by_suffix) > 8  # deeper than n-gram lookup may go
    assert len(rounds) < 0.7 * len(plain_rounds)


def test_a_new_conversation_drafts_from_an_earlier_one():
    target = toy_target(FUNCTION)
    engine = auto_engine(target, None)
    run(engine, "<|user|>write mean\n<|assistant|>")
    # another conversation, asking for the same: its prompt does not hold the answer
    done, rounds = run(engine, "<|user|>mean, again\n<|assistant|>")
    assert done.text == FUNCTION
    assert sum(e.accepted for e in rounds if e.drafter == "suffix") > 0.7 * len(FUNCTION)


def walk(rows: list[list[int]]) -> tuple[list[int], list[float]]:
    """The suffix-tree walk of `continuation`, column by column, by brute force."""
    tokens: list[int] = []
    shares: list[float] = []
    alive, prob = rows, 1.0
    for i in range(len(rows[0])):
        column = [row[i] for row in alive]
        counts = {x: column.count(x) for x in column if x != SEP}
        if not counts:
            break
        best = max(
            counts, key=lambda x: (counts[x], max(j for j, y in enumerate(column) if y == x))
        )
        prob *= counts[best] / len(alive)
        if prob < MIN_PROB:
            break
        tokens.append(best)
        shares.append(counts[best] / len(alive))
        alive = [row for row in alive if row[i] == best]
    return tokens, shares


def test_the_continuation_is_the_walk_a_suffix_tree_makes():
    rng = np.random.default_rng(3)
    for _ in range(500):
        n_rows, width = int(rng.integers(1, 9)), int(rng.integers(1, 8))
        rows = rng.integers(0, 3, size=(n_rows, width))
        rows[:, : rng.integers(0, width + 1)] = rows[-1, 0]  # often a shared beginning
        rows[rng.random(rows.shape) < 0.1] = SEP
        rows = np.where(np.cumprod(rows != SEP, axis=1).astype(bool), rows, SEP)
        assert continuation(rows) == walk(rows.tolist()), rows
