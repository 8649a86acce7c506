"""Shared fixtures. The real pair is installed by scripts/setup.sh; a missing model is a
failed set-up, so real tests fail (never skip) without it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import DRAFT_ID, TARGET_ID, installed

from localspec.backends import load_llama_library

load_llama_library()  # before numpy, as the CLI does (docs/gpu-overhead.md)
# the planner's CPU estimates stay the catalog's: a test's plan must not follow what the
# sessions of earlier tests (or this machine's user) measured (test_calibration.py sets it)
os.environ["LOCALSPEC_CALIBRATION"] = "0"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Fast tests first, real-model tests last: a broken change fails in seconds."""
    items.sort(key=lambda item: item.get_closest_marker("real") is not None)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """localspec's home (settings, conversations, installed models) in an empty tmp dir."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("LOCALSPEC_HOME", str(path))
    return path


@pytest.fixture(scope="session")
def real_paths() -> tuple[Path, Path]:
    return installed(TARGET_ID), installed(DRAFT_ID)


@pytest.fixture(scope="session")
def real_models(real_paths: tuple[Path, Path]) -> Iterator[tuple]:
    """The real target and draft, loaded once for the whole run (2 threads, 2048 ctx)."""
    from localspec.backends.llama import LlamaModel, LoadOptions

    options = LoadOptions(n_ctx=2048, n_threads=2)
    target = LlamaModel(real_paths[0], options)
    draft = LlamaModel(real_paths[1], options)
    yield target, draft
    target.close()
    draft.close()


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma 3 270M: another vocabulary (scripts/test.sh pulls it)."""
    return installed("gemma-3-270m")
