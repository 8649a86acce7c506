#!/usr/bin/env python3
"""Replay greedy drafting policies on a recording, without timing noise.

On a shared machine two runs of the same bench differ by ±20%, more than most policy
changes gain. Greedy speculation is deterministic, though: what a round accepts depends
only on the text so far. So `record` stores, per bench prompt, the target's greedy answer
y, the draft model's greedy guess and top-2 confidence after every prefix of y (one
batched pass), the draft's confidences along its own path after each miss, and the costs
measured on this machine: T(k), c, and the draft's catch-up per token. `replay` then runs
a policy over every prompt with those costs: `auto` is the real AdaptiveDrafter (its
choose, p_min and accept), fed the recorded outcomes instead of model calls.

    .venv/bin/python scripts/replay.py record -t TARGET.gguf -d DRAFT.gguf --out rec.json
    .venv/bin/python scripts/replay.py replay rec.json [--policies auto,draft-g4,oracle]
        [--costs "T1,T2,...,T9;c;catchup"]   # seconds; default: the recorded ones
        [--profile gpu.json --target-model ID --draft-model ID]  # scripts/gpu_profile.py's

`oracle` is a bound: the fastest rounds any drafter of these sources could pick, knowing
what the target will accept.

The replay models what the engine pays (a stopped draft still paid the pass that saw the
low confidence; the draft's cache catches up in one batch) but not Python's own time per
round, nor the drift of a shared machine's costs during a bench run: compare policies
with it, and measure the one you keep with `localspec bench`. Two more simplifications:
it drafts from n-grams and the draft model only (no suffix index), and `auto` knows the
draft model's step and catch-up costs from the start, where the engine guesses them
until the draft model's first use (a catch-up token at half a step, about twice this
CPU's rate): with the engine's catch-up guess the F16 code-bench recording replays at 1.40×
instead of 1.53×, and Spec-Bench's Q4_K_M slowest prompt at 0.93× instead of 0.85×.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.bench.costs import measure_costs, time_pass
from localspec.bench.suite import BenchPrompt, load_prompts
from localspec.decoding.adaptive import AdaptiveDrafter
from localspec.decoding.drafters import NgramIndex, NoDrafter, Outcome, p_min_at
from localspec.decoding.engine import Engine
from localspec.decoding.idle import TIMING, free_guesses
from localspec.decoding.sampling import top2
from localspec.drafting import GAMMA_MAX
from localspec.session import Session

MAX_TOKENS = 128


# --- record --------------------------------------------------------------------------
def record(
    target: LlamaModel,
    draft: LlamaModel,
    bench_prompts: Sequence[BenchPrompt],
    max_tokens: int = MAX_TOKENS,
    with_costs: bool = True,
) -> dict:
    session = Session(Engine(target, NoDrafter(), 0))
    prompts: dict[str, dict] = {}
    for p in bench_prompts:
        prompt = session.render([{"role": "user", "content": p.prompt}])
        # cold, as the bench runs: a reused prefix splits the batches differently, and
        # at a near-tie that alone can change the greedy answer
        target.reset()
        y = greedy_answer(target, prompt, max_tokens)
        draft.reset()
        draft.evaluate(prompt, 1)
        rows = draft.evaluate(prompt + y, len(y) + 1).copy()
        guess, conf = zip(*(top2(row) for row in rows), strict=True)
        after_miss = {
            i: own_path(draft, [*prompt, *y[:i], guess[i]])
            for i in range(len(y))
            if guess[i] != y[i]
        }
        prompts[p.name] = {
            "category": p.category,
            "prompt": prompt,
            "y": y,
            "guess": list(guess),
            "conf": list(conf),
            "after_miss": after_miss,
        }
        agree = np.mean([g == x for g, x in zip(guess, y, strict=False)])
        print(f"{p.name:26} {len(y)} tokens, draft agrees on {agree:.0%}", flush=True)
    if not with_costs:
        return {"prompts": prompts}
    first: list[int] = prompts[next(iter(prompts))]["prompt"]
    costs = measure_costs(target, draft, first, k_max=GAMMA_MAX + 1)
    return {
        "costs": {
            "verify_s": costs.verify_s,
            "draft_s": costs.draft_s,
            "catchup_s": catchup_per_token(draft, first),
        },
        "prompts": prompts,
    }


def greedy_answer(target: LlamaModel, prompt: list[int], max_tokens: int) -> list[int]:
    y: list[int] = []
    logits = target.evaluate(prompt, 1)
    while len(y) < max_tokens and not target.is_eog(x := int(np.argmax(logits[0]))):
        y.append(x)
        logits = target.evaluate(prompt + y, 1)
    return y


def own_path(draft: LlamaModel, seq: list[int]) -> list[float]:
    """The draft's confidences along its own greedy path after a wrong guess."""
    confs = []
    for _ in range(GAMMA_MAX - 1):
        token, conf = top2(draft.evaluate(seq, 1)[0].copy())
        confs.append(conf)
        seq = [*seq, token]
    return confs


