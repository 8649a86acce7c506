"""What this machine has for the planner: GPUs and their memory, RAM, cores, and whether
the installed llama.cpp can offload to a GPU at all.

NVIDIA GPUs are read through NVML (nvidia-ml-py, `import pynvml`). Each NVML call is
wrapped on its own, so a missing library or driver means "no GPU", and a field that one
driver cannot report (free memory under some vGPU setups) is left unknown instead of
failing the probe. Apple Silicon shares its RAM with the GPU: the GPU may use about
two thirds of it (three quarters above 36 GiB), unless `iogpu.wired_limit_mb` says more.
Everything can be overridden (`--vram 8GiB --ram 16GiB --gpu none`) for what-if plans.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import subprocess
from dataclasses import dataclass, replace
from typing import Any

from localspec.errors import LocalspecError
from localspec.models.calibration import cpu_scale

GiB = 1 << 30
MiB = 1 << 20
_UNITS = {
    "": GiB,
    "b": 1,
    "k": 1 << 10,
    "kb": 10**3,
    "kib": 1 << 10,
    "m": MiB,
    "mb": 10**6,
    "mib": MiB,
    "g": GiB,
    "gb": 10**9,
    "gib": GiB,
    "t": 1 << 40,
    "tb": 10**12,
    "tib": 1 << 40,
}
REBUILD = {
    "nvidia": "LOCALSPEC_ACCEL=cuda ./scripts/setup.sh",
    "apple": "LOCALSPEC_ACCEL=metal ./scripts/setup.sh",
}


class HardwareError(LocalspecError):
    """A bad override (e.g. an unreadable size)."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    vendor: str  # "nvidia" | "apple"
    total: int | None  # bytes; None when the driver would not say
    free: int | None

    @property
    def usable(self) -> int | None:
        """What a new process can take: free memory, else the total."""
        return self.free if self.free is not None else self.total


@dataclass(frozen=True)
class Remote:
    """One device of an rpc-server (`--rpc`): the target's layers may go there."""

    endpoint: str  # host:port
    free: int  # bytes, as the server reports them
    total: int


@dataclass(frozen=True)
class Hardware:
    gpus: tuple[Gpu, ...]
    ram_total: int
    ram_available: int
    cores: int  # physical
    offload: bool  # llama.cpp was built with a GPU backend
    unified: bool = False  # Apple Silicon: GPU memory is system RAM
    notes: tuple[str, ...] = ()
    remote: tuple[Remote, ...] = ()  # rpc-servers' devices, for the target only
    # a one-token pass on this CPU as this machine's runs measured it, over the estimate
    # (calibration.py); 1 where none was kept
    cpu_scale: float = 1.0
    x86: bool = False  # where a CPU target's prompts are read by a copy not repacked

    @property
    def rpc_servers(self) -> int:
        return len({r.endpoint for r in self.remote})

    @property
    def gpu_usable(self) -> bool:
        """A GPU is present and llama.cpp can put layers on it."""
        return bool(self.gpus) and self.offload

    def describe(self) -> str:
        """One line: 'NVIDIA RTX 4060 (8.0 GiB free), 31.2 GiB RAM, 8 cores'."""
        parts = [
            f"{g.name} ({fmt_size(g.usable)} {'usable' if self.unified else 'free'})"
            if g.usable is not None
            else f"{g.name} (memory unknown)"
            for g in self.gpus
        ] or ["no GPU"]
        parts.append(f"{fmt_size(self.ram_available)} RAM available")
        parts.append(f"{self.cores} CPU cores")
        if self.remote:
            free = fmt_size(sum(r.free for r in self.remote))
            parts.append(f"{self.rpc_servers} rpc-server(s) with {free} free")
        return ", ".join(parts)


@dataclass(frozen=True)
class Overrides:
    """What-if settings: a value given here replaces the probed one."""

    vram: int | None = None  # one GPU with this much memory, all of it free
    ram: int | None = None  # this much RAM, all of it available
    gpu: str | None = None  # "none" | "nvidia" | "apple"
    cores: int | None = None


