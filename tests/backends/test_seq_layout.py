"""The layout's decisions over plain data (no model): which pass a gap splits, when a
filler pays, when an idle slot pads a pass, what a pass is estimated to cost, and when a
lasting gap is worth moving caches for. tests/backends/test_seq_gaps_real.py carries them
out on the real target."""

from __future__ import annotations

import pytest

from localspec.backends.seq_layout import PAD_RETIME, Layout, Part, id_runs

N_CTX = 512


def layout(**kw) -> Layout:
    return Layout(n_seq=4, unified=False, recurrent=False, n_batch=512, **kw)


def one(seqs: tuple[int, ...], k: int = 1) -> list[Part]:
    return [Part(s, [1] * k, 0, k) for s in seqs]


def lengths(seq: int) -> int:
    return 10 * (seq + 1)


def test_runs_of_ids():
    assert id_runs([0, 1, 3]) == [2, 1]
    assert id_runs([0, 2, 3]) == [1, 2]
    assert id_runs([0, 1, 2, 3]) == [4]
    assert id_runs([1]) == [1]


def test_only_a_cache_each_with_equal_counts_has_gaps():
    assert layout().gaps(one((0, 1, 3))) is not None
    assert layout().gaps(one((0, 1, 2))) is None
    assert layout().gaps([*one((0,), 2), *one((2,))]) is None  # unequal: split anyway
    assert Layout(4, unified=True, recurrent=False, n_batch=512).gaps(one((0, 2))) is None
    assert Layout(4, unified=False, recurrent=True, n_batch=512).gaps(one((0, 2))) is None


def test_a_gap_is_filled_with_as_many_tokens_where_the_passes_say_it_pays():
    rounds = one((0, 3), 3)
    untimed = layout().fillers(rounds, lengths, N_CTX)
    assert untimed == [Part(1, [0] * 3, 20, 0), Part(2, [0] * 3, 30, 0)]
    # one pass of 4 slots' tokens against two of one slot's (a compute-bound CPU's Q4)
    assert layout(ubatch_s={3: 0.05, 12: 0.12}).fillers(rounds, lengths, N_CTX) == []
    # a GPU's, or F16 on a CPU: more tokens cost little
    assert len(layout(ubatch_s={3: 0.05, 12: 0.09}).fillers(rounds, lengths, N_CTX)) == 2


def test_no_filler_where_a_gap_or_the_batch_is_full():
    assert layout().fillers(one((0, 2)), lambda s: N_CTX if s == 1 else 0, N_CTX) == []
    small = Layout(4, unified=False, recurrent=False, n_batch=8)
    assert small.fillers(one((0, 3), 3), lengths, N_CTX) == []


def test_estimates_of_a_pass_from_the_timed_ones():
    assert layout().estimate(3) is None
    timed = layout(ubatch_s={2: 0.08, 4: 0.12})
    assert timed.estimate(3) == pytest.approx(0.10)  # on their line
    assert timed.estimate(8) == pytest.approx(0.24)  # the largest's per token
    assert timed.estimate(1) == pytest.approx(0.08)  # no less than the smallest


def test_one_micro_batch_passes_are_timed_by_their_tokens():
    lay = layout()
    lay.observe(one((0, 1)), 0.10)
    lay.observe(one((0, 2)), 0.50)  # split: not a one-micro-batch time
    lay.observe(one((0, 1)), 0.20)
    assert lay.ubatch_s == {2: pytest.approx(0.12)}


