"""The CPU draft: a Q4_0 copy of the draft model, made once with llama.cpp's quantize API."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localspec.backends import quantize
from localspec.backends.gguf import gguf_info
from localspec.backends.quantize import Q4_0, cpu_draft, cpu_draft_path, draft_to_load

pytestmark = pytest.mark.usefixtures("home")


@pytest.fixture
def repacking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantize, "repacks_q4_0", lambda: True)


def test_a_draft_on_the_gpu_or_kept_is_loaded_as_it_is(tmp_path: Path) -> None:
    source = tmp_path / "d.gguf"  # never opened: neither case looks at the file
    assert draft_to_load(source, on_gpu=True) == source
    assert draft_to_load(source, on_gpu=False, quant="keep") == source


def test_an_unknown_draft_quant_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(quantize.LocalspecError, match="--draft-quant must be"):
        draft_to_load(tmp_path / "d.gguf", on_gpu=False, quant="q2")


def test_without_repacked_kernels_the_draft_stays(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(quantize, "repacks_q4_0", lambda: False)
    source = tmp_path / "d.gguf"
    assert cpu_draft(source) == source


def test_copies_of_same_named_files_do_not_collide(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "d.gguf", tmp_path / "b" / "d.gguf"
    for p in (a, b):
        p.parent.mkdir()
        p.write_bytes(b"GGUF")
    assert cpu_draft_path(a) != cpu_draft_path(b)
    assert cpu_draft_path(a).name == "d.cpu-q4_0.gguf"


@pytest.mark.real
def test_a_failed_copy_falls_back_to_the_draft(real_paths, repacking, monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise quantize.QuantizeError("llama.cpp could not requantize it (1)")

    monkeypatch.setattr(quantize, "requantize", fail)
    said: list[str] = []
    draft = real_paths[1]
    assert cpu_draft(draft, said.append) == draft
    assert "as it is: llama.cpp could not requantize" in said[-1]
    assert not cpu_draft_path(draft).exists()


@pytest.mark.real
def test_the_real_draft_gets_a_q4_0_copy_made_once(real_paths, repacking) -> None:
    draft = real_paths[1]
    said: list[str] = []
    copy = cpu_draft(draft, said.append)
    assert copy == cpu_draft_path(draft) and copy.is_file()
    assert len(said) == 1 and "Q4_0 copy" in said[0]
    info, source = gguf_info(copy), gguf_info(draft)
    assert info.file_type == Q4_0 and source.file_type != Q4_0
    # all of it Q4_0 (18 bytes per 32 weights), the output head included
    q4_table = source.vocab * source.embedding // 32 * 18
    assert info.output_bytes in (0, q4_table) and source.output_bytes not in (0, q4_table)
    assert 0 <= info.embd_bytes - q4_table < 64 << 10  # the table, and a few norms
    assert info.layers == source.layers and info.vocab == source.vocab
    assert not [p for p in copy.parent.iterdir() if p.name.endswith(".tmp")]

    made = copy.stat().st_mtime_ns
    assert cpu_draft(draft, said.append) == copy  # the second time: the same file
    assert copy.stat().st_mtime_ns == made and len(said) == 1
    assert cpu_draft(copy) == copy  # a Q4_0 file is not copied again

    os.utime(copy, ns=(made, draft.stat().st_mtime_ns - 1))  # older than its source
    assert cpu_draft(draft, said.append) == copy
    assert len(said) == 2  # made again


@pytest.mark.real
def test_a_draft_that_cannot_pair_is_not_copied(real_paths, gemma_path, repacking) -> None:
    said: list[str] = []
    target, draft = real_paths
    assert draft_to_load(gemma_path, on_gpu=False, say=said.append, target=target) == gemma_path
    assert not said and not cpu_draft_path(gemma_path).exists()
    assert cpu_draft(draft, said.append, target=target) == cpu_draft_path(draft)  # pairs
