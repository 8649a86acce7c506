"""What the engine tells its caller, as data: pieces of text, rounds, and the end.

Vocabulary (as in vLLM): a round drafts up to γ tokens; the target *accepts* a prefix of
them and then adds one token of its own: the *recovered* token where it rejected a draft
token, or the *bonus* token when it accepted all of them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

Source = Literal["draft", "target"]  # accepted draft token, or the target's own choice
StopReason = Literal["eog", "stop_string", "max_tokens", "context_full", "cancelled"]


@dataclass(frozen=True)
class Stats:
    """A snapshot of one answer's speculation, at the end or mid-way."""

    tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: float = 0.0  # α: accepted / drafted
    mean_accepted_len: float = 0.0  # tokens per round, counting the target's own token
    # (the end-of-generation token too, and tokens past a stop or max_tokens)
    tokens_per_s: float = 0.0  # decode speed, after the first token
    ttft_s: float = 0.0
    # Set at the end of an answer, 0 in the snapshots taken mid-way (sorting every
    # round's figures costs a GPU round). TPOT, time per output token: each round's time
    # spread evenly over its tokens, what other tools call TPOT or ITL. A gap: the time
    # between two pieces as the engine hands them out, what a reader sees: a round's
    # tokens come together, so gaps are mostly near 0 and one round's time apart.
    tpot_p50_s: float = 0.0
    tpot_p95_s: float = 0.0
    gap_p50_s: float = 0.0
    gap_p95_s: float = 0.0
    prompt_tokens: int = 0
    elapsed_s: float = 0.0
    draft_s: float = 0.0  # wall time in the drafter
    verify_s: float = 0.0  # wall time in the target's verification passes
    round_s: float = 0.0  # wall time of the rounds (after the first token), engine only
    llama_s: float = 0.0  # of which inside model calls (both models)
    gamma: int = 0  # γ of the latest round
    drafter: str = ""  # drafter of the latest round
    drafters: tuple[str, ...] = ()  # those that drafted in the answer, the most first
    accepted_per_position: tuple[int, ...] = ()
    drafted_per_position: tuple[int, ...] = ()
    recalled: int = 0  # tokens the last answer had chosen here, taken without a pass
    # of the prompt, what the target's cache held and it did not read, its last token read
    # always (None: no pass read it, an answer recalled whole); a recurrent model reads on
    # from a checkpoint, which may lie before the end of what its cache shares with it
    prompt_cached: int | None = None

    @property
    def itl_p50_s(self) -> float:
        """The old name of tpot_p50_s (the bench's reports still read it)."""
        return self.tpot_p50_s

    @property
    def itl_p95_s(self) -> float:
        """The old name of tpot_p95_s."""
        return self.tpot_p95_s

    @property
    def overhead_s(self) -> float:
        """Round time spent outside model calls: Python, sampling, bookkeeping."""
        return max(0.0, self.round_s - self.llama_s)

    @property
    def overhead_share(self) -> float:
        """overhead_s as a share of the rounds' time."""
        return self.overhead_s / self.round_s if self.round_s else 0.0

    def summary(self) -> str:
        line = (
            f"{self.tokens} tokens, {self.tokens_per_s:.1f} tok/s, "
            f"acceptance {self.acceptance_rate:.0%} ({self.accepted}/{self.drafted}), "
            f"mean accepted length {self.mean_accepted_len:.2f}, TTFT {self.ttft_s:.2f}s, "
            f"γ {self.gamma} ({self.drafter})"
        )
        if self.tpot_p50_s:
            line += (
                f", TPOT p50/p95 {self.tpot_p50_s * 1e3:.1f}/{self.tpot_p95_s * 1e3:.1f} ms"
                f", gaps p50/p95 {self.gap_p50_s * 1e3:.1f}/{self.gap_p95_s * 1e3:.1f} ms"
            )
        return line


@dataclass(frozen=True)
class Piece:
    """Text released by one emitted token ('' while a UTF-8 character or a possible stop
    string is incomplete)."""

    text: str
    token: int
    source: Source
    margin: float | None = None  # when tracing: the target's top-2 logit gap here
    runner_up: int | None = None  # when tracing: the target's second choice here
    # when asked for (logprobs): the target's log-probability of this token, and of its
    # most likely ones, (token, log-probability), from the pass that scored it
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class RoundEnd:
    drafter: str  # who drafted this round: "draft", "ngram", "ngram+draft", "none", ...
    gamma: int  # tokens the round meant to draft
    drafted: int
    accepted: int
    stats: Stats
    why: str = ""  # an adaptive drafter's reason, in a line


