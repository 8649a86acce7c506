"""The numbers the chat shows, computed without Textual: rates, costs, summaries."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from localspec.decoding.events import Stats

STOP_WORDS = {
    "eog": "done",
    "stop_string": "stop string",
    "max_tokens": "max tokens",
    "context_full": "context full",
    "cancelled": "stopped",
    "interrupted": "interrupted",
    "error": "failed",
}


@dataclass
class RateWindow:
    """Tokens/s over the last `window_s`, from (time, token count) samples."""

    window_s: float = 1.0
    history: int = 60  # rates kept for the sparkline
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    rates: deque[float] = field(default_factory=deque)

    def sample(self, now: float, tokens: int) -> float:
        """Record the count at `now`; returns the current rate."""
        self.samples.append((now, tokens))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()
        (t0, n0) = self.samples[0]
        rate = (tokens - n0) / (now - t0) if now > t0 else 0.0
        self.rates.append(rate)
        while len(self.rates) > self.history:
            self.rates.popleft()
        return rate

    def restart(self) -> None:
        """A new answer: the window starts over; the sparkline keeps its history."""
        self.samples.clear()


@dataclass(frozen=True)
class PlainCost:
    """T(1), the target's time for one plain decoding step: measured (low == high), or
    only bounded by the batch sizes timed."""

    low_s: float
    high_s: float

    @property
    def measured(self) -> bool:
        return self.low_s == self.high_s


@dataclass(frozen=True)
class Speedup:
    """Plain decoding's time over speculation's: a figure when T(1) was measured, else
    the range its bounds allow."""

    low: float
    high: float

    @property
    def measured(self) -> bool:
        return self.low == self.high


@dataclass
class VerifyCosts:
    """Seconds per verification pass by batch size, learned from the rounds of a pair.

    A round that drafted nothing is a plain decoding step: its cost, T(1), is what
    plain decoding would pay per token, the baseline of the speedup estimate.
    """

    total_s: dict[int, float] = field(default_factory=dict)
    count: dict[int, int] = field(default_factory=dict)

    def observe(self, batch: int, seconds: float) -> None:
        if batch >= 1 and seconds > 0:
            self.total_s[batch] = self.total_s.get(batch, 0.0) + seconds
            self.count[batch] = self.count.get(batch, 0) + 1

    def plain_s(self) -> PlainCost | None:
        """T(1) where plain rounds ran; else bounds from the batches timed: no larger
        than the cheapest batch (a pass never gets cheaper with more tokens), no smaller
        than a k-token batch's k-th part (a batch never costs more than k passes)."""
        if not self.count:
            return None
        mean = {k: self.total_s[k] / self.count[k] for k in self.count}
        if 1 in mean:
            return PlainCost(mean[1], mean[1])
        return PlainCost(max(t / k for k, t in mean.items()), min(mean.values()))


def speedup(stats: Stats, plain: PlainCost | None) -> Speedup | None:
    """Plain decoding's time for the answer's tokens over the time the engine's rounds
    took: the time the UI takes between rounds would slow plain decoding as much."""
    if plain is None or stats.tokens < 2 or stats.tokens_per_s <= 0:
        return None
    rate = (stats.tokens - 1) / stats.round_s if stats.round_s > 0 else stats.tokens_per_s
    return Speedup(plain.low_s * rate, plain.high_s * rate)


def stats_record(stats: Stats, speedup_x: Speedup | None) -> dict[str, Any]:
    """The figures kept with an answer in its conversation file: "speedup" where T(1)
    was measured, else "speedup_range" (low, high)."""
    record = asdict(stats)
    for key in ("accepted_per_position", "drafted_per_position"):
        record.pop(key, None)
    if speedup_x is not None and speedup_x.measured:
        record["speedup"] = round(speedup_x.high, 3)
    elif speedup_x is not None:
        record["speedup_range"] = [round(speedup_x.low, 3), round(speedup_x.high, 3)]
    return record


def speedup_text(stats: Mapping[str, Any], digits: int = 1) -> str:
    """ "≈1.9×" from measured costs, "0.6–2.4×" from bounds, "" without either."""
    if stats.get("speedup"):
        return f"≈{stats['speedup']:.{digits}f}×"
    if bounds := stats.get("speedup_range"):
        return f"{bounds[0]:.1f}–{bounds[1]:.1f}×"
    return ""


def latency_text(stats: Mapping[str, Any], key: str) -> str:
    """p50 · p95 of a latency ("tpot" or "gap") in ms, or "–" before the answer ends."""
    p50, p95 = stats.get(f"{key}_p50_s"), stats.get(f"{key}_p95_s")
    if not p50 and not p95:
        return "–"
    return f"{(p50 or 0) * 1e3:.0f} ms p50 · {(p95 or 0) * 1e3:.0f} p95"


def summary_line(stop_reason: str, stats: Mapping[str, Any]) -> str:
    """The line under an answer: how it ended and what speculation did for it."""
    parts = [STOP_WORDS.get(stop_reason, stop_reason)]
    tokens = stats.get("tokens")
    if tokens:
        parts.append(f"{tokens} tokens")
    if stats.get("tokens_per_s"):
        parts.append(f"{stats['tokens_per_s']:.1f} tok/s")
    if stats.get("drafted"):
        parts.append(
            f"acceptance {stats['acceptance_rate']:.0%} ({stats['accepted']}/{stats['drafted']})"
        )
    elif tokens:
        parts.append("nothing drafted")
    if text := speedup_text(stats):
        parts.append(f"{text} vs plain")
    if stats.get("error"):
        parts.append(str(stats["error"]))
    return " · ".join(parts)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB") else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
