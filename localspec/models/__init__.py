"""Model management: the catalog, installed files, downloads, the machine and the planner.

Layers, bottom up (each imports only those below it):
- `catalog` (the data) and `catalog_file` (reading models.toml); `store` (install
  records and sha256 checks; GGUF headers are `localspec.backends.gguf`); `mirror`.
- `hub` (the Hugging Face hub client) and `resolve` (a spec to an installed file);
  `download` (pull and register) on top of both.
- `hardware`; `memory` and `speed` (what a model costs); `candidates`, `planner` (the
  decisions, as data) and `explain` (their sentences); `inventory` (what to list) and
  `pairing` (the pair to load when none is named).
"""
