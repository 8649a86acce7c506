"""`localspec bench` (placeholder until its issue lands)."""

from __future__ import annotations

import argparse

from ..errors import LocalspecError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="(not yet available)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise LocalspecError("'bench' is not available yet")
