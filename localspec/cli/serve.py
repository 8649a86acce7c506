"""`localspec serve`: an OpenAI-compatible HTTP server over one loaded pair, for editors
and coding agents (see localspec/server/)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import ipaddress
import logging
import os
import socket
import sys
from dataclasses import replace
from pathlib import Path

from localspec.cli.options import (
    add_model_options,
    add_reasoning_option,
    add_template_file_option,
    add_template_option,
    apply_reasoning,
    ranged_float,
    ranged_int,
    session_config,
)
from localspec.errors import LocalspecError
from localspec.models.memory import MAX_SLOTS

LOOPBACK_NAMES = ("localhost",)
CACHE_RAM_MIB = 8192  # llama-server's default
SERVE_EXAMPLES = """examples:
  localspec serve                                  the planner's pair on 127.0.0.1:8080
  localspec serve -t qwen2.5-coder-7b-instruct -d qwen2.5-coder-0.5b-instruct
  localspec serve --cache-reuse 256                for llama.vim and llama.vscode
  ANTHROPIC_BASE_URL=http://127.0.0.1:8080 claude  Claude Code through it"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the pair over the OpenAI and Anthropic APIs",
        description="""\
Load the pair once and answer the OpenAI API at http://HOST:PORT/v1 (chat,
completions with a suffix, Responses, embeddings), Anthropic's Messages API at
http://HOST:PORT, and llama-server's /infill and /completion for editors; several
clients at once, each in a slot with its own cache. docs/serve.md has each
editor's and agent's settings.""",
        epilog=SERVE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_options(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    g.add_argument("--port", type=ranged_int(0, 65535), default=8080, help="default: 8080")
    g.add_argument(
        "--api-key",
        default=None,
        help="key clients must send as 'Authorization: Bearer KEY' "
        "(default: $LOCALSPEC_API_KEY; none: no key asked)",
    )
    g.add_argument(
        "--max-queue",
        type=ranged_int(0, 100_000),
        default=16,
        help="requests that may wait while every slot is busy; beyond, a 429 with "
        "Retry-After (0: none wait; default: 16)",
    )
    g.add_argument(
        "--cache-reuse",
        type=ranged_int(0, 1_000_000),
        default=0,
        metavar="N",
        help="as llama-server's: where an editor's context chunks moved up in the prompt, "
        "move their cached entries (runs of at least N tokens) instead of reading them "
        "again; the answer is then close to, not exactly, a fresh read's (default 0: off; "
        "llama.vim and llama.vscode suggest 256)",
    )
    g.add_argument(
        "--cache-ram",
        type=ranged_int(0, 10_000_000),
        default=None,
        metavar="MiB",
        help="as llama-server's: the caches of prompts a slot gives up for another are "
        "kept in RAM up to this size, and a request that continues one (a chat's turn "
        "after an agent's) gets it back instead of reading its prompt again (0: off; "
        f"default: {CACHE_RAM_MIB}, or a quarter of the free RAM where that is less)",
    )
    g.add_argument(
        "--parallel",
        type=ranged_int(1, 64),
        default=None,
        help="requests decoded at once, each in a slot with its own cache of --ctx tokens "
        f"(default: as many as fit in memory, at most {MAX_SLOTS})",
    )
    g.add_argument(
        "--kv-unified",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the slots' caches in one buffer (as llama-server's --kv-unified): slots "
        "drafting to unequal depths share a pass, each token attending over every slot's "
        "cells (default: on a GPU, or with a draft model cheap beside the target); on a "
        "CPU, --no-kv-unified serves four or more busy clients faster",
    )
    g.add_argument(
        "--max-tokens",
        "--n-predict",
        "-n",
        type=ranged_int(1, 10_000_000),
        default=None,
        metavar="N",
        help="the most tokens an answer may take, whatever a request asks, as "
        "llama-server's -n (default: as many as the context holds; agents ask no limit, "
        "and a small model that repeats itself goes on until the context is full)",
    )
    g.add_argument("--model-name", help="the model name clients use (default: the target's)")
    g.add_argument(
        "--slots",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="GET /slots: what each slot does, as llama-server's (its figures, no text of "
        "prompts or answers; ?fail_on_no_slot=1 answers 503 while every slot is busy; "
        "default: on)",
    )
    g.add_argument(
        "--slot-save-path",
        type=Path,
        metavar="DIR",
        help="as llama-server's: POST /slots/ID?action=save (or restore, erase) with "
        '{"filename": ...} keeps a slot\'s cache in a file here, and brings it back after '
        "a restart: a long system prompt is read once (made if missing; default: off)",
    )
    g.add_argument(
        "--allowed-host",
        action="append",
        type=host_header,
        default=[],
        metavar="NAME",
        help="a Host header to answer besides the loopback and the bound address "
        "(a name this machine is reached by); repeatable",
    )
    g.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        type=web_origin,
        metavar="ORIGIN",
        help="a web origin whose pages may call the API (e.g. http://localhost:3000; "
        "'*': any); requests from browsers are refused otherwise; repeatable",
    )
    add_template_option(g)  # every request's; a request's chat_template_kwargs win
    add_template_file_option(g)
    g = p.add_argument_group(
        "sampling",
        "what a request that leaves it out gets (default: what the model's GGUF recommends, "
        "else its API's own: temperature 1.0 for OpenAI's and Anthropic's, 0.8 for "
        "llama-server's /completion and /infill; coding agents send none)",
    )
    g.add_argument("--temperature", "--temp", type=ranged_float(0, 2), metavar="T")
    g.add_argument("--top-p", type=ranged_float(0.001, 1), metavar="P")
    g.add_argument("--top-k", type=ranged_int(0, 1_000_000), metavar="K")
    g.add_argument("--min-p", type=ranged_float(0, 0.999), metavar="P")
    add_reasoning_option(g)
    g.add_argument(
        "--reasoning-budget-message",
        metavar="TEXT",
        help="written into the reasoning before its forced end (e.g. 'Time to answer.')",
    )
    p.set_defaults(func=serve)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cache_ram_bytes(mib: int | None) -> int:
    """--cache-ram in bytes; unset, llama-server's 8 GiB where a quarter of the RAM free
    now holds it (the states are copies of the slots' caches: a small machine's RAM is
    the models', the file pages they read included: `ram.spare`)."""
    if mib is not None:
        return mib << 20
    from localspec.backends import ram

    return min(CACHE_RAM_MIB << 20, ram.spare() // 4)


def save_dir(path: Path | None) -> Path | None:
    """--slot-save-path, made where missing; a one-line error where it cannot be."""
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LocalspecError(f"--slot-save-path {path}: {e.strerror}") from e
    return path


def host_header(text: str) -> str:
    """The name in a `Host` header, as --allowed-host takes it: "mybox.local:8080" is
    "mybox.local" (the guard compares names, not ports)."""
    from localspec.server.guard import host_name

    name = host_name(text)
    if "://" in text or not name or any(c in name for c in "/ @"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a host name: write it as in a URL's host part "
            "(e.g. mybox.local or 192.168.1.20)"
        )
    return name


def web_origin(text: str) -> str:
    """An `Origin` as a browser sends it (scheme://host[:port], lower case, no path), or
    '*'; "localhost:3000" or a trailing '/' would never match one."""
    origin = text.strip().lower().rstrip("/")
    scheme, sep, rest = origin.partition("://")
    if origin != "*" and not (sep and scheme and rest and "/" not in rest):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a web origin: write it as a browser sends it, "
            "scheme://host[:port] (e.g. http://localhost:3000), or '*'"
        )
    return origin


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address `host` names, before the models load, so that a port
    another server holds or a wrong host is said at once, in one line."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise LocalspecError(f"cannot serve on {host}: {str(e.strerror).lower()}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio does: ::1 beside 127.0.0.1
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as e:
        for sock in sockets:
            sock.close()
        raise LocalspecError(bind_error(host, port, e)) from None
    return sockets


