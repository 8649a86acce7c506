"""`localspec run`: answer one prompt, streaming to stdout, stats to stderr."""

from __future__ import annotations

import argparse
import json
import sys

from localspec.cli.options import (
    add_model_options,
    add_reasoning_option,
    add_sampling_options,
    add_template_file_option,
    add_template_option,
    apply_reasoning,
    sampling_params,
    session_config,
)
from localspec.errors import LocalspecError
from localspec.thinking import Thinking

RUN_EXAMPLES = """examples:
  localspec run "Explain a B-tree"
  echo "Explain this diff" | localspec run --json --max-tokens 200
  localspec run PROMPT --draft ngram      prompt lookup: no draft model at all
  localspec run PROMPT --draft none       plain decoding, to compare with
  localspec run PROMPT --temperature 0.7 --seed 1   sampled, distributed as the target's"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="answer one prompt (argument or stdin)",
        description="""\
Answer one prompt with speculative decoding: the answer streams to stdout, the
figures (tokens/s, acceptance, γ) to stderr.""",
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "prompt",
        nargs="*",
        help="the prompt (its words, quoted or not); read from stdin when omitted",
    )
    add_model_options(p)
    add_sampling_options(p)
    p.add_argument("--system", help="system message (chat mode)")
    add_template_option(p)
    add_template_file_option(p)
    add_reasoning_option(p)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="plain completion, no chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument(
        "--explain", action="store_true", help="print each round's drafting decision to stderr"
    )
    p.set_defaults(func=run)


def read_prompt(args: argparse.Namespace) -> str:
    prompt = " ".join(args.prompt) if args.prompt else None  # `run why is the sky blue`
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
    apply_reasoning(session, args, warn)
    try:
        if args.raw:
            events, out = session.complete(prompt, config), Output(None, args.json)
        else:
            messages: list[Message] = []
            if args.system:
                messages.append({"role": "system", "content": args.system})
            messages.append({"role": "user", "content": prompt})
            out = Output(session.thinking(messages), args.json)
            events = session.chat(messages, config)
        for event in events:
            if isinstance(event, Piece):
                out.write(event.text)
            elif isinstance(event, RoundEnd) and args.explain:
                print(
                    f"[round {event.stats.rounds}] {event.drafter} drafted {event.drafted}, "
                    f"accepted {event.accepted}. {event.why}",
                    file=sys.stderr,
                )
            elif isinstance(event, Finished):
                out.end()
                finish(event, args.json, out, models(session))
    finally:
        session.close()
    return 0


def warn(line: str) -> None:
    print(f"localspec: {line}", file=sys.stderr)


class Output:
    """The answer as it streams, to stdout; a thinking model's reasoning to stderr
    (dimmed on a terminal), so that stdout holds the answer alone. With --json nothing
    streams: both are kept for the one object at the end."""

    def __init__(self, thinking: Thinking | None, quiet: bool) -> None:
        self.split = thinking.split() if thinking is not None else None
        self.quiet = quiet
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self._dim = sys.stderr.isatty()

    def write(self, text: str) -> None:
        reasoning, content = self.split.push(text) if self.split else ("", text)
        self._show(reasoning, content)

    def end(self) -> None:
        if self.split is not None:
            self._show(*self.split.flush())

    def _show(self, reasoning: str, content: str) -> None:
        self.reasoning.append(reasoning)
        self.content.append(content)
        if self.quiet:
            return
        if reasoning:
            sys.stderr.write(f"\x1b[2m{reasoning}\x1b[0m" if self._dim else reasoning)
            sys.stderr.flush()
        if content:
            sys.stdout.write(content)
            sys.stdout.flush()


def models(session) -> dict[str, str]:  # session: Session
    """The models that answered, by name: the target, and the draft model (or the
    model-free drafter: mtp, ngram, none), for --json."""
    if session.draft_model is not None:
        draft = session.draft_model.name
    elif session.head is not None:  # the target's own MTP head, or Gemma 4's assistant
        draft = session.head.name if session.head.from_file else "mtp"
    else:
        draft = session.config.draft if session.config is not None else "none"
    return {"target": session.target.name, "draft": draft}


def finish(done, as_json: bool, out: Output, names: dict[str, str]) -> None:  # done: Finished
    s = done.stats
    if as_json:
        reasoning = {"reasoning": "".join(out.reasoning)} if out.split is not None else {}
        print(
            json.dumps(
                {
                    "text": "".join(out.content),
                    **reasoning,
                    "tokens": len(done.tokens),
                    "stop_reason": done.stop_reason,
                    "models": names,
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
