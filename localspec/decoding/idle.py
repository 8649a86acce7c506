"""A draft model `auto` is not drafting with: when to try it (adaptive.py decides each
round; these are the prices it decides on).

An idle draft model, whose guesses cost a pass, is probed again once the time since its
last use would have paid for the probe PROBE_SHARE times over, so probing costs at most
that share; never where the costs say it could not pay even on text it drafts well
(GOOD_ALPHA).

An unseen one is judged at its prior α (0.7), which on a CPU where it pays only on text
it drafts well keeps it off, and a probe waits for more idle time than most answers run:
on 2 cores of a Xeon a fixed γ of 3 beat `auto` on code by 9-17% with the Q4_K_M pair.
So it gets a first try of FIRST_TRIES rounds once an answer has run FIRST_TRY_AFTER
tokens (a short answer never pays for the draft model's read of the prompt), where the
batch sizes timed so far, with no optimism for the others, say a draft right GOOD_ALPHA
of the time would beat plain decoding, and reading the text costs at most
FIRST_TRY_ROUNDS plain rounds; the α it measures decides from there. Before that, where
only one-token passes were timed, one round drafts free guesses (`free_guesses`) to time
a pass of TIMING_PASS tokens: where that costs 3.4 one-token ones (2 cores of an EPYC), the
draft model is never tried.
"""

from __future__ import annotations

from collections.abc import Sequence

PROBE_SHARE = 0.02  # at most this share of the time goes to probing an idle draft model
GOOD_ALPHA = 0.9  # the draft model's α on text it drafts well (code): a probe looks for it
RECOVER = 0.08  # per token made without the draft model, its low α closes this share of
# the gap to its prior
FIRST_TRY_AFTER = 16  # an unseen draft model's first try waits for this many answer tokens
# ... and reads the text so far in at most this many plain rounds' time (priced
# pessimistically until timed); a draft at 1.2x plain decoding saves that in ~70 tokens
FIRST_TRY_ROUNDS = 12
FIRST_TRY_MARGIN = 1.05  # ... and would beat plain decoding by this much at GOOD_ALPHA
FIRST_TRIES = 4  # rounds a first try lasts: one miss (1 in 8 at α 0.88) is no verdict
TIMING = "timing"  # a round that drafts free guesses to time a pass of TIMING_PASS tokens
# llama.cpp's repacked CPU kernels (Q4_0, Q4_K, IQ4_NL) take a pass's tokens four at a time
# and each one left over alone: on 2 cores of a Xeon T(2) was 1.2-1.7 T(1) and T(4)
# 1.4-1.8 T(1) (eleven bench runs of twelve), and the line through a timed 2-token pass,
# 1.7-3.1 T(1) at k = 4, kept the first try off for good where it was steep. A 4-token
# pass is what a 3-token draft costs, and on a GPU about what any small pass costs.
TIMING_PASS = 4


def good_draft_gains(t: Sequence[float], c: float, depth: int) -> list[float]:
    """Speed over plain decoding of drafts of k = 1..depth tokens by a draft model right
    GOOD_ALPHA of the time (Leviathan et al.'s E(k) at a constant α), at c a token and
    t[k - 1] = T(k) for a pass of k tokens (0 where nothing is timed yet)."""
    gains = []
    for k in range(1, depth + 1):
        cost = k * c + t[k]
        tokens = (1 - GOOD_ALPHA ** (k + 1)) / (1 - GOOD_ALPHA)
        gains.append(tokens * t[0] / cost if cost > 0 else 0.0)
    return gains


def first_try_depth(t: Sequence[float], c: float, depth: int) -> tuple[int, float] | None:
    """The depth of a first try and its gain at GOOD_ALPHA on `t` (T(k), priced with no
    optimism), or None where that gain stays below FIRST_TRY_MARGIN."""
    gains = good_draft_gains(t, c, depth)
    k = max(range(depth), key=gains.__getitem__, default=-1)
    return (k + 1, gains[k]) if k >= 0 and gains[k] >= FIRST_TRY_MARGIN else None


def free_guesses(context: Sequence[int], n: int) -> list[int]:
    """n guesses of the next tokens at no cost, each the last one's `last_follower`."""
    text, guesses = list(context), []
    for _ in range(n):
        guesses.append(last_follower(text))
        text.append(guesses[-1])
    return guesses


def last_follower(context: Sequence[int]) -> int:
    """A free guess of the next token: what followed the last token where it last
    occurred (else the last token again)."""
    last = context[-1]
    for i in range(len(context) - 2, -1, -1):
        if context[i] == last:
            return context[i + 1]
    return last
