"""`localspec bench`: every mode side by side on one prompt suite; Markdown, JSON, PNG."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from localspec.cli.options import (
    add_draft_quant,
    add_repack_option,
    add_rpc_option,
    ctx_arg,
    max_tokens_arg,
    ranged_int,
    rpc_endpoints,
    threads_arg,
)
from localspec.errors import LocalspecError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure speedups: every mode on the same models, prompt by prompt",
        description="Runs plain decoding and each speculative mode on every prompt, "
        "interleaved, greedy, on the same loaded models; writes bench.md, bench.json and "
        "bench.png, and prints the Markdown.",
    )
    g = p.add_argument_group("models")
    g.add_argument(
        "--target",
        "-t",
        help="target: a .gguf path or a catalog id (default: the machine's default pair)",
    )
    g.add_argument("--draft", "-d", help="draft: a .gguf path, a catalog id, or 'none'")
    g.add_argument(
        "--threads", type=threads_arg, default=0, help="CPU threads (default: physical cores)"
    )
    g.add_argument(
        "--ctx", type=ctx_arg, default=4096, help="context size in tokens (default 4096)"
    )
    g.add_argument(
        "--n-gpu-layers",
        type=int,
        default=-1,
        help="target layers to offload to a GPU (default: all)",
    )
    add_draft_quant(g)
    add_repack_option(g)
    add_rpc_option(g)
    g.add_argument(
        "--rpc-rtt-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="with --rpc: add this round-trip time to every server, through a relay on "
        "127.0.0.1 (localspec and the peer alike; default 0)",
    )
    g.add_argument(
        "--peer-rpc",
        metavar="HOST:PORT[,...]",
        help="with --rpc and the peer modes: the rpc-servers llama.cpp's binaries use, as "
        "many as --rpc's and set up alike (an rpc-server serves one client at a time, and "
        "localspec holds its own; scripts/rpc_bench.sh starts both sets)",
    )
    b = p.add_argument_group("bench")
    b.add_argument(
        "--prompts",
        type=Path,
        help='prompts file {"name": {"category": ..., "prompt": ...}} '
        "(default: the suite shipped with localspec)",
    )
    b.add_argument(
        "--suite",
        choices=("localspec", "specbench", "fim", "json"),
        default="localspec",
        help="localspec: the prompts file (--prompts); specbench: a seeded sample of "
        "Spec-Bench's questions, first turns; fim: code completion (/infill) on cuts of "
        "the standard library, localspec serve against llama-server; json: structured output "
        "(response_format json_schema), localspec serve against llama-server "
        "(default: %(default)s)",
    )
    b.add_argument(
        "--cases",
        type=int,
        default=12,
        help="--suite fim: completion cases, one-line, few-line and block middles in turn "
        "(default %(default)s)",
    )
    b.add_argument(
        "--specbench",
        type=Path,
        metavar="QUESTION_JSONL",
        help="Spec-Bench's question.jsonl (default: $LOCALSPEC_SPECBENCH, else "
        "shared/specbench/question.jsonl beside the repository)",
    )
    b.add_argument(
        "--per-category",
        type=int,
        default=2,
        help="Spec-Bench questions per category (default %(default)s)",
    )
    b.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the Spec-Bench sample and of the fim suite's cases (default 0)",
    )
    b.add_argument(
        "--list-prompts",
        action="store_true",
        help="run nothing: print the prompts a run would use, as a prompts file (--prompts)",
    )
    b.add_argument("--only", help="comma-separated prompt names or categories to run")
    b.add_argument(
        "--modes",
        default="baseline,draft,ngram,auto",
        help="comma-separated: baseline, draft, ngram, mtp (the target's own MTP head), "
        "auto, draft-gN, ngram-gN, mtp-gN, and llama.cpp's own binaries as the peer: "
        "peer (its speculative example, γ 3; peer-gN, which bring peer-plain along), peer-plain "
        "(default: %(default)s; baseline always runs)",
    )
    b.add_argument(
        "--gamma",
        "-g",
        type=ranged_int(0, 32),
        default=4,
        help="γ of the draft, ngram and mtp modes (default 4)",
    )
    b.add_argument(
        "--max-tokens",
        "-n",
        type=max_tokens_arg,
        default=128,
        help="new tokens per answer (default 128)",
    )
    b.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="--suite json: sample at this temperature (OpenAI's top_p 1, top_k 40 and min_p "
        "0.05 on every server, a seed per case) instead of decoding greedily (default 0)",
    )
    b.add_argument(
        "--repeats",
        type=ranged_int(1, 1000),
        default=1,
        help="runs of each prompt and mode; figures are medians (default 1; --suite json: "
        "each repeat from servers started afresh)",
    )
    b.add_argument(
        "--out",
        type=Path,
        help="directory for bench.md/json/png "
        "(default: a new one in $LOCALSPEC_HOME/bench; on Linux without it, "
        "~/.local/share/localspec/bench)",
    )
    b.add_argument(
        "--peer",
        type=Path,
        help="JSON from scripts/peer_speculative.sh run --out: "
        "adds llama.cpp's speculative example, prompt for prompt",
    )
    b.add_argument(
        "--peer-bin",
        type=Path,
        help="llama.cpp binaries for the peer modes "
        "(default: where scripts/peer_speculative.sh build puts them)",
    )
    b.add_argument("--no-chart", action="store_true", help="skip the PNG")
    b.add_argument(
        "--no-costs",
        action="store_true",
        help="skip timing the target's passes and the draft's step before the runs "
        "(the report's 'What speculation has to work with': 50-odd passes, slow "
        "over --rpc or with a large model)",
    )
    b.add_argument(
        "--render",
        type=Path,
        metavar="BENCH_JSON",
        help="run nothing: render the Markdown (and PNG) of an earlier run again from its "
        "bench.json, beside it, and print the Markdown",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localspec.bench.delay import delayed
    from localspec.bench.report import render

    if args.render is not None:
        md, *_ = render(args.render, chart=not args.no_chart)
        print(md.read_text(encoding="utf-8"), end="")
        return 0
    if args.temperature and args.suite != "json":
        raise LocalspecError("--temperature is for --suite json (the other suites are greedy)")
    if not 0 <= args.temperature <= 2:
        raise LocalspecError("--temperature must be between 0 and 2")
    if args.suite in ("fim", "json"):
        check_server_suite(args)
        return bench_servers(args, output_dir(args.out))
    prompts, suite = choose_prompts(args)
    if args.list_prompts:
        from localspec.bench.specbench import as_prompts_file

        print(as_prompts_file(prompts), end="")
        return 0
    rpc, peer_rpc = rpc_endpoints(args.rpc), rpc_endpoints(args.peer_rpc)
    check_rpc(rpc, peer_rpc, args.rpc_rtt_ms)
    out = output_dir(args.out)
    with delayed(rpc + peer_rpc, args.rpc_rtt_ms / 1e3) as endpoints:
        ours, peers = endpoints[: len(rpc)], endpoints[len(rpc) :]
        where = placement(rpc, peer_rpc, args.rpc_rtt_ms)
        return bench(args, prompts, suite, out, ours, peers, where)


def bench_servers(args: argparse.Namespace, out: Path) -> int:
    """The suites served over HTTP: `localspec serve` (plain and auto) against
    llama-server (plain, -md, ngram-mod), every case on every server: code completion
    (localspec.bench.fim) or structured output (localspec.bench.structured)."""
    from localspec.backends.llama import default_threads
    from localspec.bench import fim, structured
    from localspec.bench.peer import default_bin_dir
    from localspec.bench.servers import PairSetup

    target, draft = resolve_pair(args.target, args.draft)
    llama_server = (args.peer_bin or default_bin_dir()) / "llama-server"
    if not llama_server.exists():
        raise LocalspecError(
            f"{llama_server} not found: run scripts/peer_speculative.sh build llama-server "
            "(or pass --peer-bin)"
        )
    setup = PairSetup(
        target=target,
        draft=draft,
        peer_draft=draft_file(draft, target, args) if draft is not None else None,
        threads=args.threads or default_threads(),
        n_ctx=args.ctx,
        llama_server=llama_server,
        repack=args.repack,
        prompt_reader=args.prompt_reader,
    )

    def progress(line: str) -> None:
        print(f"bench: {line}", file=sys.stderr, flush=True)

    if args.suite == "json":
        report = structured.run_json(
            setup, args.max_tokens, out / "logs", args.repeats, progress, args.temperature
        )
        structured.audit_agreement(report, setup)
        print(structured.to_markdown(report))
        paths = structured.write(report, out)
    else:
        cases = fim.cut_cases(args.cases, args.seed)
        completions = fim.run_fim(setup, cases, args.max_tokens, out / "logs", progress)
        fim.audit_agreement(completions, cases, setup, args.max_tokens)
        print(fim.to_markdown(completions))
        paths = fim.write(completions, out)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def check_server_suite(args: argparse.Namespace) -> None:
    """The fim and json suites run their own cases and modes: an option of the prompt
    suites would be ignored there, so it is refused."""
    if args.cases < 1:
        raise LocalspecError("--cases must be at least 1")
    ignored = {
        "--rpc": args.rpc,
        "--prompts": args.prompts,
        "--modes": args.modes != "baseline,draft,ngram,auto",
        "--list-prompts": args.list_prompts,
        "--only": args.only,
        "--peer": args.peer,
        "--repeats": args.suite == "fim" and args.repeats != 1,
    }
    if given := [name for name, on in ignored.items() if on]:
        raise LocalspecError(
            f"--suite {args.suite} runs its own cases and modes: drop {', '.join(given)}"
        )


def check_rpc(rpc: tuple[str, ...], peer_rpc: tuple[str, ...], rtt_ms: float) -> None:
    if rtt_ms and not rpc:
        raise LocalspecError("--rpc-rtt-ms adds latency to RPC servers: pass them with --rpc")
    if not 0 <= rtt_ms <= 1000:
        raise LocalspecError("--rpc-rtt-ms must be between 0 and 1000")
    if peer_rpc and not rpc:
        raise LocalspecError("--peer-rpc is the peer's copy of --rpc's servers: pass both")
    if peer_rpc and len(peer_rpc) != len(rpc):
        raise LocalspecError(
            f"--peer-rpc names {len(peer_rpc)} server(s) and --rpc {len(rpc)}: "
            "the peer's split must be the same as localspec's"
        )
    if shared := set(rpc) & set(peer_rpc):
        raise LocalspecError(
            f"{', '.join(sorted(shared))} is in both --rpc and --peer-rpc: an rpc-server "
            "serves one client at a time, so the peer needs servers of its own"
        )


def bench(
    args,
    prompts,
    suite,
    out: Path,
    rpc: tuple[str, ...],
    peer_rpc: tuple[str, ...],
    where: str | None,
) -> int:
    """Run the bench on the resolved prompts; `rpc` and `peer_rpc`: localspec's and the
    peer's servers as they reach them."""
    from localspec.backends.llama import default_threads
    from localspec.bench.machine import machine_load
    from localspec.bench.markdown import to_markdown
    from localspec.bench.modes import parse_modes
    from localspec.bench.peer import load_peer
    from localspec.bench.report import write_report
    from localspec.bench.runner import BenchConfig, run_bench

    target_path, draft_path = resolve_pair(args.target, args.draft)
    if draft_path is not None:  # the file both localspec and the peer draft with
        draft_path = draft_file(draft_path, target_path, args)
    modes = parse_modes(args.modes, args.gamma, have_draft=draft_path is not None)
    peer = load_peer(args.peer) if args.peer else None
    peer_bin = None
    if any(m.is_peer for m in modes):
        if peer is not None:
            raise LocalspecError("--peer FILE and the peer modes do the same; pick one")
        if rpc and not peer_rpc:
            raise LocalspecError(
                "the peer modes with --rpc need servers of their own (--peer-rpc): an "
                "rpc-server serves one client at a time, and localspec holds --rpc's"
            )
        peer_bin = peer_binaries(args, target_path, draft_path, modes, peer_rpc)

    if (load := machine_load()) > 0.5 * (os.cpu_count() or 1):
        print(
            f"bench: the machine is busy (load {load:.1f} on {os.cpu_count()} CPUs): "
            "timings will be noisy",
            file=sys.stderr,
        )
    target, draft = load_models(target_path, draft_path, args, rpc)
    try:
        print(
            f"bench: {len(prompts)} prompts × {len(modes)} modes × {args.repeats} "
            f"on {target.name}" + (f" + {draft.name}" if draft else ""),
            file=sys.stderr,
        )
        report = run_bench(
            target,
            draft,
            prompts,
            modes,
            BenchConfig(max_tokens=args.max_tokens, repeats=args.repeats, costs=not args.no_costs),
            progress=ProgressLine(sys.stderr),
            peer=peer,
            threads=args.threads or default_threads(),
            peer_bin=peer_bin,
            suite=suite,
            placement=where,
        )
    finally:
        target.close()
        if draft is not None:
            draft.close()
    print(to_markdown(report))  # first: a full disk must not lose the figures
    for r in report.defects():  # said in the report too; a log should not miss it either
        label = r.agreement.label() if r.agreement else ""
        print(f"bench: DEFECT: {r.prompt} {r.mode}: {label}", file=sys.stderr)
    try:
        paths = write_report(report, out, chart=not args.no_chart)
    except OSError as e:
        raise LocalspecError(f"could not write the report to {out}: {e.strerror or e}") from e
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    if report.info.interrupted:
        raise KeyboardInterrupt  # reported, but still an interrupted run (exit 130)
    return 0


