"""The scheduler's decisions over plain data (fast): what each shared pass reads, and
which slot a request goes to. The real slots: test_slots_real.py."""

from __future__ import annotations

from localspec.server.scheduling import (
    ALONE_MIN_CHUNK,
    BUSY_CHUNK,
    GIVE_WAY,
    MIN_CHUNK,
    MOST_OUT,
    PROMPT_PASS_S,
    READ_AHEAD_CHUNKS,
    READ_AHEAD_S,
    Pace,
    Swap,
    Want,
    beside_chunk,
    dearer,
    pick_slot,
    plan_step,
    read_ahead_chunk,
    split_pass_s,
    steps_out,
)


def test_rounds_go_whole_and_a_long_prompt_is_cut_into_chunks_beside_them():
    wants = [Want(0, 5000, 1, arrived=0), Want(1, 5, 5, arrived=1), Want(2, 1, 1, arrived=2)]
    shares = plan_step(wants, budget=512)
    assert shares == {1: 5, 2: 1, 0: BUSY_CHUNK}


def test_a_short_requests_prompt_is_not_held_to_small_chunks():
    wants = [Want(0, 5000, 1, arrived=0), Want(1, 1, 1, arrived=1), Want(2, 900, 1, True, 2)]
    assert plan_step(wants, budget=512) == {1: 1, 2: 511}


def test_a_prompt_alone_reads_a_middling_chunk_until_its_passes_are_timed():
    assert plan_step([Want(0, 5000, 1)], budget=512) == {0: BUSY_CHUNK}
    assert plan_step([Want(0, 100, 1)], budget=512) == {0: 100}


CPU = Pace(prompt_token_s=0.007, rounds_s=0.12)  # the 1.5B Q4_K_M target, 2 AVX-512 cores
SLOW = Pace(prompt_token_s=0.027, rounds_s=0.1)  # the same on two AVX2 cores
GPU = Pace(prompt_token_s=0.00006, rounds_s=0.015)


def test_prompts_alone_read_what_takes_half_a_second_so_a_newcomer_waits_little():
    # a keystroke's request that comes meanwhile waits for this pass
    (n,) = plan_step([Want(0, 5000, 1)], budget=512, pace=CPU).values()
    assert abs(n * CPU.prompt_token_s - PROMPT_PASS_S) <= CPU.prompt_token_s
    assert plan_step([Want(0, 5000, 1)], budget=512, pace=GPU) == {0: 512}  # ~30 ms
    # where fewer would read much slower, no fewer than that
    assert plan_step([Want(0, 5000, 1)], budget=512, pace=SLOW) == {0: ALONE_MIN_CHUNK}
    # two pastes share the pass, in order of arrival
    shares = plan_step([Want(0, 5000, 1, arrived=0), Want(1, 900, 1, arrived=1)], 512, CPU)
    assert shares == {0: n}


def test_beside_a_short_requests_round_a_paste_takes_as_long_as_the_round():
    wants = [Want(0, 5000, 1, arrived=0), Want(1, 4, 4, short=True, arrived=1)]
    shares = plan_step(wants, budget=512, pace=CPU)
    assert shares[1] == 4
    assert abs(shares[0] * CPU.prompt_token_s - CPU.rounds_s) <= CPU.prompt_token_s
    # a long request's round: a larger chunk (more slots decode sooner); on a GPU the
    # round's time allows more than that
    long_round = [Want(0, 5000, 1, arrived=0), Want(1, 4, 4, arrived=1)]
    assert plan_step(long_round, budget=512, pace=CPU)[0] == BUSY_CHUNK
    assert plan_step(wants, budget=512, pace=GPU)[0] == round(0.015 / 0.00006)
    # at least one token, however slow the model: the paste never stops
    slow = Pace(prompt_token_s=0.5, rounds_s=0.1)
    assert plan_step(wants, budget=512, pace=slow)[0] == MIN_CHUNK


def test_a_short_requests_own_prompt_is_read_whole_and_a_paste_as_long_beside_it():
    # a keystroke's request: 30 new tokens of its prompt (the rest is in its slot's cache)
    wants = [Want(0, 5000, 1, arrived=0), Want(1, 30, 1, short=True, arrived=1)]
    assert plan_step(wants, budget=512, pace=CPU) == {1: 30, 0: 30}
    wants = [Want(0, 5000, 1, arrived=0), Want(1, 900, 1, short=True, arrived=1)]
    assert plan_step(wants, budget=512, pace=CPU) == {1: 512}


