"""Serve's slots with a cache each, on the real target: a pass over sequences 0, 1 and 3
fills sequence 2 with a token for the pass (llama.cpp reads sequences with a gap between
their ids in two micro-batches) and drops it after, leaving sequence 2 as it was."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from localspec.backends.llama import LlamaModel, LoadOptions, Part, id_runs

pytestmark = pytest.mark.real

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The capital of France is",
    "for i in range(10):\n    print(",
    "SELECT name FROM users WHERE",
]
# largest difference of a logit between the same tokens read in passes of other shapes:
# batched kernels move the last bits (~0.05 here); a stray cache entry moves them by whole
# logits
NOISE = 0.5


@pytest.fixture(scope="module")
def model(real_paths) -> Iterator[LlamaModel]:
    m = LlamaModel(str(real_paths[0]), LoadOptions(n_ctx=512, n_threads=2, n_seq=4))
    assert not m.kv_unified  # a cache per sequence: what the gaps are about
    yield m
    m.close()


def read(model: LlamaModel, seq: int, tokens: list[int]) -> np.ndarray:
    """`tokens` read afresh into `seq`: the last one's logits."""
    model.remove_from(seq, 0)
    return model.decode_parts([Part(seq, tokens, 0, 1)])[0]


def test_a_pass_with_a_gap_leaves_the_gap_as_it_was_and_answers_as_without_it(
    model: LlamaModel,
):
    prompts = [model.tokenize(t) for t in TEXTS]
    for seq, tokens in enumerate(prompts):
        read(model, seq, tokens[:-1])
    lengths = [model.seq_len(s) for s in range(4)]
    gap = 2
    model._ubatch_s.clear()  # untimed: filled
    assert model._fillers([Part(s, [1], 0, 1) for s in (0, 1, 3)]) == [
        Part(gap, [0], lengths[gap], 0)
    ]

    parts = [Part(s, [prompts[s][-1]], lengths[s], 1) for s in (3, 0, 1)]  # any order
    rows = model.decode_parts(parts)

    assert [model.seq_len(s) for s in range(4)] == [n + (s != gap) for s, n in enumerate(lengths)]
    for part, row in zip(parts, rows, strict=True):
        alone = read(model, part.seq, prompts[part.seq])
        assert np.abs(row - alone).max() < NOISE, part.seq
    # the gap's cache goes on from its own last token, not the filler
    last = model.decode_parts([Part(gap, [prompts[gap][-1]], lengths[gap], 1)])[0]
    fresh = read(model, gap, prompts[gap])
    assert np.abs(last - fresh).max() < NOISE


def test_a_gap_is_filled_with_as_many_tokens_where_the_passes_say_it_pays(model: LlamaModel):
    model._ubatch_s.clear()
    rounds = [Part(s, [1, 2, 3], 0, 3) for s in (0, 3)]
    assert [(f.seq, len(f.tokens)) for f in model._fillers(rounds)] == [(1, 3), (2, 3)]
    # one pass of 4 slots' tokens against two of one slot's (a compute-bound CPU's Q4)
    model._ubatch_s.update({3: 0.05, 12: 0.12})
    assert model._fillers(rounds) == []
    model._ubatch_s[12] = 0.09  # a GPU's, or F16 on a CPU: more tokens cost little
    assert len(model._fillers(rounds)) == 2
    model._ubatch_s.clear()


def test_no_filler_where_the_sequences_run_on_or_a_gap_is_full(model: LlamaModel):
    model._ubatch_s.clear()
    assert model._fillers([Part(s, [1], 0, 1) for s in (0, 1, 2)]) == []
    assert model._fillers([Part(1, [1], 0, 1)]) == []
    assert model._fillers([Part(0, [1, 2], 0, 2), Part(2, [1], 0, 1)]) == []  # unequal
    full = model.tokenize("x " * 600)[: model.n_ctx]
    read(model, 1, full)
    try:
        assert model._fillers([Part(0, [1], 0, 1), Part(2, [1], 0, 1)]) == []
    finally:
        model.remove_from(1, 0)


def test_runs_of_ids():
    assert id_runs([0, 1, 3]) == [2, 1]
    assert id_runs([0, 2, 3]) == [1, 2]
    assert id_runs([0, 1, 2, 3]) == [4]
    assert id_runs([1]) == [1]
