#!/usr/bin/env python3
"""Make the reference CPU scenario's target: an F16 copy of the 1.5B Q4_K_M target.

An F16 1.5B decodes at ~4.4 tok/s on a 2-core CPU against the 0.5B draft's ~16.6: a
draft/target cost ratio (~0.26) like a 7B-class target with a 0.5B draft on a laptop,
which the Q4_K_M pair (ratio ~0.6) cannot show. The copy is made with llama.cpp's own
quantize API (type F16, requantizing allowed, so Q4_K/Q6_K tensors are dequantized):
the weights carry no more information than the Q4_K_M file, but cost what F16 costs.

    .venv/bin/python scripts/make_f16.py [SOURCE.gguf | catalog-id] [--out PATH] [--force]

Writes …-f16.gguf into the model store (localspec.paths.models_dir(), where the mirror
puts the pair) unless --out says otherwise; never into the repository.
The file appears atomically (written under a temporary name, then renamed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

DEFAULT_SOURCE = "qwen2.5-coder-1.5b-instruct"
Q4_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
REPO = Path(__file__).resolve().parent.parent


def resolve_source(spec: str) -> Path:
    """A .gguf path, or a catalog id; before the catalog knows of an install, the default
    target's file in the model store."""
    from localspec.errors import LocalspecError
    from localspec.paths import models_dir

    path = Path(spec).expanduser()
    if path.suffix == ".gguf" or path.exists():
        return path
    try:
        from localspec.models.resolve import resolve_installed

        return Path(resolve_installed(spec))
    except ImportError:
        pass
    except LocalspecError as e:
        if spec != DEFAULT_SOURCE or not (models_dir() / Q4_FILE).is_file():
            sys.exit(f"make_f16: {e}")
    if spec != DEFAULT_SOURCE:
        sys.exit(f"make_f16: {spec} is not a .gguf path (and there is no catalog yet)")
    return models_dir() / Q4_FILE


def f16_name(source: Path) -> str:
    stem = source.stem
    for suffix in ("-q4_k_m", "-Q4_K_M", ".Q4_K_M", "-q8_0", "-Q8_0"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return f"{stem}-f16.gguf"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "source",
        nargs="?",
        default=DEFAULT_SOURCE,
        help=f"a .gguf file or catalog id (default: {DEFAULT_SOURCE})",
    )
    p.add_argument("--out", type=Path, help="where to write (default: the model store)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--force", action="store_true", help="rewrite an existing output")
    args = p.parse_args()

    source = resolve_source(args.source)
    if not source.is_file():
        sys.exit(f"make_f16: source not found: {source} (run ./scripts/setup.sh)")
    from localspec.backends.quantize import F16, requantize
    from localspec.errors import LocalspecError
    from localspec.paths import models_dir

    # the store, not the source's folder: a hub download's folder is the HF cache's
    out = (args.out or models_dir() / f16_name(source)).expanduser().resolve()
    if out.is_relative_to(REPO):
        sys.exit(f"make_f16: {out} is inside the repository; model files stay out of it")
    if out.exists() and not args.force:
        print(out)
        print(f"make_f16: {out.name} exists (--force to rewrite)", file=sys.stderr)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"make_f16: {source.name} -> {out} (about a minute, ~3 GB)", file=sys.stderr)
    started = time.perf_counter()
    try:
        requantize(source, out, F16, threads=args.threads)
    except LocalspecError as e:
        sys.exit(f"make_f16: {e}")
    size = out.stat().st_size / 1e9
    print(f"make_f16: wrote {size:.2f} GB in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    print(out)  # stdout: the path alone, for scripts
    return 0


if __name__ == "__main__":
    sys.exit(main())
