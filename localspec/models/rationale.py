"""The planner's decisions as data: for each choice a plan makes (the target and where it
goes, the drafter, the context, the next size up), the numbers that explain it.
`explain` turns them into sentences; nothing here decides or words anything."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from localspec.models.memory import Budget, Placement, Requirement

# Where the target went, best first: with its draft wholly on the GPU, alone wholly on
# it, partly on it (the most layers), or on a machine without a usable GPU.
Stage = Literal["pair-on-gpu", "target-on-gpu", "partial", "cpu"]
# Why the drafter is what it is.
DrafterReason = Literal[
    "draft", "asked-none", "asked-ngram", "no-draft-model", "none-fits", "does-not-pay"
]


@dataclass(frozen=True)
class TargetChoice:
    """The target file, where it went, and whether a quantization was chosen among several."""

    name: str
    quant: str
    layers: int  # its repeating layers
    gpu_layers: int  # as placed (llama.cpp's n_gpu_layers)
    stage: Stage
    had_choice: bool  # more than one quantization was in the running


@dataclass(frozen=True)
class DraftEstimate:
    """A draft model next to the target: where it sits and what it is estimated to buy."""

    name: str
    quant: str
    on_gpu: bool
    gamma: int
    speedup: float


@dataclass(frozen=True)
class DrafterChoice:
    """What drafts, and why."""

    reason: DrafterReason
    draft: DraftEstimate | None = None  # the chosen one, or the best that does not pay


@dataclass(frozen=True)
class NextSizeUp:
    """The next larger target, and why it was passed over."""

    name: str
    quant: str
    tokens_per_s: float  # at the smallest context; 0 when it does not fit
    min_speed: float
    needs: Requirement  # what it needs, for when it does not fit


@dataclass(frozen=True)
class Slow:
    """Nothing reaches the asked speed: the plan is the smallest target that fits."""

    min_speed: float
    tokens_per_s: float  # the best this target manages


@dataclass(frozen=True)
class Rationale:
    """Every decision of one plan, with the machine and the memory it was made for."""

    machine: str  # the machine in words
    notes: tuple[str, ...]  # what the hardware probe noticed
    gpu_usable: bool
    target: TargetChoice
    drafter: DrafterChoice
    n_ctx: int
    asked_ctx: int
    placement: Placement
    budget: Budget
    next_size_up: NextSizeUp | None = None
    slow: Slow | None = None
    # a hybrid target's recurrent state a sequence: with its snapshots on the device,
    # and its lasting copies in RAM (bytes; 0 for a model that has none)
    state: int = 0
    kept: int = 0
    # a CPU target's prompt reader (backends/reader.py): the RAM it takes (0: none, as on
    # a GPU or where nothing is repacked), and beside how many of serve's slots the budget
    # holds it (0: not even beside one sequence, as `run` and `chat` have)
    reader: int = 0
    reader_slots: int = 0

    @property
    def reader_fits(self) -> bool:
        return self.reader_slots > 0
