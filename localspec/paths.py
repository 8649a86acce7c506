"""Where localspec keeps its files: one root, movable with $LOCALSPEC_HOME (tests use tmp)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def home() -> Path:
    """The localspec data directory: $LOCALSPEC_HOME, else the user's data dir."""
    root = os.environ.get("LOCALSPEC_HOME") or platformdirs.user_data_dir("localspec")
    return Path(root).expanduser()


def models_dir() -> Path:
    """Model files that did not come through the Hugging Face cache (mirrors, `add`)."""
    return home() / "models"


def conversations_dir() -> Path:
    return home() / "conversations"
