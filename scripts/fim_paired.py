"""`auto` with and without its deeper tries (AdaptiveDrafter.explore), paired, in process.

Two sessions of the same pair; each fim bench case's first request and its keystroke go
to both, in alternating order, as serve runs them (the typed text opening the middle, the
idle draft model reading ahead before the next request). Prints each request's decode
time and the median ratio over the cases, so the machine's load, which moves a whole
bench run, moves both sides alike. docs/bench/fim/README.md has its figures:

    .venv/bin/python scripts/fim_paired.py TARGET.gguf DRAFT.gguf --seeds 0 1
"""

from __future__ import annotations

import argparse
import statistics

from localspec.backends.llama import LoadOptions
from localspec.bench.fim import FimCase, cut_cases
from localspec.decoding.adaptive import AdaptiveDrafter
from localspec.decoding.engine import GenerationConfig
from localspec.decoding.events import Finished
from localspec.decoding.prediction import Prediction
from localspec.decoding.sampling import SamplingParams
from localspec.server.infill import ExtraChunk, InfillLines, infill_prompt, middle_config
from localspec.session import Session, SessionConfig, open_session


def ask(session: Session, case: FimCase, keystroke: bool) -> tuple[float, int]:
    """One /infill request as serve builds it: its decode seconds and middle tokens."""
    typed = case.typed + (case.middle[:1] if keystroke else "")
    extra = [ExtraChunk(filename=f, text=t) for f, t in case.extra]
    built = infill_prompt(session.target, case.prefix, case.suffix, extra, typed, 64, 4096)
    lines = InfillLines(case.suffix, len(case.typed))
    config = GenerationConfig(64, SamplingParams(temperature=0), lines=lines)
    config = middle_config(built, config, session.target)
    drafter = session.engine.drafter
    assert isinstance(drafter, AdaptiveDrafter)  # auto's
    drafter.predict(Prediction(built.source, len(built.tokens), anchored=False))
    done = [e for e in session.engine.generate(built.tokens, config) if isinstance(e, Finished)]
    drafter.predict(None)
    while drafter.read_ahead(session.target.cached, 64) > 0:
        pass
    stats = done[0].stats
    return stats.elapsed_s - stats.ttft_s, len(done[0].tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--cases", type=int, default=12)
    args = parser.parse_args()
    load = LoadOptions(n_ctx=4096, n_threads=2)
    sessions = {
        name: open_session(SessionConfig(args.target, args.draft, "auto", load, load))
        for name in ("without", "with")
    }
    # the deeper tries off: each choice stays the one the timed sizes alone give
    sessions["without"].engine.drafter.explore = lambda best, *_: best  # type: ignore[attr-defined]
    ratios: dict[bool, list[float]] = {False: [], True: []}
    turn = 0
    for seed in args.seeds:
        for case in cut_cases(args.cases, seed):
            for keystroke in (False, True):
                names = ["without", "with"][:: 1 if turn % 2 == 0 else -1]
                turn += 1
                took = {name: ask(sessions[name], case, keystroke) for name in names}
                (off_s, off_n), (on_s, on_n) = took["without"], took["with"]
                if off_n >= 4:  # shorter middles are mostly the first round's time
                    ratios[keystroke].append(on_s / off_s)
                kind = "keystroke" if keystroke else "first"
                without, with_ = f"{off_s:.2f}s/{off_n}", f"{on_s:.2f}s/{on_n}"
                print(f"{case.name[:36]:<36} {kind:<9} without {without}  with {with_}")
    for keystroke, kind in ((False, "first requests"), (True, "keystrokes")):
        values = ratios[keystroke]
        median = statistics.median(values)
        print(f"{kind}: with / without, median over {len(values)} cases: {median:.3f}")
    for session in sessions.values():
        session.close()


if __name__ == "__main__":
    main()
