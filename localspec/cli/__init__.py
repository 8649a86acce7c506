"""`localspec`: one small module per subcommand, each with `register(subparsers)`.

Modules import their heavy dependencies (llama.cpp, numpy) inside their handlers so
`localspec --help` stays instant. Errors meant for the user (LocalspecError) become one
line on stderr and exit status 1; never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping
from typing import NoReturn

from localspec import version
from localspec.errors import LocalspecError

TOP_LEVEL = ("-h", "--help", "-V", "--version")  # options of `localspec` itself, not the chat's
COMMANDS = ("chat", "run", "serve", "bench", "plan", "pull", "models", "add")


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: the full usage block of `serve` is a dozen
    lines above the one that says what was wrong."""

    commands: Mapping[str, argparse.ArgumentParser]  # the top level's, by name

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


EXAMPLES = """examples:
  localspec                         the chat, with the pair that fits this machine
  localspec run "Explain a B-tree"  stream one answer (stats on stderr)
  localspec serve                   the OpenAI API on 127.0.0.1:8080, for editors
  localspec plan                    what fits this machine, and why
  localspec pull coder-fim          the base models an editor's completion wants

Each command says more with --help, e.g. localspec serve --help."""


def build_parser() -> Parser:
    parser = Parser(
        prog="localspec",
        description="Faster local LLM answers with speculative decoding. "
        "Without a command, opens the chat.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", "-V", action="version", version=version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    parser.commands = sub.choices
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or (argv[0].startswith("-") and argv[0] not in TOP_LEVEL):
        argv = ["chat", *argv]  # no command: the chat, with any options given
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the command's parser, whose --help lists its options
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command not in ("plan", "pull", "models", "add"):
        from localspec.backends import load_llama_library

        load_llama_library()
    try:
        return int(args.func(args) or 0)
    except LocalspecError as e:
        print(f"localspec: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("localspec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
