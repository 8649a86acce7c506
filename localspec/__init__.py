"""localspec: speculative decoding for local GGUF models through llama.cpp.

The packages, from the bottom up:

- `localspec.decoding`: the algorithm (draft, verify, emit); knows nothing of files or UIs.
- `localspec.backends`: the `Model` interface and its llama.cpp and toy implementations.
- `localspec.models`: the catalog, installed files, downloads, the machine, the planner.
- `localspec.bench`: side-by-side benchmarks and the policy replay.
- `localspec.session`, `settings`, `conversations`: what the CLI and the chat share.
- `localspec.cli`: the `localspec` command. The chat lives in the top-level `tui` package.
"""


def version() -> str:
    """localspec's version and llama-cpp-python's (whose llama.cpp decodes), for bug reports."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    def of(package: str) -> str:
        try:
            return installed(package)
        except PackageNotFoundError:
            return "not installed"

    return f"localspec {of('localspec')} (llama-cpp-python {of('llama-cpp-python')})"
