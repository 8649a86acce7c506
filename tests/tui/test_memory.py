"""The stats panel's memory figures, read from this very process."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest

from tui.memory import GpuMemory, MemoryProbe, MemoryUse
from tui.widgets.stats import memory_rows

MiB = 1 << 20


def test_the_probe_reads_this_process_and_the_machine():
    probe = MemoryProbe()
    try:
        memory = probe()
    finally:
        probe.close()
    assert 0 < memory.process < memory.total
    assert 0 < memory.used <= memory.total
    assert all(isinstance(gpu, GpuMemory) for gpu in memory.gpus)  # none without NVML
    assert 0 <= memory.mapped <= memory.process


@pytest.mark.skipif(sys.platform != "linux", reason="file pages are told apart on Linux")
def test_a_mapped_file_counts_as_mapped(tmp_path: Path):
    """A model is mmapped: its pages are the process's, yet the machine counts them as
    available, so the panel says how much of "app" they are."""
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\1" * (64 * MiB))
    probe = MemoryProbe()
    before = probe().mapped
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert sum(m[i] for i in range(0, len(m), 4096)) == 64 * MiB // 4096  # touch each page
        after = probe().mapped
    probe.close()
    assert after - before >= 60 * MiB


def test_the_app_row_names_its_mapped_share_when_it_matters():
    GiB = 1 << 30
    mostly_files = dict(memory_rows(MemoryUse(2 * GiB, GiB, 24 * GiB, mapped=GiB + GiB // 2)))
    assert mostly_files["app"] == "2.0 GiB · 1.5 GiB mmap"
    assert mostly_files["RAM"] == "1.0 GiB / 24.0 GiB"
    assert dict(memory_rows(MemoryUse(2 * GiB, GiB, 24 * GiB, mapped=MiB)))["app"] == "2.0 GiB"
