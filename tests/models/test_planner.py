"""The planner, on a small fixture catalog and a table of machines (no GPU, 4 to 80 GiB
GPUs, Apple 16 and 64 GiB, tight RAM): every plan fits its budget, more memory never
gives a smaller target, the draft sits wholly on the GPU; each drafter decision and its
sentence; the memory arithmetic; installed-only planning and the default pair that `run`
and the chat load. One test checks the shipped catalog plans for every family."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hub_server import make_gguf

from localspec.backends.gguf import GgufInfo, gguf_info, tensor_shapes
from localspec.models import planner, store
from localspec.models.catalog_file import default_catalog, parse_catalog
from localspec.models.explain import plan_json, reasons
from localspec.models.hardware import GiB, Gpu, Hardware, Overrides, Remote, apply, fmt_size
from localspec.models.memory import (
    Budget,
    Placement,
    Requirement,
    Weights,
    compute_bytes,
    footprint,
    memory_budget,
    place,
    reader_bytes,
)
from localspec.models.pairing import PairSpec, default_pair, pair_for_target
from localspec.models.planner import (
    MIN_CTX,
    DrafterChoice,
    DraftEstimate,
    NextSizeUp,
    NothingFits,
    Plan,
    Rationale,
    Request,
    Side,
    TargetChoice,
    plan_catalog,
    plan_installed,
)
from localspec.models.resolve import NotInstalled
from localspec.models.speed import step_seconds
from localspec.models.store import FileRecord, Installed

# Three families: one with a draft and targets from 1.5B to 32B (real Qwen2.5-Coder
# shapes and file sizes, so the placements are the ones users see), one without a draft,
# and one whose draft has another tokenizer.
FIXTURE = """\
default_family = "coder"

[families.coder]
name = "Coder"
architecture = "qwen2"
tokenizer = "coder"

[families.solo]
name = "Solo"
architecture = "llama"
tokenizer = "solo"

[families.other]
name = "Other"
architecture = "gemma3"
tokenizer = "other"

[pairs.default]
target = "coder-1.5b"
draft = "coder-0.5b"

[models."coder-0.5b"]
name = "Coder 0.5B"
family = "coder"
role = "draft"
params = 0.49
shape = { layers = 24, kv_heads = 2, head_dim = 64, embedding = 896, vocab = 151936, \
context = 32768, tied_embeddings = true }
hub = "test/coder-0.5b"
quants.Q4_K_M = { file = "coder-0.5b-q4_k_m.gguf", size = 491_400_064 }
quants.Q8_0 = { file = "coder-0.5b-q8_0.gguf", size = 675_710_816 }

[models."coder-1.5b"]
name = "Coder 1.5B"
family = "coder"
role = "target"
params = 1.54
shape = { layers = 28, kv_heads = 2, head_dim = 128, embedding = 1536, vocab = 151936, \
context = 32768, tied_embeddings = true }
hub = "test/coder-1.5b"
quants.Q4_K_M = { file = "coder-1.5b-q4_k_m.gguf", size = 1_117_320_768 }
quants.Q5_K_M = { file = "coder-1.5b-q5_k_m.gguf", size = 1_285_494_336 }
quants.Q8_0 = { file = "coder-1.5b-q8_0.gguf", size = 1_894_532_160 }

[models.coder-7b]
name = "Coder 7B"
family = "coder"
role = "target"
params = 7.62
shape = { layers = 28, kv_heads = 4, head_dim = 128, embedding = 3584, vocab = 152064, \
context = 32768 }
hub = "test/coder-7b"
quants.Q4_K_M = { file = "coder-7b-q4_k_m.gguf", size = 4_683_074_240 }
quants.Q5_K_M = { file = "coder-7b-q5_k_m.gguf", size = 5_444_831_424 }
quants.Q8_0 = { file = "coder-7b-q8_0.gguf", size = 8_098_525_376 }

[models.coder-32b]
name = "Coder 32B"
family = "coder"
role = "target"
params = 32.8
shape = { layers = 64, kv_heads = 8, head_dim = 128, embedding = 5120, vocab = 152064, \
context = 32768 }
hub = "test/coder-32b"
quants.Q4_K_M = { file = "coder-32b-q4_k_m.gguf", size = 19_851_336_256 }
quants.Q5_K_M = { file = "coder-32b-q5_k_m.gguf", size = 23_262_157_056 }
quants.Q8_0 = { file = "coder-32b-q8_0.gguf", size = 34_820_885_056 }

