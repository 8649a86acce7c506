"""Spec-Bench as a bench suite: its questions, and a seeded sample of each category.

Spec-Bench (Xia et al., ACL 2024 Findings) is the public speculative-decoding benchmark:
480 questions in 13 categories (the eight of MT-Bench, then translation, summarization,
QA, math reasoning and RAG), one JSON object a line with `question_id`, `category` and
`turns`. Its questions are not shipped with localspec: the file is found through
--specbench, $LOCALSPEC_SPECBENCH, or as `shared/specbench/question.jsonl` beside the
repository (or beside one of its parents). Each question's first turn is its prompt. A
run takes `per_category` questions of each category, picked by a seeded generator per
category, so the same seed picks the same questions on every machine and Python.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from localspec.bench.suite import BenchError, BenchPrompt

ENV_VAR = "LOCALSPEC_SPECBENCH"
BESIDE_REPO = Path("shared") / "specbench" / "question.jsonl"


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str
    turn: str  # the first turn: the user message a run answers


@dataclass(frozen=True)
class Sample:
    """Which questions to run: `per_category` of each category, picked with `seed`."""

    per_category: int = 2
    seed: int = 0


def find_questions(path: Path | None = None) -> Path:
    """The questions file: `path`, else $LOCALSPEC_SPECBENCH, else the first
    shared/specbench/question.jsonl beside the repository or one of its parents."""
    if path is None and (env := os.environ.get(ENV_VAR)):
        path = Path(env)
    if path is not None:
        if not path.is_file():
            raise BenchError(f"Spec-Bench questions not found: {path}")
        return path
    repo = Path(__file__).resolve().parents[2]
    for folder in repo.parents:
        if (candidate := folder / BESIDE_REPO).is_file():
            return candidate
    raise BenchError(
        f"Spec-Bench questions not found beside {repo} (../{BESIDE_REPO}): "
        f"pass --specbench PATH or set {ENV_VAR}"
    )


def load_questions(path: Path) -> tuple[Question, ...]:
    """Every question in the file, validated: every bad line is reported at once."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise BenchError(f"cannot read Spec-Bench questions {path}: {e}") from None
    problems: list[str] = []
    questions: list[Question] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            question = parse_question(json.loads(line))
        except json.JSONDecodeError as e:
            problems.append(f"line {number}: not valid JSON ({e.msg})")
        except ValueError as e:
            problems.append(f"line {number}: {e}")
        else:
            questions.append(question)
    if problems:
        shown = "; ".join(problems[:5]) + (
            f"; and {len(problems) - 5} more" if problems[5:] else ""
        )
        raise BenchError(f"{path}: {shown}")
    if not questions:
        raise BenchError(f"{path}: no questions")
    return tuple(questions)


def parse_question(entry: object) -> Question:
    """One line's object as a Question; ValueError says what is wrong with it."""
    if not isinstance(entry, dict):
        raise ValueError("not an object")
    category, turns = entry.get("category"), entry.get("turns")
    if "question_id" not in entry:
        raise ValueError("no question_id")
    if not isinstance(category, str) or not category.strip():
        raise ValueError("category must be a non-empty string")
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
        raise ValueError("turns must be a list of strings")
    if not turns[0].strip():
        raise ValueError("the first turn is empty")
    return Question(str(entry["question_id"]), category.strip(), turns[0])


def sample_questions(questions: Sequence[Question], sample: Sample) -> tuple[BenchPrompt, ...]:
    """`sample.per_category` questions of each category (all of a smaller one), in the
    file's order of categories; each category's pick depends on the seed and the
    category alone, so adding questions to one category leaves the others' picks."""
    if sample.per_category < 1:
        raise BenchError("--per-category must be at least 1")
    by_category: dict[str, list[Question]] = {}
    for q in questions:
        by_category.setdefault(q.category, []).append(q)
    prompts: list[BenchPrompt] = []
    for category, members in by_category.items():
        rng = random.Random(f"{sample.seed}:{category}")  # str seeds hash the same everywhere
        picked = rng.sample(members, min(sample.per_category, len(members)))
        picked.sort(key=members.index)
        prompts += [BenchPrompt(f"{category}-{q.question_id}", category, q.turn) for q in picked]
    return tuple(prompts)


def load_sample(path: Path | None, sample: Sample) -> tuple[BenchPrompt, ...]:
    """The sampled prompts of the questions file `path` (found as `find_questions` does)."""
    return sample_questions(load_questions(find_questions(path)), sample)


def describe(sample: Sample, count: int) -> str:
    """The suite, for the report."""
    return (
        f"Spec-Bench (first turns): {count} questions, {sample.per_category} per category "
        f"(seed {sample.seed})"
    )


def as_prompts_file(prompts: Sequence[BenchPrompt]) -> str:
    """`prompts` as a prompts file (`--prompts`): a sample can be run again without
    Spec-Bench's file, or by another version of localspec."""
    data = {p.name: {"category": p.category, "prompt": p.prompt} for p in prompts}
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
