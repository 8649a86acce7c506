"""`--no-repack` (LoadOptions.repack False) on the real target: llama.cpp loads its
weights as the file lays them out, not repacked for its CPU kernels, so a prompt's
logits come from other kernels: the same to within those kernels' noise, and not to
the last bit (the option reached llama.cpp)."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.backends.quantize import repacks_q4_0
from localspec.backends.seq_layout import Part
from localspec.cli import build_parser
from localspec.cli.options import session_config

pytestmark = pytest.mark.real

TEXT = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
# logits: other kernels quantize the activations otherwise (mean ~0.05, the odd logit
# of 151,936 ~0.5); another model, or a stray cache entry, moves them by whole logits
NOISE, MEAN_NOISE = 1.0, 0.1


def logits(path: str, repack: bool) -> np.ndarray:
    model = LlamaModel(path, LoadOptions(n_ctx=256, n_threads=2, repack=repack))
    try:
        tokens = model.tokenize(TEXT)
        (rows,) = model.decode_parts([Part(0, tokens, 0, 8)])
        return rows.copy()  # a view of llama.cpp's buffer, freed with the model
    finally:
        model.close()


def test_the_target_as_laid_out_gives_its_logits_through_other_kernels(real_paths):
    repacked, laid_out = (logits(str(real_paths[0]), r) for r in (True, False))
    # llama.cpp repacks Q4_K on x86 with AVX2 (on ARM for some cores only: not asked there)
    if repacks_q4_0() and platform.machine().lower() in ("x86_64", "amd64"):
        assert not np.array_equal(repacked, laid_out)  # not the same kernels
    apart = np.abs(repacked - laid_out)
    assert apart.max() < NOISE and apart.mean() < MEAN_NOISE, (apart.max(), apart.mean())
    assert (repacked.argmax(axis=1) == laid_out.argmax(axis=1)).all()


def test_the_option_reaches_the_targets_load_only(real_paths):
    args = ["serve", "-t", str(real_paths[0]), "-d", str(real_paths[1]), "--ctx", "512"]
    parse = build_parser().parse_args
    assert session_config(parse(args)).target_load.repack
    config = session_config(parse([*args, "--no-repack"]))
    assert not config.target_load.repack and config.draft_load.repack
