"""`localspec run`: answer one prompt, streaming to stdout, stats to stderr."""

from __future__ import annotations

import argparse
import json
import sys

from localspec.cli.options import (
    add_model_options,
    add_sampling_options,
    sampling_params,
    session_config,
)
from localspec.errors import LocalspecError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="answer one prompt (argument or stdin)")
    p.add_argument("prompt", nargs="?", help="the prompt; read from stdin when omitted")
    add_model_options(p)
    add_sampling_options(p)
    p.add_argument("--system", help="system message (chat mode)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="plain completion, no chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument(
        "--explain", action="store_true", help="print each round's drafting decision to stderr"
    )
    p.set_defaults(func=run)


def read_prompt(args: argparse.Namespace) -> str:
    prompt = args.prompt
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise LocalspecError("no prompt: pass one as an argument or on stdin")
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise LocalspecError("the prompt is empty")
    return prompt


def run(args: argparse.Namespace) -> int:
    from localspec.decoding.engine import GenerationConfig
    from localspec.decoding.events import Finished, Piece, RoundEnd
    from localspec.session import Message, open_session

    prompt = read_prompt(args)
    config = GenerationConfig(
        max_tokens=args.max_tokens, sampling=sampling_params(args), stop=tuple(args.stop)
    )
    session = open_session(session_config(args), say=warn)
    try:
        if args.raw:
            events = session.complete(prompt, config)
        else:
            messages: list[Message] = []
            if args.system:
                messages.append({"role": "system", "content": args.system})
            messages.append({"role": "user", "content": prompt})
            events = session.chat(messages, config)
        for event in events:
            if isinstance(event, Piece) and not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, RoundEnd) and args.explain:
                print(
                    f"[round {event.stats.rounds}] {event.drafter} drafted {event.drafted}, "
                    f"accepted {event.accepted}. {event.why}",
                    file=sys.stderr,
                )
            elif isinstance(event, Finished):
                finish(event, args.json)
    finally:
        session.close()
    return 0


def warn(line: str) -> None:
    print(f"localspec: {line}", file=sys.stderr)


def finish(done, as_json: bool) -> None:  # done: Finished
    s = done.stats
    if as_json:
        print(
            json.dumps(
                {
                    "text": done.text,
                    "tokens": len(done.tokens),
                    "stop_reason": done.stop_reason,
                    "stats": {
                        "acceptance_rate": s.acceptance_rate,
                        "mean_accepted_len": s.mean_accepted_len,
                        "tokens_per_s": s.tokens_per_s,
                        "ttft_s": s.ttft_s,
                        "tpot_p50_s": s.tpot_p50_s,  # time per output token
                        "tpot_p95_s": s.tpot_p95_s,
                        "gap_p50_s": s.gap_p50_s,  # between pieces, as they came out
                        "gap_p95_s": s.gap_p95_s,
                        "drafted": s.drafted,
                        "accepted": s.accepted,
                        "rounds": s.rounds,
                        "gamma": s.gamma,
                        "drafter": s.drafter,
                        "draft_s": s.draft_s,
                        "verify_s": s.verify_s,
                        "overhead_s": s.overhead_s,
                    },
                },
                ensure_ascii=False,
            )
        )
    else:
        print(file=sys.stdout)
        print(f"[{done.stop_reason}] {s.summary()}", file=sys.stderr)
