"""Reading models.toml into a Catalog, and saying exactly what is wrong with a bad one.

The file is read with tomllib, then every table is checked against its schema. Every
problem (an unknown key, a missing field, a draft from another family) is collected with
its file and line and reported together as one CatalogError, so a typo never becomes a
traceback or a silently ignored setting. tomllib keeps no line numbers, so `_key_lines`
finds them in the text.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from localspec.errors import LocalspecError, Problem
from localspec.models.catalog import (
    DEFAULT_QUANT,
    ROLES,
    Catalog,
    Family,
    HubFile,
    Mirror,
    ModelEntry,
    Moe,
    PairEntry,
    Quant,
    Recurrent,
    Shape,
    suggest,
)
from localspec.models.mirror import PypiChunks

DEFAULT_PATH = Path(str(resources.files("localspec") / "data" / "models.toml"))
_ID = re.compile(r"[a-z0-9][a-z0-9._-]*")
_QUANT = re.compile(r"[A-Z0-9_]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class CatalogError(LocalspecError):
    """models.toml is malformed; `problems` holds every one found, with file and line."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = tuple(problems)
        shown = "; ".join(str(p) for p in self.problems[:3])
        more = len(self.problems) - 3
        super().__init__(shown + (f" (and {more} more)" if more > 0 else ""))


def load_catalog(path: Path | None = None) -> Catalog:
    """Read and check a catalog (default: the one shipped with localspec)."""
    path = Path(path) if path else DEFAULT_PATH
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise CatalogError([Problem(str(path), f"cannot read: {e.strerror}")]) from None
    return parse_catalog(text, path)


