"""A round's option (which source drafts how many tokens, at what expected gain) and the
comparison `AdaptiveDrafter.choose` runs over them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Choice:
    source: str  # "none", "draft", or a free source ("ngram", "prediction", "suffix") [+draft]
    k: int  # tokens to draft in all
    gain: float  # expected tokens/s relative to plain decoding (0 for a probe)
    ngram: int = 0  # of which from the free match (n-gram lookup or the prediction)


def better(
    best: Choice, source: str, gains: Sequence[float], first: int, free_tokens: int | None
) -> Choice:
    """`best`, or the option of `source` at the best of `gains` (gains[i] drafts first + i
    tokens, of which `free_tokens` from the free match; None: all), if that beats it (a tie
    keeps the earlier and shallower option). One Choice a family, not one an option:
    choose runs every round, and on a GPU a round's Python is a share of its time."""
    i = max(range(len(gains)), key=gains.__getitem__)  # the first of equal ones
    if gains[i] <= best.gain:
        return best
    k = first + i
    return Choice(source, k, gains[i], k if free_tokens is None else free_tokens)
