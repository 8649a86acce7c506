"""The planner's CPU estimates, set right by this machine's own runs.

A CPU's speed at llama.cpp's kernels varies more between machines than a bandwidth per
core can say: two cores of a Xeon and of an EPYC decode the same F16 target at 5.5 and 17
tokens/s (docs/bench/json), and `plan` estimated the default 1.5B at 11 tokens/s on an
EPYC that ran it at 23-35. So when a session whose target decoded on the CPU closes, the
ratio of its measured one-token pass to the planner's estimate for that model is kept
(the last KEEP, per CPU and core count, in calibration.json), and the planner scales its
CPU estimates by their median. `LOCALSPEC_CALIBRATION=0` leaves both alone (the tests'
default: their plans must not follow the machine's history).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path

from localspec.paths import home, write_atomic

KEEP = 9  # ratios kept per CPU: a loaded host's run moves the median by one place
MIN_PASSES = 16  # one-token passes a session must have timed to count


def enabled() -> bool:
    return os.environ.get("LOCALSPEC_CALIBRATION", "1") != "0"


def path() -> Path:
    return home() / "calibration.json"


def cpu_key(cores: int) -> str:
    """This CPU's model name and the cores used: what the ratios are kept under."""
    name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name or platform.processor() or platform.machine()} x{cores}"


def _ratios() -> dict[str, list[float]]:
    try:
        data = json.loads(path().read_text())
        cpu = data.get("cpu", {}) if isinstance(data, dict) else {}
        return {
            key: [float(r) for r in values if isinstance(r, int | float) and r > 0]
            for key, values in cpu.items()
            if isinstance(values, list)
        }
    except (OSError, ValueError, AttributeError):
        return {}  # none yet, or unreadable: the estimates stand as they are


def cpu_scale(cores: int) -> float | None:
    """Measured over estimated one-token pass time on this CPU with `cores` cores (the
    median of the ratios kept), or None where none was kept (or calibration is off)."""
    if not enabled():
        return None
    ratios = _ratios().get(cpu_key(cores))
    return statistics.median(ratios) if ratios else None


def record_cpu_ratio(cores: int, ratio: float) -> None:
    """Keep one session's ratio (the oldest goes beyond KEEP); written atomically."""
    if not enabled() or not ratio > 0:
        return
    ratios = _ratios()
    key = cpu_key(cores)
    ratios[key] = [*ratios.get(key, []), ratio][-KEEP:]
    write_atomic(path(), json.dumps({"cpu": ratios}, indent=1) + "\n")
