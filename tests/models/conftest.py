"""Model management runs against a Hugging Face cache in tmp, the hub off unless a test
starts the fake one (hub_server.fake_hub, which sets HF_ENDPOINT and clears
HF_HUB_OFFLINE)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def home(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_TOKEN", "")
    monkeypatch.setenv("LOCALSPEC_HUB_TIMEOUT", "2")
    return home
