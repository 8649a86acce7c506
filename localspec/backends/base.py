"""The one interface a model backend implements, and the KV-cache bookkeeping all share.

A model's KV cache holds a list of tokens at positions 0..n-1. `evaluate(tokens, k)`
makes the cache hold exactly `tokens` and returns the next-token logits after each of
the last k: it keeps the longest common prefix, drops the rest (`llama_memory_seq_rm`)
and decodes only what is new. Prefill, verification, rollback after a rejection,
re-syncing the draft model and reusing a chat's earlier turns are all this one call.

A recurrent or hybrid model (Mamba, RWKV, Jamba, Qwen3.5, Granite 4.0-H) keeps one
state, not one entry per position, so its cache cannot drop a suffix, except through
snapshots of that state after the last few tokens of a pass, where llama.cpp keeps them
(`cut_depth` of them; `can_cut` is False where there are none). A cut they do not cover
fails in `_remove_from`: the cache then starts over and the next call re-reads the text
from the start: slow, but the logits stay those of the text.
"""

from __future__ import annotations

import operator
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Self, SupportsIndex, TypeVar

import numpy as np

from localspec.errors import LocalspecError

T = TypeVar("T")


class ModelError(LocalspecError):
    """A model could not be loaded or run; the message is meant for the user."""


class LoadFailed(ModelError):
    """llama.cpp could not load a model or allocate its context (most often: memory)."""

    def __init__(self, message: str, n_ctx: int | None = None) -> None:
        super().__init__(message)
        self.n_ctx = n_ctx  # the context it could not allocate, when that was the failure


class ContextFull(ModelError):
    """The tokens do not fit in the model's context window."""


class Cancelled(Exception):
    """The request's client left while its tokens waited for (or went through) a shared
    pass; the first `done` of them were read."""

    def __init__(self, done: int = 0) -> None:
        super().__init__("cancelled")
        self.done = done


def common_prefix(a: Sequence[T], b: Sequence[T], start: int = 0) -> int:
    """The length of the longest common prefix of a and b (token lists, or texts), given
    that they agree before `start`. It compares whole slices (C speed, ~1 ns a token) and
    halves the range where they differ, never a Python loop over the tokens."""
    a, b = _sliceable(a), _sliceable(b)
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    n = len(short)
    if start >= n:
        return n
    if short[start:] == long[start:n]:
        return n
    lo, hi = start, n  # short[:lo] == long[:lo]; they differ before hi
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if short[lo:mid] == long[lo:mid]:
            lo = mid
        else:
            hi = mid
    while short[lo] == long[lo]:
        lo += 1
    return lo


LONG_READ = 32  # a read of this many tokens or more times the model's rate of reading
MEMO_FROM = 1024  # shorter lists are compared outright: it costs less than the bookkeeping
# a recurrent model's prompt of CHECKPOINT_FROM tokens or more gets a lasting checkpoint
# CHECKPOINT_TAIL tokens before its end (llama-server's offset; see Model.evaluate)
CHECKPOINT_FROM, CHECKPOINT_TAIL = 16, 4


def checkpoint_stops(start: int, end: int, marks: Sequence[int]) -> list[int]:
    """Where a prompt's read of tokens [start, end) stops for a lasting checkpoint: at
    the marks within it, and CHECKPOINT_TAIL tokens before its end where it reads
    CHECKPOINT_FROM tokens or more."""
    tail = end - CHECKPOINT_TAIL
    stops = sorted({m for m in marks if start < m < tail})
    return [*stops, tail] if end - start >= CHECKPOINT_FROM else stops


class SeqState(bytearray):
    """A model's saved cache (`Model.save_state`): llama.cpp's bytes for it, and what a
    recurrent model keeps beside them, `kept` (its lasting checkpoints: opaque here,
    `kept_bytes` in all), which comes back with it."""

    kept: tuple[Any, ...] = ()
    kept_bytes = 0

    @property
    def size(self) -> int:
        return len(self) + self.kept_bytes


