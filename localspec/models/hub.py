"""The Hugging Face hub as localspec uses it: its conventions, and one file fetched.

Hub files land in the Hugging Face cache layout (`blobs/<etag>`, `snapshots/<commit>/
<file>` linking to it, `refs/<revision>`), under `HF_HUB_CACHE` / `HF_HOME`, from
`HF_ENDPOINT`, and not at all with `HF_HUB_OFFLINE`, all read when a pull starts. The
transfer uses huggingface-hub's own metadata call and HTTP getter, but keeps the partial
file as `blobs/<etag>.incomplete` across runs (recent huggingface-hub discards it), so an
interrupted pull resumes with a Range request. A blob is renamed into place only after
its sha256 matched: the catalog's where it has one, else the hub's LFS sha256. Nothing
half-written or unverified ever carries a model's name.

A hub that cannot be reached (offline, refused, or silent: it is asked once, with a
deadline) raises HubUnreachable, and `download` goes on from the model's mirror.
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
from localspec.models.catalog import HubFile
from localspec.models.store import sha256_of

DEFAULT_HUB_TIMEOUT = 5.0  # seconds for the hub to answer before the mirror is used
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
                actual = sha256_of(partial)
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


def cached_file(hub: HubFile, cache: Path) -> Path | None:
    """Where an earlier pull (or `hf download`) left `hub`'s file in the cache, if it did;
    nothing is asked of the hub."""
    from huggingface_hub import try_to_load_from_cache

    if hub.is_glob:
        return None
    found = try_to_load_from_cache(hub.repo, hub.file, cache_dir=cache, revision=hub.revision)
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None
