"""The chat's settings: a typed value, kept in $LOCALSPEC_HOME/settings.toml between runs.

Loading never fails: an unknown key or a bad value becomes a `Problem` (shown to the
user together) and that field keeps its default. Saving writes a temporary file, fsyncs
it and renames it over the old one, so a crash leaves either the old or the new file.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

from localspec.decoding.engine import GenerationConfig
from localspec.decoding.sampling import SamplingParams
from localspec.errors import LocalspecError, Problem
from localspec.paths import home, write_atomic
from localspec.thinking import SWITCHES, Switch

Drafter = Literal["model", "ngram", "none"]  # the pair's draft model, n-grams, or plain decoding
DRAFTERS: tuple[Drafter, ...] = get_args(Drafter)
MAX_GAMMA = 32


class SettingsError(LocalspecError):
    """A setting with a value it cannot take; `key` names it (as settings.toml does)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key

    def named(self, name: str) -> str:
        """The message with the setting called `name` (a form's label, an option)."""
        text = str(self)
        return name + text[len(self.key) :] if self.key and text.startswith(self.key) else text


@dataclass(frozen=True)
class Settings:
    system_prompt: str = "You are a helpful coding assistant. Answer concisely."
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 0.95
    max_tokens: int = 1024
    gamma: int | Literal["auto"] = "auto"  # tokens drafted per round, or adaptive
    drafter: Drafter = "model"
    provenance: bool = False  # colour each piece of an answer by who chose it
    target: str = ""  # the pair picked on the models screen; "" = the planner's choice
    draft: str = ""
    rpc: str = ""  # host:port[,host:port...] of rpc-servers for the target's layers; "" = none
    reasoning: Switch = "auto"  # thinking on, off, or as the model's chat template has it
    reasoning_budget: int = -1  # a thinking model's most reasoning tokens; -1 = no limit

    def __post_init__(self) -> None:
        for f in fields(self):
            check(f.name, getattr(self, f.name))

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p)

    def generation(self) -> GenerationConfig:
        return GenerationConfig(max_tokens=self.max_tokens, sampling=self.sampling())


def check(key: str, value: Any) -> None:
    """Raise SettingsError unless `value` is one `key` can take."""

    def need(ok: bool, what: str) -> None:
        if not ok:
            given = f"{value:g}" if number else repr(value)  # 2, as typed, not 2.0
            raise SettingsError(f"{key} must be {what}, not {given}", key)

    number = isinstance(value, int | float) and not isinstance(value, bool)
    whole = isinstance(value, int) and not isinstance(value, bool)
    match key:
        case "system_prompt" | "target" | "draft":
            need(isinstance(value, str), "text")
        case "temperature":
            need(number and math.isfinite(value) and 0 <= value <= 5, "a number from 0 to 5")
        case "top_p":
            need(number and 0 < value <= 1, "a number above 0, at most 1")
        case "reasoning_budget":
            need(whole and value >= -1, "a whole number of at least -1 (-1: no limit)")
        case "max_tokens":
            need(whole and value >= 1, "a whole number of at least 1")
        case "gamma":
            need(
                value == "auto" or (whole and 0 <= value <= MAX_GAMMA),
                f"'auto' or a whole number from 0 to {MAX_GAMMA}",
            )
        case "drafter":
            need(value in DRAFTERS, " or ".join(repr(d) for d in DRAFTERS))
        case "reasoning":
            need(value in SWITCHES, " or ".join(repr(s) for s in SWITCHES))
        case "provenance":
            need(isinstance(value, bool), "true or false")
        case "rpc":
            need(isinstance(value, str) and _endpoints_ok(value), "host:port[,host:port...]")
        case _:
            raise SettingsError(f"unknown setting {key!r}")


def _endpoints_ok(text: str) -> bool:
    from localspec.backends.rpc import RpcError, parse_endpoints

    try:
        return not text or bool(parse_endpoints(text))
    except RpcError:
        return False


def settings_path() -> Path:
    return home() / "settings.toml"


def load_settings(path: Path | None = None) -> tuple[Settings, list[Problem]]:
    """The saved settings (defaults where absent or wrong), and what was wrong."""
    path = path or settings_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Settings(), []
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        return Settings(), [Problem(path.name, f"unreadable, using defaults: {e}", key="(file)")]
    known = {f.name for f in fields(Settings)}
    values: dict[str, Any] = {}
    problems = []
    for key, value in data.items():
        if key not in known:
            problems.append(Problem(path.name, "unknown setting, ignored", key=key))
            continue
        if key == "temperature" and type(value) is int:
            value = float(value)  # TOML's `temperature = 1` is an int
        try:
            check(key, value)
        except SettingsError as e:
            problems.append(Problem(path.name, f"{e}; using the default", key=key))
            continue
        values[key] = value
    return Settings(**values), problems


def save_settings(settings: Settings, path: Path | None = None) -> None:
    """Write `settings` atomically: readers see the old file or the new one, never half."""
    path = path or settings_path()
    write_atomic(path, "".join(f"{key} = {_toml(v)}\n" for key, v in asdict(settings).items()))


def updated(settings: Settings, **changes: Any) -> Settings:
    """`settings` with `changes` applied; SettingsError names the first bad value."""
    return replace(settings, **changes)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    # A JSON string is a TOML basic string, except that TOML wants DEL escaped too.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007F")
