"""What is installed: verified-model records, and what a GGUF file's header says.

A model counts as installed when a record under `$LOCALSPEC_HOME/installed/` names its
files; the record is written only after every file has been checked against its sha256,
and keeps each file's size and mtime so later runs trust it without re-hashing gigabytes.
Files themselves live where they were fetched: the Hugging Face cache for the hub, and
`$LOCALSPEC_HOME/models/` for mirrors. `localspec add` records a local file the same way.

The GGUF header is parsed here rather than with gguf.GGUFReader, which decodes every
vocabulary entry into numpy objects (~20 s for a Qwen file); the planner needs only the
shape keys and each tensor's size, which a streaming read gets in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from localspec.errors import LocalspecError
from localspec.paths import home, models_dir, write_atomic

_HASH_BLOCK = 8 << 20


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
class GgufInfo:
    """The GGUF facts the planner and `add` need."""

    architecture: str
    name: str
    file_type: int | None
    layers: int
    kv_heads: int
    head_dim: int
    embedding: int
    vocab: int
    context: int
    tokenizer: str  # tokenizer.ggml.model / tokenizer.ggml.pre
    layer_bytes: tuple[int, ...]  # weight bytes of each repeating layer (blk.N.*)
    embd_bytes: int  # token embeddings and the small tensors outside the layers
    output_bytes: int  # the output head; 0 when it reuses the token embeddings
    split_count: int = 1

    @property
    def total_bytes(self) -> int:
        return sum(self.layer_bytes) + self.embd_bytes + self.output_bytes

    @property
    def quant(self) -> str:
        """The file type as a quantization name ("Q4_K_M"), or "unknown"."""
        from gguf.constants import LlamaFileType

        if self.file_type is None:
            return "unknown"
        try:
            return LlamaFileType(self.file_type).name.removeprefix("MOSTLY_").replace("ALL_", "")
        except ValueError:
            return "unknown"


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
            info=GgufInfo(**{**info, "layer_bytes": tuple(info["layer_bytes"])}) if info else None,
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


def find_installed(model: str, quant: str | None = None) -> Installed | None:
    """The installed entry for a model: the named quantization, else the one a plan
    would pick first (Q4_K_M, then the others from small to large)."""
    from localspec.models.catalog import QUANT_ORDER

    entries = [e for e in all_installed() if e.model == model and quant in (None, e.quant)]
    if not entries:
        return None
    order = {q: i for i, q in enumerate(QUANT_ORDER)}
    return min(entries, key=lambda e: order.get(e.quant, len(order)))


def local_ids() -> list[str]:
    return sorted({e.model for e in all_installed() if e.source == "local"})


def mirror_path(file_name: str) -> Path:
    """Where a file fetched from a mirror is kept."""
    return models_dir() / file_name


# --- hashing -------------------------------------------------------------------------


def sha256_of(path: Path, progress: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
            if progress:
                progress(len(block))
    return digest.hexdigest()


def verify(path: Path, sha256: str) -> FileRecord:
    """Hash `path`; a record of it if it matches, StoreError otherwise."""
    actual = sha256_of(path)
    if actual != sha256:
        raise StoreError(f"{path.name}: sha256 mismatch (got {actual[:12]}…, want {sha256[:12]}…)")
    return FileRecord.of(path, sha256)


# --- GGUF headers --------------------------------------------------------------------

_GGUF_MAGIC = b"GGUF"
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_ARRAY_KEEP = 64  # keep small arrays (per-layer head counts); count the big ones only


@dataclass
class _Header:
    kv: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, int] = field(default_factory=dict)  # name -> bytes


def gguf_info(paths: Path | Iterable[Path]) -> GgufInfo:
    """Shape and per-layer weight bytes from a GGUF file (all shards of a split one)."""
    shards = [paths] if isinstance(paths, Path) else list(paths)
    headers = [_read_header(p) for p in shards]
    kv = headers[0].kv
    tensors: dict[str, int] = {}
    for h in headers:
        tensors.update(h.tensors)
    arch = str(kv.get("general.architecture", "unknown"))

    def key(name: str, default: Any = 0) -> Any:
        value = kv.get(f"{arch}.{name}", default)
        return max(value) if isinstance(value, list) and value else value

    layers = int(key("block_count"))
    embedding = int(key("embedding_length"))
    heads = int(key("attention.head_count", 1)) or 1
    per_layer = [0] * layers
    embd = output = 0
    for name, size in tensors.items():
        if m := re.match(r"blk\.(\d+)\.", name):
            index = int(m.group(1))
            if index < layers:
                per_layer[index] += size
                continue
        if name.startswith("output."):
            output += size
        else:
            embd += size
    tokens = kv.get("tokenizer.ggml.tokens")
    vocab = tokens if isinstance(tokens, int) else len(tokens or ())
    return GgufInfo(
        architecture=arch,
        name=str(kv.get("general.name", shards[0].stem)),
        file_type=kv.get("general.file_type"),
        layers=layers,
        kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(key("attention.key_length", embedding // heads)),
        embedding=embedding,
        vocab=int(vocab),
        context=int(key("context_length")),
        tokenizer=f"{kv.get('tokenizer.ggml.model', '?')}/{kv.get('tokenizer.ggml.pre', '?')}",
        layer_bytes=tuple(per_layer),
        # norms and such are tiny; the output norm rides with the embeddings
        embd_bytes=embd,
        output_bytes=output if "output.weight" in tensors else 0,
        split_count=int(kv.get("split.count", 1)),
    )


def _read_header(path: Path) -> _Header:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with open(path, "rb") as raw:
            f = _Buffered(raw)
            if f.read(4) != _GGUF_MAGIC:
                raise StoreError(f"not a GGUF model file: {path}")
            version, n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
            if version < 2:
                raise StoreError(f"{path.name}: GGUF version {version} is too old")
            header = _Header()
            for _ in range(n_kv):
                name = f.string()
                header.kv[name] = f.value(f.u32())
            for _ in range(n_tensors):
                name = f.string()
                n_dims = f.u32()
                dims = struct.unpack(f"<{n_dims}Q", f.read(8 * n_dims))
                ggml_type = f.u32()
                f.read(8)  # offset
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
                count = 1
                for d in dims:
                    count *= d
                header.tensors[name] = count // block * type_size
            return header
    except (struct.error, ValueError, KeyError, UnicodeDecodeError) as e:
        raise StoreError(f"{path.name}: unreadable GGUF header ({e})") from None
    except OSError as e:
        raise StoreError(f"cannot read {path}: {e.strerror}") from None


class _Buffered:
    """Little-endian reads over the file's head, kept in memory: a header is a few MB
    (vocabulary and merges), and in-memory unpacking is ~5x faster than small reads."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.buf = b""
        self.pos = 0

    def _need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            more = self.f.read(max(n, 4 << 20))
            self.buf = self.buf[self.pos :] + more
            self.pos = 0
            if len(self.buf) < n:
                raise ValueError("truncated header")

    def read(self, n: int) -> bytes:
        self._need(n)
        data = self.buf[self.pos : self.pos + n]
        self.pos += n
        return data

    def u32(self) -> int:
        self._need(4)
        (value,) = struct.unpack_from("<I", self.buf, self.pos)
        self.pos += 4
        return int(value)

    def u64(self) -> int:
        self._need(8)
        (value,) = struct.unpack_from("<Q", self.buf, self.pos)
        self.pos += 8
        return int(value)

    def string(self) -> str:
        return self.read(self.u64()).decode("utf-8")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.u32(), self.u64()
            if count > _ARRAY_KEEP:
                self.skip(item, count)
                return count  # big arrays (vocabularies, merges) matter only by length
            return [self.value(item) for _ in range(count)]
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {kind}")
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def skip(self, item: int, count: int) -> None:
        if item in _SCALARS:
            self.read(struct.calcsize(_SCALARS[item]) * count)
        elif item == _STRING:
            # the hot loop of the whole parse (every vocabulary entry): kept local
            u64 = _U64.unpack_from
            while count:
                buf, pos, size = self.buf, self.pos, len(self.buf)
                while count and pos + 8 <= size:
                    (length,) = u64(buf, pos)
                    if pos + 8 + length > size:
                        break
                    pos += 8 + length
                    count -= 1
                self.pos = pos
                if count:  # the next string runs past the buffer: refill enough for it
                    self._need(8)
                    self._need(8 + u64(self.buf, self.pos)[0])
        else:
            for _ in range(count):
                self.value(item)


def gguf_info_or_none(paths: Iterable[Path]) -> GgufInfo | None:
    with contextlib.suppress(StoreError):
        return gguf_info(list(paths))
    return None