def test_long_rounds_sit_out_as_many_steps_beside_a_short_one_as_keep_it_near_alone():
    """A chat streams while an editor's completion decodes: on a CPU, where the chat's
    token makes the completion's pass 1.4x as dear, the chat's round goes one step in
    three (the completion's passes then 1.13x as long as alone); at 1.9x, one in four,
    the most it sits out; on a GPU, where it costs nothing, every step."""
    cpu = Pace(prompt_token_s=0.007, rounds_s=0.105, short_rounds_s=0.075)
    dear = Pace(prompt_token_s=0.007, rounds_s=0.1425, short_rounds_s=0.075)
    gpu = Pace(prompt_token_s=0.00006, rounds_s=0.0152, short_rounds_s=0.015)
    chat, completion = Want(0, 1, 1, arrived=0), Want(1, 1, 1, short=True, arrived=1)

    def chat_went(pace: Pace) -> list[bool]:
        return [0 in plan_step([chat, completion], 512, pace, n) for n in range(9)]

    assert steps_out(cpu.rounds_s, cpu.short_rounds_s) == 2
    assert chat_went(cpu) == [True, False, False] * 3
    assert steps_out(dear.rounds_s, dear.short_rounds_s) == MOST_OUT == 3
    assert chat_went(dear) == [True, False, False, False] * 2 + [True]
    assert chat_went(gpu) == [True] * 9
    # within GIVE_WAY of the short one's pass alone, no step out: a pass a step is best
    assert steps_out(GIVE_WAY * 0.1, 0.1) == 0 and steps_out(1.16 * 0.1, 0.1) == 1
    # untimed: it goes; alone (no short round beside it), it always goes
    assert plan_step([chat, completion], 512, Pace(0.007, 0.105), 1) == {0: 1, 1: 1}
    assert plan_step([chat], 512, cpu, 1) == {0: 1}
    # a long prompt's chunk beside the short round alone takes as long as its pass
    paste = Want(2, 5000, 1, arrived=2)
    assert plan_step([chat, completion, paste], 512, cpu, 1) == {1: 1, 2: round(0.075 / 0.007)}
    # the same rule keeps the long requests from drafting meanwhile (the worker's _yields)
    assert dearer(cpu.rounds_s, cpu.short_rounds_s)
    assert not dearer(gpu.rounds_s, gpu.short_rounds_s) and not dearer(0.105, 0.0)


def test_work_beside_the_slots_takes_as_long_as_their_step_or_as_a_prompt_alone():
    """An embedding request's texts, read in passes of their own between the slots'."""
    token_s = CPU.prompt_token_s
    # after a step that took 0.12 s, as many tokens as take as long
    assert beside_chunk(token_s, 0.12, 512) == round(0.12 / token_s)
    assert beside_chunk(token_s, 0.0001, 512) == MIN_CHUNK  # it never stops
    assert beside_chunk(GPU.prompt_token_s, 0.5, 512) == 512
    # with no slot decoding, as a prompt alone: half a second, or the least a CPU reads
    # efficiently
    assert beside_chunk(token_s, None, 512) == round(PROMPT_PASS_S / token_s)
    assert beside_chunk(SLOW.prompt_token_s, None, 512) == ALONE_MIN_CHUNK
    assert beside_chunk(0.0, 0.12, 512) == beside_chunk(0.0, None, 512) == BUSY_CHUNK


def test_when_the_pass_is_full_short_requests_go_first():
    wants = [Want(i, 17, 17, short=i == 3, arrived=i) for i in range(4)]
    shares = plan_step(wants, budget=40)
    assert shares == {3: 17, 0: 17}  # the short one, then the oldest; the rest wait


def test_a_chunk_never_leaves_fewer_tokens_than_its_logits_rows():
    # 130 to read, the last 20 scored: a 128-token chunk would leave 2 rows for later
    shares = plan_step([Want(0, 130, 20), Want(1, 1, 1)], budget=512)
    assert shares == {1: 1, 0: 110}


def test_a_pass_always_reads_something():
    assert plan_step([Want(0, 17, 17)], budget=8) == {0: 8}  # a round over the budget
    assert plan_step([], budget=512) == {}


def test_a_request_goes_to_the_slot_that_shares_the_longest_prefix():
    chat, editor = [1, 2, 3, 4, 5, 6], [9, 8, 7]
    idle = {0: (chat, 10.0), 1: (editor, 20.0), 2: ([], 5.0)}
    assert pick_slot([1, 2, 3, 4, 5, 6, 7, 8], idle) == 0
    assert pick_slot([9, 8, 7, 6], idle) == 1
    # nothing shared: the least recently used slot, whose cache is least likely wanted
    assert pick_slot([42], idle) == 2
    # a chat template's opening shared, no more: not worth the chat's cache either
    assert pick_slot([1, 2, 40, 41, 42, 43, 44, 45], idle) == 2


def test_cache_reuse_moves_chunks_back_in_order():
    from localspec.backends.base import moves

    cached = [1, 2, 10, 11, 12, 13, 20, 21, 22, 23, 9]
    prompt = [1, 2, 20, 21, 22, 23, 30, 31]  # chunk 10-13 went, 20-23 moved up
    assert moves(cached, prompt, 4) == (2, [(2, 6, 4)])
    assert moves(cached, prompt, 5) == (2, [])  # shorter runs are read again
    assert moves(cached, prompt, 0) == (2, [])  # off
    assert moves([1, 2, 3], [1, 2, 3], 1) == (3, [])