def parse_size(text: str) -> int:
    """'8GiB', '8G', '8 GB', '512MiB', '16' (GiB) -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise HardwareError(f"'{text}' is not a size (try 8GiB, 512MiB, 16G)")
    return int(float(m.group(1)) * _UNITS[unit])


def fmt_size(n: int | float | None) -> str:
    if n is None:
        return "?"
    if abs(n) >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.0f} MiB"


def probe(
    overrides: Overrides = Overrides(),
    nvml: Any = None,
    offload: bool | None = None,
) -> Hardware:
    """This machine, with `overrides` applied. `nvml` replaces pynvml (tests pass a fake)
    and `offload` replaces asking llama.cpp whether it can use a GPU."""
    import psutil

    notes: list[str] = []
    mem = psutil.virtual_memory()
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    unified = _apple_silicon()
    gpus: tuple[Gpu, ...] = ()
    if overrides.gpu != "none":
        if unified:
            gpus = (Gpu(0, _apple_chip(), "apple", _apple_gpu_share(mem.total), None),)
        else:
            gpus, nvml_notes = probe_nvidia(nvml)
            notes += nvml_notes
    if offload is None:
        offload = _llama_offload() if gpus or overrides.vram or overrides.gpu else False
    hw = Hardware(gpus, mem.total, mem.available, cores, offload, unified, tuple(notes))
    hw = apply(replace(hw, x86=x86_cpu()), overrides)
    if hw.cores == cores and (scale := cpu_scale(cores)) is not None:  # not a what-if CPU
        hw = replace(hw, cpu_scale=scale)
    if hw.gpus and not hw.offload:
        vendor = hw.gpus[0].vendor
        hw = replace(
            hw,
            notes=(
                *hw.notes,
                (
                    f"llama.cpp here was built without {'Metal' if vendor == 'apple' else 'CUDA'}, "
                    f"so the GPU goes unused; rebuild it with `{REBUILD[vendor]}`"
                ),
            ),
        )
    return hw


def x86_cpu() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def apply(hw: Hardware, o: Overrides) -> Hardware:
    """`hw` with the what-if values of `o` in place of the probed ones."""
    if o.gpu not in (None, "none", "nvidia", "apple"):
        raise HardwareError(f"--gpu must be none, nvidia or apple, not '{o.gpu}'")
    ram_total = o.ram if o.ram is not None else hw.ram_total
    ram_available = o.ram if o.ram is not None else hw.ram_available
    cores = o.cores or hw.cores
    gpus, unified, offload = hw.gpus, hw.unified, hw.offload
    if o.gpu == "none":
        gpus, unified = (), False
    elif o.gpu == "apple" or (unified and o.gpu is None):
        unified, offload = True, offload or o.gpu == "apple"
        probed = gpus[0] if gpus and gpus[0].vendor == "apple" else None
        if o.vram is not None:
            share: int | None = o.vram
        elif probed is not None and o.ram is None:
            share = probed.total
        else:
            share = default_gpu_share(ram_total)
        name = probed.name if probed is not None else "Apple GPU"
        gpus = (Gpu(0, name, "apple", share, None),)
    elif o.vram is not None or o.gpu == "nvidia":
        # a what-if GPU is assumed usable: the question is what would fit on it
        vram = o.vram if o.vram is not None else (gpus[0].usable if gpus else None)
        if vram is None:
            raise HardwareError("--gpu nvidia needs --vram SIZE on a machine without one")
        name = gpus[0].name if gpus and gpus[0].vendor == "nvidia" else "NVIDIA GPU"
        gpus, unified, offload = (Gpu(0, name, "nvidia", vram, vram),), False, True
    x86 = hw.x86 and not unified  # an Apple what-if: an Apple CPU
    return Hardware(gpus, ram_total, ram_available, cores, offload, unified, hw.notes, x86=x86)


# --- NVIDIA --------------------------------------------------------------------------


def probe_nvidia(nvml: Any = None) -> tuple[tuple[Gpu, ...], list[str]]:
    """NVIDIA GPUs through NVML (`nvml`: pynvml, or a stand-in with its functions);
    ((), [why]) when there is no library, driver or GPU."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return (), ["nvidia-ml-py is not installed: NVIDIA GPUs are not detected"]
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        if _is_missing_driver(e):
            return (), []  # the common case on machines without NVIDIA: nothing to say
        return (), [f"NVML could not start ({_reason(e)}): NVIDIA GPUs are not detected"]
    notes: list[str] = []
    gpus: list[Gpu] = []
    try:
        count = _field(notes, "GPU count", lambda: int(nvml.nvmlDeviceGetCount())) or 0
        for i in range(count):
            handle = _field(notes, f"GPU {i}", lambda i=i: nvml.nvmlDeviceGetHandleByIndex(i))
            if handle is None:
                continue
            name = _field(notes, f"GPU {i} name", lambda h=handle: _text(nvml.nvmlDeviceGetName(h)))
            total, free = _memory(nvml, handle, notes, i)
            gpus.append(Gpu(i, name or f"NVIDIA GPU {i}", "nvidia", total, free))
    finally:
        with contextlib.suppress(Exception):  # shutting down a library that half-worked
            nvml.nvmlShutdown()
    return tuple(gpus), notes


