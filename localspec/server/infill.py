"""Fill-in-the-middle for editors: llama-server's `POST /infill` (llama.vim, llama.vscode)
and OpenAI's `suffix` on `/v1/completions`.

The prompt is built as llama-server builds it, from the FIM tokens the GGUF declares: the
repository layout where the model has one (`<|repo_name|>myproject`, a `<|file_sep|>name`
before each extra chunk, then the current file), the prefix cut to its last 3/4 of a
batch and the suffix to its first 1/4, the extra chunks in what is left of the context
after the answer. One difference: the text typed on the cursor's line opens the middle
(localspec.decoding.opening) instead of closing the prefix, so a keystroke on that line
reads one token again, not the suffix; the client gets the middle after it, as from
llama-server. The text after the cursor and the extra chunks are a free draft source
for the request (the middle often re-joins the suffix, repeats a neighbouring line, or
copies from another file), and the answer is judged line by line as it completes: it
stops where a line repeats the suffix's first line (dropped), where a later line is
indented less than `n_indent`, and at the first line end after `t_max_predict_ms`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import Field

from localspec.backends.base import FimTokens, Model
from localspec.decoding.engine import GenerationConfig
from localspec.decoding.events import Finished, Piece, StopReason
from localspec.decoding.opening import Opening
from localspec.decoding.sampling import SamplingParams
from localspec.decoding.text import Verdict
from localspec.server.errors import ApiError
from localspec.server.schemas import LLAMA_SERVER_DEFAULTS, Body, ProbsAsked, Seed

INFILL_BATCH = 2048  # llama-server's default -b: its prefix and suffix budgets come from it
REPO_NAME = "myproject\n"  # llama-server's names in the repository layout
CURRENT_FILE = "filename\n"
SNIPPET = "\n\n--- snippet ---\n\n"  # between extra chunks where the model has no file_sep


class ExtraChunk(Body):
    text: str = ""
    filename: str = "tmp"


class InfillRequest(ProbsAsked):
    """llama-server's /infill body; fields it has that change nothing here (samplers,
    t_max_prompt_ms, id_slot, cache_prompt: the cache is always reused) are accepted."""

    model: str | None = None
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list)
    prompt: str = ""  # the text typed on the cursor's line, after the prefix
    n_predict: int = Field(-1, ge=-1)  # -1: until the model ends it; 0: only read it
    t_max_predict_ms: int = Field(0, ge=0)
    n_indent: int = Field(0, ge=0)
    cache_prompt: bool = True
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=2)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    min_p: float | None = Field(None, ge=0, lt=1)
    seed: Seed = None
    stop: str | list[str] | None = None
    response_fields: list[str] | None = None  # only these ("timings/prompt_n": a path)
    return_tokens: bool = False  # the middle's token ids too

    def sampling(self) -> SamplingParams:
        """llama-server's defaults where the request says nothing (temperature 0.8)."""
        d = LLAMA_SERVER_DEFAULTS
        return SamplingParams(
            temperature=d.temperature if self.temperature is None else self.temperature,
            top_k=d.top_k if self.top_k is None else self.top_k,
            top_p=d.top_p if self.top_p is None else self.top_p,
            min_p=d.min_p if self.min_p is None else self.min_p,
            seed=self.seed,
        )

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)


@dataclass(frozen=True)
class InfillPrompt:
    tokens: list[int]
    truncated: bool  # the prefix, the suffix or the extra chunks were cut
    source: list[int]  # the suffix and extra chunks as kept: the free draft source
    opening: str = ""  # the typed text the middle opens with (the client has it)
    opening_tokens: int = 0  # how many tokens the tokenizer splits it into


