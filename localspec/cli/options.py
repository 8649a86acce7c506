"""Options shared by `run`, `chat` and `bench`: which models, and how to sample."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.errors import LocalspecError

if TYPE_CHECKING:
    from localspec.session import Session


def ranged_int(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an int within [lo, hi], refused at parse time with the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be between {lo} and {hi}")
        return value

    return parse


def ranged_float(lo: float, hi: float) -> Callable[[str], float]:
    """An argparse type: a number within [lo, hi], refused at parse time with the range."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not lo <= value <= hi:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be between {lo:g} and {hi:g}")
        return value

    return parse


ctx_arg = ranged_int(16, 1 << 24)  # llama.cpp takes 32 bits; models cap it far lower
threads_arg = ranged_int(0, 1024)
max_tokens_arg = ranged_int(1, 1 << 24)  # the context clamps an answer anyway
_gamma_int = ranged_int(0, 32)


def template_kwargs_arg(text: str) -> dict:
    """--chat-template-kwargs: a JSON object of the chat template's variables."""
    import json

    from localspec.session import TemplateKwargsError, template_kwargs

    try:
        return template_kwargs(json.loads(text))
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    except TemplateKwargsError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_template_option(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--chat-template-kwargs",
        type=template_kwargs_arg,
        default={},
        metavar="JSON",
        help="the chat template's variables, e.g. '{\"enable_thinking\": false}' (Qwen3: "
        'answer without thinking) or \'{"reasoning_effort": "high"}\' (gpt-oss)',
    )


def add_template_file_option(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--chat-template-file",
        type=template_file_arg,
        metavar="FILE",
        help="a Jinja chat template in place of the one in the target's GGUF (as "
        "llama-server's: a fixed template for tool calls or thinking)",
    )


def template_file_arg(path: str) -> str:
    """The template in the file at `path`, checked to parse."""
    import jinja2

    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
        jinja2.Environment().parse(text)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise argparse.ArgumentTypeError(f"{path} is not UTF-8 text") from None
    except jinja2.TemplateSyntaxError as e:
        raise argparse.ArgumentTypeError(f"{path}, line {e.lineno}: {e.message}") from None
    return text


SAVED = " (default: from the settings)"  # the chat's options that, left out, keep them


def add_reasoning_option(
    p: argparse.ArgumentParser | argparse._ArgumentGroup, saved: bool = False
) -> None:
    """--reasoning and --reasoning-budget; `saved`: their defaults are the chat's settings."""
    from localspec.thinking import SWITCHES

    p.add_argument(
        "--reasoning",
        choices=SWITCHES,
        default="auto",
        help="a thinking model thinks before it answers (on) or answers at once (off), "
        "by its chat template's switch, enable_thinking (Qwen3, Qwen3.5/3.6, Gemma 4), as "
        "llama-server's --reasoning; auto: as the template has it"
        + (SAVED if saved else " (default)"),
    )
    p.add_argument(
        "--reasoning-budget",
        type=ranged_int(-1, 1 << 30),
        default=-1,
        metavar="N",
        help="a thinking model's reasoning ends after N tokens and it answers (0: at once; "
        "-1: no limit)" + (SAVED if saved else ", default -1"),
    )


def reasoning_budget(args: argparse.Namespace) -> int | None:
    return None if args.reasoning_budget < 0 else args.reasoning_budget


def apply_reasoning(session: Session, args: argparse.Namespace, say: Callable[[str], None]) -> bool:
    """The template's variables and the reasoning options of the command line on
    `session`; whether --reasoning switches thinking (a line where the model's template
    has nothing to switch)."""
    from localspec.thinking import switched

    session.template_kwargs = {**args.chat_template_kwargs, **switched(args.reasoning)}
    session.reasoning_budget = reasoning_budget(args)
    if note := session.switch_note(args.reasoning):
        say(note)
    return args.reasoning != "auto" and note is None


