"""The hardware probe: NVML scenarios through a fake pynvml module (no library, no driver,
one GPU, two GPUs, a failing field), sizes, and what-if overrides."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from localspec.models import hardware as hw
from localspec.models.hardware import GiB, Gpu, Hardware, HardwareError, Overrides


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # pynvml's own names
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class NVMLError_DriverNotLoaded(NVMLError):
    def __str__(self) -> str:
        return "Driver Not Loaded"


class NVMLError_FunctionNotFound(NVMLError):
    def __str__(self) -> str:
        return "Function Not Found"


class FakeNvml:
    """pynvml's functions over a list of GPUs, with failures on demand."""

    nvmlMemory_v2 = 0x02000028

    def __init__(
        self,
        gpus: list[dict[str, Any]],
        init_error: Exception | None = None,
        fail: set[str] = frozenset(),
        v2: bool = True,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.fail = fail
        self.v2 = v2
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")
        if "shutdown" in self.fail:
            raise NVMLError("Uninitialized")

    def nvmlDeviceGetCount(self) -> int:
        if "count" in self.fail:
            raise NVMLError("Unknown Error")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if f"handle{i}" in self.fail:
            raise NVMLError("GPU is lost")
        return i

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        if f"name{handle}" in self.fail:
            raise NVMLError("Not Supported")
        return self.gpus[handle]["name"].encode()

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> Any:
        g = self.gpus[handle]
        if version is not None:
            self.calls.append("memory_v2")
            if not self.v2:
                raise NVMLError_FunctionNotFound()
        else:
            self.calls.append("memory_v1")
        if f"memory{handle}" in self.fail:
            raise NVMLError("Not Supported")
        return SimpleNamespace(total=g["total"], free=g["free"], used=g["total"] - g["free"])


LAPTOP = {"name": "NVIDIA GeForce RTX 4060 Laptop GPU", "total": 8 * GiB, "free": 7 * GiB}
DESKTOP = {"name": "NVIDIA GeForce RTX 4090", "total": 24 * GiB, "free": 23 * GiB}


def test_no_library_is_no_gpu_and_says_nothing():
    gpus, notes = hw.probe_nvidia(FakeNvml([], init_error=NVMLError_LibraryNotFound()))
    assert gpus == () and notes == []


def test_no_driver_is_no_gpu():
    gpus, notes = hw.probe_nvidia(FakeNvml([], init_error=NVMLError_DriverNotLoaded()))
    assert gpus == () and notes == []


def test_another_init_error_is_no_gpu_with_a_note():
    nvml = FakeNvml([LAPTOP], init_error=NVMLError("Insufficient Permissions"))
    gpus, notes = hw.probe_nvidia(nvml)
    assert gpus == () and "Insufficient Permissions" in notes[0]


def test_one_gpu_through_the_v2_memory_struct():
    nvml = FakeNvml([LAPTOP])
    gpus, notes = hw.probe_nvidia(nvml)
    assert gpus == (Gpu(0, LAPTOP["name"], "nvidia", 8 * GiB, 7 * GiB),)
    assert notes == [] and "memory_v2" in nvml.calls and nvml.calls[-1] == "shutdown"


def test_two_gpus():
    gpus, _ = hw.probe_nvidia(FakeNvml([LAPTOP, DESKTOP]))
    assert [g.name for g in gpus] == [LAPTOP["name"], DESKTOP["name"]]
    assert [g.index for g in gpus] == [0, 1]
    from localspec.models.memory import memory_budget

    machine = Hardware(gpus, 64 * GiB, 60 * GiB, 16, offload=True)
    assert memory_budget(machine).vram > 7 * GiB + 22 * GiB - 2 * GiB  # both cards count


def test_old_driver_falls_back_to_the_v1_struct():
    nvml = FakeNvml([LAPTOP], v2=False)
    gpus, notes = hw.probe_nvidia(nvml)
    assert gpus[0].free == 7 * GiB and "memory_v1" in nvml.calls and notes == []


def test_a_failing_field_is_left_unknown():
    gpus, notes = hw.probe_nvidia(FakeNvml([LAPTOP, DESKTOP], fail={"name0", "memory1"}))
    assert gpus[0].name == "NVIDIA GPU 0" and gpus[0].free == 7 * GiB
    assert gpus[1].name == DESKTOP["name"] and gpus[1].total is None and gpus[1].free is None
    assert len(notes) == 2 and all("NVML could not read" in n for n in notes)


def test_a_lost_gpu_or_count_is_skipped_not_fatal():
    gpus, notes = hw.probe_nvidia(FakeNvml([LAPTOP, DESKTOP], fail={"handle0", "shutdown"}))
    assert [g.index for g in gpus] == [1] and "GPU 0" in notes[0]
    gpus, notes = hw.probe_nvidia(FakeNvml([LAPTOP], fail={"count"}))
    assert gpus == () and "GPU count" in notes[0]


def test_unknown_memory_counts_as_nothing_in_the_budget():
    from localspec.models.memory import memory_budget

    gpu = Gpu(0, "mystery", "nvidia", None, None)
    assert memory_budget(Hardware((gpu,), 16 * GiB, 16 * GiB, 4, offload=True)).vram == 0


def test_the_real_library_without_a_driver_does_not_crash():
    gpus, notes = hw.probe_nvidia()  # pynvml as installed; this machine has no NVIDIA driver
    assert isinstance(gpus, tuple) and isinstance(notes, list)


def test_probe_reads_ram_and_cores_and_notes_a_cpu_only_llama_cpp():
    machine = hw.probe(nvml=FakeNvml([LAPTOP]), offload=False)
    assert machine.ram_total > 0 and 0 < machine.ram_available <= machine.ram_total
    assert machine.cores >= 1 and machine.gpus[0].name == LAPTOP["name"]
    assert not machine.gpu_usable
    assert any("LOCALSPEC_ACCEL=cuda ./scripts/setup.sh" in n for n in machine.notes)


def test_probe_with_a_usable_gpu_has_no_rebuild_note():
    machine = hw.probe(nvml=FakeNvml([LAPTOP]), offload=True)
    assert machine.gpu_usable and not machine.notes


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("8GiB", 8 * GiB),
        ("8G", 8 * GiB),
        ("8 GB", 8 * 10**9),
        ("512MiB", 512 << 20),
        ("16", 16 * GiB),
        ("1.5GiB", int(1.5 * GiB)),
        ("2tib", 2 << 40),
    ],
)
def test_parse_size(text, size):
    assert hw.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "eight", "8XB", "-1G", "8 G B"])
