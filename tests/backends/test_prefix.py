"""The prefix checks each round makes of a cache or an index against the whole context."""

import random

import numpy as np
import pytest

from localspec.backends import base
from localspec.backends.base import Tokens, common_prefix, shared_prefix
from localspec.backends.toy import ToyModel


def brute_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def fresh(tokens: list[int]) -> list[int]:
    """Equal ints as other objects, as a chat re-tokenized for a new request has them."""
    return [int(str(t)) for t in tokens]


def test_common_and_shared_prefix_agree_with_a_scan() -> None:
    rng = random.Random(0)
    for _ in range(500):
        a = [rng.randrange(300, 200_000) for _ in range(rng.randrange(0, 300))]
        b = fresh(a[: rng.randrange(0, len(a) + 1)])
        if b and rng.random() < 0.5:
            b[rng.randrange(len(b))] += 1  # depart somewhere
        b += [rng.randrange(300, 200_000) for _ in range(rng.randrange(0, 40))]
        expected = brute_prefix(a, b)
        assert common_prefix(a, b) == expected
        stored = list(a)
        assert shared_prefix(stored, b) == expected
        assert stored == a  # the same values ...
        assert all(x is y for x, y in zip(stored[:expected], b, strict=False))  # ... b's objects


def test_a_reused_cache_takes_the_new_requests_objects_and_reads_nothing_again() -> None:
    vocab = 200_000  # ids past 256: CPython shares one object for each small int
    model = ToyModel(lambda ctx: np.zeros(vocab), n_vocab=vocab)
    rng = random.Random(1)
    prompt = [rng.randrange(1000, vocab) for _ in range(50)]
    model.evaluate(prompt, 1)
    decoded = model.decoded
    again = [*fresh(prompt), rng.randrange(1000, vocab)]
    model.evaluate(again, 1)
    assert model.decoded == decoded + 1  # the 50 tokens held were kept
    assert model.cached == again
    assert all(x is y for x, y in zip(model.cached, again, strict=True))


def change(rng: random.Random, t: Tokens, others: list[Tokens]) -> None:
    """One of the ways a list changes: appended to, cut, written into, followed, tried."""
    op = rng.randrange(11)
    if op == 0:
        t.append(rng.randrange(3))
    elif op == 1:
        t.extend(rng.choices(range(3), k=rng.randrange(4)))
    elif op == 2:
        del t[rng.randrange(-len(t) - 1, len(t) + 1) :]
    elif op == 3 and t:
        t[rng.randrange(-len(t), len(t))] = rng.randrange(3)
    elif op == 4 and t:
        t.pop(rng.randrange(-len(t), len(t)))
    elif op == 5:
        t.insert(rng.randrange(-3, len(t) + 3), rng.randrange(3))
    elif op == 6 and t:
        t[rng.randrange(len(t)) : rng.randrange(len(t) + 1)] = rng.choices(range(3), k=2)
    elif op == 7:
        t.follow(rng.choice(others))
    elif op == 8 and t:
        del t[rng.randrange(len(t))]
    elif op == 9 and len(t) > 1:
        t[::2] = [rng.randrange(3) for _ in t[::2]]
    elif op == 10:
        t.remove(t[0]) if t else t.clear()


def test_tokens_lists_find_their_common_prefix_from_where_they_last_agreed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever changed in between, the answer is a scan's; after appends alone only the
    new tokens are compared (a three-token alphabet makes chance agreements common)."""
    monkeypatch.setattr(base, "MEMO_FROM", 0)  # short lists are compared outright
    for log_max in (Tokens.LOG_MAX, 3):  # 3: agreements older than the log are forgotten
        monkeypatch.setattr(Tokens, "LOG_MAX", log_max)
        rng = random.Random(log_max)
        for _ in range(1000):
            lists = [Tokens(rng.choices(range(3), k=rng.randrange(12))) for _ in range(3)]
            for _ in range(40):
                a, b = rng.sample(lists, 2)
                change(rng, rng.choice(lists), lists)
                if rng.random() < 0.2:
                    with b.trying(rng.choices(range(3), k=2)):
                        assert shared_prefix(a, b) == brute_prefix(a, b)
                assert shared_prefix(a, b) == brute_prefix(a, b)


def test_after_appends_only_the_new_tokens_are_compared() -> None:
    context = Tokens(range(1000, 31_000))
    cache = Tokens()
    assert shared_prefix(cache, context) == 0
    cache.follow(context)
    context.extend([7, 8])
    assert cache.agreed(context) == 30_000  # known without a look at the 30,000
    assert shared_prefix(cache, context) == 30_000
    with context.trying([9]):
        cache.follow(context)
    del cache[-1]  # a rejected draft token goes
    context.append(5)
    assert cache.agreed(context) == 30_002  # the draft's cut, known from both logs
    assert shared_prefix(cache, context) == 30_002


def test_a_prompts_read_stops_at_the_marks_within_it_and_before_its_end() -> None:
    from localspec.backends.base import CHECKPOINT_FROM, CHECKPOINT_TAIL, checkpoint_stops

    end = 100
    tail = end - CHECKPOINT_TAIL
    assert checkpoint_stops(0, end, ()) == [tail]
    # marks read already, at the tail or past it go; the rest in order, once
    assert checkpoint_stops(30, end, (50, 10, 30, 50, 40, tail, 99)) == [40, 50, tail]
    short = end - CHECKPOINT_FROM + 1  # too short a read for the tail's stop
    assert checkpoint_stops(short, end, ()) == []
    assert checkpoint_stops(short, end, (short + 2,)) == [short + 2]


def test_common_prefix_of_two_texts_agrees_with_a_scan() -> None:
    rng = random.Random(1)
    for _ in range(300):
        a = "".join(rng.choice("ab") for _ in range(rng.randrange(0, 40)))
        b = a[: rng.randrange(0, len(a) + 1)] + "".join(rng.choice("ab") for _ in range(3))
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix(a, b) == n
