"""Adaptive speculation (`--gamma auto`): each round, draft what maximizes tokens/s.

Measured online, per conversation:
- α_i, the chance that draft position i is accepted given the ones before it were, per
  draft source (the draft model; n-gram lookup per matched length n, as a 4-token match
  is a much safer bet than a 2-token one; a draft cut short by p_min counts as a miss
  where it stopped), as moving averages so a change of topic shows within a few
  rounds; a deep position left untested relaxes toward the one before it, and an idle
  draft model's α back up toward its prior (on a GPU, where a change of pass size costs
  cold passes, probes do that), so a few early misses cannot keep drafts short, or the
  draft model off, for good (a retry that misses goes back to the α measured before the
  raise; an unrelated request starts it afresh: `Acceptance.restart`); a source not yet
  used is judged at its prior (the draft model also on T's prior line, its first try
  being dear, unless the costs say a good one pays: idle.py);
- c, the draft model's cost per token (prior: its weight bytes relative to those a token
  of the target reads, a MoE's active experts only);
- T(k), the target's time to verify a batch of k tokens, fitted as a line a + b(k-1)
  (on a GPU b ≈ 0; on a CPU anywhere from 0.1a to 0.7a).
(Both kept in localspec.decoding.estimates; this module decides with them.)

A round that drafts k tokens yields E(k) = 1 + Σ_{i≤k} Π_{j≤i} α_j tokens (Leviathan et
al.: (1 - α^(k+1)) / (1 - α) for a constant α) in k·c + T(k+1) seconds. Each round takes
the source and k with the best E/time, k = 0 (plain decoding) included, so speculation
that does not pay is switched off. A free source (n-grams, the suffix index, a
prediction) is measured even when it is not drafted: what it proposed is set against the
text the target goes on to write (a *shadow* draft: shadows.py), so its α stays current.
The draft model, whose guesses cost a pass, is probed (idle.py). Hybrid drafting: a free
match goes first; the draft model drafts when there is none, or extends one that ends
short when that pays (a suffix run whose continuation grows unsure, the end of a
prediction; an n-gram match is always γ long, as a copy of the text goes on).

Under a grammar, the forced tokens of jump-forward (engine.py) come first in the round's
pass, as good as certain: a draft after f of them is judged against that round's rate,
(f + 1 + E(k)) / T(f + k + 1) over (f + 1) / T(f + 1), and the pass's time teaches T of
its whole size. In a sampled answer the forced text is certain but its split is not (the
target samples one of the tokenizations the grammar allows), so there the forced tokens
are a source of their own, with α as such leads fared, drafted only as far as they pay.

A request may bring a prediction of its answer (Predicted Outputs, see prediction.py):
another free source, weighed like the n-grams with its own α (per alignment length,
measured afresh for each request) and drafted deeper (up to PREDICTION_GAMMA_MAX): where
the answer keeps to it, deep drafts pay; where it departs, the other sources take over
until it re-joins. The suffix index (suffix.py) is a third: the longest earlier run of the
context's tail, in this conversation or an earlier one, and what most often followed it,
with α per run length, drafted as deep along a long run.

Under load (serve's slots, whose rounds share each pass: batching.py), each token a
round adds delays the n slots beside it, so a free source's token is priced n times:
T_n(k) = T(n) + n (T(n + k − 1) − T(n)), T the shared passes' times. A miss costs many
times what a hit gains, so an n-gram or suffix draft (α learned on other texts) counts
on no position surer than the ~12 observations α stands for can vouch for
(SUREST in estimates.py; a prediction's α is this request's own). The draft model's steps
are one pass for every slot drafting, which all wait for: the slots draft to one depth,
the best for all (load.py, `common_depth`). γ falls as slots fill and comes back as they
empty; with one slot (n = 1) nothing changes.

The draft model stops early (p_min, per position) at a token too unsure to pay for what
drafting on from it costs: its verify slot and the steps after it, against the tokens it
may add at the rate the round aims at (`p_min`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.backends.base import Model, followed_by, shared_prefix
from localspec.decoding.choice import Choice, better
from localspec.decoding.drafters import (
    UNBOUNDED,
    Draft,
    DraftModel,
    MtpDrafter,
    NgramIndex,
    Outcome,
    stop_thresholds,
)
from localspec.decoding.engine import Engine
from localspec.decoding.estimates import (
    PREDICTION_GAMMA_MAX,
    SUREST,
    Acceptance,
    VerifyCost,
)
from localspec.decoding.grammar import GrammarState, allowed_prefix, last_state
from localspec.decoding.idle import (
    FIRST_TRIES,
    FIRST_TRY_AFTER,
    FIRST_TRY_ROUNDS,
    PROBE_SHARE,
    RECOVER,
    TIMING,
    TIMING_PASS,
    first_try_depth,
    free_guesses,
    good_draft_gains,
)
from localspec.decoding.load import Load
from localspec.decoding.prediction import Prediction
from localspec.decoding.priors import (
    FIM_NGRAM_PRIOR,
    FIM_PREDICTION_PRIOR,
    FRESH,
    NGRAM_PRIOR,
    PREDICTION_PRIOR,
    REVISIT,
    SAMPLED_LEAD_PRIOR,
    free_key,
    ngram_key,
    prediction_key,
)
from localspec.decoding.sampling import Probs, SamplingParams
from localspec.decoding.shadows import Shadow, Shadows
from localspec.decoding.suffix import DEEP_RUN, SUFFIX_PRIOR, SuffixIndex, suffix_key
from localspec.drafting import GAMMA_MAX

EXPLORE_SEEN = 8  # a free source is tried deeper than timed once it was judged this often
CATCHUP_ROUNDS = 32  # a draft model's catch-up after plain rounds, spread over this many
# ... and in a completion (a middle of ~20 tokens in rounds of ~3, the fim bench's median):
# a draft model that has not read a new prompt pays it within it, or reads ahead instead
FIM_CATCHUP_ROUNDS = 6


class AdaptiveDrafter:
    """Hybrid n-gram + draft-model drafting, γ chosen each round for speed."""

    name = "auto"

    def __init__(
        self,
        draft_model: Model | None = None,
        cost_ratio: float = 0.3,
        head: MtpDrafter | None = None,
        growth: Sequence[float] = (),
        reader: Model | None = None,
    ) -> None:
        """`cost_ratio`: prior for c / T(1) until the draft model has been timed. `head`:
        the target's MTP head, drafting in the draft model's place (and priced as one).
        `reader`: the target, whose reads of a prompt price the draft model's until timed."""
        self.reader = reader
        self.model: DraftModel | MtpDrafter | None = head
        if head is None and draft_model is not None:
            self.model = DraftModel(draft_model)
        self.cost_ratio = cost_ratio
        self.ngrams = NgramIndex(n_max=4, n_min=2)  # 1-token matches are mostly noise
        self.alpha = {"draft": Acceptance.prior(0.7)} | {
            ngram_key(n): Acceptance.prior(a) for n, a in NGRAM_PRIOR.items()
        }
        self.prediction: Prediction | None = None
        self._completing = False  # the prediction is a completion's (fill-in-the-middle)
        self.suffix: SuffixIndex | None = SuffixIndex()  # None: without it (to measure it)
        self.alpha |= {
            f"{fresh}{suffix_key(n)}": Acceptance.prior(a, PREDICTION_GAMMA_MAX)
            for n, a in SUFFIX_PRIOR.items()
            for fresh in ("", FRESH)
        }
        self._fresh = False  # this request is a fresh completion (REVISIT)
        self._chat_ngrams: dict[str, Acceptance] | None = None  # kept during completions
        self._match_n = 0  # the length of this round's free match
        self._free = "ngram"  # this round's free source: "ngram", "prediction" or "suffix"
        self.verify = VerifyCost(growth=tuple(growth))
        self.load: Load | None = None  # serve's slots, which share the target's passes
        self.draft_idle_s = 0.0  # decode time since the draft model was last used
        self.shadows = Shadows()
        self._text_len = 0  # the text's length after the last round
        self._last: Choice | None = None
        self._draft_s = 0.0
        self.alpha["lead"] = Acceptance.prior(SAMPLED_LEAD_PRIOR, PREDICTION_GAMMA_MAX)
        self._sampled = False  # this answer samples (its forced tokens are a bet)
        self._answer_from = 0  # where this request's answer begins in its text
        self.answered = 0  # tokens of this answer so far

    @property
    def busy_s(self) -> float:
        return self.model.busy_s if self.model else 0.0

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx if self.model else UNBOUNDED

    @property
    def draft_cost(self) -> float:
        """c: seconds per draft-model token; under load, as the slots pay it: every one
        waits for a draft step, which the slots drafting in it share."""
        if self.model is None:
            return 0.0
        if self.load is None or (n := self.slots()) == 1:
            return self.draft_step()
        return self.draft_step() * n / self.load.sharers()

    def draft_step(self) -> float:
        """Seconds of a draft step: as timed alone (else its prior), or a shared pass's."""
        assert self.model is not None
        c = self.model.step_s or self.cost_ratio * self.timings().a
        return c if self.load is None or self.slots() == 1 else self.load.draft_step(c)

    def predict(self, prediction: Prediction | None) -> None:
        """The next answers' prediction (None: none); its α is measured afresh. A
        fill-in-the-middle's (unanchored) starts from the priors fitted for completions,
        prompt lookup's too, until the next request that is not one."""
        self.prediction = prediction
        self._completing = prediction is not None and not prediction.anchored
        priors = FIM_PREDICTION_PRIOR if self._completing else PREDICTION_PRIOR
        for n, a in priors.items():
            self.alpha[prediction_key(n)] = Acceptance.prior(a, PREDICTION_GAMMA_MAX)
        if self._completing and self._chat_ngrams is None:
            self._chat_ngrams = {ngram_key(n): self.alpha[ngram_key(n)] for n in NGRAM_PRIOR}
            for n, a in FIM_NGRAM_PRIOR.items():
                self.alpha[ngram_key(n)] = Acceptance.prior(a)
        elif not self._completing and self._chat_ngrams is not None:
            self.alpha |= self._chat_ngrams  # what the conversations had taught it
            self._chat_ngrams = None

    # --- the round ------------------------------------------------------------------
    def draft(
        self,
        context: Sequence[int],
        gamma: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        forced: int = 0,
        grammar: GrammarState | None = None,
    ) -> Draft:
        deep, gamma = min(gamma, PREDICTION_GAMMA_MAX), min(gamma, GAMMA_MAX)
        if len(context) - forced != self._text_len:
            self.shadows.clear()  # another text (the next request): they would not apply
            if not (revisit := self.revisits(context)):
                self.alpha["draft"].restart()
            self._fresh = self._completing and not revisit
            self._answer_from = len(context) - forced - 1  # (the prefill gave its first)
        self.answered = len(context) - forced - self._answer_from
        self._sampled = not params.greedy
        if forced and self._sampled and (keep := self.lead_worth(forced)) < forced:
            self._last, self._draft_s = Choice("none", 0, 1.0), 0.0
            return Draft(by="none", lead=keep, why=f"{keep} of {forced} forced tokens pay")
        lag = self.model.unread(context) if self.model else 0
        # each free match priced as far as the grammar takes it (a keystroke's last
        # middle, where the character typed next is another, ends at the indentation)
        n, match = self.ngrams.match(context, gamma)
        match = allowed_prefix(grammar, match)
        free = [("ngram", n, match, self.choose(len(match), gamma, lag, n, forced=forced))]
        if self.prediction is not None:
            n, found = self.prediction.match(context, deep)
            depth = deep if n >= max(PREDICTION_PRIOR) else gamma  # deep along a long run
            found = allowed_prefix(grammar, found[:depth])
            if found:
                choice = self.choose(len(found), depth, lag, n, "prediction", forced)
                if found[:1] == match[:1]:
                    # the lookup proposes what the prediction does (an edited file is in
                    # the prompt too): the prediction drafts it, deeper, on this request's α
                    free.clear()
                free.append(("prediction", n, found, choice))
        if self.suffix is not None:
            run = self.suffix.match(context, deep)
            depth = deep if run.run >= DEEP_RUN else gamma  # deep along a long run
            if tokens := allowed_prefix(grammar, run.tokens[:depth]):
                if tokens[:1] == match[:1] and run.run > self.ngrams.n_max:
                    # the lookup's match is the end of this longer run: the suffix drafts
                    # it, on its own α (else the one measured first would keep it)
                    free = [f for f in free if f[0] != "ngram"]
                choice = self.choose(len(tokens), depth, lag, run.run, "suffix", forced)
                free.append(("suffix", run.run, tokens, choice))
        # the free source whose round pays best (a probe counts as plain decoding)
        self._free, self._match_n, match, choice = max(free, key=lambda f: f[3].gain or 1.0)
        if choice.source == TIMING:  # free guesses, to time a pass of their size
            self._free, match = TIMING, free_guesses(context, choice.ngram)
        self._last = choice
        drafted = self._free if choice.ngram else None
        self.shadow(len(context), [(f[0], f[1], f[2]) for f in free if f[0] != drafted])
        tokens = match[: choice.ngram]
        q: list[Probs | None] = [None] * choice.ngram
        busy = self.busy_s
        # under a grammar the draft model goes on within it, from its state after the
        # free tokens (none where the grammar refuses one of them: the rest would be lost)
        after = grammar if grammar is None else last_state(grammar, tokens)
        if (
            self.model is not None
            and choice.k > choice.ngram
            and (grammar is None or after is not None)
        ):
            with followed_by(context, tokens) as seq:
                more = self.model.draft(
                    seq, choice.k - choice.ngram, params, rng, self.p_min(choice), grammar=after
                )
            tokens, q = tokens + more.tokens, q + more.q
        self._draft_s = self.busy_s - busy
        return Draft(tokens, q, by=choice.source, planned=choice.k, why=self.explain(choice))

    def read_ahead(self, context: Sequence[int], n: int) -> int:
        """Between requests: the draft model reads up to `n` more tokens of `context`
        (the slot's text; an editor's next completion shares most of it), where it could
        pay at all. Returns how many are left to read."""
        model = self.model
        if not isinstance(model, DraftModel) or not self.timings().seconds:
            return 0
        return model.read_ahead(context, n) if self.draft_could_pay() else 0

    def shadow(self, at: int, proposals: Sequence[tuple[str, int, Sequence[int]]]) -> None:
        """Keep the free proposals (source, match length, tokens) a round does not draft,
        to measure them on the text that follows (see Shadow)."""
        for source, n, tokens in proposals:
            key = self.key(source, n)
            if tokens:
                self.shadows.keep(Shadow(key, at, list(tokens[: len(self.alpha[key].alpha)])))

    def accept(self, tokens: Sequence[int], outcome: Outcome) -> None:
        if self.model is not None:
            self.model.accept(tokens, outcome)
        self._text_len = len(tokens)
        self.shadows.settle(tokens, self.alpha)
        choice = self._last
        if choice is None:
            return
        if self.slots() == 1:  # a pass shared with other slots' tokens times them too
            self.verify.time_pass(outcome.forced + outcome.drafted + 1, outcome.verify_s)
        if outcome.forced and self._sampled:
            self.alpha["lead"].observe(outcome.forced, outcome.forced_accepted)
        n_ng = min(choice.ngram, outcome.drafted)
        if n_ng and choice.source != TIMING:
            self.alpha[self.free_key()].observe(n_ng, min(outcome.accepted, n_ng))
            if self._free == "prediction" and self.prediction is not None:
                self.prediction.observe(n_ng, min(outcome.accepted, n_ng))
        # a draft model that stopped short (p_min) yielded nothing where it stopped: a miss
        stopped = choice.k > max(outcome.drafted, choice.ngram)
        if outcome.accepted >= n_ng and (outcome.drafted > n_ng or stopped):
            self.alpha["draft"].observe(outcome.drafted - n_ng + stopped, outcome.accepted - n_ng)
        if "draft" in choice.source:
            self.draft_idle_s = 0.0
        else:
            # not on a GPU: a retry at a raised α went off every few dozen tokens, each
            # two changes of size dearer than the draft (the priced probe comes back)
            if not self.verify.switch_cost(1):
                self.alpha["draft"].recover(1 - (1 - RECOVER) ** (outcome.accepted + 1))
            self.draft_idle_s += self._draft_s + outcome.verify_s

    # --- the decision ---------------------------------------------------------------
    def lead_worth(self, n: int) -> int:
        """How many of a sampled round's `n` forced tokens pay for their place in the
        pass: the k with the best (1 + E(k)) / T(k + 1), α as such leads fared."""
        if not self.timings().seconds:
            return n  # T(1) not timed yet
        lead = self.alpha["lead"]
        t = self.priced(min(n, len(lead.alpha)) + 1)  # t[k] = T(k + 1)
        rates = [1 / t[0]] + [(1 + e) / t[k] for k, e in enumerate(lead.expected(n), 1)]
        return max(range(len(rates)), key=rates.__getitem__)

    def catchup_cost(self, lag: int) -> float:
        """Seconds for the draft model to read the `lag` tokens it has not seen."""
        if self.model is None or lag <= 1:
            return 0.0
        return (lag - 1) * (self.model.catchup_s or self.draft_cost / 2)

    def choose(
        self,
        matched: int,
        gamma: int,
        lag: int = 0,
        n: int = 4,
        free: str = "ngram",
        forced: int = 0,
    ) -> Choice:
        """The source and k with the best expected tokens/s (see the module docstring);
        `matched` tokens from a match of length `n` by the free source `free` ("ngram",
        "prediction" or "suffix"). The draft model drafts at most GAMMA_MAX tokens in a
        round. After `forced` tokens of the grammar's (jump-forward, as good as certain)
        the pass already holds forced + 1 tokens: a draft is priced from there, its
        expected tokens added to those forced + 1 (gains are over that round's rate)."""
        if gamma == 0 or not self.timings().seconds:
            return Choice("none", 0, 1.0)  # time one plain round first: T(1)
        # on a GPU, until T(1) is timed warm; beside a short request, on dear passes
        if (self.slots() == 1 and not self.verify.warm) or (self.load and self.load.yields()):
            return Choice("none", 0, 1.0)
        c = self.draft_cost
        m, depth = min(matched, gamma), min(gamma, GAMMA_MAX)
        t = self.priced(max(m, depth) + 1 + forced)[forced:]  # t[k - 1] = T(forced + k)
        # a plain round's time: T(1) as timed, not the line's a (one far batch size, as a
        # deep prediction draft times, can tilt the line and make every draft look dear)
        a = t[0]
        per = 1 / (forced + 1)  # a drafted token's share of the round's tokens, as a rate
        ng = self.alpha[self.key(free, n)] if matched else None
        catchup_rounds = FIM_CATCHUP_ROUNDS if self._completing else CATCHUP_ROUNDS
        catchup = self.catchup_cost(lag) / catchup_rounds
        fixed = catchup + (self.model.round_s if self.model is not None else 0.0)
        best = Choice("none", 0, 1.0)
        # Plain Python over ≤16 depths: numpy's per-call cost is most of a GPU round's Python.
        # A source not yet seen is judged at its prior, at every depth: on a CPU a 2-token
        # pass can cost most of a 6-token one, so a 1-token try is the dearest way to learn.
        if ng and m:
            surest = SUREST if self.slots() > 1 and free != "prediction" else 1.0  # (docstring)
            expected = ng.expected(m, surest)
            gains = [(1 + per * e) * a / t[k] for k, e in enumerate(expected, 1)]
            best = better(best, free, gains, 1, free_tokens=None)
            best = self.explore(best, free, ng, expected, gains, forced, a)
        load = self.load
        if self.model is not None and load and self.slots() > 1 and not (forced or load.splits):
            # under load every drafting slot drafts to one depth (its steps are shared)
            dm = self.alpha["draft"]
            d, gain = load.depth(dm.expected(depth), self.draft_step(), fixed)
            if d:
                best = better(best, "draft", [gain], d, free_tokens=0)
        elif self.model is not None:
            dm = self.alpha["draft"]
            # Its first try pays the catch-up of the whole prompt, so it has to pay by the
            # priors, not just time a batch size (on a CPU the dearest one, T(2)).
            batch = t if dm.seen[0] else self.priced(depth + 1 + forced, prior=True)[forced:]
            gains = [
                (1 + per * e) * a / (fixed + k * c + batch[k])
                for k, e in enumerate(dm.expected(depth), 1)
            ]
            best = better(best, "draft", gains, 1, free_tokens=0)
            if ng and m < depth:
                # the whole n-gram match, then the draft model goes on after it
                held, reach = expected[-1], ng.all_accepted(m, surest)
                gains = [
                    (1 + per * (held + reach * e)) * a / (fixed + (r + 1) * c + batch[m + r])
                    for r, e in enumerate(dm.expected(depth - m), 1)
                ]
                best = better(best, f"{free}+draft", gains, m + 1, free_tokens=m)
        if best.k:
            return best
        return (None if forced else self.first_try(lag, depth)) or self._probe(lag)

    def first_try(self, lag: int, depth: int) -> Choice | None:
        """The unseen draft model's first try (idle.py), or a round that times a pass of
        TIMING_PASS tokens before it, or None: alone (not under load), not in a completion
        (whose middle is short, and read ahead for), judged on the timed sizes with no
        optimism (`VerifyCost.line_table`; on a GPU with the cold passes a change costs)."""
        timed = self.verify.seconds
        if (
            self.model is None
            or self.alpha["draft"].seen[0] >= FIRST_TRIES
            or self.slots() > 1
            or self._completing
            or self.answered < FIRST_TRY_AFTER
            or 1 not in timed
        ):
            return None
        tried = first_try_depth(self.verify.line_table(depth + 1), self.draft_cost, depth)
        if tried is None:
            return None
        if len(timed) < 2:
            guesses = min(TIMING_PASS - 1, depth)
            return Choice(TIMING, guesses, 0.0, ngram=guesses)
        price = self.read_estimate(lag) + self.verify.switch_cost(1 + self.verify.cold_passes)
        return Choice("draft", *tried) if price <= FIRST_TRY_ROUNDS * self.verify.one else None

    def read_estimate(self, lag: int) -> float:
        """Seconds for the draft model to read the `lag` tokens it has not seen: as timed,
        else at its size's share (`cost_ratio`) of the target's time to read a token of a
        prompt (on 2 cores of a Xeon 4.6 ms a token, where it took 4.8; the half step a
        token that `catchup_cost` guesses is 2.6 times that)."""
        if self.model is None or self.model.catchup_s or not (self.reader and self.reader.read_s):
            return self.catchup_cost(lag)
        return max(lag - 1, 0) * self.cost_ratio * self.reader.read_s

    def explore(
        self,
        best: Choice,
        free: str,
        ng: Acceptance,
        expected: list[float],
        gains: list[float],
        forced: int,
        a: float,
    ) -> Choice:
        """`best`, or a deeper draft of the free source, to an untimed batch size: judged
        at the best that size can cost (`VerifyCost.hopeful`), and only where even at
        the table's own price (`gains`) it would not lose to plain decoding. On a CPU T(k)
        can flatten past the sizes timed so far (the Q4_K_M target on 2 cores of an EPYC:
        T(16) ≈ 7 T(1), where the line through T(1..6) says 13), and only a try times it;
        a sure match (a keystroke's last middle, a followed prediction) pays for the try.
        Only on a measured α (EXPLORE_SEEN): a prior is a guess, and a deep try on a wrong
        one costs a deep pass."""
        if self.slots() > 1 or ng.seen[0] < EXPLORE_SEEN:
            return best  # passes shared with other slots, or a guessed α
        top = max(self.verify.seconds)
        if forced + len(expected) + 1 <= top:
            return best  # every size within reach is timed
        per, hope = 1 / (forced + 1), self.verify.hopeful
        tries = [
            (1 + per * e) * a / hope(forced + k + 1)
            if forced + k + 1 > top and gains[k - 1] >= 1
            else 0.0
            for k, e in enumerate(expected, 1)
        ]
        return better(best, free, tries, 1, free_tokens=None)

    def slots(self) -> int:
        """The slots decoding in the passes this one's rounds go into (1: alone)."""
        return 1 if self.load is None else self.load.slots()

    def timings(self) -> VerifyCost:
        """The target's pass times a round is judged on: its own alone, else the shared's."""
        n = self.slots()
        return self.verify if n == 1 or self.load is None else self.load.passes

    def priced(self, top: int, prior: bool = False) -> list[float]:
        """T(1..top) as a round pays it: alone, the target's times; under load, as the
        slots share each pass (`Load.priced`)."""
        if self.slots() == 1 or self.load is None:
            return self.verify.prior_table(top) if prior else self.verify.table(top)
        return self.load.priced(top, prior)

    def _probe(self, lag: int) -> Choice:
        """Speculation does not pay by the estimates; try the idle draft model once its
        idle time has paid for the probe, to notice when it pays again (a change of
        topic). Free sources need no probe: their shadows measure them. On a GPU its
        price holds the cold passes after its two changes of pass size (docs/gpu.md, 6)."""
        k = 1  # one token: the cheapest sign that it pays again
        timings = self.timings()
        switches = timings.switch_cost(1 + timings.cold_passes)
        probe = self.catchup_cost(lag) + k * (self.draft_cost + timings.b * self.slots())
        due = self.model is not None and self.draft_idle_s * PROBE_SHARE >= probe + switches
        if due and self.draft_could_pay():
            return Choice("draft", k, 0.0)
        return Choice("none", 0, 1.0)

    def draft_could_pay(self) -> bool:
        """Whether the draft model would beat plain decoding at the measured costs, at
        some γ, on text it drafts well (α = GOOD_ALPHA, as on code). Where it would not
        (a small target on a few CPU cores: T(2) about 2 T(1)), a probe can only lose:
        each one reads up to a window of missed text, at up to PROBE_SHARE of the time."""
        t = self.priced(GAMMA_MAX + 1)
        return max(good_draft_gains(t, self.draft_cost, GAMMA_MAX)) > 1.0

    def p_min(self, choice: Choice) -> list[float]:
        """Draft-model early stop, per token the draft model drafts this round: the
        confidence it needs for drafting on from it to pay (`stop_thresholds`), at the
        rate the round aims at (its expected gain, in tokens/s)."""
        n_model = choice.k - choice.ngram
        a = self.priced(1)[0] if self.timings().seconds else 0.0
        if a <= 0:
            return [0.5] * n_model
        reach = 1.0  # the chance that every token before the draft model's is accepted
        if choice.ngram:
            reach = self.alpha[self.free_key()].all_accepted(choice.ngram)
        t = np.array(self.priced(choice.k + 1)[: choice.k + 1])  # t[i] = T(i + 1)
        alpha = self.alpha["draft"].alpha[:n_model]
        rate = max(choice.gain, 1.0) / a
        return stop_thresholds(t, alpha, self.draft_cost, rate, choice.ngram, reach)

    def explain(self, choice: Choice) -> str:
        """One line on why this round drafts what it drafts."""
        a, b = self.verify.a, self.verify.b
        if a == 0:
            return "plain decoding: timing the target first"
        if choice.source == TIMING:
            return f"free guesses, to time a {choice.k + 1}-token pass before a first try"
        head = f"{choice.source} γ={choice.k}" if choice.k else "plain decoding"
        gain = f" ≈ {choice.gain:.2f}× plain" if choice.gain else " (probe)"
        return (
            f"{head}{gain}: α {self._free_alpha()}, "
            f"draft {self.alpha['draft'].alpha[0]:.2f}; draft {self.draft_cost * 1e3:.3g} "
            f"ms/token; verify {a * 1e3:.3g} ms + {b * 1e3:.3g} ms per extra token"
        )

    def free_key(self) -> str:
        """The acceptance key of this round's free match."""
        return self.key(self._free, self._match_n)

    def key(self, source: str, n: int) -> str:
        """The acceptance key of a match of length n by the free `source`; a fresh
        completion's suffix matches have their own (REVISIT)."""
        key = free_key(source, n)
        return FRESH + key if self._fresh and source == "suffix" else key

    def revisits(self, context: Sequence[int]) -> bool:
        """Whether a new request's `context` is mostly the last one's (REVISIT)."""
        kept = shared_prefix(self.suffix.context.tokens, context) if self.suffix else len(context)
        return kept >= REVISIT * len(context)

    def _free_alpha(self) -> str:
        """α of this round's free match, or of every n-gram length without a match."""
        if self._free != "ngram":
            return f"{self._free} {self.alpha[self.free_key()].alpha[0]:.2f}"
        ns = [self._match_n] if self._match_n else sorted(NGRAM_PRIOR)
        return " ".join(f"{n}-gram {self.alpha[ngram_key(n)].alpha[0]:.2f}" for n in ns)


def auto_engine(
    target: Model,
    draft: Model | None,
    head: MtpDrafter | None = None,
    growth: Sequence[float] = (),
) -> Engine:
    """The engine `--gamma auto` runs: hybrid drafting with an adaptive γ (up to
    GAMMA_MAX, deeper for a prediction that keeps matching). `growth`: T(k)/T(1) at least
    (a MoE target's, from the experts a pass reads), until T(k) is timed."""
    # c / T(1) before c is timed: the bytes a token reads (a MoE target's active experts
    # only: by file sizes a 0.5B draft looked free beside a 30B-A3B)
    ratio = draft.read_bytes / target.read_bytes if draft and target.read_bytes else 0.3
    if head is not None:
        ratio = head.head.cost_ratio
    drafter = AdaptiveDrafter(draft, cost_ratio=ratio, head=head, growth=growth, reader=target)
    model = getattr(target, "shared", target)  # a slot's: its model's
    drafter.verify.cold_passes = getattr(model, "cold_passes", 0)
    drafter.verify.after_each_change = True
    return Engine(target, drafter, PREDICTION_GAMMA_MAX)
