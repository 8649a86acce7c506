"""What `auto` (localspec.decoding.adaptive) learns as it goes: α_i, the chance that draft
position i of a source is accepted (`Acceptance`), and T(k), the target's time to verify
k tokens in one pass (`VerifyCost`). Plain measurements, no decisions.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from localspec.drafting import GAMMA_MAX

PREDICTION_GAMMA_MAX = 16  # a prediction that keeps matching is drafted this deep
TABLE_SIZE = PREDICTION_GAMMA_MAX + 1  # the largest batch a round verifies
EMA_WEIGHT = 0.15
PRIOR_COUNT = 2  # the prior α weighs as much as this many observations
# A moving average vouches for (2 - w) / w observations (its variance is that of a mean
# of as many, however many it has seen), and as many hits in a row do not rule out a
# miss in as many: where a miss costs many times a hit (under load), no draft position
# counts as surer than this
SUREST = 1 - 1 / (2 / EMA_WEIGHT - 1)
RELAX = 0.05  # per round, an untested position's α closes this share of its gap below α_{i-1}
CPU_SLOPE = 0.3  # prior b/a until two batch sizes have been timed
STEEP = 0.5  # T(k) rising by this share of T(1) per token: compute-bound, not in steps


@dataclass
class Acceptance:
    """α_i per draft position: the prior counts as PRIOR_COUNT observations, then a mean
    of what was seen turns into a moving average (weight EMA_WEIGHT), so two misses
    already tell a bad source from a good one. A position not yet drafted takes the α of
    the one before it, so a deeper draft gets tried."""

    alpha: list[float]  # as long as the deepest draft it judges
    seen: list[int] = field(default_factory=list)
    prior_value: float = 0.0
    hits: list[int] = field(default_factory=list)  # of `seen`, the accepted
    # α as measured before an idle recovery raised it (None: not raised since)
    measured: list[float] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.seen += [0] * (len(self.alpha) - len(self.seen))
        if not self.hits:  # as if each position's α were the rate of what it has seen
            self.hits = [round(a * n) for a, n in zip(self.alpha, self.seen, strict=True)]

    @classmethod
    def prior(cls, value: float, depth: int = GAMMA_MAX) -> Acceptance:
        return cls([value] * depth, prior_value=value)

    def recover(self, share: float) -> None:
        """While idle, a below-prior α closes `share` of its gap to the prior: a low α
        keeps its source unused, so nothing else would ever revise it."""
        if self.measured is None:
            self.measured = list(self.alpha)
        self.alpha = [a + share * max(self.prior_value - a, 0.0) for a in self.alpha]

    def restart(self) -> None:
        """Another text begins (a request that does not go on from the last): an α_i
        below the rate of all its position has seen (the prior counted as PRIOR_COUNT
        observations) goes up to it. The moving average followed the last text: a few
        misses where one answer ended kept the draft model off for most of the next,
        unrelated one, and nothing revises an α that keeps its source unused. A high one
        stays: the first misses take it down."""
        self.measured = None
        for i, (n, hits) in enumerate(zip(self.seen, self.hits, strict=True)):
            if n:
                rate = (hits + PRIOR_COUNT * self.prior_value) / (n + PRIOR_COUNT)
                self.alpha[i] = max(self.alpha[i], rate)

    def observe(self, drafted: int, accepted: int) -> None:
        if self.measured is not None:
            if drafted and not accepted:
                # the retry the recovery led to failed: the raise was a guess the text
                # refuted, so the miss counts against what was measured (else a nearly
                # free draft that is always wrong is retried every few rounds: a miss
                # takes less off than the idle rounds put back)
                self.alpha = self.measured
            self.measured = None
        # position i tells something only if all before it were accepted
        tested = min(accepted + 1, drafted)
        for i in range(tested):
            self.learn(i, i < accepted)
        self.relax_from(tested)

    def learn(self, i: int, accepted: bool) -> None:
        """Position i was tested (every one before it accepted)."""
        if not self.seen[i] and i > 0:
            self.alpha[i] = self.alpha[i - 1]
        self.seen[i] += 1
        self.hits[i] += accepted
        weight = max(EMA_WEIGHT, 1 / (PRIOR_COUNT + self.seen[i]))
        self.alpha[i] += weight * (float(accepted) - self.alpha[i])

    def relax_from(self, tested: int) -> None:
        """The positions from `tested` on were not tested this time."""
        for i in range(max(1, tested), len(self.alpha)):
            if not self.seen[i]:
                self.alpha[i] = self.alpha[i - 1]
            elif self.alpha[i] < self.alpha[i - 1]:
                # A low α_i keeps drafts short, so it would never be tested again; and
                # acceptance given the earlier tokens right rarely falls with depth.
                self.alpha[i] += RELAX * (self.alpha[i - 1] - self.alpha[i])

    def expected(self, k: int, surest: float = 1.0) -> list[float]:
        """E(j) - 1 for j = 1..k: the expected accepted tokens when drafting j, no α_i
        counted above `surest` (SUREST: shadows of a copied text hit round after round and
        take α to 0.999, and the copy ends all the same). (Sums of products of at most 16
        values: plain Python, as numpy costs more on so few.)"""
        return list(accumulate(accumulate(self.upto(k, surest), operator.mul)))

    def all_accepted(self, k: int, surest: float = 1.0) -> float:
        return math.prod(self.upto(k, surest))

    def upto(self, k: int, surest: float) -> list[float]:
        """α_1..α_k, none above `surest`."""
        return self.alpha[:k] if surest >= 1.0 else [min(a, surest) for a in self.alpha[:k]]


def moved(old: float | None, new: float) -> float:
    """A time's moving average after `new` (the first one as it is)."""
    return new if old is None else old + 2 * EMA_WEIGHT * (new - old)