def choose_prompts(args: argparse.Namespace):  # -> (tuple[BenchPrompt, ...], str | None)
    """The prompts to run, `--only` applied, and the suite's name for the report (None:
    a prompts file)."""
    from localspec.bench import specbench
    from localspec.bench.suite import load_prompts, select_prompts

    if args.suite == "localspec":
        if args.specbench is not None:
            raise LocalspecError("--specbench needs --suite specbench")
        return select_prompts(load_prompts(args.prompts), args.only), None
    if args.prompts is not None:
        raise LocalspecError("--prompts and --suite specbench name two suites; pick one")
    sample = specbench.Sample(args.per_category, args.seed)
    prompts = select_prompts(specbench.load_sample(args.specbench, sample), args.only)
    return prompts, specbench.describe(sample, len(prompts))


def resolve_pair(target: str | None, draft: str | None) -> tuple[Path, Path | None]:
    """Paths of the target and draft: as given, else the machine's default pair."""
    from localspec.session import resolve_file

    if target is None:
        try:
            from localspec.models.pairing import default_pair
        except ImportError:
            raise LocalspecError("--target is required (no default pair yet)") from None
        pair = default_pair(draft)
        target, draft = pair.target, draft or pair.draft
    if draft == "ngram":
        raise LocalspecError(
            "--draft ngram: the ngram mode needs no draft; pass a draft model, or 'none'"
        )
    # said first: what else is wrong matters once the files are there
    return resolve_file(target), None if draft in (None, "none") else resolve_file(draft)


