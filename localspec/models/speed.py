"""How fast a placed model decodes, and what speculation buys, as estimates for choosing.

A decode step costs a fixed overhead plus the bytes read over the memory bandwidth of
where they live; calibrated on a 2-core CPU (and scaled by what this machine's own runs
measured, where they ran on its CPU: calibration.py) and, for GPUs, on conservative
bandwidths and the costs measured on an H200 (docs/gpu.md: the fixed cost and how a
verify pass grows).
Speculation with acceptance α and γ drafted tokens yields (1-α^(γ+1))/(1-α) tokens per γ
draft steps plus one verification pass (Leviathan et al.). `--gamma auto` measures what
these only estimate.

A mixture-of-experts token reads its layers' dense weights and `active / experts` of the
routed experts; a verify pass of k tokens reads the experts any of them is routed to:
a share 1 - (1 - s)^k of them for s = active / experts, routed independently (the
worst case; trained routers share experts more). So a MoE verify pass grows faster with
k than a dense one does, by what those bytes cost beside the pass's fixed cost
(`step_seconds`, `batch_growth`). On an H200 a random twin of Qwen3-Coder-30B-A3B's 48
layers fits T(k) = 1.8 ms + bytes(k) / 1.3 TB/s within 4% for k = 1..8, and with its
experts in RAM the growth follows their bytes (docs/gpu.md).
"""

from __future__ import annotations

from collections.abc import Callable

from localspec.drafting import GAMMA_MAX
from localspec.models.hardware import GiB, Hardware
from localspec.models.memory import Weights

CPU_BANDWIDTH_PER_CORE = 8.25e9  # bytes/s
CPU_BANDWIDTH_MAX = 45e9  # what llama.cpp reaches on a desktop with dual-channel DDR5
CPU_STEP_OVERHEAD = 0.06  # seconds x cores (measured on a 2-core CPU)
# GPU memory bandwidth grows with the card's memory: (up to this much memory, bytes/s),
# conservative within each class (a laptop RTX 4060, a desktop 3090/4090, an A100/H100;
# an M-series base, Pro, Max).
GPU_BANDWIDTH = {
    "nvidia": ((12 * GiB, 250e9), (32 * GiB, 700e9), (1 << 50, 1500e9)),
    "apple": ((16 * GiB, 100e9), (36 * GiB, 150e9), (1 << 50, 300e9)),
}
# Measured on an H200 with Q4_K_M shapes of Qwen2.5-Coder 1.5B-32B (docs/gpu.md): T(1) =
# 1.1 ms + bytes / 1.7 TB/s, and each extra token of a verify pass up to 8 costs 0.19 T(1)
# (llama.cpp's quantized matrix-vector kernels scale with the batch up to 8 columns).
GPU_STEP_OVERHEAD = 0.001
# Per layer on a GPU, the kernels a dense block does not launch (H200, random twins,
# docs/gpu.md): a MoE layer's routing and expert gathers (the 30B-A3B twin's pass has
# 0.8 ms more fixed cost than its bytes and GPU_STEP_OVERHEAD account for), a Gated
# DeltaNet layer's convolution and scan (Qwen3.5-0.8B's and Qwen3.6-27B's twins).
GPU_MOE_LAYER = 17e-6
GPU_RECURRENT_LAYER = 10e-6
# A layer whose experts are in RAM hands its activations from the GPU to the CPU and back
# each pass (the twin with all 48 layers' experts in RAM: ~9 ms of fixed cost, not ~2)
CPU_EXPERTS_LAYER = 100e-6
RPC_PASS_SECONDS = 0.001  # per rpc-server and pass: a LAN round trip and its dispatch
ACCEPTANCE = 0.85  # the Qwen-Coder pair accepts 0.85-0.95 on code (measured)
VERIFY_SLOPE = {"cpu": 0.15, "gpu": 0.19}  # a k-token verify costs 1 + slope(k-1) steps