def gamma_arg(text: str) -> int | str:
    """Tokens drafted per round, or 'auto'."""
    if text == "auto":
        return text
    try:
        return _gamma_int(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (or 'auto')") from None


def add_model_options(p: argparse.ArgumentParser, saved: bool = False) -> None:
    """The pair and how it loads; `saved`: --gamma's default is the chat's settings."""
    g = p.add_argument_group("models (default: the plan's, as `localspec plan` shows)")
    g.add_argument(
        "--target",
        "-t",
        help="target model: a .gguf path or a catalog id (the plan then chooses the rest for it)",
    )
    g.add_argument(
        "--draft",
        "-d",
        help="draft: a .gguf path (a draft model, or Gemma 4's assistant for its target), a "
        "catalog id, 'mtp' (the target's own MTP head), 'ngram' or 'none' (default: the "
        "plan's; for a target neither pulled nor added, mtp where its GGUF has a head, else "
        "ngram)",
    )
    g.add_argument(
        "--gamma",
        "-g",
        type=gamma_arg,
        default="auto",
        help="tokens drafted per round, or 'auto'" + (SAVED if saved else " (default)"),
    )
    g.add_argument(
        "--ctx",
        type=ctx_arg,
        default=None,
        help="context size in tokens (default: the plan's, else 4096)",
    )
    g.add_argument(
        "--threads", type=threads_arg, default=0, help="CPU threads (default: physical cores)"
    )
    g.add_argument(
        "--n-gpu-layers",
        type=int,
        default=None,
        help="target layers to offload to the GPU (default: the plan's, else all)",
    )
    add_draft_quant(g)
    add_repack_option(g)
    add_rpc_option(g)


def add_rpc_option(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--rpc",
        metavar="HOST:PORT[,...]",
        default=None,
        help="llama.cpp rpc-servers (scripts/rpc_server.sh) that hold the target's layers; "
        "the draft stays on this machine",
    )


def with_servers(hw, endpoints: tuple[str, ...]):  # (Hardware | None, ...) -> Hardware | None
    """`hw` (None: this machine, probed) with the devices of the rpc-servers at
    `endpoints`, whose free memory the plan counts for the target; `hw` as it is without
    servers."""
    if not endpoints:
        return hw
    from dataclasses import replace

    from localspec.backends import load_llama_library
    from localspec.backends.rpc import remote_devices
    from localspec.models.hardware import Remote, probe

    load_llama_library()
    remote = tuple(Remote(d.endpoint, d.free, d.total) for d in remote_devices(endpoints))
    return replace(hw or probe(), remote=remote)


def rpc_endpoints(text: str | None) -> tuple[str, ...]:
    """--rpc's servers, checked; () when it is not given."""
    from localspec.backends.rpc import parse_endpoints

    return parse_endpoints(text) if text else ()


def add_draft_quant(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--draft-quant",
        choices=("auto", "keep"),
        default="auto",
        help="auto (default): on a CPU, draft with a Q4_0 copy of the draft model, "
        "made once (llama.cpp's fastest type there); keep: the file as it is",
    )


def add_repack_option(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--no-repack",
        dest="repack",
        action="store_false",
        help="load the target's weights as the file lays them out, not repacked for "
        "llama.cpp's CPU kernels (as llama-server's --no-repack): on some CPUs prompts "
        "read much faster so and tokens decode a little slower (docs/performance.md)",
    )
    g.add_argument(
        "--no-prompt-reader",
        dest="prompt_reader",
        action="store_false",
        help="no second load of the target, not repacked, for long prompts (by default "
        "on x86 CPUs, where RAM has room for it: prompts read 1.3-1.6x faster, "
        "docs/performance.md)",
    )


def add_sampling_options(p: argparse.ArgumentParser, saved: bool = False) -> None:
    """The sampler's options; `saved` (the chat): those its settings hold, whose
    defaults they are."""
    g = p.add_argument_group("sampling")
    if saved:
        g.add_argument("--temperature", "--temp", type=float, help="0 = greedy" + SAVED)
        g.add_argument("--top-p", type=float, help="nucleus sampling's share" + SAVED)
        g.add_argument("--max-tokens", "-n", type=int, help="the most tokens of an answer" + SAVED)
        return
    g.add_argument("--temperature", "--temp", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=0.95, help="default %(default)s")
    g.add_argument("--top-k", type=int, default=40, help="0: no limit; default %(default)s")
    g.add_argument("--min-p", type=float, default=0.05, help="default %(default)s")
    g.add_argument("--repeat-penalty", type=float, default=1.0, help="1 = off (default)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="per repeat (OpenAI's)")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="once seen (OpenAI's)")
    g.add_argument(
        "--repeat-last-n",
        type=int,
        default=64,
        help="the penalties' window (-1: all); default %(default)s",
    )
    g.add_argument("--seed", type=int, default=None, help="default: a new one each run")
    g.add_argument(
        "--max-tokens", "-n", type=max_tokens_arg, default=512, help="default %(default)s"
    )


def sampling_params(args: argparse.Namespace):  # -> SamplingParams
    from localspec.decoding.sampling import SamplingParams

    try:
        return SamplingParams(
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            repeat_penalty=args.repeat_penalty,
            frequency_penalty=args.frequency_penalty,
            presence_penalty=args.presence_penalty,
            repeat_last_n=args.repeat_last_n,
            seed=args.seed,
        )
    except ValueError as e:
        raise LocalspecError(str(e)) from None


def session_config(args: argparse.Namespace):  # -> SessionConfig
    """Explicit models as given; missing ones come from the machine's plan."""
    from localspec.backends.llama import LoadOptions
    from localspec.session import SessionConfig

    target, draft = args.target, args.draft
    n_ctx, n_gpu_layers = args.ctx, args.n_gpu_layers
    cpu_moe = 0
    rpc = rpc_endpoints(getattr(args, "rpc", None))
    pair = None
    if target is None:
        from localspec.models.pairing import default_pair

        pair = default_pair(draft, with_servers(None, rpc), n_ctx=n_ctx)
    elif not rpc and (draft is None or n_ctx is None or n_gpu_layers is None):
        pair = planned_for(target, draft, n_ctx)
    if pair is not None:
        target, draft = pair.target, pair.draft
        n_ctx = n_ctx or pair.n_ctx
        if n_gpu_layers is None and not rpc:  # over RPC every layer goes to the servers
            n_gpu_layers, cpu_moe = pair.n_gpu_layers, pair.cpu_moe
    if draft is None:  # the target's own MTP head where its GGUF has one, else n-grams
        draft = "mtp" if has_mtp_head(target) else "ngram"
    load = LoadOptions(
        n_ctx=n_ctx or 4096,
        n_threads=args.threads,
        n_gpu_layers=-1 if n_gpu_layers is None else n_gpu_layers,
        rpc=rpc,  # the target's only: the draft stays local
        cpu_moe=cpu_moe,
        chat_template=getattr(args, "chat_template_file", None),
        repack=args.repack,
        prompt_reader=args.prompt_reader,  # none where nothing is repacked
    )
    return SessionConfig(
        target=target,
        draft=draft,
        gamma=args.gamma,
        draft_quant=args.draft_quant,
        target_load=load,
        draft_load=LoadOptions(n_ctx=load.n_ctx, n_threads=args.threads),
    )


def planned_for(target: str, draft: str | None, n_ctx: int | None):  # -> PairSpec | None
    """The plan around a named target where it is installed (its draft, offload and
    context); None for a file the store does not know, or one that the plan cannot fit
    (then it loads as asked, llama.cpp's defaults and the memory back-off doing the
    rest). Not over RPC: a named target there loads as asked, and a server that is down
    is for the load to report (the chat shows it and retries), not the plan."""
    from localspec.models.pairing import pair_for_target
    from localspec.session import resolve_model

    try:
        return pair_for_target(resolve_model(target), draft, n_ctx=n_ctx)
    except LocalspecError:
        return None  # loading it says why


def has_mtp_head(target: str) -> bool:
    """Whether the target's GGUF carries MTP blocks (read from its header; False where it
    cannot be read: loading it says why)."""
    from localspec.models import pairing
    from localspec.session import resolve_model

    try:
        return pairing.has_mtp_head(resolve_model(target))
    except LocalspecError:
        return False
