"""`--gamma auto`: the cost model, the choice it makes, and that it never loses much."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.backends.llama import GRAPH_WARMUP
from localspec.backends.toy import ToyModel, scripted
from localspec.decoding.adaptive import (
    RECOVER,
    Acceptance,
    AdaptiveDrafter,
    VerifyCost,
    auto_engine,
)
from localspec.decoding.choice import Choice
from localspec.decoding.drafters import Outcome
from localspec.decoding.events import RoundEnd
from localspec.decoding.idle import (
    FIRST_TRIES,
    FIRST_TRY_AFTER,
    TIMING,
    TIMING_PASS,
    free_guesses,
)
from localspec.decoding.load import Load, common_depth
from localspec.decoding.sampling import SamplingParams


def test_expected_tokens_match_the_closed_form_for_constant_alpha():
    alpha = 0.8
    acc = Acceptance.prior(alpha)
    for k in range(1, 6):
        assert 1 + acc.expected(k)[-1] == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))


def test_acceptance_learns_per_position():
    acc = Acceptance.prior(0.5)
    for _ in range(60):
        acc.observe(drafted=4, accepted=1)  # first always right, second always wrong
    assert acc.alpha[0] > 0.95 and acc.alpha[1] < 0.05
    assert acc.alpha[2] == acc.alpha[1]  # never reached: assumed like the one before


def test_a_deep_position_judged_on_early_misses_is_tried_again():
    """Two early misses at position 2, then only one-token drafts (all right): position 2
    is never tested, so its α must recover by itself (seen on a chat prompt: auto stayed
    on one-token drafts for the rest of the answer)."""
    acc = Acceptance.prior(0.7)
    acc.observe(drafted=2, accepted=1)
    acc.observe(drafted=3, accepted=1)
    low = acc.alpha[1]
    for _ in range(30):
        acc.observe(drafted=1, accepted=1)
    assert acc.alpha[0] > 0.9
    assert acc.alpha[1] - low > 0.6 * (acc.alpha[0] - low)
    assert acc.alpha[1] <= acc.alpha[0]  # relaxes toward the one before, never past it


def test_auto_drafts_deeply_again_after_early_misses():
    d = drafter_with(a=0.112, b=0.01, c=0.02, alpha=0.9)  # the F16 pair on a 2-core CPU
    d.alpha["draft"] = Acceptance.prior(0.7)
    d.alpha["draft"].observe(drafted=2, accepted=1)
    d.alpha["draft"].observe(drafted=3, accepted=1)
    ks = []
    for _ in range(40):  # the text is easy: every drafted token is accepted
        k = d.choose(matched=0, gamma=8).k
        ks.append(k)
        d.alpha["draft"].observe(drafted=k, accepted=k)
    assert ks[0] == 1 and min(ks[-5:]) >= 4  # before the fix: 1 every round


def test_verify_cost_fits_a_line_and_tries_the_next_batch_size():
    cost = VerifyCost()
    for k, t in [(1, 0.10), (2, 0.12), (3, 0.14)]:
        cost.observe(k, t)
    assert cost.a == pytest.approx(0.10) and cost.b == pytest.approx(0.02)
    t4, t6 = cost.batch(np.array([4, 6]))
    assert t4 == pytest.approx(0.14)  # untimed next size: optimistic, so it gets tried
    assert t6 == pytest.approx(0.20)


def test_a_plain_round_is_priced_as_timed_not_by_the_line():
    """The serve log's "≈ n× plain decoding" divides by T(1). On a CPU the line through
    every timed size sits well off it (the Q4_K_M target on 2 cores of an EPYC: T(16)
    below T(15)), and by the line's a a request that ran at plain speed read ≈1.5×."""
    cost = VerifyCost()
    assert cost.one == 0.0  # unknown until timed
    for k, t in [(1, 0.027), (2, 0.044), (4, 0.072), (8, 0.122), (16, 0.147)]:
        cost.observe(k, t)
    assert cost.one == pytest.approx(0.027)
    assert cost.a > 1.2 * cost.one  # what it used to divide by


def test_an_untimed_batch_size_is_not_assumed_free_where_each_token_costs_its_own():
    """Costs in steps (memory-bound, the F16 target) make the next size worth a try at
    the largest timed one's price; costs that rise by a pass's share per token
    (compute-bound: the Q4_K_M target on 2 cores) go on rising, and a deep draft tried
    at the old price lost 6.5 T(1) in the replay of summarize-release-notes."""
    stepped, steep = VerifyCost(), VerifyCost()
    for k, t in enumerate([0.076, 0.126, 0.141], 1):  # T(3) - T(2) = 0.2 T(1)
        stepped.observe(k, t)
    for k, t in enumerate([0.029, 0.056, 0.080], 1):  # T(3) - T(2) = 0.83 T(1)
        steep.observe(k, t)
    assert stepped.batch(np.array([4]))[0] == pytest.approx(0.141)
    t4 = steep.batch(np.array([4]))[0]
    assert t4 == pytest.approx(steep.a + 3 * steep.b) and t4 > 0.1  # on the line, past T(3)


def test_between_timed_batch_sizes_t_lies_on_the_way_from_one_to_the_other():
    """Not on the line through every timed size: on a CPU T flattens past a few tokens,
    and the line would price T(5) above a timed T(8)."""
    cost = VerifyCost()
    for k, t in [(1, 0.030), (2, 0.060), (3, 0.090), (8, 0.120)]:
        cost.observe(k, t)
    table = cost.table(8)
    assert table[4] == pytest.approx(0.090 + 0.030 * 2 / 5)  # T(5)
    assert table[:8] == sorted(table[:8])
    assert [cost.hopeful(k) for k in (9, 12)] == [0.120] * 2  # above: as cheap as T(8) at best


# T(1..6) as the engine timed them: the Q4_K_M target on 2 cores of an EPYC (AVX-512)
Q4_EPYC_T = [0.035, 0.063, 0.087, 0.111, 0.149, 0.171]


def test_a_sure_free_match_tries_an_untimed_deeper_pass_where_it_cannot_lose():
    """Steep timed sizes put every untimed one on their line (T(16) at 0.43 s), so a
    keystroke's last middle, drafted back with α 0.98, went 3 deep for a whole answer.
    Tried, T(16) took 0.21 s. A deeper try is made where the line's price would still
    not lose to plain decoding; a weak match, which would, is not tried deeper, nor one
    sure by its prior alone."""
    from localspec.decoding.estimates import PREDICTION_GAMMA_MAX as DEEP

    d = AdaptiveDrafter(ToyModel(scripted("x")))
    d.model = None  # free sources alone
    for k, t in enumerate(Q4_EPYC_T, 1):
        d.verify.observe(k, t)
    d.alpha["suffix16"] = Acceptance([0.98] * DEEP, [10] * DEEP)
    sure = d.choose(matched=16, gamma=16, n=30, free="suffix")
    assert sure.source == "suffix" and sure.k >= 2 * len(Q4_EPYC_T)  # an untimed size
    line = d.verify.table(sure.k + 1)
    sure_tokens = 1 + d.alpha["suffix16"].expected(sure.k)[-1]
    assert sure_tokens * line[0] / line[sure.k] >= 1.0  # no loss at the line's price
    d.verify.observe(sure.k + 1, 0.200)  # timed: cheaper than the line said
    deeper = d.choose(matched=16, gamma=16, n=30, free="suffix")
    assert deeper.k >= sure.k and deeper.gain > 1.5
    weak = AdaptiveDrafter(ToyModel(scripted("x")))
    weak.model = None
    for k, t in enumerate(Q4_EPYC_T, 1):
        weak.verify.observe(k, t)
    weak.alpha["suffix16"] = Acceptance([0.75] * DEEP, [10] * DEEP)
    assert weak.choose(matched=16, gamma=16, n=30, free="suffix").k + 1 <= len(Q4_EPYC_T)
    weak.alpha["suffix16"] = Acceptance.prior(0.98, DEEP)  # sure by its prior alone
    assert weak.choose(matched=16, gamma=16, n=30, free="suffix").k + 1 <= len(Q4_EPYC_T)


