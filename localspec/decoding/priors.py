"""What `auto` believes of each free draft source before it has measured it, and which
acceptance (α per position) a match of a source is judged by: per source and match
length, as a 4-token n-gram match is a much safer bet than a 2-token one (adaptive.py
measures them; suffix.py has the suffix index's own)."""

from __future__ import annotations

from localspec.decoding.suffix import suffix_key

NGRAM_PRIOR = {2: 0.35, 3: 0.5, 4: 0.65}  # α before any measurement, by matched length n
# a prediction's α before any measurement, by aligned run length (at least this long);
# a long run is most of an edited file, followed token for token
PREDICTION_PRIOR = {2: 0.6, 8: 0.9}
# For a fill-in-the-middle (an unanchored prediction: the text after the cursor and the
# other files' chunks), fitted by scripts/fit_fim_priors.py on the default pair's greedy
# middles of 18 cuts of the standard library (seed 1; the bench measures seed 0's):
# its source at runs of 2-7 tokens 0.47, of 8 and more 1.00 (412/413); prompt lookup
# 0.48, 0.57 and 0.86 by n-gram length. Code repeats itself more than chat does.
FIM_PREDICTION_PRIOR = {2: 0.47, 8: 0.95}
FIM_NGRAM_PRIOR = {2: 0.48, 3: 0.57, 4: 0.85}
# A sampled answer's forced tokens (jump-forward): the text is certain, its split is not
# (the target may write `"evidence` as `"ev` `i` `de` `nce`), so each is accepted with the
# target's chance of that very token. Greedy answers keep their split (as_written).
SAMPLED_LEAD_PRIOR = 0.9
# A completion whose prompt shares less than this share with the last one is a fresh one (a
# new file or place, not the next keystroke): its suffix matches are other files' text,
# short runs of which are noise, while at a keystroke the same short runs re-join the last
# middle and are nearly always right. One α per run length served both: fresh requests
# drafted 3-4 deep on the keystrokes' α and lost (F16 target, 2 cores of an EPYC: 0 of
# 20, 15 and 40 drafted tokens in three first requests). So they keep α apart.
REVISIT = 0.5
FRESH = "fresh-"  # the prefix of a fresh completion's suffix keys


def ngram_key(n: int) -> str:
    """The acceptance key of an n-gram match of length n (lengths outside the priors'
    range share the nearest one's)."""
    return f"ngram{min(max(n, min(NGRAM_PRIOR)), max(NGRAM_PRIOR))}"


def prediction_key(n: int) -> str:
    """The acceptance key of a prediction alignment of run length n."""
    at_least = max((m for m in PREDICTION_PRIOR if m <= n), default=min(PREDICTION_PRIOR))
    return f"prediction{at_least}"


def free_key(source: str, n: int) -> str:
    """The acceptance key of a free match of length n by `source`."""
    keys = {"prediction": prediction_key, "suffix": suffix_key}
    return keys.get(source, ngram_key)(n)
