"""Which file a model spec means: 'id' or 'id:QUANT' (a catalog id, or one `localspec add`
gave) to the installed file to load.

It sits above the catalog (what could be installed) and the store (what is recorded),
and also finds files already where a pull would put them but never recorded (fetched
before records existed, or by `hf download`): those are usable as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

from localspec.errors import LocalspecError
from localspec.models import store
from localspec.models.catalog import (
    DEFAULT_QUANT,
    QUANT_ORDER,
    Quant,
    UnknownModel,
    split_spec,
    suggest,
)
from localspec.models.catalog_file import default_catalog
from localspec.models.hub import cached_file, hub_cache
from localspec.models.store import Installed


class NotInstalled(LocalspecError):
    """A catalog model that is not downloaded yet."""


def resolve_installed(spec: str) -> Path:
    """The path of an installed model, by catalog id ('id' or 'id:QUANT') or by the id
    given to `localspec add`. Raises NotInstalled saying how to get it."""
    model_id, quant = split_spec(spec)
    found = find_installed(model_id, quant)
    if found is not None:
        return found.path
    catalog = default_catalog()
    model = catalog.find(model_id)
    if model is not None:
        for q in [model.quant(quant)] if quant else sorted(model.quants, key=_preference):
            path = find_present(q)
            if path is not None:
                return path
    if model is None and catalog.pair(model_id) is None:
        raise UnknownModel(
            f"'{spec}' is not a model file, an installed model or a catalog id"
            f"{suggest(model_id, catalog.ids() + store.local_ids())}"
        )
    what = f"{model_id}:{quant}" if quant else model_id
    raise NotInstalled(f"{what} is not installed: run `localspec pull {what}`")


def find_installed(model_id: str, quant: str | None = None) -> Installed | None:
    """The recorded entry for a model: the named quantization, else the one a plan would
    pick first (Q4_K_M, then the others from small to large)."""
    entries = store.installed_quants(model_id, quant)
    order = {q: i for i, q in enumerate(QUANT_ORDER)}
    return min(entries, key=lambda e: order.get(e.quant, len(order)), default=None)


def present_files(quant: Quant, cache: Path) -> list[tuple[str, Path, str]]:
    """(source, path, sha256) of files of `quant` already on disk where a pull would
    have put them: the mirror's file, or the hub file in the Hugging Face cache."""
    found: list[tuple[str, Path, str]] = []
    if quant.mirror is not None:
        path = store.mirror_path(quant.mirror.file)
        if path.is_file():
            found.append(("mirror", path, quant.mirror.sha256))
    cached = cached_file(quant.hub, cache) if quant.hub is not None else None
    if cached is not None:
        blob_name = Path(os.path.realpath(cached)).name
        sha = quant.sha256 or (blob_name if store.is_sha256(blob_name) else None)
        if sha:
            found.append(("hub", cached, sha))
    return found


def find_present(quant: Quant) -> Path | None:
    """A file of `quant` already on disk without a record (read-only: nothing hashed).
    A mirror file is trusted at its final name: the mirror renames only verified files."""
    for source, path, _sha in present_files(quant, hub_cache()):
        if source == "mirror" and quant.mirror and path.stat().st_size != quant.mirror.size:
            continue
        return path
    return None


def _preference(q: Quant) -> tuple[bool, int]:
    return (q.name != DEFAULT_QUANT, q.size)