def test_a_free_source_is_measured_on_the_rounds_that_do_not_draft_it():
    """Plain rounds still learn what an n-gram match would have kept (its shadow), so no
    draft has to be risked to notice that the text repeats or stopped repeating."""
    d = drafter_with(a=0.03, b=0.03, c=0.01, alpha=0.0)  # each drafted token costs a pass
    d.model = None
    text = [1, 2, 3, 4, 9, 9, 1, 2, 3]  # the 3-gram "1 2 3" was followed by 4 9 9
    params, rng = SamplingParams(), np.random.default_rng(0)
    prior = d.alpha["ngram3"].alpha[0]
    for follows in (4, 9, 9, 1, 2, 3):  # the text repeats what followed the match
        assert d.draft(text, 8, params, rng).tokens == []  # drafting does not pay
        text = [*text, follows]
        d.accept(text, Outcome(0, 0, 0.03))
    assert d.alpha["ngram3"].alpha[0] > prior
    right = d.alpha["ngram3"].alpha[0]
    for follows in (5, 6, 7):  # now it departs from every match
        d.draft(text, 8, params, rng)
        text = [*text, follows]
        d.accept(text, Outcome(0, 0, 0.03))
    assert min(a.alpha[0] for key, a in d.alpha.items() if key.startswith("ngram")) < right


def measured(alpha: float) -> Acceptance:
    """α as if seen many times."""
    return Acceptance([alpha] * 8, [10] * 8)


def drafter_with(a: float, b: float, c: float, alpha: float) -> AdaptiveDrafter:
    d = AdaptiveDrafter(ToyModel(scripted("x")))
    for k in range(1, 9):
        d.verify.observe(k, a + b * (k - 1))
    d.model.step_s = c  # type: ignore[union-attr]
    d.alpha["draft"] = measured(alpha)
    return d


def unseen(timed: list[float], c: float, read_s: float) -> AdaptiveDrafter:
    """A draft model not tried yet, the target's first sizes timed and a prompt's read."""
    target = ToyModel(scripted("x"))
    target.read_s = read_s
    d = AdaptiveDrafter(ToyModel(scripted("x")), cost_ratio=c / timed[0], reader=target)
    for k, t in enumerate(timed, 1):
        d.verify.observe(k, t)
    return d


def test_an_unseen_draft_model_is_tried_where_a_good_draft_would_pay():
    """The Q4_K_M pair on 2 cores of a Xeon (T(1) 80, T(4) 121 ms, c 25 ms, the target
    reads a prompt at 14 ms a token): at its prior α 0.7 the draft model loses, right
    GOOD_ALPHA of the time (code) it pays. Once the answer has run FIRST_TRY_AFTER tokens
    a round times a 4-token pass with free guesses if no larger pass was timed, then the
    draft model is tried where reading the text is not too dear, for FIRST_TRIES rounds:
    its measured α decides from there. On an EPYC, where a 4-token pass costs 3.4 one-token
    ones, it is never tried."""
    xeon = unseen([0.0802], c=0.0246, read_s=0.0143)
    xeon.answered = FIRST_TRY_AFTER - 1
    assert xeon.choose(matched=0, gamma=8, lag=80).k == 0
    xeon.answered = FIRST_TRY_AFTER
    timing = Choice(TIMING, TIMING_PASS - 1, 0.0, ngram=TIMING_PASS - 1)
    assert xeon.choose(matched=0, gamma=8, lag=80) == timing
    assert free_guesses([5, 6, 7, 5, 8, 5], 3) == [8, 5, 8] and free_guesses([1, 2], 1) == [2]
    xeon.verify.observe(4, 0.121)
    first = xeon.choose(matched=0, gamma=8, lag=80)
    assert first.source == "draft" and first.k >= 2 and first.gain > 1
    assert xeon.choose(matched=0, gamma=8, lag=400).k == 0  # a long text to read first
    for _ in range(FIRST_TRIES):  # the rounds of its first try, all missed
        assert xeon.choose(matched=0, gamma=8, lag=1).source == "draft"
        xeon.alpha["draft"].observe(drafted=first.k, accepted=0)
    assert xeon.choose(matched=0, gamma=8, lag=1).k == 0
    # a 2-token pass timed instead (that day 128 ms, the dearest per token) draws a line
    # on which no draft pays: the draft model would never have been tried
    two = unseen([0.0802, 0.128], c=0.0246, read_s=0.0143)
    two.answered = FIRST_TRY_AFTER
    assert two.choose(matched=0, gamma=8, lag=80).k == 0
    epyc = unseen([0.0288], c=0.0099, read_s=0.006)
    epyc.answered = 100
    assert epyc.choose(matched=0, gamma=8, lag=80).source == TIMING
    epyc.verify.observe(4, 0.0969)
    assert epyc.choose(matched=0, gamma=8, lag=80).k == 0


def test_a_sizes_first_pass_is_not_kept_and_no_size_costs_more_than_a_larger():
    """An H200's 0.8B hybrid twin, the passes as timed: each size's first two passes ran
    without llama.cpp's CUDA graph or captured it (T(1) 4.6 and 6.8 ms against 1.6). Kept,
    a cold T(1) made a draft at α 0.01 look 2× plain decoding, every round of an answer."""
    cost = VerifyCost(cold_passes=GRAPH_WARMUP)  # a target on a GPU
    cost.time_pass(1, 0.0046)
    cost.time_pass(1, 0.0068)  # the pass that captures the graph
    assert cost.seconds == {1: 0.0068}  # needed at once: the latest stands until warm
    cost.time_pass(1, 0.0016)
    for t in (0.0060, 0.0050, 0.0020):
        cost.time_pass(2, t)
    assert cost.seconds == {1: 0.0016, 2: 0.0020}
    cost.seconds[1] = 0.0046  # a T(1) timed too high all the same
    assert cost.table(3)[0] == pytest.approx(0.0020)
    d = drafter_with(a=0.0016, b=0.0004, c=0.0003, alpha=0.01)
    d.verify.seconds[1] = 0.0046
    assert d.choose(matched=0, gamma=8).k == 0