def parse_catalog(text: str, path: Path = DEFAULT_PATH) -> Catalog:
    """Build a Catalog from TOML text; every problem is reported with its line."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        found = re.search(r"line (\d+)", str(e))
        if found:
            line: int | None = int(found.group(1))
        else:  # "at end of document": the last line
            line = text.count("\n") + 1 if "end of document" in str(e) else None
        message = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", str(e))
        raise CatalogError([Problem(path.name, message, line)]) from None
    reader = _Reader(path.name, _key_lines(text))
    catalog = reader.catalog(data)
    if reader.problems:
        raise CatalogError(reader.problems)
    return catalog


def default_catalog() -> Catalog:
    """The shipped catalog (parsed each time: a few milliseconds, and no global state)."""
    return load_catalog()


_TOP = {"default_family", "families", "models", "pairs", "mirrors"}
_FAMILY: dict[str, Any] = {"name": str, "architecture": str, "tokenizer": str}
_MODEL: dict[str, Any] = {
    "name": str,
    "family": str,
    "role": str,
    "params": (int, float),
    "shape": dict,
    "hub": str,
    "revision": str,
    "quants": dict,
    "drafts": list,
    "completes_code": bool,
    "architecture": str,
    "moe": dict,
    "hybrid": dict,
    "mtp_layers": int,
}
_MOE: dict[str, Any] = {"experts": int, "active": int, "expert_ff": int, "shared": bool}
_HYBRID: dict[str, Any] = {
    "attention_every": int,
    "key_heads": int,
    "value_heads": int,
    "head_dim": int,
    "conv_kernel": int,
}
_SHAPE: dict[str, Any] = {
    "layers": int,
    "kv_heads": int,
    "head_dim": int,
    "embedding": int,
    "vocab": int,
    "context": int,
    "tied_embeddings": bool,
}
_QUANT_KEYS: dict[str, Any] = {
    "file": str,
    "size": int,
    "sha256": str,
    "hub": str,
    "revision": str,
    "mirror": str,
}
_MIRROR: dict[str, Any] = {
    "pypi": str,
    "version": str,
    "parts": int,
    "file": str,
    "size": int,
    "sha256": str,
}
_PAIR: dict[str, Any] = {"target": str, "draft": str, "quant": str}


@dataclass
class _Reader:
    """Turns parsed TOML into dataclasses, collecting problems instead of stopping."""

    file: str
    lines: dict[tuple[str, ...], int]
    problems: list[Problem] = field(default_factory=list)

    def problem(self, where: tuple[str, ...], message: str) -> None:
        self.problems.append(Problem(self.file, message, self.line(where)))

    def line(self, where: tuple[str, ...]) -> int | None:
        # the key itself, else the nearest enclosing table or inline table we know of
        for n in range(len(where), 0, -1):
            if where[:n] in self.lines:
                return self.lines[where[:n]]
        return None

    def table(
        self, data: Any, where: tuple[str, ...], schema: dict[str, Any], required: Iterable[str]
    ) -> dict[str, Any] | None:
        """Check one table's keys and value types; returns it, or None if not a table."""
        name = ".".join(where)
        if not isinstance(data, dict):
            self.problem(where, f"{name} must be a table")
            return None
        for key, value in data.items():
            if key not in schema:
                self.problem(
                    (*where, key),
                    f"unknown key '{key}' in {name}{suggest(key, list(schema))}",
                )
            elif not isinstance(value, schema[key]) or (
                schema[key] is int and isinstance(value, bool)
            ):
                self.problem((*where, key), f"{name}.{key} must be {_type_name(schema[key])}")
        for key in required:
            if key not in data:
                self.problem(where, f"{name} is missing '{key}'")
        return data

    def catalog(self, data: dict[str, Any]) -> Catalog:
        for key in data:
            if key not in _TOP:
                self.problem((key,), f"unknown top-level key '{key}'{suggest(key, list(_TOP))}")
        mirrors = self.named(data, "mirrors", self.mirror)
        families = self.named(data, "families", self.family)
        family_ids = {f.id for f in families}
        models = self.named(data, "models", lambda i, d, w: self.model(i, d, w, mirrors))
        by_id = {m.id: m for m in models}
        # a model that failed its own checks was reported there: not again where named
        broken = set(data.get("models", {}) if isinstance(data.get("models"), dict) else ())
        broken -= set(by_id)
        for m in models:
            if m.family not in family_ids:
                self.problem(("models", m.id, "family"), f"{m.id}: unknown family '{m.family}'")
            for d in m.drafts:
                if d not in broken:
                    self.check_draft(("models", m.id, "drafts"), m, by_id.get(d), d)
        pairs = self.named(data, "pairs", self.pair)
        for p in pairs:
            where = ("pairs", p.id)
            target, draft = by_id.get(p.target), by_id.get(p.draft)
            if target is None:
                if p.target not in broken:
                    self.problem((*where, "target"), f"pair {p.id}: unknown model '{p.target}'")
            elif target.role != "target":
                self.problem((*where, "target"), f"pair {p.id}: {p.target} is not a target")
            elif all(q.name != p.quant for q in target.quants):
                self.problem((*where, "quant"), f"pair {p.id}: {p.target} has no {p.quant}")
            if p.draft not in broken:
                self.check_draft((*where, "draft"), target, draft, p.draft)
        default = data.get("default_family")
        if not isinstance(default, str) or default not in family_ids:
            self.problem(("default_family",), "default_family must name one of the families")
            default = ""
        return Catalog(tuple(families), tuple(models), tuple(pairs), default)

    def check_draft(
        self,
        where: tuple[str, ...],
        target: ModelEntry | None,
        draft: ModelEntry | None,
        draft_id: str,
    ) -> None:
        if draft is None:
            self.problem(where, f"unknown draft '{draft_id}'")
        elif draft.role != "draft":
            self.problem(where, f"{draft_id} is not a draft (its role is {draft.role})")
        elif target is not None and draft.family != target.family:
            self.problem(
                where,
                f"draft {draft_id} is in family {draft.family}, but its target {target.id} "
                f"is in family {target.family}: they do not share a tokenizer",
            )

    def named(
        self, data: dict[str, Any], section: str, build: Callable[[str, Any, tuple[str, ...]], Any]
    ) -> list[Any]:
        """Each entry of a `[section.<id>]` group, built and checked."""
        entries = data.get(section, {})
        if not isinstance(entries, dict):
            self.problem((section,), f"{section} must be a table of tables")
            return []
        built = []
        for entry_id, entry in entries.items():
            where = (section, entry_id)
            if not _ID.fullmatch(entry_id):
                self.problem(where, f"'{entry_id}' is not a valid id (lowercase, digits, . _ -)")
                continue
            value = build(entry_id, entry, where)
            if value is not None:
                built.append(value)
        return built

    def family(self, family_id: str, data: Any, where: tuple[str, ...]) -> Family | None:
        d = self.table(data, where, _FAMILY, _FAMILY)
        if d is None or not all(isinstance(d.get(k), str) for k in _FAMILY):
            return None
        return Family(family_id, d["name"], d["architecture"], d["tokenizer"])

    def mirror(self, mirror_id: str, data: Any, where: tuple[str, ...]) -> Mirror | None:
        d = self.table(data, where, _MIRROR, _MIRROR)
        if d is None or any(not isinstance(d.get(k), t) for k, t in _MIRROR.items()):
            return None
        if "{i}" not in d["pypi"]:
            self.problem((*where, "pypi"), f"mirrors.{mirror_id}.pypi must contain '{{i}}'")
        if not _SHA256.fullmatch(d["sha256"]):
            self.problem((*where, "sha256"), f"mirrors.{mirror_id}.sha256 is not 64 hex digits")
        chunks = PypiChunks(name=d["pypi"], version=d["version"], parts=d["parts"])
        return Mirror(mirror_id, chunks, d["file"], d["size"], d["sha256"])

    def model(
        self, model_id: str, data: Any, where: tuple[str, ...], mirrors: list[Mirror]
    ) -> ModelEntry | None:
        required = ("family", "role", "params", "shape", "quants")
        d = self.table(data, where, _MODEL, required)
        if d is None or any(not isinstance(d.get(k), _MODEL[k]) for k in required):
            return None
        if d["role"] not in ROLES:
            self.problem((*where, "role"), f"{model_id}: role must be 'target' or 'draft'")
        if d.get("drafts") and d["role"] != "target":
            self.problem((*where, "drafts"), f"{model_id}: only a target lists drafts")
        needed = set(_SHAPE) - {"tied_embeddings"}
        shape_data = self.table(d["shape"], (*where, "shape"), _SHAPE, needed)
        if shape_data is None or any(not isinstance(shape_data.get(k), int) for k in needed):
            return None
        hybrid = self.table(d.get("hybrid", {}), (*where, "hybrid"), _HYBRID, ())
        every = (hybrid or {}).get("attention_every", 1)
        if not isinstance(every, int) or every < 1:
            self.problem((*where, "hybrid"), f"{model_id}: attention_every must be 1 or more")
            every = 1
        shape = Shape(**shape_data, attention_every=every, recurrent=self.recurrent(hybrid, where))
        moe = None
        if "moe" in d:
            m = self.table(d["moe"], (*where, "moe"), _MOE, ("experts", "active", "expert_ff"))
            if m is not None and all(isinstance(m.get(k), int) for k in ("experts", "active")):
                moe = Moe(m["experts"], m["active"], int(m["expert_ff"]), bool(m.get("shared")))
        quants = []
        for name, q in d["quants"].items():
            quant = self.quant(model_id, name, q, (*where, "quants", name), d, mirrors)
            if quant is not None:
                quants.append(quant)
        if not d["quants"]:
            self.problem((*where, "quants"), f"{model_id} lists no quantizations")
        drafts = d.get("drafts", [])
        if not all(isinstance(x, str) for x in drafts):
            self.problem((*where, "drafts"), f"{model_id}: drafts must be model ids")
            drafts = []
        return ModelEntry(
            id=model_id,
            name=d.get("name", model_id),
            family=d["family"],
            role=d["role"],
            params=float(d["params"]),
            shape=shape,
            quants=tuple(sorted(quants, key=lambda q: q.rank)),
            drafts=tuple(drafts),
            completes_code=bool(d.get("completes_code", False)),
            moe=moe,
            mtp_layers=int(d.get("mtp_layers", 0)),
            architecture=d.get("architecture"),
        )

    def recurrent(self, hybrid: dict[str, Any] | None, where: tuple[str, ...]) -> Recurrent | None:
        """A hybrid's recurrent layers, where the table gives all of what sizes their
        state (none of it: the planner learns the state from the file)."""
        keys = ("key_heads", "value_heads", "head_dim", "conv_kernel")
        given = [(hybrid or {}).get(k) for k in keys]
        if all(v is None for v in given):
            return None
        numbers = [v for v in given if isinstance(v, int) and not isinstance(v, bool) and v > 0]
        if len(numbers) < len(keys):
            name = ".".join((*where, "hybrid"))
            self.problem((*where, "hybrid"), f"{name} needs {', '.join(keys)}: positive integers")
            return None
        return Recurrent(*numbers)

    def quant(
        self,
        model_id: str,
        name: str,
        data: Any,
        where: tuple[str, ...],
        model: dict[str, Any],
        mirrors: list[Mirror],
    ) -> Quant | None:
        if not _QUANT.fullmatch(name):
            self.problem(where, f"{model_id}: '{name}' is not a quantization name (e.g. Q4_K_M)")
        d = self.table(data, where, _QUANT_KEYS, ("size",))
        if d is None or not isinstance(d.get("size"), int):
            return None
        hub = None
        repo = d.get("hub", model.get("hub"))
        if "file" in d:
            if repo is None:
                self.problem(where, f"{model_id} {name}: a file needs a hub repo ('hub = ...')")
            else:
                hub = HubFile(repo, d["file"], d.get("revision", model.get("revision", "main")))
        mirror = None
        if "mirror" in d:
            mirror = next((m for m in mirrors if m.id == d["mirror"]), None)
            if mirror is None:
                self.problem(
                    (*where, "mirror"), f"{model_id} {name}: unknown mirror '{d['mirror']}'"
                )
        if "file" not in d and "mirror" not in d:
            self.problem(where, f"{model_id} {name}: no source (give 'file' or 'mirror')")
        sha = d.get("sha256")
        if sha is not None and not _SHA256.fullmatch(sha):
            self.problem((*where, "sha256"), f"{model_id} {name}: sha256 is not 64 hex digits")
        return Quant(name, d["size"], hub, mirror, sha)

    def pair(self, pair_id: str, data: Any, where: tuple[str, ...]) -> PairEntry | None:
        d = self.table(data, where, _PAIR, ("target", "draft"))
        if d is None or not all(isinstance(d.get(k), str) for k in ("target", "draft")):
            return None
        return PairEntry(pair_id, d["target"], d["draft"], d.get("quant", DEFAULT_QUANT).upper())


def _type_name(t: Any) -> str:
    names = {
        str: "a string",
        int: "an integer",
        bool: "true or false",
        dict: "a table",
        list: "a list",
        (int, float): "a number",
    }
    return names.get(t, str(t))


_HEADER = re.compile(r"^\s*\[\[?\s*(.+?)\s*\]\]?\s*(#.*)?$")
_PART = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
_KEY = re.compile(rf"^\s*({_PART}(?:\s*\.\s*{_PART})*)\s*=")


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Line numbers of tables and keys, by dotted path: tomllib does not keep them, and a
    problem without its line is hard to find in a long catalog."""
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), 1):
        if m := _HEADER.match(line):
            table = _split_key(m.group(1))
            for n in range(1, len(table) + 1):
                lines.setdefault(table[:n], number)
        elif m := _KEY.match(line):
            lines.setdefault((*table, *_split_key(m.group(1))), number)
    return lines


def _split_key(key: str) -> tuple[str, ...]:
    parts = re.findall(r'"([^"]*)"|\'([^\']*)\'|([A-Za-z0-9_-]+)', key)
    return tuple(next(p for p in part if p) if any(part) else "" for part in parts)
