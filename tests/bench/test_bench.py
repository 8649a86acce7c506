"""`localspec bench`: the suite, modes, agreement, and the reports, on toy models; one
short run on the real pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error, localspec

from localspec.backends.toy import ToyModel, scripted
from localspec.bench import costs, modes, peer, runner, suite
from localspec.bench.markdown import to_markdown
from localspec.bench.modes import Mode
from localspec.bench.report import render, write_report
from localspec.bench.results import Report
from localspec.bench.runner import BenchConfig, Progress
from localspec.bench.suite import BenchError, BenchPrompt
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Engine
from localspec.errors import LocalspecError

REPLY = "def add(a, b):\n    return a + b\n"
NEAR_REPLY = "def add(a, b):\n    return a - b\n"  # one token off: the draft gets rejected
PROMPTS = (
    BenchPrompt("one", "code", "Write add."),
    BenchPrompt("two", "edit", "Fix this: def add(a, b): return a - b"),
    BenchPrompt("three", "edit", "Rename add to plus."),
)
FAST = BenchConfig(max_tokens=40, repeats=1, warmup=False)


def toy_pair() -> tuple[ToyModel, ToyModel]:
    # simulated pass costs, so tokens/s are finite and speculation pays
    target = ToyModel(scripted(REPLY), name="toy-target", pass_s=0.002, token_s=0.0002)
    draft = ToyModel(scripted(NEAR_REPLY), name="toy-draft", pass_s=0.0002)
    return target, draft


def run_toy(names: str = "baseline,draft,ngram,auto", **kwargs) -> Report:
    target, draft = toy_pair()
    return runner.run_bench(target, draft, PROMPTS, modes.parse_modes(names), FAST, **kwargs)


# --- the suite ---------------------------------------------------------------------------
def test_default_suite_has_four_categories_of_at_least_four_prompts():
    prompts = suite.load_prompts()
    assert len(prompts) >= 16
    by_category: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    assert {"code", "edit", "chat", "summarize"} <= by_category.keys()
    assert all(len(ps) >= 4 for ps in by_category.values())
    # an edit carries the code it edits, so the answer can echo it
    assert all("```" in p.prompt for p in by_category["edit"])


def write(tmp_path: Path, content: str) -> Path:
    path = tmp_path / "prompts.json"
    path.write_text(content)
    return path


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('{"a": {"category": "code", "prompt": "x"}', "not valid JSON (line 1"),
        ("[]", "expected an object of prompts"),
        ("{}", "expected an object of prompts"),
        ('{"a": "just text"}', "'a' is not an object"),
        ('{"a": {"category": "code"}}', "'a' lacks prompt"),
        ('{"a": {"category": "code", "prompt": "x", "lang": "en"}}', "unknown key(s) lang"),
        ('{"a": {"category": "", "prompt": "x"}}', "'a': category must be a non-empty string"),
        ('{"a": {"category": "code", "prompt": 3}}', "'a': prompt must be a non-empty string"),
    ],
)
def test_prompts_file_errors_say_what_is_wrong(tmp_path, content, words):
    with pytest.raises(BenchError) as err:
        suite.load_prompts(write(tmp_path, content))
    assert words in str(err.value)


def test_every_problem_in_a_prompts_file_is_reported_at_once(tmp_path):
    path = write(tmp_path, '{"a": {"category": "code"}, "b": {"prompt": "x"}, "c": 1}')
    with pytest.raises(BenchError) as err:
        suite.load_prompts(path)
    message = str(err.value)
    assert "'a' lacks prompt" in message and "'b' lacks category" in message
    assert "'c' is not an object" in message and "\n" not in message


def test_missing_prompts_file(tmp_path):
    with pytest.raises(BenchError, match="not found"):
        suite.load_prompts(tmp_path / "nope.json")


def test_select_by_name_or_category():
    assert [p.name for p in suite.select_prompts(PROMPTS, "edit")] == ["two", "three"]
    assert [p.name for p in suite.select_prompts(PROMPTS, "one,three")] == ["one", "three"]
    with pytest.raises(BenchError, match="no prompt or category named nope"):
        suite.select_prompts(PROMPTS, "nope")


# --- modes -------------------------------------------------------------------------------
def test_baseline_always_runs_first():
    parsed = modes.parse_modes("auto,draft-g2,ngram", gamma=5)
    assert [m.name for m in parsed] == ["baseline", "auto", "draft-g2", "ngram"]
    assert [m.gamma for m in parsed] == [0, 0, 2, 5]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("baseline,turbo", "unknown mode 'turbo'"),
        ("auto-g3", "only draft, ngram, mtp and peer take a fixed γ"),
        ("peer-plain-g2", "only draft, ngram, mtp and peer take a fixed γ"),
        ("draft-g0", "γ must be between 1 and 32"),
    ],
)
def test_bad_modes(text, words):
    with pytest.raises(BenchError, match=words):
        modes.parse_modes(text)


def test_draft_mode_needs_a_draft_model():
    with pytest.raises(BenchError, match="need a draft model"):
        modes.parse_modes("draft,ngram", have_draft=False)
    assert [m.name for m in modes.parse_modes("ngram,auto", have_draft=False)] == [
        "baseline",
        "ngram",
        "auto",
    ]


# --- agreement (the audit itself: test_audit.py) -----------------------------------------
def differing_factory(reply: str):
    """Baseline as usual; every other mode decodes with a target scripted to `reply`: an
    answer the bench's target would not give, as a logic error would produce."""
    other = ToyModel(scripted(reply), name="other")

    def factory(mode: Mode, target, draft):
        if mode.kind == "baseline":
            return Engine(target, NoDrafter(), 0)
        return Engine(other, NoDrafter(), 0)

    return factory


