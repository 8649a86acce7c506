"""What `auto` prices a round by under serve's slots, whose rounds share each pass
(server/batching.py): how many slots decode now, the shared passes' times, and how many
slots a draft-model step is shared by (adaptive.py's module docstring: T_n(k))."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from localspec.decoding.estimates import VerifyCost


@dataclass
class Load:
    """Serve's slots: how many decode in the same passes now, and the target's pass
    times by tokens in the pass (every slot's round together), shared by all."""

    slots: Callable[[], int]
    passes: VerifyCost
    # slots whose drafts share a draft-model pass, on average: a draft step delays every
    # slot, and is shared by those that draft in it
    drafting: Callable[[], float] = lambda: 1.0
    slot: int = 0  # this slot's key in `willing`
    # per slot, shared by all: whether its last round would draft with the draft model
    # were its steps shared by every slot (AdaptiveDrafter.draft_sharers); one key per
    # slot from the start, so that no thread's sum sees the dict change size
    willing: dict[int, bool] = field(default_factory=dict)

    def sharers(self, willing: bool) -> float:
        """The slots a draft step is expected to be shared by: as many as measured, or as
        would draft together, this one included."""
        self.willing[self.slot] = willing
        return max(self.drafting(), float(sum(self.willing.values())))

    def leave(self) -> None:
        """This slot's request ended: it drafts no more."""
        self.willing[self.slot] = False