def placement(rpc: tuple[str, ...], peer_rpc: tuple[str, ...], rtt_ms: float) -> str | None:
    """Where the target runs, for the report (None: all on this machine)."""
    if not rpc:
        return None
    added = f", {rtt_ms:g} ms round-trip time added to each (a relay)" if rtt_ms else ""
    peer = f"; the peer's on its own, set up alike ({', '.join(peer_rpc)})" if peer_rpc else ""
    return f"The target's layers on {len(rpc)} rpc-server(s) ({', '.join(rpc)}){added}{peer}"


def peer_binaries(
    args: argparse.Namespace, target: Path, draft: Path | None, modes, rpc: tuple[str, ...]
):
    """llama.cpp's binaries for the peer modes, checked before any model loads."""
    from localspec.backends.llama import default_threads
    from localspec.bench.peer import LlamaCppPeer, default_bin_dir

    runner = LlamaCppPeer(
        bin_dir=args.peer_bin or default_bin_dir(),
        target=target,
        draft=draft,
        threads=args.threads or default_threads(),
        n_ctx=args.ctx,
        n_gpu_layers=args.n_gpu_layers,
        rpc=rpc,
    )
    runner.check(speculative=any(m.kind == "peer" for m in modes))
    return runner


def draft_file(path: Path, target: Path, args: argparse.Namespace) -> Path:
    from localspec.backends.quantize import draft_to_load
    from localspec.session import draft_on_gpu

    on_gpu = draft_on_gpu(draft_options(args))
    return draft_to_load(
        path,
        on_gpu,
        args.draft_quant,
        lambda line: print(f"bench: {line}", file=sys.stderr),
        target,
    )