def step_seconds(
    weights: Weights,
    gpu_layers: int,
    hw: Hardware,
    on_servers: bool = False,
    cpu_moe: int = 0,
    tokens: int = 1,
) -> float:
    """Estimated time of one pass over `tokens` new tokens (a decode step for one): the
    fixed cost, and every weight byte they use read once from where it lives.
    `on_servers`: the layers are on hw's rpc-servers (the target with --rpc); `cpu_moe`:
    the routed experts of the first layers are read from RAM (memory.py)."""
    n = len(weights.layers)
    on_gpu = max(0, min(gpu_layers, n))
    read = [weights.read_by(i, tokens) for i in range(n)]
    gpu_bytes = sum(read[n - on_gpu :]) + (weights.head if gpu_layers > n else 0)
    if weights.is_moe and cpu_moe:  # their experts stay in RAM, the rest of them here
        gpu_bytes -= sum(
            weights.read_by(i, tokens) - weights.read_by(i, 0) for i in range(n - on_gpu, cpu_moe)
        )
    all_bytes = sum(read) + weights.head
    cpu_bytes = all_bytes - gpu_bytes
    cpu_bw = min(CPU_BANDWIDTH_PER_CORE * hw.cores, CPU_BANDWIDTH_MAX)
    cpu_s = hw.cpu_scale  # this CPU's own runs against these estimates
    if on_servers:
        # The RPC backend reports a server's memory, not what kind of device it is: its
        # layers are costed at this machine's CPU speed, a floor (a GPU server is faster),
        # and each pass goes through every server once.
        overhead = CPU_STEP_OVERHEAD / max(hw.cores, 1) + hw.rpc_servers * RPC_PASS_SECONDS
        return overhead + all_bytes / cpu_bw
    if gpu_layers <= 0:
        return (CPU_STEP_OVERHEAD / max(hw.cores, 1) + all_bytes / cpu_bw) * cpu_s
    per_layer = (GPU_MOE_LAYER if weights.is_moe else 0.0) + GPU_RECURRENT_LAYER * (
        weights.recurrent_layers / max(n, 1)
    )
    handed_over = max(0, min(cpu_moe, n) - (n - on_gpu)) if weights.is_moe else 0
    overhead = GPU_STEP_OVERHEAD + on_gpu * per_layer + handed_over * CPU_EXPERTS_LAYER
    return overhead + gpu_bytes / gpu_bandwidth(hw) + cpu_bytes / cpu_bw * cpu_s


def gpu_bandwidth(hw: Hardware) -> float:
    if not hw.gpus:
        return 1.0
    gpu = hw.gpus[0]
    memory = gpu.total or gpu.usable or 0
    tiers = GPU_BANDWIDTH.get(gpu.vendor, GPU_BANDWIDTH["nvidia"])
    return next(bandwidth for limit, bandwidth in tiers if memory <= limit)


def batch_growth(
    weights: Weights, k: int, gpu_layers: int, hw: Hardware, cpu_moe: int = 0
) -> float:
    """T(k) / T(1) by the bytes a pass of k tokens reads where the model lies: for a dense
    model 1 (the verify slope prices its compute), for a MoE the experts k tokens are
    routed to beside the pass's fixed cost."""
    if not weights.is_moe:
        return 1.0

    def t(tokens: int) -> float:
        return step_seconds(weights, gpu_layers, hw, cpu_moe=cpu_moe, tokens=tokens)

    return t(k) / t(1)


def speculation(
    t_target: float,
    t_draft: float,
    slope: float,
    alpha: float = ACCEPTANCE,
    growth_of: Callable[[int], float] | None = None,
) -> tuple[int, float]:
    """(γ, speedup) maximizing tokens per second over γ = 1..GAMMA_MAX; a MoE target's
    verify pass of k tokens costs at least `growth_of(k)` T(1) (`batch_growth`)."""
    best = (1, 0.0)
    for gamma in range(1, GAMMA_MAX + 1):
        expected = (1 - alpha ** (gamma + 1)) / (1 - alpha)
        growth = max(1 + slope * gamma, growth_of(gamma + 1) if growth_of else 1.0)
        seconds = gamma * t_draft + t_target * growth
        speedup = expected * t_target / seconds
        if speedup > best[1]:
            best = (gamma, speedup)
    return best
