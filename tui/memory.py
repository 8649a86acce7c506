"""Memory use for the stats panel: this process, the machine, and each NVIDIA GPU.

As in gpustat, every NVML call is wrapped: a failing field reads as unknown, and a
machine without NVML has no GPU rows. Probing is a blocking call; the app runs it in a
thread worker.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import psutil


@dataclass(frozen=True)
class GpuMemory:
    index: int
    name: str
    used: int | None  # bytes; None when NVML could not say
    total: int | None


@dataclass(frozen=True)
class MemoryUse:
    process: int  # resident bytes of this process (the models live here on a CPU)
    used: int  # the machine's RAM in use
    total: int
    gpus: tuple[GpuMemory, ...] = ()
    mapped: int = 0  # of `process`, pages of files: the mmapped model files, which the
    # machine counts as available (it may drop them and read them again), so `process`
    # can exceed `used` (Linux; 0 where unknown)


class MemoryProbe:
    """Reads memory use; NVML is initialised on first use and shut down by `close`."""

    def __init__(self) -> None:
        self._process = psutil.Process(os.getpid())
        self._nvml: Any = None  # the pynvml module once initialised, False if unavailable

    def __call__(self) -> MemoryUse:
        vm = psutil.virtual_memory()
        info = self._process.memory_info()
        return MemoryUse(
            info.rss,
            vm.total - vm.available,
            vm.total,
            self._gpus(),
            mapped=getattr(info, "shared", 0),
        )  # Linux: file pages + shmem

    def _gpus(self) -> tuple[GpuMemory, ...]:
        nvml = self._init_nvml()
        if not nvml:
            return ()
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception:
            return ()
        gpus = []
        for i in range(count):
            used = total = None
            name = f"GPU {i}"
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
            except Exception:
                gpus.append(GpuMemory(i, name, None, None))
                continue
            try:
                raw = nvml.nvmlDeviceGetName(handle)
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
            except Exception:
                pass
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle)
                used, total = int(info.used), int(info.total)
            except Exception:
                pass
            gpus.append(GpuMemory(i, name, used, total))
        return tuple(gpus)

    def _init_nvml(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:  # no driver, no library, no GPU: no GPU rows
                self._nvml = False
        return self._nvml

    def close(self) -> None:
        if self._nvml:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        self._nvml = None
