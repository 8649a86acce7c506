"""Settings: typed, validated, saved atomically, and forgiving when the file is wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localspec.settings import (
    Settings,
    SettingsError,
    load_settings,
    save_settings,
    settings_path,
    updated,
)


def test_defaults_when_no_file(tmp_path: Path):
    assert load_settings(tmp_path / "settings.toml") == (Settings(), [])


def test_round_trip_keeps_every_field(tmp_path: Path):
    path = tmp_path / "settings.toml"
    s = Settings(
        system_prompt='Say "hi"\n\tthen \\ stop ✓ 🦙 \x7f \x01',
        temperature=0.7,
        top_p=0.5,
        max_tokens=64,
        gamma=6,
        drafter="ngram",
        provenance=True,
        target="qwen2.5-coder-7b-instruct",
        draft="/models/q 0.5b.gguf",
        reasoning="off",
        reasoning_budget=128,
    )
    save_settings(s, path)
    assert load_settings(path) == (s, [])
    assert not list(tmp_path.glob(".*.tmp")), "the temporary file is renamed away"


def test_saving_replaces_the_file_whole(tmp_path: Path):
    path = tmp_path / "settings.toml"
    save_settings(Settings(max_tokens=5), path)
    inode = os.stat(path).st_ino
    save_settings(Settings(max_tokens=6), path)
    assert load_settings(path)[0].max_tokens == 6
    assert os.stat(path).st_ino != inode  # a rename, not an in-place rewrite


def test_a_save_that_fails_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path = tmp_path / "settings.toml"
    save_settings(Settings(max_tokens=5), path)

    def disk_full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("localspec.paths.os.replace", disk_full)
    with pytest.raises(OSError):
        save_settings(Settings(max_tokens=6), path)
    assert load_settings(path)[0].max_tokens == 5
    assert [p.name for p in tmp_path.iterdir()] == ["settings.toml"]


def test_home_moves_with_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    save_settings(Settings(gamma=2))
    assert settings_path() == tmp_path / "settings.toml"
    assert load_settings()[0].gamma == 2


def test_problems_are_collected_and_defaults_kept(tmp_path: Path):
    path = tmp_path / "settings.toml"
    path.write_text(
        'temperature = -1\ncolour = "red"\ngamma = "lots"\nmax_tokens = 32\n'
        'drafter = "magic"\ntop_p = 1\n'
    )
    settings, problems = load_settings(path)
    assert settings == Settings(max_tokens=32, top_p=1)
    assert sorted(p.key for p in problems) == ["colour", "drafter", "gamma", "temperature"]
    assert all(str(p).startswith("settings.toml: ") for p in problems)


def test_integer_temperature_is_accepted(tmp_path: Path):
    path = tmp_path / "settings.toml"
    path.write_text("temperature = 1\n")
    assert load_settings(path) == (Settings(temperature=1.0), [])


def test_unreadable_file_is_one_problem(tmp_path: Path):
    path = tmp_path / "settings.toml"
    path.write_text("this is = = not toml")
    settings, problems = load_settings(path)
    assert settings == Settings() and len(problems) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"max_tokens": 0},
        {"gamma": 33},
        {"gamma": True},
        {"drafter": "draft"},
        {"provenance": "yes"},
        {"max_tokens": 1.5},
        {"reasoning": "no"},
        {"reasoning_budget": -2},
    ],
)
def test_bad_values_are_refused(change: dict):
    with pytest.raises(SettingsError):
        updated(Settings(), **change)


def test_generation_config_follows_the_settings():
    config = Settings(temperature=0.3, top_p=0.8, max_tokens=99).generation()
    assert config.max_tokens == 99
    assert (config.sampling.temperature, config.sampling.top_p) == (0.3, 0.8)
