"""Where localspec keeps its files: one root, movable with $LOCALSPEC_HOME (tests use tmp)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs


def home() -> Path:
    """The localspec data directory: $LOCALSPEC_HOME, else the user's data dir."""
    root = os.environ.get("LOCALSPEC_HOME") or platformdirs.user_data_dir("localspec")
    return Path(root).expanduser()


def models_dir() -> Path:
    """Model files that did not come through the Hugging Face cache (mirrors, `add`)."""
    return home() / "models"


def conversations_dir() -> Path:
    return home() / "conversations"


def write_atomic(path: Path, data: str | bytes | list[bytes | bytearray]) -> None:
    """Write `data` (or its pieces, in order) to `path` so that readers see the old file
    or the new one, never half (a crash leaves the old one); makes the parent directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in data if isinstance(data, list) else [data]:
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
