"""Reading a GGUF file's header: its shape, tokenizer and the bytes of each layer.

The planner, `localspec add` and the CPU draft all need these facts, and nothing else of
the file. They sit below both the backends and model management, so that neither has to
import the other for them.

The header is parsed by hand rather than with `gguf.GGUFReader`: the reader builds a numpy
view for every vocabulary entry and merge (hundreds of thousands of them in a Qwen or
Gemma file), which takes seconds per file, and the planner reads headers whenever it runs.
This reader streams the header, keeps the keys it needs and counts the big arrays; the
tensor data, gigabytes, is never read. Quantization block sizes and file types come
from the `gguf` package.
"""

from __future__ import annotations

import contextlib
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from localspec.errors import LocalspecError

GGUF_MAGIC = b"GGUF"  # a GGUF file's first four bytes
# the parts of a split GGUF: name-00001-of-00003.gguf; llama.cpp opens the first
SPLIT_SUFFIX = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


# drafters that read the target's own context (its KV cache, its token embeddings):
# loaded beside the target as its head (localspec.backends.mtp), never on their own
ASSISTANT_ARCHS = ("gemma4-assistant",)


class GgufError(LocalspecError):
    """A file that is not a readable GGUF model."""


@dataclass(frozen=True)
class GgufInfo:
    """The GGUF facts the planner, `add` and the CPU draft need."""

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
    mtp_layers: int = 0  # MTP ("nextn") blocks after the trunk, counted in `layers`
    experts: int = 0  # a MoE's routed experts per layer (0: dense)
    experts_used: int = 0  # of which each token uses this many
    expert_bytes: tuple[int, ...] = ()  # the routed experts' bytes of each layer (MoE)
    recurrent: bool = False  # some layers keep a recurrent state (Mamba, Gated DeltaNet)
    attention_every: int = 1  # a hybrid's one attention layer in this many (Qwen3.5: 4)
    state_bytes: int = 0  # one sequence's recurrent state (f32), as llama.cpp sizes it
    # the weights llama.cpp repacks for an x86 CPU's kernels (None: stored before it was
    # counted); a prompt reader (backends/reader.py) maps their file pages as well
    repacked_bytes: int | None = None

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


# GGUF value types (gguf.GGUFValueType, not imported: it loads numpy): struct formats
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
# the types llama.cpp repacks on an x86 CPU with AVX2 (ggml-cpu/repack.cpp), in matrices
# of rows a multiple of 8; the token embeddings are looked up, not multiplied: never
REPACKED_TYPES = ("Q4_0", "Q4_K", "IQ4_NL", "MXFP4")
_U64 = struct.Struct("<Q")
_ARRAY_KEEP = 64  # keep small arrays (per-layer head counts); count the big ones only


@dataclass
class _Header:
    kv: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, int] = field(default_factory=dict)  # name -> bytes
    shapes: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # dims, type


def gguf_info(paths: Path | Iterable[Path]) -> GgufInfo:
    """Shape and per-layer weight bytes from a GGUF file (all shards of a split one)."""
    shards = [paths] if isinstance(paths, Path) else list(paths)
    headers = [_read_header(p) for p in shards]
    kv = headers[0].kv
    tensors: dict[str, int] = {}
    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    for h in headers:
        tensors.update(h.tensors)
        shapes.update(h.shapes)
    arch = str(kv.get("general.architecture", "unknown"))

    def key(name: str, default: Any = 0) -> Any:
        value = kv.get(f"{arch}.{name}", default)
        return max(value) if isinstance(value, list) and value else value

    layers = int(key("block_count"))
    embedding = int(key("embedding_length"))
    heads = int(key("attention.head_count", 1)) or 1
    per_layer = [0] * layers
    experts = [0] * layers
    embd = output = 0
    for name, size in tensors.items():
        if m := re.match(r"blk\.(\d+)\.", name):
            index = int(m.group(1))
            if index < layers:
                per_layer[index] += size
                if "_exps." in name:  # ffn_{gate,up,down}_exps: the routed experts
                    experts[index] += size
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
        # a drafter over its target's KV cache (ASSISTANT_ARCHS) keeps none of its own
        kv_heads=0 if arch in ASSISTANT_ARCHS else int(key("attention.head_count_kv", heads)),
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
        mtp_layers=int(key("nextn_predict_layers")),
        experts=int(key("expert_count")),
        experts_used=int(key("expert_used_count")),
        expert_bytes=tuple(experts) if any(experts) else (),
        recurrent=any(".ssm_" in name for name in tensors),
        attention_every=int(key("full_attention_interval", 1)),
        state_bytes=_state_bytes(key, tensors),
        repacked_bytes=sum(
            tensors[name]
            for name, (dims, kind) in shapes.items()
            if kind in REPACKED_TYPES
            and len(dims) == 2
            and dims[1] % 8 == 0
            and (name.startswith("blk.") or name == "output.weight")
        ),
    )