def test_a_divergence_the_passes_do_not_explain_is_a_loud_defect(tmp_path):
    target = ToyModel(scripted(REPLY), name="toy-target")
    factory = differing_factory(REPLY[:8] + "X" + REPLY[9:])
    found = runner.run_bench(
        target, None, PROMPTS[:1], modes.parse_modes("ngram"), FAST, engine_factory=factory
    )
    agreement = found.result("one", "ngram").agreement
    assert not agreement.identical and agreement.first_diff == 8 and agreement.is_defect
    assert agreement.divergence.batched_argmax == ord(REPLY[8])  # the target's own choice
    assert "differs at 8: DEFECT" in agreement.label() and "'X'" in agreement.label()
    assert found.result("one", "baseline").agreement.identical
    assert found.summary()[0].defects == 1
    text = to_markdown(found)
    assert text.index("**DEFECT**: 1 greedy answer(s)") < text.index("## Speedup")
    assert "1/1" not in text and "0/1, 1 DEFECT" in text
    (_, js, _) = write_report(found, tmp_path)
    assert json.loads(js.read_text())["defects"][0]["mode"] == "ngram"


def test_an_answer_that_stops_early_differs_where_it_ends():
    target = ToyModel(scripted(REPLY), name="toy-target")
    found = runner.run_bench(
        target,
        None,
        PROMPTS[:1],
        modes.parse_modes("ngram"),
        FAST,
        engine_factory=differing_factory(REPLY[:5]),
    )
    agreement = found.result("one", "ngram").agreement
    assert agreement.first_diff == 5 and agreement.divergence.other_token is None
    assert agreement.is_defect  # the target's pass there does not pick the end token


# --- the run and its reports -------------------------------------------------------------
def test_every_mode_runs_on_every_prompt_and_greedy_output_is_the_baselines():
    events: list[Progress] = []
    report = run_toy(progress=events.append)
    assert report.info.modes == ("baseline", "draft", "ngram", "auto")
    assert len(report.results) == len(PROMPTS) * 4
    assert len(events) == 2 * len(report.results)  # a start and an end per run
    assert [e.done for e in events[-2:]] == [len(report.results) - 1, len(report.results)]
    for r in report.results:
        assert r.agreement.identical, (r.prompt, r.mode, r.agreement)
        assert r.tokens == len(REPLY) and r.tokens_per_s > 0
        assert 0 <= r.overhead_share < 1
    base = report.result("one", "baseline")
    assert base.speedup == 1.0 and base.acceptance_rate == 0
    draft = report.result("one", "draft")
    assert 0 < draft.acceptance_rate < 1 and draft.mean_accepted_len > 1
    (summary_draft, *_) = report.summary()
    assert summary_draft.mode == "draft" and summary_draft.prompts == len(PROMPTS)
    assert dict(summary_draft.by_category).keys() == {"code", "edit"}