def catchup_per_token(draft: LlamaModel, prompt: list[int], reps: int = 5) -> float:
    """Seconds per token of a 32-token catch-up batch (one logits row), beyond one step."""
    one, batch = (time_pass(draft, prompt, k, reps, n_logits=1).llama_s for k in (1, 33))
    return (batch - one) / 32


# --- replay --------------------------------------------------------------------------
LONG_READ = 64  # a catch-up longer than this runs at `read_s` a token, where measured


@dataclass(frozen=True)
class Costs:
    verify_s: list[float]  # T(k) for k = 1.., seconds
    draft_s: float  # c
    catchup_s: float  # per token of a catch-up batch (32 tokens)
    read_s: float | None = None  # per token of a long read (512 tokens; a GPU's is cheaper)

    def read(self, n: int) -> float:
        """Seconds for the draft model to read n tokens it has not seen."""
        rate = self.read_s if self.read_s is not None and n > LONG_READ else self.catchup_s
        return n * rate


class Recording:
    """One prompt's recording: what the draft model would propose from position t."""

    def __init__(self, rec: dict) -> None:
        self.prompt, self.y = rec["prompt"], rec["y"]
        self.guess, self.conf = rec["guess"], rec["conf"]
        self.after_miss = {int(k): v for k, v in rec["after_miss"].items()}

    def draft(self, start: int, n: int, p_min: float | Sequence[float]) -> tuple[int, int, bool]:
        """(drafted, accepted, stopped early) for the draft model drafting up to n tokens
        from position `start` of y; it stops at a confidence below p_min (one threshold,
        or one per drafted position)."""
        accepted, miss = 0, None
        for j in range(n):
            pos = start + j
            if miss is None:
                conf = self.conf[pos] if pos < len(self.conf) else 0.0
            else:
                path = self.after_miss.get(start + miss, [])
                conf = path[j - miss - 1] if j - miss - 1 < len(path) else 0.0
            if conf < p_min_at(p_min, j):
                return j, accepted, True
            if miss is None and pos < len(self.y) and self.guess[pos] == self.y[pos]:
                accepted += 1
            elif miss is None:
                miss = j
        return n, accepted, False


@dataclass(frozen=True)
class Replayed:
    speedup: float  # over plain decoding, at the given costs
    rounds: int
    drafted: int
    accepted: int


