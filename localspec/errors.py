"""What goes wrong in a way the user can fix: the one error base class the CLI prints as a
line, and `Problem`, one thing wrong in a file the user edits (the catalog, the settings)."""

from __future__ import annotations

from dataclasses import dataclass


class LocalspecError(Exception):
    """An error with a message a user can act on (no traceback shown)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a file, shown with the others: where it is, and what is wrong."""

    file: str  # the file as shown to the user
    message: str
    line: int | None = None  # where the file has lines to point at (TOML)
    key: str | None = None  # the setting it is about

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        if self.key:
            where = f"{where}: {self.key}"
        return f"{where}: {self.message}"
