"""`localspec bench --suite fim`: code completion as editors ask for it, against
llama.cpp's `llama-server /infill`.

The cases are cut from code no one here wrote (the Python standard library's sources, a
seeded choice of file and cursor): a middle of one line, of a few lines, or a function's
body, with the lines before the cursor as the prefix, those after it as the suffix, and a
chunk of another file of the same package as `input_extra`, the body llama.vim and
llama.vscode send. Every server gets the same requests, greedy, case for case and in a
rotating order (one machine state for all): `localspec serve` decoding plainly and with
`--gamma auto`, and `llama-server` plain, with the draft model (`-md`) and with its
`ngram-mod` drafter. Each case is then sent again with one more character typed, as the
next keystroke would, and once more after the middle's first line is written and Enter
pressed: how much of the prompt each server reads again, and how long it takes.

Per mode: latency (client side, request to answer: what an editor waits), its p50 and
p95, the decode part alone (the server's predicted_ms), exact matches with the true
middle, and agreement with localspec's plain decoding (each difference audited: the two
tokens' logits at the first difference, in one pass of the target).
"""

from __future__ import annotations

import ast
import difflib
import json
import platform
import random
import statistics
import sysconfig
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from localspec.bench.audit import JUDGED, judge
from localspec.bench.servers import MODES, PairSetup, settle, start_pair_servers
from localspec.errors import LocalspecError
from localspec.paths import write_atomic

if TYPE_CHECKING:
    from localspec.backends.base import Model
    from localspec.server.infill import InfillPrompt

KINDS = ("line", "lines", "block")
# llama.vim sends 256 lines before the cursor, 64 after and chunks of 64 lines; these
# are smaller, so that a case takes seconds, not a minute, on a laptop's CPU
PREFIX_LINES, SUFFIX_LINES, EXTRA_LINES = 32, 8, 24
# where llama-server's middle differs from localspec's: not a near-tie to judge
ANOTHER = "another prompt (llama-server reads the typed text before the suffix)"
MAX_BLOCK = 12  # a function body of at most this many lines
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "lib2to3", "encodings", "__pycache__"}


@dataclass(frozen=True)
class FimCase:
    name: str  # "path/file.py:LINE"
    kind: str  # one of KINDS
    prefix: str  # the lines before the cursor's line
    typed: str  # the cursor's line up to the cursor: its indentation (llama.vim's `prompt`)
    middle: str  # what the author wrote there
    suffix: str  # the lines after the middle
    extra: tuple[tuple[str, str], ...]  # (filename, text): other files' chunks

    def body(self, n_predict: int, keystroke: bool = False) -> dict[str, Any]:
        """llama.vim's /infill body, greedy; `keystroke`: one more character typed."""
        typed = self.typed + (self.middle[:1] if keystroke else "")
        return {
            "input_prefix": self.prefix,
            "input_suffix": self.suffix,
            "input_extra": [{"filename": f, "text": t} for f, t in self.extra],
            "prompt": typed,
            "n_predict": n_predict,
            "n_indent": len(self.typed),
            "cache_prompt": True,
            "temperature": 0,
            "top_k": 40,
            "top_p": 0.99,
            "return_tokens": True,
            "stream": False,
        }

    def enter_body(self, n_predict: int) -> dict[str, Any]:
        """The author's first line of the middle written, then Enter: the line joins the
        prefix, and the next line's indentation (the author's) is typed."""
        first, _, rest = self.middle.partition("\n")
        after = next((line for line in (rest + self.suffix).splitlines() if line.strip()), "")
        typed = after[: indent_of(after)]
        return self.body(n_predict) | {
            "input_prefix": self.prefix + self.typed + first + "\n",
            "prompt": typed,
            "n_indent": len(typed),
        }


