"""A llama.cpp model's vocabulary: tokenizing, token pieces, special and FIM tokens,
the chat template and metadata (LlamaModel's share that reads no cache)."""

from __future__ import annotations

import ctypes
from functools import cached_property
from typing import TYPE_CHECKING

import llama_cpp as ll

from localspec.backends import pieces
from localspec.backends.base import FimTokens
from localspec.backends.pieces import PieceTokenizer

if TYPE_CHECKING:
    from localspec.backends.llama import LoadOptions

# a prompt this long (~2k tokens, ~3 ms to tokenize) or longer is tokenized in pieces: the
# first one costs a look at every token's attributes (~50 ms for Qwen's 152k)
PIECES_FROM = 8192
_VOCAB_KINDS = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}


class LlamaVocab:
    """LlamaModel's vocabulary, from the llama.cpp model its loading sets."""

    _model: ctypes.c_void_p
    _vocab: ctypes.c_void_p
    _piece_cache: dict[int, bytes]
    n_vocab: int
    options: LoadOptions  # its chat_template

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        add_bos = special and not self._starts_with_bos(text)
        if special and len(text) >= PIECES_FROM and self._pieces is not None:
            return self._pieces.tokenize(text, add_bos)
        return self._tokenize(text, add_bos, special)

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            buf = (ll.llama_token * -n)()
            n = ll.llama_tokenize(self._vocab, data, len(data), buf, -n, add_special, parse_special)
        return list(buf[:n])

    @cached_property
    def _pieces(self) -> PieceTokenizer | None:
        return pieces.for_vocab(
            self._vocab,
            self.metadata("tokenizer.ggml.model"),
            self.chat_template() or "",
            lambda text, add: self._tokenize(text, add, True),
        )

    def special_tokens(self) -> list[tuple[int, str, bool]] | None:
        return pieces.special_tokens(self._vocab)

    def _starts_with_bos(self, text: str) -> bool:
        bos = ll.llama_vocab_bos(self._vocab)
        return bos >= 0 and text.startswith(self.token_text(bos))

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        if special:
            return self._piece(token, True)
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece_cache[token] = self._piece(token, False)
        return piece

    def _piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self._vocab, token))

    def token_text(self, token: int) -> str:
        return (ll.llama_vocab_get_text(self._vocab, token) or b"").decode("utf-8", "replace")

    @property
    def vocab_kind(self) -> str:
        return _VOCAB_KINDS.get(ll.llama_vocab_type(self._vocab), "unknown")

    @property
    def special_ids(self) -> tuple[int, int]:
        return (ll.llama_vocab_bos(self._vocab), ll.llama_vocab_eos(self._vocab))

    def chat_template(self) -> str | None:
        raw = self.options.chat_template or ll.llama_model_chat_template(self._model, None)
        return (raw.decode("utf-8") if isinstance(raw, bytes) else raw) or None

    def fim_tokens(self) -> FimTokens:
        v = self._vocab
        return FimTokens(
            ll.llama_vocab_fim_pre(v),
            ll.llama_vocab_fim_suf(v),
            ll.llama_vocab_fim_mid(v),
            ll.llama_vocab_fim_rep(v),
            ll.llama_vocab_fim_sep(v),
        )

    @property
    def adds_bos(self) -> bool:
        """Whether the vocabulary wants BOS at the start of a text."""
        return bool(ll.llama_vocab_get_add_bos(self._vocab))

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = ll.llama_model_meta_val_str(self._model, key.encode(), buf, 256)
        return buf.value.decode("utf-8", "replace") if n >= 0 else None
