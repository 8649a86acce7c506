"""What `serve` gives a request that leaves a sampling or reasoning field out: its own
flags' values (`--temperature`, `--reasoning-budget`, ...), else the GGUF's recommended
sampling, in place of the API's own default."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

T = TypeVar("T", bound=BaseModel)


@dataclass(frozen=True)
class SamplingDefaults:
    """`serve --temperature/--top-p/--top-k/--min-p`: what a request that leaves one out
    gets, in place of its API's own default (OpenAI's and Anthropic's temperature 1.0,
    llama-server's 0.8). Agents send none, and at 1.0 a small model's tool calls and
    JSON go astray; llama-server's `--temp` is the same knob."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None

    @classmethod
    def of_model(cls, metadata: Callable[[str], str | None]) -> SamplingDefaults:
        """What a GGUF recommends (`general.sampling.*`, written from the model's
        generation_config.json by llama.cpp's converter, read so by llama-server)."""

        def number(key: str, kind: type[float] | type[int], lo: float, hi: float) -> Any:
            try:
                value = kind(metadata(f"general.sampling.{key}") or "")
            except ValueError:
                return None
            return value if lo <= value <= hi else None  # a value out of range: none

        return cls(
            number("temp", float, 0, 2),
            number("top_p", float, 1e-6, 1),
            number("top_k", int, 0, 1 << 20),
            number("min_p", float, 0, 0.999),
        )

    def over(self, other: SamplingDefaults) -> SamplingDefaults:
        """These, and `other`'s where these say nothing."""
        mine = asdict(self)
        return SamplingDefaults(
            **{k: v if mine[k] is None else mine[k] for k, v in asdict(other).items()}
        )

    def describe(self) -> str:
        """'temperature 0.7, top_p 0.8' ('' for none)."""
        return ", ".join(f"{k} {v:g}" for k, v in asdict(self).items() if v is not None)

    def fill(self, body: T) -> T:
        """`body` with what it leaves unset set to these."""
        return filled(self, body)


@dataclass(frozen=True)
class ReasoningDefaults:
    """`serve --reasoning-budget/--reasoning-budget-message` (llama-server's flags): a
    thinking model's budget for the chat requests that set none."""

    reasoning_budget_tokens: int | None = None
    reasoning_budget_message: str | None = None

    def fill(self, body: T) -> T:
        return filled(self, body)


def filled(defaults: Any, body: T) -> T:
    """`body` with the fields it leaves unset (and has) set to `defaults`' (a dataclass)."""
    unset = {
        name: value
        for name, value in asdict(defaults).items()
        if value is not None and name in type(body).model_fields and getattr(body, name) is None
    }
    return body.model_copy(update=unset) if unset else body