# --- cutting cases ---------------------------------------------------------------------
def source_files(root: Path) -> list[Path]:
    """Python sources under `root`, tests and third-party packages left out, sorted."""
    return sorted(
        p
        for p in root.rglob("*.py")
        if not SKIP_DIRS & set(p.relative_to(root).parts[:-1]) and p.stat().st_size > 2000
    )


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def middle_span(source: str, kind: str, rng: random.Random) -> tuple[int, int] | None:
    """[start, end) lines of a middle of `kind` in `source`, or None where it has none:
    `line`/`lines` are 1 or 2-4 one-line statements in a row inside a block, `block` a
    function's body of at most MAX_BLOCK lines."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    lines = source.splitlines()
    if kind == "block":
        bodies = [
            (node.body[0].lineno - 1, node.end_lineno or 0)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body[0].lineno > node.lineno  # not `def f(): return x`
            and 2 <= (node.end_lineno or 0) - node.body[0].lineno + 1 <= MAX_BLOCK
        ]
        return rng.choice(bodies) if bodies else None
    one_line = {  # statement lines (0-based) of one-line statements in an indented block
        node.lineno - 1
        for node in ast.walk(tree)
        if isinstance(node, ast.stmt)
        and not isinstance(node, ast.Expr)  # docstrings and bare calls' strings
        and node.end_lineno == node.lineno
        and node.col_offset > 0
        and "\t" not in lines[node.lineno - 1]
    }
    n = 1 if kind == "line" else rng.randint(2, 4)
    spans = [
        (i, i + n)
        for i in sorted(one_line)
        if i >= PREFIX_LINES // 2
        and all(
            j in one_line and indent_of(lines[j]) == indent_of(lines[i]) for j in range(i, i + n)
        )
    ]
    return rng.choice(spans) if spans else None


def cut_cases(count: int, seed: int, root: Path | None = None) -> list[FimCase]:
    """`count` cases, the kinds in turn, from a seeded choice of files under `root`
    (default: the standard library)."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    files = source_files(root)
    if len(files) < 2:
        raise LocalspecError(f"no Python sources to cut completion cases from under {root}")
    rng = random.Random(seed)
    cases: list[FimCase] = []
    tries = 0
    while len(cases) < count:
        tries += 1
        if tries > 100 * count:
            raise LocalspecError(f"could not cut {count} completion cases from {root}")
        path = rng.choice(files)
        kind = KINDS[len(cases) % len(KINDS)]
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        lines = source.splitlines(keepends=True)
        span = middle_span(source, kind, rng)
        if span is None:
            continue
        start, end = span
        first = lines[start]
        typed = first[: indent_of(first)]
        siblings = [p for p in files if p.parent == path.parent and p != path] or files
        other = rng.choice(siblings)
        try:
            other_lines = other.read_text(encoding="utf-8").splitlines(keepends=True)
        except (OSError, UnicodeDecodeError):
            continue
        at = rng.randrange(max(1, len(other_lines) - EXTRA_LINES))
        cases.append(
            FimCase(
                name=f"{path.relative_to(root)}:{start + 1}",
                kind=kind,
                prefix="".join(lines[max(0, start - PREFIX_LINES) : start]),
                typed=typed,
                middle=first[len(typed) :] + "".join(lines[start + 1 : end]),
                suffix="".join(lines[end : end + SUFFIX_LINES]),
                extra=(
                    (
                        str(other.relative_to(root)),
                        "".join(other_lines[at : at + EXTRA_LINES]),
                    ),
                ),
            )
        )
    return cases


# --- the requests ------------------------------------------------------------------------
def infill(client: httpx.Client, base: str, body: dict[str, Any]) -> dict[str, Any]:
    """One /infill request: the answer and its client-side latency."""
    started = time.perf_counter()
    r = client.post(f"{base}/infill", json=body)
    latency = time.perf_counter() - started
    if r.status_code != 200:
        raise LocalspecError(f"{base}/infill answered {r.status_code}: {r.text[:200]}")
    answer = r.json()
    timings = answer.get("timings", {})
    return {
        "latency_s": latency,
        "content": answer.get("content", ""),
        "tokens": answer.get("tokens", []),
        "prompt_tokens": answer.get("tokens_evaluated", 0),
        "prompt_n": timings.get("prompt_n", 0),
        "prompt_ms": timings.get("prompt_ms", 0.0),
        "predicted_n": timings.get("predicted_n", 0),
        "predicted_ms": timings.get("predicted_ms", 0.0),
        "draft_n": timings.get("draft_n", 0),  # both servers' speculation counters
        "draft_n_accepted": timings.get("draft_n_accepted", 0),
        "recalled_n": timings.get("recalled_n", 0),  # localspec's: from the last middle
    }


