"""Adaptive speculation (`--gamma auto`). Placeholder: fixed γ=4 until issue 3 lands."""

from __future__ import annotations

from .backend import Model
from .drafters import DraftModel, NgramDrafter
from .engine import Engine, FixedGamma


class AdaptiveGamma(FixedGamma):
    def __init__(self) -> None:
        super().__init__(4)


def auto_engine(target: Model, draft: Model | None) -> Engine:
    """The engine `--gamma auto` runs: hybrid drafting with an adaptive γ."""
    drafter = DraftModel(draft) if draft is not None else NgramDrafter()
    return Engine(target, drafter, AdaptiveGamma())
