"""An answer that must open with a given text, split into tokens as the model pleases.

Fill-in-the-middle's typed text (llama.vim's and llama.vscode's `prompt`: the cursor's
line up to the cursor) opens the middle here, where llama-server reads it at the end of
the prefix. There it sits before the suffix, so each keystroke reads the suffix again;
here the prompt is the same from keystroke to keystroke on a line, and the typed text is
a forced draft that the target verifies with the rest of its first round. Appending the
typed text's own tokens would not do: a middle then goes on from a split the model never
saw in training (after a token of eight spaces it writes ` self`, one space too many),
so the text is a grammar instead, and the model picks each token that spells it (a
token may run past its end). On the fim suite's cases the middles come about as close
to the authors' as with llama-server's layout (docs/bench/fim, scripts/fim_layouts.py).
"""

from __future__ import annotations

import bisect
import weakref

import numpy as np

from localspec.backends.base import Model


class Pieces:
    """The bytes of every token of a vocabulary, sorted to find those that begin a text."""

    def __init__(self, model: Model) -> None:
        self.of = [model.token_bytes(t) for t in range(model.n_vocab)]
        self.ids: dict[bytes, list[int]] = {}
        for token, piece in enumerate(self.of):
            if piece:  # a control token renders to nothing: it spells no text
                self.ids.setdefault(piece, []).append(token)
        # every spelling token's piece in byte order, and its id: the tokens that begin
        # with a text are one run of it (53k of Qwen's 152k begin with a space)
        keyed = sorted((piece, token) for piece, tokens in self.ids.items() for token in tokens)
        self.sorted = [piece for piece, _ in keyed]
        self.order = np.array([token for _, token in keyed], dtype=np.int64)

    def spelling(self, text: bytes) -> np.ndarray:
        """The tokens that may come first in a spelling of `text`: those that are a start
        of it, and those it is a start of."""
        shorter = [t for k in range(1, len(text)) for t in self.ids.get(text[:k], ())]
        longer = self.order[bisect.bisect_left(self.sorted, text) : self._past(text)]
        return np.sort(np.concatenate([longer, np.array(shorter, dtype=np.int64)]))

    def _past(self, text: bytes) -> int:
        """Where the pieces that begin with `text` end in `sorted`."""
        stem = text.rstrip(b"\xff")
        if not stem:  # only 0xff bytes: every piece after them begins with them
            return len(self.sorted)
        return bisect.bisect_left(self.sorted, stem[:-1] + bytes([stem[-1] + 1]))


_PIECES: weakref.WeakKeyDictionary[Model, Pieces] = weakref.WeakKeyDictionary()


def pieces_of(model: Model) -> Pieces:
    """A model's Pieces, made once (~0.4 s for a 152k vocabulary)."""
    if (found := _PIECES.get(model)) is None:
        found = _PIECES[model] = Pieces(model)
    return found


class Opening:
    """A grammar (localspec.decoding.grammar): the answer opens with `text`, then is free."""

    def __init__(self, model: Model, text: str) -> None:
        self.pieces = pieces_of(model)
        self.text = text.encode()

    def start(self) -> OpeningState:
        return OpeningState(self.pieces, self.text)

    def within(self, other: object) -> bool:
        """An opening typed further allows fewer tokens at each step: those that spell
        a start of it or run past its end spelled one of the shorter opening too."""
        return (
            isinstance(other, Opening)
            and other.pieces is self.pieces
            and self.text.startswith(other.text)
        )


class OpeningState:
    def __init__(self, pieces: Pieces, left: bytes) -> None:
        self.pieces = pieces
        self.left = left  # what of the opening is still to be written
        self._ids: np.ndarray | None = None

    def spelling(self) -> np.ndarray | None:
        """The tokens allowed next, in id order; None once the answer is free (the
        opening written, or a vocabulary that cannot spell it: then it is not forced)."""
        if not self.left:
            return None
        if self._ids is None:
            self._ids = self.pieces.spelling(self.left)
        return self._ids if len(self._ids) else None

    def allows(self, token: int) -> bool:
        if (ids := self.spelling()) is None:
            return True
        i = int(np.searchsorted(ids, token))
        return i < len(ids) and int(ids[i]) == token

    def mask(self, logits: np.ndarray) -> np.ndarray:
        if (ids := self.spelling()) is None:
            return logits.copy()
        out = np.full_like(logits, -np.inf)
        out[ids] = logits[ids]
        return out

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        if (ids := self.spelling()) is None:
            return np.ones(len(tokens), dtype=bool)
        return np.isin(tokens, ids)

    def accept(self, token: int) -> None:
        piece = self.pieces.of[token]
        self.left = self.left[len(piece) :] if self.left.startswith(piece) else b""
        self._ids = None

    def clone(self) -> OpeningState:
        twin = OpeningState(self.pieces, self.left)
        twin._ids = self._ids
        return twin

    def forced_text(self, limit: int) -> bytes:
        return self.left[:limit] if self.spelling() is not None else b""

    def forced_tokens(self, limit: int) -> list[int]:
        return []  # text only, split as the model pleases

    @property
    def free(self) -> bool:
        return self.spelling() is None
