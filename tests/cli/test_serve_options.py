"""`localspec serve`'s choices made before loading (fast): the slots' one cache only
where speculation can pay beside other slots."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from localspec.backends.llama import LoadOptions
from localspec.cli.serve import drafts_under_load, one_cache, reader_note
from localspec.session import SessionConfig


def sized(path: Path, size: int) -> str:
    with open(path, "wb") as f:  # sparse: only the size matters here
        f.truncate(size)
    return str(path)


def test_one_cache_for_the_slots_only_with_a_cheap_draft_on_a_cpu(tmp_path: Path):
    cpu = LoadOptions(n_gpu_layers=0)
    f16 = sized(tmp_path / "target-f16.gguf", 3_090_000_000)
    q4 = sized(tmp_path / "target-q4.gguf", 1_117_000_000)
    draft = sized(tmp_path / "draft.gguf", 491_000_000)
    assert drafts_under_load(SessionConfig(f16, draft, "auto", cpu, cpu))  # 0.16
    assert not drafts_under_load(SessionConfig(q4, draft, "auto", cpu, cpu))  # 0.44
    assert not drafts_under_load(SessionConfig(f16, "ngram", "auto", cpu, cpu))
    # --kv-unified / --no-kv-unified decide it; one slot has no one to share with
    f16_pair = SessionConfig(f16, draft, "auto", cpu, cpu)
    assert one_cache(4, None, f16_pair) and not one_cache(4, False, f16_pair)
    assert one_cache(4, True, SessionConfig(q4, draft, "auto", cpu, cpu))
    assert not one_cache(1, True, f16_pair)


def test_a_moe_target_is_sized_by_the_bytes_a_token_reads(tmp_path: Path, monkeypatch):
    """Beside a 17 GB 30B-A3B whose token reads a tenth of it, a 0.5B draft costs ~0.3 of
    a pass, not the 0.03 its file size says."""
    monkeypatch.setattr(
        "localspec.models.memory.read_share", lambda path: 0.1 if "a3b" in path.name else 1.0
    )
    cpu = LoadOptions(n_gpu_layers=0)
    moe = sized(tmp_path / "coder-30b-a3b.gguf", 17_000_000_000)
    draft = sized(tmp_path / "draft.gguf", 491_000_000)
    assert not drafts_under_load(SessionConfig(moe, draft, "auto", cpu, cpu))


def test_sampling_defaults_out_of_range_get_one_line(capsys):
    """`serve --temp 3` is refused before anything loads, in one line that says the range."""
    from localspec.cli import main

    for args, words in (
        (["--temp", "3"], "between 0 and 2"),
        (["--top-p", "x"], "not a number"),
        (["--reasoning-budget", "-2"], "between -1 and"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(["serve", *args])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert words in err and "Traceback" not in err


def test_a_port_in_use_or_a_wrong_host_is_said_at_once_in_one_line(capsys):
    """Another server on the port (llama-server's default is ours too), or a host that is
    not this machine's: one line and exit 1, before the models load ("serving" unsaid)."""
    import socket

    from localspec.cli import main

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        cases = (
            (["--port", str(port)], f"port {port} on 127.0.0.1 is in use"),
            (["--host", "192.0.2.1"], "not an address of this machine"),  # TEST-NET-1
            (["--host", "no-such-host.invalid"], "cannot serve on no-such-host.invalid"),
        )
        for args, words in cases:
            assert main(["serve", *args]) == 1
            err = capsys.readouterr().err
            assert words in err and len(err.strip().splitlines()) == 1, err


def test_a_cors_origin_is_written_as_browsers_send_it(capsys):
    """A browser's Origin is scheme://host[:port]: 'localhost:3000' or a path would never
    match one, so they are refused; case and a trailing '/' are made as browsers write."""
    from localspec.cli import main
    from localspec.cli.serve import web_origin

    assert web_origin("HTTP://LocalHost:3000/") == "http://localhost:3000"
    assert web_origin("vscode-webview://abc123") == "vscode-webview://abc123"
    assert web_origin("*") == "*"
    for origin in ("localhost:3000", "http://localhost:3000/app", "http://", "3000"):
        with pytest.raises(SystemExit) as exit_:
            main(["serve", "--cors-origin", origin])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert "is not a web origin" in err and len(err.splitlines()) == 1, err


def test_an_allowed_host_is_a_name_the_guard_can_match(capsys):
    """The guard compares a Host header's name, not its port: 'mybox.local:8080' is taken
    as 'mybox.local' (it would never match otherwise); a URL or nothing is refused."""
    from localspec.cli import main
    from localspec.cli.serve import host_header

    assert host_header("MyBox.local:8080") == "mybox.local"
    assert host_header("[fe80::1]") == "fe80::1"
    for host in ("", "http://mybox.local", "mybox.local/v1"):
        with pytest.raises(SystemExit) as exit_:
            main(["serve", "--allowed-host", host])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert "is not a host name" in err and len(err.splitlines()) == 1, err


def test_the_start_line_tells_whether_the_prompt_reader_loaded():
    loaded = SimpleNamespace(reader=SimpleNamespace(extra_bytes=int(0.8 * 2**30)))
    assert "loaded again not repacked (+0.8 GiB of RAM)" in reader_note(loaded)
    short = SimpleNamespace(reader=None, reader_left_out=int(7.8 * 2**30))
    assert "read by the repacked weights" in reader_note(short)
    assert "7.8 GiB more RAM than is free" in reader_note(short)
    assert reader_note(SimpleNamespace(reader=None, reader_left_out=0)) == ""  # a GPU's
