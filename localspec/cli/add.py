"""`localspec add`: register a local GGUF file as a model (family read from its header)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from localspec.errors import LocalspecError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "add",
        help="register a local .gguf file as a model",
        description="Register a local GGUF file so that `run`, `plan --installed` and the "
        "chat can use it by id. Its family, and so which drafts pair with it, is read from "
        "its header. The file stays where it is.",
    )
    p.add_argument("path", help="the .gguf file (the first part of a split GGUF)")
    p.add_argument("--id", dest="model_id", help="the id to use (default: the file name)")
    p.add_argument(
        "--role", choices=("target", "draft"), help="default: draft below 1 GB, else target"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localspec.backends.gguf import is_assistant, split_parts
    from localspec.models.catalog_file import default_catalog
    from localspec.models.download import register as register_file
    from localspec.models.store import FileRecord, all_installed

    path = Path(args.path).expanduser().resolve()
    if not path.is_file():
        raise LocalspecError(f"model file not found: {args.path}")
    if args.model_id is not None and not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", args.model_id):
        raise LocalspecError("--id: use lowercase letters, digits, '.', '_' and '-'")
    shards = split_parts(path)
    assistant = is_assistant(path)
    if assistant and args.role == "target":
        raise LocalspecError(f"{path.name} is a Gemma 4 assistant: a drafter, not a target")
    catalog = default_catalog()
    # a local file is trusted as it is: not hashed (it never came over a network)
    records = [FileRecord.of(p, "") for p in shards]
    entry = register_file(records, catalog, model_id=args.model_id, role=args.role)
    info = entry.info
    assert info is not None
    family = catalog.family(entry.family).name if entry.family else None
    print(
        f"added {entry.model}: {info.name}, {entry.quant}, {info.layers} layers, "
        f"{info.vocab} tokens, as a {entry.role}"
    )
    if assistant:  # it reads its target's cache: it pairs with the Gemma 4 it was made for
        print(
            f"a Gemma 4 assistant: it drafts beside the Gemma 4 target it was made for "
            f"(localspec run --target TARGET --draft {entry.model})"
        )
        return 0
    if family is None:
        print(
            "its vocabulary matches no catalog family: it can draft (or be drafted for) "
            "only with --draft and a model of the same vocabulary"
        )
        return 0
    other = "draft" if entry.role == "target" else "target"
    mates = [m for m in catalog.models if m.family == entry.family and m.role == other]
    have = {e.model for e in all_installed()}
    names = ", ".join(m.id + (" (installed)" if m.id in have else "") for m in mates)
    print(f"family: {family}; {other}s that pair with it: {names or 'none in the catalog'}")
    return 0
