"""`localspec serve`: an OpenAI-compatible HTTP server over one loaded pair, for editors
and coding agents (see localspec/server/)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from pathlib import Path

from localspec.cli.options import add_model_options, ranged_int, session_config

LOOPBACK_NAMES = ("localhost",)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the pair over an OpenAI-compatible HTTP API")
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
        help="requests that may wait; beyond, a 429 with Retry-After (default: 16)",
    )
    g.add_argument("--model-name", help="the model name clients use (default: the target's)")
    p.set_defaults(func=serve)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def model_names(spec: str) -> tuple[str, tuple[str, ...]]:
    """The name a model is served as (its catalog id, or its file's stem) and the other
    names accepted for it."""
    stem = Path(spec).stem
    if spec.endswith(".gguf") or "/" in spec:
        return stem, ()
    return spec, (stem,) if stem != spec else ()


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from localspec.cli.run import warn
    from localspec.server.app import ServerOptions, create_app
    from localspec.session import open_session

    key = args.api_key or os.environ.get("LOCALSPEC_API_KEY") or None
    if key is None and not is_loopback(args.host):
        warn(
            f"serving on {args.host} without an API key: anyone who can reach this "
            "machine can use it (set --api-key or LOCALSPEC_API_KEY)"
        )
    config = session_config(args)
    session = open_session(config, say=warn)
    try:
        name, aliases = model_names(config.target)
        target_path = getattr(session.target, "path", None)
        if target_path is not None:
            aliases = (*aliases, Path(target_path).stem)
        if args.model_name:
            aliases, name = (name, *aliases), args.model_name
        draft = Path(config.draft).stem if config.draft.endswith(".gguf") else config.draft
        options = ServerOptions(
            model_id=name,
            draft_id=draft,
            aliases=tuple(dict.fromkeys(a for a in aliases if a != name)),
            api_key=key,
            max_queue=args.max_queue,
        )
        logging.basicConfig(
            level=logging.INFO, format="localspec serve: %(message)s", stream=sys.stderr
        )
        print(
            f"localspec: serving {name} (draft: {draft}, γ {config.gamma}) at "
            f"http://{args.host}:{args.port}/v1",
            file=sys.stderr,
            flush=True,
        )
        uvicorn.run(
            create_app(session, options),
            host=args.host,
            port=args.port,
            log_level="warning",
            access_log=False,
            # uvloop and httptools where installed (our dependencies): each streamed
            # token's chunk costs Python time on the cores llama.cpp decodes with
            loop="auto",
            http="auto",
        )
    finally:
        session.close()
    return 0
