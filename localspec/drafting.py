"""What the decoding engine, the planner and the session agree on about drafting.

It imports nothing, so that model management (which must not import the decoding
engine) and the session (which must not load llama.cpp to read a name) share one
definition instead of copies.
"""

from __future__ import annotations

GAMMA_MAX = 8  # the most tokens drafted in one round (adaptive γ and the planner's search)
# a recurrent state's lasting checkpoints kept a sequence, a copy of the state each in RAM
# (Model.evaluate): the earliest in its text (a system prompt's end, which a new
# conversation shares), and the latest (this turn's prompt's end and last message's start,
# the last turn's)
LASTING_CHECKPOINTS = 4
# drafters that need no draft model file ("mtp": the target's own MTP head)
MODEL_FREE_DRAFTERS = ("ngram", "mtp", "none")
