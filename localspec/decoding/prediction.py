"""Predicted Outputs: a text the answer is expected to repeat, as a free draft source.

An editor that asks for an edit of a file sends the file as the prediction: most of the
answer is that text. The prediction is tokenized once. Each round the answer's tail is
aligned with it: the longest run of the answer's last tokens that occurs in the
prediction (on a tie, the one nearest where the previous alignment would have gone on),
and what follows there is proposed. Where the answer departs from the prediction no
alignment reaches `n_min` tokens and the source stays silent until the answer re-joins
it. It is prompt lookup restricted to the prediction, with long matches.

As a drafter it only proposes: output stays the target's (greedy equal to plain
decoding, sampled distributed as the target's), whatever the prediction says.
"""

from __future__ import annotations

from collections.abc import Sequence
from difflib import SequenceMatcher

import numpy as np

from localspec.decoding.drafters import Draft, Drafter, Outcome
from localspec.decoding.grammar import GrammarState
from localspec.decoding.sampling import SamplingParams

TAIL = 64  # the most answer tokens compared when aligning; longer runs add no certainty


def prediction_usage(predicted: Sequence[int], completion: Sequence[int]) -> tuple[int, int]:
    """OpenAI's `accepted_prediction_tokens` and `rejected_prediction_tokens`: the tokens
    of the prediction that appear in the completion, in order (the matching blocks of
    the two token sequences), and those that do not. A fact of the output, whichever
    source drafted it: where the suffix index or prompt lookup proposed the same text
    first, the prediction's tokens still appeared."""
    matcher = SequenceMatcher(None, list(predicted), list(completion), autojunk=False)
    accepted = sum(block.size for block in matcher.get_matching_blocks())
    return accepted, len(predicted) - accepted


class Prediction:
    """A predicted answer (token ids) for one request whose answer starts at
    `answer_start` in the context; counts what became of the tokens it drafted (the
    drafting's own figures; the API reports `prediction_usage`)."""

    def __init__(
        self, tokens: Sequence[int], answer_start: int, n_min: int = 2, anchored: bool = True
    ) -> None:
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.answer_start = answer_start
        self.n_min = n_min
        # whether the answer is expected to start where the prediction does (an edited
        # file); a fill-in-the-middle's source (the text after the cursor) is not
        self.anchored = anchored
        self.accepted = 0  # drafted prediction tokens the target kept
        self.rejected = 0  # drafted prediction tokens the target refused
        self._last: tuple[int, int] | None = None  # (aligned end in tokens, answer length)

    def match(self, context: Sequence[int], gamma: int) -> tuple[int, list[int]]:
        """(aligned run length, up to `gamma` tokens that follow the alignment); (0, [])
        where the answer's tail is not in the prediction. At the start of the answer the
        prediction's beginning is proposed, as a run of `n_min`."""
        answer = context[self.answer_start :]
        if not len(answer):
            self._last = (-1, 0)
            if not self.anchored:
                return 0, []
            return self.n_min, self.tokens[:gamma].tolist()
        end, run = self.align(answer)
        if run < min(self.n_min, len(answer)):
            return 0, []
        self._last = (end, len(answer))
        return run, self.tokens[end + 1 : end + 1 + gamma].tolist()

    def align(self, answer: Sequence[int]) -> tuple[int, int]:
        """(index in the prediction where the answer's tail ends, length of that run):
        the longest run, then the one nearest the expected place."""
        tail = np.asarray(answer[-TAIL:], dtype=np.int64)
        p = self.tokens
        ends = np.flatnonzero(p[:-1] == tail[-1])  # an end with nothing after it is no use
        if not ends.size:
            return -1, 0
        run = np.zeros(ends.size, dtype=np.int64)
        alive = np.ones(ends.size, dtype=bool)
        for k in range(len(tail)):
            at = ends - k
            alive &= at >= 0
            alive[alive] = p[at[alive]] == tail[-1 - k]
            if not alive.any():
                break
            run += alive
        best = int(run.max())
        tied = ends[run == best]
        expected = self.expected_end(len(answer))
        # nearest the expected place, forward before backward
        nearest = min(tied, key=lambda e: (int(e) < expected, abs(int(e) - expected)))
        return int(nearest), best

    def expected_end(self, answer_len: int) -> int:
        """Where the answer's last token would sit had it followed the last alignment."""
        if self._last is None:
            return answer_len - 1
        end, then = self._last
        return end + answer_len - then

    def observe(self, drafted: int, accepted: int) -> None:
        self.accepted += accepted
        self.rejected += drafted - accepted


class PredictionDrafter:
    """For a fixed γ: the prediction where it aligns, another drafter where it does not."""

    def __init__(self, prediction: Prediction, fallback: Drafter) -> None:
        self.prediction = prediction
        self.fallback = fallback
        self.name = fallback.name
        self._drafted_by_prediction = False

    @property
    def busy_s(self) -> float:
        return self.fallback.busy_s

    @property
    def n_ctx(self) -> int:
        return self.fallback.n_ctx

    def draft(
        self,
        context: Sequence[int],
        gamma: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        forced: int = 0,
        grammar: GrammarState | None = None,
    ) -> Draft:
        _, tokens = self.prediction.match(context, gamma)
        self._drafted_by_prediction = bool(tokens)
        if tokens:
            return Draft(tokens, [None] * len(tokens), by="prediction")
        return self.fallback.draft(context, gamma, params, rng, forced=forced, grammar=grammar)

    def accept(self, tokens: Sequence[int], outcome: Outcome) -> None:
        if self._drafted_by_prediction:
            self.prediction.observe(outcome.drafted, outcome.accepted)
        self.fallback.accept(tokens, outcome)  # a draft model drops what it no longer holds