def test_a_cpus_tiles_keep_a_smaller_pass_dearer_than_a_larger_one():
    """2 cores of a Xeon, the Q4_K_M target: a 4-token pass took 114 ms, a 3-token one
    144 (llama.cpp's kernels work in tiles). Counted at 114, the 3-token pass made a
    2-token draft look as cheap as a 3-token one, and `auto` drafted 2 tokens (a 144 ms
    pass) where the α it had measured said 3 (a 114 ms one)."""
    xeon = [0.0789, 0.109, 0.144, 0.114, 0.146, 0.180, 0.208, 0.212, 0.283]
    d = drafter_with(a=0.0789, b=0.0, c=0.0268, alpha=0.8)
    d.verify.seconds.clear()
    for k, t in enumerate(xeon, 1):
        d.verify.observe(k, t)
    assert d.verify.table(9)[:4] == pytest.approx(xeon[:4])
    d.alpha["draft"] = Acceptance([0.77, 0.87, 0.58, 0.58, 0.58], [10] * 5)
    assert d.choose(matched=0, gamma=8).k == 3


def test_on_a_gpu_the_passes_after_each_change_of_size_are_cold_and_priced():
    """The same twin on an H200 (scripts/gpu_switch.py): 1-token passes 1.4 ms; after one
    2-token pass (4.7 ms) the next two 1-token passes took 4.1 and 3.2 ms (llama.cpp keeps
    one CUDA graph per context: every change of size warms up again). Timed, they kept
    T(1) high and drafts looking cheap: 14 of 63 rounds drafted at α 0.1-0.2."""
    cost = VerifyCost(cold_passes=GRAPH_WARMUP, after_each_change=True)
    cost.time_pass(1, 0.0046)
    assert cost.seconds == {1: 0.0046} and not cost.warm  # stands in until a warm one
    for t in (0.0034, 0.0014):
        cost.time_pass(1, t)
    assert cost.seconds == {1: 0.0014} and cost.warm
    for k, t in ((2, 0.0047), (1, 0.0041), (1, 0.0032), (1, 0.0014)):
        cost.time_pass(k, t)
    assert cost.seconds == {1: pytest.approx(0.0014)}  # no T(2) warm yet, T(1) as it was
    assert cost.cold_excess == pytest.approx(0.0027 + 0.3 * (0.0018 - 0.0027))
    assert cost.switch_cost(3) == pytest.approx(3 * cost.cold_excess)


def test_on_a_gpu_an_idle_draft_model_comes_back_by_probes_priced_with_cold_passes():
    """An MTP head measured wrong (α 0.14) in 40 plain rounds of 1.6 ms. On a CPU its α
    recovers toward the prior (0.7) and it is probed once 2% of the idle time paid for a
    probe; on a GPU a probe's two changes of pass size cost three cold passes (2.4 ms
    each, the H200's 0.8B twin): α is left as measured and the probe waits for that too."""

    def idle(cold_excess: float) -> AdaptiveDrafter:
        d = drafter_with(a=0.0016, b=0.00036, c=0.00027, alpha=0.14)
        d.alpha["draft"].prior_value = 0.7
        d.verify.cold_passes, d.verify.after_each_change = GRAPH_WARMUP, True
        d.verify.cold_excess = cold_excess
        d._last, text = Choice("none", 0, 1.0), [1, 2, 3]
        for _ in range(40):
            text = [*text, 5]
            d.accept(text, Outcome(0, 0, 0.0016))
        return d

    cpu, gpu = idle(cold_excess=0.0), idle(cold_excess=0.0024)
    assert cpu.alpha["draft"].alpha[0] > 0.3
    assert gpu.alpha["draft"].alpha[0] == pytest.approx(0.14)
    assert cpu._probe(lag=0).k == 1 and gpu._probe(lag=0).k == 0
    gpu.draft_idle_s = 1.0
    assert gpu._probe(lag=0).k == 1


def test_on_a_cpu_every_pass_is_timed():
    cost = VerifyCost()
    cost.time_pass(2, 0.160)
    assert cost.seconds == {2: 0.160}


def test_cheap_accurate_draft_is_used_deeply():
    choice = drafter_with(a=0.10, b=0.005, c=0.01, alpha=0.9).choose(matched=0, gamma=8)
    assert choice.source == "draft" and choice.k >= 4 and choice.gain > 1.5


def test_expensive_draft_means_plain_decoding():
    choice = drafter_with(a=0.10, b=0.05, c=0.08, alpha=0.7).choose(matched=0, gamma=8)
    assert choice.k == 0


def test_free_ngram_match_beats_the_draft_model_when_it_is_reliable():
    d = drafter_with(a=0.10, b=0.005, c=0.05, alpha=0.6)
    d.alpha["ngram4"] = measured(0.95)
    assert d.choose(matched=6, gamma=8).source.startswith("ngram")


F16_CPU_T = [0.0789, 0.143, 0.159, 0.159, 0.162, 0.162, 0.210, 0.220]  # T(1..8), 2 cores


def on_cpu(d: AdaptiveDrafter, seconds: list[float]) -> AdaptiveDrafter:
    """T(1..8) as measured on 2 CPU cores (F16_CPU_T, the F16 target: T(2) is 1.8 T(1),
    T(6) 2 T(1))."""
    for k, t in enumerate(seconds, 1):
        d.verify.seconds[k] = t
    return d


def test_a_source_not_yet_seen_is_judged_at_its_prior_at_every_depth():
    """Where a 2-token pass costs most of a 6-token one, trying a new source on one token
    is the dearest way to learn its α (the F16 pair: the draft model, tried on one token
    at 1.8 T(1), was judged not to pay and never drafted deeply)."""
    d = on_cpu(drafter_with(a=0.0789, b=0.0, c=0.0099, alpha=0.7), F16_CPU_T)
    d.alpha["draft"] = Acceptance.prior(0.7)
    choice = d.choose(matched=0, gamma=8)
    assert choice.source == "draft" and choice.k >= 4 and choice.gain > 1
    d.alpha["ngram4"] = Acceptance.prior(0.65)
    d.model = None
    assert d.choose(matched=8, gamma=8, n=4).k >= 4  # a new n-gram length likewise


@pytest.mark.parametrize(("a", "c", "tried"), [(0.0792, 0.0105, True), (0.0385, 0.0104, False)])
def test_a_draft_model_not_yet_tried_must_pay_on_the_prior_cost_line(
    a: float, c: float, tried: bool
) -> None:
    """Its first try pays the prompt's catch-up, so it is made where the priors say it
    pays (the F16 target: c = 0.13 T(1)), not just to time T(2), which an untimed size
    would be assumed to cost as T(1) (the Q4_K_M target: c = 0.27 T(1), where the draft
    model tried on one token cost 4-8% on every short prompt, then stayed off)."""
    d = drafter_with(a=a, b=0.0, c=c, alpha=0.7)
    d.verify = VerifyCost()
    d.verify.observe(1, a)  # one plain round timed
    d.alpha["draft"] = Acceptance.prior(0.7)
    d.model.catchup_s = 0.0034  # type: ignore[union-attr]
    choice = d.choose(matched=0, gamma=8, lag=60)
    assert (choice.source == "draft") == tried and (choice.k > 0) == tried