class Tokens(list[int]):
    """A token list that logs its changes: appending is free, and any other change (a
    cut, an assignment) notes the first position it touched. Each round asks how much of
    a kept list (a cache's, an index's) still agrees with the context; two Tokens answer
    from where they last agreed, in time proportional to what changed since, not to the
    context (what that saves a round at 30k tokens: docs/design.md, "The caches"). A
    change made past the list's methods (C code writing into it) would go unseen; nothing
    here does that."""

    __slots__ = ("__weakref__", "_agreed", "_log", "_log_start")
    LOG_MAX = 1024  # changes kept; past them, agreements made before are forgotten

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        super().__init__(tokens)
        self._log: list[int] = []  # the first position each change touched, in order
        self._log_start = 0  # changes counted before the log's first entry
        # id(other) -> (other, its change count, ours, the prefix both held then)
        self._agreed: dict[int, tuple[weakref.ref[Tokens], int, int, int]] = {}

    @property
    def changes(self) -> int:
        return self._log_start + len(self._log)

    def unchanged_before(self, since: int) -> int:
        """A position no change after the first `since` touched anything before (0 where
        those changes are forgotten)."""
        if since < self._log_start:
            return 0
        return min(self._log[since - self._log_start :], default=len(self))

    def agreed(self, other: Tokens) -> int:
        """How long a prefix this list and `other` are known to share: what they shared
        when last compared, as far as neither changed it since."""
        entry = self._agreed.get(id(other))
        if entry is None or entry[0]() is not other:
            return 0
        _, theirs, ours, n = entry
        return min(n, other.unchanged_before(theirs), self.unchanged_before(ours))

    def agree(self, other: Tokens, n: int) -> None:
        """Note that this list and `other` share their first n tokens."""
        if len(self._agreed) >= 4 and id(other) not in self._agreed:
            del self._agreed[next(iter(self._agreed))]  # the oldest
        self._agreed[id(other)] = (weakref.ref(other), other.changes, self.changes, n)

    def trying(self, more: Sequence[int]) -> Trial:
        """This list with `more` after it for a `with` block (a draft read for one
        pass), then as it was."""
        return Trial(self, more)

    def follow(self, tokens: Sequence[int]) -> int:
        """Become a copy of `tokens`, keeping the prefix shared with it (its length is
        returned)."""
        n = shared_prefix(self, tokens)
        if n < len(self):
            del self[n:]
        self.extend(tokens[n:])
        if len(self) >= MEMO_FROM and isinstance(tokens, Tokens):
            self.agree(tokens, len(self))
        return n

    def _changed(self, at: int) -> None:
        self._log.append(at)
        if len(self._log) > self.LOG_MAX:
            self._log_start += len(self._log)
            self._log.clear()

    def _first(self, index: SupportsIndex | slice) -> int:
        if isinstance(index, slice):
            start, _, step = index.indices(len(self))
            return start if step == 1 else 0
        i = operator.index(index)
        return i + len(self) if i < 0 else i

    def __setitem__(self, index: Any, value: Any) -> None:
        self._changed(self._first(index))
        super().__setitem__(index, value)

    def __delitem__(self, index: SupportsIndex | slice) -> None:
        self._changed(self._first(index))
        super().__delitem__(index)

    def pop(self, index: SupportsIndex = -1) -> int:
        self._changed(max(0, self._first(index)))
        return super().pop(index)

    def insert(self, index: SupportsIndex, value: int) -> None:
        self._changed(max(0, min(self._first(index), len(self))))
        super().insert(index, value)

    def remove(self, value: int) -> None:
        self._changed(0)
        super().remove(value)

    def clear(self) -> None:
        self._changed(0)
        super().clear()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._changed(0)
        super().sort(*args, **kwargs)

    def reverse(self) -> None:
        self._changed(0)
        super().reverse()

    def __imul__(self, n: SupportsIndex) -> Self:
        self._changed(0)
        return super().__imul__(n)

    def __reduce__(self) -> tuple[type[Tokens], tuple[list[int]]]:
        return Tokens, (list(self),)  # a copy agrees with nothing yet


class Trial:
    """`Tokens.trying`'s block (a class: a generator's context manager costs more, and
    a plain round runs one)."""

    __slots__ = ("n", "tokens")

    def __init__(self, tokens: Tokens, more: Sequence[int]) -> None:
        self.tokens, self.n = tokens, len(tokens)
        tokens.extend(more)

    def __enter__(self) -> Tokens:
        return self.tokens

    def __exit__(self, *exc: object) -> None:
        if len(self.tokens) > self.n:
            del self.tokens[self.n :]


@contextmanager
def followed_by(tokens: Sequence[int], more: Sequence[int]) -> Iterator[list[int]]:
    """`tokens` then `more`, for a `with` block that may append to it: a Tokens lends
    itself (see Tokens.trying), anything else is copied."""
    if isinstance(tokens, Tokens):
        with tokens.trying(more) as seq:
            yield seq
    else:
        yield [*tokens, *more]


