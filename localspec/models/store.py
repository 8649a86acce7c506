"""What is installed: a record for each verified model file, and the sha256 checks.

A model counts as installed when a record under `$LOCALSPEC_HOME/installed/` names its
files; the record is written only after every file has been checked against its sha256,
and keeps each file's size and mtime so later runs trust it without re-hashing gigabytes.
Files themselves live where they were fetched: the Hugging Face cache for the hub, and
`$LOCALSPEC_HOME/models/` for mirrors. `localspec add` records a local file the same way.

The store knows nothing of the catalog: which record a spec means is `resolve`'s to say.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localspec.backends.gguf import GgufInfo
from localspec.errors import LocalspecError
from localspec.paths import home, models_dir, write_atomic

_HASH_BLOCK = 8 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


class StoreError(LocalspecError):
    """A model file that is not what its record or the catalog says."""


@dataclass(frozen=True)
class FileRecord:
    path: str
    size: int
    mtime_ns: int
    sha256: str

    @classmethod
    def of(cls, path: Path, sha256: str) -> FileRecord:
        st = path.stat()
        return cls(str(path), st.st_size, st.st_mtime_ns, sha256)

    def intact(self) -> bool:
        """Still the verified file: same size and modification time (no re-hash)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return st.st_size == self.size and st.st_mtime_ns == self.mtime_ns


@dataclass(frozen=True)
class Installed:
    """A verified model: catalog id (or the id `add` gave it), quantization, files."""

    model: str
    quant: str
    source: str  # "hub" | "mirror" | "local"
    files: tuple[FileRecord, ...]
    info: GgufInfo | None = None
    family: str | None = None  # for local files: the catalog family their header matches
    role: str = "target"

    @property
    def path(self) -> Path:
        """The file to load (the first shard of a split GGUF)."""
        return Path(self.files[0].path)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def intact(self) -> bool:
        return all(f.intact() for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Installed:
        info = data.get("info")
        return cls(
            model=data["model"],
            quant=data["quant"],
            source=data["source"],
            files=tuple(FileRecord(**f) for f in data["files"]),
            info=_info(info) if info else None,
            family=data.get("family"),
            role=data.get("role", "target"),
        )


# --- records -------------------------------------------------------------------------


def records_dir() -> Path:
    return home() / "installed"


def _record_path(model: str, quant: str) -> Path:
    return records_dir() / f"{model}@{quant}.json"


def record(entry: Installed) -> Installed:
    """Write a verified model's record (atomically: a crash leaves the old one or none)."""
    write_atomic(_record_path(entry.model, entry.quant), json.dumps(entry.to_json(), indent=1))
    return entry


def forget(model: str, quant: str) -> None:
    _record_path(model, quant).unlink(missing_ok=True)


def all_installed(intact_only: bool = True) -> list[Installed]:
    """Every recorded model whose files are still the verified ones."""
    found = []
    for path in sorted(records_dir().glob("*.json")):
        try:
            entry = Installed.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged record is as good as none: pull re-verifies
        if not intact_only or entry.intact():
            found.append(entry)
    return found


def installed_quants(model: str, quant: str | None = None) -> list[Installed]:
    """The intact records of `model` (of one quantization, if named)."""
    return [e for e in all_installed() if e.model == model and quant in (None, e.quant)]


def local_ids() -> list[str]:
    return sorted({e.model for e in all_installed() if e.source == "local"})


def mirror_path(file_name: str) -> Path:
    """Where a file fetched from a mirror is kept."""
    return models_dir() / file_name


# --- hashing -------------------------------------------------------------------------


def is_sha256(text: str) -> bool:
    """Whether `text` reads as a sha256 (an LFS file's ETag, a blob's name in the cache)."""
    return bool(_SHA256.fullmatch(text))


def sha256_of(path: Path, progress: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
            if progress:
                progress(len(block))
    return digest.hexdigest()


def check_sha256(path: Path, sha256: str) -> FileRecord:
    """Hash `path`; a record of it if it matches, StoreError otherwise."""
    actual = sha256_of(path)
    if actual != sha256:
        raise StoreError(f"{path.name}: sha256 mismatch (got {actual[:12]}…, want {sha256[:12]}…)")
    return FileRecord.of(path, sha256)


def _info(data: dict) -> GgufInfo:
    """A stored GgufInfo (JSON lists back to tuples; fields added since default)."""
    tuples = {k: tuple(data[k]) for k in ("layer_bytes", "expert_bytes") if k in data}
    return GgufInfo(**{**data, **tuples})
