"""What `auto` prices a round by under serve's slots, whose rounds share each pass
(server/batching.py): how many slots decode now, the shared passes' times, how many
slots a draft-model step is shared by, and the depth the slots draft to together
(adaptive.py's module docstring: T_n(k), and `common_depth` below)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
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
    slot: int = 0  # this slot's key in `expects`
    # per slot, shared by all: E(k) - 1 for k = 1..γ of its draft model as its last round
    # measured them (None: it drafts with none now); one key per slot from the start, so
    # that no thread's reading sees the dict change size
    expects: dict[int, list[float] | None] = field(default_factory=dict)
    # the draft model's pass times by tokens in the pass (its steps, every drafting slot's
    # token in each); None: no draft model
    draft_passes: VerifyCost | None = None
    # a cache per slot: llama.cpp reads a pass whose slots bring unequal token counts in
    # several, the tokens beyond the others' in a pass of their own (LlamaModel)
    splits: bool = False
    # whether this slot's long request gives way to a short one (an editor's completion)
    # decoding beside it (server/scheduling.py, GIVE_WAY): it drafts nothing meanwhile
    yields: Callable[[], bool] = lambda: False

    def priced(self, top: int, prior: bool = False) -> list[float]:
        """T(1..top) as a slot's round pays it under the load of n slots: a pass of the
        others' n - 1 tokens and this round's k, each token beyond the first priced n
        times (T_n); with a cache per slot, the k - 1 beyond the others' in a pass of
        their own that all n wait for. `prior`: on the passes' prior line."""
        n = self.slots()
        t = self.passes.prior_table(n + top) if prior else self.passes.table(n + top)
        base = t[n - 1]  # T(n): every slot's token, this one's plain
        if self.splits:  # its k - 1 extra tokens in a pass of their own, all waiting
            return [base] + [base + n * t[k - 2] for k in range(2, top + 1)]
        return [base + n * (t[n + k - 2] - base) for k in range(1, top + 1)]

    def draft_step(self, fallback: float) -> float:
        """Seconds of one draft step of the slots drafting now (`fallback` until such
        a pass is timed)."""
        if self.draft_passes is None or not self.draft_passes.seconds:
            return fallback
        m = round(self.sharers())
        return self.draft_passes.table(m)[m - 1]

    def sharers(self) -> float:
        """Slots that share a draft-model step, on average: at least one, at most all."""
        return min(max(self.drafting(), 1.0), self.slots())

    def depth(self, expected: list[float], step_s: float, fixed: float = 0.0) -> tuple[int, float]:
        """The depth every slot drafts to this round, and its gain over plain decoding
        (`common_depth`), with this slot's `expected` E(k) - 1 among the others' and its
        `fixed` seconds a drafted round adds (its draft model's catch-up share)."""
        self.expects[self.slot] = expected
        drafting = [e for e in self.expects.values() if e]
        n = max(self.slots(), len(drafting))
        top = n * (1 + max(len(e) for e in drafting))
        return common_depth(drafting, n, step_s, self.passes.table(top), fixed)

    def leave(self) -> None:
        """This slot's request ended: it drafts no more."""
        self.expects[self.slot] = None


def common_depth(
    expects: Sequence[Sequence[float]],
    n: int,
    step_s: float,
    table: Sequence[float],
    fixed: float = 0.0,
) -> tuple[int, float]:
    """The draft depth D for every drafting slot, and the pass's tokens/s at D over plain
    decoding's (D = 0, gain 1: drafting does not pay).

    The slots' draft steps go through the draft model in one pass each, which every slot
    waits for (batching.py), and such a pass costs about as much for one slot's token as
    for four: slots that draft to different depths wait for the deepest one's steps, and
    the shallow ones gain nothing by it. So under load the slots draft alike, to the D
    with the best (n + Σ_i E_i(D)) / (f + D c + T(n + m D)): n slots in the passes, m of them
    drafting (`expects`: each one's E(k) - 1), c a draft step (`step_s`), T the shared
    passes' times (`table`, taken as never falling with more tokens), and `fixed` the
    seconds the deciding slot's drafted round adds besides (its draft model's catch-up on
    the prompt, a share of it a round: passes all the slots wait for, as the steps). Four
    slots of the F16 target on 2 cores drafting each to its own best depth ran level with
    plain decoding; to one depth, 1.07-1.21x (docs/design.md, "Slots")."""
    t = list(itertools.accumulate(table, max))
    plain = n / t[n - 1]
    best, gain = 0, 1.0
    for d in range(1, max((len(e) for e in expects), default=0) + 1):
        # a slot that may draft fewer (its answer's last tokens) drafts what it may
        depths = [min(d, len(e)) for e in expects]
        tokens = n + sum(e[k - 1] for e, k in zip(expects, depths, strict=True))
        rate = tokens / (fixed + d * step_s + t[n + sum(depths) - 1]) / plain
        if rate > gain:
            best, gain = d, rate
    return best, gain
