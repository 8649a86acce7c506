"""The live stats panel: speed, what speculation is doing, and memory."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.table import Table
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Label, Sparkline, Static

from tui.figures import RateWindow, human_bytes, latency_text, speedup_text
from tui.memory import MemoryUse

# The panel refreshes twice a second while an answer streams: each refresh costs the UI
# thread ~10 ms on a slow CPU, taken from llama.cpp where its threads fill every core.
SAMPLE_S = 0.5


def _rows(rows: list[tuple[str, str]]) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in rows:
        table.add_row(label, value)
    return table


def speed_rows(rate_now: float, figures: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rates, then (once an answer ends) the time per output token, each round's time
    spread over its tokens, and the real gaps between the pieces as they came."""
    return [
        ("now", f"{rate_now:5.1f} tok/s"),
        ("answer", f"{figures.get('tokens_per_s', 0.0):5.1f} tok/s"),
        ("TPOT", latency_text(figures, "tpot")),
        ("gaps", latency_text(figures, "gap")),
    ]


def speculation_rows(figures: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Acceptance, mean accepted length, γ and drafter, TTFT, speedup estimate."""
    drafted = figures.get("drafted", 0)
    acceptance = (
        f"{figures.get('acceptance_rate', 0.0):.0%} ({figures.get('accepted', 0)}/{drafted})"
        if drafted
        else "–"
    )
    speedup = speedup_text(figures, digits=2)
    return [
        ("accepted", acceptance),
        ("mean len", f"{figures.get('mean_accepted_len', 0.0):.2f} tok/round"),
        ("γ", f"{figures.get('gamma', 0)} · {figures.get('drafter') or '–'}"),
        ("TTFT", f"{figures.get('ttft_s', 0.0):.2f} s"),
        ("tokens", str(figures.get("tokens", 0))),
        ("speedup", f"{speedup} plain" if speedup else "–"),
    ]


def memory_rows(memory: MemoryUse | None) -> list[tuple[str, str]]:
    if memory is None:
        return [("RAM", "…")]
    app = human_bytes(memory.process)
    if memory.mapped >= memory.process / 10:  # say why "app" may be more than "RAM"
        app += f" · {human_bytes(memory.mapped)} mmap"
    rows = [
        ("app", app),
        ("RAM", f"{human_bytes(memory.used)} / {human_bytes(memory.total)}"),
    ]
    for gpu in memory.gpus:
        used = "?" if gpu.used is None else human_bytes(gpu.used)
        total = "?" if gpu.total is None else human_bytes(gpu.total)
        rows.append((f"GPU{gpu.index}", f"{used} / {total}"))
    return rows


class StatsPanel(Vertical):
    """Figures of the answer in progress (or the last one), sampled a few times a second."""

    generating: reactive[bool] = reactive(False)
    """An answer is streaming: the rate sampler runs."""

    figures: reactive[dict[str, Any]] = reactive(dict, always_update=True)
    """The latest figures of the current or last answer (see figures.stats_record)."""

    memory: reactive[MemoryUse | None] = reactive(None)
    """The latest memory reading."""

    pair: reactive[str] = reactive("loading models…")
    """The pair (target, then draft, a line each), or what is happening to it."""

    why: reactive[str] = reactive("")
    """Why `--gamma auto` drafts what it drafts, in a line (empty with a fixed γ)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.tokens = 0  # tokens of the current answer, counted as pieces arrive
        self.rate = RateWindow(window_s=1.0)
        self.rate_now = 0.0

    def compose(self) -> ComposeResult:
        yield Static(self.pair, id="stats-pair", markup=False)
        yield Static("SPEED", classes="stats-heading")
        yield Static(id="stats-speed")
        yield Sparkline([], id="stats-sparkline")
        yield Static("SPECULATION", classes="stats-heading")
        yield Static(id="stats-speculation")
        yield Static(id="stats-why", markup=False)
        yield Static("MEMORY", classes="stats-heading")
        yield Static(id="stats-memory")
        with Horizontal(id="stats-legend"):  # colours as in the provenance view (.tcss)
            yield Label("■ draft", classes="legend-draft")
            yield Label("■ target", classes="legend-target")

    def on_mount(self) -> None:
        self._sampler = self.set_interval(SAMPLE_S, self.sample, pause=True)
        self._show_figures()
        self.watch_memory(self.memory)
        self.watch_why(self.why)

    def start_answer(self) -> None:
        self.tokens = 0
        self.rate.restart()
        self.rate.sample(time.monotonic(), 0)
        self.figures = {}
        self.why = ""
        self.generating = True

    def count(self, tokens: int = 1) -> None:
        self.tokens += tokens

    def sample(self) -> None:
        self.rate_now = self.rate.sample(time.monotonic(), self.tokens)
        self.query_one(Sparkline).data = list(self.rate.rates)
        self._show_figures()

    def watch_generating(self, generating: bool) -> None:
        self.set_class(generating, "-generating")
        if not self.is_mounted:
            return
        if generating:
            self._sampler.resume()
        else:
            self._sampler.pause()
            self.rate_now = 0.0
            self._show_figures()

    def watch_figures(self) -> None:
        if self.is_mounted:
            self._show_figures()

    def watch_memory(self, memory: MemoryUse | None) -> None:
        if self.is_mounted:  # the rows keep their number: no new layout while streaming
            self.query_one("#stats-memory", Static).update(
                _rows(memory_rows(memory)), layout=not self.generating
            )

    def watch_why(self, why: str) -> None:
        """The decision in the panel ("ngram γ=3 ≈ 1.24× plain"); the figures behind it
        (α, costs) in its tooltip."""
        if self.is_mounted:
            label = self.query_one("#stats-why", Static)
            decision = why.split(": ", 1)[0]
            if decision != str(label.content):  # unchanged through plain decoding
                label.update(decision)
            label.tooltip = why or None
            self.set_class(bool(why), "-explaining")

    def watch_pair(self, pair: str) -> None:
        if self.is_mounted:
            self.query_one("#stats-pair", Static).update(pair)

    def _show_figures(self) -> None:
        # While an answer streams the rows only change their values: redrawing just them,
        # not the screen's layout, keeps the UI thread off the cores llama.cpp decodes on.
        layout = not self.generating
        self.query_one("#stats-speed", Static).update(
            _rows(speed_rows(self.rate_now, self.figures)), layout=layout
        )
        self.query_one("#stats-speculation", Static).update(
            _rows(speculation_rows(self.figures)), layout=layout
        )
