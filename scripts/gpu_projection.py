#!/usr/bin/env python3
"""Project what `auto` gains on a GPU: the recorded greedy answers of the real pair
(scripts/replay.py record) replayed at the costs scripts/gpu_profile.py measured there.

Acceptance comes from the recording (the Qwen2.5-Coder 1.5B target and its 0.5B draft),
costs from the profile: a 7B or 32B target agrees with the 0.5B draft less often than the
1.5B does, so read the larger targets' rows as what their costs allow at the 1.5B's
acceptance, not as their own figures.

    python scripts/gpu_projection.py --profile docs/bench/gpu/h200-profile.json \\
        docs/bench/replay/specbench-f16.json docs/bench/replay/f16.json [--slower 4]

`--slower F` asks what a card whose memory reads the weights F times slower would see
(a consumer card: less bandwidth, similar launch costs): every pass of a model gets
(F - 1) x its weight bytes / the profile's bandwidth added, once per pass (so a catch-up
of 32 tokens adds a 32nd of it per token). The bandwidth is the slope of a least-squares
line of the targets' T(1) over their file sizes; the rest of each pass stays as measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from localspec.bench.replay import Costs, Recording, profile_costs, run_policy
from localspec.drafting import GAMMA_MAX

TARGETS = ("1.5b", "3b", "7b", "14b", "32b")
FIXED = tuple(f"draft-g{g}" for g in range(1, GAMMA_MAX + 1))


def medians(prompts: dict, costs: Costs, policy: str) -> tuple[dict[str, float], float, float]:
    """(median per category, median over prompts, slowest prompt) for one policy."""
    by = {n: run_policy(Recording(r), costs, policy).speedup for n, r in prompts.items()}
    cats = sorted({r["category"] for r in prompts.values()})
    per = {
        c: statistics.median(s for n, s in by.items() if prompts[n]["category"] == c) for c in cats
    }
    return per, statistics.median(by.values()), min(by.values())


def fit(profile: dict) -> tuple[float, float]:
    """(seconds, seconds per byte): the least-squares line of the targets' T(1) over their
    file sizes, a pass's fixed cost and the profile's read of one byte."""
    targets = [m for m in profile["models"].values() if "step_ms" not in m]
    line = statistics.linear_regression(
        [m["file_bytes"] for m in targets], [m["verify_ms"][0] / 1e3 for m in targets]
    )
    return line.intercept, line.slope


def slower(costs: Costs, profile: dict, target: str, draft: str, factor: float) -> Costs:
    """`costs` on a card that reads weights `factor` times slower (see the docstring)."""
    if factor == 1:
        return costs
    per_byte = (factor - 1) * fit(profile)[1]
    t = per_byte * profile["models"][target]["file_bytes"]
    d = per_byte * profile["models"][draft]["file_bytes"]
    return Costs(
        [x + t for x in costs.verify_s],
        costs.draft_s + d,
        costs.catchup_s + d / 32,
        None if costs.read_s is None else costs.read_s + d / 512,
    )


def project(recording: Path, profile: dict, draft: str, factor: float = 1.0) -> str:
    prompts = json.loads(recording.read_text())["prompts"]
    lines = [
        f"### {recording.name} ({len(prompts)} answers)"
        + (f", weights read {factor:g}x slower" if factor != 1 else ""),
        "",
        "| target | T(1) ms | auto: median over categories | all prompts | slowest "
        "| best fixed γ (all) | oracle (all) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in TARGETS:
        target = f"qwen2.5-coder-{size}-instruct"
        if target not in profile["models"]:
            continue
        costs = slower(profile_costs(profile, target, draft), profile, target, draft, factor)
        per, all_, slowest = medians(prompts, costs, "auto")
        fixed = {p: medians(prompts, costs, p)[1] for p in FIXED}
        best = max(fixed, key=lambda p: fixed[p])
        oracle = medians(prompts, costs, "oracle")[1]
        over_categories = statistics.median(per.values())
        gamma = best.removeprefix("draft-g")
        lines.append(
            f"| {size.upper()} | {costs.verify_s[0] * 1e3:.2f} | {over_categories:.2f}× "
            f"| {all_:.2f}× | {slowest:.2f}× | {fixed[best]:.2f}× (γ {gamma}) | {oracle:.2f}× |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recordings", type=Path, nargs="+")
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--slower", type=float, default=1.0, help="weights read F times slower")
    args = parser.parse_args()
    profile = json.loads(args.profile.read_text())
    fixed, per_byte = fit(profile)
    print(
        f"T(1) = {fixed * 1e3:.2f} ms + file bytes / {1 / per_byte / 1e12:.2f} TB/s "
        "(least squares over the profile's targets)\n"
    )
    for recording in args.recordings:
        print(project(recording, profile, args.draft_model, args.slower), end="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