[models.solo-8b]
name = "Solo 8B"
family = "solo"
role = "target"
params = 8.03
shape = { layers = 32, kv_heads = 8, head_dim = 128, embedding = 4096, vocab = 128256, \
context = 131072 }
hub = "test/solo-8b"
quants.Q4_K_M = { file = "solo-8b-q4_k_m.gguf", size = 4_920_734_016 }
quants.Q8_0 = { file = "solo-8b-q8_0.gguf", size = 8_540_770_560 }

[models.other-4b]
name = "Other 4B"
family = "other"
role = "target"
params = 3.88
shape = { layers = 34, kv_heads = 4, head_dim = 256, embedding = 2560, vocab = 262208, \
context = 131072, tied_embeddings = true }
hub = "test/other-4b"
quants.Q4_K_M = { file = "other-4b-q4_k_m.gguf", size = 2_489_757_856 }
quants.Q8_0 = { file = "other-4b-q8_0.gguf", size = 4_130_401_568 }

[models.other-270m]
name = "Other 270M"
family = "other"
role = "draft"
params = 0.27
shape = { layers = 18, kv_heads = 1, head_dim = 256, embedding = 640, vocab = 262144, \
context = 32768, tied_embeddings = true }
hub = "test/other-270m"
quants.Q4_K_M = { file = "other-270m-q4_k_m.gguf", size = 253_113_024 }
quants.Q8_0 = { file = "other-270m-q8_0.gguf", size = 291_545_536 }
"""

CATALOG = parse_catalog(FIXTURE, Path("planner-fixture.toml"))
FAMILIES = [f.id for f in CATALOG.families]
DESKTOP = Hardware((), 32 * GiB, 30 * GiB, 8, offload=False)
WORKSTATION = Hardware((), 128 * GiB, 120 * GiB, 16, offload=False)


def nvidia(vram: int, base: Hardware = DESKTOP) -> Hardware:
    return apply(base, Overrides(vram=vram * GiB))


MACHINES = {
    "no GPU": apply(DESKTOP, Overrides(gpu="none")),
    "4 GiB GPU": nvidia(4),
    "8 GiB GPU": nvidia(8),
    "12 GiB GPU": nvidia(12),
    "24 GiB GPU": nvidia(24),
    "80 GiB GPU": nvidia(80, WORKSTATION),
    "Apple 16 GiB": apply(DESKTOP, Overrides(gpu="apple", ram=16 * GiB)),
    "Apple 64 GiB": apply(DESKTOP, Overrides(gpu="apple", ram=64 * GiB)),
    "tight RAM, no GPU": apply(DESKTOP, Overrides(gpu="none", ram=5 * GiB)),
    "tight RAM, 8 GiB GPU": apply(DESKTOP, Overrides(vram=8 * GiB, ram=4 * GiB)),
    "2 cores, 24 GiB": Hardware((), 24 * GiB, 22 * GiB, 2, offload=False),
}


def plan_or_none(hw: Hardware, family: str, **kw) -> Plan | None:
    try:
        return plan_catalog(CATALOG, hw, Request(family=family, **kw))
    except NothingFits:
        return None


def params(plan: Plan | None) -> float:
    return CATALOG.model(plan.target.id).params if plan else 0.0


def weights_of(model_id: str, quant: str) -> Weights:
    model = CATALOG.model(model_id)
    return Weights.estimate(model, model.quant(quant))


def any_target_fits(hw: Hardware, family: str) -> bool:
    """Whether some target file of `family` fits alone at the smallest context."""
    budget = memory_budget(hw)
    return any(
        place(Weights.estimate(m, q), None, MIN_CTX, budget, hw) is not None
        for m in CATALOG.targets(family)
        for q in m.quants
    )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("machine", MACHINES)
def test_every_plan_fits_its_budget(machine, family):
    hw = MACHINES[machine]
    plan = plan_or_none(hw, family)
    assert (plan is not None) == any_target_fits(hw, family)
    if plan is None:
        return
    assert plan.fits()
    assert plan.vram_estimate <= plan.vram_budget
    if hw.unified:
        assert plan.vram_estimate + plan.ram_estimate <= plan.ram_budget
    else:
        assert plan.ram_estimate <= plan.ram_budget
    if hw.gpu_usable:  # the budget is the GPUs' free memory less a reserve
        assert 0 < plan.vram_budget < sum(g.usable or 0 for g in hw.gpus)
    else:
        assert plan.vram_budget == 0 and plan.vram_estimate == 0
    # the estimate is the sum of the two models' footprints where the plan puts them
    vram, ram = footprint(
        weights_of(plan.target.id, plan.target.quant), plan.target.n_ctx, plan.target.n_gpu_layers
    )
    if plan.draft is not None:
        draft = weights_of(plan.draft.id, plan.draft.quant)
        draft_vram, draft_ram = footprint(draft, plan.draft.n_ctx, plan.draft.n_gpu_layers)
        vram, ram = vram + draft_vram, ram + draft_ram
        assert plan.drafter == "draft" and plan.draft.n_ctx == plan.target.n_ctx
        assert CATALOG.model(plan.draft.id).family == family
        if hw.gpu_usable:  # a partly offloaded draft would lose its speed
            assert plan.draft.n_gpu_layers == len(draft.layers) + 1
    assert (vram, ram) == (plan.vram_estimate, plan.ram_estimate)
    assert MIN_CTX <= plan.target.n_ctx <= 8192
    if not hw.gpu_usable:
        assert plan.target.n_gpu_layers == 0
    # the decisions behind the plan are the plan's own numbers
    why = plan.why
    assert why.target.gpu_layers == plan.target.n_gpu_layers and why.n_ctx == plan.target.n_ctx
    assert (why.placement.vram, why.placement.ram) == (plan.vram_estimate, plan.ram_estimate)
    assert (why.drafter.reason == "draft") == (plan.draft is not None)
    said = reasons(plan)
    assert said[0] == f"This machine: {hw.describe()}."
    assert any(r.startswith(f"Target: {CATALOG.model(plan.target.id).name} ") for r in said)


@pytest.mark.parametrize("family", FAMILIES)
def test_more_vram_never_gives_a_smaller_target(family):
    sizes = [
        params(plan_or_none(nvidia(v) if v else MACHINES["no GPU"], family))
        for v in range(0, 97, 2)
    ]
    assert sizes == sorted(sizes), sizes


@pytest.mark.parametrize("family", FAMILIES)
def test_more_ram_never_gives_a_smaller_target(family):
    sizes = [
        params(plan_or_none(apply(DESKTOP, Overrides(gpu="none", ram=r * GiB)), family))
        for r in range(2, 65, 2)
    ]
    assert sizes == sorted(sizes), sizes
    apple = [
        params(plan_or_none(apply(DESKTOP, Overrides(gpu="apple", ram=r * GiB)), family))
        for r in (8, 16, 24, 32, 48, 64, 96, 128)
    ]
    assert apple == sorted(apple), apple


def test_the_table_reads_right_for_the_coder_family():
    got = {name: plan_or_none(hw, "coder") for name, hw in MACHINES.items()}
    assert got["24 GiB GPU"].target.id == "coder-32b"
    assert got["24 GiB GPU"].target.n_gpu_layers == 65  # all 64 layers and the output
    assert got["80 GiB GPU"].target.quant == "Q8_0"  # room for the best quantization
    assert got["no GPU"].target.n_gpu_layers == 0 and got["no GPU"].target.quant == "Q4_K_M"
    for name in ("8 GiB GPU", "12 GiB GPU", "24 GiB GPU", "Apple 16 GiB"):
        assert got[name].draft is not None and got[name].draft.id == "coder-0.5b"
    # a 2-core CPU could hold the 32B model but not run it: the speed floor keeps it small
    assert got["2 cores, 24 GiB"].target.id == "coder-1.5b"


def test_speed_floor_can_be_lifted():
    slow = MACHINES["2 cores, 24 GiB"]
    assert plan_or_none(slow, "coder", min_speed=0).target.id == "coder-32b"


SERVERS = tuple(Remote(f"10.0.0.{i}:50052", 40 * GiB, 48 * GiB) for i in (2, 3))


def test_rpc_servers_hold_a_target_this_machine_cannot():
    laptop = Hardware((), 8 * GiB, 6 * GiB, 8, offload=False)
    alone = plan_or_none(laptop, "coder", min_speed=0)
    split = plan_or_none(replace(laptop, remote=SERVERS), "coder", min_speed=0)
    assert alone is not None and split is not None
    assert params(split) > params(alone)
    target = CATALOG.model(split.target.id)
    assert split.target.n_gpu_layers == target.shape.layers + 1  # every layer and the head
    placed, budget = split.why.placement, split.why.budget
    weights = weights_of(split.target.id, split.target.quant)
    assert sum(weights.layers) < placed.remote <= budget.remote
    assert placed.vram == 0 and placed.ram <= budget.ram  # embeddings and the draft, here
    assert split.draft is None or split.draft.n_gpu_layers == 0  # the draft stays local
    said = reasons(split)
    assert "2 rpc-server(s) with 80.0 GiB free" in said[0]
    assert any("layers on the rpc-servers" in r for r in said)
    assert any(f"{fmt_size(placed.remote)} of {fmt_size(budget.remote)} on the" in r for r in said)
    assert plan_json(split)["memory"]["remote_estimate"] == placed.remote


def test_nothing_fits_over_rpc_says_what_the_servers_lack():
    small = (Remote("10.0.0.2:50052", 1 * GiB, 4 * GiB),)  # 512 MiB kept back
    tiny = Hardware((), 4 * GiB, 2 * GiB, 8, offload=False, remote=small)
    with pytest.raises(NothingFits, match=r"on the rpc-servers \(they have 512 MiB to spare\)"):
        plan_catalog(CATALOG, tiny, Request(family="coder"))


def test_rpc_servers_share_the_target_with_a_local_gpu_by_free_memory():
    gpu = replace(nvidia(8), remote=SERVERS[:1])
    placed = place(weights_of("coder-32b", "Q4_K_M"), None, MIN_CTX, memory_budget(gpu), gpu)
    assert placed is not None and placed.remote > 0 and placed.vram > 0
    budget = memory_budget(gpu)
    assert placed.vram / placed.remote == pytest.approx(budget.vram / budget.remote, rel=0.01)


def test_the_speed_floor_counts_remote_layers_at_this_cpus_speed():
    """The RPC backend does not say what a server's device is: slower than local GPUs."""
    weights = weights_of("coder-7b", "Q4_K_M")
    here = Hardware((), 64 * GiB, 60 * GiB, 8, offload=False, remote=SERVERS)
    local = step_seconds(weights, 0, here)
    remote = step_seconds(weights, len(weights.layers) + 1, here, on_servers=True)
    assert remote > local  # the same bytes at the same speed, plus a round trip per server