def test_p_min_of_a_one_token_draft_is_its_verify_slot_at_the_rounds_rate():
    d = drafter_with(a=0.10, b=0.02, c=0.01, alpha=0.8)
    assert d.p_min(Choice("draft", 1, 1.5)) == [pytest.approx(1.5 * 0.02 / 0.10)]


def test_p_min_lets_a_deep_draft_pay_for_a_dear_second_slot():
    """A first token that alone would not pay its verify slot (64 ms of a 79 ms step) can
    open a deep draft that does; past the second slot, tokens are nearly free."""
    d = on_cpu(drafter_with(a=0.0789, b=0.0, c=0.0099, alpha=0.85), F16_CPU_T)
    assert d.p_min(Choice("draft", 1, 1.4)) == [0.9]  # 1.4 × 64/79, clipped
    deep = d.p_min(Choice("draft", 5, 1.4))
    assert deep[0] < 0.7 and deep[1] < 0.4 and max(deep[2:]) < 0.1
    after_ngram = d.p_min(Choice("ngram+draft", 5, 1.4, ngram=2))
    assert len(after_ngram) == 3 and after_ngram[0] <= deep[2] + 0.05


def probes_in(d: AdaptiveDrafter, rounds: int, a: float, b: float, c: float) -> int:
    """Rounds of plain decoding (and probes that miss) in which the draft model is tried."""
    probes = 0
    for _ in range(rounds):
        choice = d.choose(matched=0, gamma=8)
        d._last = choice
        spent = a if choice.k == 0 else a + choice.k * (b + c)
        d.accept([], Outcome(choice.k, 0, spent))
        probes += choice.k > 0
    return probes


def test_idle_sources_are_probed_on_a_small_budget():
    d = drafter_with(a=0.10, b=0.05, c=0.02, alpha=0.3)
    probes = probes_in(d, 400, a=0.10, b=0.05, c=0.02)
    assert 1 <= probes <= 20  # noticed, but probing stays a small share


def test_a_draft_model_that_could_not_pay_on_its_best_text_is_not_probed():
    """The Q4_K_M pair on this project's 2 cores (Spec-Bench run, quiet machine): T(2) is
    2 T(1), and a draft model right every time would reach 0.92x plain decoding at best;
    probes there cost up to PROBE_SHARE of the time and can find nothing (the same pair
    on a busy machine, T(2) 1.7 T(1): 0.95x at α 0.9)."""
    quiet = [0.0296, 0.0589, 0.0806, 0.0975, 0.123, 0.147, 0.169, 0.224]
    d = on_cpu(drafter_with(a=0.0296, b=0.0, c=0.0102, alpha=0.3), quiet)
    assert not d.draft_could_pay()
    assert probes_in(d, 2000, a=0.0296, b=0.029, c=0.0102) == 0
    busy = [0.0337, 0.0573, 0.0753, 0.0907, 0.114, 0.131, 0.156, 0.213]
    assert not on_cpu(drafter_with(a=0.0337, b=0.0, c=0.0103, alpha=0.3), busy).draft_could_pay()
    f16 = on_cpu(drafter_with(a=0.0789, b=0.0, c=0.0098, alpha=0.3), F16_CPU_T)
    assert f16.draft_could_pay()  # the F16 target: the draft model pays on code
    cheaper = drafter_with(a=0.0296, b=0.004, c=0.0102, alpha=0.3)  # a GPU-like T(k)
    assert cheaper.draft_could_pay() and probes_in(cheaper, 2000, 0.0296, 0.004, 0.0102) > 0


REPLY = "def area(r):\n    return 3.14159 * r * r\n" * 3


def conversation(draft_reply: str, target_cost=(0.004, 0.0005), draft_cost=(0.0, 0.0003)):
    reply = REPLY
    # costs booked, not slept: auto reads them as on a quiet machine, whatever the load
    target = ToyModel(scripted(reply), pass_s=target_cost[0], token_s=target_cost[1], sleep=False)
    draft = ToyModel(
        scripted(draft_reply), pass_s=draft_cost[0], token_s=draft_cost[1], sleep=False
    )
    return target, draft, reply


def test_auto_speeds_up_a_good_draft_and_picks_plain_for_a_useless_one():
    target, draft, reply = conversation(draft_reply=REPLY)
    good = list(auto_engine(target, draft).generate(target.tokenize("<|assistant|>")))
    rounds = [e for e in good if isinstance(e, RoundEnd)]
    assert good[-1].text == reply
    assert good[-1].stats.mean_accepted_len > 2.5 and rounds[-1].why

    # a draft that is always wrong and costs 40% of a target pass per token
    target, draft, reply = conversation("z" * 200, draft_cost=(0.0, 0.002))
    bad = list(auto_engine(target, draft).generate(target.tokenize("<|assistant|>")))
    rounds = [e for e in bad if isinstance(e, RoundEnd)]
    assert bad[-1].text == reply
    assert sum("draft" in e.drafter for e in rounds) <= 6  # a first try, then plain
    assert any(e.drafter in ("ngram", "suffix") and e.accepted for e in rounds)  # it repeats


def test_short_ngram_matches_are_judged_apart_from_long_ones():
    d = drafter_with(a=0.10, b=0.01, c=0.05, alpha=0.3)
    d.alpha["ngram4"] = measured(0.9)
    for _ in range(30):  # 2-token matches keep failing
        d._match_n, d._last = 2, Choice("ngram", 2, 1.0, 2)
        d.accept([], Outcome(2, 0, 0.12))
    assert "ngram" not in d.choose(matched=4, gamma=4, n=2).source
    assert d.choose(matched=4, gamma=4, n=4).source.startswith("ngram")


def test_a_failed_retry_after_an_idle_recovery_counts_against_what_was_measured():
    """Idle rounds raise a low α toward its prior so the draft gets retried; a miss on
    the retry takes it back to what was measured, one more miss on top. A nearly free
    draft that is always wrong (an MTP head on a GPU, ~0.05 T(1)) was otherwise retried
    every ~3 rounds: a miss took 15% off, the idle rounds put more back."""
    a = Acceptance.prior(0.8, depth=4)
    for _ in range(20):
        a.observe(1, 0)  # always wrong
    low = a.alpha[0]
    for _ in range(30):
        a.recover(RECOVER)
    assert a.alpha[0] > low + 0.1
    a.observe(1, 0)  # the retry fails
    assert a.alpha[0] < low
    for _ in range(30):
        a.recover(RECOVER)
    raised = a.alpha[0]
    a.observe(1, 1)  # a retry that is right keeps the raise
    assert a.alpha[0] > raised


