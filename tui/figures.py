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

    def plain_s(self) -> tuple[float, bool] | None:
        """(T(1), measured?) or None: measured when plain rounds ran, else a linear fit
        over the batch sizes seen, else the smallest batch's cost (an upper bound)."""
        if not self.count:
            return None
        mean = {k: self.total_s[k] / self.count[k] for k in self.count}
        if 1 in mean:
            return mean[1], True
        if len(mean) >= 2:
            ks = sorted(mean)
            n = len(ks)
            mx, my = sum(ks) / n, sum(mean[k] for k in ks) / n
            slope = sum((k - mx) * (mean[k] - my) for k in ks) / sum((k - mx) ** 2 for k in ks)
            fit = my + slope * (1 - mx)
            if 0 < fit <= mean[ks[0]]:
                return fit, False
        return mean[min(mean)], False


def speedup(stats: Stats, plain_s: float | None) -> float | None:
    """Plain decoding's time for the answer's tokens over the time the engine's rounds
    took: the time the UI takes between rounds would slow plain decoding as much."""
    if plain_s is None or stats.tokens < 2 or stats.tokens_per_s <= 0:
        return None
    if stats.round_s > 0:
        return plain_s * (stats.tokens - 1) / stats.round_s
    return plain_s * stats.tokens_per_s


def stats_record(stats: Stats, speedup_x: float | None) -> dict[str, Any]:
    """The figures kept with an answer in its conversation file."""
    record = asdict(stats)
    for key in ("accepted_per_position", "drafted_per_position"):
        record.pop(key, None)
    if speedup_x is not None:
        record["speedup"] = round(speedup_x, 3)
    return record


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
    if stats.get("speedup"):
        parts.append(f"≈{stats['speedup']:.1f}× vs plain")
    if stats.get("error"):
        parts.append(str(stats["error"]))
    return " · ".join(parts)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB") else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
