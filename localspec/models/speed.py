"""How fast a placed model decodes, and what speculation buys, as estimates for choosing.

A decode step costs a fixed overhead plus the bytes read over the memory bandwidth of
where they live; calibrated on a 2-core CPU and, for GPUs, on conservative bandwidths and
the costs measured on an H200 (docs/gpu.md: the fixed cost and how a verify pass grows).
Speculation with acceptance α and γ drafted tokens yields (1-α^(γ+1))/(1-α) tokens per γ
draft steps plus one verification pass (Leviathan et al.). `--gamma auto` measures what
these only estimate.

A mixture-of-experts token reads its layers' dense weights and `active / experts` of the
routed experts; a verify pass of k tokens reads the experts any of them is routed to:
a share 1 - (1 - s)^k of them for s = active / experts, routed independently (the
worst case; trained routers share experts more). So a MoE verify pass grows much faster
with k than a dense one does while reading bytes is what costs (`batch_growth`).
"""

from __future__ import annotations

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
RPC_PASS_SECONDS = 0.001  # per rpc-server and pass: a LAN round trip and its dispatch
ACCEPTANCE = 0.85  # the Qwen-Coder pair accepts 0.85-0.95 on code (measured)
VERIFY_SLOPE = {"cpu": 0.15, "gpu": 0.19}  # a k-token verify costs 1 + slope(k-1) steps


def step_seconds(
    weights: Weights,
    gpu_layers: int,
    hw: Hardware,
    on_servers: bool = False,
    cpu_moe: int = 0,
) -> float:
    """Estimated time of one decode step: every weight byte a token uses is read once.
    `on_servers`: the layers are on hw's rpc-servers (the target with --rpc); `cpu_moe`:
    the routed experts of the first layers are read from RAM (memory.py)."""
    n = len(weights.layers)
    on_gpu = max(0, min(gpu_layers, n))
    read = [weights.read_per_token(i) for i in range(n)]
    gpu_bytes = sum(read[n - on_gpu :]) + (weights.head if gpu_layers > n else 0)
    if weights.is_moe and cpu_moe:  # their experts stay in RAM, the rest of them here
        gpu_bytes -= sum(
            weights.experts[i] * weights.expert_share for i in range(n - on_gpu, cpu_moe)
        )
    all_bytes = sum(read) + weights.head
    cpu_bytes = all_bytes - gpu_bytes
    cpu_bw = min(CPU_BANDWIDTH_PER_CORE * hw.cores, CPU_BANDWIDTH_MAX)
    if on_servers:
        # The RPC backend reports a server's memory, not what kind of device it is: its
        # layers are costed at this machine's CPU speed, a floor (a GPU server is faster),
        # and each pass goes through every server once.
        overhead = CPU_STEP_OVERHEAD / max(hw.cores, 1) + hw.rpc_servers * RPC_PASS_SECONDS
        return overhead + all_bytes / cpu_bw
    gpu_bw = gpu_bandwidth(hw)
    overhead = GPU_STEP_OVERHEAD if gpu_layers > 0 else CPU_STEP_OVERHEAD / max(hw.cores, 1)
    return overhead + gpu_bytes / gpu_bw + cpu_bytes / cpu_bw


def gpu_bandwidth(hw: Hardware) -> float:
    if not hw.gpus:
        return 1.0
    gpu = hw.gpus[0]
    memory = gpu.total or gpu.usable or 0
    tiers = GPU_BANDWIDTH.get(gpu.vendor, GPU_BANDWIDTH["nvidia"])
    return next(bandwidth for limit, bandwidth in tiers if memory <= limit)


def batch_growth(weights: Weights, k: int) -> float:
    """T(k) / T(1) where reading bytes is the cost: for a dense model 1, for a MoE the
    experts k tokens are routed to over the ones one token is (the module docstring)."""
    if not weights.is_moe:
        return 1.0
    dense = sum(weights.layers) - sum(weights.experts) + weights.head
    experts = sum(weights.experts)
    s = weights.expert_share
    return (dense + experts * (1 - (1 - s) ** k)) / (dense + experts * s)


def speculation(
    t_target: float,
    t_draft: float,
    slope: float,
    alpha: float = ACCEPTANCE,
    weights: Weights | None = None,
) -> tuple[int, float]:
    """(γ, speedup) maximizing tokens per second over γ = 1..GAMMA_MAX; a MoE target's
    (`weights`) verify pass costs at least what the experts it reads cost."""
    best = (1, 0.0)
    for gamma in range(1, GAMMA_MAX + 1):
        expected = (1 - alpha ** (gamma + 1)) / (1 - alpha)
        growth = max(1 + slope * gamma, batch_growth(weights, gamma + 1) if weights else 1.0)
        seconds = gamma * t_draft + t_target * growth
        speedup = expected * t_target / seconds
        if speedup > best[1]:
            best = (gamma, speedup)
    return best
