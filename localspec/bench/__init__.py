"""`localspec bench`: modes run side by side on a prompt suite, and the policy replay.

From the bottom up: `suite` (the prompts), `specbench` (Spec-Bench's questions as a
suite: a seeded sample per category), `modes` (what is compared, and the engine each
runs), `costs` (T(k) and the draft's step), `machine` (the CPU, its load, each run's share
of it), `peer` (llama.cpp's own binaries), `audit` (where an answer differs from plain
decoding: numerics or a defect), `results` (the report as data and its versioned JSON),
`runner` (the run loop), `markdown` and `chart` (rendered from a report), `report` (the
files: the JSON first, the rest rendered from it). `replay` replays drafting policies on
recorded answers.
"""
