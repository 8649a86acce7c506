"""Errors as the user should see them: what happened, and what to do about it."""

from __future__ import annotations

from localspec.backends.base import ContextFull, LoadFailed, ModelError
from localspec.errors import LocalspecError


def advice(error: BaseException) -> tuple[str, str]:
    """(what happened, what to do) for a notification."""
    if isinstance(error, ContextFull):
        return (
            f"The conversation no longer fits the model's context ({error}).",
            "Start a new conversation with Ctrl+N, or restart with a larger --ctx.",
        )
    if isinstance(error, LoadFailed | MemoryError):
        return (
            str(error) or "Out of memory.",
            "Pick a smaller pair on the models screen (Ctrl+L), or close other programs.",
        )
    if isinstance(error, ModelError):
        return str(error), "Pick another pair on the models screen (Ctrl+L)."
    if isinstance(error, LocalspecError):
        return str(error), ""
    if isinstance(error, OSError):
        return f"{error.strerror or error} ({error.filename or 'file'})", (
            "Check that $LOCALSPEC_HOME is writable and the disk is not full."
        )
    return (
        f"Unexpected error: {type(error).__name__}: {error}",
        "The conversation so far is saved; please report this.",
    )
