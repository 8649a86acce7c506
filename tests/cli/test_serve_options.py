"""`localspec serve`'s choices made before loading (fast): the slots' one cache only
where speculation can pay beside other slots."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.backends.llama import LoadOptions
from localspec.cli.serve import drafts_under_load
from localspec.session import SessionConfig


def sized(path: Path, size: int) -> str:
    with open(path, "wb") as f:  # sparse: only the size matters here
        f.truncate(size)
    return str(path)


def test_one_cache_for_the_slots_only_with_a_cheap_draft_on_a_cpu(tmp_path: Path):
    cpu = LoadOptions(n_gpu_layers=0)
    f16 = sized(tmp_path / "target-f16.gguf", 3_090_000_000)
    q4 = sized(tmp_path / "target-q4.gguf", 1_117_000_000)
    draft = sized(tmp_path / "draft.gguf", 491_000_000)
    assert drafts_under_load(SessionConfig(f16, draft, "auto", cpu, cpu))  # 0.16
    assert not drafts_under_load(SessionConfig(q4, draft, "auto", cpu, cpu))  # 0.44
    assert not drafts_under_load(SessionConfig(f16, "ngram", "auto", cpu, cpu))


def test_a_moe_target_is_sized_by_the_bytes_a_token_reads(tmp_path: Path, monkeypatch):
    """Beside a 17 GB 30B-A3B whose token reads a tenth of it, a 0.5B draft costs ~0.3 of
    a pass, not the 0.03 its file size says."""
    monkeypatch.setattr(
        "localspec.models.memory.read_share", lambda path: 0.1 if "a3b" in path.name else 1.0
    )
    cpu = LoadOptions(n_gpu_layers=0)
    moe = sized(tmp_path / "coder-30b-a3b.gguf", 17_000_000_000)
    draft = sized(tmp_path / "draft.gguf", 491_000_000)
    assert not drafts_under_load(SessionConfig(moe, draft, "auto", cpu, cpu))


def test_sampling_defaults_out_of_range_get_one_line(capsys):
    """`serve --temp 3` is refused before anything loads, in one line that says the range."""
    from localspec.cli import main

    for args, words in ((["--temp", "3"], "between 0 and 2"), (["--top-p", "x"], "not a number")):
        with pytest.raises(SystemExit) as exit_:
            main(["serve", *args])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert words in err and "Traceback" not in err