def test_with_cache_reuse_a_slot_is_picked_for_what_it_would_move():
    from localspec.backends.base import moves

    def keeps(cache, prompt):
        n_past, chunks = moves(cache, prompt, 4)
        return n_past + sum(n for *_, n in chunks)

    prompt = [7, *range(100, 140)]  # another's first chunk went: only 1 token is a prefix
    idle = {0: ([7, 1, 2, 3, 4, 5, 6, *range(100, 140)], 2.0), 1: ([7, 8], 1.0)}
    assert pick_slot(prompt, idle) == 1  # by prefix: the least recently used
    assert pick_slot(prompt, idle, keeps) == 0


def test_a_slot_gives_up_its_cache_to_ram_and_takes_back_what_a_prompt_continues():
    from localspec.server.scheduling import KEEP_TOKENS, MIN_GAIN, plan_swap

    chat = list(range(1000, 1000 + KEEP_TOKENS + 50))  # a conversation in the slot
    agent = list(range(5000, 5000 + KEEP_TOKENS + 50))  # another, kept in RAM
    # the agent's next turn: the chat goes to RAM, the agent comes back
    assert plan_swap([*agent, 7, 8], chat, [agent]) == Swap(save=True, restore=0)
    # the chat's own next turn: nothing moves
    assert plan_swap([*chat, 7, 8], chat, [agent]) == Swap()
    # a prompt of its own: the chat is kept, nothing to load
    assert plan_swap([1, 2, 3], chat, [agent]) == Swap(save=True)
    # the chat is kept already (its earlier turn's state is only a prefix: kept again)
    assert plan_swap([1, 2, 3], chat, [[*chat, 9]]) == Swap(save=False)
    assert plan_swap([1, 2, 3], chat, [chat[:300]]) == Swap(save=True)
    # too little would be lost to be worth a copy, or gained to be worth a load
    short = chat[: KEEP_TOKENS - 1]
    assert plan_swap([1, 2, 3], short, []) == Swap()
    near = [*chat[: 300 - MIN_GAIN + 1], 9]
    assert plan_swap([*chat[:300], 4], near, [chat]).restore is None
    # the saved prompt that keeps the most of it
    assert plan_swap([*agent, 1], [], [agent[:100], agent, chat]) == Swap(restore=1)


def test_ram_keeps_the_latest_prompts_within_its_budget():
    from localspec.server.prompt_cache import PromptCache, Saved

    def saved(tokens: list[int], size: int) -> Saved:
        return Saved(tuple(tokens), ((tuple(tokens), bytearray(size)),))

    cache = PromptCache(budget=100)
    a, b = saved([1, 2], 40), saved([3, 4], 40)
    cache.put(a)
    cache.put(b)
    longer = saved([1, 2, 5], 40)
    cache.put(longer)  # a's conversation went on: its old state goes
    assert cache.entries() == [b, longer]
    cache.use(b)  # b is now the most recently used: c pushes out `longer`
    c = saved([6], 40)
    cache.put(c)
    assert cache.entries() == [b, c] and cache.size == 80
    cache.put(saved([7], 101))  # larger than the whole budget: not kept
    assert cache.entries() == [b, c]


def test_reading_ahead_comes_in_chunks_a_request_waits_little_for():
    # the 0.5B Q4_0 draft on two CPU cores: 64 tokens in ~100 ms, 16 in ~28 ms
    n = read_ahead_chunk(64, 0.100)
    assert n < 64 and abs(n * 0.100 / 64 - READ_AHEAD_S) < 0.100 / 64  # ~30 ms, a token near
    assert 14 <= read_ahead_chunk(16, 0.028) <= 18  # about where it stays
    # on a GPU a chunk costs its fixed overhead: read as much as a pass takes
    assert read_ahead_chunk(64, 0.002) == READ_AHEAD_CHUNKS[1]
    # a loaded machine: never below a few tokens a pass
    assert read_ahead_chunk(16, 1.0) == READ_AHEAD_CHUNKS[0]
    assert read_ahead_chunk(16, 0.0) == READ_AHEAD_CHUNKS[1]


def test_unequal_rounds_in_caches_of_their_own_cost_a_micro_batch_each_level():
    """A cache per slot: llama.cpp reads a chat's token beside a completion's round of 3
    as 1 + 1, then 2 (`split_equal`); equal rounds in one micro-batch."""
    table = [0.07, 0.095, 0.12, 0.10, 0.13, 0.16]  # T(1..6): 4 tokens cheaper than 3
    assert split_pass_s([3], table) == 0.12 and split_pass_s([], table) == 0.0
    assert split_pass_s([1, 3], table) == 0.095 + 0.095
    assert split_pass_s([1, 1, 1, 1], table) == 0.10
    assert split_pass_s([2, 1, 3], table) == 0.12 + 0.095 + 0.07
