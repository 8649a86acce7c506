"""`localspec models`: the catalog, what is installed, and what fits this machine."""

from __future__ import annotations

import argparse
import json
from typing import Any

from localspec.cli.plan import add_hardware_options, hardware_from


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help="the catalog: installed, size, fits this machine?",
        description="List the catalog's models, with what is installed, "
        "each file's size, and whether it fits this machine (or a what-if "
        "one): wholly on the GPU, split GPU+CPU, on the CPU, or not at all.",
    )
    p.add_argument("--family", "-f", help="only this family")
    p.add_argument("--installed", action="store_true", help="only installed models")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_hardware_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localspec.models import store
    from localspec.models.catalog import DEFAULT_QUANT
    from localspec.models.catalog_file import default_catalog
    from localspec.models.hardware import fmt_size
    from localspec.models.inventory import ModelFile, take_inventory

    catalog = default_catalog()
    if args.family:
        catalog.family(args.family)  # one-line error for an unknown family
    inventory = take_inventory(catalog, store.all_installed(), hardware_from(args))
    installed_ids = {f.id for f in inventory.files if f.model and f.installed}
    machine = inventory.machine

    def shown(f: ModelFile) -> bool:
        if args.family and f.family != args.family:
            return False
        if f.model is None or f.installed is not None:
            return True
        if args.installed:
            return False
        if not f.is_default_quant and f.id in installed_ids:
            return False  # an installed model shows its installed quantizations only
        has_default = any(q.name == DEFAULT_QUANT for q in f.model.quants)
        # the table shows one row per model; --json shows them all
        return f.is_default_quant or not has_default or args.json

    rows: list[dict[str, Any]] = [
        {
            "id": f.id,
            "family": f.family,
            "role": f.role,
            "quant": f.quant,
            "size": f.size,
            "installed": f.installed.source if f.installed else None,
            "path": str(f.installed.path) if f.installed else None,
            "fits": f.fits,
            "completes_code": bool(f.model and f.model.completes_code),
        }
        for f in inventory.files
        if shown(f)
    ]
    if args.json:
        print(json.dumps({"machine": machine, "models": rows}, indent=2))
        return 0
    print(f"this machine: {machine}")
    header = ("MODEL", "ROLE", "QUANT", "SIZE", "INSTALLED", "FITS")
    table = [header] + [
        (r["id"], r["role"], r["quant"], fmt_size(r["size"]), r["installed"] or "-", r["fits"])
        for r in rows
    ]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    family = None
    for r, row in zip([None, *rows], table, strict=True):
        if r is not None and r["family"] != family:
            family = r["family"]
            name = catalog.family(family).name if family and catalog.find(r["id"]) else family
            print(
                f"\n{name or 'other'}" + (" (default)" if family == catalog.default_family else "")
            )
        cells = (str(c).ljust(w) for c, w in zip(row, widths, strict=True))
        print(("  " + "  ".join(cells)).rstrip())
    print(
        "\nFITS: alone at a 2048-token context, with headroom. "
        "`localspec pull ID[:QUANT]` downloads one; `localspec plan` picks a pair.\n"
        "Code completion (serve's /infill): the Qwen2.5-Coder models, the base ones best "
        "(`localspec pull coder-fim`)."
    )
    return 0
