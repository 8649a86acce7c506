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
    from localspec.models.catalog import DEFAULT_QUANT, default_catalog
    from localspec.models.hardware import fmt_size
    from localspec.models.planner import Weights, budget

    catalog = default_catalog()
    if args.family:
        catalog.family(args.family)  # one-line error for an unknown family
    hw = hardware_from(args)
    b = budget(hw)
    installed = store.all_installed()
    have = {(e.model, e.quant): e for e in installed}
    rows: list[dict[str, Any]] = []
    for m in catalog.models:
        if args.family and m.family != args.family:
            continue
        for q in m.quants:
            entry = have.get((m.id, q.name))
            if args.installed and entry is None:
                continue
            if (
                entry is None
                and not args.installed
                and q.name != DEFAULT_QUANT
                and any((m.id, x.name) in have for x in m.quants)
            ):
                continue  # an installed model shows its installed quantizations only
            if (
                entry is None
                and q.name != DEFAULT_QUANT
                and any(x.name == DEFAULT_QUANT for x in m.quants)
                and not args.json
            ):
                continue  # the table shows one row per model; --json shows them all
            weights = (
                Weights.from_gguf(entry.info) if entry and entry.info else Weights.estimate(m, q)
            )
            rows.append(
                {
                    "id": m.id,
                    "family": m.family,
                    "role": m.role,
                    "quant": q.name,
                    "size": entry.size if entry else q.size,
                    "installed": entry.source if entry else None,
                    "path": str(entry.path) if entry else None,
                    "fits": fits(weights, hw, b),
                }
            )
    for e in installed:
        if e.source == "local" or catalog.find(e.model) is None:
            if args.family and e.family != args.family:
                continue
            rows.append(
                {
                    "id": e.model,
                    "family": e.family,
                    "role": e.role,
                    "quant": e.quant,
                    "size": e.size,
                    "installed": e.source,
                    "path": str(e.path),
                    "fits": fits(Weights.from_gguf(e.info), hw, b) if e.info else "?",
                }
            )
    if args.json:
        print(json.dumps({"machine": hw.describe(), "models": rows}, indent=2))
        return 0
    print(f"this machine: {hw.describe()}")
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
        "`localspec pull ID[:QUANT]` downloads one; `localspec plan` picks a pair."
    )
    return 0


def fits(weights, hw, b) -> str:  # (Weights, Hardware, Budget) -> str
    """'GPU' (wholly), 'GPU+CPU', 'CPU', or 'no'."""
    from localspec.models.planner import MIN_CTX, place

    p = place(weights, None, MIN_CTX, b, hw)
    if p is None:
        return "no"
    if not hw.gpu_usable or p.target_layers == 0:
        return "CPU"
    return "GPU" if p.target_layers > len(weights.layers) else "GPU+CPU"
