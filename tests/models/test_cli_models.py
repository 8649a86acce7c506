"""The `plan`, `models`, `add` and `pull` commands, as a user types them: what-if plans as
text and JSON, the catalog listing, registering a local file, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import assert_one_line_error
from hub_server import make_gguf

from localspec.cli import main
from localspec.models.catalog_file import default_catalog
from localspec.models.download import DownloadError, resolve_pull
from localspec.models.resolve import resolve_installed


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_for_a_what_if_machine(home, capsys):
    code, out, _ = run(
        capsys, "plan", "--json", "--vram", "24GiB", "--ram", "64GiB", "--cores", "8"
    )
    plan = json.loads(out)
    assert code == 0
    assert plan["target"]["id"] == "qwen2.5-coder-32b-instruct"
    assert plan["target"]["path"] is None and plan["target"]["n_gpu_layers"] == 65
    assert plan["draft"]["id"] == "qwen2.5-coder-0.5b-instruct" and plan["drafter"] == "draft"
    mem = plan["memory"]
    assert mem["vram_estimate"] <= mem["vram_budget"] and mem["ram_estimate"] <= mem["ram_budget"]
    assert plan["reasons"][0].startswith("This machine: NVIDIA GPU (24.0 GiB free)")
    # the 32B fills the card: serve's slots would push layers off it, so it gets one
    assert plan["slots"] == 1


def test_plan_says_how_many_slots_serve_gets(home, capsys):
    roomy = run(capsys, "plan", "--json", "--gpu", "none", "--ram", "64GiB", "--cores", "8")
    assert json.loads(roomy[1])["slots"] == 4  # at most 4, however much room
    code, out, _ = run(capsys, "plan", "--gpu", "none", "--ram", "64GiB", "--cores", "8")
    assert code == 0 and "\nserve    4 slots of " in out and " tokens (requests decoded" in out


def test_plan_text_says_why_and_how_to_get_it(home, capsys):
    code, out, _ = run(
        capsys, "plan", "--gpu", "none", "--ram", "16GiB", "--cores", "8", "--family", "llama3"
    )
    assert code == 0
    assert out.startswith("target   llama-3.1-8b-instruct Q4_K_M, on the CPU, context 8192")
    assert "\n- Target: Llama 3.1 8B Instruct Q4_K_M, on the CPU" in out
    assert (
        "\nTo get it: localspec pull llama-3.1-8b-instruct:Q4_K_M llama-3.2-1b-instruct:Q4_K_M"
        in out
    )


def test_plan_errors_are_one_line(home, capsys):
    assert_one_line_error(*run(capsys, "plan", "--family", "nope")[::2], "no family 'nope'")
    assert_one_line_error(*run(capsys, "plan", "--installed")[::2], "run `localspec pull default`")
    assert_one_line_error(
        *run(capsys, "plan", "--gpu", "none", "--ram", "1GiB")[::2], "nothing fits"
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--vram", "lots"], "'lots' is not a size"),
        (["--cores", "0"], "--cores: must be between 1"),
        (["--ctx", "8"], "--ctx: must be between 16"),
    ],
)
def test_plan_refuses_a_bad_machine_or_context(home, capsys, args, words):
    with pytest.raises(SystemExit) as e:
        main(["plan", *args])
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_models_lists_the_catalog_with_fit(home, capsys):
    code, out, _ = run(capsys, "models", "--json", "--vram", "8GiB", "--ram", "32GiB")
    data = json.loads(out)
    assert code == 0 and data["machine"].startswith("NVIDIA GPU (8.0 GiB free)")
    fits = {(r["id"], r["quant"]): r["fits"] for r in data["models"]}
    assert len({r["id"] for r in data["models"]}) == len(default_catalog().models)
    assert fits["qwen2.5-coder-1.5b-instruct", "Q4_K_M"] == "GPU"
    assert fits["qwen2.5-coder-14b-instruct", "Q4_K_M"] == "GPU+CPU"
    assert fits["llama-3.3-70b-instruct", "Q8_0"] == "no"
    assert all(r["installed"] is None for r in data["models"])


def test_models_table(home, capsys):
    code, out, _ = run(capsys, "models", "--gpu", "none", "--ram", "16GiB", "--family", "qwen3")
    assert code == 0
    assert "\nQwen3\n" in out and "qwen3-32b" in out and "llama" not in out
    assert " CPU\n" in out and " no\n" in out  # 32B needs more than 16 GiB


def test_add_registers_a_local_file(home, tmp_path, capsys):
    path = make_gguf(tmp_path / "my-Coder-Q4_K_M.gguf", name="My Qwen2.5 Coder 7B Instruct")
    code, out, _ = run(capsys, "add", str(path), "--id", "my-coder", "--role", "target")
    assert code == 0
    assert out.startswith("added my-coder: My Qwen2.5 Coder 7B Instruct, Q4_K_M, 3 layers")
    assert "family: Qwen2.5-Coder; drafts that pair with it: qwen2.5-coder-0.5b-instruct" in out
    assert resolve_installed("my-coder") == path
    code, out, _ = run(capsys, "models", "--installed", "--json")
    [row] = json.loads(out)["models"]
    assert (row["id"], row["installed"], row["family"]) == ("my-coder", "local", "qwen2.5-coder")


def test_add_defaults_and_errors(home, tmp_path, capsys):
    path = make_gguf(tmp_path / "Odd-Model.gguf", arch="mamba", vocab=500)
    code, out, _ = run(capsys, "add", str(path))
    assert code == 0 and out.startswith("added odd-model:") and "as a draft" in out
    assert "matches no catalog family" in out
    assert_one_line_error(
        *run(capsys, "add", str(tmp_path / "nope.gguf"))[::2], "model file not found"
    )
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    assert_one_line_error(*run(capsys, "add", str(text))[::2], "not a GGUF model file")
    assert_one_line_error(
        *run(capsys, "add", str(path), "--id", "qwen3-8b")[::2], "is a catalog id"
    )
    assert_one_line_error(*run(capsys, "add", str(path), "--id", "Bad Id")[::2], "--id")


def test_add_a_gemma4_assistant_says_what_it_drafts_for(home, tmp_path, capsys):
    path = make_gguf(tmp_path / "mtp-gemma-4-12b-it.gguf", arch="gemma4-assistant")
    code, out, _ = run(capsys, "add", str(path))
    assert code == 0 and "as a draft" in out
    assert "a Gemma 4 assistant: it drafts beside the Gemma 4 target it was made for" in out
    assert "--draft mtp-gemma-4-12b-it)" in out
    refused = run(capsys, "add", str(path), "--id", "as-target", "--role", "target")
    assert_one_line_error(*refused[::2], "a drafter, not a target")


def test_add_a_split_gguf_needs_every_part(home, tmp_path, capsys):
    first = tmp_path / "big-00001-of-00002.gguf"
    make_gguf(first)
    assert_one_line_error(*run(capsys, "add", str(first))[::2], "missing big-00002-of-00002.gguf")


def test_pull_errors_are_one_line(home, capsys):
    assert_one_line_error(
        *run(capsys, "pull", "qwen2.5-coder-7b-instrct")[::2],
        "did you mean qwen2.5-coder-7b-instruct",
    )
    assert_one_line_error(
        *run(capsys, "pull", "qwen3-8b", "--source", "mirror")[::2],
        "qwen3-8b:Q4_K_M has no mirror; try --source auto",
    )
    assert_one_line_error(
        *run(capsys, "pull", "qwen3-8b")[::2],
        "offline mode (HF_HUB_OFFLINE is set) (and it has no mirror)",
    )


def test_pull_best_resolves_to_the_plan():
    catalog = default_catalog()
    got = resolve_pull(
        "best", None, catalog, planned=lambda: [("qwen3-8b", "Q5_K_M"), ("qwen3-0.6b", "Q4_K_M")]
    )
    assert [(m.id, q.name) for m, q in got] == [("qwen3-8b", "Q5_K_M"), ("qwen3-0.6b", "Q4_K_M")]
    for quant, spec in ((None, "best:Q8_0"), ("Q8_0", "best")):  # the plan picks them
        with pytest.raises(DownloadError, match="'best' pulls the quantizations the plan"):
            resolve_pull(spec, quant, catalog, planned=lambda: [])
    pair = resolve_pull("coder-7b", "q8_0", catalog)
    assert [(m.id, q.name) for m, q in pair] == [
        ("qwen2.5-coder-7b-instruct", "Q8_0"),
        ("qwen2.5-coder-0.5b-instruct", "Q8_0"),
    ]


def test_run_without_models_says_to_pull(home):
    env = {**os.environ}
    r = subprocess.run(
        [sys.executable, "-m", "localspec", "run", "hi"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1
    assert r.stderr == "localspec: no model is installed: run `localspec pull default`\n"


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit):
        main(["pull", "--help"])
    out = capsys.readouterr().out
    assert "--source {auto,hub,mirror}" in out and "hf://owner/repo/file.gguf" in out


def test_version_names_localspec_and_llama_cpp_python(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    llama = version("llama-cpp-python")
    assert out == f"localspec {version('localspec')} (llama-cpp-python {llama})\n"
