"""Every model localspec knows of, for listing: each catalog quantization and each
installed file, with its size, whether it is installed, and whether it fits this machine;
and each catalog pair with what is left to download. `localspec models` and the chat's
models screen show it, each in its own way."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from localspec.models.catalog import DEFAULT_QUANT, Catalog, ModelEntry
from localspec.models.hardware import Hardware
from localspec.models.memory import Budget, Weights, fit, memory_budget
from localspec.models.pairing import PairSpec
from localspec.models.planner import MIN_CTX
from localspec.models.store import Installed


@dataclass(frozen=True)
class ModelFile:
    """A catalog quantization, or an installed file that is not one (`add`, hf:// pulls)."""

    id: str
    family: str | None
    role: str
    quant: str
    size: int  # bytes: the installed files', else the catalog's
    installed: Installed | None
    fits: str  # alone at the smallest context: "GPU", "GPU+CPU", "CPU", "no"; "?" unknown
    model: ModelEntry | None  # the catalog's entry; None for a file outside the catalog

    @property
    def is_default_quant(self) -> bool:
        return self.quant == DEFAULT_QUANT


@dataclass(frozen=True)
class PairStatus:
    """A catalog pair at its quantization: how big, how much is missing, and the fit."""

    id: str
    target: str
    draft: str
    quant: str
    size: int  # both files, bytes
    missing: int  # bytes still to download
    fits: str  # the target's

    @property
    def installed(self) -> bool:
        return self.missing == 0

    @property
    def spec(self) -> PairSpec:
        """Catalog ids: the session resolves them to the installed files."""
        return PairSpec(f"{self.target}:{self.quant}", f"{self.draft}:{self.quant}")


@dataclass(frozen=True)
class Inventory:
    machine: str  # the machine in words
    files: tuple[ModelFile, ...]  # the catalog's, in its order; then the others installed
    pairs: tuple[PairStatus, ...]


def take_inventory(catalog: Catalog, installed: Iterable[Installed], hw: Hardware) -> Inventory:
    """The catalog and what is installed, with each file's fit on `hw`."""
    budget = memory_budget(hw)
    entries = list(installed)
    have = {(e.model, e.quant): e for e in entries}
    files = []
    for model in catalog.models:
        for quant in model.quants:
            entry = have.get((model.id, quant.name))
            if entry is not None and entry.info is not None:
                weights = Weights.from_gguf(entry.info)
            else:
                weights = Weights.estimate(model, quant)
            size = entry.size if entry else quant.size
            files.append(
                ModelFile(
                    model.id,
                    model.family,
                    model.role,
                    quant.name,
                    size,
                    entry,
                    _fit(weights, budget, hw),
                    model,
                )
            )
    for entry in entries:
        if entry.source == "local" or catalog.find(entry.model) is None:
            fits = _fit(Weights.from_gguf(entry.info), budget, hw) if entry.info else "?"
            files.append(
                ModelFile(
                    entry.model,
                    entry.family,
                    entry.role,
                    entry.quant,
                    entry.size,
                    entry,
                    fits,
                    None,
                )
            )
    return Inventory(hw.describe(), tuple(files), _pairs(catalog, files))


def _pairs(catalog: Catalog, files: list[ModelFile]) -> tuple[PairStatus, ...]:
    by_key = {(f.id, f.quant): f for f in files if f.model is not None}
    found = []
    for pair in catalog.pairs:
        target, draft = catalog.model(pair.target), catalog.model(pair.draft)
        target_quant = target.quant(pair.quant)
        # the draft at the pair's quantization where it has it, else its default
        has_it = any(q.name == pair.quant for q in draft.quants)
        draft_quant = draft.quant(pair.quant if has_it else None)
        sides = ((target, target_quant), (draft, draft_quant))
        missing = sum(q.size for m, q in sides if by_key[m.id, q.name].installed is None)
        target_file = by_key.get((target.id, target_quant.name))
        found.append(
            PairStatus(
                pair.id,
                target.id,
                draft.id,
                target_quant.name,
                target_quant.size + draft_quant.size,
                missing,
                target_file.fits if target_file else "?",
            )
        )
    return tuple(found)


def _fit(weights: Weights, budget: Budget, hw: Hardware) -> str:
    return fit(weights, MIN_CTX, budget, hw)