def draft_options(args: argparse.Namespace):  # -> LoadOptions
    from localspec.backends.llama import LoadOptions

    return LoadOptions(n_ctx=args.ctx, n_threads=args.threads)


def load_models(
    target_path: Path, draft_path: Path | None, args: argparse.Namespace, rpc: tuple[str, ...]
):
    from localspec.backends.gguf import is_assistant
    from localspec.backends.llama import LoadOptions
    from localspec.backends.mtp import AssistantHead, adopt
    from localspec.cli.options import has_mtp_head
    from localspec.drafting import GAMMA_MAX
    from localspec.session import load_pair

    target_load = LoadOptions(
        n_ctx=args.ctx,
        n_threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        rpc=rpc,
        rollback=GAMMA_MAX,  # a hybrid target's state snapshots (see LoadOptions)
        mtp=has_mtp_head(str(target_path)),
        repack=args.repack,
        prompt_reader=args.prompt_reader,  # none where nothing is repacked
    )
    if draft_path is not None and is_assistant(draft_path):  # Gemma 4's: the target's head
        target, _ = load_pair(target_path, target_load, None, draft_options(args))
        try:
            adopt(target, AssistantHead(target, draft_path))
        except BaseException:
            target.close()
            raise
        return target, None
    return load_pair(target_path, target_load, draft_path, draft_options(args))


