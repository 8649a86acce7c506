"""A scripted pair for tests and `localspec chat --demo`: the real engine over toy models.

The target answers every turn with a reply (a function of the prompt); the draft guesses
a slightly different text, so the provenance view shows both accepted and rejected runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localspec.backends.toy import TEMPLATE, ToyModel, scripted
from localspec.decoding.drafters import DraftModel
from localspec.decoding.engine import Engine
from localspec.session import Session
from tui.pair import PairLoader, PairSpec

DEMO_REPLY = (
    "Here is a function that reverses a string:\n\n"
    "```python\ndef reverse(text: str) -> str:\n    return text[::-1]\n```\n\n"
    "Slicing with a step of -1 walks the string backwards."
)
SPEC = PairSpec("toy-target", "toy-draft")

Reply = Callable[[str], str]  # the whole prompt as the template renders it -> the reply


def _swap_words(text: str) -> str:
    """The draft's guess: the reply with every seventh word changed."""
    words = text.split(" ")
    return " ".join(w + "s" if i % 7 == 6 and w.isalpha() else w for i, w in enumerate(words))


def scripted_session(
    reply: Reply | str = DEMO_REPLY,
    token_s: float = 0.0,
    gamma: int = 3,
    n_ctx: int = 4096,
    template: str = TEMPLATE,
) -> Session:
    """A Session whose target answers `reply` (text, or a function of the prompt);
    `token_s`: seconds per model pass, to stream slowly; `template`: the target's chat
    template (a thinking model's, say)."""

    def target_text(prompt: bytes) -> str:
        return reply(prompt.decode("utf-8", "replace")) if callable(reply) else reply

    def draft_text(prompt: bytes) -> str:
        return _swap_words(target_text(prompt))

    target = ToyModel(
        scripted(target_text), name="toy-target", pass_s=token_s, n_ctx=n_ctx, template=template
    )
    draft = ToyModel(scripted(draft_text), name="toy-draft", pass_s=token_s / 4, n_ctx=n_ctx)
    engine = Engine(target, DraftModel(draft, p_min=0.0), gamma)
    return Session(engine, draft)  # type: ignore[arg-type]  # a toy in the LlamaModel slot


def scripted_loader(
    reply: Reply | str = DEMO_REPLY,
    token_s: float = 0.0,
    fail: Exception | None = None,
    n_ctx: int = 4096,
    template: str = TEMPLATE,
) -> PairLoader:
    """A PairLoader for the scripted pair (or one that fails with `fail`)."""

    def load(spec: PairSpec, say: Callable[[str], None]) -> Any:
        if fail is not None:
            raise fail
        return scripted_session(reply, token_s, n_ctx=n_ctx, template=template)

    return load
