"""The planner, as a table of machines (no GPU, 4 to 80 GiB GPUs, Apple 16 and 64 GiB,
tight RAM): every plan fits its budget, more memory never gives a smaller target, the
draft sits wholly on the GPU; plus the memory arithmetic, installed-only planning and the
default pair that `run` and the chat load."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hub_server import home, make_gguf

from localspec.models import planner, store
from localspec.models.catalog import NotInstalled, default_catalog
from localspec.models.hardware import GiB, Gpu, Hardware, Overrides, apply
from localspec.models.planner import (
    MIN_CTX,
    NothingFits,
    Request,
    Weights,
    footprint,
    plan_catalog,
    plan_installed,
)
from localspec.models.store import FileRecord, GgufInfo, Installed

__all__ = ["home"]

CATALOG = default_catalog()
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
    "2 cores, 24 GiB (this CI)": Hardware((), 24 * GiB, 22 * GiB, 2, offload=False),
}


def plan_or_none(hw: Hardware, family: str, **kw) -> planner.Plan | None:
    try:
        return plan_catalog(CATALOG, hw, Request(family=family, **kw))
    except NothingFits:
        return None


def params(plan: planner.Plan | None) -> float:
    return CATALOG.model(plan.target.id).params if plan else 0.0


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("machine", MACHINES)
def test_every_plan_fits_its_budget(machine, family):
    hw = MACHINES[machine]
    plan = plan_or_none(hw, family)
    if plan is None:
        assert "tight" in machine or "2 cores" in machine
        return
    assert plan.fits()
    assert plan.vram_estimate <= plan.vram_budget
    if hw.unified:
        assert plan.vram_estimate + plan.ram_estimate <= plan.ram_budget
    else:
        assert plan.ram_estimate <= plan.ram_budget
    assert plan.vram_budget == (0 if not hw.gpu_usable else plan.vram_budget)
    # the estimate is the sum of the two models' footprints where the plan puts them
    target = _weights(plan.target.id, plan.target.quant)
    vram, ram = footprint(target, plan.target.n_ctx, plan.target.n_gpu_layers)
    if plan.draft is not None:
        draft = _weights(plan.draft.id, plan.draft.quant)
        dv, dr = footprint(draft, plan.draft.n_ctx, plan.draft.n_gpu_layers)
        vram, ram = vram + dv, ram + dr
        assert plan.drafter == "draft" and plan.draft.n_ctx == plan.target.n_ctx
        if hw.gpu_usable:  # a partly offloaded draft would lose its speed
            assert plan.draft.n_gpu_layers == draft_layers(plan.draft.id) + 1
    assert (vram, ram) == (plan.vram_estimate, plan.ram_estimate)
    assert MIN_CTX <= plan.target.n_ctx <= 8192
    if not hw.gpu_usable:
        assert plan.target.n_gpu_layers == 0
    assert plan.reasons[0].startswith("This machine:") and any(
        r.startswith("Target:") for r in plan.reasons
    )


def _weights(model_id: str, quant: str) -> Weights:
    m = CATALOG.model(model_id)
    return Weights.estimate(m, m.quant(quant))


def draft_layers(model_id: str) -> int:
    return CATALOG.model(model_id).shape.layers


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


def test_the_table_reads_right_for_the_default_family():
    got = {name: plan_or_none(hw, "qwen2.5-coder") for name, hw in MACHINES.items()}
    assert got["24 GiB GPU"].target.id == "qwen2.5-coder-32b-instruct"
    assert got["24 GiB GPU"].target.n_gpu_layers == 65  # all 64 layers and the output
    assert got["80 GiB GPU"].target.quant == "Q8_0"  # room for the best quantization
    assert got["no GPU"].target.n_gpu_layers == 0 and got["no GPU"].target.quant == "Q4_K_M"
    for name in ("8 GiB GPU", "12 GiB GPU", "24 GiB GPU", "Apple 16 GiB"):
        assert got[name].draft is not None and got[name].draft.id == "qwen2.5-coder-0.5b-instruct"
    # a 2-core CPU could hold a 32B model but not run it: the speed floor keeps it small
    assert params(got["2 cores, 24 GiB (this CI)"]) <= 3.1


def test_speed_floor_can_be_lifted():
    slow = MACHINES["2 cores, 24 GiB (this CI)"]
    assert params(plan_or_none(slow, "qwen2.5-coder", min_speed=0)) == 32.8


def test_asked_context_is_kept_when_it_fits_and_cut_when_not():
    hw = nvidia(24)
    assert plan_or_none(hw, "qwen2.5-coder", n_ctx=4096).target.n_ctx == 4096
    tight = apply(DESKTOP, Overrides(gpu="none", ram=4 * GiB))
    big = plan_or_none(tight, "qwen2.5-coder", n_ctx=32768)
    assert MIN_CTX <= big.target.n_ctx < 32768
    assert any("the most that fits (asked for 32768)" in r for r in big.reasons)


def test_the_next_size_up_is_explained():
    plan = plan_or_none(nvidia(8), "qwen2.5-coder")
    nxt = [r for r in plan.reasons if r.startswith("Next size up:")]
    assert nxt and "32B" in nxt[0] and ("GiB" in nxt[0] or "tokens/s" in nxt[0])


def test_ngram_when_no_draft_fits():
    plan = plan_or_none(apply(DESKTOP, Overrides(gpu="none", ram=4 * GiB)), "qwen2.5-coder")
    assert plan.drafter == "ngram" and plan.draft is None
    assert any(r.startswith("Drafter: n-gram") for r in plan.reasons)


def test_asking_for_no_draft():
    plan = plan_or_none(nvidia(24), "qwen2.5-coder", draft="none")
    assert plan.drafter == "none" and plan.draft is None


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
    assert any("LOCALSPEC_ACCEL=cuda" in r for r in plan.reasons)


def test_nothing_fits_is_one_line():
    with pytest.raises(NothingFits, match=r"nothing fits: the smallest target, .*needs"):
        plan_catalog(CATALOG, apply(DESKTOP, Overrides(gpu="none", ram=1 * GiB)))


def test_unknown_family():
    with pytest.raises(Exception, match="no family 'nope'"):
        plan_catalog(CATALOG, DESKTOP, Request(family="nope"))


def test_json_shape():
    data = plan_catalog(CATALOG, nvidia(12)).to_json()
    assert set(data) == {"target", "draft", "drafter", "gamma", "memory", "reasons"}
    assert set(data["target"]) == {"id", "quant", "path", "n_gpu_layers", "n_ctx"}
    assert set(data["memory"]) == {"vram_budget", "vram_estimate", "ram_budget", "ram_estimate"}
    assert isinstance(data["reasons"], list) and data["gamma"] >= 1


# --- the arithmetic ------------------------------------------------------------------


def test_kv_cache_per_token():
    m = CATALOG.model("qwen2.5-coder-7b-instruct")
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
    compute = planner.compute_bytes(w, 0)
    assert v1 - compute == 30 and v3 - compute == 60  # the last layers first
    assert v4 - v3 == 7 and r3 - r4 == 7  # the head moves over last
    tied = replace(w, output=0)
    assert footprint(tied, 0, 4)[0] - footprint(tied, 0, 3)[0] == 5  # a copy of the table


def test_weights_from_a_gguf_header(tmp_path: Path):
    info = store.gguf_info(make_gguf(tmp_path / "t.gguf", layers=4, embedding=64, vocab=500))
    w = Weights.from_gguf(info)
    assert len(w.layers) == 4 and all(b == 64 * 64 * 4 + 128 * 64 * 4 for b in w.layers)
    assert w.embd > 0 and w.output == 64 * 64 * 4 and w.vocab == 500
    assert w.kv_per_token_layer == 2 * 2 * 16 * 2  # 2 KV heads of 64/4 = 16, f16


# --- installed models and the default pair --------------------------------------------


def fake_installed(model_id: str, quant: str = "Q4_K_M", path: str = "/x.gguf") -> Installed:
    m = CATALOG.model(model_id)
    q = m.quant(quant)
    w = Weights.estimate(m, q)
    info = GgufInfo(
        m.family,
        m.name,
        15,
        m.shape.layers,
        m.shape.kv_heads,
        m.shape.head_dim,
        m.shape.embedding,
        m.shape.vocab,
        m.shape.context,
        "gpt2/qwen2",
        w.layers,
        w.embd,
        w.output,
    )
    return Installed(
        model_id, quant, "hub", (FileRecord(path, q.size, 0, "0" * 64),), info, m.family, m.role
    )


def test_plan_installed_uses_only_what_is_installed():
    have = [
        fake_installed("qwen2.5-coder-7b-instruct", path="/t.gguf"),
        fake_installed("qwen2.5-coder-0.5b-instruct", path="/d.gguf"),
        fake_installed("llama-3.2-1b-instruct", path="/l.gguf"),
    ]
    plan = plan_installed(CATALOG, nvidia(24), have)
    assert plan.target.id == "qwen2.5-coder-7b-instruct" and plan.target.path == "/t.gguf"
    assert plan.draft is not None and plan.draft.path == "/d.gguf"  # same family, not llama


def test_a_draft_that_cannot_pay_gives_ngram():
    # 1.5B and 0.5B on a fast GPU: both steps are mostly fixed overhead, so c is near 1
    have = [
        fake_installed("qwen2.5-coder-1.5b-instruct"),
        fake_installed("qwen2.5-coder-0.5b-instruct"),
    ]
    plan = plan_installed(CATALOG, nvidia(24), have)
    assert plan.drafter == "ngram" and "would not pay" in " ".join(plan.reasons)


def test_default_pair_without_models_says_how_to_get_them(home):
    from localspec.models.pairing import default_pair

    with pytest.raises(NotInstalled, match=r"run `localspec pull default`"):
        default_pair(hw=DESKTOP)


def _install_tiny_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Two small GGUFs recorded as the default pair (the planner reads their headers)."""
    paths = []
    for model_id in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"):
        path = make_gguf(tmp_path / f"{model_id}.gguf", layers=2, vocab=300)
        # the record carries the real model's shape, as if measured from the real file
        entry = fake_installed(model_id)
        store.record(replace(entry, files=(FileRecord.of(path, "0" * 64),)))
        paths.append(path)
    return paths[0], paths[1]


def test_default_pair_plans_over_installed_models(home, tmp_path):
    from localspec.models.pairing import default_pair

    target, draft = _install_tiny_pair(tmp_path)
    ci = default_pair(hw=MACHINES["2 cores, 24 GiB (this CI)"])
    assert (ci.target, ci.draft) == (str(target), str(draft))  # the draft pays, barely
    assert ci.n_gpu_layers == 0 and ci.n_ctx == 8192
    gpu = default_pair(hw=nvidia(8))
    assert gpu.target == str(target) and gpu.n_gpu_layers == 29  # 28 layers and the head
    assert default_pair("none", hw=nvidia(8)).draft == "none"
    assert default_pair("/some/draft.gguf", hw=nvidia(8)).draft == "/some/draft.gguf"


def test_default_pair_falls_back_when_nothing_fits(home, tmp_path):
    from localspec.models.pairing import default_pair

    target, draft = _install_tiny_pair(tmp_path)
    pair = default_pair(hw=apply(DESKTOP, Overrides(gpu="none", ram=1 * GiB)))
    assert (pair.target, pair.draft) == (str(target), str(draft))
    assert pair.n_ctx is None and "No plan fits" in pair.reasons[0]
