import numpy as np

from localspec.backends.toy import ToyModel, scripted
from localspec.decoding.drafters import DraftModel, NgramIndex
from localspec.decoding.sampling import SamplingParams


def brute_force(ctx: list[int], gamma: int, n_max: int, n_min: int) -> list[int]:
    for n in range(min(n_max, len(ctx) - 1), n_min - 1, -1):
        suffix = ctx[-n:]
        for start in range(len(ctx) - n - 1, -1, -1):  # latest earlier occurrence
            if ctx[start : start + n] == suffix:
                text = list(ctx)  # a copy from start + n on, reading what it writes
                for j in range(gamma):
                    text.append(text[start + n + j])
                return text[len(ctx) :]
    return []


def test_index_finds_what_a_scan_finds_as_the_context_grows():
    rng = np.random.default_rng(0)
    ctx = rng.integers(0, 6, size=300).tolist()  # small alphabet: many repeats
    index = NgramIndex(n_max=4, n_min=2)
    for end in range(2, len(ctx)):
        assert index.lookup(ctx[:end], 5) == brute_force(ctx[:end], 5, 4, 2)


def test_a_match_that_runs_into_the_end_repeats_its_period():
    index = NgramIndex(n_max=4, n_min=2)
    assert index.lookup([9, 5, 5, 5, 5], 6) == [5] * 6  # "!!!!": not one token a round
    assert index.lookup([9, 1, 2, 3, 1, 2, 3, 1, 2], 5) == [3, 1, 2, 3, 1]
    assert index.lookup([1, 2, 7, 1, 2, 8, 1, 2], 2) == [8, 1]  # room before the end


def test_index_starts_afresh_for_another_text():
    index = NgramIndex(n_max=3, n_min=1)
    assert index.lookup([1, 2, 3, 1, 2], 2) == [3, 1]
    assert index.lookup([7, 8, 9, 7], 2) == [8, 9]  # nothing left over from [1, 2, 3, ...]


def test_a_cut_draft_reads_a_new_conversation_whole_when_it_fits():
    from localspec.decoding.drafters import SINKS

    model = ToyModel(scripted("ok"), n_ctx=100_000)
    drafter = DraftModel(model, p_min=0.0, window=16)
    long_chat = [1, 2, 3, 4, *(10 + i for i in range(26))]  # 30 tokens, none read
    seq, held = drafter.view(long_chat)
    assert seq == [*long_chat[:SINKS], *long_chat[-16:]] and held == 0
    model.evaluate(seq, 1)  # it reads the cut view, then goes on from it
    assert drafter.view([*long_chat, 7]) == ([*seq, 7], len(seq))
    # another conversation, opening like the first (the same template): 18 tokens, of
    # which 14 unread, fit the window, so it reads them all, not the first's cut of them
    new_chat = [1, 2, 3, 4, *(200 + i for i in range(14))]
    assert drafter.view(new_chat) == (new_chat, SINKS)


def test_a_draft_step_in_a_pass_shared_with_other_slots_is_not_timed():
    """Under serve's slots a step's call lasts the whole shared pass, with the others'
    tokens in it (a prompt's catch-up among them: a 1-token step once timed at 600 ms
    kept a slot from drafting for the rest of its answer). Only a step alone times it;
    under load `auto` prices steps by the shared passes (Load.draft_step)."""
    model = ToyModel(scripted("abcdefgh"))
    drafter = DraftModel(model, p_min=0.0)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0)
    model.shared_pass = True
    drafter.draft([1, 2, 3], 2, params, rng)
    assert drafter.step_s == 0.0 and drafter.catchup_s == 0.0
    model.shared_pass = False
    drafter.draft([1, 2, 3], 3, params, rng)
    assert drafter.step_s > 0.0
