"""The prefix checks each round makes of a cache or an index against the whole context."""

import random

import numpy as np

from localspec.backends.base import common_prefix, shared_prefix
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