def replay(rec: Recording, costs: Costs, policy: str) -> Replayed:
    """One greedy answer under `policy`: what the engine would draft, accept and gain."""
    y, t_of = rec.y, costs.verify_s
    auto = policy == "auto"
    drafter = AdaptiveDrafter(None)
    if auto:  # the real decision logic; only the model calls are replayed
        drafter.model = SimpleNamespace(  # type: ignore[assignment]
            step_s=costs.draft_s, catchup_s=costs.catchup_s, round_s=0.0, accept=lambda *a: None
        )
    fixed = 0 if auto else int(policy.removeprefix("draft-g"))
    t, spent, cached = 1, 0.0, 0  # the first token comes from prefill, as in the engine
    rounds = total_drafted = total_accepted = 0
    while t < len(y):
        context = rec.prompt + y[:t]
        gamma = min(GAMMA_MAX if auto else fixed, len(y) - t - 1)
        k, n_ngram, p_min = gamma, 0, [0.5] * gamma
        match: list[int] = []
        if auto:
            drafter._match_n, match = drafter.ngrams.match(context, gamma)
            drafter.answered = t
            choice = drafter.choose(len(match), gamma, len(context) - cached, drafter._match_n)
            drafter._last, k, n_ngram, p_min = choice, choice.k, choice.ngram, drafter.p_min(choice)
            if choice.source == TIMING:
                match = free_guesses(context, choice.ngram)
            if not n_ngram:
                drafter.shadow(len(context), [("ngram", drafter._match_n, match)])
        accepted = next((j for j in range(n_ngram) if match[j] != y[t + j]), n_ngram)
        draft_s, n_model = 0.0, 0
        if k > n_ngram:
            lag = len(context) - cached
            n_model, more, stopped = rec.draft(t + n_ngram, k - n_ngram, p_min)
            if accepted == n_ngram:
                accepted += more
            steps = n_model + stopped  # a stopped draft paid for the pass that saw why
            draft_s = costs.read(max(lag - 1, 0)) + steps * costs.draft_s
            cached = min(len(context) + n_ngram + steps - 1, len(context) + accepted)
        drafted = n_ngram + n_model
        accepted = min(accepted, len(y) - t - 1)
        spent += draft_s + t_of[drafted]
        rounds, total_drafted, total_accepted = (
            rounds + 1,
            total_drafted + drafted,
            total_accepted + accepted,
        )
        if auto:
            drafter._draft_s = draft_s
            text = rec.prompt + y[: t + accepted + 1]
            drafter.accept(text, Outcome(drafted, accepted, t_of[drafted]))
        t += accepted + 1
    speedup = (len(y) - 1) * t_of[0] / spent if spent else 1.0
    return Replayed(speedup, rounds, total_drafted, total_accepted)


def oracle(rec: Recording, costs: Costs) -> Replayed:
    """A bound on any drafter of these sources: each round drafts k n-gram tokens, k
    draft-model tokens, or the n-gram match and then the draft model, knowing what the
    target will accept; the rounds are a shortest path over the positions of y, in two
    states: before the draft model's first use, which pays its read of the context so
    far, and after. Left out: its catch-up after n-gram rounds and its early stop, so no
    policy reaches it."""
    y, t_of, c = rec.y, costs.verify_s, costs.draft_s
    n = len(y)
    run = [0] * (n + 1)  # run[t]: the draft model's guesses from t on that are right
    for t in range(n - 1, -1, -1):
        run[t] = run[t + 1] + 1 if rec.guess[t] == y[t] else 0
    ngrams = NgramIndex(n_max=4, n_min=2)  # auto's
    Option = tuple[int, int, float, bool]  # drafted, accepted, seconds, by the draft model
    # best[used][t]: the least time from position t to the end; pick: the round taken
    best = [[0.0] * (n + 1) for _ in range(2)]
    pick: list[dict[int, Option]] = [{}, {}]
    options: dict[int, list[Option]] = {}
    for t in range(1, n):
        match = ngrams.lookup(rec.prompt + y[:t], GAMMA_MAX)
        right = next((j for j, x in enumerate(match) if t + j >= n or x != y[t + j]), len(match))
        here = [(0, 0, t_of[0], False)]
        here += [(k, min(right, k), t_of[k], False) for k in range(1, len(match) + 1)]
        here += [(k, min(run[t], k), k * c + t_of[k], True) for k in range(1, GAMMA_MAX + 1)]
        if right == len(match) > 0:
            m = right
            here += [
                (m + j, m + min(run[t + m], j), j * c + t_of[m + j], True)
                for j in range(1, GAMMA_MAX - m + 1)
            ]
        options[t] = [(d, min(a, n - t - 1), s, by) for d, a, s, by in here]
    for t in range(n - 1, 0, -1):
        first_read = costs.read(len(rec.prompt) + t - 1)
        for used in (1, 0):
            totals = [
                s + (first_read if by and not used else 0.0) + best[used or by][t + a + 1]
                for _, a, s, by in options[t]
            ]
            i = int(np.argmin(totals))
            pick[used][t], best[used][t] = options[t][i], totals[i]
    t, used, rounds, drafted, accepted = 1, 0, 0, 0, 0
    while t < n:
        d, a, _, by = pick[used][t]
        rounds, drafted, accepted, used = rounds + 1, drafted + d, accepted + a, used or by
        t += a + 1
    speedup = (n - 1) * t_of[0] / best[0][1] if n > 1 else 1.0
    return Replayed(speedup, rounds, drafted, accepted)