def test_an_unlucky_start_does_not_switch_the_draft_model_off_for_good():
    """Three misses on an answer's opening turn the draft off; while plain decoding runs,
    its α recovers toward the prior, so it is drafted with again within a few rounds
    (seen on a chat prompt whose draft agrees 79% of the time: off after three misses,
    for 120 tokens; at 2% a token, off for ~80 rounds of an answer whose first 20 tokens
    the draft had 60% right, 79% in all)."""
    d = drafter_with(a=0.104, b=0.0, c=0.0125, alpha=0.7)
    for k, t in enumerate([0.104, 0.146, 0.150, 0.154, 0.168, 0.174, 0.229, 0.241], 1):
        d.verify.seconds[k] = t  # the F16 target's costs measured with the Q4_0 draft
    d.alpha["draft"] = Acceptance.prior(0.7)
    for _ in range(3):
        d._last = Choice("draft", 1, 1.0)
        d.accept([], Outcome(1, 0, 0.114))
    assert d.choose(matched=0, gamma=8).k == 0
    plain = 0
    while d.choose(matched=0, gamma=8).source != "draft":
        d._last = Choice("none", 0, 1.0)
        d.accept([], Outcome(0, 0, 0.104))
        plain += 1
    assert 1 <= plain <= 10  # the misses count, for a round or more
    assert d.alpha["draft"].alpha[0] < 0.7  # never past the prior


def test_a_draft_that_does_not_pay_at_its_prior_stays_off():
    d = drafter_with(a=0.10, b=0.05, c=0.08, alpha=0.7)
    d.alpha["draft"] = Acceptance.prior(0.7)
    d._last = Choice("draft", 1, 1.0)
    d.accept([], Outcome(1, 0, 0.15))
    for _ in range(200):
        d._last = Choice("none", 0, 1.0)
        d.accept([], Outcome(0, 0, 0.10))
        d.draft_idle_s = 0.0  # leave probing out: recovery alone must not bring it back
        assert d.choose(matched=0, gamma=8).k == 0
    assert d.alpha["draft"].alpha[0] == pytest.approx(0.7, abs=0.01)


def test_a_draft_cut_short_by_p_min_counts_as_a_miss_where_it_stopped():
    """The Q4_K_M target with the Q4_0 draft: p_min is high, so planned deep drafts stop
    after one confident token. Each such round paid a stopped draft step and a 2-token
    verify for ~1.9 tokens; auto must plan by what it got, not by what it planned."""
    d = drafter_with(a=0.0334, b=0.0, c=0.0099, alpha=0.98)  # the answer opened easy
    d.verify = VerifyCost()
    for k, t in enumerate([0.0334, 0.0587, 0.0748, 0.101], 1):  # larger batches untimed
        d.verify.observe(k, t)
    planned = []
    for _ in range(8):
        d._last = d.choose(matched=0, gamma=8)
        planned.append(d._last.k)
        if d._last.k == 0:
            break
        d.accept([], Outcome(1, 1, 0.0587))  # one token drafted, right; then a stop
    assert planned[0] >= 2 and planned[-1] == 0 and len(planned) <= 4  # before: forever
    first, second = d.alpha["draft"].alpha[:2]
    assert second < 0.85 and first > 0.98  # the stop is a miss at the second position


def rounds_until_the_draft_model_is_probed(conversation_len: int) -> int:
    """Plain rounds (Q4_K_M-like costs on this project's CPU) until an idle draft model
    that has read nothing of a `conversation_len`-token chat is tried again."""
    d = drafter_with(a=0.034, b=0.02, c=0.010, alpha=0.3)
    d.model.catchup_s = 0.003  # type: ignore[union-attr]
    context = [i % 250 for i in range(conversation_len)]
    for rounds in range(20_000):
        lag = d.model.unread(context)  # type: ignore[union-attr]
        choice = d.choose(matched=0, gamma=8, lag=lag)
        if "draft" in choice.source:
            return rounds
        d._last = choice
        d.accept([], Outcome(0, 0, 0.034))
    return 20_000


def test_a_draft_model_left_off_through_a_long_chat_is_still_probed_again():
    """It reads at most a window of what it missed, so the probe that notices a change of
    topic costs the same after 2,000 tokens as after 50,000 (it cost 25 times more)."""
    from localspec.decoding.drafters import WINDOW

    near, far = (rounds_until_the_draft_model_is_probed(n) for n in (2_000, 50_000))
    assert far == near < 20_000
    assert near == pytest.approx(WINDOW * 0.003 / 0.034 / 0.02, rel=0.1)  # PROBE_SHARE


def test_under_load_gamma_falls_as_slots_fill_and_comes_back_as_they_empty():
    """GPU-like costs (a pass of a few tokens costs about one of one token): alone, a
    deep draft pays; each extra token delays every slot's pass, so with 8 slots sharing
    the passes the same drafter drafts less, and alone again, as before."""
    a, b = 0.010, 0.0006
    d = drafter_with(a=a, b=b, c=0.001, alpha=0.8)
    alone = d.choose(matched=0, gamma=8)
    passes = VerifyCost()
    for k in range(1, 48):  # the shared passes' times, by tokens in the pass
        passes.observe(k, a + b * (k - 1))
    slots = [1]
    d.load = Load(lambda: slots[0], passes)
    assert d.choose(matched=0, gamma=8) == alone  # one slot: exactly as before
    depths = []
    for n in (2, 4, 8):
        slots[0] = n
        depths.append(d.choose(matched=0, gamma=8).k)
    assert alone.k >= depths[0] >= depths[1] >= depths[2] and depths[2] < alone.k
    # and a drafted token must be surer to pay its slot in a fuller pass
    slots[0] = 1
    p_alone = d.p_min(alone)
    slots[0] = 4
    assert all(loaded > p for loaded, p in zip(d.p_min(alone), p_alone, strict=True))
    slots[0] = 1
    assert d.choose(matched=0, gamma=8) == alone


def test_under_load_the_slots_draft_to_one_depth_and_a_slot_alone_in_its_wish_does_not():
    """A draft step is one pass of the draft model for every slot drafting, and each slot
    waits for it: a slot that drafts deeper than the others makes them all wait for its
    steps. So the slots draft to one depth, the best for the pass's tokens/s over all of
    them (each publishes its E(k) in the Load they share). Four alike find each other
    within a round and all draft to the same depth; a slot whose draft model drafts well
    among three whose drafts miss stays plain, and so do they."""
    a, b, c = 0.060, 0.004, 0.012  # a CPU pass grows by b a token; a draft step costs c
    passes = VerifyCost()
    for k in range(1, 48):
        passes.observe(k, a + b * (k - 1))

    def slots(alphas: list[float]) -> list[AdaptiveDrafter]:
        expects: dict[int, list[float] | None] = dict.fromkeys(range(len(alphas)))
        out = []
        for i, alpha in enumerate(alphas):
            d = drafter_with(a=a, b=b, c=c, alpha=alpha)
            d.load = Load(lambda: len(alphas), passes, lambda: 1.0, i, expects)
            out.append(d)
        return out

    alike = slots([0.8] * 4)
    first = [d.choose(matched=0, gamma=8) for d in alike]
    assert first[0].source == "none" and first[-1].source == "draft"  # the later see more
    again = [d.choose(matched=0, gamma=8) for d in alike]
    assert {(c.source, c.k) for c in again} == {("draft", again[0].k)}  # one depth for all
    alone = slots([0.8, 0.2, 0.2, 0.2])
    for _ in range(2):
        assert all(d.choose(matched=0, gamma=8).source == "none" for d in alone)
    load = alike[3].load
    assert load is not None
    load.leave()
    assert load.expects[3] is None  # it drafts no more: the others decide without it


