#!/usr/bin/env python3
"""Where the typed text goes in a FIM prompt, judged by how close the middles come to
the authors': llama-server's layout (it closes the prefix), its tokens appended after
`<|fim_middle|>`, or the opening grammar that localspec serves (the model spells it).

Greedy plain decoding in process on the fim suite's cases, each as cut and with one more
character typed (the next keystroke); similarity is the bench's `middle_similarity`.

    scripts/fim_layouts.py --target T.gguf --cases 12 --seed 0
"""

from __future__ import annotations

import argparse
import os
import statistics

from localspec.backends.llama import LlamaModel, LoadOptions
from localspec.bench.fim import cut_cases, middle_similarity
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished
from localspec.decoding.sampling import SamplingParams
from localspec.server.infill import ExtraChunk, InfillLines, Unopened, infill_prompt, middle_config

LAYOUTS = ("prefix", "appended", "opening")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--cases", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-predict", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    model = LlamaModel(args.target, LoadOptions(n_ctx=4096, n_threads=args.threads))

    def middle(layout: str, case, typed: str) -> str:
        extra = [ExtraChunk(filename=f, text=t) for f, t in case.extra]
        built = infill_prompt(model, case.prefix, case.suffix, extra, typed, args.n_predict, 4096)
        config = GenerationConfig(
            args.n_predict,
            SamplingParams(temperature=0),
            lines=InfillLines(case.suffix, len(case.typed)),
        )
        prompt = built.tokens
        if layout == "prefix":  # llama-server's: the typed text just before <|fim_suffix|>
            at = prompt.index(model.fim_tokens().suf)
            prompt = [*prompt[:at], *model.tokenize(typed, special=False), *prompt[at:]]
        elif layout == "appended":
            prompt = [*prompt, *model.tokenize(typed, special=False)]
        else:
            config = middle_config(built, config, model)
        done = list(Engine(model, NoDrafter(), 0).generate(prompt, config))[-1]
        assert isinstance(done, Finished)
        return (
            Unopened(typed, model.token_bytes).finished(done).text
            if layout == "opening"
            else done.text
        )

    scores: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    same = 0
    for case in cut_cases(args.cases, args.seed):
        for typed, truth in (
            (case.typed, case.middle),
            (case.typed + case.middle[:1], case.middle[1:]),
        ):
            answers = {layout: middle(layout, case, typed) for layout in LAYOUTS}
            for layout, answer in answers.items():
                scores[layout].append(middle_similarity(answer, truth))
            same += answers["prefix"] == answers["opening"]
            row = "  ".join(f"{layout} {scores[layout][-1]:.2f}" for layout in LAYOUTS)
            print(f"{case.name:<40} {typed!r:<32} {row}", flush=True)
    model.close()
    n = len(scores["prefix"])
    print(f"\n{n} middles (seed {args.seed}); similar to the author's, mean:")
    for layout in LAYOUTS:
        print(f"  {layout:<9} {statistics.mean(scores[layout]):.3f}")
    print(f"  the opening's middle equal to llama-server's layout's: {same}/{n}")


if __name__ == "__main__":
    main()
