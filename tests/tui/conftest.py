"""Every chat test runs with its own empty localspec home (settings, conversations)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _own_home(home: Path) -> Path:
    return home
