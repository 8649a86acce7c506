"""scripts/make_tiny_gguf.py: tiny random qwen2 models that llama.cpp loads and runs.

The vocabulary comes from the real Qwen2.5-Coder 0.5B GGUF (tokenizer keys only), so
these are `real` tests: they need the model that scripts/setup.sh installs.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from localspec.backends.base import check_compatible
from localspec.decoding.drafters import Drafter, DraftModel, NgramDrafter, NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished, RoundEnd

pytestmark = pytest.mark.real

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_gguf.py"
VOCAB_SOURCE = "qwen2.5-coder-0.5b-instruct"
VOCAB_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def vocab_source() -> Path:
    """The real 0.5B model file (only its tokenizer.* keys are read)."""
    from localspec.paths import models_dir

    path = models_dir() / VOCAB_FILE
    if path.exists():
        return path
    from conftest import installed

    return installed(VOCAB_SOURCE)


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_tiny_gguf", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny target and draft with the real Qwen2 vocabulary (shallower than the
    script's defaults, to keep the test quick)."""
    import gguf

    make = load_script()
    vocab = gguf.GGUFReader(str(vocab_source()))
    out = tmp_path_factory.mktemp("tiny")
    target = make.build(replace(make.TARGET, n_layer=2), vocab, out / "target.gguf", seed=0)
    draft = make.build(replace(make.DRAFT, n_layer=1), vocab, out / "draft.gguf", seed=1)
    return target, draft


@pytest.fixture(scope="module")
def tiny_models(tiny_pair: tuple[Path, Path]):
    from localspec.backends.llama import LlamaModel, LoadOptions

    options = LoadOptions(n_ctx=512, n_threads=1)
    target, draft = (LlamaModel(p, options) for p in tiny_pair)
    yield target, draft
    target.close()
    draft.close()


def test_llama_cpp_loads_the_tiny_models(tiny_models) -> None:
    target, draft = tiny_models
    assert target.n_vocab == draft.n_vocab > 150_000  # the whole Qwen2 vocabulary
    assert target.vocab_kind == "bpe"
    assert target.metadata("general.architecture") == "qwen2"
    assert target.metadata("qwen2.block_count") == "2"
    assert target.size_bytes > draft.size_bytes
    check_compatible(target, draft)  # same tokenizer: they pair
    tokens = target.tokenize("def fib(n):")
    assert b"".join(target.token_bytes(t) for t in tokens) == b"def fib(n):"


@pytest.mark.parametrize("drafter", ["none", "draft", "ngram"])
def test_the_engine_generates_with_the_tiny_models(tiny_models, drafter: str) -> None:
    target, draft = tiny_models
    drafters: dict[str, tuple[Drafter, int]] = {
        "none": (NoDrafter(), 0),
        "draft": (DraftModel(draft, p_min=0.0), 4),
        "ngram": (NgramDrafter(), 4),
    }
    made, gamma = drafters[drafter]
    engine = Engine(target, made, gamma)
    events = list(engine.generate(target.tokenize("Hello, world"), GenerationConfig(16)))
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.stop_reason in ("max_tokens", "eog")
    assert len(finished.tokens) >= 1
    rounds = [e for e in events if isinstance(e, RoundEnd)]
    assert finished.stats.rounds == len(rounds) >= 1
    if drafter == "draft":
        assert finished.stats.drafted >= 4  # p_min 0: every round drafts
    assert finished.stats.llama_s > 0


def test_a_context_beyond_the_models_training_is_capped_and_said(tmp_path: Path) -> None:
    """llama.cpp would allocate any context asked for (a typo in --ctx could take all
    memory); localspec caps it at the model's training context and says so."""
    import gguf

    from localspec.backends.llama import LlamaModel, LoadOptions
    from localspec.session import SessionConfig, open_session

    make = load_script()
    vocab = gguf.GGUFReader(str(vocab_source()))
    path = make.build(replace(make.TARGET, n_layer=1, n_ctx=256), vocab, tmp_path / "t.gguf")
    for asked in (100_000, 0):  # 0: the training context
        model = LlamaModel(path, LoadOptions(n_ctx=asked, n_threads=1))
        assert model.n_ctx == 256
        model.close()
    said: list[str] = []
    session = open_session(
        SessionConfig(str(path), target_load=LoadOptions(n_ctx=100_000)), say=said.append
    )
    try:
        assert session.target.n_ctx == 256
        assert said == session.notes and "capped at 256" in said[0]
    finally:
        session.close()
