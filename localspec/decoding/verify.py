"""Verification: which drafted tokens the target keeps, and the token it adds.

Notation (Leviathan et al. 2023): the draft proposes x_1..x_γ from its distributions q_i;
the target scores the same positions in one pass, giving p_1..p_{γ+1}.

- Greedy: accept x_i while it is the target's argmax; the first mismatch is replaced by
  the target's argmax (the *recovered* token); when all γ are accepted, the target's
  argmax at γ+1 is the *bonus* token. The output is exactly greedy decoding's.
- Sampled: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); on the first
  rejection, draw the recovered token from norm(max(0, p_i - q_i)); when all are
  accepted, draw the bonus from p_{γ+1}. Each emitted token is distributed as p.
A drafter without a distribution (n-grams) proposes with certainty: q_i is one-hot.

Target and draft vocabularies may differ in size (by up to 128 padding entries, as in
Qwen2.5 7B over 0.5B): q_i is zero beyond the draft's vocabulary, and p_i beyond the
target's, so a drafted token the target cannot emit is always rejected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from localspec.decoding.sampling import Probs, sample

Kind = Literal["recovered", "bonus"]


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many drafted tokens were kept (a prefix)
    token: int  # the target's own token that follows them
    kind: Kind


def verify_greedy(draft: Sequence[int], target_argmax: Sequence[int]) -> Verdict:
    """`target_argmax[i]` is the target's choice after the context plus draft[:i]."""
    for i, x in enumerate(draft):
        if target_argmax[i] != x:
            return Verdict(i, int(target_argmax[i]), "recovered")
    return Verdict(len(draft), int(target_argmax[len(draft)]), "bonus")


def verify_sampled(
    draft: Sequence[int],
    q: Sequence[Probs | None],
    p: Callable[[int], Probs],
    rng: np.random.Generator,
) -> Verdict:
    """Rejection sampling. `q[i]` is None for a certain (one-hot) proposal; `p(i)` gives
    the target's distribution at position i, computed only when it is needed."""
    for i, x in enumerate(draft):
        p_i = p(i)
        q_x = 1.0 if q[i] is None else float(q[i][x])  # type: ignore[index]
        p_x = p_i[x] if x < len(p_i) else 0.0  # beyond the target's vocabulary: p = 0
        if q_x > 0 and rng.random() * q_x < p_x:  # accept with prob min(1, p/q)
            continue
        return Verdict(i, sample(residual(p_i, q[i], x), rng), "recovered")
    return Verdict(len(draft), sample(p(len(draft)), rng), "bonus")


def residual(p_i: Probs, q_i: Probs | None, x: int) -> Probs:
    """norm(max(0, p - q)): the part of p that the draft under-proposed."""
    if q_i is None:
        r = p_i.copy()
        if x < len(r):
            r[x] = 0.0
    else:
        r = np.maximum(p_i - on_vocab(q_i, len(p_i)), 0.0)
    total = r.sum()
    # p == q (up to rounding) leaves no residual; p itself is then the right law
    return r / total if total > 1e-12 else p_i


def on_vocab(q_i: Probs, n_vocab: int) -> Probs:
    """The draft's distribution over the target's `n_vocab` tokens: zero past the
    draft's own vocabulary; mass on tokens the target lacks is dropped (p is zero there,
    so max(0, p - q) is zero there too)."""
    if len(q_i) == n_vocab:
        return q_i
    if len(q_i) > n_vocab:
        return q_i[:n_vocab]
    return np.concatenate([q_i, np.zeros(n_vocab - len(q_i))])
