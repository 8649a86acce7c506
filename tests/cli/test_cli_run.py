"""`localspec run` end to end, as a user runs it: a subprocess, real models."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import assert_one_line_error, localspec


def assert_error(result: subprocess.CompletedProcess, words: str) -> None:
    assert_one_line_error(result.returncode, result.stderr, words)


def test_missing_model_file(tmp_path: Path):
    r = localspec("run", "hi", "--target", str(tmp_path / "nope.gguf"), "--draft", "none")
    assert_error(r, "not found")


def test_not_a_gguf(tmp_path: Path):
    fake = tmp_path / "fake.gguf"
    fake.write_text("hello")
    assert_error(localspec("run", "hi", "--target", str(fake)), "not a GGUF")


def test_empty_prompt(tmp_path: Path):
    assert_error(localspec("run", "  ", "--target", "x.gguf"), "empty")
    assert_error(localspec("run", "--target", "x.gguf", stdin=""), "empty")


def test_bad_sampling_value():
    assert_error(localspec("run", "hi", "--target", "x.gguf", "--top-p", "0"), "top-p")


@pytest.mark.parametrize(
    ("option", "value"),
    [("--ctx", "99999999999"), ("--ctx", "8"), ("--threads", "-2"), ("--max-tokens", "0")],
)
def test_out_of_range_numbers_are_refused_before_anything_loads(option: str, value: str):
    r = localspec("run", "hi", "--target", "x.gguf", option, value)
    assert_usage_error(r, "localspec run", f"argument {option}")
    assert "must be between" in r.stderr


@pytest.mark.parametrize(
    ("value", "why"), [("40", "must be between 0 and 32"), ("x", "'x' is not a whole number")]
)
def test_a_bad_gamma_is_refused_and_auto_named(value: str, why: str):
    r = localspec("run", "hi", "--target", "x.gguf", "--gamma", value)
    assert_usage_error(r, "localspec run", f"--gamma/-g: {why} (or 'auto')")


def assert_usage_error(r: subprocess.CompletedProcess, prog: str, words: str) -> None:
    """A mistyped command line: exit 2 and one line, naming the command's --help."""
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"{prog}: error: "), r.stderr
    assert words in r.stderr and r.stderr.endswith(f"(see '{prog} --help')\n"), r.stderr


@pytest.mark.parametrize(
    ("args", "prog", "words"),
    [
        (["serve", "--parallel", "0"], "localspec serve", "--parallel: must be between 1"),
        (["plan", "--bogus"], "localspec plan", "unrecognized arguments: --bogus"),
        (["--bogus"], "localspec chat", "unrecognized arguments: --bogus"),
        (["srve"], "localspec", "invalid choice: 'srve'"),
    ],
)
def test_a_mistyped_command_line_gets_one_line_naming_the_commands_help(args, prog, words):
    assert_usage_error(localspec(*args), prog, words)


def test_every_command_says_what_it_does_and_the_main_ones_show_examples():
    """After `localspec --help`, a command's own --help is a user's next stop."""
    from localspec.cli import build_parser

    parser = build_parser()
    for name, command in parser.commands.items():
        assert command.description, f"localspec {name} --help says nothing of what it does"
    for name in ("run", "serve"):
        assert "examples:\n  localspec" in parser.commands[name].format_help(), name


@pytest.mark.real
def test_incompatible_draft(real_paths, gemma_path):
    r = localspec("run", "hi", "--target", str(real_paths[0]), "--draft", str(gemma_path))
    assert_error(r, "cannot be paired")


@pytest.mark.real
def test_drafting_with_an_mtp_head_a_model_lacks(real_paths):
    r = localspec("run", "hi", "--target", str(real_paths[0]), "--draft", "mtp")
    assert_error(r, "has no MTP head")


@pytest.mark.real
@pytest.mark.parametrize("words", [["word " * 600], ["word"] * 600], ids=["quoted", "unquoted"])
def test_prompt_longer_than_the_context(real_paths, words: list[str]):
    # unquoted, the words are one prompt (`localspec run why is the sky blue`)
    r = localspec("run", *words, "--target", str(real_paths[0]), "--draft", "none", "--ctx", "256")
    assert_error(r, "context")


@pytest.mark.real
def test_json_result_from_stdin(real_paths):
    target, draft = map(str, real_paths)
    r = localspec(
        "run",
        "--target",
        target,
        "--draft",
        draft,
        "--gamma",
        "3",
        "--max-tokens",
        "12",
        "--json",
        stdin="Write hello world in C.",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tokens"] == 12 and out["stop_reason"] == "max_tokens" and out["text"]
    # the models that answered (on a CPU the draft is its Q4_0 copy: .cpu-q4_0)
    assert out["models"]["target"] == Path(target).stem
    assert out["models"]["draft"].startswith(Path(draft).stem)
    stats = out["stats"]
    assert {
        "acceptance_rate",
        "mean_accepted_len",
        "tokens_per_s",
        "ttft_s",
        "tpot_p50_s",
        "tpot_p95_s",
        "gap_p50_s",
        "gap_p95_s",
        "drafted",
        "accepted",
        "rounds",
        "gamma",
    } <= stats.keys()
    assert stats["drafted"] > 0 and 0 <= stats["acceptance_rate"] <= 1


@pytest.mark.real
def test_streams_text_and_prints_stats_line(real_paths):
    r = localspec(
        "run", "Say hi.", "--target", str(real_paths[0]), "--draft", "ngram", "--max-tokens", "8"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "tok/s" in r.stderr and "acceptance" in r.stderr