def test_a_slow_machine_gets_the_smallest_target_and_says_so():
    plan = plan_or_none(MACHINES["2 cores, 24 GiB"], "solo", min_speed=50)
    assert plan is not None and plan.target.id == "solo-8b"
    assert plan.why.slow is not None and plan.why.slow.min_speed == 50
    assert 0 < plan.why.slow.tokens_per_s < 50
    assert reasons(plan)[-1] == (
        f"Slow: nothing fits that decodes at 50 tokens/s here; this target manages "
        f"~{plan.why.slow.tokens_per_s:.1f}."
    )


def test_asked_context_is_kept_when_it_fits_and_cut_when_not():
    assert plan_or_none(nvidia(24), "coder", n_ctx=4096).target.n_ctx == 4096
    tight = apply(DESKTOP, Overrides(gpu="none", ram=3 * GiB))
    big = plan_or_none(tight, "coder", n_ctx=32768)
    assert MIN_CTX <= big.target.n_ctx < 32768 and big.why.asked_ctx == 32768
    assert f"Context: {big.target.n_ctx} tokens, the most that fits (asked for 32768)." in (
        reasons(big)
    )


def test_the_next_size_up_is_explained():
    # on an 8 GiB GPU the 32B model would run mostly on the CPU: it fits, too slowly
    plan = plan_or_none(nvidia(8), "coder")
    bigger = plan.why.next_size_up
    assert plan.target.id == "coder-7b" and bigger is not None
    assert (bigger.name, bigger.quant) == ("Coder 32B", "Q4_K_M")
    assert 0 < bigger.tokens_per_s < bigger.min_speed == 5
    assert reasons(plan)[-1] == (
        f"Next size up: Coder 32B (Q4_K_M) would fit but decode at only "
        f"~{bigger.tokens_per_s:.1f} tokens/s here (below 5; --min-speed 0 allows it)."
    )
    # without a GPU and with 16 GiB of RAM it does not fit at all
    plan = plan_or_none(apply(DESKTOP, Overrides(gpu="none", ram=16 * GiB)), "coder")
    bigger = plan.why.next_size_up
    assert plan.target.id == "coder-7b" and bigger is not None and bigger.tokens_per_s == 0
    assert not bigger.needs.on_gpu and bigger.needs.ram > plan.ram_budget
    assert reasons(plan)[-1] == (
        f"Next size up: Coder 32B (Q4_K_M) would need {bigger.needs.describe()}."
    )
    assert bigger.needs.describe().endswith("of RAM (you have 14.4 GiB to spare)")