@dataclass
class Unopened:
    """The answer as the client gets it, without the opening it already has: a piece
    whose token lies inside the opening is dropped, one across its end keeps the text
    that follows it, and the end's text and tokens lose it."""

    opening: str
    token_bytes: Callable[[int], bytes]
    left: int = 0  # characters of the opening not yet passed
    bytes_left: int = 0  # and its bytes not yet spelled by the answer's tokens
    lead: int = 0  # the opening's bytes in the first token that is not wholly inside it
    inside: int = 0  # the answer's tokens that spell the opening (once it finished)

    def __post_init__(self) -> None:
        self.left, self.bytes_left = len(self.opening), len(self.opening.encode())

    def piece(self, piece: Piece) -> Piece | None:
        spelled = self.bytes_left > 0 and piece.token >= 0
        if spelled:  # (a token's text may come later, held back as it is not yet whole)
            size = len(self.token_bytes(piece.token))
            if size > self.bytes_left:
                self.lead = self.bytes_left
            self.bytes_left -= min(size, self.bytes_left)
        text = piece.text
        if self.left > 0 and text:
            cut = min(len(text), self.left)
            text, self.left = text[cut:], self.left - cut
        if spelled and self.lead == 0 and not text:
            return None  # wholly the opening's
        return piece if text == piece.text else replace(piece, text=text)

    def finished(self, done: Finished) -> Finished:
        """The middle alone (nothing where the line rule dropped the opening's line)."""
        text = done.text[len(self.opening) :] if done.text.startswith(self.opening) else ""
        self.inside = spelled_within(done.tokens, self.opening, self.token_bytes)
        return replace(done, text=text, tokens=done.tokens[self.inside :])


def spelled_within(tokens: Sequence[int], text: str, token_bytes: Callable[[int], bytes]) -> int:
    """How many of the first `tokens` lie wholly inside `text` (one that runs past its
    end is the middle's)."""
    size, spelled = len(text.encode()), 0
    for inside, token in enumerate(tokens):
        spelled += len(token_bytes(token))
        if spelled > size:
            return inside
    return len(tokens)


def middle_config(built: InfillPrompt, config: GenerationConfig, model: Model) -> GenerationConfig:
    """A middle that opens with the typed text: the opening as a grammar, its tokens
    beyond the client's limit (nothing where nothing is asked for: a warm-up)."""
    if not built.opening or not config.max_tokens:
        return config
    n = config.max_tokens + built.opening_tokens
    return replace(config, grammar=Opening(model, built.opening), max_tokens=n)


def fim_tokens_of(model: Model) -> FimTokens:
    """The model's FIM tokens; a one-line 400 where it has none."""
    fim = model.fim_tokens()
    if not fim.complete:
        raise ApiError(
            400,
            f"{model.name} has no fill-in-the-middle tokens: use a model that completes "
            "code (the catalog's Qwen2.5-Coder, base or instruct) or send a templated prompt "
            "to /v1/completions",
            code="fim_not_supported",
        )
    return fim