def output_dir(out: Path | None) -> Path:
    """Where the report goes, checked before a long run rather than after it: `--out`
    made now, the default one (a new directory per run) made when written."""
    if out is None:
        out = default_out_dir()
        existing = next(p for p in out.parents if p.exists() or p == p.parent)
        if not (existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)):
            raise LocalspecError(f"cannot write bench reports under {existing} (use --out DIR)")
        return out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LocalspecError(f"--out {out}: {e.strerror or e}") from e
    if not os.access(out, os.W_OK | os.X_OK):
        raise LocalspecError(f"--out {out}: not writable")
    return out


def default_out_dir() -> Path:
    from localspec.paths import home

    return home() / "bench" / time.strftime("%Y%m%d-%H%M%S")


class ProgressLine:
    """One line per run on stderr: overwritten in place on a terminal, appended in logs."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.perf_counter()

    def __call__(self, event) -> None:  # event: runner.Progress
        from localspec.bench.machine import CONTENDED

        head = (
            f"[{event.done + (event.figures is None):>{len(str(event.total))}}/"
            f"{event.total}] {event.prompt.name:<24} {event.mode.name:<10}"
        )
        if event.figures is None:
            if self.tty:
                self.stream.write(f"\r\033[K{head} …{self._eta(event)}")
                self.stream.flush()
            return
        f = event.figures
        line = f"{head} {f.tokens_per_s:6.2f} tok/s"
        if event.speedup is not None and event.mode.kind != "baseline":
            line += f"  {event.speedup:.2f}×"
        if f.drafted:
            line += f"  accept {f.acceptance_rate:.0%}"
        if f.cpu_share is not None and f.cpu_share < CONTENDED:
            line += f"  (noisy: {f.cpu_share:.0%} of the CPU)"
        self.stream.write(("\r\033[K" if self.tty else "") + line + "\n")
        self.stream.flush()

    def _eta(self, event) -> str:
        if not event.done:
            return ""
        left = (time.perf_counter() - self.started) / event.done * (event.total - event.done)
        return f"  ({left / 60:.0f} min left)" if left >= 60 else f"  ({left:.0f} s left)"
