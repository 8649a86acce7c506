"""scripts/make_tiny_gguf.py: tiny random qwen2 models that llama.cpp loads and runs.

The vocabulary comes from the real Qwen2.5-Coder 0.5B GGUF (tokenizer keys only), so
these are `real` tests: they need the model that scripts/setup.sh installs.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers import free_port, load_script, wait_healthy

from localspec.backends.base import check_compatible
from localspec.decoding.drafters import Drafter, DraftModel, NgramDrafter, NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished, Piece, RoundEnd

pytestmark = pytest.mark.real

VOCAB_SOURCE = "qwen2.5-coder-0.5b-instruct"
VOCAB_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def vocab_source() -> Path:
    """The real 0.5B model file (only its tokenizer.* keys are read)."""
    from localspec.paths import models_dir

    path = models_dir() / VOCAB_FILE
    if path.exists():
        return path
    from helpers import installed

    return installed(VOCAB_SOURCE)


@functools.cache
def vocab_reader():  # -> make_tiny_gguf.Vocab
    """The vocabulary file's tokenizer, read once for every test that builds a model."""
    return load_script("make_tiny_gguf").read_vocab(vocab_source())


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny target and draft with the real Qwen2 vocabulary (shallower than the
    script's defaults, to keep the test quick)."""

    make = load_script("make_tiny_gguf")
    vocab = vocab_reader()
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


def test_a_chat_template_given_replaces_the_ggufs(tiny_pair) -> None:
    """LoadOptions.chat_template (`--chat-template-file`): llama.cpp's model answers
    with it, and a session renders its prompts with it."""
    from localspec.backends.llama import LlamaModel, LoadOptions
    from localspec.backends.toy import TEMPLATE
    from localspec.decoding.adaptive import auto_engine
    from localspec.session import Session

    model = LlamaModel(tiny_pair[0], LoadOptions(n_ctx=512, n_threads=1, chat_template=TEMPLATE))
    try:
        assert model.chat_template() == TEMPLATE
        text = Session(auto_engine(model, None)).prompt_text([{"role": "user", "content": "hi"}])
        assert text == "<|user|>hi\n<|assistant|>"
    finally:
        model.close()


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

    from localspec.backends.llama import LlamaModel, LoadOptions
    from localspec.session import SessionConfig, open_session

    make = load_script("make_tiny_gguf")
    vocab = vocab_reader()
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


def test_serve_samples_as_the_gguf_recommends_and_caps_answers_as_told(tmp_path: Path):
    """`general.sampling.*` (llama.cpp's converter writes them from generation_config.json;
    llama-server reads them): the defaults of requests that set none, a flag over each;
    and `--max-tokens` caps an answer that asks no limit."""
    from localspec.backends.llama import LlamaModel, LoadOptions
    from localspec.server.defaults import SamplingDefaults

    make = load_script("make_tiny_gguf")
    keys = {"general.sampling.temp": 0.25, "general.sampling.top_k": 20}
    keys["general.sampling.top_p"] = 7.0  # out of range: not a recommendation
    path = make.build(
        replace(make.TARGET, n_layer=1), vocab_reader(), tmp_path / "t.gguf", metadata=keys
    )
    model = LlamaModel(path, LoadOptions(n_ctx=256, n_threads=1))
    try:
        own = SamplingDefaults.of_model(model.metadata)
    finally:
        model.close()
    assert own == SamplingDefaults(temperature=0.25, top_k=20)

    port = free_port()
    args = [
        sys.executable,
        "-m",
        "localspec",
        "serve",
        "--target",
        str(path),
        "--draft",
        "none",
        "--ctx",
        "256",
        "--threads",
        "1",
        "--port",
        str(port),
        "--top-k",
        "5",
        "--max-tokens",
        "3",
        "--reasoning",
        "off",
    ]
    server = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        said = [server.stderr.readline()]
        while said[-1] and "serving" not in said[-1]:  # up to its address, or its end
            said.append(server.stderr.readline())
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server, 120, lambda: "".join(said))
        request = {"prompt": "def", "temperature": 0}
        answer = httpx.post(f"{url}/v1/completions", json=request, timeout=60).json()
    finally:
        server.terminate()
        server.wait(timeout=30)
    line = "samples with temperature 0.25, top_k 5 (the model's GGUF recommends "
    line += "temperature 0.25, top_k 20)"
    assert line in "".join(said), said
    assert "does not think (its chat template has no reasoning): thinking off" in "".join(said)
    assert answer["usage"]["completion_tokens"] == 3, answer
    assert answer["choices"][0]["finish_reason"] == "length"


