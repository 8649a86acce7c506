"""The peer, run live inside `localspec bench`: llama.cpp's own binaries on the same prompt.

`scripts/peer_speculative.sh build` makes `llama-speculative-simple` (speculative
decoding with a draft model, `--spec-type draft-simple`) and `llama-completion` (plain
decoding) from the llama.cpp vendored in llama-cpp-python. Run between localspec's own
modes, prompt by prompt, they meet the same machine state, so "x times the peer" is a
side-by-side ratio too, not one against figures taken at another time. Each run loads
the models again (from the page cache) and reports its own decode speed, which excludes
the load and the prompt, like localspec's.

Both stop where localspec does: after `max_tokens` tokens, or at an end-of-generation
token. That takes care: `-f` drops one trailing newline from the prompt file (the chat
template's generation prompt ends in one), and the speculative example stops only once it
has decoded more than `-n` tokens (see `spec_n_predict`). `load_peer` reads instead the
figures `scripts/peer_speculative.sh run --out` wrote.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from localspec.bench.suite import BenchError
from localspec.errors import LocalspecError

SPEC_BIN, PLAIN_BIN = "llama-speculative-simple", "llama-completion"
DEFAULT_N_MAX = 3  # the draft length llama.cpp's example was measured with

# llama-speculative-simple: "decoded  130 tokens in   12.345 seconds, speed:   10.531 t/s"
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")
# llama.cpp's perf lines: "prompt eval time = 1.0 ms / 5 tokens", "eval time = 2.0 ms / 9 runs"
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs")
END_OF_TEXT = "[end of text]"  # llama-completion, when it sampled an end-of-generation token


class PeerError(LocalspecError):
    """The peer binaries are missing or did not run; the message says which and why."""


@dataclass(frozen=True)
class PeerFigures:
    """What one peer run reports about itself."""

    tokens: int  # the answer's length
    tokens_per_s: float  # decode speed, as the binary computes it
    decode_s: float
    prompt_s: float  # prompt evaluation: the peer's nearest figure to a TTFT
    drafted: int = 0
    accepted: int = 0


def default_bin_dir() -> Path:
    """Where scripts/peer_speculative.sh builds (its LOCALSPEC_PEER_DIR default)."""
    from importlib.metadata import version

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = Path(os.environ.get("LOCALSPEC_PEER_DIR") or cache / "localspec" / "peer")
    return root / f"build-{version('llama-cpp-python')}" / "bin"


@dataclass(frozen=True)
class LlamaCppPeer:
    """Runs the two binaries on the target (and draft) the bench has loaded."""

    bin_dir: Path
    target: Path
    draft: Path | None
    threads: int
    n_ctx: int = 4096
    n_gpu_layers: int = -1  # -1: all
    rpc: tuple[str, ...] = ()  # rpc-servers that hold the target's layers (the draft's stay here)

    def check(self, speculative: bool) -> None:
        names = [PLAIN_BIN] + ([SPEC_BIN] if speculative else [])
        if missing := [n for n in names if not os.access(self.bin_dir / n, os.X_OK)]:
            raise PeerError(
                f"{', '.join(missing)} not found in {self.bin_dir}: "
                "run scripts/peer_speculative.sh build (or pass --peer-bin)"
            )
        if speculative and self.draft is None:
            raise PeerError("the peer's speculative mode needs a draft model (--draft)")

    def plain(self, prompt_text: str, max_tokens: int) -> PeerFigures:
        """llama-completion samples `-n` tokens (or up to an end token), exactly."""
        out = self._run(PLAIN_BIN, prompt_text, max_tokens, ["-tb", str(self.threads), "-no-cnv"])
        prompt, decode = _PROMPT_EVAL.search(out), _last(_EVAL, out)
        if decode is None:
            raise PeerError(f"{PLAIN_BIN}: no 'eval time' line in its output")
        # every "run" decodes one sampled token, the last sampled one excepted (the first
        # came from the prompt's pass); an end token is sampled, but not part of the answer
        runs, decode_s = int(decode.group(2)), float(decode.group(1)) / 1e3
        return PeerFigures(
            tokens=runs + (END_OF_TEXT not in out),
            tokens_per_s=runs / decode_s if decode_s > 0 else 0.0,
            decode_s=decode_s,
            prompt_s=float(prompt.group(1)) / 1e3 if prompt else 0.0,
        )

    def speculative(self, prompt_text: str, max_tokens: int, n_max: int) -> PeerFigures:
        assert self.draft is not None  # check() said so
        extra = [
            "-md",
            str(self.draft),
            "-td",
            str(self.threads),
            "-ngld",
            "0" if self.rpc else self._ngl(),  # --rpc would offer the servers to the draft too
            "--spec-type",
            "draft-simple",
            "--spec-draft-n-max",
            str(n_max),
        ]
        out = self._run(SPEC_BIN, prompt_text, spec_n_predict(max_tokens), extra)
        decoded, encoded = _last(_DECODED, out), _ENCODED.search(out)
        if decoded is None:
            raise PeerError(f"{SPEC_BIN}: no 'decoded N tokens' line in its output")
        drafted, accepted = _last(_DRAFTED, out), _last(_ACCEPTED, out)
        tokens, decode_s = int(decoded.group(1)), float(decoded.group(2))
        if tokens > max_tokens:
            raise PeerError(
                f"{SPEC_BIN} decoded {tokens} tokens where {max_tokens} were asked: "
                "a build without the draft-budget patch; run scripts/peer_speculative.sh build"
            )
        return PeerFigures(
            # its count includes the end token where it stopped early; localspec's does not
            tokens=tokens if tokens == max_tokens else tokens - 1,
            tokens_per_s=tokens / decode_s if decode_s > 0 else 0.0,
            decode_s=decode_s,
            prompt_s=float(encoded.group(2)) if encoded else 0.0,
            drafted=int(drafted.group(1)) if drafted else 0,
            accepted=int(accepted.group(1)) if accepted else 0,
        )

    def _ngl(self) -> str:
        return str(999 if self.n_gpu_layers < 0 else self.n_gpu_layers)

    def command(self, binary: str, prompt_file: str, n_predict: int, extra: list[str]) -> list[str]:
        """The command line of one peer run; greedy like the bench: temperature 0 and
        top-k 1 (llama.cpp's sampler chain)."""
        return [
            str(self.bin_dir / binary),
            "-m",
            str(self.target),
            "-f",
            prompt_file,
            "-n",
            str(n_predict),
            "-t",
            str(self.threads),
            "-c",
            str(self.n_ctx),
            "--temp",
            "0",
            "--top-k",
            "1",
            "--seed",
            "1",
            "-ngl",
            self._ngl(),
            *(["--rpc", ",".join(self.rpc)] if self.rpc else []),
            *extra,
        ]

    def _run(self, binary: str, prompt_text: str, n_predict: int, extra: list[str]) -> str:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as f:
            f.write(prompt_file_text(prompt_text))
            f.flush()
            try:
                done = subprocess.run(
                    self.command(binary, f.name, n_predict, extra),
                    capture_output=True,
                    text=True,
                    errors="replace",
                    stdin=subprocess.DEVNULL,
                    timeout=3600,
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                raise PeerError(f"{binary} did not run: {e}") from None
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise PeerError(f"{binary} failed ({done.returncode}): {tail}")
        return done.stdout + "\n" + done.stderr


def prompt_file_text(prompt_text: str) -> str:
    """What to write to a `-f` file so that llama.cpp reads `prompt_text`: its `-f`
    drops one trailing newline, which a chat template's generation prompt ends in."""
    return prompt_text + "\n"


def spec_n_predict(max_tokens: int) -> int:
    """The `-n` that makes llama-speculative-simple decode `max_tokens` tokens: its loop
    stops once it has decoded more than `-n` (`n_predict > params.n_predict`), and with
    the draft budget capped to what is left (scripts/peer_speculative.sh patches the cap
    in where llama.cpp reads a budget of 0 as no limit) it overshoots by exactly one."""
    return max_tokens - 1


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = None
    for found in pattern.finditer(text):  # noqa: B007 - the last match is the summary's
        pass
    return found


@dataclass(frozen=True)
class PeerRun:
    """llama.cpp's speculative example on one prompt (scripts/peer_speculative.sh)."""

    plain_tps: float  # llama.cpp's own plain decoding of the same prompt
    spec_tps: float
    acceptance: float


@dataclass(frozen=True)
class Peer:
    name: str  # its command line
    runs: dict[str, PeerRun]  # by prompt name


def load_peer(path: Path) -> Peer:
    """The JSON that scripts/peer_speculative.sh --out writes."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        runs = {
            name: PeerRun(float(r["plain_tps"]), float(r["spec_tps"]), float(r["acceptance"]))
            for name, r in data["prompts"].items()
        }
        return Peer(str(data.get("peer", "llama.cpp speculative example")), runs)
    except FileNotFoundError:
        raise BenchError(f"peer file not found: {path}") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise BenchError(f"{path}: not a peer_speculative.sh result ({e})") from None