def test_the_common_depth_maximizes_the_passs_tokens_per_second():
    """`common_depth` over plain data: GPU-like costs (a pass of 36 tokens about one of
    4) let good drafts go deep; on a CPU, where four slots' pass of 12 tokens costs half
    as much again as one of 4, the same drafts stay shallow; poor ones do not draft; a
    slot that drafts poorly pulls the depth down for all; the gain is the pass's rate
    over plain decoding's; a slot that may draft fewer tokens drafts what it may."""
    good = [0.8 * (1 - 0.8**k) / 0.2 for k in range(1, 9)]  # E(k) - 1 at α = 0.8
    poor = [0.2 * (1 - 0.2**k) / 0.8 for k in range(1, 9)]
    gpu = [0.010 + 0.0001 * (k - 1) for k in range(1, 40)]
    cpu = [0.100 + 0.010 * (k - 1) for k in range(1, 40)]
    deep, _ = common_depth([good] * 4, 4, 0.0005, gpu)
    shallow, gain = common_depth([good] * 4, 4, 0.020, cpu)
    assert deep >= 5 and 1 <= shallow <= 3
    rate = (4 + 4 * good[shallow - 1]) / (shallow * 0.020 + cpu[4 + 4 * shallow - 1])
    assert gain == pytest.approx(rate / (4 / cpu[3]))
    assert common_depth([poor] * 4, 4, 0.020, cpu) == (0, 1.0)
    mixed, _ = common_depth([good, good, poor, poor], 4, 0.020, cpu)
    assert mixed < shallow
    assert common_depth([], 4, 0.020, cpu) == (0, 1.0)
    # a slot that may draft one token more (its answer's last) does not hold the others
    assert common_depth([good] * 3 + [good[:1]], 4, 0.0005, gpu)[0] >= 5
    # a draft model still to read its prompt pays that too: a marginal depth no longer pays
    _, marginal = common_depth([good] * 4, 4, 0.020, cpu)
    assert common_depth([good] * 4, 4, 0.020, cpu, fixed=0.5)[1] < marginal
    assert common_depth([good] * 4, 4, 0.020, cpu, fixed=1.0) == (0, 1.0)
    # a pass timed slower than a larger one (a noisy host) does not make the larger cheap
    dip = cpu[:12] + [0.05] * 27
    assert common_depth([good] * 4, 4, 0.020, dip) == common_depth(
        [good] * 4, 4, 0.020, cpu[:12] + [cpu[11]] * 27
    )


def test_under_load_a_round_times_only_itself_alone():
    """A shared pass's time holds the other slots' tokens: it does not teach T(k)."""
    d = drafter_with(a=0.10, b=0.05, c=0.08, alpha=0.7)
    before = dict(d.verify.seconds)
    d.load = Load(lambda: 4, VerifyCost())
    d.choose(matched=0, gamma=8)
    d._last = Choice("none", 0, 1.0)
    d.accept([1, 2, 3], Outcome(0, 0, 0.9))
    assert d.verify.seconds == before


def test_a_completion_starts_from_the_priors_fitted_for_completions():
    from localspec.decoding.adaptive import AdaptiveDrafter
    from localspec.decoding.prediction import Prediction
    from localspec.decoding.priors import (
        FIM_NGRAM_PRIOR,
        FIM_PREDICTION_PRIOR,
        NGRAM_PRIOR,
        ngram_key,
        prediction_key,
    )

    auto = AdaptiveDrafter()
    auto.alpha[ngram_key(4)].observe(4, 4)  # what a conversation taught it
    taught = auto.alpha[ngram_key(4)].alpha[:]
    auto.predict(Prediction([1, 2, 3], 10, anchored=False))  # a fill-in-the-middle
    assert auto.alpha[prediction_key(8)].alpha[0] == FIM_PREDICTION_PRIOR[8]
    assert auto.alpha[ngram_key(3)].alpha[0] == FIM_NGRAM_PRIOR[3]
    auto.predict(Prediction([1, 2, 3], 10, anchored=False))  # the next keystroke
    auto.predict(None)  # a chat again: what it had learned comes back
    assert auto.alpha[ngram_key(4)].alpha == taught
    assert auto.alpha[ngram_key(2)].alpha[0] == NGRAM_PRIOR[2]
    auto.predict(Prediction([1, 2, 3], 10))  # an edit's prediction keeps its own priors
    assert auto.alpha[prediction_key(8)].alpha[0] != FIM_PREDICTION_PRIOR[8]


def test_a_moe_targets_untimed_passes_cost_at_least_the_experts_they_read() -> None:
    """Before a size is timed, T(k) is guessed from the line or the largest timed one;
    a MoE target's k-token pass reads more experts than one token's, and the guess knows."""
    growth = (1.0, 1.45, 1.85, 2.2)
    cost = VerifyCost(growth=growth)
    cost.observe(1, 0.010)
    table = cost.table(4)
    assert table[0] == 0.010
    assert table[1:4] == pytest.approx([0.0145, 0.0185, 0.022])
    assert cost.prior_table(4)[1:] == pytest.approx([0.0145, 0.0185, 0.022])
    dense = VerifyCost()
    dense.observe(1, 0.010)
    assert dense.table(2)[1] == 0.010  # the next size up is tried as cheap: timed then
    cost.observe(2, 0.012)  # timed: the measurement wins over the guess
    assert cost.table(2)[1] == pytest.approx(0.012)


def test_what_a_draft_models_round_costs_beyond_its_steps_is_priced():
    """A recurrent draft model copies its state before each draft and goes back to it
    after a rejection: a cost per round, not per token, that a draft has to pay for."""
    d = drafter_with(a=0.10, b=0.005, c=0.01, alpha=0.9)
    assert d.choose(matched=0, gamma=8).source == "draft"
    assert d.model is not None
    d.model.round_s = 0.5  # five plain passes' worth a round: drafting cannot pay it
    assert d.choose(matched=0, gamma=8).k == 0


def test_a_completion_pays_a_new_prompts_catch_up_within_its_few_rounds() -> None:
    """The F16 target on 2 cores and a fresh 535-token completion prompt: the draft
    model's catch-up (1.3 s) spread over a chat answer's rounds pays, but a middle of
    ~20 tokens does not earn it back (in the fim bench such requests ran at 0.25-0.55x
    plain decoding); once the draft model has read ahead, the completion drafts with it."""
    from localspec.decoding.prediction import Prediction

    d = on_cpu(drafter_with(a=0.0789, b=0.0, c=0.0099, alpha=0.9), F16_CPU_T)
    d.model.catchup_s = 0.0025  # type: ignore[union-attr]
    assert d.choose(matched=0, gamma=8, lag=535).source == "draft"  # a chat
    d.predict(Prediction([1, 2, 3], 10, anchored=False))  # a fill-in-the-middle
    assert d.choose(matched=0, gamma=8, lag=535).source != "draft"
    assert d.choose(matched=0, gamma=8, lag=20).source == "draft"  # read ahead
    d.predict(None)
    assert d.choose(matched=0, gamma=8, lag=535).source == "draft"


