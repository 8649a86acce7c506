"""Serve's slots with a cache each, on the real target: a pass over sequences 0, 1 and 3
fills sequence 2 with a token for the pass (llama.cpp reads sequences with a gap between
their ids in two micro-batches) and drops it after, leaving sequence 2 as it was; a gap
that lasts is closed by moving the caches, each sequence going on as before; and an idle
slot pads a pass of the three others the same way. The
decisions alone: tests/backends/test_seq_layout.py."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.backends.seq_layout import Part

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


def read_all_but_last(model: LlamaModel) -> tuple[list[list[int]], list[int]]:
    """Each text but its last token read into its own sequence: the texts' tokens, and
    the caches' lengths."""
    prompts = [model.tokenize(t) for t in TEXTS]
    for seq, tokens in enumerate(prompts):
        read(model, seq, tokens[:-1])
    return prompts, [model.seq_len(s) for s in range(4)]


def assert_each_goes_on_as_read_afresh(
    model: LlamaModel,
    prompts: list[list[int]],
    lengths: list[int],
    gap: int,
    parts: list[Part],
    rows: list[np.ndarray],
) -> None:
    """After a pass over the others' last prompt tokens: each scored as a fresh read of
    its prompt does, and the gap's slot (filled for the pass, or its cache moved) holds
    its own tokens and goes on from its own last one."""
    assert [model.seq_len(s) for s in range(4)] == [n + (s != gap) for s, n in enumerate(lengths)]
    for part, row in zip(parts, rows, strict=True):
        alone = read(model, part.seq, prompts[part.seq])
        assert np.abs(row - alone).max() < NOISE, part.seq
    last = model.decode_parts([Part(gap, [prompts[gap][-1]], lengths[gap], 1)])[0]
    fresh = read(model, gap, prompts[gap])
    assert np.abs(last - fresh).max() < NOISE


def test_a_pass_with_a_gap_leaves_the_gap_as_it_was_and_answers_as_without_it(
    model: LlamaModel,
):
    prompts, lengths = read_all_but_last(model)
    gap = 2
    model.layout.ubatch_s.clear()  # untimed: filled
    assert model.layout.fillers([Part(s, [1], 0, 1) for s in (0, 1, 3)], model.seq_len, 512) == [
        Part(gap, [0], lengths[gap], 0)
    ]

    parts = [Part(s, [prompts[s][-1]], lengths[s], 1) for s in (3, 0, 1)]  # any order
    rows = model.decode_parts(parts)

    assert_each_goes_on_as_read_afresh(model, prompts, lengths, gap, parts, rows)


def test_a_gap_counts_its_cost_until_a_pass_runs_without_one(model: LlamaModel):
    model.layout.ubatch_s.clear()
    model.layout.ubatch_s.update({1: 1e-6, 2: 1e-6, 3: 1e-6})  # a pass of one micro-batch: ~free
    model.layout.move_s_per_byte = 1.0  # moving: never worth it here
    prompts = [model.tokenize(t) for t in TEXTS]
    for seq, tokens in enumerate(prompts):
        read(model, seq, tokens)
    where = list(model.layout.where)
    model.layout.gap_cost = 0.0
    held = {s: model.layout.where[s] for s in range(4)}
    gapped = [Part(s, [1], model.seq_len(s), 1) for s in sorted(held, key=held.get)[::2]]
    model.decode_parts(gapped)
    first = model.layout.gap_cost
    assert first > 0
    model.decode_parts([Part(p.seq, [1], p.pos + 1, 1) for p in gapped])
    assert model.layout.gap_cost > first
    assert model.layout.where == where  # not moved: it would cost more than the gap lost
    model.decode_parts([Part(0, [1], model.seq_len(0), 1)])
    assert model.layout.gap_cost == 0.0
    model.layout.move_s_per_byte = 1e-9
    model.layout.ubatch_s.clear()


def test_a_lasting_gap_is_closed_by_moving_caches(model: LlamaModel):
    prompts, lengths = read_all_but_last(model)
    gap = model.layout.where.index(2)  # the slot in llama.cpp's sequence 2
    active = [s for s in range(4) if s != gap]
    model.layout.gap_cost = 1.0  # the gap has lost a second already

    parts = [Part(s, [prompts[s][-1]], lengths[s], 1) for s in active]
    rows = model.decode_parts(parts)

    held = sorted(model.layout.where[s] for s in active)
    assert held == list(range(held[0], held[0] + 3))  # one run: one micro-batch
    assert model.layout.one_ubatch(model.layout.order(parts))
    assert model.layout.gap_cost == 0.0
    assert_each_goes_on_as_read_afresh(model, prompts, lengths, gap, parts, rows)


def test_an_idle_slot_that_pads_a_pass_is_left_as_it_was(model: LlamaModel):
    prompts, lengths = read_all_but_last(model)
    idle = model.layout.where.index(3)  # the slot in llama.cpp's sequence 3
    active = [s for s in range(4) if s != idle]
    model.layout.ubatch_s.clear()
    model.layout.ubatch_s.update({3: 1.0, 4: 0.5})  # four slots' tokens cost less: padded

    parts = [Part(s, [prompts[s][-1]], lengths[s], 1) for s in active]
    rows = model.decode_parts(parts)

    assert model.layout.ubatch_s[3] == 1.0 and model.layout.ubatch_s[4] != 0.5  # a pass of 4
    assert_each_goes_on_as_read_afresh(model, prompts, lengths, idle, parts, rows)
    model.layout.ubatch_s.clear()
