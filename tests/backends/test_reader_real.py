"""The prompt reader (reader.py) on the real target: a long pass of one sequence is read
by a second, not repacked load, and the repacked model decodes on from the cache it hands
back, to within the two kernels' noise of reading it itself; a cache the main context
changed since is taken in again, never read on from a stale copy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import llama_cpp as ll
import numpy as np
import pytest

from localspec.backends import ram, reader
from localspec.backends.gguf import gguf_info
from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.backends.quantize import repacks_q4_0
from localspec.backends.seq_layout import Part
from localspec.cli import build_parser
from localspec.cli.options import session_config

pytestmark = pytest.mark.real

# as in test_repack_real: other kernels move the odd logit by ~0.5, a stray or missing
# cache entry by whole logits
NOISE, MEAN_NOISE = 1.5, 0.1
TEXT = Path(reader.__file__).read_text()


@pytest.fixture(scope="module")
def pair(real_paths):
    """The target without a reader and with one, two slots each."""
    options = LoadOptions(n_ctx=1024, n_threads=2, n_seq=2)
    models = [LlamaModel(real_paths[0], options)]
    models.append(
        LlamaModel(real_paths[0], LoadOptions(**{**vars(options), "prompt_reader": True}))
    )
    yield models
    for model in models:
        model.close()


def reading(pair: list[LlamaModel]) -> list[LlamaModel]:
    """The pair, where the second has a reader (x86: asked above); else skipped, as a CPU
    whose weights llama.cpp does not repack has nothing to read around."""
    if pair[1].reader is None and not (reader.reads_faster_plain() and repacks_q4_0()):
        pytest.skip("llama.cpp repacks nothing on this CPU, or it is not x86: no reader")
    assert pair[1].reader is not None
    return pair


def next_logits(model: LlamaModel, seq: int, tokens: list[int], pos: int) -> np.ndarray:
    """A round of four tokens decoded by the repacked model (below READ_MIN)."""
    (rows,) = model.decode_parts([Part(seq, tokens[pos : pos + 4], pos, 4)])
    return rows.copy()


def start(pair: list[LlamaModel], part: Part) -> None:
    """Both models' slots emptied, then `part` read by each."""
    for model in pair:
        for seq in (0, 1):
            model.remove_from(seq, 0)
        model.decode_parts([part])


def assert_near(a: np.ndarray, b: np.ndarray) -> None:
    apart = np.abs(a - b)
    assert apart.max() < NOISE and apart.mean() < MEAN_NOISE, (apart.max(), apart.mean())


def test_the_reader_is_there_where_weights_were_repacked(pair):
    plain, read = pair
    assert plain.reader is None
    if reader.reads_faster_plain() and repacks_q4_0():  # x86 with AVX2: Q4_K repacked
        assert read.reader is not None and read.reader.extra_bytes > 500 * 2**20


def test_a_long_read_goes_through_the_reader_and_decoding_follows_on(pair):
    plain, read = reading(pair)
    tokens = plain.tokenize(TEXT)[:400]
    start(pair, Part(1, tokens[:300], 0, 1))  # slot 1: one long pass
    assert read.reader.reads == 1 and read.reader.holds == read._at(1)
    assert read.seq_len(1) == 300 and read.seq_len(0) == 0
    assert_near(next_logits(plain, 1, tokens, 300), next_logits(read, 1, tokens, 300))
    reads = read.reader.reads
    read.decode_parts([Part(1, tokens[304:330], 304, 1)])  # short: the repacked model's
    assert read.reader.reads == reads and read.reader.holds is None


def test_a_prompts_chunk_beside_another_slots_round_is_read_by_the_reader(pair):
    plain, read = reading(pair)
    tokens = plain.tokenize(TEXT)[:400]
    start(pair, Part(0, tokens[:40], 0, 1))  # slot 0 has a conversation
    reads = read.reader.reads
    rows = {}
    for model in pair:  # slot 0's round of 3 beside slot 1's prompt chunk of 120
        parts = [Part(0, tokens[40:43], 40, 3), Part(1, tokens[100:220], 0, 1)]
        rows[id(model)] = model.decode_parts(parts)
    assert read.reader.reads == reads + 1 and read.reader.holds == read._at(1)
    for a, b in zip(rows[id(plain)], rows[id(read)], strict=True):
        assert a.shape == b.shape
        assert_near(a, b)
    assert read.seq_len(0) == 43 and read.seq_len(1) == 120
    assert_near(next_logits(plain, 1, tokens[100:], 120), next_logits(read, 1, tokens[100:], 120))
    assert_near(next_logits(plain, 0, tokens, 43), next_logits(read, 0, tokens, 43))


def test_a_cache_changed_since_is_taken_in_again(pair):
    plain, read = reading(pair)
    tokens = plain.tokenize(TEXT)[:500]
    rewritten = tokens[:150] + tokens[250:404]  # the turn from token 150 on, another text
    reads = read.reader.reads
    for model in pair:
        model.remove_from(0, 0)
        model.decode_parts([Part(0, tokens[:250], 0, 1)])
        model.remove_from(0, 150)  # the reader's copy holds the old text from there
        model.decode_parts([Part(0, rewritten[150:300], 150, 1)])
        assert model.seq_len(0) == 300
    assert read.reader.reads == reads + 2
    assert_near(next_logits(plain, 0, rewritten, 300), next_logits(read, 0, rewritten, 300))