def _state_bytes(key: Any, tensors: dict[str, int]) -> int:
    """A recurrent model's state per sequence: llama.cpp's n_embd_r (the convolution's
    last d_conv - 1 inputs) and n_embd_s (the SSM / delta-rule state) of each layer that
    has one; 0 for a model without."""
    layers = {m.group(1) for name in tensors if (m := re.match(r"blk\.(\d+)\.ssm_", name))}
    if not layers:
        return 0
    d_conv, d_inner = int(key("ssm.conv_kernel")), int(key("ssm.inner_size"))
    d_state, groups = int(key("ssm.state_size")), int(key("ssm.group_count"))
    return len(layers) * layer_state_bytes(d_conv, d_inner, d_state, groups)


def layer_state_bytes(d_conv: int, d_inner: int, d_state: int, groups: int) -> int:
    """One recurrent layer's state per sequence, in f32, from its `ssm.*` keys."""
    conv = max(0, d_conv - 1) * (d_inner + 2 * groups * d_state)
    return (conv + d_state * d_inner) * 4


def _read_header(path: Path) -> _Header:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with open(path, "rb") as raw:
            f = _Buffered(raw)
            if f.read(4) != GGUF_MAGIC:
                raise GgufError(f"not a GGUF model file: {path}")
            version, n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
            if version < 2:
                raise GgufError(f"{path.name}: GGUF version {version} is too old")
            header = _Header()
            for _ in range(n_kv):
                name = f.string()
                header.kv[name] = f.value(f.u32())
            for _ in range(n_tensors):
                name = f.string()
                n_dims = f.u32()
                dims = struct.unpack(f"<{n_dims}Q", f.read(8 * n_dims))
                ggml_type = GGMLQuantizationType(f.u32())
                f.read(8)  # offset
                block, type_size = GGML_QUANT_SIZES[ggml_type]
                count = 1
                for d in dims:
                    count *= d
                header.tensors[name] = count // block * type_size
                header.shapes[name] = (dims, ggml_type.name)
            return header
    except (struct.error, ValueError, KeyError, UnicodeDecodeError) as e:
        raise GgufError(f"{path.name}: unreadable GGUF header ({e})") from None
    except OSError as e:
        raise GgufError(f"cannot read {path}: {e.strerror}") from None


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


def tensor_shapes(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each tensor's dimensions (ggml's order, as `gguf.GGUFReader` gives them) and type
    name ("Q4_K"), without the reader's seconds over the vocabulary."""
    return _read_header(path).shapes


def gguf_info_or_none(paths: Iterable[Path]) -> GgufInfo | None:
    """The header's facts, or None for a file that has no readable GGUF header."""
    with contextlib.suppress(GgufError):
        return gguf_info(list(paths))
    return None


def is_assistant(path: Path) -> bool:
    """Whether the GGUF at `path` is such a drafter (Gemma 4's "assistant")."""
    info = gguf_info_or_none([path])
    return info is not None and info.architecture in ASSISTANT_ARCHS


def split_parts(path: Path) -> list[Path]:
    """All parts of a split GGUF (name-00001-of-0000N.gguf), or just `path`."""
    m = SPLIT_SUFFIX.search(path.name)
    if not m:
        return [path]
    total = int(m.group(2))
    stem = path.name[: m.start()]
    parts = [path.with_name(f"{stem}-{i:05d}-of-{total:05d}.gguf") for i in range(1, total + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise GgufError(f"split GGUF incomplete: missing {', '.join(missing)}")
    return parts


def in_part_order(names: Iterable[str]) -> list[str]:
    """Names of a split GGUF's parts in part order (the first is the one llama.cpp opens)."""
    return sorted(names, key=lambda n: (int(m.group(1)) if (m := SPLIT_SUFFIX.search(n)) else 0, n))
