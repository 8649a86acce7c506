"""Speculative decoding: the engine loop, verification, sampling, drafters, adaptive γ.

Nothing here reads files, catalogs, HTTP or a UI: it sees models only through
`localspec.backends.base.Model`.
"""