def shared_prefix(stored: list[int], tokens: Sequence[int]) -> int:
    """common_prefix of a list kept from round to round (a cache's, an index's) and the
    caller's tokens. Where both are Tokens, from where they last agreed (see Tokens).
    The kept list takes the caller's int objects for the prefix it compared: Python
    compares one object with itself by its address, equal ints of two objects by value,
    four times slower, and a chat re-tokenized for each request has new objects for its
    earlier turns."""
    if len(stored) >= MEMO_FROM and isinstance(stored, Tokens) and isinstance(tokens, Tokens):
        n = _shared_from(stored, tokens, stored.agreed(tokens))
        stored.agree(tokens, n)
        return n
    return _shared_from(stored, tokens, 0)


def _shared_from(stored: list[int], tokens: Sequence[int], start: int) -> int:
    n = common_prefix(stored, tokens, start)
    if n > start and isinstance(tokens, list) and stored[n - 1] is not tokens[n - 1]:
        list.__setitem__(stored, slice(start, n), tokens[start:n])  # equal values: no change
    return n


def moves(
    cached: Sequence[int], tokens: Sequence[int], min_chunk: int
) -> tuple[int, list[tuple[int, int, int]]]:
    """What llama-server's --cache-reuse keeps of `cached` for `tokens`: the shared prefix,
    then, in order, each run of at least `min_chunk` cached tokens that `tokens` holds
    next, as (where tokens has it, where the cache has it, length). Runs only move back:
    llama.cpp wants a sequence's positions to stay consecutive."""
    n_past = common_prefix(cached, tokens)
    head_c = head_p = n_past
    chunks: list[tuple[int, int, int]] = []
    while min_chunk > 0 and head_c < len(cached) and head_p < len(tokens):
        n = common_prefix(cached[head_c:], tokens[head_p:])
        if n >= min_chunk:
            chunks.append((head_p, head_c, n))
            head_p, head_c = head_p + n, head_c + n
        else:
            head_c += 1
    return n_past, chunks


