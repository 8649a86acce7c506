"""`localspec models` (placeholder until its issue lands)."""

from __future__ import annotations

import argparse

from ..errors import LocalspecError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="(not yet available)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise LocalspecError("'models' is not available yet")
