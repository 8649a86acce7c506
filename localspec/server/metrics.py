"""The server's Prometheus figures (`GET /metrics`), in a registry of its own, and each
answer's log line."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from localspec.decoding.events import Stats

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RATE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)


class Metrics:
    def __init__(self, queue_depth: Callable[[], float]) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "localspec_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter("localspec_prompt_tokens", "Prompt tokens read", registry=r)
        self.completion_tokens = Counter(
            "localspec_completion_tokens", "Tokens generated", registry=r
        )
        self.drafted = Counter("localspec_drafted_tokens", "Tokens drafted", registry=r)
        self.accepted = Counter(
            "localspec_accepted_tokens", "Drafted tokens the target accepted", registry=r
        )
        self.prediction_accepted = Counter(
            "localspec_prediction_accepted_tokens",
            "Predicted Outputs tokens the target accepted",
            registry=r,
        )
        self.prediction_rejected = Counter(
            "localspec_prediction_rejected_tokens",
            "Predicted Outputs tokens the target rejected",
            registry=r,
        )
        acceptance = Gauge(
            "localspec_acceptance_rate", "Accepted / drafted tokens since start", registry=r
        )
        acceptance.set_function(self.acceptance_rate)
        depth = Gauge("localspec_queue_depth", "Requests waiting or being decoded", registry=r)
        depth.set_function(queue_depth)
        self.ttft = Histogram(
            "localspec_ttft_seconds", "Time to first token", buckets=TTFT_BUCKETS, registry=r
        )
        self.tokens_per_s = Histogram(
            "localspec_tokens_per_second",
            "Decode speed per request, after the first token",
            buckets=RATE_BUCKETS,
            registry=r,
        )
        # prompts the slots gave up, in RAM (--cache-ram): the worker says how much
        self.kept_prompts = Gauge(
            "localspec_prompt_cache_bytes", "Bytes of prompts kept in RAM", registry=r
        )
        self.prompts_back = Counter(
            "localspec_prompt_cache_tokens", "Prompt tokens loaded back from RAM", registry=r
        )
        self._drafted = self._accepted = 0

    def acceptance_rate(self) -> float:
        return self._accepted / self._drafted if self._drafted else 0.0

    def observe_answer(self, stats: Stats, tokens: int, accepted: int, rejected: int) -> None:
        """One finished answer: `tokens` generated, `accepted`/`rejected` prediction tokens."""
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.completion_tokens.inc(tokens)
        self.drafted.inc(stats.drafted)
        self.accepted.inc(stats.accepted)
        self._drafted += stats.drafted
        self._accepted += stats.accepted
        self.prediction_accepted.inc(accepted)
        self.prediction_rejected.inc(rejected)
        if tokens:
            self.ttft.observe(stats.ttft_s)
        if stats.tokens_per_s:
            self.tokens_per_s.observe(stats.tokens_per_s)

    def observe_request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def answer_line(s: Stats, stop_reason: str, shared: float = 0.0, plain_s: float = 0.0) -> str:
    """A request's log line: tokens, speed, TTFT, acceptance, drafters, speedup over
    plain decoding (`plain_s`: the target's plain round as `auto` timed it; 0: unknown).
    `shared`: the share of its target passes that carried other slots' tokens too; its
    rate then is its share of those passes, and no match for plain decoding's rate
    alone, so the line says how much it shared instead."""
    line = (
        f"{s.tokens} tokens ({stop_reason}), {s.tokens_per_s:.1f} tok/s, "
        f"TTFT {s.ttft_s:.2f}s, acceptance {s.acceptance_rate:.0%} "
        f"({s.accepted}/{s.drafted}), drafted by {', '.join(s.drafters) or 'none'}"
    )
    if s.recalled:  # no pass made them: no speedup to tell
        return line + f", {s.recalled} recalled from the last answer"
    if shared:
        share = f"{shared:.0%}" if shared >= 0.005 else "<1%"
        return line + f", {share} of its passes shared with other requests"
    if not s.drafted:  # it was plain decoding: a ratio to T(1) alone would show
        return line  # only the sampling and streaming that plain decoding pays too
    if plain_s and s.tokens_per_s:
        line += f", ≈{s.tokens_per_s * plain_s:.2f}x plain decoding"
    return line