def test_repeats_are_interleaved_and_kept():
    target, draft = toy_pair()
    order: list[tuple[int, str, str]] = []

    def note(e: Progress) -> None:
        if e.figures is None:
            order.append((e.repeat, e.prompt.name, e.mode.name))

    report = runner.run_bench(
        target,
        draft,
        PROMPTS[:2],
        modes.parse_modes("draft"),
        BenchConfig(max_tokens=8, repeats=2, warmup=False),
        progress=note,
    )
    assert order[:4] == [
        (0, "one", "baseline"),
        (0, "one", "draft"),
        (0, "two", "baseline"),
        (0, "two", "draft"),
    ]
    assert order[4][0] == 1
    assert all(len(r.runs) == 2 for r in report.results)


def test_an_interrupted_run_reports_the_prompts_it_completed():
    def stop_on_the_third_prompt(e: Progress) -> None:
        if e.figures is None and e.prompt.name == "three" and e.mode.name == "draft":
            raise KeyboardInterrupt

    report = run_toy("draft", progress=stop_on_the_third_prompt)
    assert report.info.interrupted and report.prompts == ("one", "two")
    assert "Interrupted" in to_markdown(report)

    def stop_at_once(e: Progress) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # nothing complete: nothing to report
        run_toy("draft", progress=stop_at_once)


def test_runs_that_did_not_get_the_cpu_are_flagged():
    # the toy models sleep through their passes: as if other work had the CPU
    report = run_toy("draft", threads=2)
    assert len(report.contended()) == len(report.results)
    assert all(
        f.cpu_share is not None and f.cpu_share < 0.5 for r in report.results for f in r.runs
    )
    assert "**Noisy**: 6 of 6 runs" in to_markdown(report)
    quiet = run_toy("draft")  # thread count unknown: nothing to say
    assert not quiet.contended() and "Noisy" not in to_markdown(quiet)


def test_reports_are_written(tmp_path):
    report = run_toy()
    paths = write_report(report, tmp_path / "out")
    md, js, png = paths
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "bench.json",
        "bench.md",
        "bench.png",
    ]  # written atomically: no temporaries left
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(js.read_text())
    assert data["info"]["target"] == "toy-target" and data["info"]["max_tokens"] == 40
    assert len(data["results"]) == 12 and len(data["summary"]) == 3
    row = data["results"][1]
    for key in (
        "tokens_per_s",
        "speedup",
        "acceptance_rate",
        "mean_accepted_len",
        "ttft_s",
        "itl_p50_s",
        "itl_p95_s",
        "overhead_share",
        "agreement",
        "runs",
    ):
        assert key in row
    assert row["agreement"]["identical"] is True and "overhead_share" in row["runs"][0]
    assert data["version"] == 2 and data["defects"] == []
    text = md.read_text()
    assert "| mode | code | edit | all |" in text
    assert all(f"| {p.name} |" in text for p in PROMPTS)
    assert text.count("identical") >= 9


def test_a_report_renders_again_from_its_json_alone(tmp_path):
    """JSON → Report → Markdown gives the Markdown shown at run time, byte for byte."""
    target = ToyModel(scripted(REPLY), name="toy-target")
    found = runner.run_bench(  # a defect and the cost table: every part of the report
        target,
        None,
        PROMPTS,
        modes.parse_modes("ngram"),
        BenchConfig(max_tokens=40, warmup=False, costs=True),
        engine_factory=differing_factory(REPLY[:8] + "X" + REPLY[9:]),
        threads=2,
    )
    assert found.info.costs is not None and found.defects()
    md, js, png = write_report(found, tmp_path)
    assert md.read_text() == to_markdown(found)
    again = Report.from_json(json.loads(js.read_text()))
    assert again == found and to_markdown(again) == md.read_text()
    md.unlink()
    png.unlink()
    assert render(js) == (md, png) and md.read_text() == to_markdown(found)