@dataclass
class FimRow:
    case: str
    kind: str
    mode: str
    first: dict[str, Any]  # the case's request
    keystroke: dict[str, Any]  # the same with one more character typed
    exact: bool  # the middle equals the author's
    similarity: float = 0.0  # how close to the author's it is (middle_similarity)
    agrees: bool | None = None  # equal to localspec-plain's (None: not compared)
    audit: str = ""  # where it differs from localspec-plain: the two tokens' margin
    # the middle's first line written and Enter pressed (FimCase.enter_body), after both
    enter: dict[str, Any] = field(default_factory=dict)


@dataclass
class FimReport:
    setup: dict[str, Any]
    cases: list[dict[str, str]]
    rows: list[FimRow] = field(default_factory=list)


def editor_lines(text: str) -> list[str]:
    """A middle as an editor shows it: without trailing whitespace on its lines."""
    return [line.rstrip() for line in text.rstrip().splitlines()]


def same_middle(answer: str, middle: str) -> bool:
    """Equal but for trailing whitespace on each line (editors trim it)."""
    return editor_lines(answer) == editor_lines(middle)


def middle_similarity(answer: str, middle: str) -> float:
    """How much of the author's middle the answer has, in order, and nothing else, as
    difflib's ratio of matching characters (1: the same; a middle that writes on past
    the text after the cursor scores less): the edit similarity of completion benchmarks
    (CrossCodeEval), where exact matches are rare."""
    a, b = "\n".join(editor_lines(answer)), "\n".join(editor_lines(middle))
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def run_fim(
    setup: PairSetup,
    cases: list[FimCase],
    n_predict: int,
    logs: Path,
    progress: Callable[[str], None] = lambda _: None,
) -> FimReport:
    """Every case on every server, in a rotating order; then the agreement audit."""
    report = FimReport(
        setup={k: str(v) for k, v in asdict(setup).items()}
        | {"n_predict": n_predict, "python": platform.python_version()},
        cases=[{"name": c.name, "kind": c.kind} for c in cases],
    )
    warm = cases[-1].body(8) | {"input_extra": [], "input_prefix": "x = 1\n"}
    with ExitStack() as stack, httpx.Client(timeout=600) as client:
        bases = start_pair_servers(
            stack, setup, logs, lambda base: infill(client, base, warm), progress
        )
        names = list(bases)
        for i, case in enumerate(cases):
            order = names[i % len(names) :] + names[: i % len(names)]
            for mode in order:
                progress(f"case {i + 1}/{len(cases)} {case.name} ({case.kind}): {mode}")
                first = infill(client, bases[mode], case.body(n_predict))
                again = infill(client, bases[mode], case.body(n_predict, keystroke=True))
                settle(client, bases[mode])
                enter = infill(client, bases[mode], case.enter_body(n_predict))
                settle(client, bases[mode])  # not on the next server's time
                report.rows.append(
                    FimRow(
                        case.name,
                        case.kind,
                        mode,
                        first,
                        again,
                        same_middle(first["content"], case.middle),
                        middle_similarity(first["content"], case.middle),
                        enter=enter,
                    )
                )
    return report


def audit_agreement(
    report: FimReport, cases: list[FimCase], setup: PairSetup, n_predict: int
) -> None:
    """Compare every mode's tokens with localspec-plain's; where they differ, judge the
    first difference on the target (audit.judge): a near-tie, numerics or a defect."""
    from localspec.backends.llama import LlamaModel, LoadOptions
    from localspec.server.infill import ExtraChunk, infill_prompt

    plain = {r.case: r for r in report.rows if r.mode == "localspec-plain"}
    differ = []
    for row in report.rows:
        base = plain.get(row.case)
        if base is None or row.mode == "localspec-plain":
            continue
        # the middles as the editor gets them: a line dropped at the end was still
        # decoded (the tokens run on where the content does not), and llama-server keeps
        # the indentation of the line it cut
        row.agrees = same_middle(row.first["content"], base.first["content"])
        if not row.agrees:
            differ.append((row, base.first["tokens"], row.first["tokens"]))
    if not differ:
        return
    model = LlamaModel(setup.target, LoadOptions(n_ctx=setup.n_ctx, n_threads=setup.threads))
    try:
        by_name = {c.name: c for c in cases}
        for row, a, b in differ:
            case = by_name[row.case]
            if case.typed and not row.mode.startswith("localspec"):
                row.audit = ANOTHER
                continue
            extra = [ExtraChunk(filename=f, text=t) for f, t in case.extra]
            built = infill_prompt(
                model, case.prefix, case.suffix, extra, case.typed, n_predict, setup.n_ctx
            )
            opening = spelled_opening(model, built)  # as plain decoding wrote them, before a
            row.audit = judge(model, built.tokens, opening + a, opening + b)
    finally:
        model.close()


