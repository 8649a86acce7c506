#!/usr/bin/env python3
"""The engine's per-round overhead against the target's pass time, on the GPU and the CPU.

Loads a target and a draft GGUF (scripts/make_tiny_gguf.py builds tiny ones with the
real Qwen2 vocabulary) with all layers offloaded (`--devices gpu`) or none (`cpu`), and
for each engine configuration (plain decoding, draft model γ 4, n-gram γ 4, auto) runs a
few prompts and reports, per round:

- `overhead` (the engine's own figure): Stats.overhead_s / rounds, with Stats.overhead_s
  = draft_s + verify_s - llama_s (Python inside the timed draft and verify calls);
- `loop` overhead: (decode wall time - time inside llama.cpp) / rounds, measured from
  outside the engine, so it also counts what the engine does not time: the verdict
  (argmax), emitting pieces, rollback, the Stats snapshot and the RoundEnd event;
- each as a share of the round, next to the target's own pass time for 1 and 5 tokens
  (Model.evaluate of a token after a fixed prefix, median of `--reps`).

Prints `llama_supports_gpu_offload()`, the GPU's name and a Markdown table; writes
everything as JSON (and, with --profile, cProfile's top functions per round) to --out.

    python scripts/gpu_overhead.py --target T.gguf --draft D.gguf --out DIR

`--context N` puts about N tokens of earlier text (the bench's prompts, in turn) before
each prompt, as a long chat or a pasted file does: what a round costs in Python beyond
the passes may grow with the context (prefix checks, the drafters' indexes). `--warm`
answers each prompt with 8 tokens before its timed run, so that the rounds timed find the
drafters' indexes built, as a conversation's next turn does (else the first round's
indexing of the context counts among them). For `--context 30000`, tiny models of a
longer context: `make_tiny_gguf.py --n-ctx 32768`.
"""

from __future__ import annotations

# isort: off
# llama_cpp (libllama and the ggml backends) must load before numpy: on the H100 machine,
# with the CUDA build, a model load crashed (SIGSEGV in llama_model::print_info's
# std::stringstream) whenever numpy had been imported first. See docs/gpu-overhead.md.
import localspec.backends.llama  # noqa: F401
# isort: on

import argparse
import cProfile
import io
import itertools
import json
import platform
import pstats
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from localspec.backends.llama import LlamaModel, LoadOptions, supports_gpu_offload
from localspec.bench import runner
from localspec.bench.costs import PassTimes, time_pass
from localspec.bench.suite import load_prompts
from localspec.decoding.adaptive import auto_engine
from localspec.decoding.drafters import DraftModel, NgramDrafter, NoDrafter
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Finished, Piece

PROMPTS = {
    "code": "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "edit": "Rename the variable x to count everywhere and return only the code:\n\n"
    "def total(items):\n    x = 0\n    for item in items:\n        x += item.price\n"
    "    return x\n",
    "chat": "In two sentences: why do cats purr?",
}
CONFIGS = ("plain", "draft γ4", "ngram γ4", "auto")


@dataclass
class RunFigures:
    """One configuration's totals over all prompts."""

    config: str
    answers: int = 0
    tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    llama_s: float = 0.0
    overhead_s: float = 0.0  # Stats.overhead_s, summed
    decode_wall_s: float = 0.0  # first token to Finished, as the caller sees it
    decode_llama_s: float = 0.0  # llama time in that span (both models)

    def add(self, stats_fin: Finished, decode_wall_s: float, decode_llama_s: float) -> None:
        s = stats_fin.stats
        self.answers += 1
        self.tokens += s.tokens
        self.rounds += s.rounds
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.draft_s += s.draft_s
        self.verify_s += s.verify_s
        self.llama_s += s.llama_s
        self.overhead_s += s.overhead_s
        self.decode_wall_s += decode_wall_s
        self.decode_llama_s += decode_llama_s

    def summary(self) -> dict[str, float]:
        r = max(self.rounds, 1)
        round_s = self.decode_wall_s / r
        loop_s = (self.decode_wall_s - self.decode_llama_s) / r
        return {
            "round_ms": round_s * 1e3,
            "llama_per_round_ms": self.decode_llama_s / r * 1e3,
            "overhead_ms": self.overhead_s / r * 1e3,
            "overhead_share": self.overhead_s / max(self.draft_s + self.verify_s, 1e-12),
            "loop_overhead_ms": loop_s * 1e3,
            "loop_overhead_share": loop_s / max(round_s, 1e-12),
            "tokens_per_round": (self.tokens - self.answers) / r,  # less each prefill's token
            "acceptance": self.accepted / self.drafted if self.drafted else 0.0,
            "tokens_per_s": self.tokens / self.decode_wall_s if self.decode_wall_s else 0.0,
        }


@dataclass
class DeviceReport:
    device: str
    n_gpu_layers: int
    target_pass: list[PassTimes] = field(default_factory=list)
    draft_pass: list[PassTimes] = field(default_factory=list)
    runs: list[RunFigures] = field(default_factory=list)
    profile: dict[str, str] = field(default_factory=dict)
    audit: dict[str, list[str]] = field(default_factory=dict)  # config: a line per prompt


def progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def gpu_name() -> str:
    """The GPU's name and driver from nvidia-smi, or why there is none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return out.stdout.strip() or "nvidia-smi printed nothing"
    except (OSError, subprocess.SubprocessError) as e:
        return f"no GPU found ({type(e).__name__})"


def with_context(model: LlamaModel, prompt: str, context: int) -> list[int]:
    """The prompt's tokens after about `context` tokens of earlier text."""
    tokens = model.tokenize(prompt)
    if context <= len(tokens):
        return tokens
    texts = [p.prompt for p in load_prompts()]
    earlier: list[int] = []
    for i in itertools.count():
        if len(earlier) >= context - len(tokens):
            break
        earlier += model.tokenize(texts[i % len(texts)] + "\n\n", special=False)
    return earlier[: context - len(tokens)] + tokens


def make_engine(config: str, target: LlamaModel, draft: LlamaModel) -> Engine:
    if config == "plain":
        return Engine(target, NoDrafter(), 0)
    if config == "draft γ4":
        return Engine(target, DraftModel(draft, p_min=0.0), 4)  # always a full γ
    if config == "ngram γ4":
        return Engine(target, NgramDrafter(), 4)
    if config == "auto":
        return auto_engine(target, draft)
    raise ValueError(config)


def run_once(
    engine: Engine, prompt: list[int], config: GenerationConfig, models: list[LlamaModel]
) -> tuple[Finished, float, float]:
    """One answer: (Finished, decode wall s, llama s in the decode), timed from outside."""
    first_at = first_busy = None
    for event in engine.generate(prompt, config):
        if first_at is None and isinstance(event, Piece):
            first_at, first_busy = time.perf_counter(), sum(m.busy_s for m in models)
        if isinstance(event, Finished):
            end, end_busy = time.perf_counter(), sum(m.busy_s for m in models)
            assert first_at is not None and first_busy is not None
            return event, end - first_at, end_busy - first_busy
    raise RuntimeError("the engine ended without a Finished event")


def measure(
    device: str,
    target_path: Path,
    draft_path: Path,
    max_tokens: int,
    reps: int,
    configs: tuple[str, ...],
    profile: tuple[str, ...],
    threads: int = 0,
    context: int = 0,
    check: bool = False,
    warm: bool = False,
) -> DeviceReport:
    layers = -1 if device == "gpu" else 0
    n_ctx = max(2048, context + max_tokens + 256)
    options = LoadOptions(n_ctx=n_ctx, n_gpu_layers=layers, n_threads=threads)
    target = LlamaModel(target_path, options)
    draft = LlamaModel(draft_path, options)
    report = DeviceReport(device, layers)
    progress(f"{device}: loaded both models")
    try:
        prompts = [with_context(target, p, context) for p in PROMPTS.values()]
        prefix = prompts[0]
        for k in (1, 5):
            report.target_pass.append(time_pass(target, prefix, k, reps, warmup=3))
        report.draft_pass.append(time_pass(draft, prefix, 1, reps, warmup=3))
        progress(f"{device}: pass times {[asdict(p) for p in report.target_pass]}")
        gen = GenerationConfig(max_tokens=max_tokens)
        for name in configs:
            engine = make_engine(name, target, draft)
            list(engine.generate(prompts[0], GenerationConfig(max_tokens=16)))  # warm up
            figures = RunFigures(name)
            for prompt in prompts:
                if warm:  # the caches and indexes hold the prompt, as at a chat's next turn
                    list(engine.generate(prompt, GenerationConfig(max_tokens=8)))
                figures.add(*run_once(engine, prompt, gen, [target, draft]))
            report.runs.append(figures)
            progress(f"{device}: {name}: {figures.summary()}")
            if name in profile:
                report.profile[name] = profile_engine(
                    make_engine(name, target, draft), prompts, gen
                )
        if check:
            report.audit = audit_configs(configs, target, draft, prompts, max_tokens)
            progress(f"{device}: audit {report.audit}")
    finally:
        target.close()
        draft.close()
    return report


def audit_configs(
    configs: tuple[str, ...],
    target: LlamaModel,
    draft: LlamaModel,
    prompts: list[list[int]],
    max_tokens: int,
) -> dict[str, list[str]]:
    """Each configuration's greedy answers against plain decoding's, cold, as the bench
    checks them: "identical", or where they part and the audit's verdict (numerics: the
    one-token and the batched pass really pick differently there; DEFECT: anything else)."""
    plain = [
        runner.run_once(make_engine("plain", target, draft), target, draft, p, max_tokens)
        for p in prompts
    ]
    out: dict[str, list[str]] = {}
    for name in (c for c in configs if c != "plain"):
        lines = []
        for base, prompt in zip(plain, prompts, strict=True):
            engine = make_engine(name, target, draft)
            other = runner.run_once(engine, target, draft, prompt, max_tokens)
            agreed = runner.agreement(target, base, other)
            assert agreed is not None  # both runs are ours, with traces
            lines.append(agreed.divergence.label() if agreed.divergence else "identical")
        out[name] = lines
    return out


