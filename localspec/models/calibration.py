"""The planner's CPU estimates, set right by this machine's own runs.

A CPU's speed at llama.cpp's kernels varies more between machines than a bandwidth per
core can say: two cores of a Xeon and of an EPYC decode the same F16 target at 5.5 and 17
tokens/s (docs/bench/json), and `plan` estimated the default 1.5B at 11 tokens/s on an
EPYC that ran it at 23-35. So when a session whose target decoded on the CPU closes, the
ratio of its measured one-token pass to the planner's estimate for that model is kept
(the last KEEP, per CPU and core count, in calibration.json), and the planner scales its
CPU estimates by their median. `LOCALSPEC_CALIBRATION=0` leaves both alone (the tests'
default: their plans must not follow the machine's history).

`auto`'s timings are kept there too (`passes`): T(k) of the batch sizes it timed and its
draft model's step, per CPU, threads and model file, which the next session's `auto`
starts from. Unseeded, a fresh `auto` spends its first rounds finding out what a 2-, 3-
and 4-token pass costs and whether the draft model pays (on two EPYC cores, where it
barely does, 0.97-0.99x plain decoding at the median over nine prompts of 128 tokens,
and 1.01-1.02x started from the last run's timings: scripts/seeded_auto.py).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def _load() -> dict[str, Any]:
    try:
        data = json.loads(path().read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: the estimates stand as they are
    return data if isinstance(data, dict) else {}


def _save(section: str, value: dict[str, Any]) -> None:
    """One section of calibration.json replaced, the others kept; written atomically."""
    data = _load()
    data[section] = value
    write_atomic(path(), json.dumps(data, indent=1) + "\n")


def _ratios() -> dict[str, list[float]]:
    try:
        cpu = _load().get("cpu", {})
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
    _save("cpu", ratios)


@dataclass(frozen=True)
class PassTimes:
    """What `auto` timed on this CPU: T(k) in seconds by batch size k, and each draft
    model's one-token step and catch-up per token (by draft file)."""

    verify: dict[int, float] = field(default_factory=dict)
    drafts: dict[str, tuple[float, float]] = field(default_factory=dict)


def _passes() -> dict[str, Any]:
    passes = _load().get("passes", {})
    return passes if isinstance(passes, dict) else {}


def _parse(entry: object) -> PassTimes | None:
    if not isinstance(entry, dict):
        return None
    try:
        verify = {int(k): float(t) for k, t in entry.get("verify", {}).items() if float(t) > 0}
        drafts = {name: (float(a), float(b)) for name, (a, b) in entry.get("drafts", {}).items()}
    except (TypeError, ValueError, AttributeError):
        return None
    return PassTimes(verify, drafts)


def recorded_passes(key: str) -> PassTimes | None:
    """The timings kept under `key` (see `passes_key`), or None (none, or calibration off)."""
    return _parse(_passes().get(key)) if enabled() else None


def record_passes(key: str, times: PassTimes) -> None:
    """Keep a session's timings under `key`, over what was kept (sizes and drafts it did
    not time stay as they were)."""
    if not enabled() or not times.verify:
        return
    passes = _passes()
    kept = _parse(passes.get(key)) or PassTimes()
    passes[key] = {
        "verify": {str(k): t for k, t in sorted((kept.verify | times.verify).items())},
        "drafts": {name: list(pair) for name, pair in (kept.drafts | times.drafts).items()},
    }
    _save("passes", passes)


def passes_key(threads: int, model: Path, layout: str) -> str:
    """What timings are kept under: this CPU, the threads, the model file (name and size)
    and how llama.cpp laid its weights out."""
    return f"{cpu_key(threads)} | {file_id(model)} | {layout}"


def file_id(path: Path) -> str:
    """A model file as the timings name it: its name and size."""
    return f"{path.name} {path.stat().st_size}"