def bind_error(host: str, port: int, e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use by another program (choose one with --port)"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"cannot serve on {host}: not an address of this machine"
    if e.errno == errno.EACCES:
        return f"no permission to serve on port {port} (below 1024 needs root; see --port)"
    return f"cannot serve on {host}:{port}: {e.strerror}"


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def model_name(spec: str) -> str:
    """The name a model is served as: its catalog id, or its file's stem (a request may
    name any model: the loaded one answers, and says its name)."""
    return Path(spec).stem if spec.endswith(".gguf") or "/" in spec else spec


def default_slots(config) -> int:  # config: SessionConfig
    """As many slots of the context asked for as fit beside the pair, at most MAX_SLOTS;
    1 where the files cannot be read for it (llama.cpp's error follows) or over RPC."""
    from localspec.backends.gguf import GgufInfo, gguf_info_or_none
    from localspec.drafting import MODEL_FREE_DRAFTERS
    from localspec.models.hardware import probe
    from localspec.models.memory import Weights, memory_budget, slots_that_fit
    from localspec.session import resolve_model

    def info(spec: str) -> GgufInfo | None:
        path = resolve_model(spec)
        return gguf_info_or_none([path]) if path.is_file() else None

    if config.target_load.rpc:
        return 1
    target = info(config.target)
    draft = None if config.draft in MODEL_FREE_DRAFTERS else info(config.draft)
    if target is None or (draft is None and config.draft not in MODEL_FREE_DRAFTERS):
        return 1
    hw = probe()
    return slots_that_fit(
        Weights.from_gguf(target),
        Weights.from_gguf(draft) if draft else None,
        config.target_load.n_ctx,
        memory_budget(hw),
        hw,
    )


CHEAP_DRAFT = 0.25  # draft bytes over target bytes under which drafts pay beside others


def one_cache(parallel: int, asked: bool | None, config) -> bool:  # config: SessionConfig
    """Whether the slots share one KV cache: as `--kv-unified` asks, else where drafts
    can pay under load."""
    if parallel <= 1:
        return False
    return drafts_under_load(config) if asked is None else asked


def drafts_under_load(config) -> bool:  # config: SessionConfig
    """Whether speculation can pay while several slots share the passes, so that the
    slots share one KV cache (llama.cpp passes unequal rounds in one go then; see
    LlamaModel): on a GPU, where a pass costs about the same for a few more tokens, or
    with a draft model of at most CHEAP_DRAFT of the target's bytes (on 2 CPU cores the
    F16 1.5B's 0.5B draft, 0.16, paid under load; the Q4_K_M pair's, 0.44, did not)."""
    from localspec.backends.llama import supports_gpu_offload
    from localspec.drafting import MODEL_FREE_DRAFTERS
    from localspec.models.memory import read_share
    from localspec.session import resolve_model

    if config.target_load.n_gpu_layers != 0 and supports_gpu_offload():
        return True
    if config.draft in MODEL_FREE_DRAFTERS:
        return False
    target, draft = resolve_model(config.target), resolve_model(config.draft)
    if not (target.is_file() and draft.is_file()):
        return False
    # a MoE target by the bytes a token reads (its active experts), as auto prices drafts
    return draft.stat().st_size <= CHEAP_DRAFT * target.stat().st_size * read_share(target)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from localspec.cli.run import warn
    from localspec.server.app import ServerOptions, create_app
    from localspec.server.defaults import ReasoningDefaults, SamplingDefaults
    from localspec.server.guard import Guard
    from localspec.server.shutdown import Server
    from localspec.session import open_session

    config = session_config(args)
    save_path = save_dir(args.slot_save_path)  # before the models load: a bad path is told at once
    with contextlib.ExitStack() as stack:  # the sockets and the models, however it ends
        sockets = listen(args.host, args.port)
        for sock in sockets:  # uvicorn closes them where it ran: again is harmless
            stack.callback(sock.close)
        key = args.api_key or os.environ.get("LOCALSPEC_API_KEY") or None
        if key is None and not is_loopback(args.host):
            warn(
                f"serving on {args.host} without an API key: anyone who can reach this "
                "machine can use it (set --api-key or LOCALSPEC_API_KEY)"
            )
        parallel = args.parallel or default_slots(config)
        unified = one_cache(parallel, args.kv_unified, config)
        config = replace(
            config,
            target_load=replace(config.target_load, n_seq=parallel, kv_unified=unified),
            draft_load=replace(config.draft_load, n_seq=parallel, kv_unified=unified),
        )
        session = open_session(config, say=warn)
        stack.callback(session.close)
        if apply_reasoning(session, args, warn):  # the variables every request starts from
            print(
                f"localspec: thinking {args.reasoning} where a request does not say",
                file=sys.stderr,
            )
        asked = SamplingDefaults(args.temperature, args.top_p, args.top_k, args.min_p)
        recommended = SamplingDefaults.of_model(session.target.metadata)
        sampling = asked.over(recommended)
        name = args.model_name or model_name(config.target)
        draft = Path(config.draft).stem if config.draft.endswith(".gguf") else config.draft
        options = ServerOptions(
            model_id=name,
            draft_id=draft,
            api_key=key,
            max_queue=args.max_queue,
            parallel=parallel,
            cache_reuse=args.cache_reuse,
            cache_ram=cache_ram_bytes(args.cache_ram),
            sampling=sampling,
            reasoning=ReasoningDefaults(session.reasoning_budget, args.reasoning_budget_message),
            max_tokens=args.max_tokens,
            slots_endpoint=args.slots,
            slot_save_path=save_path,
            guard=Guard.for_address(
                args.host, is_loopback(args.host), args.allowed_host, args.cors_origin
            ),
        )
        logging.basicConfig(
            level=logging.INFO, format="localspec serve: %(message)s", stream=sys.stderr
        )
        app = create_app(session, options)
        slots = f"{parallel} slot{'s' if parallel > 1 else ''} of {session.target.n_ctx} tokens"
        slots += reader_note(session.target)
        if kept := app.state.worker.prompt_cache:
            slots += f", prompts kept in up to {kept.budget / 2**30:.1f} GiB of RAM"
        if save_path is not None:
            slots += f", slots saved to and restored from {save_path}"
        if described := sampling.describe():
            if recommendation := recommended.describe():
                described += f" (the model's GGUF recommends {recommendation})"
            print(f"localspec: a request that sets none samples with {described}", file=sys.stderr)
        if (budget := session.reasoning_budget) is not None:
            print(
                f"localspec: a thinking model's reasoning ends after {budget} tokens where a "
                "request sets no budget",
                file=sys.stderr,
            )
        print(
            f"localspec: serving {name} (draft: {draft}, γ {config.gamma}; {slots}) at "
            f"{url(sockets[0])}/v1",
            file=sys.stderr,
            flush=True,
        )
        server = Server(
            uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                # uvloop and httptools where installed (our dependencies): each streamed
                # token's chunk costs Python time on the cores llama.cpp decodes with
                loop="auto",
                http="auto",
            ),
            app.state.worker,
        )
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn raises the Ctrl-C it handled
            server.run(sockets=sockets)
    return 0


def reader_note(target: object) -> str:
    """The start line's words on a CPU target's prompt reader (backends/reader.py): its
    RAM where it loaded, and where RAM was short for it, that prompts are read without."""
    if prompt_reader := getattr(target, "reader", None):
        return (
            ", long prompts read by the target loaded again not repacked "
            f"(+{prompt_reader.extra_bytes / 2**30:.1f} GiB of RAM)"
        )
    if left_out := getattr(target, "reader_left_out", 0):
        return (
            ", long prompts read by the repacked weights (the target loaded again to read "
            f"them 1.3-1.6x faster would take {left_out / 2**30:.1f} GiB more RAM than is "
            "free beside these slots' caches)"
        )
    return ""