@dataclass
class VerifyCost:
    """T(k) = a + b(k-1), least squares over moving averages of each timed batch size."""

    seconds: dict[int, float] = field(default_factory=dict)
    # passes of a batch size that run slower than the next (LlamaModel.cold_passes: on a
    # GPU, llama.cpp's CUDA-graph warm-up), not timed by `time_pass`
    cold_passes: int = 0
    # whether those are the first passes after every change of size (one engine's own
    # passes: llama.cpp keeps one graph per context, so a 2-token probe between 1-token
    # passes warms up twice), or only each size's first ever (serve's shared passes,
    # whose size changes with the load, so that most of them count)
    after_each_change: bool = False
    cold: dict[int, int] = field(default_factory=dict)  # size -> its first passes let go
    cold_excess: float = 0.0  # seconds a cold pass takes beyond its size's warm T(k)
    a: float = 0.0
    b: float = 0.0
    # T(k) / T(1) at least, where known: a MoE target's pass of k tokens reads the experts
    # any of them is routed to (localspec.models.speed.batch_growth); () for a dense one
    growth: tuple[float, ...] = ()
    _cold_one: bool = field(default=False, repr=False)  # T(1) timed on a cold pass only
    _last: int = field(default=0, repr=False)  # the last pass's size, and passes in a row
    _run: int = field(default=0, repr=False)
    _key: tuple = field(default=(), repr=False, compare=False)
    _cached: list[float] = field(default_factory=list, repr=False, compare=False)

    def time_pass(self, k: int, seconds: float) -> None:
        """A pass of k tokens took `seconds`. Cold passes teach T(k) nothing: on an H200 a
        0.8B hybrid twin's passes after a change of size took 2-4 times a steady one, and
        kept as T(k) such a time priced its size for good (a T(1) timed so kept `auto`
        drafting at α 0.01, which kept T(1) cold; a T(2) so, never drafting again). What
        they cost beyond a warm pass is kept instead (`cold_excess`: a change of size has
        its price). T(1) alone is needed at once, so until its first warm pass the latest
        one stands; a larger size, untimed meanwhile, is priced as the table prices one."""
        self._run = self._run + 1 if k == self._last else 1
        self._last = k
        if self._is_cold(k):
            if self._timed_warm(k):
                excess = max(seconds - self.seconds[k], 0.0)
                self.cold_excess = moved(self.cold_excess or None, excess)
            elif k == 1:
                self.seconds[1], self._cold_one = seconds, True
                self.a, self.b = self._fit()
            return
        if k == 1 and self._cold_one:  # its first warm pass replaces the cold one
            self._cold_one = False
            self.seconds.pop(1)
        self.observe(k, seconds)

    def _is_cold(self, k: int) -> bool:
        if self.after_each_change:
            return self._run <= self.cold_passes
        seen = self.cold.get(k, 0)
        if seen < self.cold_passes and not self._timed_warm(k):
            self.cold[k] = seen + 1
            return True
        return False

    def _timed_warm(self, k: int) -> bool:
        return k in self.seconds and not (k == 1 and self._cold_one)

    @property
    def warm(self) -> bool:
        """Whether T(1) was timed on a warm pass (on a CPU, on any)."""
        return self._timed_warm(1)

    def switch_cost(self, passes: int) -> float:
        """What `passes` cold passes cost beyond warm ones (0 where none are)."""
        return passes * self.cold_excess

    def observe(self, k: int, seconds: float) -> None:
        self.seconds[k] = moved(self.seconds.get(k), seconds)
        self.a, self.b = self._fit()

    def seed(self, seconds: dict[int, float]) -> None:
        """Start from T(k) as an earlier session timed them (models/calibration.py), the
        sizes timed here kept: each pass times its size on from there."""
        self.seconds = seconds | self.seconds
        self.a, self.b = self._fit()

    def _fit(self) -> tuple[float, float]:
        """Least squares of t = a + b(k-1), in closed form (this runs every round)."""
        n = len(self.seconds)
        xs = [k - 1 for k in self.seconds]
        ts = list(self.seconds.values())
        if n >= 2:
            mx, mt = sum(xs) / n, sum(ts) / n
            sxx = sum((x - mx) ** 2 for x in xs)
            b = sum((x - mx) * (t - mt) for x, t in zip(xs, ts, strict=True)) / sxx
            a = mt - b * mx
            if b >= 0 and a > 0:
                return a, b
        a = sum(t / (1 + CPU_SLOPE * x) for x, t in zip(xs, ts, strict=True)) / n
        return a, CPU_SLOPE * a

    @property
    def one(self) -> float:
        """T(1): a plain round's time as timed (the line's a until it is; 0: unknown). The
        line itself can sit well off it: on a CPU, T rises in steps."""
        return self.seconds.get(1, self.a)

    def batch(self, ks: np.ndarray) -> np.ndarray:
        """T(k) for each k in ks, as `table` gives them."""
        return np.array(self.table(int(ks.max())))[ks - 1]

    def table(self, top: int) -> list[float]:
        """T(1..n), n ≥ top (t[k - 1] = T(k)): its own average where timed (CPU costs rise
        in steps, not on a line), and between two timed sizes on the straight line from
        one to the other. The first untimed size above the timed ones is assumed as cheap
        as the dearest timed one (on a line or in steps, T rises), so it gets tried and
        timed; unless the timed sizes rise steeply per token (compute-bound), where the
        line is the guess. Worked out once per change of the timings (a round asks for it
        several times)."""
        key = (tuple(self.seconds.items()), self.a, self.b)
        if key != self._key or len(self._cached) < top:
            self._cached, self._key = self._build(max(top, TABLE_SIZE)), key
        return self._cached

    def hopeful(self, k: int) -> float:
        """What an untimed T(k) above the timed sizes is hoped to cost: the largest timed
        T (T rises with k, a CPU's tiles aside), or what the experts it reads make it;
        the price at which `AdaptiveDrafter.explore` weighs a deeper try."""
        return self._at_least(k, max(self.seconds.values()))

    def prior_table(self, top: int) -> list[float]:
        """T(1..top) on the line a + b(k-1), b at most its CPU prior: no optimism for an
        untimed size, and no steep line drawn through a CPU's first step either."""
        b = min(self.b, CPU_SLOPE * self.a)
        return [self._at_least(k, self.a + b * (k - 1)) for k in range(1, top + 1)]

    def line_table(self, top: int) -> list[float]:
        """T(1..top) with no optimism: timed sizes as timed, the others on the fitted line,
        none below a smaller size's (what the draft model's first try is judged on: it
        pays for reading the text, so an untimed size is not priced low to get it timed)."""
        table, floor = [], 0.0
        for k in range(1, top + 1):
            t = self.seconds.get(k)
            t = max(self.a + self.b * (k - 1), floor) if t is None else t
            floor = max(floor, t)
            table.append(self._at_least(k, t))
        return table

    def _at_least(self, k: int, t: float) -> float:
        """An untimed T(k) no lower than the experts it reads make it."""
        if k > len(self.growth):
            return t
        return max(t, self.one * self.growth[k - 1])

    def _steep(self) -> bool:
        """Whether the two largest timed batch sizes (past one token) grow by half a
        one-token pass per token or more."""
        sizes = sorted(k for k in self.seconds if k > 1)[-2:]
        if len(sizes) < 2:
            return False
        (j, tj), (k, tk) = ((s, self.seconds[s]) for s in sizes)
        return (tk - tj) / (k - j) >= STEEP * self.one

    def _build(self, n: int) -> list[float]:
        """T(1..n) as `table` describes it. A T(1) timed above a larger size counts at
        that size's time (a T(1) kept too high, as a cold pass leaves it, would make every
        draft look cheap); the other timed sizes count as timed: a CPU's kernels work in
        tiles (on 2 cores of a Xeon a 4-token pass took 114 ms, a 3-token one 144), and
        a 3-token pass counted at 114 made a 2-token draft look as cheap as a 3-token one."""
        timed = sorted(self.seconds)
        top, steep = max(timed, default=0), self._steep()
        table, floor = [], None  # floor: the largest T(j) timed for j < k
        for k in range(1, n + 1):
            t = self.seconds.get(k)
            if t is not None:
                if k == 1:
                    t = min(self.seconds.values())
                floor = t if floor is None else max(floor, t)
            elif floor is not None and k < top:
                # between timed sizes j < k < l: on the way from T(j) to T(l)
                j = max(s for s in timed if s < k)
                after = min(s for s in timed if s > k)
                rise = max(self.seconds[after] - floor, 0.0) * (k - j) / (after - j)
                t = self._at_least(k, floor + rise)
            else:
                t = self.a if floor is None else floor
                if k != top + 1 or steep:
                    t = max(t, self.a + self.b * (k - 1))
                t = self._at_least(k, t)
            table.append(t)
        return table
