"""The chat screen's widgets."""

from .prompt import PromptInput
from .stats import StatsPanel
from .transcript import Answer, Transcript, UserMessage

__all__ = ["Answer", "PromptInput", "StatsPanel", "Transcript", "UserMessage"]
