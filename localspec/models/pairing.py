"""The pair `run`, `chat` and `bench` load when no models are named: the plan for this
machine over what is installed, else the installed default pair."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.errors import LocalspecError
from localspec.models.catalog import NotInstalled, default_catalog
from localspec.models.hardware import Hardware, probe
from localspec.models.planner import NothingFits, Plan, Request, plan_installed

MODEL_FREE_DRAFTERS = ("ngram", "none")  # as in session.py, without importing llama.cpp
NOTHING_INSTALLED = "no model is installed: run `localspec pull default`"


@dataclass(frozen=True)
class Pair:
    """What to load: paths (or catalog ids), and the plan's offload and context."""

    target: str
    draft: str  # a path, a catalog id, "ngram" or "none"
    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    reasons: tuple[str, ...] = ()


def default_pair(draft: str | None = None, hw: Hardware | None = None) -> Pair:
    """The best installed pair for this machine. `draft` is the user's --draft, if any:
    it is kept, and the plan places the target around it."""
    from localspec.models import store

    catalog = default_catalog()
    installed = store.all_installed()
    if not any(e.role == "target" for e in installed):
        raise NotInstalled(NOTHING_INSTALLED)
    hw = hw or probe()
    wanted = draft if draft is None or draft in MODEL_FREE_DRAFTERS else _draft_id(draft)
    try:
        plan = plan_installed(catalog, hw, installed, Request(draft=wanted))
    except NothingFits as e:
        return _fallback(str(e), draft)
    return pair_from_plan(plan, draft)


def pair_from_plan(plan: Plan, draft: str | None = None) -> Pair:
    """The loadable pair of a plan; an explicit `draft` wins over the plan's."""
    target = plan.target.path or plan.target.id
    if draft is None:
        draft = (plan.draft.path or plan.draft.id) if plan.draft else plan.drafter
    return Pair(target, draft, plan.target.n_ctx, plan.target.n_gpu_layers, plan.reasons)


def _draft_id(draft: str) -> str:
    """A catalog id as the planner knows it ('id:Q4_K_M' -> 'id'); paths as given."""
    return draft if draft.endswith(".gguf") or "/" in draft else draft.partition(":")[0]


def _fallback(why: str, draft: str | None) -> Pair:
    """No plan fits: the default pair if installed (llama.cpp's own defaults and the
    session's memory back-off take it from there), else the smallest installed target."""
    from localspec.models import store

    catalog = default_catalog()
    pair = catalog.pair("default")
    targets = sorted((e for e in store.all_installed() if e.role == "target"), key=lambda e: e.size)
    target = store.find_installed(pair.target) if pair else None
    target = target or (targets[0] if targets else None)
    if target is None:
        raise LocalspecError(NOTHING_INSTALLED)
    if draft is None:
        found = store.find_installed(pair.draft) if pair else None
        draft = str(found.path) if found else "ngram"
    return Pair(
        str(target.path),
        draft,
        None,
        None,
        (f"No plan fits ({why}); trying {target.model} anyway.",),
    )