def test_a_gap_is_moved_once_it_has_lost_what_moving_costs():
    lay = layout(ubatch_s={1: 0.01, 3: 0.03}, move_s_per_byte=1e-3)
    gapped = one((0, 1, 3))
    lay.count_gap_cost(gapped, 0.05)
    assert lay.gap_cost == pytest.approx(0.02)
    assert lay.moves(gapped, lambda s: 100) is None  # 0.02 s lost < 0.2 s to move 200 bytes
    for _ in range(10):
        lay.count_gap_cost(gapped, 0.05)
    moves = lay.moves(gapped, lambda s: 100)
    assert moves is not None and moves.swaps == [(3, 2)] and moves.size == 200
    for a, b in moves.swaps:
        lay.swapped(a, b)
    assert lay.where == [0, 1, 3, 2] and lay.gaps(gapped) is None
    lay.moved(moves, 0.002)
    assert lay.gap_cost == 0.0 and lay.move_s_per_byte == pytest.approx(0.5e-3 + 0.5e-5)
    lay.count_gap_cost(one((0, 1, 3)), 0.05)  # a pass without a gap: the count starts again
    assert lay.gap_cost == 0.0


# a cache each, 2 cores of a Xeon: Q4_K_M's kernels take tokens four at a time, F16's not
Q4_PASSES = {3: 0.140, 4: 0.116}
F16_PASSES = {3: 0.204, 4: 0.212}


def test_an_idle_slot_pads_a_pass_where_one_more_slots_tokens_cost_less():
    assert layout(ubatch_s=Q4_PASSES).padding(one((0, 1, 2)), lengths, N_CTX) == [
        Part(3, [0], 40, 0)
    ]
    assert layout(ubatch_s={6: 0.3, 8: 0.25}).padding(one((1, 2, 3), 2), lengths, N_CTX) == [
        Part(0, [0, 0], 10, 0)  # the run's other side
    ]
    assert layout(ubatch_s=F16_PASSES).padding(one((0, 1, 2)), lengths, N_CTX) == []
    assert len(layout(ubatch_s={3: 0.14}).padding(one((0, 1, 2)), lengths, N_CTX)) == 1  # tried
    assert layout().padding(one((0, 1, 2)), lengths, N_CTX) == []  # its own size untimed
    moved = layout(ubatch_s=Q4_PASSES, where=[0, 3, 1, 2])  # slot 1's cache in sequence 3
    assert moved.padding(moved.order(one((0, 2, 3))), lengths, N_CTX) == [Part(1, [0], 20, 0)]
    shared = Layout(4, unified=True, recurrent=False, n_batch=512, ubatch_s=Q4_PASSES)
    assert shared.padding(one((0, 2, 3)), lengths, N_CTX) == [Part(1, [0], 20, 0)]


def test_no_padding_alone_with_every_slot_busy_past_a_full_cache_or_batch_or_a_recurrent_state():
    assert layout(ubatch_s={1: 0.2, 2: 0.1}).padding(one((0,)), lengths, N_CTX) == []
    assert layout(ubatch_s={4: 0.2, 5: 0.1}).padding(one((0, 1, 2, 3)), lengths, N_CTX) == []
    assert layout(ubatch_s=Q4_PASSES).padding(one((0, 1, 3)), lengths, N_CTX) == []  # a gap
    assert len(layout(ubatch_s=Q4_PASSES).fill(one((0, 1, 3)), lengths, N_CTX)) == 1  # filled
    assert layout(ubatch_s=Q4_PASSES).padding(one((0, 1, 2)), lambda s: N_CTX, N_CTX) == []
    small = Layout(4, unified=False, recurrent=False, n_batch=3, ubatch_s=Q4_PASSES)
    assert small.padding(one((0, 1, 2)), lengths, N_CTX) == []
    shared = Layout(4, unified=True, recurrent=False, n_batch=512, ubatch_s={2: 0.2, 3: 0.1})
    assert shared.padding([*one((0,)), *one((1,), 4)], lengths, N_CTX) == []  # unequal counts
    state = Layout(4, unified=False, recurrent=True, n_batch=512, ubatch_s=Q4_PASSES)
    assert state.padding(one((0, 1, 2)), lengths, N_CTX) == []


def test_the_choice_not_taken_is_timed_again_now_and_then():
    lay = layout(ubatch_s=F16_PASSES)
    padded = [bool(lay.padding(one((0, 1, 2)), lengths, N_CTX)) for _ in range(2 * PAD_RETIME)]
    assert [i + 1 for i, p in enumerate(padded) if p] == [PAD_RETIME, 2 * PAD_RETIME]
