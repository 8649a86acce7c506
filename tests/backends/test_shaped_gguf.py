"""scripts/gpu_profile.py's random twins: the tensors of the real Q4_K_M files, so a pass
costs what the real file's costs (docs/gpu.md). Checked against the real pair that
scripts/setup.sh installs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import DRAFT_ID, TARGET_ID, installed, load_script
from test_tiny_gguf import vocab_reader

from localspec.backends.gguf import tensor_shapes

pytestmark = pytest.mark.real


Table = dict[str, tuple[tuple[int, ...], str]]  # a tensor's dimensions and type


def kinds(table: Table) -> Counter:
    """How many tensors of each kind (the name without its layer) have each type."""
    return Counter((name.split(".")[-2], kind) for name, (_, kind) in table.items())


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The real pair's random twins, written once (1.6 GB, removed after), both with the
    vocabulary they share, read once (as the script takes one --vocab for both)."""
    profile, out = load_script("gpu_profile"), tmp_path_factory.mktemp("twins")
    made = {
        m: profile.write_shaped(m, vocab_reader(), out / f"{m}.gguf") for m in (DRAFT_ID, TARGET_ID)
    }
    yield made
    for path in made.values():
        path.unlink()


@pytest.mark.parametrize("model_id", [DRAFT_ID, TARGET_ID])
def test_a_random_twin_has_the_real_files_tensors_and_size(
    model_id: str, twins: dict[str, Path]
) -> None:
    real, twin = installed(model_id), twins[model_id]
    ours, theirs = tensor_shapes(twin), tensor_shapes(real)
    assert {n: s for n, (s, _) in ours.items()} == {n: s for n, (s, _) in theirs.items()}
    # llama.cpp's Q4_K_M rule puts Q6_K in as many layers as the published file does
    # (which layers differs: the files were made by an older llama.cpp)
    assert kinds(ours) == kinds(theirs)
    assert abs(twin.stat().st_size - real.stat().st_size) < 8192


def test_llama_cpp_runs_a_random_twin(twins: dict[str, Path]) -> None:
    from localspec.backends.llama import LlamaModel, LoadOptions

    model = LlamaModel(twins[DRAFT_ID], LoadOptions(n_ctx=256, n_threads=2))
    try:
        logits = model.evaluate(model.tokenize("def add(a, b):"), 2)
        assert logits.shape == (2, model.n_vocab) and np.isfinite(logits).all()
    finally:
        model.close()
