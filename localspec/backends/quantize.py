"""Requantizing GGUF files with llama.cpp's own quantize API, and the CPU draft.

On a CPU a draft model's step is compute-bound, and its speed depends on the tensor
types more than on their size: llama.cpp repacks Q4_0 tensors into interleaved blocks
with dedicated AVX2/AVX-512/NEON kernels, but a K-quant mix of a small model is mostly
other types (a 0.5B Qwen's 896-wide rows fall back to Q5_0, and its 136M-parameter
output head stays Q8_0 or Q6_K). A copy of the whole draft in Q4_0 steps twice as fast
on an AVX-512 EPYC (10 against 19-21 ms a token) at 1.6 points less greedy agreement with
the target. The draft's weights decide only speed, never the output: the target verifies
every token. So on a CPU localspec drafts with such a copy, made once into the store.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
from collections.abc import Callable
from pathlib import Path

from localspec.errors import LocalspecError
from localspec.paths import models_dir

Q4_0 = 2  # llama_ftype LLAMA_FTYPE_MOSTLY_Q4_0, as GGUF's general.file_type stores it
F16 = 1  # LLAMA_FTYPE_MOSTLY_F16


class QuantizeError(LocalspecError):
    pass


def requantize(
    source: Path, out: Path, ftype: int, pure: bool = False, threads: int | None = None
) -> None:
    """Write `source` requantized to `ftype` at `out`, atomically. `pure`: every tensor
    in that type (llama.cpp otherwise keeps the output head and some others finer)."""
    import llama_cpp as ll

    from localspec.backends import llama  # noqa: F401  (initializes the backend, with its quiet log)

    params = ll.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True  # the source is usually quantized already
    params.pure = pure
    params.nthread = threads or os.cpu_count() or 2
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        rc = ll.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise QuantizeError(
                f"llama.cpp could not requantize {source.name} ({rc}); "
                "LOCALSPEC_LLAMA_LOG=1 shows its log"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def repacks_q4_0() -> bool:
    """Whether llama.cpp's CPU backend has repacked Q4_0 kernels here: x86 with AVX2,
    or 64-bit ARM (NEON dot product)."""
    machine = platform.machine().lower()
    if machine in ("arm64", "aarch64"):
        return True
    if machine not in ("x86_64", "amd64"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx2" in line for line in f)
    except OSError:  # not Linux: no cheap way to tell, so keep the draft as it is
        return False


def cpu_draft_path(source: Path) -> Path:
    """Where the Q4_0 copy of `source` lives: the store, named after the source file, in
    a folder per source (its path and size hashed: two files of one name never share)."""
    st = source.stat()
    tag = hashlib.sha256(f"{source.resolve()}|{st.st_size}".encode()).hexdigest()[:12]
    return models_dir() / "cpu-drafts" / tag / f"{source.stem}.cpu-q4_0.gguf"


def draft_to_load(
    source: Path,
    on_gpu: bool,
    quant: str = "auto",
    say: Callable[[str], None] = lambda _: None,
    target: Path | None = None,
) -> Path:
    """The file to load for the draft `source`: with `quant` "auto" and the draft on the
    CPU, its Q4_0 copy (see `cpu_draft`); "keep": `source` as it is."""
    if quant not in ("auto", "keep"):
        raise LocalspecError(f"--draft-quant must be 'auto' or 'keep', not {quant!r}")
    return source if quant == "keep" or on_gpu else cpu_draft(source, say, target)


def cpu_draft(
    source: Path, say: Callable[[str], None] = lambda _: None, target: Path | None = None
) -> Path:
    """The draft to load on this CPU: a Q4_0 copy of `source`, made on first use, or
    `source` itself where a copy would not be faster, cannot be made, or would be
    wasted (a vocabulary that cannot pair with `target`'s: the load refuses it)."""
    from localspec.backends.base import MAX_VOCAB_DIFFERENCE
    from localspec.backends.gguf import ASSISTANT_ARCHS, GgufError, gguf_info

    if not repacks_q4_0():
        return source
    try:  # each header read once: this runs on every session start
        info = gguf_info(source)
        other = gguf_info(target) if target is not None else info
    except GgufError:
        return source  # llama.cpp will say what is wrong with it
    if info.architecture in ASSISTANT_ARCHS:  # a head over the target's context, not a model
        return source
    far = abs(info.vocab - other.vocab) > MAX_VOCAB_DIFFERENCE
    if info.file_type == Q4_0 or info.tokenizer != other.tokenizer or far:
        return source
    out = cpu_draft_path(source)
    if out.is_file() and out.stat().st_mtime_ns >= source.stat().st_mtime_ns:
        return out
    say(f"making a CPU-fast Q4_0 copy of the draft {source.name} in {out.parent} (once)")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        requantize(source, out, Q4_0, pure=True)
    except (QuantizeError, OSError) as e:
        say(f"drafting with {source.name} as it is: {e}")
        return source
    return out