def test_a_report_of_another_version_is_refused(tmp_path):
    data = run_toy("ngram").to_json()
    with pytest.raises(BenchError, match="version 1; this localspec reads version 2"):
        Report.from_json({k: v for k, v in data.items() if k != "version"})
    with pytest.raises(BenchError, match="not a bench report"):
        Report.from_json({**data, "results": [{"prompt": "one"}]})


def test_the_command_renders_a_report_again(tmp_path):
    md, js, _ = write_report(run_toy("ngram"), tmp_path)
    shown = md.read_text()
    md.unlink()
    r = localspec("bench", "--render", str(js), "--no-chart")
    assert r.returncode == 0, r.stderr
    assert r.stdout == shown == md.read_text()


def test_peer_figures_join_prompt_for_prompt(tmp_path):
    peer_file = tmp_path / "peer.json"
    peer_file.write_text(
        json.dumps(
            {
                "peer": "llama-speculative-simple",
                "prompts": {
                    "one": {
                        "category": "code",
                        "plain_tps": 100.0,
                        "spec_tps": 120.0,
                        "acceptance": 0.8,
                    },
                },
            }
        )
    )
    report = run_toy("draft", peer=peer.load_peer(peer_file))
    draft = report.result("one", "draft")
    assert draft.vs_peer == pytest.approx(draft.tokens_per_s / 120.0)
    assert report.result("two", "draft").vs_peer is None
    assert report.summary()[0].vs_peer == pytest.approx(draft.vs_peer)
    text = to_markdown(report)
    assert "vs peer" in text and "100.00/120.00" in text


def test_bad_peer_file(tmp_path):
    path = tmp_path / "peer.json"
    path.write_text('{"prompts": {"one": {"spec_tps": 1}}}')
    with pytest.raises(BenchError, match=r"not a peer_speculative\.sh result"):
        peer.load_peer(path)


FAKE_PLAIN = """#!/bin/sh
# llama-completion's perf lines; fails unless -f holds the chat-templated prompt
echo "$@" > "$0.args"
while [ $# -gt 0 ]; do [ "$1" = -f ] && cp "$2" "$0.prompt"; shift; done
grep -q '<|assistant|>' "$0.prompt" || exit 3
echo 'common_perf_print: prompt eval time =   250.00 ms /    20 tokens (12 ms per token)' >&2
echo 'common_perf_print:        eval time =  2000.00 ms /    19 runs   (105 ms per token)' >&2
"""
FAKE_SPEC = """#!/bin/sh
echo "$@" > "$0.args"
echo 'main: encoded   19 tokens in    0.200 seconds, speed:   95.000 t/s' >&2
echo 'main: decoded   22 tokens in    1.000 seconds, speed:   22.000 t/s' >&2
echo 'main: n_drafted = 12' >&2
echo 'main: n_accept  = 9' >&2
"""


def fake_peer(tmp_path: Path, spec: str = FAKE_SPEC):
    from localspec.bench.peer import PLAIN_BIN, SPEC_BIN, LlamaCppPeer

    for name, script in ((PLAIN_BIN, FAKE_PLAIN), (SPEC_BIN, spec)):
        (tmp_path / name).write_text(script)
        (tmp_path / name).chmod(0o755)
    return LlamaCppPeer(tmp_path, tmp_path / "t.gguf", tmp_path / "d.gguf", threads=2)


def test_the_peer_runs_live_between_the_modes(tmp_path):
    report = run_toy("draft,peer,peer-plain", peer_bin=fake_peer(tmp_path))
    spec, plain = report.result("one", "peer"), report.result("one", "peer-plain")
    assert spec.tokens_per_s == pytest.approx(22.0) and spec.acceptance_rate == 0.75
    assert spec.ttft_s == pytest.approx(0.2) and spec.agreement is None and spec.external
    assert plain.tokens == 20 and plain.tokens_per_s == pytest.approx(9.5)
    draft = report.result("one", "draft")
    assert draft.vs_peer == pytest.approx(draft.tokens_per_s / 22.0)
    assert draft.peer_plain_tokens_per_s == pytest.approx(9.5)
    assert "peer = llama-speculative-simple" in (report.info.peer or "")
    text = to_markdown(report)
    # 22 decoded of the 40 asked: it stopped at an end token, which localspec does not count
    assert "| one | peer | 21 | 22.00 |" in text and "9.50/22.00" in text


