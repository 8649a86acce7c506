"""localspec: speculative decoding for local GGUF models through llama.cpp."""

# llama.cpp's library is loaded before numpy's: a CUDA build segfaulted at model load
# whenever numpy had been imported first (seen on an H100, docs/gpu-overhead.md).
try:
    import llama_cpp  # noqa: F401
except ImportError:  # the catalog, planner and downloads work without it
    pass
