"""The prompt suite: loading and validating a prompts file, and picking prompts from it.

A suite is a JSON object of named prompts, each with a category; the one shipped with
localspec lives in `localspec/data/bench_prompts.json`. Every problem in a file is
reported at once, in one line (`BenchError`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from localspec.errors import LocalspecError

PROMPT_KEYS = {"category", "prompt"}


class BenchError(LocalspecError):
    """A bench input (prompts file, modes, peer file, report) is wrong; one line for the user."""


@dataclass(frozen=True)
class BenchPrompt:
    name: str
    category: str  # "code", "edit", "chat", "summarize", or any the file uses
    prompt: str  # the user message; rendered with the target's chat template


def default_prompts_path() -> Path:
    return Path(str(resources.files("localspec") / "data" / "bench_prompts.json"))


def load_prompts(path: Path | None = None) -> tuple[BenchPrompt, ...]:
    """The suite in `path` (default: the one shipped with localspec), validated: every
    problem in the file is reported at once, in one line."""
    path = path or default_prompts_path()
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BenchError(f"prompts file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BenchError(f"cannot read prompts file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise BenchError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(data, dict) or not data:
        raise BenchError(
            f'{path}: expected an object of prompts, {{"name": {{"category": ..., "prompt": ...}}}}'
        )
    problems: list[str] = []
    prompts: list[BenchPrompt] = []
    for name, entry in data.items():
        if not name.strip():
            problems.append("a prompt has an empty name")
            continue
        if not isinstance(entry, dict):
            problems.append(f"{name!r} is not an object")
            continue
        if missing := sorted(PROMPT_KEYS - entry.keys()):
            problems.append(f"{name!r} lacks {', '.join(missing)}")
        if unknown := sorted(entry.keys() - PROMPT_KEYS):
            problems.append(f"{name!r} has unknown key(s) {', '.join(unknown)}")
        bad = [
            k
            for k in sorted(PROMPT_KEYS & entry.keys())
            if not isinstance(entry[k], str) or not entry[k].strip()
        ]
        problems += [f"{name!r}: {k} must be a non-empty string" for k in bad]
        if not missing and not unknown and not bad:
            prompts.append(BenchPrompt(name, entry["category"].strip(), entry["prompt"]))
    if problems:
        raise BenchError(f"{path}: " + "; ".join(problems))
    return tuple(prompts)


def select_prompts(prompts: Sequence[BenchPrompt], only: str | None) -> tuple[BenchPrompt, ...]:
    """Prompts whose name or category is in the comma-separated `only` (all if None)."""
    if not only:
        return tuple(prompts)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    known = {p.name for p in prompts} | {p.category for p in prompts}
    if unknown := [w for w in wanted if w not in known]:
        raise BenchError(
            f"no prompt or category named {', '.join(unknown)} "
            f"(categories: {', '.join(sorted({p.category for p in prompts}))})"
        )
    return tuple(p for p in prompts if p.name in wanted or p.category in wanted)