def test_a_fresh_completion_keeps_its_suffix_alpha_apart_from_the_keystrokes():
    """At a keystroke the slot's earlier text re-joins the last middle, and short suffix
    runs are right nearly always; in a fresh completion (another file) the same short
    runs are other files' text. Drafted on the keystrokes' α they all missed (F16 target,
    2 cores of an EPYC), so a completion that shares less than half its prompt with the
    last one keeps α of its own."""
    from localspec.decoding.prediction import Prediction

    d = drafter_with(a=0.03, b=0.003, c=0.01, alpha=0.0)
    d.model = None  # the suffix index alone
    d.alpha["suffix2"] = measured(0.95)
    d.alpha["fresh-suffix2"] = measured(0.05)
    params, rng = SamplingParams(), np.random.default_rng(0)
    old = [*range(100, 160), *range(5, 30)]  # a completion's prompt, then its middle
    d.predict(Prediction([1], 60, anchored=False))
    d.draft(old, 8, params, rng)
    keystroke = [*old[:40], 42, *old[40:60], 77, 5, 6]  # most of it the last prompt
    d.predict(Prediction([1], 61, anchored=False))
    assert d.draft(keystroke, 8, params, rng).tokens[:3] == [7, 8, 9]
    assert d.free_key() == "suffix2"
    fresh = [*range(300, 360), 77, 5, 6]  # another file, with the same 2-token run
    d.predict(Prediction([1], 60, anchored=False))
    assert d.draft(fresh, 8, params, rng).tokens == []
    assert d.key("suffix", 2) == "fresh-suffix2"
    d.predict(None)  # a chat's turn: its suffix matches are never a fresh completion's
    assert d.draft([*range(400, 460), 77, 5, 6], 8, params, rng).tokens[:3] == [7, 8, 9]


def test_a_pass_with_the_grammars_forced_tokens_times_its_whole_size():
    """Jump-forward: a round's pass holds the forced tokens before the drafter's. Its
    time teaches T of the whole pass, not a pro-rata share as T of the drafter's part (a
    T(1) learned as a fifth of T(5) would make every draft look dear)."""
    from localspec.decoding.engine import drafters_part

    assert drafters_part(Outcome(6, 5, 0.3), 4) == Outcome(2, 1, 0.3, 4, forced_accepted=4)
    refused = Outcome(0, 0, 0.3, forced=4, forced_accepted=2)
    assert drafters_part(Outcome(4, 2, 0.3), 4) == refused
    assert drafters_part(Outcome(3, 3, 0.3), 0) == Outcome(3, 3, 0.3)
    d = drafter_with(a=0.10, b=0.05, c=0.08, alpha=0.7)
    before = dict(d.verify.seconds)  # T(1) 0.10 ... T(5) 0.30
    d._last = Choice("none", 0, 1.0)
    d.accept([1, 2, 3], drafters_part(Outcome(4, 4, 0.16), 4))  # a pass of 5 in 0.16 s
    assert d.verify.seconds[1] == before[1] and d.verify.seconds[5] < before[5]


def test_a_draft_after_the_grammars_forced_tokens_is_priced_in_their_pass():
    """Jump-forward's tokens go in the same pass: a draft after them lengthens a pass
    that already yields forced + 1 tokens, so it must beat that round's rate, not plain
    decoding's (on a CPU line a + b(k - 1): 13 tokens in 0.34 s against 1 in 0.10 s)."""
    d = drafter_with(a=0.10, b=0.02, c=0.01, alpha=0.7)
    alone = d.choose(matched=0, gamma=8)
    assert alone.source == "draft" and alone.k >= 1  # 1.7 tokens in 0.13 s beat 1 in 0.10
    after = d.choose(matched=0, gamma=8, forced=12)
    assert after.source == "none"  # 13.7 tokens in 0.37 s do not beat 13 in 0.34
    assert d.choose(matched=0, gamma=8, forced=0) == alone


