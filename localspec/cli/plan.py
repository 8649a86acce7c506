"""`localspec plan`: the target + draft that fit this machine (or a what-if one), and why."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from localspec.cli.options import ctx_arg, ranged_int, rpc_endpoints, with_servers

if TYPE_CHECKING:
    from localspec.models.hardware import Hardware, Remote
    from localspec.models.planner import Plan


def add_hardware_options(p: argparse.ArgumentParser) -> None:
    """What-if overrides of the hardware probe, shared with `models`."""
    from localspec.models.hardware import HardwareError, parse_size

    def size(text: str) -> int:
        try:
            return parse_size(text)
        except HardwareError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    g = p.add_argument_group("what if (instead of this machine's)")
    g.add_argument("--vram", type=size, metavar="SIZE", help="one GPU with this much memory")
    g.add_argument("--ram", type=size, metavar="SIZE", help="this much RAM")
    g.add_argument("--gpu", choices=("none", "nvidia", "apple"), help="this kind of GPU, or none")
    g.add_argument("--cores", type=ranged_int(1, 4096), metavar="N", help="this many CPU cores")


def hardware_from(args: argparse.Namespace) -> Hardware:
    from localspec.models.hardware import Overrides, probe

    return probe(Overrides(vram=args.vram, ram=args.ram, gpu=args.gpu, cores=args.cores))


def register(sub: argparse._SubParsersAction) -> None:
    from localspec.models.planner import DEFAULT_MIN_SPEED

    p = sub.add_parser(
        "plan",
        help="the target + draft that fit this machine, and why",
        description="Pick the largest target and its draft that fit this machine's memory "
        "(or the one described by --vram/--ram/--gpu), with GPU offload, context and "
        "drafting, and say why. Speed estimates on a CPU follow what this machine's own "
        "runs measured there, once there are some (LOCALSPEC_CALIBRATION=0: the "
        "catalog's constants).",
    )
    p.add_argument(
        "--family",
        "-f",
        help="a model family (default: the catalog's default; with --installed, all)",
    )
    p.add_argument("--ctx", type=ctx_arg, help="context wanted, in tokens (default 8192)")
    p.add_argument(
        "--min-speed",
        type=float,
        default=DEFAULT_MIN_SPEED,
        metavar="TOK/S",
        help="skip targets estimated slower than this (default %(default)g)",
    )
    p.add_argument(
        "--installed",
        action="store_true",
        help="only installed models (what `run` and the chat will load)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--rpc",
        metavar="HOST:PORT[,...]",
        help="rpc-servers that would hold the target's layers: their free memory counts",
    )
    add_hardware_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localspec.models import store
    from localspec.models.catalog_file import default_catalog
    from localspec.models.explain import plan_json
    from localspec.models.planner import Request, plan_catalog, plan_installed

    catalog = default_catalog()
    hw = with_servers(hardware_from(args), rpc_endpoints(args.rpc))
    installed = store.all_installed()
    request = Request(family=args.family, n_ctx=args.ctx, min_speed=args.min_speed)
    if args.installed:
        plan = plan_installed(catalog, hw, installed, request)
    else:
        plan = plan_catalog(catalog, hw, request, installed)
    if args.json:
        data = plan_json(plan) | {"cpu_scale": round(hw.cpu_scale, 3)}
        if hw.remote:
            data["rpc_devices"] = [
                {"endpoint": r.endpoint, "free": r.free, "total": r.total} for r in hw.remote
            ]
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return 0
    if hw.remote:
        print(describe_remote(hw.remote))
    print(describe(plan, hw.cpu_scale))
    return 0


def describe_remote(devices: tuple[Remote, ...]) -> str:
    """The rpc-servers' devices, which the plan below counts for the target."""
    from localspec.models.hardware import fmt_size

    return "".join(
        f"remote   {d.endpoint}: {fmt_size(d.free)} free of {fmt_size(d.total)}\n" for d in devices
    )


def describe(plan: Plan, cpu_scale: float = 1.0) -> str:
    """The plan for people: what, where, and why; and how to get what is missing
    (`cpu_scale`: this CPU's own runs against the estimates, where they were kept)."""
    from localspec.models.explain import reasons
    from localspec.models.hardware import fmt_size

    t, d = plan.target, plan.draft
    where = f"{t.n_gpu_layers} layers on the GPU" if t.n_gpu_layers else "on the CPU"
    if t.cpu_moe:
        where += f" (the experts of {t.cpu_moe} on the CPU)"
    if plan.why.placement.remote:
        where = f"{t.n_gpu_layers} layers on the rpc-servers"
    lines = [
        f"target   {t.id} {t.quant}, {where}, context {t.n_ctx}"
        + ("" if t.path else "  (not installed)")
    ]
    if d is not None:
        lines.append(f"draft    {d.id} {d.quant}" + ("" if d.path else "  (not installed)"))
    drafter = {
        "draft": f"the draft model, γ={plan.gamma} to start (estimated x{plan.speedup:.2f})",
        "ngram": "n-gram prompt lookup",
        "none": "none",
    }[plan.drafter]
    lines.append(f"drafter  {drafter}")
    estimated = "estimated"
    if cpu_scale != 1 and t.n_gpu_layers == 0:
        estimated += f", scaled x{1 / cpu_scale:.2f} by this CPU's own runs"
    lines.append(f"speed    ~{plan.tokens_per_s:.1f} tokens/s plain decoding ({estimated})")
    memory = f"{fmt_size(plan.ram_estimate)} of {fmt_size(plan.ram_budget)} RAM"
    if plan.vram_budget:
        memory = f"{fmt_size(plan.vram_estimate)} of {fmt_size(plan.vram_budget)} GPU, " + memory
    if remote := plan.why.placement.remote:
        memory = f"{fmt_size(remote)} of {fmt_size(plan.why.budget.remote)} remote, " + memory
    if plan.why.reader_fits:
        memory += f", {fmt_size(plan.why.reader)} of it a second copy that reads prompts"
    lines.append(f"memory   {memory}")
    serve = (
        f"serve    {plan.slots} slot{'s' if plan.slots > 1 else ''} of {t.n_ctx} tokens "
        "(requests decoded at once, each with its own cache)"
    )
    if 0 < (room := plan.why.reader_slots) < plan.slots:
        serve += f"; beside more than {room} the second copy has no room"
    lines.append(serve)
    lines.append("")
    lines.extend(f"- {r}" for r in reasons(plan))
    missing = [f"{s.id}:{s.quant}" for s in (t, d) if s is not None and not s.path]
    if missing:
        lines.append("")
        lines.append(f"To get it: localspec pull {' '.join(missing)}")
    return "\n".join(lines)
