"""localspec: speculative decoding for local GGUF models through llama.cpp."""

import contextlib

# llama.cpp's library is loaded before numpy's: a CUDA build segfaulted at model load
# whenever numpy had been imported first (seen on an H100, docs/gpu-overhead.md).
with contextlib.suppress(ImportError):  # the catalog and downloads work without it
    import llama_cpp  # noqa: F401