def test_ngram_when_no_draft_fits():
    plan = plan_or_none(apply(DESKTOP, Overrides(gpu="none", ram=3 * GiB)), "coder")
    assert plan.drafter == "ngram" and plan.draft is None
    assert plan.why.drafter == DrafterChoice("none-fits")
    assert "Drafter: n-gram prompt lookup: no draft model fits next to the target." in (
        reasons(plan)
    )


def test_ngram_when_the_family_has_no_draft():
    plan = plan_or_none(nvidia(24), "solo")
    assert plan.drafter == "ngram" and plan.why.drafter == DrafterChoice("no-draft-model")


def test_asking_for_a_drafter():
    plan = plan_or_none(nvidia(24), "coder", draft="none")
    assert plan.drafter == "none" and plan.draft is None
    assert plan.why.drafter == DrafterChoice("asked-none")
    plan = plan_or_none(nvidia(24), "coder", draft="ngram")
    assert plan.drafter == "ngram" and plan.why.drafter == DrafterChoice("asked-ngram")


def test_gpu_llama_cpp_cannot_use_plans_for_the_cpu():
    hw = Hardware(
        (Gpu(0, "NVIDIA GeForce RTX 4090", "nvidia", 24 * GiB, 23 * GiB),),
        32 * GiB,
        30 * GiB,
        8,
        offload=False,
        notes=(
            "llama.cpp here was built without CUDA, so the GPU goes unused; "
            "rebuild it with `LOCALSPEC_ACCEL=cuda ./scripts/setup.sh`",
        ),
    )
    plan = plan_catalog(CATALOG, hw)
    assert plan.target.n_gpu_layers == 0 and plan.vram_estimate == 0
    assert plan.why.notes == hw.notes
    assert any("LOCALSPEC_ACCEL=cuda" in r and r.startswith("Note: ") for r in reasons(plan))