# --- vocabularies of different sizes (Qwen2.5 7B/32B over the 0.5B draft) --------------
QWEN_LARGE_VOCAB = 152_064  # Qwen2.5 7B and 32B
QWEN_SMALL_VOCAB = 151_936  # Qwen2.5 0.5B (the vocabulary file's own size)


@pytest.fixture(scope="module")
def unequal_models(tmp_path_factory: pytest.TempPathFactory):
    """A tiny target with 152,064 vocabulary entries and a tiny draft with 151,936."""

    from localspec.backends.llama import LlamaModel, LoadOptions

    make = load_script("make_tiny_gguf")
    vocab = vocab_reader()
    out = tmp_path_factory.mktemp("unequal")
    big = replace(make.TARGET, n_layer=1, n_vocab=QWEN_LARGE_VOCAB, embd_type="f16")
    small = replace(make.DRAFT, n_layer=1, n_vocab=QWEN_SMALL_VOCAB)
    paths = (make.build(big, vocab, out / "big.gguf"), make.build(small, vocab, out / "s.gguf"))
    options = LoadOptions(n_ctx=512, n_threads=1)
    target, draft = (LlamaModel(p, options) for p in paths)
    yield target, draft
    target.close()
    draft.close()


def test_the_tiny_models_have_the_asked_vocabulary_sizes(unequal_models) -> None:
    target, draft = unequal_models
    assert (target.n_vocab, draft.n_vocab) == (QWEN_LARGE_VOCAB, QWEN_SMALL_VOCAB)
    assert target.token_text(QWEN_LARGE_VOCAB - 1) == f"[PAD{QWEN_LARGE_VOCAB - 1}]"
    check_compatible(target, draft)  # 128 apart: llama.cpp pairs them


def test_sampling_with_unequal_vocabularies_runs_through_llama_cpp(unequal_models) -> None:
    """Before: `p - q` did not broadcast (152,064 vs 151,936) at the first rejection."""
    from localspec.decoding.sampling import SamplingParams

    target, draft = unequal_models
    engine = Engine(target, DraftModel(draft, p_min=0.0), 4)
    prompt = target.tokenize("def fib(n):")
    rejected = 0
    for seed in range(3):
        sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        done = list(engine.generate(prompt, GenerationConfig(24, sampling=sampling)))[-1]
        assert isinstance(done, Finished) and done.tokens
        rejected += done.stats.drafted - done.stats.accepted
    assert rejected > 0  # the residual p - q was drawn from


def test_greedy_with_unequal_vocabularies_is_plain_decoding(unequal_models) -> None:
    target, draft = unequal_models
    prompt = target.tokenize("Hello, world")
    config = GenerationConfig(24, trace=True)
    plain_events = list(Engine(target, NoDrafter(), 0).generate(prompt, config))
    plain = plain_events[-1]
    spec = list(Engine(target, DraftModel(draft, p_min=0.0), 4).generate(prompt, config))[-1]
    assert isinstance(plain, Finished) and isinstance(spec, Finished)
    pieces = [e for e in plain_events if isinstance(e, Piece)]
    for i, (got, want) in enumerate(zip(spec.tokens, plain.tokens, strict=False)):
        if got != want:  # only at a numerical near-tie (see test_real_engine.py)
            assert pieces[i].margin is not None and pieces[i].margin < 1.0
            assert got == pieces[i].runner_up
            return
    assert spec.tokens == plain.tokens