def test_the_peer_always_runs_beside_its_plain_decoding():
    names = [m.name for m in modes.parse_modes("draft,peer-g2,peer")]
    assert names == ["baseline", "draft", "peer-plain", "peer-g2", "peer"]
    assert [m.name for m in modes.parse_modes("peer-plain,peer")] == [
        "baseline",
        "peer-plain",
        "peer",
    ]
    assert "peer-plain" not in [m.name for m in modes.parse_modes("draft,auto")]


def test_the_peer_decodes_as_many_tokens_as_localspec(tmp_path):
    """llama.cpp's -f drops a trailing newline and its speculative example decodes -n + 1
    tokens: the prompt file and -n make up for both."""
    runner_ = fake_peer(tmp_path)
    prompt = "<|user|>hi\n<|assistant|>\n"  # a generation prompt ends in a newline
    runner_.plain(prompt, 40)
    plain_args = (tmp_path / "llama-completion.args").read_text().split()
    assert plain_args[plain_args.index("-n") + 1] == "40"
    assert (tmp_path / "llama-completion.prompt").read_text() == prompt + "\n"
    done = runner_.speculative(prompt, 22, n_max=3)
    spec_args = (tmp_path / "llama-speculative-simple.args").read_text().split()
    assert spec_args[spec_args.index("-n") + 1] == "21" and done.tokens == 22


def test_a_peer_that_decodes_past_its_budget_is_refused(tmp_path):
    with pytest.raises(LocalspecError, match="decoded 22 tokens where 20 were asked"):
        fake_peer(tmp_path).speculative("<|assistant|>", 20, n_max=3)


def test_the_plain_peer_does_not_count_its_end_token(tmp_path):
    runner_ = fake_peer(tmp_path)
    (tmp_path / "llama-completion").write_text(FAKE_PLAIN + "echo ' [end of text]'\n")
    # 20 sampled, the last one the end token: 19 decoded after the prompt's pass
    assert runner_.plain("<|assistant|>", 40).tokens == 19


def test_a_failing_peer_says_why(tmp_path):
    broken = "#!/bin/sh\necho 'error: unknown argument: --spec-type' >&2\nexit 1\n"
    with pytest.raises(LocalspecError, match="unknown argument: --spec-type"):
        run_toy("peer", peer_bin=fake_peer(tmp_path, spec=broken))


def test_missing_peer_binaries(tmp_path):
    from localspec.bench.peer import LlamaCppPeer

    binaries = LlamaCppPeer(tmp_path, tmp_path / "t.gguf", None, threads=2)
    with pytest.raises(LocalspecError, match=r"scripts/peer_speculative\.sh build"):
        binaries.check(speculative=False)


# --- the command ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--prompts", "{bad}"], "not valid JSON"),
        (["--modes", "turbo"], "unknown mode"),
        (["--only", "nope"], "no prompt or category named nope"),
        (["--draft", "none", "--modes", "draft"], "need a draft model"),
        (["--out", "a-file/sub"], "Not a directory"),  # before the run, not after it
        (["--draft", "none", "--target", "missing.gguf"], "model file not found"),
        (["--draft", "missing.gguf"], "model file not found"),
        # the served suites run their own cases: an option of the prompt suites is refused
        (["--suite", "fim", "--list-prompts", "--repeats", "2"], "drop --list-prompts, --rep"),
        (["--suite", "json", "--only", "x", "--repeats", "2"], "modes: drop --only"),
    ],
)
def test_command_errors_are_one_line(tmp_path, args, words):
    (tmp_path / "t.gguf").write_bytes(b"")  # there: the other errors come before a load
    args = [str(tmp_path / a) if a == "missing.gguf" else a for a in args]
    if args[0] == "--prompts":
        args = ["--prompts", str(write(tmp_path, args[1]))]
    if args[0] == "--out":
        (tmp_path / "a-file").write_text("")
        args = ["--out", str(tmp_path / args[1])]
    r = localspec("bench", "--target", str(tmp_path / "t.gguf"), *args)
    assert_one_line_error(r.returncode, r.stderr, words)


