"""What a session keeps of this machine's speed for the next one (in calibration.json,
localspec.models.calibration): its one-token passes against the planner's estimate, and
`auto`'s timings, which a new session's `auto` starts from."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from localspec.backends.base import Model
from localspec.backends.llama import LlamaModel, default_threads
from localspec.decoding.adaptive import AdaptiveDrafter
from localspec.decoding.drafters import DraftModel
from localspec.decoding.engine import Engine

log = logging.getLogger(__name__)


def record_cpu_speed(target: Model) -> None:
    """Keep how this session's one-token passes compared with the planner's estimate,
    where the target decoded on the CPU with its cores (localspec.models.calibration);
    never a reason for closing to fail."""
    from statistics import median

    from localspec.backends.gguf import gguf_info
    from localspec.models.calibration import MIN_PASSES, enabled, record_cpu_ratio
    from localspec.models.hardware import probe
    from localspec.models.memory import Weights
    from localspec.models.speed import step_seconds

    model = getattr(target, "shared", target)  # a slot's: its model's
    if not enabled() or not isinstance(model, LlamaModel) or not model.on_cpu:
        return
    if len(model.one_token_s) < MIN_PASSES:
        return
    try:
        hw = replace(probe(), cpu_scale=1.0)
        if model.options.n_threads not in (0, hw.cores):
            return
        estimate = step_seconds(Weights.from_gguf(gguf_info(model.path)), 0, hw)
        record_cpu_ratio(hw.cores, median(model.one_token_s) / estimate)
    except Exception as e:  # a file the planner cannot read, a home that cannot be written
        log.debug("no CPU calibration kept: %s", e)


def timings_key(target: Model) -> str | None:
    """Where `auto`'s timings of this target are kept (models/calibration.py): a load
    wholly on the CPU only (a GPU's passes warm up per size, which a fresh context has to
    see for itself)."""
    from localspec.models.calibration import passes_key

    model = getattr(target, "shared", target)  # a slot's: its model's
    if not isinstance(model, LlamaModel) or not model.on_cpu:
        return None
    threads = model.options.n_threads or default_threads()
    return passes_key(threads, model.path, "repacked" if model.options.repack else "as laid out")


def draft_id(model: Model) -> str:
    from localspec.models.calibration import file_id

    path = getattr(getattr(model, "shared", model), "path", None)
    return file_id(path) if isinstance(path, Path) else ""


def seeded(engine: Engine) -> Engine:
    """`engine`, whose `auto` starts from the timings an earlier session on this CPU kept
    for its models (none kept: as it was)."""
    from localspec.models.calibration import recorded_passes

    drafter = engine.drafter
    if not isinstance(drafter, AdaptiveDrafter):
        return engine
    try:
        key = timings_key(engine.target)
        kept = recorded_passes(key) if key else None
        if kept is None:
            return engine
        drafter.verify.seed(kept.verify)
        model = drafter.model
        if isinstance(model, DraftModel) and (steps := kept.drafts.get(draft_id(model.model))):
            model.step_s, model.catchup_s = steps
    except OSError as e:  # a model file gone from under it: start unseeded
        log.debug("no timings seeded: %s", e)
    return engine


def record_timings(*engines: Engine) -> None:
    """Keep what this session's `auto` timed (T(k), its draft model's step) for the next
    one on this CPU: of several engines (the session's and serve's slots', which time
    the passes they have alone), the one that timed the most sizes; never a reason for
    closing to fail."""
    from localspec.models.calibration import PassTimes, record_passes

    autos = [(e, e.drafter) for e in engines if isinstance(e.drafter, AdaptiveDrafter)]
    if not autos:
        return
    engine, drafter = max(autos, key=lambda pair: len(pair[1].verify.seconds))
    if len(drafter.verify.seconds) < 2:
        return
    try:
        if (key := timings_key(engine.target)) is None:
            return
        drafts = {}
        model = drafter.model
        if isinstance(model, DraftModel) and model.step_s > 0:
            drafts[draft_id(model.model)] = (model.step_s, model.catchup_s)
        record_passes(key, PassTimes(dict(drafter.verify.seconds), drafts))
    except Exception as e:  # a home that cannot be written
        log.debug("no timings kept: %s", e)