def test_the_option_reaches_the_targets_load_only(real_paths):
    args = ["serve", "-t", str(real_paths[0]), "-d", str(real_paths[1]), "--ctx", "512"]
    parse = build_parser().parse_args
    config = session_config(parse(args))
    assert config.target_load.prompt_reader and not config.draft_load.prompt_reader
    assert not session_config(parse([*args, "--no-prompt-reader"])).target_load.prompt_reader
    laid_out = session_config(parse([*args, "--no-repack"])).target_load
    model = LlamaModel(real_paths[0], laid_out)  # nothing repacked: nothing to read around
    try:
        assert laid_out.prompt_reader and model.reader is None
    finally:
        model.close()


@pytest.fixture(scope="module")
def shared(real_paths):
    """As `pair`, the two slots in one cache of 2 x 352 cells."""
    options = LoadOptions(n_ctx=352, n_threads=2, n_seq=2, kv_unified=True)
    models = [LlamaModel(real_paths[0], replace(options, prompt_reader=r)) for r in (False, True)]
    yield models
    for model in models:
        model.close()


def test_in_one_cache_the_state_goes_back_by_way_of_a_spare_sequence(shared):
    plain, read = reading(shared)
    tokens = plain.tokenize(TEXT)[:200]
    for model in shared:
        model.remove_from(0, 0)
        model.decode_parts([Part(0, tokens[:150], 0, 1)])
    assert read.layout.where == [2, 1]  # slot 0's cache now in the spare; 0 is spare
    assert read.seq_len(0) == 150 and read.seq_len(1) == 0
    assert_near(next_logits(plain, 0, tokens, 150), next_logits(read, 0, tokens, 150))


def test_where_one_cache_has_no_block_for_the_state_the_pass_is_read_there(shared, monkeypatch):
    """llama.cpp reads a state back into contiguous cells only; a shared cache whose
    free cells are scattered has none (where they lie is llama.cpp's to choose: the
    refusal is its answer, `_set_state` False, made here): the pass is read by the
    repacked model, the slot's cache kept as it was."""
    plain, read = reading(shared)
    tokens = plain.tokenize(TEXT)[:400]
    for model in shared:
        model.remove_from(0, 0)
        model.decode_parts([Part(0, tokens[:100], 0, 1)])
    where, reads, spare = list(read.layout.where), read.reader.reads, read._spare
    took = read._set_state
    monkeypatch.setattr(read, "_set_state", lambda at, state: at != spare and took(at, state))
    for model in shared:
        model.decode_parts([Part(0, tokens[100:180], 100, 1)])
    assert read.reader.reads == reads + 1 and read.layout.where == where  # tried, kept
    assert read.reader.holds is None and read.seq_len(0) == 180 and not read._has(spare)
    assert_near(next_logits(plain, 0, tokens, 180), next_logits(read, 0, tokens, 180))


def test_the_reader_is_sized_against_the_ram_the_slots_caches_left(real_paths, monkeypatch):
    """The slots' caches take their RAM when the context is made (GiBs for a 14B target
    at 8k tokens each): the reader is weighed after that, and where too little is left it
    stays out, its spare sequence too."""
    import psutil

    if not (reader.reads_faster_plain() and repacks_q4_0()):
        pytest.skip("llama.cpp repacks nothing on this CPU, or it is not x86: no reader")
    order: list[str] = []
    made, room = ll.llama_init_from_model, reader.has_room
    monkeypatch.setattr(ll, "llama_init_from_model", lambda *a: order.append("ctx") or made(*a))
    monkeypatch.setattr(reader, "has_room", lambda *a: order.append("room") or room(*a))
    options = LoadOptions(n_ctx=256, n_threads=2, n_seq=2, kv_unified=True, prompt_reader=True)
    model = LlamaModel(real_paths[0], options)
    try:
        assert order[:2] == ["ctx", "room"] and model.reader is not None
        assert model._spare == 2 and model.reader_left_out == 0
        size = model.reader.extra_bytes
    finally:
        model.close()
    short = psutil.virtual_memory()._replace(available=2**29)  # 512 MiB left
    monkeypatch.setattr(psutil, "virtual_memory", lambda: short)
    model = LlamaModel(real_paths[0], options)
    try:
        assert model.reader is None and model._spare is None
        assert model.reader_left_out == size  # serve's start line tells of it
        tokens = model.tokenize(TEXT)[:100]
        (rows,) = model.decode_parts([Part(1, tokens, 0, 1)])  # serves as it did
        assert model.seq_len(1) == 100 and rows.shape == (1, model.n_vocab)
    finally:
        model.close()


def test_the_file_pages_each_model_reads_count_as_taken(pair, real_paths):
    """llama.cpp reads a CPU model's weights in place from its file's pages, which the
    machine counts as available: each model holds them while loaded (`ram.hold`), the
    repacked tensors' only where a reader reads them again, so the reader's room and
    serve's kept prompts are weighed against RAM without them."""
    plain, read = reading(pair)
    size = real_paths[0].stat().st_size
    repacked = gguf_info(real_paths[0]).repacked_bytes or 0
    assert repacked > 0
    # the file less its header (and llama.cpp's rounding to MiB in its log)
    assert 0 <= size - repacked - ram.held(plain) < 0.01 * size
    assert 0 <= size - ram.held(read) - ram.held(read.reader) < 0.01 * size
    extra = LlamaModel(real_paths[0], LoadOptions(n_ctx=256, n_threads=2))
    before = ram.held()
    extra.close()
    assert before - ram.held() == ram.held(plain) and ram.held(extra) == 0


def test_the_planner_counts_the_tensors_llama_cpp_repacks(pair, real_paths):
    """What the planner reads from the file as repacked (gguf.REPACKED_TYPES: the RAM a
    reader's file pages take) is what llama.cpp's load log says it repacked."""
    reading(pair)
    counted = gguf_info(real_paths[0]).repacked_bytes
    assert counted and abs(counted / 2**20 - pair[1].repacked_mib) < 0.01
