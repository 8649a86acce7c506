"""The chat screen's widgets."""

from tui.widgets.prompt import PromptInput
from tui.widgets.stats import StatsPanel
from tui.widgets.transcript import Answer, Transcript, UserMessage

__all__ = ["Answer", "PromptInput", "StatsPanel", "Transcript", "UserMessage"]
