"""The loaded pair of models, and the engine that the current settings ask of it.

The models load once; the drafter (draft model, n-grams, none) and γ (fixed or auto)
only change the engine around them, so switching those in the settings is instant.
Which pair to load is a `PairSpec`, the same value the planner's default pair is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from localspec.models.pairing import PairSpec
from localspec.session import Session, SessionConfig, make_engine
from localspec.settings import Settings
from localspec.thinking import switched
from tui.figures import VerifyCosts

# Loads a pair (blocking, in a worker); `say` reports steps such as a memory back-off.
PairLoader = Callable[[PairSpec, Callable[[str], None]], Session]


@dataclass
class LoadedPair:
    """A loaded Session and the engines built on its models."""

    spec: PairSpec
    base: Session
    costs: VerifyCosts = field(default_factory=VerifyCosts)  # the target's pass costs
    # per conversation, the first message its prompts hold (localspec.window)
    windows: dict[str, int] = field(default_factory=dict)
    _built: tuple[tuple[str, int | str], Session] | None = None

    @property
    def has_draft_model(self) -> bool:
        """A draft model, or the target's own MTP head (which drafts as one)."""
        return self.base.draft_model is not None or self.base.head is not None

    def drafter_for(self, settings: Settings) -> str:
        """The drafter that will run: 'model' falls back to n-grams without a draft model."""
        if settings.drafter == "model" and not self.has_draft_model:
            return "ngram"
        return settings.drafter

    def session_for(self, settings: Settings) -> Session:
        """A Session whose engine follows `settings`; kept while they do not change, so
        the adaptive drafter keeps what it learned. Call with the turn lock held."""
        drafter = self.drafter_for(settings)
        key = (drafter, settings.gamma)
        if self._built is None or self._built[0] != key:
            head = self.base.head if drafter == "model" else None
            kind = "mtp" if head is not None and self.base.draft_model is None else drafter
            config = SessionConfig(target=self.spec.target, draft=kind, gamma=settings.gamma)
            draft_model = self.base.draft_model if drafter == "model" else None
            engine = make_engine(self.base.target, draft_model, config, head)
            self._built = (key, self.base.around(engine))
        session = self._built[1]
        budget = settings.reasoning_budget  # (the command line's, where it set one)
        session.reasoning_budget = None if budget < 0 else budget
        session.template_kwargs = {**self.base.template_kwargs, **switched(settings.reasoning)}
        return session

    def close(self) -> None:
        self.base.close()