def profile_engine(engine: Engine, prompts: list[list[int]], gen: GenerationConfig) -> str:
    """cProfile's top functions by own time, in µs per round (cProfile inflates Python)."""
    rounds = 0
    prof = cProfile.Profile()
    for prompt in prompts:
        prof.enable()
        events = list(engine.generate(prompt, gen))
        prof.disable()
        fin = events[-1]
        assert isinstance(fin, Finished)
        rounds += fin.stats.rounds
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, func), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((tottime, cumtime, ncalls, f"{Path(file).name}:{line}({func})"))
    rows.sort(reverse=True)
    out = io.StringIO()
    out.write(f"{rounds} rounds; µs per round: own, cumulative; calls per round\n")
    for tottime, cumtime, ncalls, where in rows[:25]:
        out.write(
            f"{tottime / rounds * 1e6:9.1f} {cumtime / rounds * 1e6:9.1f} "
            f"{ncalls / rounds:6.2f}  {where}\n"
        )
    return out.getvalue()


def table(reports: list[DeviceReport]) -> str:
    lines = [
        "| device | config | T(1) ms | round ms | llama/round ms | overhead ms (share) "
        "| loop overhead ms (share) | tokens/round | acceptance | tok/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rep in reports:
        t1 = rep.target_pass[0].llama_s * 1e3
        for run in rep.runs:
            s = run.summary()
            lines.append(
                f"| {rep.device} | {run.config} | {t1:.3f} | {s['round_ms']:.3f} "
                f"| {s['llama_per_round_ms']:.3f} "
                f"| {s['overhead_ms']:.3f} ({s['overhead_share']:.1%}) "
                f"| {s['loop_overhead_ms']:.3f} ({s['loop_overhead_share']:.1%}) "
                f"| {s['tokens_per_round']:.2f} | {s['acceptance']:.0%} "
                f"| {s['tokens_per_s']:.0f} |"
            )
    return "\n".join(lines)


def pass_lines(reports: list[DeviceReport]) -> str:
    lines = []
    for rep in reports:
        for which, passes in (("target", rep.target_pass), ("draft", rep.draft_pass)):
            for p in passes:
                lines.append(
                    f"{rep.device}: {which} pass of {p.tokens} token(s): "
                    f"{p.llama_s * 1e3:.3f} ms in llama.cpp, {p.wall_s * 1e3:.3f} ms "
                    f"around Model.evaluate"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("bench-out/gpu-overhead"))
    parser.add_argument("--devices", default="gpu,cpu", help="comma list of gpu, cpu")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=50, help="timed passes per pass size")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0 = physical cores)")
    parser.add_argument("--gpu-name", default="", help="the GPU's name (skips nvidia-smi)")
    parser.add_argument(
        "--context", type=int, default=0, help="tokens of earlier text before each prompt"
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="answer each prompt briefly before its timed run (the indexes built)",
    )
    parser.add_argument(
        "--audit",
        action="store_true",
        help="check each configuration's greedy answers against plain decoding's",
    )
    parser.add_argument(
        "--profile", default="", help="comma list of configs to cProfile (first device only)"
    )
    args = parser.parse_args(argv)

    import llama_cpp

    gpu = args.gpu_name or gpu_name()
    print(f"python {platform.python_version()}, llama-cpp-python {llama_cpp.__version__}")
    print(f"GPU: {gpu}", flush=True)
    configs = tuple(c for c in args.configs.split(",") if c)
    profile = tuple(c for c in args.profile.split(",") if c)
    reports: list[DeviceReport] = []
    for device in (d for d in args.devices.split(",") if d):
        started = time.perf_counter()
        rep = measure(
            device,
            args.target,
            args.draft,
            args.max_tokens,
            args.reps,
            configs,
            () if reports else profile,  # cProfile on the first device only
            args.threads,
            args.context,
            args.audit,
            args.warm,
        )
        reports.append(rep)
        print(f"{device}: measured in {time.perf_counter() - started:.1f} s", flush=True)
        for name, text in rep.profile.items():
            print(f"\ncProfile, {device}, {name}:\n{text}")
    offload = supports_gpu_offload()
    print(f"llama_supports_gpu_offload() = {offload}")

    args.out.mkdir(parents=True, exist_ok=True)
    data = {
        "gpu": gpu,
        "gpu_offload": offload,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "max_tokens": args.max_tokens,
        "context": args.context,
        "reports": [
            {**asdict(r), "summaries": {run.config: run.summary() for run in r.runs}}
            for r in reports
        ],
    }
    (args.out / "gpu_overhead.json").write_text(json.dumps(data, indent=2))
    print()
    print(pass_lines(reports))
    print()
    print(table(reports))
    for rep in reports:
        for name, lines in rep.audit.items():
            same = lines.count("identical")
            print(f"{rep.device}: {name}: {same}/{len(lines)} answers as plain decoding's")
            for line in (x for x in lines if x != "identical"):
                print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