def run_policy(rec: Recording, costs: Costs, policy: str) -> Replayed:
    return oracle(rec, costs) if policy == "oracle" else replay(rec, costs, policy)


def report(data: dict, costs: Costs, policies: list[str]) -> None:
    prompts = data["prompts"]
    categories = sorted({r["category"] for r in prompts.values()})
    print(
        "T(k) ms: "
        + " ".join(f"{t * 1e3:.3g}" for t in costs.verify_s)
        + f"; c {costs.draft_s * 1e3:.3g} ms; catch-up {costs.catchup_s * 1e3:.3g} ms/token"
        + (f", {costs.read_s * 1e3:.3g} in a long read" if costs.read_s else "")
    )
    print("| policy | " + " | ".join(categories) + " | all | slowest |")
    print("|---|" + "---:|" * (len(categories) + 2))
    for policy in policies:
        by = {name: run_policy(Recording(r), costs, policy).speedup for name, r in prompts.items()}
        cells = [
            statistics.median(s for n, s in by.items() if prompts[n]["category"] == c)
            for c in categories
        ]
        print(
            f"| {policy} | "
            + " | ".join(f"{x:.2f}×" for x in cells)
            + f" | {statistics.median(by.values()):.2f}× | {min(by.values()):.2f}× |"
        )


def parse_costs(text: str) -> Costs:
    verify, draft, catchup = text.split(";")
    return Costs([float(x) for x in verify.split(",")], float(draft), float(catchup))


def profile_costs(profile: dict, target: str, draft: str) -> Costs:
    """The costs of a target and draft measured by scripts/gpu_profile.py (milliseconds
    there): the recorded answers replayed as if that pair ran on that machine."""
    models = profile["models"]
    for model_id, role in ((target, "target"), (draft, "draft")):
        if model_id not in models or (role == "draft" and "step_ms" not in models[model_id]):
            have = ", ".join(models)
            raise SystemExit(f"replay: the profile has no {role} {model_id} (it has {have})")
    t, d = models[target], models[draft]
    verify = [ms / 1e3 for ms in t["verify_ms"][: GAMMA_MAX + 1]]
    read = None
    if reads := d.get("read_ms"):  # {tokens: ms}; the longest read's rate
        n = max(reads, key=int)
        read = reads[n] / int(n) / 1e3
    return Costs(verify, d["step_ms"] / 1e3, d["catchup_ms_per_token"] / 1e3, read)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record the bench prompts with a model pair")
    rec.add_argument("--target", "-t", type=Path, required=True)
    rec.add_argument("--draft", "-d", type=Path, required=True)
    rec.add_argument("--threads", type=int, default=0)
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument(
        "--prompts", type=Path, help="a prompts file (`localspec bench --list-prompts` writes one)"
    )
    rep = sub.add_parser("replay", help="replay policies on a recording")
    rep.add_argument("recording", type=Path)
    rep.add_argument("--policies", default="auto,draft-g3,draft-g4,draft-g5")
    rep.add_argument("--costs", help='"T1,...,T9;c;catchup" in seconds (default: recorded)')
    rep.add_argument("--profile", type=Path, help="costs from scripts/gpu_profile.py's JSON")
    rep.add_argument("--target-model", default="qwen2.5-coder-1.5b-instruct")
    rep.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    args = parser.parse_args()
    if args.command == "record":
        options = LoadOptions(n_threads=args.threads)
        target, draft = LlamaModel(args.target, options), LlamaModel(args.draft, options)
        data = record(target, draft, load_prompts(args.prompts))
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(args.out)
        return 0
    data = json.loads(args.recording.read_text())
    recorded = data["costs"]
    if args.profile:
        profile = json.loads(args.profile.read_text())
        costs = profile_costs(profile, args.target_model, args.draft_model)
    elif args.costs:
        costs = parse_costs(args.costs)
    else:
        costs = Costs(list(recorded["verify_s"]), recorded["draft_s"], recorded["catchup_s"])
    policies = args.policies.split(",")
    known = ("auto", "oracle")
    if bad := [p for p in policies if p not in known and not p.removeprefix("draft-g").isdigit()]:
        print(f"replay: unknown policy {bad[0]!r}: use auto, oracle or draft-gN", file=sys.stderr)
        return 2
    report(data, costs, policies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
