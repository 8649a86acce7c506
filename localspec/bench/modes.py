"""The ways to decode that `localspec bench` compares, and the engine each one runs.

`baseline` is plain decoding (every speedup is a ratio to it); `draft` and `ngram` draft
at a fixed γ; `auto` is the session's adaptive hybrid. `peer` and `peer-plain` are
llama.cpp's own binaries (`localspec.bench.peer`). Engines are built by the session's one
builder (`localspec.session.make_engine`), so the bench runs what `localspec run` runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from localspec.backends.base import Model
from localspec.bench.peer import DEFAULT_N_MAX
from localspec.bench.suite import BenchError
from localspec.decoding.engine import Engine
from localspec.session import SessionConfig, make_engine

MODE_KINDS = ("baseline", "draft", "ngram", "mtp", "auto", "peer", "peer-plain")
MODE_RE = re.compile(r"^(baseline|draft|ngram|mtp|auto|peer-plain|peer)(?:-g(\d+))?$")
FIXED_GAMMA = ("draft", "ngram", "mtp", "peer")  # the kinds a -gN suffix applies to
PEER_KINDS = ("peer", "peer-plain")  # llama.cpp's own binaries (localspec.bench.peer)
DEFAULT_MODES = "baseline,draft,ngram,auto"


@dataclass(frozen=True)
class Mode:
    """One way to decode: `baseline` (plain), `draft`/`ngram` at a fixed γ, `auto`; or
    the peer: `peer` (llama.cpp's speculative example), `peer-plain` (its plain decoding)."""

    name: str
    kind: str  # one of MODE_KINDS
    gamma: int = 0  # fixed γ for draft/ngram, the peer's --spec-draft-n-max; else 0

    @property
    def needs_draft_model(self) -> bool:
        return self.kind in ("draft", "peer")

    @property
    def is_peer(self) -> bool:
        return self.kind in PEER_KINDS


def parse_modes(text: str, gamma: int = 4, have_draft: bool = True) -> tuple[Mode, ...]:
    """`baseline,draft,ngram,auto,draft-g2,...`: baseline is always run, first (every
    speedup is a ratio to it); `draft`/`ngram` take `gamma`, `draft-gN` takes N; `peer`
    drafts DEFAULT_N_MAX, `peer-gN` N. llama.cpp's speculative example always runs beside
    its plain decoding (`peer-plain`, added where missing), so a report compares both
    plain decodings as well as both speculative ones."""
    modes: dict[str, Mode] = {}
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        m = MODE_RE.match(word)
        if m is None:
            raise BenchError(
                f"unknown mode {word!r}: use baseline, draft, ngram, mtp, auto, draft-gN, "
                "ngram-gN, mtp-gN, peer, peer-gN or peer-plain"
            )
        kind, n = m.group(1), m.group(2)
        if n is not None and kind not in FIXED_GAMMA:
            raise BenchError(f"mode {word!r}: only draft, ngram, mtp and peer take a fixed γ (-gN)")
        default = DEFAULT_N_MAX if kind == "peer" else gamma
        g = int(n) if n is not None else (default if kind in FIXED_GAMMA else 0)
        if kind in FIXED_GAMMA and not 1 <= g <= 32:
            raise BenchError(f"mode {word!r}: γ must be between 1 and 32")
        modes[word] = Mode(word, kind, g)
    if not have_draft and (need := [m.name for m in modes.values() if m.needs_draft_model]):
        raise BenchError(f"mode(s) {', '.join(need)} need a draft model (--draft)")
    baseline = modes.pop("baseline", Mode("baseline", "baseline"))
    return (baseline, *with_peer_plain(tuple(modes.values())))


def with_peer_plain(modes: tuple[Mode, ...]) -> tuple[Mode, ...]:
    """`modes` with `peer-plain` just before the first peer mode, if that is missing."""
    if "peer-plain" in (m.name for m in modes):
        return modes
    first = next((i for i, m in enumerate(modes) if m.kind == "peer"), None)
    if first is None:
        return modes
    return (*modes[:first], Mode("peer-plain", "peer-plain"), *modes[first:])


def session_config(mode: Mode, target: Model, draft: Model | None) -> SessionConfig:
    """What `localspec run` would be told to decode as `mode` does."""
    if mode.kind == "baseline":
        return SessionConfig(target.name, draft="none", gamma=0)
    if mode.kind == "draft":
        if draft is None:
            raise BenchError(f"mode {mode.name} needs a draft model")
        return SessionConfig(target.name, draft=draft.name, gamma=mode.gamma)
    if mode.kind in ("ngram", "mtp"):
        return SessionConfig(target.name, draft=mode.kind, gamma=mode.gamma)
    if mode.kind == "auto":
        return SessionConfig(target.name, draft=draft.name if draft else "ngram", gamma="auto")
    raise BenchError(f"mode {mode.name} runs llama.cpp's binaries, not an engine")


def build_engine(mode: Mode, target: Model, draft: Model | None) -> Engine:
    """A fresh engine for one run, as the session builds it: no state carries over (but
    the target's MTP head, drafting in `mtp` and `auto`: its cache follows the target's)."""
    from localspec.backends.llama import LlamaModel
    from localspec.backends.mtp import head_of

    config = session_config(mode, target, draft)
    head = head_of(target) if isinstance(target, LlamaModel) else None
    if mode.kind not in ("mtp", "auto") and head is not None:
        head.detach()  # the other modes run as plain decoding's target does
        head = None
    if head is None and mode.kind == "mtp":
        raise BenchError(f"mode {mode.name}: {target.name} has no MTP head")
    return make_engine(target, draft if mode.kind in ("draft", "auto") else None, config, head)


EngineFactory = Callable[[Mode, Model, Model | None], Engine]


def peer_command(mode: Mode) -> str:
    """The peer binary a peer mode runs, for the report."""
    if mode.kind == "peer":
        return (
            f"{mode.name} = llama-speculative-simple --spec-type draft-simple "
            f"--spec-draft-n-max {mode.gamma}"
        )
    return f"{mode.name} = llama-completion (plain decoding)"