def test_nothing_fits_is_one_line():
    with pytest.raises(
        NothingFits, match=r"nothing fits: the smallest target, Coder 1\.5B .*needs"
    ):
        plan_catalog(CATALOG, apply(DESKTOP, Overrides(gpu="none", ram=1 * GiB)))


def test_unknown_family():
    with pytest.raises(Exception, match="no family 'nope'"):
        plan_catalog(CATALOG, DESKTOP, Request(family="nope"))


def test_json_shape():
    data = plan_json(plan_catalog(CATALOG, nvidia(12)))
    assert set(data) == {
        "target",
        "draft",
        "drafter",
        "gamma",
        "slots",
        "tokens_per_s",
        "memory",
        "reasons",
    }
    assert set(data["target"]) == {"id", "quant", "path", "n_gpu_layers", "n_ctx", "cpu_moe"}
    assert set(data["memory"]) == {
        *("vram_budget", "vram_estimate", "ram_budget", "ram_estimate"),
        *("remote_budget", "remote_estimate"),  # the rpc-servers' (0 without --rpc)
        *("recurrent_state", "recurrent_state_kept"),  # a hybrid target's (0 for others)
        *("prompt_reader", "prompt_reader_fits", "prompt_reader_beside_slots"),
    }
    assert data["memory"]["remote_budget"] == data["memory"]["remote_estimate"] == 0
    assert data["memory"]["recurrent_state"] == data["memory"]["recurrent_state_kept"] == 0
    assert isinstance(data["reasons"], list) and data["gamma"] >= 1


# --- the sentences, from decisions made by hand --------------------------------------


def hand_made_plan(drafter: DrafterChoice, unified: bool = False) -> Plan:
    budget = Budget(vram=10 * GiB, ram=20 * GiB, unified=unified)
    placement = Placement(4096, 29, True, 3 * GiB, 2 * GiB)
    why = Rationale(
        machine="a test machine",
        notes=("one note.",),
        gpu_usable=True,
        target=TargetChoice("Big", "Q5_K_M", 28, 29, "pair-on-gpu", had_choice=True),
        drafter=drafter,
        n_ctx=4096,
        asked_ctx=4096,
        placement=placement,
        budget=budget,
        next_size_up=NextSizeUp(
            "Bigger", "Q4_K_M", 3.25, 5.0, Requirement(True, 30 * GiB, 1 * GiB, budget)
        ),
    )
    side = Side("big", "Q5_K_M", None, 29, 4096)
    return Plan(side, None, "ngram", 4, budget.vram, 3 * GiB, budget.ram, 2 * GiB, why)


def test_reasons_render_the_decisions():
    draft = DraftEstimate("Small", "Q4_K_M", True, 5, 1.834)
    assert reasons(hand_made_plan(DrafterChoice("draft", draft))) == (
        "This machine: a test machine.",
        "Note: one note.",
        "Target: Big Q5_K_M, all 29 layers on the GPU: the largest target that fits; the "
        "largest quantization that keeps it and its draft wholly on the GPU.",
        "Draft: Small Q4_K_M, wholly on the GPU; estimated x1.83 at γ=5 (acceptance 0.85 "
        "assumed; --gamma auto measures and turns drafting off where it does not pay).",
        "Context: 4096 tokens (as asked).",
        "Memory: 3.0 GiB of 10.0 GiB GPU budget, 2.0 GiB of 20.0 GiB RAM budget (weights, "
        "KV cache and compute buffers; headroom kept for the system).",
        "Next size up: Bigger (Q4_K_M) would fit but decode at only ~3.2 tokens/s here "
        "(below 5; --min-speed 0 allows it).",
    )
    slow_draft = DrafterChoice("does-not-pay", replace(draft, speedup=0.91))
    unified = reasons(hand_made_plan(slow_draft, unified=True))
    assert unified[3] == (
        "Drafter: n-gram prompt lookup: Small would not pay on this device (estimated x0.91)."
    )
    assert unified[5] == (
        "Memory: 3.0 GiB for the GPU (budget 10.0 GiB) and 5.0 GiB in all (budget 20.0 GiB, "
        "shared), weights, KV cache and compute buffers included, headroom kept."
    )


# --- the arithmetic ------------------------------------------------------------------


def test_kv_cache_per_token():
    m = CATALOG.model("coder-7b")
    assert m.shape.kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2  # 2 x L x KV heads x d x f16
    w = Weights.estimate(m, m.quant("Q4_K_M"))
    assert w.kv_per_token_layer * m.shape.layers == m.shape.kv_bytes_per_token()
    cpu_v, cpu_r = footprint(w, 4096, 0)
    gpu_v, gpu_r = footprint(w, 8192, 0)
    assert cpu_v == gpu_v == 0 and gpu_r - cpu_r >= 4096 * m.shape.kv_bytes_per_token()


def test_offload_moves_the_last_layers_then_the_head():
    w = Weights((10, 20, 30), embd=5, output=7, kv_per_token_layer=1, vocab=10, embedding=4)
    v1, _ = footprint(w, 0, 1)
    v3, r3 = footprint(w, 0, 3)
    v4, r4 = footprint(w, 0, 4)
    compute = compute_bytes(w, 0)
    assert v1 - compute == 30 and v3 - compute == 60  # the last layers first
    assert v4 - v3 == 7 and r3 - r4 == 7  # the head moves over last
    tied = replace(w, output=0)
    assert footprint(tied, 0, 4)[0] - footprint(tied, 0, 3)[0] == 5  # a copy of the table


def test_weights_from_a_gguf_header(tmp_path: Path):
    info = gguf_info(make_gguf(tmp_path / "t.gguf", layers=4, embedding=64, vocab=500))
    w = Weights.from_gguf(info)
    assert len(w.layers) == 4 and all(b == 64 * 64 * 4 + 128 * 64 * 4 for b in w.layers)
    assert w.embd > 0 and w.output == 64 * 64 * 4 and w.vocab == 500
    assert w.kv_per_token_layer == 2 * 2 * 16 * 2  # 2 KV heads of 64/4 = 16, f16


DEFAULT_PAIR = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")


@pytest.mark.real
def test_the_catalogs_estimate_of_the_default_pair_is_their_files(real_paths):
    """Where a file is not pulled yet the planner estimates its parts from the catalog:
    for the default pair's files, what their headers say (Qwen's own GGUFs carry the
    output head as a tensor of its own, though the models tie it)."""
    catalog = default_catalog()
    for path, model_id in zip(real_paths, DEFAULT_PAIR, strict=True):
        m = catalog.model(model_id)
        guess, real = Weights.estimate(m, m.quant("Q4_K_M")), Weights.from_gguf(gguf_info(path))
        assert m.quant("Q4_K_M").hub.file == path.name and real.output > 0
        assert abs(sum(guess.layers) - sum(real.layers)) < 0.15 * sum(real.layers), model_id
        assert abs(guess.output - real.output) < 0.25 * real.output, model_id
    guess = Weights.estimate(catalog.model(DEFAULT_PAIR[0]), catalog.model(DEFAULT_PAIR[0]).quant())
    real = Weights.from_gguf(gguf_info(real_paths[0]))
    for part in ("embd", "output", "repacked"):  # the target's reader: 596.5 MiB
        assert abs(getattr(guess, part) - getattr(real, part)) < 0.05 * getattr(real, part), part


def test_tensor_shapes_read_as_ggufs_own_reader_reads_them(tmp_path: Path):
    import gguf

    path = make_gguf(tmp_path / "t.gguf", layers=2, embedding=64, vocab=500)
    want = {
        t.name: (tuple(int(d) for d in t.shape), t.tensor_type.name)
        for t in gguf.GGUFReader(path).tensors
    }
    assert tensor_shapes(path) == want and ("output.weight", ((64, 64), "F32")) in want.items()


# --- installed models and the default pair --------------------------------------------


def fake_installed(model_id: str, quant: str = "Q4_K_M", path: str = "/x.gguf") -> Installed:
    m = CATALOG.model(model_id)
    q = m.quant(quant)
    w = Weights.estimate(m, q)
    s = m.shape
    info = GgufInfo(
        m.family,
        m.name,
        15,
        s.layers,
        s.kv_heads,
        s.head_dim,
        s.embedding,
        s.vocab,
        s.context,
        "gpt2/qwen2",
        w.layers,
        w.embd,
        w.output,
    )
    record = FileRecord(path, q.size, 0, "0" * 64)
    return Installed(model_id, quant, "hub", (record,), info, m.family, m.role)


def test_plan_installed_uses_only_what_is_installed():
    have = [
        fake_installed("coder-7b", path="/t.gguf"),
        fake_installed("coder-0.5b", path="/d.gguf"),
        fake_installed("other-270m", path="/o.gguf"),
    ]
    plan = plan_installed(CATALOG, nvidia(24), have)
    assert plan.target.id == "coder-7b" and plan.target.path == "/t.gguf"
    assert plan.draft is not None and plan.draft.path == "/d.gguf"  # same family, not other
    with pytest.raises(NothingFits, match="no target of family other is installed"):
        plan_installed(CATALOG, nvidia(24), have, Request(family="other"))


def test_a_draft_that_cannot_pay_gives_ngram():
    # 1.5B and 0.5B on a fast GPU: both steps are mostly fixed overhead (measured on an
    # H200: the 0.5B's step is 0.65 of the 1.5B's pass), so the draft barely pays its way
    have = [fake_installed("coder-1.5b"), fake_installed("coder-0.5b")]
    plan = plan_installed(CATALOG, nvidia(24), have)
    assert plan.drafter == "ngram" and plan.why.drafter.reason == "does-not-pay"
    estimate = plan.why.drafter.draft
    assert estimate is not None and estimate.name == "Coder 0.5B"
    assert estimate.speedup < planner.MIN_SPEEDUP
    assert "would not pay" in " ".join(reasons(plan))


def test_default_pair_without_models_says_how_to_get_them(home):
    with pytest.raises(NotInstalled, match=r"run `localspec pull default`"):
        default_pair(hw=DESKTOP, catalog=CATALOG)


def _install_tiny_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Two small GGUFs recorded as the default pair (the planner reads their headers)."""
    paths = []
    for model_id in ("coder-1.5b", "coder-0.5b"):
        path = make_gguf(tmp_path / f"{model_id}.gguf", layers=2, vocab=300)
        # the record carries the catalog model's shape, as if measured from the real file
        entry = fake_installed(model_id)
        store.record(replace(entry, files=(FileRecord.of(path, "0" * 64),)))
        paths.append(path)
    return paths[0], paths[1]


def test_default_pair_plans_over_installed_models(home, tmp_path):
    target, draft = _install_tiny_pair(tmp_path)
    ci = default_pair(hw=MACHINES["2 cores, 24 GiB"], catalog=CATALOG)
    assert (ci.target, ci.draft) == (str(target), str(draft))  # the draft pays, barely
    assert ci.n_gpu_layers == 0 and ci.n_ctx == 8192
    assert ci.reasons[0].startswith("This machine: ")
    gpu = default_pair(hw=nvidia(8), catalog=CATALOG)
    assert gpu.target == str(target) and gpu.n_gpu_layers == 29  # 28 layers and the head
    assert default_pair("none", hw=nvidia(8), catalog=CATALOG).draft == "none"
    chosen = default_pair("/some/draft.gguf", hw=nvidia(8), catalog=CATALOG)
    assert chosen.draft == "/some/draft.gguf"


def test_a_named_target_is_planned_around(home, tmp_path):
    """`--target` alone: the plan keeps that target and chooses its draft, offload and
    context; a file the store does not know is loaded as asked (None here)."""
    target, draft = _install_tiny_pair(tmp_path)
    pair = pair_for_target(target, hw=MACHINES["2 cores, 24 GiB"])
    assert pair is not None and (pair.target, pair.draft) == (str(target), str(draft))
    assert (pair.n_ctx, pair.n_gpu_layers) == (8192, 0)
    assert pair_for_target(target, "none", nvidia(8)).draft == "none"  # type: ignore[union-attr]
    assert pair_for_target(tmp_path / "elsewhere.gguf", hw=nvidia(8)) is None
    # a --ctx given is the context the plan places the models for
    wide = pair_for_target(target, hw=MACHINES["2 cores, 24 GiB"], n_ctx=16384)
    assert wide is not None and wide.n_ctx == 16384
    assert default_pair(hw=MACHINES["2 cores, 24 GiB"], catalog=CATALOG, n_ctx=16384).n_ctx == 16384
    have = [
        fake_installed("coder-7b", path="/t7.gguf"),
        fake_installed("coder-1.5b", path="/t.gguf"),
    ]
    assert plan_installed(CATALOG, nvidia(24), have).target.path == "/t7.gguf"
    pinned = plan_installed(CATALOG, nvidia(24), have, Request(target="/t.gguf"))
    assert pinned.target.path == "/t.gguf"


def test_default_pair_falls_back_when_nothing_fits(home, tmp_path):
    target, draft = _install_tiny_pair(tmp_path)
    pair = default_pair(hw=apply(DESKTOP, Overrides(gpu="none", ram=1 * GiB)), catalog=CATALOG)
    assert (pair.target, pair.draft) == (str(target), str(draft))
    assert pair.n_ctx is None and "No plan fits" in pair.reasons[0]


# --- the shipped catalog -------------------------------------------------------------


def test_the_shipped_catalog_parses_and_every_family_plans():
    shipped = default_catalog()
    for pair in shipped.pairs:  # each named pair is a target and a draft it can pull
        target, draft = shipped.model(pair.target), shipped.model(pair.draft)
        assert (target.role, draft.role) == ("target", "draft"), pair.id
        assert target.family == draft.family, pair.id
        assert any(q.name == pair.quant for q in target.quants), pair.id
    assert shipped.pair("default") is not None
    for family in shipped.families:
        plan = plan_catalog(shipped, nvidia(24), Request(family=family.id))
        assert plan.fits() and shipped.model(plan.target.id).family == family.id


def test_the_planned_pair_is_the_same_pair_as_one_named_alike():
    """The chat compares the pair picked on its models screen with the one loaded: the
    planner's reasons must not make the same pair look like another."""
    planned = PairSpec("/t.gguf", "/d.gguf", 8192, 0, ("This machine: ...",))
    assert planned == PairSpec("/t.gguf", "/d.gguf", 8192, 0)
    assert planned != PairSpec("/t.gguf", "ngram", 8192, 0)


