"""The chat's numbers: rates, the plain-decoding baseline, summaries."""

from __future__ import annotations

import pytest

from localspec.decoding.events import Stats
from tui.figures import RateWindow, VerifyCosts, human_bytes, speedup, stats_record, summary_line


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
    assert costs.plain_s() == (0.30, False)  # only batches of 5: an upper bound
    costs.observe(3, 0.20)
    fit, measured = costs.plain_s()
    assert fit == pytest.approx(0.10) and not measured  # 0.05 s per token + 0.05 s
    costs.observe(1, 0.12)
    costs.observe(1, 0.08)
    assert costs.plain_s() == (pytest.approx(0.10), True)


def test_speedup_is_plain_time_over_actual_time():
    stats = Stats(tokens=21, tokens_per_s=20.0)
    assert speedup(stats, 0.1) == pytest.approx(2.0)  # plain: 10 tok/s
    assert speedup(stats, None) is None
    assert speedup(Stats(tokens=1, tokens_per_s=0.0), 0.1) is None


def test_the_speedup_leaves_out_what_the_ui_took_between_rounds():
    """20 tokens in 1 s of rounds, but 1.25 s of answer: the UI's 0.25 s would slow plain
    decoding too, so it is not speculation's to answer for."""
    stats = Stats(tokens=21, tokens_per_s=16.0, round_s=1.0)
    assert speedup(stats, 0.1) == pytest.approx(2.0)


def test_summary_line():
    record = stats_record(
        Stats(tokens=31, tokens_per_s=24.5, drafted=24, accepted=18, acceptance_rate=0.75), 1.94
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
