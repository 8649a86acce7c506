"""--cache-reuse on the real default pair: an editor's context chunks that moved up in the
prompt (llama.vim's ring buffer drops its oldest chunk) are moved in the cache, not read
again; the cache stays what llama.cpp holds."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

from localspec.backends.llama import LoadOptions
from localspec.server.app import ServerOptions, create_app
from localspec.session import Session, SessionConfig, open_session

pytestmark = pytest.mark.real

PREFIX = "import math\n\n\ndef circle_area(r):\n"
SUFFIX = "\n\ndef square_area(a):\n    return a * a\n"


def chunk(i: int) -> dict:
    """A chunk of another file, as llama.vim's ring buffer keeps them (~200 tokens)."""
    body = "".join(f"def f{i}_{j}(x):\n    return x * {i} + {j}\n\n" for j in range(12))
    return {"text": body, "filename": f"m{i}.py"}


def body(extra: list[dict]) -> dict:
    return {
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": extra,
        "prompt": "    return",
        "n_predict": 12,
        "n_indent": 4,
        "temperature": 0,
        "cache_prompt": True,
    }


@pytest.fixture(scope="module")
def session(real_paths) -> Iterator[Session]:
    load = LoadOptions(n_ctx=4096, n_threads=2, n_seq=2)
    s = open_session(SessionConfig(str(real_paths[0]), str(real_paths[1]), "auto", load, load))
    yield s
    s.close()


def test_chunks_that_moved_up_are_not_read_again(session: Session):
    options = ServerOptions("coder", parallel=2, cache_reuse=64)
    with TestClient(create_app(session, options)) as client:
        first = client.post("/infill", json=body([chunk(1), chunk(2), chunk(3)])).json()
        second = client.post("/infill", json=body([chunk(2), chunk(3), chunk(4)])).json()
    assert "math.pi" in first["content"] and "math.pi" in second["content"], second["content"]
    # without the move, all but <|repo_name|>myproject would be read again (~800 tokens);
    # with it, chunk 4 and the current file (~300)
    moved = second["tokens_evaluated"] - second["timings"]["prompt_n"]
    assert moved > 350, second["timings"]
    assert second["timings"]["prompt_n"] < 0.45 * second["tokens_evaluated"], second["timings"]


def test_reuse_keeps_the_cache_what_llama_cpp_holds(real_models):
    """A chunk moved by the backend: `cached` and llama.cpp's own positions agree, the
    rest is read as usual, and the next token's logits stay close to a fresh read's."""
    target, _ = real_models
    tok = target.tokenize
    a, b = tok("# a list of helpers\n"), tok(chunk(1)["text"], special=False)
    c = tok(chunk(2)["text"], special=False)
    tail = tok("def main():\n    return f2_3(", special=False)
    target.reset()
    target.evaluate([*a, *b, *c], 1)
    moved = target.reuse([*a, *c, *tail], 64)
    # all of c is kept: its first tokens ("def f") as the prefix b shares, the rest moved
    assert len(c) - 4 <= moved <= len(c) and target.cached == [*a, *c]
    assert target.kv_len() == len(a) + len(c)
    reused = target.evaluate([*a, *c, *tail], 1)[0].copy()
    assert target.decoded and target.cached == [*a, *c, *tail]
    target.reset()
    fresh = target.evaluate([*a, *c, *tail], 1)[0]
    assert int(np.argmax(fresh)) in np.argsort(reused)[-3:]
    assert target.reuse([*a, *c, *tail], 64) == 0  # nothing moved: nothing changes
    target.reset()
