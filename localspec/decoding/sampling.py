"""Turning logits into the distribution a token is drawn from.

The same transform is applied to the target's logits (giving p) and the draft's (giving
q), with the same history, so that rejection sampling reproduces exactly the target's
sampling distribution. Order, as in llama.cpp's chain: logit bias, penalties (repeat,
frequency, presence), temperature, top-k, top-p, min-p. Temperature 0 means greedy
(argmax of the biased and penalized row).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Probs = np.ndarray  # float64 over the vocabulary, sums to 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 40  # 0 = whole vocabulary
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0  # 1 = off
    frequency_penalty: float = 0.0  # OpenAI's: minus this per occurrence in the window
    presence_penalty: float = 0.0  # OpenAI's: minus this once for a token in the window
    repeat_last_n: int = 64  # the penalties' window; -1: the whole history
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, added to its logit)
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        return (self.repeat_penalty, self.frequency_penalty, self.presence_penalty) != (1, 0, 0)

    @property
    def reshapes_logits(self) -> bool:
        """Whether `penalize` changes a row (else a greedy choice is the raw argmax)."""
        return bool(self.logit_bias) or (self.penalized and self.repeat_last_n != 0)

    def __post_init__(self) -> None:
        if not 0 <= self.temperature < math.inf:  # also refuses nan
            raise ValueError("temperature must be a number >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top-p must be in (0, 1]")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError("min-p must be in [0, 1)")
        if self.top_k < 0:
            raise ValueError("top-k must be >= 0")
        if not 0 < self.repeat_penalty < math.inf:
            raise ValueError("repeat penalty must be a number > 0")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -math.inf < getattr(self, name) < math.inf:
                raise ValueError(f"{name.replace('_', ' ')} must be a number")
        if self.repeat_last_n < -1:
            raise ValueError("repeat-last-n must be >= -1 (-1: the whole history)")
        if not all(math.isfinite(bias) for _, bias in self.logit_bias):
            raise ValueError("a logit bias must be a finite number")
        if self.seed is not None and self.seed < 0:
            raise ValueError("seed must be >= 0")


# a logit bias no logit outweighs: a banned token (llama.cpp's -inf, kept finite for the
# checks and the arithmetic above)
BANNED = -1e30


def penalize(logits: np.ndarray, params: SamplingParams, history: Sequence[int]) -> np.ndarray:
    """llama.cpp's first samplers: the logit bias, then the penalties over the last
    `repeat_last_n` tokens of the history (the prompt's too, as llama-server's): the
    CTRL-style repeat penalty, then OpenAI's frequency and presence penalties."""
    if not params.reshapes_logits:
        return logits
    out = logits.copy()
    if params.logit_bias:
        ids, bias = np.array(params.logit_bias).T
        mine = ids < len(out)  # a draft's vocabulary may be a little shorter
        out[ids[mine].astype(np.int64)] += bias[mine]
    n = params.repeat_last_n
    window = history if n == -1 else history[-n:] if n else ()
    if not params.penalized or not window:
        return out
    recent, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    vals = out[recent]
    r = params.repeat_penalty
    vals = np.where(vals > 0, vals / r, vals * r)
    out[recent] = vals - counts * params.frequency_penalty - params.presence_penalty
    return out


def recent(params: SamplingParams, history: Sequence[int], more: Sequence[int]) -> Sequence[int]:
    """What `penalize` reads of `history` then `more` (a row's text: the context, then
    the draft before it), without a copy of a long context for each row."""
    n = params.repeat_last_n
    if not params.penalized or n == 0:
        return ()
    if n == -1:
        return [*history, *more]
    return [*history[-n:], *more][-n:]


def greedy_token(logits: np.ndarray, params: SamplingParams, history: Sequence[int]) -> int:
    return int(np.argmax(penalize(logits, params, history)))


def logits_to_probs(logits: np.ndarray, params: SamplingParams, history: Sequence[int]) -> Probs:
    """The sampling distribution for one position (dense over the vocabulary)."""
    x = penalize(logits, params, history)
    if np.isneginf(x).any():  # a grammar's row: most of it at -inf, which no law keeps
        ids = np.flatnonzero(x > -np.inf)
        return law_over(ids, x[ids], params, len(x))
    return law_over(np.arange(len(x)), x, params, len(x))


def law_over(ids: np.ndarray, logits: np.ndarray, params: SamplingParams, n: int) -> Probs:
    """`logits_to_probs` of a row whose tokens other than `ids` are at -inf (none of
    them kept), over a vocabulary of `n`, without its repetition penalty. Only the
    candidates are sorted: numpy's partition over a row of mostly equal values (-inf)
    costs ~12x a normal row's (~23 ms against 2 for 152k tokens)."""
    x = logits.astype(np.float64) / params.temperature
    if 0 < params.top_k < len(x):
        top = np.argpartition(x, len(x) - params.top_k)[len(x) - params.top_k :]
        ids, x = ids[top], x[top]
    w = np.exp(x - x.max())
    w /= w.sum()
    order = np.argsort(-w, kind="stable")
    w, ids = w[order], ids[order]
    if params.top_p < 1.0:
        # smallest prefix whose mass reaches top_p (always at least one token)
        cut = int(np.searchsorted(np.cumsum(w), params.top_p)) + 1
        w, ids = w[:cut], ids[:cut]
    if params.min_p > 0.0:
        mask = w >= params.min_p * w[0]
        w, ids = w[mask], ids[mask]
    probs = np.zeros(n, dtype=np.float64)
    probs[ids] = w / w.sum()
    return probs


def top2(logits: np.ndarray) -> tuple[int, float]:
    """The argmax and the sigmoid of its lead over the runner-up: its probability
    among the top two, an upper bound on its softmax probability. Two max passes; an
    exact softmax over a 152k vocabulary costs ~10x more, more than a GPU draft step."""
    best = int(np.argmax(logits))
    top = logits[best]
    logits[best] = -np.inf
    second = logits.max()
    logits[best] = top
    return best, float(1.0 / (1.0 + np.exp(second - top)))


def sample(probs: Probs, rng: np.random.Generator) -> int:
    # inverse CDF; clip guards the last ulp of the cumulative sum
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(probs) - 1))
