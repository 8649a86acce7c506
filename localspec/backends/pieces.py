"""Tokenizing a prompt piece by piece between control tokens, each piece kept.

An agent re-sends its whole conversation with every request, and a chat's next turn
repeats the ones before: at 20k tokens llama.cpp's tokenizer takes ~34 ms of a CPU core
(`scripts/engine_overhead.py --suite agent`), about what a GPU takes to read the turn's
new tokens, on every request (llama-server pays it too). A chat template puts control tokens
(`<|im_start|>`, `<end_of_turn>`) between the messages, and llama.cpp tokenizes the text
between two special tokens on its own (`tokenizer_st_partition`, then each raw fragment
alone), so only the pieces a request adds need its tokenizer.

That equals tokenizing the whole text where, for each token split at (a *splitter*):
- llama.cpp finds every occurrence of its text as that token: no other special token's
  text contains it or overlaps it (a suffix of one being a prefix of the other), else
  the other, matched first where longer, could take some of its characters;
- it strips no whitespace beside it (the LSTRIP and RSTRIP attributes);
- and the vocabulary is BPE or SentencePiece (a raw fragment's SentencePiece space
  prefix follows a special token the same way in both), with no EOS added at the end.
Splitters are the special tokens the chat template writes that pass these checks.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

import llama_cpp as ll

CACHE_CHARS = 1 << 21  # the kept pieces' text, at most (LRU beyond)

Tokenize = Callable[[str, bool], list[int]]  # (text, add_special) -> tokens, specials parsed


class PieceTokenizer:
    """Tokenizes text as llama.cpp does, the pieces between splitters from a cache."""

    def __init__(self, tokenize: Tokenize, splitters: dict[str, int]) -> None:
        self._tokenize = tokenize
        self._ids = splitters  # text -> token id
        alternatives = sorted(splitters, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")").split
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()  # serve tokenizes on several threads

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        """llama.cpp's tokens for `text`, special tokens parsed; BOS first where
        `add_special` and the model adds one."""
        parts = self._split(text)  # piece, splitter, piece, ..., piece
        out = self._tokenize(parts[0], add_special)  # the first: BOS goes with it
        for i in range(1, len(parts), 2):
            out.append(self._ids[parts[i]])
            out.extend(self._piece(parts[i + 1]))
        return out

    def _piece(self, piece: str) -> list[int]:
        if not piece:
            return []
        with self._lock:
            tokens = self._pieces.get(piece)
            if tokens is not None:
                self._pieces.move_to_end(piece)
                return tokens
        tokens = self._tokenize(piece, False)
        with self._lock:
            if piece not in self._pieces:
                self._pieces[piece] = tokens
                self._chars += len(piece)
            while self._chars > CACHE_CHARS and len(self._pieces) > 1:
                old, _ = self._pieces.popitem(last=False)
                self._chars -= len(old)
        return tokens


def for_vocab(
    vocab: object, model: str | None, template: str, tokenize: Tokenize
) -> PieceTokenizer | None:
    """A PieceTokenizer for a llama.cpp vocabulary (its tokenizer.ggml.model, its chat
    template's text, its whole-text tokenizer); None where the vocabulary does not allow
    splitting (see the module docstring) or the template writes no safe splitter."""
    kind = ll.llama_vocab_type(vocab)
    if kind not in (ll.LLAMA_VOCAB_TYPE_BPE, ll.LLAMA_VOCAB_TYPE_SPM):
        return None
    if model not in ("gpt2", "llama") or ll.llama_vocab_get_add_eos(vocab):
        return None
    specials = special_tokens(vocab)
    found = splitters(specials, template) if specials else {}
    return PieceTokenizer(tokenize, found) if found else None


def special_tokens(vocab: object) -> list[tuple[int, str, bool]] | None:
    """The tokens llama.cpp parses as special in a text (its cache_special_tokens): (id,
    text, whether it strips whitespace beside it); None where a text is not UTF-8 (its
    bytes could match where no whole character does)."""
    special = ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_USER_DEFINED
    special |= ll.LLAMA_TOKEN_ATTR_UNKNOWN
    strips = ll.LLAMA_TOKEN_ATTR_LSTRIP | ll.LLAMA_TOKEN_ATTR_RSTRIP
    found = []
    for t in range(ll.llama_vocab_n_tokens(vocab)):
        if (attr := ll.llama_vocab_get_attr(vocab, t)) & special:
            try:
                text = (ll.llama_vocab_get_text(vocab, t) or b"").decode("utf-8")
            except UnicodeDecodeError:
                return None
            found.append((t, text, bool(attr & strips)))
    return found


def splitters(specials: Iterable[tuple[int, str, bool]], written: str) -> dict[str, int]:
    """The special tokens (id, text, strips whitespace beside it) safe to split at (see
    the module docstring), of those whose text `written` (the chat template) holds."""
    specials = list(specials)
    texts = [text for _, text, _ in specials]
    if any(not text for text in texts):
        return {}  # an empty special token's text would match everywhere
    safe = {}
    for token, text, strips in specials:
        if strips or text not in written or texts.count(text) > 1:
            continue  # (two tokens of one text: which one llama.cpp takes is not ours)
        if all(other == text or not _overlap(text, other) for other in texts):
            safe[text] = token
    return safe


def _overlap(a: str, b: str) -> bool:
    """Whether occurrences of a and b in a text can share characters without being
    equal: one contains the other, or one ends with what the other begins with."""
    if a in b or b in a:
        return True
    return any(a.endswith(b[:k]) or b.endswith(a[:k]) for k in range(1, min(len(a), len(b))))
