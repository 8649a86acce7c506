"""Small deterministic models for tests and demos: no weights, known distributions.

Logits are a pure function of the context, so a batched pass and one-token passes give
identical numbers (unlike llama.cpp's kernels), which makes exact statements about the
sampler testable. `ByteModel` speaks UTF-8 bytes and has a chat template, so the whole
stack (engine, CLI, UI) can run against it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

import numpy as np

from localspec.backends.base import Model, Tokens

LogitsFn = Callable[[Sequence[int]], np.ndarray]

BOS, EOS = 256, 257
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
ASSISTANT = b"<|assistant|>"
# a thinking model's, as Qwen3's: the model opens its own <think> block (the template
# writes an empty one only where thinking is turned off)
THINKING_TEMPLATE = TEMPLATE.replace(
    "<|assistant|>{% endif %}",
    "<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}",
)


class ToyModel(Model):
    """A model whose next-token logits are `logits_fn(context)`; tokens are bytes."""

    def __init__(
        self,
        logits_fn: LogitsFn,
        n_vocab: int = 258,
        n_ctx: int = 4096,
        name: str = "toy",
        pass_s: float = 0.0,
        token_s: float = 0.0,
        recurrent: bool = False,
        sleep: bool = True,
        template: str = TEMPLATE,
        n_batch: int = 512,
    ) -> None:
        """`pass_s` + `token_s` per token: simulated time a pass takes, a sleep, or with
        `sleep=False` only booked on `busy_s` (what adaptive drafting reads): the same
        costs on any machine, so its choices are reproducible.
        `recurrent`: like a Mamba, one state for all it has read; a cut that would keep
        part of it fails (and a backend that ignored that would read on after it).
        `n_batch`: tokens a pass reads at most, as llama.cpp's; a long prompt is read in
        passes of it, and stops between them once `cancel` is set."""
        super().__init__()
        self.logits_fn = logits_fn
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.name = name
        self.pass_s, self.token_s = pass_s, token_s
        self.decode_calls = 0  # how many passes ran: the test of "one pass per round"
        self.recurrent = recurrent
        self.sleep = sleep
        self.template = template
        self.n_batch = n_batch
        self.state: list[int] = []  # what the "backend" has read, as it sees it

    def _decode(self, tokens: list[int], pos: int, n_logits: int) -> np.ndarray:
        for start in range(0, len(tokens), self.n_batch):
            self.stop_if_cancelled(start)
            self._pass(tokens[start : start + self.n_batch])
        context = self.state  # pos is where the caller believes it appends
        end = len(context)
        rows = [self.logits_fn(context[: end - n_logits + i + 1]) for i in range(n_logits)]
        return np.asarray(rows, dtype=np.float32).reshape(n_logits, self.n_vocab)

    def _pass(self, tokens: list[int]) -> None:
        self.decode_calls += 1
        took = self.pass_s + self.token_s * len(tokens)
        if took and self.sleep:
            time.sleep(took)
        elif took:
            self.busy_s += took
        self.state = [*self.state, *tokens]

    def _remove_from(self, pos: int) -> bool:
        if self.recurrent and 0 < pos < len(self.state):
            return False
        del self.state[pos:]
        return True

    def save_state(self) -> bytearray | None:
        return None if self.recurrent else bytearray(json.dumps(self.state), "ascii")

    def load_state(self, tokens: Sequence[int], state: bytearray) -> bool:
        self.state = json.loads(state)
        self.cached = Tokens(tokens)
        return True

    @property
    def can_cut(self) -> bool:
        return not self.recurrent

    def kv_len(self) -> int:
        return len(self.state)

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        return bytes([token]) if token < 256 else b""

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def token_text(self, token: int) -> str:
        return self.token_bytes(token).decode("latin-1") or f"<{token}>"

    @property
    def vocab_kind(self) -> str:
        return "byte"

    @property
    def special_ids(self) -> tuple[int, int]:
        return (BOS, EOS)

    def chat_template(self) -> str | None:
        return self.template


def markov(n_vocab: int, seed: int, scale: float = 2.0) -> LogitsFn:
    """Logits that depend on the last token only, drawn once from a seeded normal."""
    table = np.random.default_rng(seed).normal(0.0, scale, size=(n_vocab, n_vocab))

    def logits(context: Sequence[int]) -> np.ndarray:
        return table[context[-1] % n_vocab]

    return logits


def scripted(
    reply: str | Callable[[bytes], str], confidence: float = 20.0, marker: bytes = ASSISTANT
) -> LogitsFn:
    """Answers every chat turn with `reply` (or reply(prompt)), then EOS: the byte after
    the last `marker` (TEMPLATE's '<|assistant|>', or another template's opening of the
    assistant's turn) is the next one of the reply, near-certainly."""

    def logits(context: Sequence[int]) -> np.ndarray:
        data = bytes(t for t in context if t < 256)
        start = data.rfind(marker)
        said = data[start + len(marker) :] if start >= 0 else data
        text = reply(data[:start]) if callable(reply) else reply
        target = text.encode("utf-8")
        out = np.zeros(258, dtype=np.float32)
        out[target[len(said)] if len(said) < len(target) else EOS] = confidence
        return out

    return logits