@dataclass(frozen=True)
class Finished:
    text: str
    tokens: tuple[int, ...]
    stop_reason: StopReason
    stats: Stats
    stop_string: str | None = None  # which of the request's stop strings ended it

    @property
    def cut(self) -> bool:
        """Ended by a limit (max tokens, the context), not where the model ended it: a
        tool call being written then is partial."""
        return self.stop_reason in ("max_tokens", "context_full")


Event = Piece | RoundEnd | Finished


@dataclass
class StatsRecorder:
    """Accumulates one answer's figures; `snapshot()` turns them into Stats."""

    prompt_tokens: int = 0
    start: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    round_s: float = 0.0
    llama_s: float = 0.0
    gamma: int = 0
    drafter: str = ""
    drafted_by: dict[str, int] = field(default_factory=dict)  # tokens, by drafter
    per_token_s: list[float] = field(default_factory=list)  # TPOT, token by token
    gaps_s: list[float] = field(default_factory=list)  # between pieces handed out
    handed_at: float | None = None  # when the last piece was handed out
    accepted_at: list[int] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)
    recalled: int = 0
    prompt_cached: int | None = None

    def observe_first_token(self) -> None:
        self.first_token_at = self.last_token_at = time.perf_counter()
        self.tokens = 1

    def observe_recalled(self, n: int) -> None:
        """The answer's first n tokens (an end token not counted), recalled from the last
        answer (Engine.recall)."""
        self.first_token_at = self.last_token_at = time.perf_counter()
        self.tokens = self.recalled = n

    def end_round(
        self, drafter: str, gamma: int, drafted: int, accepted: int, produced: int, why: str
    ) -> RoundEnd:
        """Record one round (`produced`: the tokens it added to the answer) and say so."""
        self.observe_draft(drafted, accepted)
        self.observe_tokens(produced)
        self.drafter, self.gamma = drafter, gamma
        if drafted:
            self.drafted_by[drafter] = self.drafted_by.get(drafter, 0) + drafted
        return RoundEnd(drafter, gamma, drafted, accepted, self.snapshot(), why)

    def observe_draft(self, num_draft: int, num_accepted: int) -> None:
        self.drafted += num_draft
        self.accepted += num_accepted
        for i in range(num_draft):
            if i == len(self.drafted_at):
                self.drafted_at.append(0)
                self.accepted_at.append(0)
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < num_accepted

    def observe_tokens(self, n: int) -> None:
        now = time.perf_counter()
        self.rounds += 1
        if n:
            since = now - (self.last_token_at or self.start)
            self.per_token_s.extend([since / n] * n)
            self.tokens += n
            self.last_token_at = now

    def timed(self, pieces: Iterable[Piece]) -> Iterator[Piece]:
        """Hand the pieces on, timing the gaps between tokens as the caller gets them."""
        for piece in pieces:
            if piece.token >= 0:
                now = time.perf_counter()
                if self.handed_at is not None:
                    self.gaps_s.append(now - self.handed_at)
                self.handed_at = now
            yield piece

    def snapshot(self, final: bool = False) -> Stats:
        now = time.perf_counter()
        decode_s = (self.last_token_at or now) - (self.first_token_at or now)
        tpot = sorted(self.per_token_s) if final and self.per_token_s else [0.0]
        gaps = sorted(self.gaps_s) if final and self.gaps_s else [0.0]
        return Stats(
            tokens=self.tokens,
            rounds=self.rounds,
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance_rate=self.accepted / self.drafted if self.drafted else 0.0,
            mean_accepted_len=1 + self.accepted / self.rounds if self.rounds else 0.0,
            tokens_per_s=(self.tokens - 1) / decode_s if decode_s > 0 else 0.0,
            ttft_s=(self.first_token_at - self.start) if self.first_token_at else 0.0,
            tpot_p50_s=_percentile(tpot, 0.50),
            tpot_p95_s=_percentile(tpot, 0.95),
            gap_p50_s=_percentile(gaps, 0.50),
            gap_p95_s=_percentile(gaps, 0.95),
            prompt_tokens=self.prompt_tokens,
            elapsed_s=now - self.start,
            draft_s=self.draft_s,
            verify_s=self.verify_s,
            round_s=self.round_s,
            llama_s=self.llama_s,
            gamma=self.gamma,
            drafter=self.drafter,
            drafters=tuple(sorted(self.drafted_by, key=self.drafted_by.__getitem__, reverse=True)),
            accepted_per_position=tuple(self.accepted_at),
            drafted_per_position=tuple(self.drafted_at),
            recalled=self.recalled,
            prompt_cached=self.prompt_cached,
        )


def _percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
