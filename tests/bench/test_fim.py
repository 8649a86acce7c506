"""The completion suite's cases (cut from real code: the standard library) and its
report, without servers (`localspec bench --suite fim` runs it against them: the
reports in docs/bench/fim)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.bench.fim import (
    ANOTHER,
    KINDS,
    FimReport,
    FimRow,
    cut_cases,
    middle_similarity,
    same_middle,
    to_markdown,
)
from localspec.errors import LocalspecError


def test_cases_are_seeded_cuts_of_real_files():
    cases = cut_cases(6, seed=3)
    assert [c.name for c in cases] == [c.name for c in cut_cases(6, seed=3)]
    assert [c.name for c in cases] != [c.name for c in cut_cases(6, seed=4)]
    assert [c.kind for c in cases] == list(KINDS) * 2
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    for c in cases:
        path, line = c.name.rsplit(":", 1)
        source = (root / path).read_text(encoding="utf-8")
        # the case is a slice of the file, cut at the cursor
        assert c.prefix + c.typed + c.middle + c.suffix in source
        assert source.splitlines()[int(line) - 1].startswith(c.typed + c.middle.splitlines()[0])
        assert c.middle.strip() and c.typed.strip() == "" and len(c.typed) > 0
        lines = c.middle.splitlines()
        assert len(lines) == 1 if c.kind == "line" else len(lines) >= 2
        ((extra_name, extra_text),) = c.extra
        assert extra_name != path and extra_text in (root / extra_name).read_text(encoding="utf-8")
        body = c.body(64, keystroke=True)
        assert body["prompt"] == c.typed + c.middle[0] and body["n_indent"] == len(c.typed)


def test_a_tree_without_sources_is_a_clear_error(tmp_path: Path):
    with pytest.raises(LocalspecError, match="no Python sources"):
        cut_cases(2, 0, tmp_path)


def test_same_middle_ignores_trailing_blanks_only():
    assert same_middle("x = 1  \n\n", "x = 1\n")
    assert not same_middle("x = 2\n", "x = 1\n")


def test_similarity_scores_a_middle_that_writes_on_below_one_that_stops():
    middle = "    total += x\n"
    assert middle_similarity("    total += x  \n\n", middle) == 1.0
    stops = middle_similarity("    total += y\n", middle)
    writes_on = middle_similarity("    total += x\n    return total\n\nprint(f([1]))\n", middle)
    assert 0.9 < stops < 1.0 and writes_on < 0.6
    assert middle_similarity("", middle) == 0.0


def row(case: str, mode: str, latency: float, agrees: bool | None = None) -> FimRow:
    first = {"latency_s": latency, "predicted_ms": 100.0, "prompt_n": 900, "prompt_tokens": 1000}
    key = {"latency_s": latency / 4, "prompt_n": 100, "prompt_tokens": 1000}
    if mode == "localspec-auto":  # llama-server's plain rows, and older reports, have none
        key |= {"draft_n": 8, "draft_n_accepted": 6}
    exact = mode != "llama-server"
    return FimRow(case, "line", mode, first, key, exact, 1.0 if exact else 0.5, agrees)


def test_the_report_gives_ratios_to_llama_server_plain_and_the_worst_case():
    rows = [
        row("a.py:1", "llama-server", 2.0),
        row("b.py:1", "llama-server", 4.0),
        row("a.py:1", "localspec-auto", 1.0, True),
        row("b.py:1", "localspec-auto", 4.4, False),
    ]
    rows[-1].audit = "near-tie: token 3, logit gap 0.120"
    rows[0].agrees, rows[0].audit = False, ANOTHER  # llama-server's middle: another prompt
    cases = [{"name": "a.py:1", "kind": "line"}, {"name": "b.py:1", "kind": "line"}]
    md = to_markdown(FimReport({}, cases, rows))
    auto = next(line for line in md.splitlines() if line.startswith("| localspec-auto"))
    cells = [c.strip() for c in auto.split("|")[1:-1]]
    assert cells[3] == "0.90x" and cells[4] == "1.10x"  # 2.7 / 3.0; b: 4.4 / 4.0
    assert cells[6] == "2/2" and cells[7] == "1.00" and cells[8] == "1/2" and cells[11] == "10%"
    assert cells[12] == "12/16"  # both keystrokes' drafts
    plain = next(line for line in md.splitlines() if line.startswith("| llama-server"))
    assert plain.split("|")[-2].strip() == "-"
    assert "b.py:1 localspec-auto: near-tie" in md and "a.py:1 llama-server" not in md
    assert f"Not audited: 1 middles of llama-server, from {ANOTHER}." in md


def test_the_report_says_which_keystrokes_were_recalled_and_their_latency_apart():
    modes = ("localspec-plain", "localspec-auto", "llama-server")
    rows = [row(c, m, 2.0) for c in ("a.py:1", "b.py:1", "c.py:1") for m in modes]
    for r in rows:
        r.keystroke["predicted_n"] = 20
        if r.mode == "localspec-auto" and r.case != "c.py:1":
            r.keystroke |= {"recalled_n": 21, "latency_s": 0.05}  # the opening's token too
        elif r.mode.startswith("localspec"):
            r.keystroke["recalled_n"] = 1  # the opening's token only: a middle of its own
    cases = [{"name": c, "kind": "line"} for c in ("a.py:1", "b.py:1", "c.py:1")]
    md = to_markdown(FimReport({}, cases, rows))
    assert (
        "localspec-auto: 2 of 3 keystrokes typed as its last middle began, recalled from it "
        "(no pass for those tokens): there 0.05 s against llama-server's 0.50 s; elsewhere "
        "0.50 s against 0.50 s." in md
    )
    assert "localspec-plain: " not in md  # none of its keystrokes was