def _memory(nvml: Any, handle: Any, notes: list[str], i: int) -> tuple[int | None, int | None]:
    """(total, free): the v2 struct where the driver has it (its 'free' leaves out memory
    the driver reserves), else v1; a failing call leaves both unknown."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    info = None
    if version is not None:
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except Exception:  # older drivers lack nvmlDeviceGetMemoryInfo_v2
            info = None
    if info is None:
        info = _field(notes, f"GPU {i} memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    if info is None:
        return None, None
    total = getattr(info, "total", None)
    free = getattr(info, "free", None)
    return (int(total) if total is not None else None, int(free) if free is not None else None)


def _field(notes: list[str], what: str, call: Any) -> Any:
    try:
        return call()
    except Exception as e:
        notes.append(f"NVML could not read {what} ({_reason(e)})")
        return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _reason(e: Exception) -> str:
    return str(e).strip() or type(e).__name__


def _is_missing_driver(e: Exception) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    return any(
        w in text
        for w in (
            "library not found",
            "librarynotfound",
            "driver not loaded",
            "drivernotloaded",
            "not found",
        )
    )


# --- Apple ---------------------------------------------------------------------------


def _apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def _apple_chip() -> str:
    try:
        out = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=2
        )
        return out.stdout.strip() or "Apple GPU"
    except (OSError, subprocess.SubprocessError):
        return "Apple GPU"


def _apple_gpu_share(ram_total: int) -> int:
    """Metal's working-set limit: the `iogpu.wired_limit_mb` sysctl where the user set
    it, else macOS's default of ~2/3 of RAM (3/4 above 36 GiB)."""
    if _apple_silicon():  # the user's own limit, where set
        try:
            out = subprocess.run(
                ["sysctl", "-n", "iogpu.wired_limit_mb"], capture_output=True, text=True, timeout=2
            )
            limit = int(out.stdout.strip() or 0)
            if limit > 0:
                return limit * MiB
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    return default_gpu_share(ram_total)


def default_gpu_share(ram_total: int) -> int:
    """macOS's default GPU working-set limit on Apple Silicon."""
    return int(ram_total * (0.75 if ram_total > 36 * GiB else 2 / 3))


def _llama_offload() -> bool:
    try:
        from localspec.backends.llama import supports_gpu_offload

        return supports_gpu_offload()
    except Exception:  # llama.cpp not importable: it will say so when a model loads
        return False
