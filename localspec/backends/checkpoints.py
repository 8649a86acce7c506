"""Copies of a recurrent model's state, by sequence: which `LlamaModel.keep_state`
keeps and `back_to_state` returns to. Plain bookkeeping over byte buffers; llama.cpp
fills and reads them (`llama_state_seq_get_data_ext`, the recurrent part only).

A draft round's copy (a draft model drafts a token a pass, which no snapshot takes back
further than one token) replaces the last round's; a `lasting` one, at a message's start
or a few tokens before a prompt's end (Model.evaluate), stays for later turns: at most
LASTING_CHECKPOINTS of them, the earliest in the text (a system prompt's end, which the
next conversation may share), those at the reading prompt's own marks (`held`: where an
agent's task was asked, whose next task parts from its history there) and the latest.
A copy past where the cache was cut no longer holds its text and is forgotten.
"""

from __future__ import annotations

import ctypes
from collections.abc import Collection
from dataclasses import dataclass, field

from localspec.drafting import LASTING_CHECKPOINTS

Buffer = ctypes.Array[ctypes.c_uint8]


@dataclass
class Kept:
    """A copy of a sequence's recurrent state after its first `pos` tokens."""

    pos: int
    state: Buffer
    lasting: bool


def copied(kept: Kept) -> Kept:
    return Kept(kept.pos, (ctypes.c_uint8 * len(kept.state)).from_buffer_copy(kept.state), True)


@dataclass
class Checkpoints:
    by_seq: dict[int, list[Kept]] = field(default_factory=dict)  # oldest first

    def take(
        self, seq: int, pos: int, lasting: bool, size: int, held: Collection[int] = ()
    ) -> Kept:
        """A new copy at `pos` for llama.cpp to fill, in place of the one it replaces
        (whose buffer it reuses where the size is the same): the oldest lasting one but
        the earliest in the text and those at `held` positions, where there are others."""
        kept = self.by_seq.setdefault(seq, [])
        old = next((k for k in kept if k.pos == pos), None)
        if old is None and (alike := [k for k in kept if k.lasting == lasting]):
            if not lasting:
                old = alike[0]
            elif len(alike) >= LASTING_CHECKPOINTS:
                earliest = min(alike, key=lambda k: k.pos)
                others = [k for k in alike if k is not earliest]
                old = next((k for k in others if k.pos not in held), others[0])
        if old is not None:
            kept.remove(old)
            lasting |= old.lasting and old.pos == pos
        same = old is not None and len(old.state) == size
        new = Kept(pos, old.state if old and same else (ctypes.c_uint8 * size)(), lasting)
        kept.append(new)
        return new

    def latest(self, seq: int, pos: int) -> Kept | None:
        """The latest copy at or before `pos`."""
        kept = [k for k in self.by_seq.get(seq, ()) if k.pos <= pos]
        return max(kept, key=lambda k: k.pos) if kept else None

    def forget(self, seq: int, pos: int) -> None:
        """Drop the copies past position `pos`, where the cache no longer reaches."""
        if kept := self.by_seq.get(seq):
            kept[:] = [k for k in kept if k.pos <= pos]

    def lasting(self, seq: int) -> tuple[Kept, ...]:
        """Copies of the lasting ones (a saved cache's: the originals' buffers are
        reused as new copies replace them)."""
        return tuple(copied(k) for k in self.by_seq.get(seq, ()) if k.lasting)

    def put(self, seq: int, kept: tuple[Kept, ...]) -> None:
        """`kept` (a saved cache's lasting copies) as the sequence's, copied again."""
        self.by_seq[seq] = [copied(k) for k in kept]
