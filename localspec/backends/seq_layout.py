"""Where serve's slots' caches lie among llama.cpp's sequences, and when to change it.

With a cache per sequence, llama.cpp reads a batch's sequences in one micro-batch only
while their ids run on without a gap and each brings as many tokens (`split_equal`):
slots 0, 1 and 3 are read as 0 and 1, then 3, and a pass costs two passes' time. Four
clients' answers end at different times, so gaps are common. A short gap is filled for
the pass (`Layout.fillers`); one that lasts is closed by moving caches (`Layout.moves`).
And where a pass of one more slot's tokens costs less (a CPU's kernels take tokens four
at a time), an idle slot brings them too (`Layout.padding`).

`Layout` decides over plain data (which llama.cpp sequence holds which slot's cache, the
passes' timings); `LlamaModel` carries its decisions out.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# every this many padding decisions, the choice not taken is timed again (one sample of a
# size, taken while the host was slow, would otherwise decide for good)
PAD_RETIME = 256


@dataclass(frozen=True)
class Part:
    """One sequence's share of a batched decode: `tokens` at positions pos.., and the
    logits of its last n_logits. For an MTP head's pass, `embd` holds each token's input
    state beside it (numpy rows; empty for a model's own pass)."""

    seq: int
    tokens: list[int]
    pos: int
    n_logits: int
    embd: tuple = field(default=(), compare=False)


@dataclass(frozen=True)
class Gaps:
    """Parts of k tokens each in llama.cpp's sequences `held`, and the sequences in the
    gaps between them."""

    k: int
    held: list[int]
    gaps: list[int]


@dataclass(frozen=True)
class Moves:
    """The swaps of llama.cpp sequences that close a gap, and the bytes they copy."""

    swaps: list[tuple[int, int]]
    size: int


def id_runs(seqs: Sequence[int]) -> list[int]:
    """The lengths of the runs of consecutive ids in sorted `seqs`: (0, 1, 3) -> [2, 1]."""
    runs = [1]
    for a, b in itertools.pairwise(seqs):
        if b == a + 1:
            runs[-1] += 1
        else:
            runs.append(1)
    return runs


@dataclass
class Layout:
    """The slots' caches in llama.cpp's sequences (`where[slot]`), what a one-micro-batch
    pass costs by its tokens (timed), and what the gap between them has lost so far."""

    n_seq: int
    unified: bool  # one cache for all: no gap splits a pass
    recurrent: bool  # a state that cannot drop a filler token, nor be copied out whole
    n_batch: int
    where: list[int] = field(default_factory=list)
    ubatch_s: dict[int, float] = field(default_factory=dict)
    gap_cost: float = 0.0  # what the passes since the gap opened lost to it
    move_s_per_byte: float = 1e-9  # what moving a cache costs: learnt, first guessed
    pad_decisions: int = 0  # passes `padding` has decided on (see PAD_RETIME)

    def __post_init__(self) -> None:
        self.where = self.where or list(range(self.n_seq))

    def order(self, parts: list[Part]) -> list[Part]:
        """The parts by llama.cpp sequence: a batch whose sequences come out of order
        is cut into one micro-batch per sequence (four slots' rounds: four passes)."""
        return sorted(parts, key=lambda p: self.where[p.seq])

    def gaps(self, parts: list[Part]) -> Gaps | None:
        """Where a gap between these parts' sequences splits their pass; None where
        nothing is (one cache, a recurrent model, unequal counts: llama.cpp splits
        those anyway)."""
        sizes = {len(p.tokens) for p in parts}
        if self.unified or self.recurrent or len(parts) < 2 or len(sizes) > 1:
            return None
        held = sorted(self.where[p.seq] for p in parts)
        gaps = [s for s in range(held[0], held[-1]) if s not in held]
        return Gaps(sizes.pop(), held, gaps) if gaps else None

    def one_ubatch(self, parts: list[Part]) -> bool:
        """Whether llama.cpp reads these parts (in this order) in one micro-batch."""
        if self.unified or len(parts) == 1:
            return True
        counts = {len(p.tokens) for p in parts}
        held = [self.where[p.seq] for p in parts]
        return len(counts) == 1 and all(b == a + 1 for a, b in itertools.pairwise(held))

    def observe(self, parts: list[Part], took: float) -> None:
        """A pass over `parts` (in this order) took `took` seconds: timed where it was
        one micro-batch (what filling and moving weigh)."""
        if self.one_ubatch(parts):
            tokens = sum(len(p.tokens) for p in parts)
            last = self.ubatch_s.get(tokens)
            self.ubatch_s[tokens] = took if last is None else last + 0.2 * (took - last)

    def estimate(self, tokens: int) -> float | None:
        """A one-micro-batch pass's time for `tokens`, from the nearest timed sizes: in
        between, on their line; above all, as the largest's per token; below, the
        smallest's (a pass costs no less for fewer tokens)."""
        timed = sorted(self.ubatch_s.items())
        if not timed:
            return None
        below = [(n, t) for n, t in timed if n <= tokens]
        above = [(n, t) for n, t in timed if n >= tokens]
        if below and above:
            (n0, t0), (n1, t1) = below[-1], above[0]
            return t0 if n1 == n0 else t0 + (t1 - t0) * (tokens - n0) / (n1 - n0)
        if below:
            n0, t0 = below[-1]
            return t0 * tokens / n0
        return above[0][1]

    def count_gap_cost(self, parts: list[Part], took: float) -> None:
        """Add what this pass lost to a gap (its time over one micro-batch's of as many
        tokens, estimated from the timed ones) to the gap's cost so far; a pass without
        a gap starts the count again."""
        found = self.gaps(parts)
        one = None if found is None else self.estimate(sum(len(p.tokens) for p in parts))
        if found is None or one is None:
            self.gap_cost = 0.0
        else:
            self.gap_cost += max(0.0, took - one)

    def one_pass_pays(self, tokens: int, runs: list[int]) -> bool:
        """Whether one micro-batch of `tokens` costs less than one for each run, as the
        passes were timed; yes before they are."""
        one, split = self.ubatch_s.get(tokens), [self.ubatch_s.get(n) for n in runs]
        return one is None or not all(split) or one < sum(t or 0.0 for t in split)

    def fillers(self, parts: list[Part], seq_len: Callable[[int], int], n_ctx: int) -> list[Part]:
        """A slot in a gap brings as many tokens at the end of its cache (`seq_len`, by
        slot; no logits), dropped again after the pass: one pass with more tokens instead
        of several. Filled where the passes as timed say it pays, or before they are
        timed (2 cores, one token a slot: F16 1.5B, 0, 2 filled in 126 ms against 223;
        Q4_K_M, 0, 1, 3 in 108 against 123 but 0, 2 in 98 against 94). Not where a gap's
        cache or the batch is full."""
        found = self.gaps(parts)
        if found is None:
            return []
        k, held, gaps = found.k, found.held, found.gaps
        tokens = k * (len(held) + len(gaps))
        if tokens > self.n_batch or not self.one_pass_pays(tokens, [k * n for n in id_runs(held)]):
            return []
        fillers = [Part(s, [0] * k, seq_len(s), 0) for s in map(self.where.index, gaps)]
        return [] if any(f.pos + k > n_ctx for f in fillers) else fillers

    def fill(self, parts: list[Part], seq_len: Callable[[int], int], n_ctx: int) -> list[Part]:
        """The tokens other slots bring for a pass over `parts` (in this order), dropped
        after it: a gap's fillers, else an idle slot's padding, else none."""
        return self.fillers(parts, seq_len, n_ctx) or self.padding(parts, seq_len, n_ctx)

    def padding(self, parts: list[Part], seq_len: Callable[[int], int], n_ctx: int) -> list[Part]:
        """For a pass of n ≥ 2 slots' k tokens each in one micro-batch (in this order), an
        idle slot next to theirs bringing k tokens at the end of its cache (no logits),
        dropped again after the pass, where a pass of n + 1 slots' tokens costs less:
        llama.cpp's repacked CPU kernels (Q4_0, Q4_K) take a pass's tokens four at a
        time and each one left over alone (Q4_K_M 1.5B, a cache each, 2 cores of a Xeon:
        three slots' tokens in 140 ms, four in 116; F16: 204 and 212). As the passes
        were timed; the larger size is tried once before it is."""
        counts = {len(p.tokens) for p in parts}  # equal (one cache's pass may have others)
        # and one micro-batch (not a gap, the fillers' case, nor ids out of order)
        if self.recurrent or not 2 <= len(parts) < self.n_seq or len(counts) > 1:
            return []
        if not self.one_ubatch(parts):
            return []
        k = counts.pop()
        tokens = k * len(parts)
        if tokens + k > self.n_batch or tokens not in self.ubatch_s:
            return []
        padded = self.ubatch_s.get(tokens + k)
        pad = padded is None or padded < self.ubatch_s[tokens]
        self.pad_decisions += 1
        if self.pad_decisions % PAD_RETIME == 0:
            pad = not pad
        if not pad:
            return []
        held = [self.where[p.seq] for p in parts]
        if self.unified:  # any other slot's (the prompt reader may have moved one past n_seq)
            beside = min(s for s in self.where if s not in held)
        else:  # one micro-batch: their ids run on, and one lies outside the run
            beside = held[-1] + 1 if held[-1] + 1 < self.n_seq else held[0] - 1
        slot = self.where.index(beside)
        filler = Part(slot, [0] * k, seq_len(slot), 0)
        return [filler] if filler.pos + k <= n_ctx else []

    def moves(self, parts: list[Part], size: Callable[[int], int]) -> Moves | None:
        """A gap that lasts (slot 1's answer ended while 0, 2 and 3 go on) is closed by
        moving caches: the last sequence's into the gap, the gap's (an idle slot's kept
        conversation, or nothing) where it was; each pass after it is one micro-batch with
        no filler (F16 1.5B, 2 cores: 0, 1, 3 filled in 146 ms against 125 for 0, 1, 2).
        Moving copies both caches (`size` bytes of a llama.cpp sequence, 0 where empty;
        ~20 ms for 1,000 tokens), so a gap is closed once its passes have lost as much as
        that (the ski-rental rule: never more than twice what the best choice, knowing
        how long the gap lasts, would lose). None until then."""
        found = None if not self.gap_cost else self.gaps(parts)
        if found is None:
            return None
        held, n = found.held, len(found.held)
        start = max(range(self.n_seq - n + 1), key=lambda s: sum(s <= h < s + n for h in held))
        outside = [h for h in held if not start <= h < start + n]
        free = [s for s in range(start, start + n) if s not in held]
        bytes_ = sum(size(s) for s in outside + free)
        if self.gap_cost < self.move_s_per_byte * bytes_:
            return None
        return Moves(list(zip(outside, free, strict=True)), bytes_)

    def swapped(self, a: int, b: int) -> None:
        """llama.cpp's sequences a and b exchanged their caches."""
        i, j = self.where.index(a), self.where.index(b)
        self.where[i], self.where[j] = b, a

    def moved(self, moves: Moves, took: float) -> None:
        """The gap is closed: what its move cost per byte is learnt, its cost starts again."""
        rate = took / max(moves.size, 1)
        self.move_s_per_byte += 0.5 * (rate - self.move_s_per_byte)
        self.gap_cost = 0.0
