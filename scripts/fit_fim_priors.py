#!/usr/bin/env python3
"""Fits `auto`'s prior α for a completion's free source (the text after the cursor and
the other files' chunks, which the server hands `auto` as an unanchored prediction) from
the target's own greedy middles on cuts of real code.

Each case of `localspec bench --suite fim`'s kind (another seed than the bench's, so the
bench measures cases the priors never saw) is answered by plain greedy decoding; then,
at every position of the middle, the source proposes what it would there
(`Prediction.match`, as `auto` asks it), and each proposed token counts as accepted
while it and those before it equal the target's. α by run length is what
PREDICTION_PRIOR keys by (the prompt lookup's α by n-gram length is printed beside it).

    scripts/fit_fim_priors.py --target T.gguf --cases 24 --seed 1
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from collections.abc import Sequence

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.bench.fim import cut_cases
from localspec.decoding.drafters import NgramIndex, NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished
from localspec.decoding.prediction import Prediction
from localspec.decoding.priors import ngram_key, prediction_key
from localspec.decoding.sampling import SamplingParams
from localspec.server.infill import ExtraChunk, InfillLines, infill_prompt, middle_config

GAMMA = 8


def tally(
    counts: dict[str, list[int]], key: str, proposed: Sequence[int], truth: Sequence[int]
) -> None:
    """Count each proposed token as tried, and as accepted while all before it were."""
    for guess, real in zip(proposed, truth, strict=False):
        counts[key][1] += 1
        if guess != real:
            return
        counts[key][0] += 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--cases", type=int, default=24)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--n-predict", type=int, default=64)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    model = LlamaModel(args.target, LoadOptions(n_ctx=args.ctx, n_threads=args.threads))
    source: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # key -> [accepted, tried]
    lookup: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    tokens_total = 0
    for case in cut_cases(args.cases, args.seed):
        extra = [ExtraChunk(filename=f, text=t) for f, t in case.extra]
        built = infill_prompt(
            model, case.prefix, case.suffix, extra, case.typed, args.n_predict, args.ctx
        )
        config = GenerationConfig(
            args.n_predict,
            SamplingParams(temperature=0),
            lines=InfillLines(case.suffix, len(case.typed)),
        )
        config = middle_config(built, config, model)  # the typed text opens it, as served
        done = list(Engine(model, NoDrafter(), 0).generate(built.tokens, config))[-1]
        assert isinstance(done, Finished)
        answer = list(done.tokens)
        tokens_total += len(answer)
        prediction = Prediction(built.source, len(built.tokens), anchored=False)
        index = NgramIndex()
        for i in range(len(answer)):
            context = [*built.tokens, *answer[:i]]
            n, found = prediction.match(context, GAMMA)
            if found:
                tally(source, prediction_key(n), found, answer[i:])
            n, found = index.match(context, GAMMA)
            if found:
                tally(lookup, ngram_key(n), found, answer[i:])
        print(f"{case.name:<40} {case.kind:<6} {len(answer):>3} tokens", flush=True)
    model.close()
    print(f"\n{args.cases} cases, {tokens_total} middle tokens (seed {args.seed})")
    for name, counts in (("the suffix and extra chunks", source), ("prompt lookup", lookup)):
        print(f"{name}: α (accepted / proposed tokens, each counted while those before held)")
        for key in sorted(counts):
            accepted, tried = counts[key]
            print(f"  {key:<12} {accepted / tried:.2f}  ({accepted}/{tried})")


if __name__ == "__main__":
    main()