def _sliceable(seq: Sequence[T]) -> Sequence[T]:
    """`seq` as a list, or a text as it is: their slices compare with their own kind."""
    return seq if isinstance(seq, list | str) else list(seq)


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle tokens (llama.cpp's llama_vocab_fim_*), -1 where
    it has none: prefix, suffix, middle; the repository name and file separator of the
    repository layout (Qwen2.5-Coder's <|repo_name|>, <|file_sep|>)."""

    pre: int = -1
    suf: int = -1
    mid: int = -1
    rep: int = -1
    sep: int = -1

    @property
    def complete(self) -> bool:
        """Whether the model can fill in a middle at all."""
        return min(self.pre, self.suf, self.mid) >= 0


class Model(ABC):
    """A causal language model with a single-sequence KV cache."""

    name: str
    n_vocab: int
    n_ctx: int

    def __init__(self) -> None:
        self.cached: list[int] = Tokens()
        # set when the request being read has gone: a long prompt stops between chunks
        self.cancel: threading.Event | None = None
        self.busy_s = 0.0  # wall time inside decode calls, for overhead accounting
        self.decoded = 0  # tokens sent through the model so far
        # the last call went through a pass with other sequences' tokens (serve's slots):
        # its time is the pass's, not a measure of this call's cost
        self.shared_pass = False
        self.restarts = 0  # cuts that failed, so that the cache started over
        self.read_s = 0.0  # seconds a token of its last long read alone (a prompt's)

    def stop_if_cancelled(self, read: int) -> None:
        """Between the chunks of a long read: once its request is gone, stop after the
        `read` tokens already read (they stay cached)."""
        if read and self.cancel is not None and self.cancel.is_set():
            raise Cancelled(read)

    def evaluate(
        self,
        tokens: Sequence[int],
        n_logits: int,
        checkpoint: bool = False,
        marks: Sequence[int] = (),
    ) -> np.ndarray:
        """Logits of shape (n_logits, n_vocab): row i predicts the token after
        tokens[: len(tokens) - n_logits + i + 1]. Valid until the next call.

        `checkpoint` (a prompt's read): where the cache cannot cut deep (a recurrent
        state), a long read stops CHECKPOINT_TAIL tokens before its end for a lasting
        checkpoint, as llama-server's context checkpoints do. The next turn's prompt
        parts from this one there or later (a thinking model's history drops the
        reasoning after the assistant's header; an agent's tool call comes back
        re-written), and its read starts from the checkpoint instead of from the start.
        It stops at the `marks` it reads past too (messages' starts: a new conversation
        shares the system prompt before the first, an edited turn the text before its
        own), as llama-server's do at user messages, and the copies kept at those it has
        read before stay while it makes new ones."""
        if len(tokens) > self.n_ctx:
            raise ContextFull(f"{len(tokens)} tokens do not fit the context of {self.n_ctx}")
        self._cut_to(min(shared_prefix(self.cached, tokens), len(tokens) - n_logits))
        new = list(tokens[len(self.cached) :])
        if not new:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        if max(new) >= self.n_vocab or min(new) < 0:
            bad = next(t for t in new if not 0 <= t < self.n_vocab)
            raise ModelError(f"token {bad} is not in {self.name}'s vocabulary of {self.n_vocab}")
        if checkpoint and self.cut_depth is not None and n_logits <= CHECKPOINT_TAIL:
            for stop in checkpoint_stops(len(self.cached), len(tokens), marks):
                self._append(list(tokens[len(self.cached) : stop]), 0)
                self.checkpoint(lasting=True, held=marks)
            new = list(tokens[len(self.cached) :])
        return self._append(new, n_logits)

    def _append(self, new: list[int], n_logits: int) -> np.ndarray:
        """Decode `new` after what the cache holds."""
        keep = len(self.cached)
        started = time.perf_counter()
        try:
            logits = self._decode(new, keep, n_logits)
        except Cancelled as e:  # a prompt cut short between chunks: keep what was read
            self.cached.extend(new[: e.done])
            raise
        except Exception:
            self.reset()  # the cache's state is unknown after a failed decode
            raise
        finally:
            took = self._busy_since(started)
            self.busy_s += took
        if len(new) >= LONG_READ and not self.shared_pass:
            self.read_s = took / len(new)
        self.cached.extend(new)
        self.decoded += len(new)
        return logits

    def _busy_since(self, started: float) -> float:
        """The model's time in the call that began at `started` (a view of a shared
        context counts its passes only, not its waits for them)."""
        return time.perf_counter() - started

    def rollback(self, tokens: Sequence[int], end: int | None = None) -> None:
        """Drop cache entries past the common prefix with `tokens[:end]` (a rejected
        draft)."""
        n = shared_prefix(self.cached, tokens)
        self._cut_to(n if end is None else min(n, end))

    def reset(self) -> None:
        if not self._remove_from(0):
            raise ModelError(f"the cache of {self.name} could not be cleared")
        self.cached.clear()

    def _cut_to(self, keep: int) -> None:
        """Make the cache hold cached[:keep]; where the backend cannot drop a suffix
        (a recurrent model), it starts over empty."""
        if keep >= len(self.cached):
            return
        if self._remove_from(keep):
            del self.cached[keep:]
        elif (held := self._restore(keep)) is not None:
            del self.cached[held:]  # the next call reads from the checkpoint on
        else:
            self.restarts += 1
            self.reset()

    def checkpoint(  # noqa: B027 - optional hook
        self, lasting: bool = False, held: Sequence[int] = ()
    ) -> None:
        """Keep the state as it is now, for a later cut that cannot be made in place (a
        recurrent state's, past its snapshots) to come back to; nothing where every cut
        can be made in place. A draft round's replaces the last one's; a `lasting` one
        (a prompt's, see `evaluate`) stays for later turns, and makes way for another
        where there are too many, but not for those at `held` positions (the prompt's
        message starts; see checkpoints.py)."""

    def _restore(self, pos: int) -> int | None:
        """Go back to the checkpoint where it lies at or before `pos`: the position it
        holds (the cache holds cached[:that] then), or None where there is none."""
        return None

    def reuse(self, tokens: Sequence[int], min_chunk: int) -> int:
        """llama-server's --cache-reuse: past the prefix the cache shares with `tokens`,
        the chunks `moves` finds (an editor's context chunk that moved up when one before
        it went) are moved to where `tokens` has them, not read again; what the cache
        skipped over goes. The moved entries were computed after other text, so the
        answer is close to, not exactly, a fresh read's: a trade the user asks for.
        Returns the tokens moved."""
        n_past, chunks = moves(self.cached, tokens, min_chunk)
        kept = self.cached[:n_past]
        for head_p, head_c, n in chunks:
            if not self._move((head_p, head_c), (head_c, head_c + n)):
                break
            kept += self.cached[head_c : head_c + n]
        if len(kept) > n_past:
            # what lies past the last moved chunk still sits at its old positions
            self._remove_from(len(kept))
            self.cached = Tokens(kept)
        return len(kept) - n_past

    def _move(self, gap: tuple[int, int], chunk: tuple[int, int]) -> bool:
        """Drop the entries at positions [gap), move [chunk) back by the gap's width;
        False where the backend cannot (then nothing changed)."""
        return False

    def save_state(self) -> bytearray | None:
        """The cache's state (what it holds of `cached`), for `load_state` to put back
        later; None where the backend cannot (a recurrent state)."""
        return None

    def load_state(self, tokens: Sequence[int], state: bytearray) -> bool:
        """Make the cache hold `tokens` again, from their `save_state`; False where it
        could not (the cache is then empty)."""
        return False

    @property
    def can_cut(self) -> bool:
        """Whether the cache can drop a suffix (a rejected draft) in place."""
        return True

    @property
    def cut_depth(self) -> int | None:
        """The most tokens of its last pass the cache can drop (a recurrent state's
        snapshots); None: any suffix."""
        return None

    def kv_len(self) -> int:
        """Positions the backend itself holds (tests compare it with `cached`)."""
        return len(self.cached)

    @abstractmethod
    def _decode(self, tokens: list[int], pos: int, n_logits: int) -> np.ndarray:
        """Append `tokens` at positions pos.. and return logits for the last n_logits."""

    @abstractmethod
    def _remove_from(self, pos: int) -> bool:
        """Drop cache entries at positions >= pos; False where the backend cannot (a
        recurrent model's partial removal), leaving the cache as it was."""

    # --- vocabulary --------------------------------------------------------------
    @abstractmethod
    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """Text to tokens; `special` parses control tokens and adds BOS where the model
        wants one (not twice when the text already starts with it)."""

    @abstractmethod
    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """The bytes one token renders to (a control token's text where `special`, else
        nothing)."""

    @abstractmethod
    def is_eog(self, token: int) -> bool:
        """End of generation (EOS, EOT, <|im_end|>, ...)."""

    @abstractmethod
    def token_text(self, token: int) -> str:
        """The vocabulary's own text for a token id (for compatibility checks)."""

    @cached_property
    def eog_ids(self) -> tuple[int, ...]:
        """Every token that ends a generation (what llama-server's `ignore_eos` bans)."""
        return tuple(t for t in range(self.n_vocab) if self.is_eog(t))

    @property
    def size_bytes(self) -> int:
        """Weight bytes, all of them."""
        return 0

    @property
    def read_bytes(self) -> int:
        """Weight bytes one token's pass reads, which predict relative costs: all of them,
        but for a MoE's routed experts the token is not sent to."""
        return self.size_bytes

    @property
    def vocab_kind(self) -> str:
        """Tokenizer family (e.g. 'bpe', 'spm'); equal kinds are a precondition to pairing."""
        return "unknown"

    @property
    def special_ids(self) -> tuple[int, int]:
        """(BOS, EOS) ids; -1 where the model has none."""
        return (-1, -1)

    def chat_template(self) -> str | None:
        return None

    def metadata(self, key: str) -> str | None:
        """A metadata value of the model's file as text (a GGUF key); None where absent."""
        return None

    def fim_tokens(self) -> FimTokens:
        """The fill-in-the-middle tokens the vocabulary declares (none by default)."""
        return FimTokens()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free native resources."""


MAX_VOCAB_DIFFERENCE = 128  # llama.cpp's: padded vocabularies of one family differ by this


def check_compatible(target: Model, draft: Model) -> None:
    """Refuse a draft whose tokens mean something else to the target (llama.cpp's rule:
    same tokenizer kind and special tokens, vocab sizes within 128, equal token texts)."""
    first_checked = 5
    if target.vocab_kind != draft.vocab_kind:
        raise ModelError(
            f"draft {draft.name} uses a {draft.vocab_kind} tokenizer, "
            f"target {target.name} a {target.vocab_kind} one: they cannot be paired"
        )
    if abs(target.n_vocab - draft.n_vocab) > MAX_VOCAB_DIFFERENCE:
        raise ModelError(
            f"draft {draft.name} has {draft.n_vocab} tokens, target {target.name} has "
            f"{target.n_vocab}: vocabularies too different to pair"
        )
    if target.special_ids != draft.special_ids:
        raise ModelError(f"draft {draft.name} and target {target.name} use different BOS/EOS")
    for i in range(first_checked, min(target.n_vocab, draft.n_vocab)):
        if target.token_text(i) != draft.token_text(i):
            raise ModelError(
                f"draft {draft.name} and target {target.name} disagree on token {i} "
                f"({draft.token_text(i)!r} vs {target.token_text(i)!r}): not the same vocabulary"
            )
