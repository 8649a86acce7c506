"""JSON schemas made plain for llama.cpp's schema-to-grammar converter (its Python port):
local `$ref`s as pydantic and zod write them (`$defs`, `definitions`, a recursive model
at the root) and as a schema of several tools' schemas needs them, and boolean
subschemas (`true`: any value), which the converter cannot read."""

from __future__ import annotations

import re
from typing import Any, TypeGuard

from localspec.errors import LocalspecError


class SchemaRefError(LocalspecError):
    """A `$ref` that points nowhere in its schema."""


def flat_refs(schema: Any, reserved: frozenset[str] = frozenset()) -> Any:
    """`schema` with each local `$ref` pointing at an entry of the root's `$defs` of a
    name of its own (none of `reserved`: the converter's own rules), and the root not a
    `$ref` itself: the converter's port neither looks beside a `$ref` (pydantic's
    recursive model, `{"$defs": .., "$ref": ..}`, was "'#/$defs/Tree'") nor tells apart
    two definitions of one name (two tools' `Addr`, or a `string` and its own rule)."""
    if not isinstance(schema, dict) or not has_local_refs(schema):
        return schema
    names: dict[str, str] = {}  # pointer -> its name in the new $defs
    defs: dict[str, Any] = {}

    def target(ref: str) -> Any:
        node: Any = schema
        for part in ref[1:].split("/")[1:]:
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            elif isinstance(node, dict) and key in node:
                node = node[key]
            else:
                raise SchemaRefError(f"$ref {ref!r} points nowhere in it")
        return node

    def name_of(ref: str) -> str:
        if ref not in names:
            stem = re.sub(r"[^A-Za-z0-9-]+", "-", ref.rsplit("/", 1)[-1]).strip("-") or "def"
            taken = {*names.values(), *reserved}
            names[ref] = next(
                n for i in range(len(taken) + 1) if (n := f"{stem}{i or ''}") not in taken
            )
            defs[names[ref]] = rewrite(target(ref))
        return names[ref]

    def rewrite(node: Any) -> Any:
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if is_pointer(ref):
            return {**node, "$ref": f"#/$defs/{name_of(ref)}"}
        return {k: rewrite(v) for k, v in node.items()}

    root, seen = schema, set()
    while isinstance(root, dict) and is_pointer(ref := root.get("$ref")):
        if ref in seen:
            raise SchemaRefError(f"$ref {ref!r} refers only to itself")
        seen.add(ref)
        root = target(ref)  # the root's own definition, inlined
    if not isinstance(root, dict):
        raise SchemaRefError(f"the root's $ref points at {root!r}, not a schema")
    return {**rewrite(root), "$defs": defs}


def has_local_refs(node: Any) -> bool:
    if isinstance(node, list):
        return any(has_local_refs(v) for v in node)
    if not isinstance(node, dict):
        return False
    return is_pointer(node.get("$ref")) or any(has_local_refs(v) for v in node.values())


def is_pointer(ref: object) -> TypeGuard[str]:
    """A JSON pointer into this schema ("#", "#/$defs/X"; not an anchor, "#x", or a URL)."""
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))


def rebased(schema: Any, root: str) -> Any:
    """`schema` with its local `$ref`s ("#", "#/$defs/Addr": pydantic's, zod's) made to
    point under `root`, where it will live in a schema of several."""
    if isinstance(schema, list):
        return [rebased(v, root) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: rebased(v, root) for k, v in schema.items()}
    ref = schema.get("$ref")
    if is_pointer(ref):
        out["$ref"] = root + ref[1:]
    return out


# the keywords whose values are subschemas: maps of them, lists of them, or one
SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
SUBSCHEMA_ONE = ("items", "additionalProperties", "contains", "not", "propertyNames")


def plain_subschemas(schema: Any, where: str = "schema") -> Any:
    """`schema` with each subschema as the converter reads it: a boolean one, `true` (any
    value), as `{}`, and a `false` property (it never appears) left out, where a required
    one is a SchemaRefError (no answer could follow the schema); an array's `items: {}`
    (pydantic's `list[Any]`) left out, as the converter takes an empty one for none and
    looks for `prefixItems`. `items: false` and a boolean `additionalProperties` stay."""
    if schema is True:
        return {}
    if schema is False:
        raise SchemaRefError(f"{where} is false: no value follows it")
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SUBSCHEMA_MAPS:
        if isinstance(entries := out.get(key), dict):
            kept = {n: v for n, v in entries.items() if not (key == "properties" and v is False)}
            if gone := set(entries) - set(kept) & set(out.get("required") or ()):
                raise SchemaRefError(f"{where}.properties.{min(gone)} is false but required")
            out[key] = {n: plain_subschemas(v, f"{where}.{key}.{n}") for n, v in kept.items()}
    for key in SUBSCHEMA_LISTS:
        if isinstance(items := out.get(key), list):
            out[key] = [plain_subschemas(v, f"{where}.{key}[{i}]") for i, v in enumerate(items)]
    for key in SUBSCHEMA_ONE:
        value = out.get(key)
        if isinstance(value, dict) or (value is True and key != "additionalProperties"):
            out[key] = plain_subschemas(value, f"{where}.{key}")
    if out.get("items") == {}:
        del out["items"]
    return out
