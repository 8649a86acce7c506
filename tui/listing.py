"""What the models screen lists, gathered off the UI thread from the catalog, the store,
the hardware probe and the planner (localspec's public functions, no Textual here)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tui.pair import PairSpec


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
class PairRow:
    id: str
    target: str
    draft: str
    quant: str
    size: int  # both files, bytes
    missing: int  # bytes still to download
    fits: str  # the target's fit

    @property
    def installed(self) -> bool:
        return self.missing == 0

    @property
    def spec(self) -> PairSpec:
        """Catalog ids: the session resolves them to the installed files."""
        return PairSpec(f"{self.target}:{self.quant}", f"{self.draft}:{self.quant}")


@dataclass(frozen=True)
class Listing:
    machine: str
    models: list[ModelRow] = field(default_factory=list)
    pairs: list[PairRow] = field(default_factory=list)
    planned: PairSpec | None = None  # the planner's pair for this machine, if one fits
    plan_note: str = ""


def gather() -> Listing:
    """The catalog with what is installed and what fits this machine, and the plan."""
    from localspec.cli.models import fits
    from localspec.errors import LocalspecError
    from localspec.models import store
    from localspec.models.catalog import DEFAULT_QUANT, default_catalog
    from localspec.models.hardware import probe
    from localspec.models.planner import Weights, budget

    catalog = default_catalog()
    hw = probe()
    b = budget(hw)
    installed = {(e.model, e.quant): e for e in store.all_installed()}
    models: list[ModelRow] = []
    fit_of: dict[tuple[str, str], str] = {}
    for m in catalog.models:
        for q in m.quants:
            entry = installed.get((m.id, q.name))
            weights = (
                Weights.from_gguf(entry.info) if entry and entry.info else Weights.estimate(m, q)
            )
            fit_of[(m.id, q.name)] = fit = fits(weights, hw, b)
            if entry is None and q.name != DEFAULT_QUANT:
                continue  # one row per model unless another quantization is installed
            models.append(
                ModelRow(
                    m.id,
                    m.family,
                    m.role,
                    q.name,
                    entry.size if entry else q.size,
                    entry is not None,
                    fit,
                )
            )
    pairs = []
    for p in catalog.pairs:
        target, draft = catalog.model(p.target), catalog.model(p.draft)
        tq, dq = (
            target.quant(p.quant),
            draft.quant(p.quant if any(x.name == p.quant for x in draft.quants) else None),
        )
        missing = sum(
            q.size for m, q in ((target, tq), (draft, dq)) if (m.id, q.name) not in installed
        )
        pairs.append(
            PairRow(
                p.id,
                target.id,
                draft.id,
                tq.name,
                tq.size + dq.size,
                missing,
                fit_of.get((target.id, tq.name), "?"),
            )
        )
    planned, note = None, ""
    try:
        from localspec.models.pairing import default_pair

        pair = default_pair(hw=hw)
        planned = PairSpec(pair.target, pair.draft, pair.n_ctx, pair.n_gpu_layers)
        note = " ".join(pair.reasons)
    except LocalspecError as e:
        note = str(e)
    return Listing(hw.describe(), models, pairs, planned, note)


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
    from localspec.models.download import hub_cache
    from localspec.paths import models_dir

    yield from hub_cache().glob("models--*/blobs/*")
    if models_dir().exists():
        yield from (p for p in models_dir().rglob("*") if p.is_file())


def pull_pair(pair_id: str, say: Callable[[str], None]) -> None:
    """Download a catalog pair (blocking; run it in a worker)."""
    from localspec.models.download import pull

    pull([pair_id], say=say)