def infill_prompt(
    model: Model,
    prefix: str,
    suffix: str,
    extra: list[ExtraChunk],
    typed: str,
    n_predict: int,
    n_ctx: int,
    written: str = "",
) -> InfillPrompt:
    """The prompt llama-server's format_prompt_infill builds, token for token, but for
    the `typed` text's last line: the middle opens with it (its budget is taken from the
    suffix's as llama-server takes it). Whole lines before it close the prefix, as there,
    but for the lines `written` after the prefix laid out (anchors.py), which open the
    middle before the typed text (the line rule passes them: InfillLines.written)."""
    fim = fim_tokens_of(model)

    def tok(text: str) -> list[int]:
        return model.tokenize(text, special=False)

    extra_tokens: list[int] = []
    if fim.rep >= 0:
        extra_tokens += [fim.rep, *tok(REPO_NAME)]
    for chunk in extra:
        if fim.sep >= 0:
            extra_tokens += [fim.sep, *tok(chunk.filename + "\n")]
        else:
            extra_tokens += tok(SNIPPET)
        extra_tokens += tok(chunk.text)
    if fim.sep >= 0:
        extra_tokens += [fim.sep, *tok(CURRENT_FILE)]

    cut = typed.rfind("\n") + 1
    lines, typed = typed[:cut], written + typed[cut:]
    prefix_tokens, suffix_tokens = tok(prefix), tok(suffix)
    lines_tokens, typed_tokens = tok(lines), tok(typed)
    n_prefix = min(len(prefix_tokens), 3 * (INFILL_BATCH // 4))
    n_typed = len(lines_tokens) + len(typed_tokens)
    n_suffix = min(len(suffix_tokens), max(0, INFILL_BATCH // 4 - (2 + n_typed)))
    n_extra = min(max(0, n_ctx - INFILL_BATCH - 2 * n_predict), len(extra_tokens))
    kept_suffix = suffix_tokens[:n_suffix]
    kept_extra = extra_tokens[len(extra_tokens) - n_extra :]
    bos = [model.special_ids[0]] if getattr(model, "adds_bos", False) else []
    tokens = [
        *kept_extra,
        *bos,
        fim.pre,
        *prefix_tokens[len(prefix_tokens) - n_prefix :],
        *lines_tokens,
        fim.suf,
        *kept_suffix,
        fim.mid,
    ]
    truncated = (
        n_prefix < len(prefix_tokens)
        or n_suffix < len(suffix_tokens)
        or n_extra < len(extra_tokens)
    )
    return InfillPrompt(tokens, truncated, [*kept_suffix, *kept_extra], typed, len(typed_tokens))


@dataclass(frozen=True)
class Templated:
    """A FIM prompt the client wrote itself (Continue, Twinny, llama.vscode's OpenAI
    mode: `<|fim_prefix|>…<|fim_suffix|>…<|fim_middle|>`), its typed text taken out."""

    context: str  # the prompt up to the prefix token's end (other files, the template's)
    prefix: str  # the prefix's whole lines, before the cursor's
    tail: str  # from the suffix token on: the prompt is context + prefix + tail
    opening: str  # that line: the middle opens with it
    source: str  # the suffix and what stands before the prefix (other files): a free draft


def templated_fim(model: Model, prompt: str) -> Templated | None:
    """The client's FIM prompt, where it ends with the model's middle token and holds
    its prefix and suffix tokens once each, in order; None for any other prompt."""
    fim = model.fim_tokens()
    if not fim.complete:
        return None
    pre, suf, mid = (model.token_text(t) for t in (fim.pre, fim.suf, fim.mid))
    if not prompt.endswith(mid) or prompt.count(pre) != 1 or prompt.count(suf) != 1:
        return None
    head, rest = prompt.split(suf)
    if pre not in head:
        return None
    start = head.index(pre) + len(pre)
    cut = max(head.rfind("\n") + 1, start)
    source = rest[: -len(mid)] + head[: head.index(pre)]
    return Templated(head[:start], head[start:cut], suf + rest, head[cut:], source)


@dataclass
class InfillLines:
    """The line rule of a middle (text.LineRule): where it re-joins the suffix, runs
    out of its indentation, or has run past its time."""

    suffix: str
    n_indent: int = 0
    t_max_predict_s: float = 0.0
    written: str = ""  # lines the client wrote that open the middle: not judged
    why: str = ""  # what stopped it, for llama-server's stop_type: "limit" or "rejoin"
    _started: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # the first line of the suffix with text on it: the middle re-joins the suffix there
        self.rejoin = next((s.strip() for s in self.suffix.splitlines() if s.strip()), "")
        # the line breaks the suffix has before that line
        self.breaks = self.suffix[: len(self.suffix) - len(self.suffix.lstrip())].count("\n")

    def check(self, before: str, line: str) -> Verdict:
        if len(before) < len(self.written):  # a line the client wrote
            return "keep"
        if self.rejoin and line.strip() == self.rejoin:
            self.why = "rejoin"
            return "drop"
        if self.check_start(before, line + "\n") == "drop":
            return "drop"
        if self.t_max_predict_s and self.elapsed() > self.t_max_predict_s:
            self.why = "limit"
            return "end"
        return "keep"

    def check_start(self, before: str, start: str) -> Verdict:
        """llama-server's indentation rule: a later line (the first goes on from the
        cursor) whose first character after its indentation (a newline: a blank line)
        sits left of `n_indent` ends the middle."""
        if len(before) < len(self.written):  # a line the client wrote
            return "keep"
        before = before[len(self.written) :]  # the first line after them goes on too
        text = start.lstrip(" \t")
        if self.n_indent and before and text and len(start) - len(text) < self.n_indent:
            self.why = "limit"
            return "drop"
        return "keep"

    def joint(self, gap: str) -> str:
        """Where the middle re-joins the suffix, the line breaks before that line are
        the middle's and the suffix's together: the middle keeps those the suffix does
        not bring (a middle `return x`, a blank line, then the suffix's first line, is
        not followed by that blank line twice when the suffix starts with it).
        Elsewhere (time, indentation) it keeps them all, as llama-server does."""
        if self.why != "rejoin":
            return gap
        return "\n" * max(gap.count("\n") - self.breaks, 0)

    def start(self) -> None:
        self._started = time.perf_counter()

    def elapsed(self) -> float:
        return 0.0 if self._started is None else time.perf_counter() - self._started


def stop_type(reason: StopReason, lines: InfillLines | None) -> str:
    """llama-server's stop_type: "eos", "word" (a stop string), "limit" (n_predict, time,
    indentation, the context), or "none" (cancelled)."""
    if reason == "eog":
        return "eos"
    if reason == "stop_string":
        return "limit" if lines is not None and lines.why else "word"
    return "none" if reason == "cancelled" else "limit"


def infill_body(
    done: Finished,
    model: str,
    prompt_tokens: int,
    cached: int,
    truncated: bool,
    lines: InfillLines | None,
    tokens: bool = False,
    opened: int = 0,
    slot: int = 0,
) -> dict[str, Any]:
    """llama-server's /infill (and /completion) response; `opened`: the tokens of the
    opening, in the slot's context but not in the middle; `slot`: the slot that ran it."""
    s, n = done.stats, len(done.tokens)
    # with no token asked for (an editor's cache warm-up), all of it was reading
    prompt_ms = (s.ttft_s if n else s.elapsed_s) * 1e3
    read = max(prompt_tokens - cached, 1)
    predicted_ms = max(s.elapsed_s - s.ttft_s, 0.0) * 1e3 if n else 0.0
    return {
        "index": 0,
        "content": done.text,
        "tokens": list(done.tokens) if tokens else [],
        "id_slot": slot,
        "stop": True,
        "model": model,
        "tokens_predicted": n,
        "tokens_evaluated": prompt_tokens,
        "prompt": "",
        "has_new_line": "\n" in done.text,
        "truncated": truncated,
        "stop_type": stop_type(done.stop_reason, lines),
        "stopping_word": done.stop_string or "",
        "tokens_cached": prompt_tokens + opened + n,  # what the slot's context holds now
        "timings": {
            "prompt_n": read,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / read,
            "prompt_per_second": read / (prompt_ms / 1e3) if prompt_ms else 0.0,
            "cache_n": cached,
            "predicted_n": n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n if n else 0.0,
            "predicted_per_second": n / (predicted_ms / 1e3) if predicted_ms else 0.0,
            # as llama-server: only where speculation drafted (how clients tell it ran)
            **({"draft_n": s.drafted, "draft_n_accepted": s.accepted} if s.drafted else {}),
            # localspec's own: the tokens the slot's last middle had chosen here
            **({"recalled_n": s.recalled} if s.recalled else {}),
        },
    }


def pick_fields(body: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """llama-server's response_fields: only the fields asked for, a nested one under its
    path ("timings/prompt_n"); unknown ones are left out."""
    if fields is None:
        return body
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out