def spelled_opening(model: Model, built: InfillPrompt) -> list[int]:
    """The tokens greedy decoding spells a middle's opening (the typed text) with, to
    replay plain decoding's passes."""
    from localspec.decoding.drafters import NoDrafter
    from localspec.decoding.engine import Engine, GenerationConfig
    from localspec.decoding.events import Finished
    from localspec.decoding.opening import Opening
    from localspec.decoding.sampling import SamplingParams
    from localspec.server.infill import spelled_within

    if not built.opening:
        return []
    limit = len(built.opening.encode())  # a token spells one byte at the least
    grammar = Opening(model, built.opening)
    config = GenerationConfig(limit, SamplingParams(temperature=0), grammar=grammar)
    done = list(Engine(model, NoDrafter(), 0).generate(built.tokens, config))[-1]
    assert isinstance(done, Finished)
    return list(done.tokens[: spelled_within(done.tokens, built.opening, model.token_bytes)])


# --- the report -----------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def to_markdown(report: FimReport) -> str:
    rows = report.rows
    modes = [m for m in MODES if any(r.mode == m for r in rows)]
    by = {(r.mode, r.case): r for r in rows}
    cases = [c["name"] for c in report.cases]
    ref = "llama-server" if "llama-server" in modes else "localspec-plain"
    lines = [
        f"# Code completion (/infill): {len(cases)} cases cut from the standard library",
        "",
        f"Each case: {PREFIX_LINES} lines before the cursor, {SUFFIX_LINES} after it, one "
        f"chunk of {EXTRA_LINES} lines of another file; n_predict "
        f"{report.setup.get('n_predict', '?')}, greedy. Python {report.setup.get('python', '?')}'s "
        "standard library.",
        "",
        "Latency: client side, request to answer (s). Decode: the server's predicted_ms. "
        "Keystroke: the same request with one more character typed; re-read: the share of "
        "its prompt read again.",
        "",
        "Exact: the middle is the author's; similar: difflib's ratio of the middle to the "
        "author's, median (1 is the same; writing on past the text after the cursor lowers "
        "it). Drafts: tokens accepted of those drafted, over the mode's requests (the "
        "servers' draft_n_accepted and draft_n; -: none drafted). = plain: the middle is "
        "localspec plain's; llama-server reads the typed text before the suffix where "
        "localspec opens the middle with it, so its middles may differ by that prompt "
        "(not audited).",
        "",
        f"| mode | p50 s | p95 s | p50 / {ref} | worst case / {ref} | decode p50 ms | exact "
        "| similar | = plain | keystroke p50 s | keystroke / " + ref + " | re-read p50 | drafts |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ref_p50 = statistics.median(by[ref, c].first["latency_s"] for c in cases)
    ref_key = statistics.median(by[ref, c].keystroke["latency_s"] for c in cases)
    for m in modes:
        mine = [by[m, c] for c in cases]
        lat = [r.first["latency_s"] for r in mine]
        key = [r.keystroke["latency_s"] for r in mine]
        worst = max(by[m, c].first["latency_s"] / by[ref, c].first["latency_s"] for c in cases)
        reread = [r.keystroke["prompt_n"] / max(1, r.keystroke["prompt_tokens"]) for r in mine]
        agree = [r.agrees for r in mine if r.agrees is not None]
        asked = [q for r in mine for q in (r.first, r.keystroke)]
        drafted = sum(q.get("draft_n", 0) for q in asked)
        accepted = sum(q.get("draft_n_accepted", 0) for q in asked)
        lines.append(
            f"| {m} | {statistics.median(lat):.2f} | {pct(lat, 0.95):.2f} "
            f"| {statistics.median(lat) / ref_p50:.2f}x | {worst:.2f}x "
            f"| {statistics.median(r.first['predicted_ms'] for r in mine):.0f} "
            f"| {sum(r.exact for r in mine)}/{len(mine)} "
            f"| {statistics.median(r.similarity for r in mine):.2f} "
            f"| {f'{sum(agree)}/{len(agree)}' if agree else '-'} "
            f"| {statistics.median(key):.2f} | {statistics.median(key) / ref_key:.2f}x "
            f"| {100 * statistics.median(reread):.0f}% "
            f"| {f'{accepted}/{drafted}' if drafted else '-'} |"
        )
    lines += recalled(by, cases, modes, ref)
    lines += entered(by, cases, modes, ref)
    for kind in KINDS:
        kc = [c["name"] for c in report.cases if c["kind"] == kind]
        if not kc:
            continue
        cells = [
            f"{m} {statistics.median(by[m, c].first['latency_s'] for c in kc):.2f}" for m in modes
        ]
        lines.append(f"\n{kind} ({len(kc)}): median latency " + ", ".join(cells))
    audits = [f"- {r.case} {r.mode}: {r.audit}" for r in rows if r.audit not in ("", ANOTHER)]
    if audits:
        lines += ["", f"Differences from localspec-plain's middle ({JUDGED}):", *audits]
    if others := sorted({r.mode for r in rows if r.audit == ANOTHER}):
        n = sum(r.audit == ANOTHER for r in rows)
        lines += ["", f"Not audited: {n} middles of {', '.join(others)}, from {ANOTHER}."]
    return "\n".join(lines) + "\n"


def recalled(
    by: dict[tuple[str, str], FimRow], cases: list[str], modes: list[str], ref: str
) -> list[str]:
    """Where a localspec mode answered keystrokes mostly from its last middle (typed as
    that middle began; elsewhere at most the typed text's own tokens are recalled): how
    many, and the keystroke medians there and elsewhere, its own and the reference's."""
    out = []
    for m in modes:
        keys = {c: by[m, c].keystroke for c in cases}
        hit = [c for c, k in keys.items() if k.get("recalled_n", 0) > k.get("predicted_n", 0) / 2]
        if not hit:
            continue
        rest = [c for c in cases if c not in hit]

        def p50(mode: str, among: list[str]) -> str:
            return f"{statistics.median(by[mode, c].keystroke['latency_s'] for c in among):.2f}"

        there = f"there {p50(m, hit)} s against {ref}'s {p50(ref, hit)} s"
        elsewhere = f"; elsewhere {p50(m, rest)} s against {p50(ref, rest)} s" if rest else ""
        out.append(
            f"\n{m}: {len(hit)} of {len(cases)} keystrokes typed as its last middle began, "
            f"recalled from it (no pass for those tokens): {there}{elsewhere}."
        )
    return out


def entered(
    by: dict[tuple[str, str], FimRow], cases: list[str], modes: list[str], ref: str
) -> list[str]:
    """The requests after Enter (FimCase.enter_body): latency, over the reference's, and
    the share of the prompt read again (reports from before they were sent: nothing)."""
    if not all(by[m, c].enter for m in modes for c in cases):
        return []
    out = [
        "",
        "After Enter (the author's first line of the middle written, the next line's "
        "indentation typed; sent after the keystroke):",
        "",
        f"| mode | p50 s | p95 s | p50 / {ref} | re-read p50 | recalled |",
        "|---|---|---|---|---|---|",
    ]
    ref_p50 = statistics.median(by[ref, c].enter["latency_s"] for c in cases)
    for m in modes:
        asked = [by[m, c].enter for c in cases]
        lat = [q["latency_s"] for q in asked]
        reread = [q["prompt_n"] / max(1, q["prompt_tokens"]) for q in asked]
        hits = sum(q.get("recalled_n", 0) > 0 for q in asked)
        out.append(
            f"| {m} | {statistics.median(lat):.2f} | {pct(lat, 0.95):.2f} "
            f"| {statistics.median(lat) / ref_p50:.2f}x | {100 * statistics.median(reread):.0f}% "
            f"| {hits}/{len(asked)} |"
        )
    return out


def write(report: FimReport, out: Path) -> list[Path]:
    data = {
        "setup": report.setup,
        "cases": report.cases,
        "rows": [asdict(r) for r in report.rows],
    }
    paths = [out / "fim.json", out / "fim.md"]
    write_atomic(paths[0], json.dumps(data, indent=1))
    write_atomic(paths[1], to_markdown(report))
    return paths