@pytest.mark.parametrize("args", [["--max-tokens", "0"], ["--repeats", "0"], ["--gamma", "-1"]])
def test_out_of_range_numbers_are_usage_errors(args):
    r = localspec("bench", "--target", "t.gguf", *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"argument {args[0]}" in r.stderr and "must be between" in r.stderr


# --- the real pair -----------------------------------------------------------------------
@pytest.mark.real
def test_real_pair_short_bench(real_models, tmp_path):
    target, draft = real_models
    prompts = suite.select_prompts(suite.load_prompts(), "code-binary-search,edit-fix-bug")
    # no warm-up or T(k): test_rpc.py's bench warms up the real target, and test_twins.py
    # times passes on llama.cpp (the table itself: the toy tests below)
    fast = BenchConfig(max_tokens=16, warmup=False, costs=False)
    report = runner.run_bench(target, draft, prompts, modes.parse_modes("draft"), fast, threads=2)
    for r in report.results:
        assert r.tokens > 0 and r.tokens_per_s > 0 and r.ttft_s > 0
        # greedy speculation reproduces plain decoding, up to proven kernel numerics
        assert r.agreement.identical or not r.agreement.is_defect, r.agreement.label()
    assert all(report.result(p.name, "draft").runs[0].drafted > 0 for p in prompts)
    md, _, png = write_report(report, tmp_path)
    assert "edit-fix-bug" in md.read_text() and png.stat().st_size > 0


# --- costs ------------------------------------------------------------------------------
def test_the_ceiling_is_the_best_gamma_for_a_drafter_that_is_always_right():
    flat = costs.Costs((0.1,) * 4, draft_s=0.05)  # verification as cheap as one token (a GPU)
    assert flat.ceiling(0.0) == (3, pytest.approx(4.0))  # n-grams: γ + 1 tokens a pass
    assert flat.ceiling(0.05) == (3, pytest.approx(4 * 0.1 / (3 * 0.05 + 0.1)))
    linear = costs.Costs((0.1, 0.2, 0.3, 0.4))  # each token costs a pass: nothing to gain
    assert linear.ceiling(0.0)[1] == pytest.approx(1.0)
    assert costs.Costs((0.0, 0.0)).ceiling(0.0) is None


class ClockedToy(ToyModel):
    """A toy whose time inside the model is simulated, not slept: a pass costs `pass_s`
    plus `token_s` per token decoded, exactly, however busy the machine is."""

    def __init__(self, pass_s: float, token_s: float) -> None:
        super().__init__(scripted(REPLY), name="clocked")
        self.costs = (pass_s, token_s)
        self.spent = 0.0

    def _decode(self, tokens, pos, n_logits):
        self.spent += self.costs[0] + self.costs[1] * len(tokens)
        return super()._decode(tokens, pos, n_logits)

    def evaluate(self, tokens, n_logits, checkpoint=False, marks=()):
        logits = super().evaluate(tokens, n_logits, checkpoint, marks)
        self.busy_s = self.spent  # what llama.cpp would have taken, not the wall clock
        return logits


def test_costs_are_timed_and_reported():
    target, draft = ClockedToy(2.0, 0.25), ClockedToy(0.5, 0.0)
    found = costs.measure_costs(target, draft, target.tokenize("<|user|>hi"), k_max=8, reps=3)
    # each pass decodes the k new tokens only: the prefix stays cached, the k roll back
    assert found.verify_s == pytest.approx(tuple(2.0 + 0.25 * k for k in range(1, 9)))
    assert found.draft_s == pytest.approx(0.5)
    text = to_markdown(run_toy())
    assert "## What speculation has to work with" in text and "T(k) / T(1)" in text
