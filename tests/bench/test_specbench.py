"""Spec-Bench as a bench suite: loading its questions, the seeded sample, the report's
per-category and short-answer figures, and the command, on a small questions file and
toy models."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import assert_one_line_error, localspec
from test_bench import FAST, toy_pair

from localspec.bench import modes, runner, specbench, suite
from localspec.bench.markdown import to_markdown
from localspec.bench.report import write_report
from localspec.bench.results import Report
from localspec.bench.specbench import Question, Sample
from localspec.bench.suite import BenchError

CATEGORIES = ("writing", "roleplay", "coding", "extraction", "qa", "translation", "rag")


def questions_file(tmp_path: Path, per_category: int = 4, extra: str = "") -> Path:
    """A questions file in Spec-Bench's format: `per_category` of each category, each
    with a second turn that a run must leave out."""
    lines = [
        json.dumps(
            {
                "question_id": 100 * i + j,
                "category": c,
                "turns": [f"Write add. ({c} {j})", "Now a second turn."],
            }
        )
        for i, c in enumerate(CATEGORIES)
        for j in range(per_category)
    ]
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


# --- loading -----------------------------------------------------------------------------
def test_questions_load_with_their_first_turn(tmp_path):
    questions = specbench.load_questions(questions_file(tmp_path))
    assert len(questions) == 4 * len(CATEGORIES)
    assert questions[0] == Question("0", "writing", "Write add. (writing 0)")


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("{not json", "line 29: not valid JSON"),
        ('["a"]', "line 29: not an object"),
        ('{"category": "qa", "turns": ["x"]}', "line 29: no question_id"),
        ('{"question_id": 1, "turns": ["x"]}', "line 29: category must be"),
        ('{"question_id": 1, "category": "qa", "turns": []}', "line 29: turns must be"),
        ('{"question_id": 1, "category": "qa", "turns": [" "]}', "line 29: the first turn"),
    ],
)
def test_a_bad_line_is_named(tmp_path, line, words):
    with pytest.raises(BenchError) as err:
        specbench.load_questions(questions_file(tmp_path, extra=line + "\n"))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_file_is_found_by_option_then_environment_then_beside_the_repository(
    tmp_path, monkeypatch
):
    given = questions_file(tmp_path)
    assert specbench.find_questions(given) == given
    monkeypatch.setenv(specbench.ENV_VAR, str(given))
    assert specbench.find_questions(None) == given
    with pytest.raises(BenchError, match=r"not found: .*nope\.jsonl"):
        specbench.find_questions(tmp_path / "nope.jsonl")
    monkeypatch.delenv(specbench.ENV_VAR)
    found = specbench.find_questions(None) if beside_repo() else None
    assert found is None or found.parts[-3:] == ("shared", "specbench", "question.jsonl")


def beside_repo() -> bool:
    repo = Path(specbench.__file__).resolve().parents[2]
    return any((p / specbench.BESIDE_REPO).is_file() for p in repo.parents)


def test_a_missing_file_says_where_it_looked_and_how_to_point_at_it(tmp_path, monkeypatch):
    monkeypatch.delenv(specbench.ENV_VAR, raising=False)
    monkeypatch.setattr(specbench, "BESIDE_REPO", Path("no-such-dir") / "question.jsonl")
    with pytest.raises(BenchError, match="--specbench PATH or set LOCALSPEC_SPECBENCH"):
        specbench.find_questions(None)


# --- the sample --------------------------------------------------------------------------
def test_the_sample_takes_n_of_each_category_the_same_way_every_time(tmp_path):
    questions = specbench.load_questions(questions_file(tmp_path, per_category=10))
    picked = specbench.sample_questions(questions, Sample(per_category=3, seed=7))
    assert len(picked) == 3 * len(CATEGORIES)
    assert tuple(dict.fromkeys(p.category for p in picked)) == CATEGORIES  # the file's order
    assert picked == specbench.sample_questions(questions, Sample(3, 7))  # seeded
    assert picked != specbench.sample_questions(questions, Sample(3, 8))
    by_name = {f"{q.category}-{q.question_id}": q.turn for q in questions}
    assert all(by_name[p.name] == p.prompt for p in picked)  # named by category and id
    # one category's pick does not move when another grows
    more = (*questions, Question("9999", "qa", "Another."))
    again = specbench.sample_questions(more, Sample(3, 7))
    assert [p for p in again if p.category != "qa"] == [p for p in picked if p.category != "qa"]


def test_a_small_category_is_taken_whole(tmp_path):
    questions = specbench.load_questions(questions_file(tmp_path, per_category=2))
    assert len(specbench.sample_questions(questions, Sample(per_category=5))) == 14
    with pytest.raises(BenchError, match="--per-category"):
        specbench.sample_questions(questions, Sample(per_category=0))


def test_a_sample_written_as_a_prompts_file_reads_back_the_same(tmp_path):
    picked = specbench.load_sample(questions_file(tmp_path), Sample(2))
    path = tmp_path / "sample.json"
    path.write_text(specbench.as_prompts_file(picked))
    assert suite.load_prompts(path) == picked


# --- the report --------------------------------------------------------------------------
def run_sample(tmp_path: Path, per_category: int = 1, max_tokens: int = 40) -> Report:
    sample = Sample(per_category)
    prompts = specbench.load_sample(questions_file(tmp_path), sample)
    target, draft = toy_pair()
    return runner.run_bench(
        target,
        draft,
        prompts,
        modes.parse_modes("auto"),
        replace(FAST, max_tokens=max_tokens),
        suite=specbench.describe(sample, len(prompts)),
    )


def test_the_report_gives_each_category_and_their_median(tmp_path):
    report = run_sample(tmp_path)
    (auto,) = report.summary()
    assert [c for c, _ in auto.by_category] == list(CATEGORIES)
    ratios = sorted(v for _, v in auto.by_category)
    assert auto.over_categories == pytest.approx(ratios[len(ratios) // 2])
    md = to_markdown(report)
    assert "## By category" in md and "median over categories" in md
    assert "Spec-Bench (first turns): 7 questions, 1 per category (seed 0)" in md
    for c in CATEGORIES:
        assert f"| {c} | 1 |" in md


def test_short_answers_are_judged_by_their_time_to_the_last_token(tmp_path):
    report = run_sample(tmp_path, max_tokens=20)
    r = report.result(report.prompts[0], "auto")
    assert r.tokens == 20 and r.short
    base = report.result(report.prompts[0], "baseline")
    latency = base.runs[0].last_token_s / r.runs[0].last_token_s
    assert r.latency_speedup == pytest.approx(latency) and r.measure == r.latency_speedup
    (auto,) = report.summary()
    assert auto.worst == min(report.result(p, "auto").measure for p in report.prompts)
    # the medians too, as issue 21's aims judge short answers
    first = report.result(report.prompts[0], "auto")
    assert dict(auto.by_category)[first.category] == first.latency_speedup != first.speedup
    md = to_markdown(report)
    assert "## Short answers (under 32 tokens): time to the last token" in md
    assert " TTLT " in md.split("## By category")[0]  # the slowest prompt says how it was judged


def test_the_suite_and_the_latency_figures_survive_the_json(tmp_path):
    report = run_sample(tmp_path)
    _, js, *_ = write_report(report, tmp_path, chart=False)
    again = Report.from_json(json.loads(js.read_text()))
    assert again.info.suite == report.info.suite and again.results == report.results
    assert to_markdown(again) == to_markdown(report)


# --- the command -------------------------------------------------------------------------
def test_the_command_lists_the_sample_as_a_prompts_file(tmp_path):
    path = questions_file(tmp_path)
    r = localspec(
        "bench", "--suite", "specbench", "--specbench", str(path), "--per-category", "2",
        "--seed", "3", "--only", "coding,qa", "--list-prompts",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    listed = tmp_path / "listed.json"
    listed.write_text(r.stdout)
    prompts = suite.load_prompts(listed)
    expected = specbench.load_sample(path, Sample(2, 3))
    assert prompts == tuple(p for p in expected if p.category in ("coding", "qa"))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--suite", "specbench", "--specbench", "{missing}"], "Spec-Bench questions not found"),
        (["--suite", "specbench", "--specbench", "{bad}"], "line 29: not valid JSON"),
        (["--suite", "specbench", "--prompts", "x.json"], "pick one"),
        (["--specbench", "{good}"], "--specbench needs --suite specbench"),
        (["--suite", "specbench", "--specbench", "{good}", "--per-category", "0"], "at least 1"),
        (["--suite", "specbench", "--specbench", "{good}", "--only", "poetry"], "poetry"),
        (["--temperature", "0.7"], "--temperature is for --suite json"),
        (["--suite", "json", "--temperature", "-1"], "between 0 and 2"),
    ],
)
def test_command_errors_are_one_line(tmp_path, args, words):
    files = {
        "{missing}": str(tmp_path / "missing.jsonl"),
        "{bad}": str(questions_file(tmp_path / "bad", extra="{oops\n"))
        if (tmp_path / "bad").mkdir() is None
        else "",
        "{good}": str(questions_file(tmp_path)),
    }
    args = [files.get(a, a) for a in args]
    r = localspec("bench", "--target", str(tmp_path / "t.gguf"), *args)
    assert_one_line_error(r.returncode, r.stderr, words)