def test_a_target_token_the_draft_lacks_is_read_as_one_it_has(unequal_models) -> None:
    """llama.cpp refuses a token past the model's vocabulary; the draft model reads the
    target's extra padding entries as its own last one."""
    from localspec.decoding.sampling import SamplingParams

    target, draft = unequal_models
    drafter = DraftModel(draft, p_min=0.0)
    context = [*target.tokenize("def fib(n):"), QWEN_LARGE_VOCAB - 1]
    out = drafter.draft(context, 2, SamplingParams(), np.random.default_rng(0))
    assert len(out.tokens) == 2
    assert draft.cached[len(context) - 1] == QWEN_SMALL_VOCAB - 1


def test_a_draft_token_past_the_targets_vocabulary_is_refused(unequal_models) -> None:
    """The other way round (a draft with the larger vocabulary): the target never reads
    the token, which llama.cpp would refuse, and rejects it."""
    from localspec.decoding.drafters import Draft
    from localspec.decoding.sampling import SamplingParams

    small_target = unequal_models[1]  # the draft, 151,936 entries, as a target
    proposal = QWEN_SMALL_VOCAB + 5

    class PaddingDrafter(NoDrafter):
        def draft(self, context, gamma, params, rng, *, forced=0, grammar=None):  # type: ignore[override]
            q = np.zeros(QWEN_LARGE_VOCAB)
            q[proposal] = 1.0
            return Draft([proposal], [None if params.greedy else q])

    prompt = small_target.tokenize("Hello")
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, seed=3)):
        config = GenerationConfig(8, sampling=sampling)
        plain = list(Engine(small_target, NoDrafter(), 0).generate(prompt, config))[-1]
        done = list(Engine(small_target, PaddingDrafter(), 1).generate(prompt, config))[-1]
        assert done.stats.drafted > 0 and done.stats.accepted == 0
        if sampling.greedy:
            assert done.tokens == plain.tokens


# --- a recurrent model (Mamba): its cache cannot drop a suffix -----------------------
@pytest.fixture(scope="module")
def mamba_path(tmp_path_factory: pytest.TempPathFactory) -> Path:

    make = load_script("make_tiny_gguf")
    vocab = vocab_reader()
    return make.build(make.MAMBA, vocab, tmp_path_factory.mktemp("mamba") / "mamba.gguf")


def test_a_mamba_cache_cannot_be_cut_and_restarts_instead(mamba_path: Path) -> None:
    import llama_cpp as ll

    from localspec.backends.llama import LlamaModel, LoadOptions

    options = LoadOptions(n_ctx=256, n_threads=1)
    model, fresh = LlamaModel(mamba_path, options), LlamaModel(mamba_path, options)
    try:
        assert not model.can_cut
        first, second = model.tokenize("Hello world, one"), model.tokenize("Hello world, two")
        model.evaluate(first, 1)
        assert not ll.llama_memory_seq_rm(model._mem, 0, 2, -1)  # what llama.cpp says
        got = model.evaluate(second, 1).copy()
        assert model.restarts == 1 and model.kv_len() == len(model.cached) == len(second)
        assert np.allclose(got, fresh.evaluate(second, 1), atol=1e-3)
    finally:
        model.close()
        fresh.close()


def test_a_mamba_target_decodes_plainly_and_the_session_says_why(mamba_path: Path) -> None:
    from localspec.backends.llama import LoadOptions
    from localspec.session import SessionConfig, open_session

    said: list[str] = []
    load = LoadOptions(n_ctx=256, n_threads=1)
    config = SessionConfig(str(mamba_path), draft="ngram", gamma=4, target_load=load)
    session = open_session(config, say=said.append)
    try:
        assert said == [
            "plain decoding: mamba is a recurrent or hybrid model, whose cache cannot drop "
            "a rejected draft"
        ]
        prompt = session.target.tokenize("one two one two one two")
        done = list(session.engine.generate(prompt, GenerationConfig(16)))[-1]
        session.target.reset()
        plain = list(Engine(session.target, NoDrafter(), 0).generate(prompt, GenerationConfig(16)))
        assert done.tokens == plain[-1].tokens and done.stats.drafted == 0
    finally:
        session.close()
