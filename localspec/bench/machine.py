"""What the bench says about the machine it ran on: the CPU, the load, llama.cpp's
version, and how much of the CPU each run got (a run that shared it is flagged noisy)."""

from __future__ import annotations

import os
import platform
import time

CONTENDED = 0.85  # a run that got less of the CPU than this shared it with other work


def machine_load() -> float:
    """The 1-minute load average (0 where the OS has none): other work on the machine
    slows every mode, unevenly, and makes the ratios noisy."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def describe_machine() -> str:
    """The CPU's model name, the CPU count and the OS, in one line."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                cpu,
            )
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, {platform.system()}"


def llama_cpp_version() -> str:
    try:
        from importlib.metadata import version

        return f"llama-cpp-python {version('llama-cpp-python')}"
    except Exception:
        return "unknown"


class CpuClock:
    """How much of the CPU a run got: CPU seconds (this process and the peer binaries it
    waited for) over wall seconds × threads. Uncontended, llama.cpp's threads run (or
    spin) throughout, near 1; other work on the machine shows as less, and makes that
    run's figures noisy. None when the thread count is not known."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.wall, self.cpu = time.perf_counter(), cpu_seconds()

    def share(self) -> float | None:
        wall, now = time.perf_counter() - self.wall, cpu_seconds()
        if not self.threads or wall <= 0 or now is None or self.cpu is None:
            return None
        return (now - self.cpu) / (wall * self.threads)


def cpu_seconds() -> float | None:
    """User and system CPU time of this process and its waited-for children."""
    try:
        import resource  # POSIX only
    except ImportError:
        return None
    me, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime
