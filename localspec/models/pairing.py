"""The pair `run`, `chat` and `bench` load when no models are named: the plan for this
machine over what is installed, else the installed default pair."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from localspec.drafting import MODEL_FREE_DRAFTERS
from localspec.errors import LocalspecError
from localspec.models import store
from localspec.models.catalog import Catalog
from localspec.models.catalog_file import default_catalog
from localspec.models.explain import reasons
from localspec.models.hardware import Hardware, probe
from localspec.models.planner import NothingFits, Plan, Request, plan_installed
from localspec.models.resolve import NotInstalled, find_installed

NOTHING_INSTALLED = "no model is installed: run `localspec pull default`"


@dataclass(frozen=True)
class PairSpec:
    """Which models to load: paths or catalog ids (the draft may be 'ngram' or 'none'),
    and, when the planner chose them, its offload, context and reasons."""

    target: str
    draft: str
    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    # why the planner chose it: said, not part of which pair it is (equality ignores it)
    reasons: tuple[str, ...] = field(default=(), compare=False)
    cpu_moe: int = 0  # a MoE target's routed experts of its first this many layers in RAM

    @property
    def label(self) -> str:
        """'target + draft', by name."""
        return f"{short_name(self.target)} + {short_name(self.draft)}"

    @property
    def lines(self) -> str:
        """Target and draft on a line each, for narrow places."""
        return f"target {short_name(self.target)}\ndraft  {short_name(self.draft)}"


def short_name(spec: str) -> str:
    """A model's name to show: the file stem of a path, else the id."""
    return Path(spec).stem if spec.endswith(".gguf") else spec


def default_pair(
    draft: str | None = None,
    hw: Hardware | None = None,
    catalog: Catalog | None = None,
    n_ctx: int | None = None,
) -> PairSpec:
    """The best installed pair for this machine. `draft` is the user's --draft, if any:
    it is kept, and the plan places the target around it; `n_ctx`, the user's --ctx, is
    the context the plan places the models for."""
    catalog = catalog or default_catalog()
    installed = store.all_installed()
    if not any(e.role == "target" for e in installed):
        raise NotInstalled(NOTHING_INSTALLED)
    hw = hw or probe()
    try:
        plan = plan_installed(catalog, hw, installed, Request(draft=_draft_id(draft), n_ctx=n_ctx))
    except NothingFits as e:
        return _fallback(str(e), draft, catalog)
    return pair_from_plan(plan, draft)


def pair_for_target(
    target: Path, draft: str | None = None, hw: Hardware | None = None, n_ctx: int | None = None
) -> PairSpec | None:
    """The plan around a target the user named (`--target` alone, or with `--draft`):
    its draft, offload and context as the planner places them, where the target is an
    installed model (pulled, or registered with `add`) that fits; else None."""
    catalog = default_catalog()
    installed = store.all_installed()
    request = Request(draft=_draft_id(draft), target=str(target), n_ctx=n_ctx)
    try:
        plan = plan_installed(catalog, hw or probe(), installed, request)
    except NothingFits:
        return None
    return pair_from_plan(plan, draft)


def pair_from_plan(plan: Plan, draft: str | None = None) -> PairSpec:
    """The loadable pair of a plan; an explicit `draft` wins over the plan's."""
    target = plan.target.path or plan.target.id
    if draft is None:
        draft = (plan.draft.path or plan.draft.id) if plan.draft else plan.drafter
        if draft == "ngram" and plan.target.path and has_mtp_head(Path(plan.target.path)):
            draft = "mtp"  # the target drafts for itself
    return PairSpec(
        target,
        draft,
        plan.target.n_ctx,
        plan.target.n_gpu_layers,
        reasons(plan),
        cpu_moe=plan.target.cpu_moe,
    )


def _draft_id(draft: str | None) -> str | None:
    """The --draft the planner is asked for: a catalog id as it knows it ('id:Q4_K_M' ->
    'id'); paths, the model-free drafters and None (choose) as given."""
    if draft is None or draft in MODEL_FREE_DRAFTERS or draft.endswith(".gguf") or "/" in draft:
        return draft
    return draft.partition(":")[0]


def _fallback(why: str, draft: str | None, catalog: Catalog) -> PairSpec:
    """No plan fits: the default pair if installed (llama.cpp's own defaults and the
    session's memory back-off take it from there), else the smallest installed target."""
    pair = catalog.pair("default")
    targets = sorted((e for e in store.all_installed() if e.role == "target"), key=lambda e: e.size)
    target = find_installed(pair.target) if pair else None
    target = target or (targets[0] if targets else None)
    if target is None:
        raise LocalspecError(NOTHING_INSTALLED)
    if draft is None:
        found = find_installed(pair.draft) if pair else None
        draft = str(found.path) if found else "ngram"
    return PairSpec(
        str(target.path),
        draft,
        None,
        None,
        (f"No plan fits ({why}); trying {target.model} anyway.",),
    )


def has_mtp_head(path: Path) -> bool:
    """Whether the GGUF at `path` carries MTP blocks (False where it cannot be read)."""
    from localspec.backends.gguf import gguf_info_or_none

    info = gguf_info_or_none([path]) if path.is_file() else None
    return info is not None and info.mtp_layers > 0
