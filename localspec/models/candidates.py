"""The model files a plan may choose from: every quantization in the catalog, or only what
is installed (catalog models and files registered with `localspec add`), each with the
weights placement needs (measured from its header where the file is here)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from localspec.models.catalog import Catalog, ModelEntry, Quant
from localspec.models.memory import EMBD_BYTES, Weights
from localspec.models.store import Installed


@dataclass(frozen=True)
class Candidate:
    """A model file the planner may pick: a catalog quantization or an installed file."""

    id: str
    name: str
    quant: str
    family: str | None
    role: str
    params: float  # billions (estimated from bytes for a file not in the catalog)
    context: int  # training context
    weights: Weights
    path: Path | None = None  # set when installed

    @property
    def n_layers(self) -> int:
        return len(self.weights.layers)


def catalog_candidates(
    catalog: Catalog, installed: Iterable[Installed] = (), family: str | None = None
) -> list[Candidate]:
    """Every quantization of the family's targets and drafts (all families if None);
    an installed file brings its path and its measured weights."""
    have = {(e.model, e.quant): e for e in installed}
    found = []
    for model in catalog.models:
        if family is not None and model.family != family:
            continue
        for quant in model.quants:
            found.append(_from_catalog(model, quant, have.get((model.id, quant.name))))
    return found


def installed_candidates(catalog: Catalog, installed: Iterable[Installed]) -> list[Candidate]:
    """Only what is installed: catalog models and files registered with `add`."""
    found = []
    for entry in installed:
        model = catalog.find(entry.model)
        if model is not None and entry.source != "local":
            quant = next((q for q in model.quants if q.name == entry.quant), None)
            if quant is not None:
                found.append(_from_catalog(model, quant, entry))
                continue
        if entry.info is None:
            continue  # a file we cannot measure cannot be planned
        weights = Weights.from_gguf(entry.info)
        params = weights.total / EMBD_BYTES.get(entry.quant, 1.0) / 1e9
        found.append(
            Candidate(
                entry.model,
                entry.info.name,
                entry.quant,
                entry.family,
                entry.role,
                params,
                entry.info.context,
                weights,
                entry.path,
            )
        )
    return found


def _from_catalog(model: ModelEntry, quant: Quant, entry: Installed | None) -> Candidate:
    if entry is not None and entry.info is not None:
        weights = Weights.from_gguf(entry.info)
    else:
        weights = Weights.estimate(model, quant)
    return Candidate(
        model.id,
        model.name,
        quant.name,
        model.family,
        model.role,
        model.params,
        model.shape.context,
        weights,
        entry.path if entry else None,
    )
