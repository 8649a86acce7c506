"""Shadow drafts: a free source's proposal that a round did not draft, measured on the text
the target goes on to write, so the source's α stays current at no cost and no draft has
to be risked to notice that the text repeats or stopped repeating (`--gamma auto`,
localspec.decoding.adaptive)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localspec.decoding.estimates import Acceptance

MAX_SHADOWS = 64  # pending shadow drafts kept (a few rounds' worth of every free source)


@dataclass
class Shadow:
    """A free source's proposal that a round did not draft. The target's text after `at`
    says how much of it a draft would have kept: at temperature 0 exactly; sampled, a
    token matches with the target's probability for it, its chance of acceptance. Each
    position is learned as soon as the text reaches it, so a repeated text raises α within
    a few tokens, as drafting it would."""

    key: str  # the acceptance it teaches
    at: int  # where the proposal would have gone in the text
    tokens: list[int]
    checked: int = 0  # positions the text has reached so far


class Shadows:
    """The pending shadow drafts of one text, the newest last."""

    def __init__(self) -> None:
        self.pending: list[Shadow] = []

    def keep(self, shadow: Shadow) -> None:
        self.pending.append(shadow)
        del self.pending[:-MAX_SHADOWS]

    def clear(self) -> None:
        """Another text (the next request): they would not apply."""
        self.pending.clear()

    def settle(self, text: Sequence[int], alpha: dict[str, Acceptance]) -> None:
        """Each shadow teaches its acceptance the positions the text has reached; it is
        done at its first miss or its last token."""
        pending = []
        for s in self.pending:
            acceptance, hit = alpha[s.key], True
            while hit and s.checked < len(s.tokens) and s.at + s.checked < len(text):
                hit = text[s.at + s.checked] == s.tokens[s.checked]
                acceptance.learn(s.checked, hit)
                s.checked += 1
            if hit and s.checked < len(s.tokens):
                pending.append(s)
            else:
                acceptance.relax_from(s.checked)
        self.pending = pending