def test_slots_fit_beside_the_pair_without_giving_up_a_gpu_layer():
    """serve's slots: as many caches of the plan's context as fit, at most 4; on a card
    the pair fills, one (a slot never pushes a layer off the GPU)."""
    roomy = plan_catalog(CATALOG, apply(DESKTOP, Overrides(gpu="none", ram=64 * GiB)))
    assert roomy.slots == 4
    full = plan_catalog(CATALOG, nvidia(24))
    assert full.slots == 1 and full.target.n_gpu_layers > 0


def test_on_an_x86_cpu_the_plan_counts_the_prompt_reader_where_the_budget_holds_it():
    """A CPU target on x86 is loaded again, not repacked, to read prompts (reader.py):
    the plan counts its RAM where the budget holds it beside the pair, and says so (and
    beside how many of serve's slots); where not, the plan is the same and says prompts
    are read by the repacked weights; on a GPU, on an Apple CPU or for a type llama.cpp
    does not repack, none."""
    roomy = replace(apply(DESKTOP, Overrides(gpu="none", ram=64 * GiB)), x86=True)
    plan = plan_catalog(CATALOG, roomy)
    without = plan_catalog(CATALOG, replace(roomy, x86=False))
    weights = weights_of(plan.target.id, plan.target.quant)
    reader = reader_bytes(weights, plan.target.n_ctx)
    assert plan.target == without.target and plan.target.quant == "Q4_K_M"
    assert reader > weights.repacked > 0.7 * sum(weights.layers)
    assert plan.ram_estimate == without.ram_estimate + reader and plan.fits()
    assert plan.why.reader_slots == plan.slots == 4 and without.why.reader == 0
    assert any("loaded again, not repacked" in r for r in reasons(plan))
    assert plan_json(plan)["memory"]["prompt_reader"] == reader
    # in 12 GiB it fits beside two of serve's four slots; the 7B fills 8 GiB: beside none
    partial = plan_catalog(CATALOG, apply(roomy, Overrides(gpu="none", ram=12 * GiB)))
    assert partial.why.reader_slots == 2 and partial.slots == 4
    tight = apply(roomy, Overrides(gpu="none", ram=8 * GiB))
    assert tight.x86
    crowded, alone = plan_catalog(CATALOG, tight), plan_catalog(CATALOG, replace(tight, x86=False))
    assert crowded.why.reader and not crowded.why.reader_fits
    assert crowded.ram_estimate == alone.ram_estimate and crowded.target == alone.target
    assert any("read by the repacked weights" in r for r in reasons(crowded))
    for elsewhere in (nvidia(24, roomy), apply(roomy, Overrides(gpu="apple"))):
        assert plan_catalog(CATALOG, elsewhere).why.reader == 0
    assert reader_bytes(weights_of("coder-1.5b", "Q8_0"), 8192) == 0
