"""The chat's numbers: rates, the plain-decoding baseline, summaries."""

from __future__ import annotations

import pytest

from localspec.decoding.events import Stats
from tui.figures import (
    PlainCost,
    RateWindow,
    Speedup,
    VerifyCosts,
    human_bytes,
    latency_text,
    speedup,
    speedup_text,
    stats_record,
    summary_line,
)


def test_rate_window_measures_the_last_second():
    w = RateWindow(window_s=1.0, history=3)
    assert w.sample(0.0, 0) == 0.0
    assert w.sample(0.5, 10) == pytest.approx(20.0)
    assert w.sample(1.0, 20) == pytest.approx(20.0)
    assert w.sample(2.0, 20) == pytest.approx(0.0, abs=1e-9)  # stalled: the rate falls
    assert len(w.rates) == 3  # the sparkline keeps `history` rates


def test_plain_cost_measured_from_rounds_that_drafted_nothing():
    costs = VerifyCosts()
    assert costs.plain_s() is None
    costs.observe(5, 0.30)
    # only batches of 5: T(1) lies between a fifth of it and all of it
    assert costs.plain_s() == PlainCost(pytest.approx(0.06), 0.30)
    costs.observe(3, 0.20)
    bounds = costs.plain_s()
    assert bounds == PlainCost(pytest.approx(0.2 / 3), 0.20) and not bounds.measured
    costs.observe(1, 0.12)
    costs.observe(1, 0.08)
    measured = costs.plain_s()
    assert measured == PlainCost(pytest.approx(0.10), pytest.approx(0.10)) and measured.measured


def test_speedup_is_plain_time_over_actual_time():
    stats = Stats(tokens=21, tokens_per_s=20.0)
    assert speedup(stats, PlainCost(0.1, 0.1)) == Speedup(pytest.approx(2.0), pytest.approx(2.0))
    assert speedup(stats, None) is None
    assert speedup(Stats(tokens=1, tokens_per_s=0.0), PlainCost(0.1, 0.1)) is None


def test_the_speedup_leaves_out_what_the_ui_took_between_rounds():
    """20 tokens in 1 s of rounds, but 1.25 s of answer: the UI's 0.25 s would slow plain
    decoding too, so it is not speculation's to answer for."""
    stats = Stats(tokens=21, tokens_per_s=16.0, round_s=1.0)
    assert speedup(stats, PlainCost(0.1, 0.1)).high == pytest.approx(2.0)


def test_without_a_timed_plain_round_the_speedup_is_a_range_not_an_estimate():
    """Only batches of 5 were timed: T(5) as T(1) would overstate the speedup (a CPU's
    T(5) is several T(1)); the chat shows what the bounds allow."""
    costs = VerifyCosts()
    costs.observe(5, 0.30)
    estimate = speedup(Stats(tokens=21, tokens_per_s=20.0, round_s=1.0), costs.plain_s())
    assert estimate is not None and not estimate.measured
    record = stats_record(Stats(tokens=21, tokens_per_s=20.0), estimate)
    assert "speedup" not in record and record["speedup_range"] == [1.2, 6.0]
    assert summary_line("eog", record).endswith("nothing drafted · 1.2–6.0× vs plain")
    assert speedup_text(record) == "1.2–6.0×"
    assert speedup_text({"speedup": 1.94}) == "≈1.9×"
    assert speedup_text({}) == ""


def test_tpot_and_gaps_show_once_an_answer_ends():
    record = stats_record(Stats(tpot_p50_s=0.0123, tpot_p95_s=0.031, gap_p95_s=0.08), None)
    assert latency_text(record, "tpot") == "12 ms p50 · 31 p95"
    assert latency_text(record, "gap") == "0 ms p50 · 80 p95"
    assert latency_text({}, "tpot") == "–"
    assert "itl_p50_s" not in record  # the old name lives on as a property only
    assert Stats(tpot_p50_s=0.5).itl_p50_s == 0.5


def test_summary_line():
    record = stats_record(
        Stats(tokens=31, tokens_per_s=24.5, drafted=24, accepted=18, acceptance_rate=0.75),
        Speedup(1.94, 1.94),
    )
    assert "accepted_per_position" not in record
    assert summary_line("eog", record) == (
        "done · 31 tokens · 24.5 tok/s · acceptance 75% (18/24) · ≈1.9× vs plain"
    )
    assert summary_line("cancelled", {}) == "stopped"
    assert summary_line("error", {"error": "boom"}) == "failed · boom"
    assert summary_line("max_tokens", {"tokens": 5}) == "max tokens · 5 tokens · nothing drafted"


def test_human_bytes():
    assert [human_bytes(n) for n in (512, 2048, 3 << 20, 5 << 30)] == [
        "512 B",
        "2 KiB",
        "3.0 MiB",
        "5.0 GiB",
    ]
