"""The batcher's steps with a stand-in model whose passes take a while (fast): when a
slot that comes during a long prompt's reading gets its first pass. The real slots:
test_slots_real.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from localspec.backends.seq_layout import Part
from localspec.server.batching import Batcher


class SlowModel:
    """Passes of at most 8 tokens, 20 ms each; it records what each pass read."""

    name = "slow"
    size_bytes = 1
    n_batch = 8

    def __init__(self) -> None:
        self.passes: list[dict[int, int]] = []

    def decode_parts(self, parts: list[Part]) -> list[np.ndarray]:
        time.sleep(0.02)
        self.passes.append({p.seq: len(p.tokens) for p in parts})
        return [np.zeros((p.n_logits, 4), np.float32) for p in parts]


def test_a_slot_that_comes_during_a_long_prompt_joins_after_the_pass_in_flight():
    batcher, model = Batcher(), SlowModel()
    stand_in: Any = model

    def paste() -> None:  # 160 tokens to read: 20 passes of 8
        with batcher.active():
            batcher.call(stand_in, 0, list(range(160)), 0, 1)

    reading = threading.Thread(target=paste)
    reading.start()
    try:
        while not model.passes:
            time.sleep(0.001)
        with batcher.active():  # a completion, while the paste is read
            call = batcher.call(stand_in, 1, [1, 2], 0, 2, short=True)
        assert call.result is not None and call.result.shape == (2, 4)
        first = next(i for i, p in enumerate(model.passes) if 1 in p)
        # it joined the step after the pass in flight as it came, not after all 20
        assert first <= 2, model.passes
    finally:
        reading.join(timeout=10)
        batcher.stop()
    assert sum(p.get(0, 0) for p in model.passes) == 160  # the paste was read whole
