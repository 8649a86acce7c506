"""What the models screen lists, gathered off the UI thread: the models inventory
(localspec.models.inventory) as rows, the planner's pair, and download progress
(no Textual here)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from localspec.models.inventory import PairStatus
from localspec.models.pairing import PairSpec


@dataclass(frozen=True)
class ModelRow:
    id: str
    family: str
    role: str  # "target" | "draft"
    quant: str
    size: int  # bytes
    installed: bool
    fits: str  # "GPU", "GPU+CPU", "CPU", "no" or "?"


@dataclass(frozen=True)
class Listing:
    machine: str
    models: list[ModelRow] = field(default_factory=list)
    pairs: list[PairStatus] = field(default_factory=list)
    planned: PairSpec | None = None  # the planner's pair for this machine, if one fits
    plan_note: str = ""


def gather() -> Listing:
    """The catalog with what is installed and what fits this machine, and the plan."""
    from localspec.errors import LocalspecError
    from localspec.models import store
    from localspec.models.catalog_file import default_catalog
    from localspec.models.hardware import probe
    from localspec.models.inventory import take_inventory
    from localspec.models.pairing import default_pair

    hw = probe()
    inventory = take_inventory(default_catalog(), store.all_installed(), hw)
    models = [
        ModelRow(f.id, f.family or "", f.role, f.quant, f.size, f.installed is not None, f.fits)
        for f in inventory.files
        # one row per model unless another quantization is installed
        if f.model is not None and (f.installed is not None or f.is_default_quant)
    ]
    pairs = list(inventory.pairs)
    planned, note = None, ""
    try:
        planned = default_pair(hw=hw)
        note = " ".join(planned.reasons)
    except LocalspecError as e:
        note = str(e)
    return Listing(inventory.machine, models, pairs, planned, note)


def downloaded_bytes(since: float, files: Callable[[], Iterable[Path]]) -> int:
    """Bytes of model files written since `since`: finished files and the ones still
    downloading (a pull reports lines, not bytes, so the progress bar reads the disk)."""
    total = 0
    for path in files():
        try:
            st = path.stat()
        except OSError:
            continue  # renamed meanwhile: counted under its new name next time
        if st.st_mtime >= since and not path.is_symlink():
            total += st.st_size
    return total


def download_files() -> Iterable[Path]:
    """Where pulls write: the Hugging Face cache's blobs and localspec's own store."""
    from localspec.models.hub import hub_cache
    from localspec.paths import models_dir

    yield from hub_cache().glob("models--*/blobs/*")
    if models_dir().exists():
        yield from (p for p in models_dir().rglob("*") if p.is_file())


def pull_pair(pair_id: str, say: Callable[[str], None]) -> None:
    """Download a catalog pair (blocking; run it in a worker)."""
    from localspec.models.download import pull

    pull([pair_id], say=say)
