"""A thinking model's answer as the chat shows it: its reasoning apart (a folding block
above the answer), its content as Markdown. The conversation file keeps the answer as it
streamed, marks and all; this is only how it is shown."""

from __future__ import annotations

from collections.abc import Iterable

from localspec.thinking import Split

REASONING = "reasoning"  # the source of a run of reasoning (others: "draft", "target")
Run = tuple[str, str]  # (text, source)


class ReasoningRuns:
    """Runs of an answer's text, as they stream, with the reasoning split off into runs
    of their own."""

    def __init__(self, split: Split) -> None:
        self.split = split

    def push(self, text: str, source: str) -> list[Run]:
        reasoning, content = self.split.push(text)
        return [r for r in ((reasoning, REASONING), (content, source)) if r[0]]

    def flush(self) -> list[Run]:
        reasoning, content = self.split.flush()
        return [r for r in ((reasoning, REASONING), (content, "target")) if r[0]]


def split_runs(split: Split, runs: Iterable[Run]) -> list[Run]:
    """A whole answer's runs (a saved one's), the reasoning split off."""
    parts = ReasoningRuns(split)
    out = [run for text, source in runs for run in parts.push(text, source)]
    return out + parts.flush()
