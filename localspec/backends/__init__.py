"""Models as the decoder sees them: the `Model` interface, llama.cpp, toy models."""

from __future__ import annotations

import contextlib


def load_llama_library() -> None:
    """Load llama.cpp's shared library before anything imports numpy: a CUDA build
    segfaulted at model load whenever numpy had been loaded first (docs/gpu-overhead.md).
    Commands that load models call this first; the catalog and downloads never need it."""
    with contextlib.suppress(ImportError):
        import llama_cpp  # noqa: F401