def test_parse_size_refuses_nonsense(text):
    with pytest.raises(HardwareError, match="is not a size"):
        hw.parse_size(text)


BASE = Hardware(
    (Gpu(0, "NVIDIA GeForce RTX 3060", "nvidia", 12 * GiB, 11 * GiB),),
    32 * GiB,
    28 * GiB,
    8,
    offload=False,
)


def test_override_gpu_none():
    machine = hw.apply(BASE, Overrides(gpu="none"))
    assert machine.gpus == () and not machine.gpu_usable


def test_override_vram_and_ram():
    machine = hw.apply(BASE, Overrides(vram=8 * GiB, ram=16 * GiB))
    assert machine.gpus == (Gpu(0, "NVIDIA GeForce RTX 3060", "nvidia", 8 * GiB, 8 * GiB),)
    assert machine.gpu_usable  # a what-if GPU is assumed usable
    assert machine.ram_total == machine.ram_available == 16 * GiB


def test_override_apple_shares_ram():
    small = hw.apply(BASE, Overrides(gpu="apple", ram=16 * GiB))
    assert small.unified and small.gpus[0].vendor == "apple"
    assert small.gpus[0].total == int(16 * GiB * 2 / 3)
    big = hw.apply(BASE, Overrides(gpu="apple", ram=64 * GiB))
    assert big.gpus[0].total == 48 * GiB


def test_override_nvidia_needs_a_size_without_a_gpu():
    with pytest.raises(HardwareError, match="--vram"):
        hw.apply(hw.apply(BASE, Overrides(gpu="none")), Overrides(gpu="nvidia"))


def test_describe():
    text = hw.apply(BASE, Overrides(vram=8 * GiB, ram=16 * GiB, cores=4)).describe()
    assert text == "NVIDIA GeForce RTX 3060 (8.0 GiB free), 16.0 GiB RAM available, 4 CPU cores"