def test_a_sampled_answers_forced_tokens_are_drafted_as_far_as_they_pay():
    """Sampled, a forced text's split is the target's to choose (`"ev` `i` `de` `nce`),
    so each forced token is a bet: `auto` drafts as many of them as their acceptance,
    measured on such leads, pays for in the pass; greedy answers keep them all."""
    d = drafter_with(a=0.10, b=0.03, c=0.08, alpha=0.7)
    assert d.lead_worth(4) == 4  # the prior: most splits are the tokenizer's
    d._last = Choice("none", 0, 1.0)
    sampled = SamplingParams(temperature=1.0, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(12):  # leads of 4 refused at their first token, again and again
        d.draft([1, 2, 3, 4, 5, 6, 7], 8, sampled, rng, forced=4)
        d.accept([1, 2, 3, 9], Outcome(0, 0, 0.13, forced=4, forced_accepted=0))
    assert d.lead_worth(6) == 0
    draft = d.draft([1, 2, 3, 4, 5, 6, 7], 8, sampled, rng, forced=4)
    assert draft.lead == 0 and draft.tokens == []
    # a greedy answer's forced tokens are its own split: all drafted, whatever α says
    greedy = d.draft([1, 2, 3, 4, 5, 6, 7], 8, SamplingParams(), rng, forced=4)
    assert greedy.lead is None
    for _ in range(12):  # leads taken whole again
        d.draft([1, 2, 3, 4, 5, 6, 7], 8, sampled, rng, forced=4)
        d.accept([1, 2, 3, 4, 5, 6, 7, 9], Outcome(0, 0, 0.13, forced=4, forced_accepted=4))
    assert d.lead_worth(4) >= 3


def test_a_free_match_is_drafted_only_as_far_as_the_grammar_takes_it():
    """A keystroke's last middle comes back from the suffix index; where the character
    typed next is another one, the opening grammar refuses the match past the spaces.
    The round drafts what the grammar takes (priced so), not a deep pass of tokens the
    target must reject."""
    from localspec.decoding.estimates import PREDICTION_GAMMA_MAX as DEEP
    from localspec.decoding.opening import Opening

    model = ToyModel(scripted("x"), n_vocab=258)
    d = AdaptiveDrafter(model)
    d.model = None  # free sources alone
    for k, t in enumerate(Q4_EPYC_T, 1):
        d.verify.observe(k, t)
    prompt = list(b"<fim_middle>")
    context = [*prompt, *b"  return x + 1\n", *b"<fim_suffix>", *prompt]
    for n in range(1, 40):
        d.alpha[f"suffix{n}"] = Acceptance([0.98] * DEEP, [10] * DEEP)
    params, rng = SamplingParams(), np.random.default_rng(0)
    free = d.draft(context, 16, params, rng)
    assert free.by == "suffix" and bytes(free.tokens).startswith(b"  return")
    typed = Opening(model, "  y").start()  # the author typed `y`
    assert d.draft(context, 16, params, rng, grammar=typed).tokens == list(b"  ")
    going_on = Opening(model, "  re").start()  # typed as the middle began
    assert bytes(d.draft(context, 16, params, rng, grammar=going_on).tokens) == bytes(free.tokens)


def test_under_load_a_draft_step_is_priced_by_the_draft_models_shared_passes():
    """A step of the slots drafting together is one pass of the draft model with a
    token of each: its time by tokens in the pass, not one slot's step timed alone."""
    passes, draft_passes = VerifyCost(), VerifyCost()
    load = Load(lambda: 4, passes, lambda: 3.0, 0, {}, draft_passes)
    assert load.draft_step(0.012) == 0.012  # no shared step timed yet: the fallback
    for k, t in ((1, 0.010), (3, 0.016), (4, 0.019)):
        draft_passes.observe(k, t)
    assert load.draft_step(0.012) == pytest.approx(0.016)  # three slots draft
    assert Load(lambda: 4, passes).draft_step(0.012) == 0.012  # no draft model's passes


def test_with_a_cache_per_slot_a_round_pays_for_the_pass_its_extra_tokens_get():
    """With a cache per slot llama.cpp reads a pass whose slots bring unequal token
    counts in several: a round's tokens beyond the others' go in a pass of their own,
    which all the slots wait for (serve keeps one cache per slot where drafting under load
    does not pay, as with the Q4_K_M pair on a CPU). So a 3-token n-gram match that pays
    in one shared pass does not pay there; a sure 12-token prediction still does."""
    from localspec.decoding.priors import prediction_key

    a, b, c = 0.100, 0.010, 0.040
    passes = VerifyCost()
    for k in range(1, 48):
        passes.observe(k, a + b * (k - 1))

    def drafter(splits: bool) -> AdaptiveDrafter:
        d = drafter_with(a=a, b=b, c=c, alpha=0.3)
        d.alpha["ngram3"] = measured(0.7)
        d.load = Load(lambda: 4, passes, splits=splits)
        return d

    assert drafter(splits=False).choose(matched=3, gamma=3, n=3).source == "ngram"
    assert drafter(splits=True).choose(matched=3, gamma=3, n=3).source == "none"
    sure = drafter(splits=True)
    sure.alpha[prediction_key(8)] = Acceptance([0.98] * 16, [10] * 16)
    choice = sure.choose(matched=12, gamma=12, n=8, free="prediction")
    assert choice.source == "prediction" and choice.k >= 8


def test_under_load_a_copy_measured_sure_is_not_bet_on_as_a_sure_thing():
    """Shadows of a copied text hit round after round and take the suffix index's α to
    0.999, and the copy ends all the same. Alone a deep draft costs ~4 plain rounds and
    pays at ~3 of 15 tokens kept; four slots with a cache per slot all wait for its pass
    (the Q4_K_M target on 2 cores, as traced: 4 slots' tokens in 115 ms, with one slot's
    15 more in 540), so it pays only if nearly all are kept, priced at 1.01x. Counting no
    position surer than a moving average's ~12 observations vouch for, it does not, and
    it is not drafted (traced, such drafts kept 3, 0 and 1 of 15, 10 and 5). A prediction
    at the same α is (its α is this request's own); two slots still draft the copy; a
    moderate α is counted as measured; alone nothing changes."""
    from localspec.decoding.estimates import SUREST
    from localspec.decoding.priors import prediction_key

    passes = VerifyCost()
    for k, ms in {1: 72, 2: 120, 3: 112, 4: 115, 10: 284, 15: 425}.items():
        passes.observe(k, ms / 1000)
    copied = Acceptance([0.999] * 16, [38] * 16)
    assert copied.expected(1, SUREST) == [SUREST] and SUREST < 0.92  # however many hits
    assert copied.expected(15, SUREST)[-1] < 0.6 * copied.expected(15)[-1]
    assert measured(0.8).expected(8, SUREST) == measured(0.8).expected(8)

    def choice(slots: int, free: str = "suffix") -> Choice:
        d = drafter_with(a=0.072, b=0.025, c=0.04, alpha=0.3)
        d.alpha[prediction_key(16) if free == "prediction" else "suffix16"] = copied
        if slots > 1:
            d.load = Load(lambda: slots, passes, splits=True)
        return d.choose(matched=15, gamma=16, n=16, free=free)

    assert choice(4).source == "none"
    sure = choice(4, "prediction")
    assert sure.source == "prediction" and 1.0 < sure.gain < 1.05
    assert choice(2).source == "suffix" and choice(2).k >= 4
    assert choice(1).source == "suffix" and choice(1).k == 15


def test_a_long_request_drafts_nothing_while_it_gives_way_to_a_short_one():
    """A chat beside an editor's completion, on passes where the chat's tokens make the
    completion's dear (the worker's `_yields`, scheduling.dearer): the chat drafts
    nothing, not even a sure copy; once the completion is done, it drafts again."""
    passes = VerifyCost()
    for k, ms in {1: 75, 2: 105, 3: 112, 4: 115}.items():
        passes.observe(k, ms / 1000)
    beside = [True]
    d = drafter_with(a=0.075, b=0.01, c=0.04, alpha=0.3)
    d.alpha["suffix16"] = measured(0.95)
    d.load = Load(lambda: 2, passes, yields=lambda: beside[0])
    assert d.choose(matched=8, gamma=8, n=16, free="suffix").source == "none"
    beside[0] = False
    assert d.choose(matched=8, gamma=8, n=16, free="suffix").source == "suffix"


def test_a_new_texts_alpha_starts_no_lower_than_all_the_draft_model_has_seen():
    """The moving average follows the last text: a few misses where one answer ended
    kept the draft model off for ~50 rounds of the next, unrelated one (F16 target, JSON
    cases one after another), where a fixed γ of 4 had 69% of its drafts accepted."""
    a = Acceptance.prior(0.7, depth=4)
    for _ in range(40):
        a.observe(2, 2)
        a.observe(2, 1)
    for _ in range(5):
        a.observe(2, 0)  # the last text's end
    low = list(a.alpha)
    a.restart()
    assert a.alpha[0] > low[0] + 0.3 and a.alpha[0] == pytest.approx(
        (a.hits[0] + 2 * 0.7) / (a.seen[0] + 2)
    )
    for _ in range(30):
        a.observe(2, 2)  # a text it drafts better than ever
    high = list(a.alpha)
    a.restart()
    assert a.alpha == high  # never lowered


def test_a_new_request_drafts_again_where_the_last_one_ended_on_misses():
    d = drafter_with(a=0.104, b=0.0, c=0.0125, alpha=0.7)
    for k, t in enumerate([0.104, 0.146, 0.150, 0.154, 0.168, 0.174, 0.229, 0.241], 1):
        d.verify.seconds[k] = t  # the F16 target's costs measured with the Q4_0 draft
    d.model.catchup_s = 0.0  # type: ignore[union-attr]
    d.alpha["draft"] = Acceptance.prior(0.7)
    for accepted in [1, 0, 1, 1] * 10:  # earlier answers: 75% of its drafts right
        d._last = Choice("draft", 1, 1.0)
        d.accept([], Outcome(1, accepted, 0.146))
    params, rng = SamplingParams(), np.random.default_rng(0)
    text = [*range(100, 160)]
    for i in range(7):  # this one's end: misses
        d.draft(text, 8, params, rng)
        d._last = Choice("draft", 1, 1.0)
        text = [*text, 200 + i]
        d.accept(text, Outcome(1, 0, 0.146))
    d.draft(text, 8, params, rng)
    assert d._last is not None and d._last.k == 0  # the same text goes on: off
    d.draft([*range(300, 330)], 8, params, rng)  # another request, another text
    assert d._last is not None and d._last.source == "draft"
