"""Model management: the catalog, installed files, downloads, the machine and the planner.

Layers, bottom up: `catalog` (data) and `store` (what is on disk) know nothing of
each other's callers; `resolve` finds a file for a spec; `download` fetches with both;
`hardware`, `planner` and `pairing` decide what fits.
"""
