"""`localspec chat` (also `localspec` alone): the terminal chat.

The app lives in the top-level `tui` package, imported inside `run` only: importing any
`localspec` module never loads Textual (tests/cli/test_headless_imports.py). Options
given here win over the saved settings for this run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from localspec.cli.options import (
    add_model_options,
    add_reasoning_option,
    add_sampling_options,
    add_template_option,
    session_config,
)

if TYPE_CHECKING:
    from localspec.session import Session
    from localspec.settings import Settings
    from tui.pair import PairLoader, PairSpec

# Options that, left out, mean "as in the saved settings".
FROM_SETTINGS = {
    "gamma": "gamma",
    "temperature": "temperature",
    "top_p": "top_p",
    "max_tokens": "max_tokens",
    "reasoning": "reasoning",
    "reasoning_budget": "reasoning_budget",
    "system": "system_prompt",
    "rpc": "rpc",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat",
        help="open the chat (the default command)",
        description="The terminal chat, with tokens/s, acceptance and memory beside the "
        "conversation. Conversations are saved as they happen (ctrl+o opens one, ctrl+n "
        "starts one); ctrl+l picks another pair. A conversation that outgrows the context "
        "goes on: its oldest turns leave the model's prompt (not the file), and it says so.",
    )
    add_model_options(p, saved=True)
    add_sampling_options(p, saved=True)
    p.add_argument("--system", help="system prompt (default: from the settings)")
    add_template_option(p)
    add_reasoning_option(p, saved=True)
    p.add_argument(
        "--demo",
        action="store_true",
        help="a scripted pair over the real engine: try the chat without models",
    )
    p.set_defaults(func=run, **dict.fromkeys(FROM_SETTINGS))


def run(args: argparse.Namespace) -> int:
    from localspec.settings import SettingsError, load_settings, updated

    settings, problems = load_settings()
    changes = {
        key: getattr(args, opt)
        for opt, key in FROM_SETTINGS.items()
        if getattr(args, opt) is not None
    }
    try:
        settings = updated(settings, **changes)
    except SettingsError as e:  # one line, before any screen, naming the option given
        option = next((o for o, k in FROM_SETTINGS.items() if k == e.key), None)
        if option is None:
            raise
        raise SettingsError(e.named("--" + option.replace("_", "-"))) from None
    from tui.app import run_chat  # the chat alone loads Textual

    if args.demo:
        from tui.scripted import SPEC, scripted_loader

        loader, spec = scripted_loader(token_s=0.02), SPEC
    else:
        check_named_models(args)
        loader, spec = pair_loader(args, settings)
    return run_chat(loader, spec, settings, [str(p) for p in problems])


def check_named_models(args: argparse.Namespace) -> None:
    """A model named on the command line that names nothing is a one-line error before
    any screen, as `run` gives it (a saved pair that went missing is the chat's to show,
    where another can be picked)."""
    from localspec.drafting import MODEL_FREE_DRAFTERS
    from localspec.session import resolve_file

    for spec in (args.target, args.draft):
        if spec is not None and spec not in MODEL_FREE_DRAFTERS:
            resolve_file(spec)


def pair_loader(args: argparse.Namespace, settings: Settings) -> tuple[PairLoader, PairSpec]:
    """The pair to open first (options, else the saved choice, else the plan) and a
    loader that opens any pair with this run's load options."""
    from localspec.session import open_session
    from tui.pair import PairSpec

    args = argparse.Namespace(**vars(args))
    args.gamma = settings.gamma
    args.rpc = settings.rpc
    if args.target is None and settings.target:
        args.target, args.draft = settings.target, args.draft or settings.draft or None
    config = session_config(args)  # resolves the planner's pair when there is no target
    spec = PairSpec(
        config.target, config.draft, config.target_load.n_ctx, config.target_load.n_gpu_layers
    )

    def load(chosen: PairSpec, say: Callable[[str], None]) -> Session:
        target_load = config.target_load
        if chosen.n_ctx is not None:
            target_load = replace(target_load, n_ctx=chosen.n_ctx)
        if chosen.n_gpu_layers is not None:
            target_load = replace(target_load, n_gpu_layers=chosen.n_gpu_layers)
        draft_load = replace(config.draft_load, n_ctx=target_load.n_ctx)
        session = open_session(
            replace(
                config,
                target=chosen.target,
                draft=chosen.draft,
                target_load=target_load,
                draft_load=draft_load,
            ),
            say=say,
        )
        session.template_kwargs = args.chat_template_kwargs
        return session

    return load, spec
