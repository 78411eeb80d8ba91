"""How long things take on the simulated hardware: engine steps, model load, CUDA-graph capture.

The step time of vLLM 0.5.4 (V0 engine, one forward pass per step) is modelled as the sum of

* CPU work of the engine loop (scheduling, input preparation, sampling, detokenisation, output
  processing): a fixed part per step plus a part per scheduled sequence; 0.5.4 is Python-heavy here
  (knee 2 of the field notes), and the mp executor adds a broadcast per worker;
* GPU work per rank: reading this rank's share of the weights once per step (decode is memory-bound),
  or the FLOPs of the prefill tokens when those dominate; reading the KV cache of every decoded
  sequence (paged attention); kernel launches of every layer in eager mode (CUDA graphs replay the
  decode launches in one go);
* tensor-parallel communication: two all-reduces of `tokens x hidden` fp16 activations per layer,
  each costing a latency plus the bytes a ring moves over the transport NCCL picks. Small messages
  (decode) run NCCL's low-latency protocols, whose per-byte cost is mostly hidden behind the latency;
  large ones (prefill, and decode of big batches: the field notes' knee at 64 streams) pay the
  transport's full bandwidth. `_allreduce_seconds` switches steeply around `NCCL_PROTOCOL_SWITCH_BYTES`.

The transport follows NCCL's choice: NVLink when every pair of the group has it; else PCIe P2P where
NVML reports P2P supported between every pair (and NCCL_P2P_DISABLE is unset); else shared host memory
(SHM, slower when the path crosses sockets: SYS); else, with NCCL_SHM_DISABLE=1 as well, the network
transport over loopback sockets, the slowest (the field notes' setting).

CALIBRATION: the latency/bandwidth of each transport, the protocol switch and the CPU constants were
fitted (bench/twin_calibration.py, lab/vllm_twin/README.md) so that 8x V100-PCIe, a 20B FP16 model,
TP=8 with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 and the field notes' flags reproduce the field notes'
table. The other transports keep the same shape with textbook ratios; they are not measured.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class GpuSpec:
    """Peak dense FP16 tensor throughput and memory bandwidth (vendor datasheets)."""

    fp16_flops: float
    memory_bandwidth: float  # bytes/s
    pcie_bandwidth: float  # bytes/s host<->device, for swapping and weight loading


# Matched against the NVML name, first match wins.
GPU_SPECS: List[Tuple[str, GpuSpec]] = [
    ("V100-SXM2", GpuSpec(125e12, 900e9, 12e9)),
    ("V100", GpuSpec(112e12, 900e9, 12e9)),
    ("T4", GpuSpec(65e12, 320e9, 12e9)),
    ("A100-SXM4-80GB", GpuSpec(312e12, 2039e9, 24e9)),
    ("A100", GpuSpec(312e12, 1555e9, 24e9)),
    ("H100", GpuSpec(989e12, 3350e9, 50e9)),
    ("H200", GpuSpec(989e12, 4800e9, 50e9)),
    ("L4", GpuSpec(121e12, 300e9, 24e9)),
    ("A10", GpuSpec(125e12, 600e9, 24e9)),
    ("P100", GpuSpec(18.7e12, 732e9, 12e9)),
    ("P40", GpuSpec(12e12, 347e9, 12e9)),
]
ARCH_FALLBACK: Dict[str, GpuSpec] = {
    "kepler": GpuSpec(4e12, 240e9, 6e9), "maxwell": GpuSpec(6e12, 300e9, 12e9),
    "pascal": GpuSpec(18e12, 500e9, 12e9), "volta": GpuSpec(112e12, 900e9, 12e9),
    "turing": GpuSpec(65e12, 320e9, 12e9), "ampere": GpuSpec(150e12, 900e9, 24e9),
    "ada": GpuSpec(180e12, 800e9, 24e9), "hopper": GpuSpec(989e12, 3350e9, 50e9),
}


def gpu_spec(name: str, architecture: str) -> GpuSpec:
    for pattern, spec in GPU_SPECS:
        if pattern in name:
            return spec
    return ARCH_FALLBACK.get(architecture, ARCH_FALLBACK["volta"])


# --- calibrated constants -------------------------------------------------------------------------
HBM_EFFICIENCY = 0.80          # fraction of peak bandwidth a GEMV-bound decode reaches
ATTENTION_HBM_EFFICIENCY = 0.45  # paged-attention v1 KV reads on xFormers/Volta
PREFILL_MFU = 0.35             # model FLOPs utilisation of prefill GEMMs (fp16 tensor cores)
CPU_STEP_SECONDS = 0.003       # 0.5.4 engine loop per step: schedule, prepare, sample, process
CPU_SEQ_SECONDS = 0.00006      # per scheduled sequence per step
CPU_PREFILL_TOKEN_SECONDS = 0.000002  # input preparation per prompt token
CPU_WORKER_BROADCAST_SECONDS = 0.0002  # mp executor: per extra worker per step
EAGER_LAUNCH_SECONDS_PER_LAYER = 0.00006  # kernel launches per layer in eager mode
GRAPH_REPLAY_SECONDS = 0.0004  # one CUDA graph launch per decode step
RING_FACTOR_NUMERATOR = 2.0    # a ring all-reduce moves 2(n-1)/n of the message per rank
NCCL_PROTOCOL_SWITCH_BYTES = 1.4 * MiB
NCCL_PROTOCOL_SWITCH_SHARPNESS = 6.0  # NCCL picks one protocol per size: a steep, not gradual, change


@dataclass(frozen=True)
class Transport:
    """An NCCL transport between the GPUs of one tensor-parallel group."""

    name: str                 # nvlink | p2p | shm | net | none
    latency: float            # seconds per all-reduce (per call, all hops)
    bandwidth: float          # bytes/s of ring bus bandwidth for large messages
    description: str


TRANSPORTS: Dict[str, Tuple[float, float]] = {
    "nvlink": (15e-6, 60e9),
    "p2p": (25e-6, 9e9),
    "shm": (40e-6, 6e9),
    "shm-sys": (55e-6, 4e9),
    "net": (75e-6, 2.1e9),
}


def choose_transport(tensor_parallel_size: int, all_nvlink: bool, all_p2p: bool, slowest_path: str,
                     p2p_disabled: bool, shm_disabled: bool) -> Transport:
    """NCCL's transport for the group (see the module docstring)."""
    if tensor_parallel_size <= 1:
        return Transport("none", 0.0, float("inf"), "single GPU, no collective communication")
    if all_nvlink and not p2p_disabled:
        lat, bw = TRANSPORTS["nvlink"]
        return Transport("nvlink", lat, bw, "NVLink P2P between every pair")
    if all_p2p and not p2p_disabled:
        lat, bw = TRANSPORTS["p2p"]
        return Transport("p2p", lat, bw, f"PCIe P2P (slowest path {slowest_path})")
    if not shm_disabled:
        key = "shm-sys" if slowest_path == "SYS" else "shm"
        lat, bw = TRANSPORTS[key]
        reason = "NCCL_P2P_DISABLE=1" if p2p_disabled else "no P2P between every pair"
        return Transport("shm", lat, bw, f"shared host memory ({reason}; slowest path {slowest_path})")
    lat, bw = TRANSPORTS["net"]
    return Transport("net", lat, bw, "network transport over loopback sockets (NCCL_P2P_DISABLE=1 and "
                     "NCCL_SHM_DISABLE=1): routed through host memory, the slowest")


@dataclass(frozen=True)
class ModelShape:
    """What the step time needs of the model (from module_utils/revive_model.py facts)."""

    parameter_count: int
    weight_bytes: int
    num_layers: int
    hidden_size: int
    kv_bytes_per_token: int  # K and V of one token over all layers, all heads, in the KV dtype


@dataclass(frozen=True)
class StepCost:
    """One engine step: seconds and how they split (the split feeds the GPU utilisation report)."""

    seconds: float
    gpu_busy_seconds: float
    memory_busy_seconds: float


@dataclass
class PerfModel:
    model: ModelShape
    spec: GpuSpec
    tensor_parallel_size: int
    transport: Transport
    enforce_eager: bool
    max_graph_batch: int          # largest captured decode batch (0 with --enforce-eager)
    slowdown: float = 1.0         # fault knob: degraded node

    def _allreduce_seconds(self, message_bytes: float) -> float:
        tp = self.tensor_parallel_size
        if tp <= 1:
            return 0.0
        moved = RING_FACTOR_NUMERATOR * (tp - 1) / tp * message_bytes
        bandwidth_part = moved / self.transport.bandwidth
        # Share of the message that pays full bandwidth: ~0 well below the protocol switch, ~1 above.
        blend = 1.0 / (1.0 + (NCCL_PROTOCOL_SWITCH_BYTES / moved) ** NCCL_PROTOCOL_SWITCH_SHARPNESS)
        return self.transport.latency + bandwidth_part * blend

    def communication_seconds(self, tokens: int) -> float:
        if self.tensor_parallel_size <= 1 or tokens <= 0:
            return 0.0
        message = tokens * self.model.hidden_size * 2
        return 2 * self.model.num_layers * self._allreduce_seconds(message)

    def step(self, prefill_lengths: Sequence[int], decode_contexts: Sequence[int],
             swapped_blocks: int = 0, block_bytes: int = 0) -> StepCost:
        """Cost of one step: prompts to prefill (their lengths) or sequences to decode (their contexts).

        In 0.5.4 without chunked prefill a step is either all-prefill or all-decode; both lists are
        accepted so chunked prefill (mixed batches) costs the sum.
        """
        m, s, tp = self.model, self.spec, self.tensor_parallel_size
        prefill_tokens = sum(prefill_lengths)
        decode_seqs = len(decode_contexts)
        tokens = prefill_tokens + decode_seqs
        if tokens == 0 and swapped_blocks == 0:
            return StepCost(0.0, 0.0, 0.0)
        cpu = (CPU_STEP_SECONDS + CPU_SEQ_SECONDS * (len(prefill_lengths) + decode_seqs)
               + CPU_PREFILL_TOKEN_SECONDS * prefill_tokens + CPU_WORKER_BROADCAST_SECONDS * (tp - 1))
        weights = m.weight_bytes / tp / (s.memory_bandwidth * HBM_EFFICIENCY)
        flops = 2.0 * m.parameter_count * tokens / tp / (s.fp16_flops * PREFILL_MFU)
        prefill_attention = sum(length * length for length in prefill_lengths) * 4.0 * m.hidden_size \
            * m.num_layers / tp / (s.fp16_flops * PREFILL_MFU)
        kv_read = sum(decode_contexts) * m.kv_bytes_per_token / tp / (s.memory_bandwidth
                                                                       * ATTENTION_HBM_EFFICIENCY)
        graphs = (not self.enforce_eager and prefill_tokens == 0 and 0 < decode_seqs <= self.max_graph_batch)
        launches = GRAPH_REPLAY_SECONDS if graphs else EAGER_LAUNCH_SECONDS_PER_LAYER * m.num_layers
        gpu = max(weights, flops) + prefill_attention + kv_read + launches
        comm = self.communication_seconds(tokens)
        swap = swapped_blocks * block_bytes / s.pcie_bandwidth if block_bytes else 0.0
        seconds = (cpu + gpu + comm + swap) * self.slowdown
        # NCCL kernels spin while they wait, so communication counts as busy, as nvidia-smi shows it.
        return StepCost(seconds, (gpu + comm + swap) * self.slowdown, (weights + kv_read) * self.slowdown)


# --- start-up timing --------------------------------------------------------------------------------
PROCESS_INIT_SECONDS = 9.0       # interpreter, torch import, CUDA context, worker processes
NCCL_INIT_SECONDS_PER_RANK = 0.6  # NCCL communicator set-up per rank (TP > 1)
WEIGHT_LOAD_BYTES_PER_SECOND = 650e6  # safetensors from local SSD into GPU memory, all ranks together
PROFILE_RUN_SECONDS = 3.0        # the profiling forward pass
GRAPH_CAPTURE_SECONDS_PER_BATCH = 0.6  # per captured decode batch size


def load_seconds(weight_bytes: int) -> float:
    """Model load: proportional to the weight bytes (field notes: 41 GB from local SSD, cold start 1-2 min)."""
    return weight_bytes / WEIGHT_LOAD_BYTES_PER_SECOND


def init_seconds(tensor_parallel_size: int) -> float:
    return PROCESS_INIT_SECONDS + (NCCL_INIT_SECONDS_PER_RANK * tensor_parallel_size
                                   if tensor_parallel_size > 1 else 0.0)


# --- CUDA graph memory (0.5.4 captures after the KV cache is allocated, outside the budget) ---------
# reference §1.5/§7.2: [1, 2, 4] + [8*i for i in 1..32], capped at the padded max_num_seqs.
CUDA_GRAPH_BATCH_SIZES = [1, 2, 4] + [8 * i for i in range(1, 33)]
GRAPH_BYTES_PER_BATCH_PER_LAYER = 1.15 * MiB  # graph objects and kernel parameters
GRAPH_ACTIVATION_FACTOR = 100  # activation pool of the largest batch: batch x hidden x 2 bytes x this
CUDA_CONTEXT_BYTES = 500 * MiB  # CUDA context + cuBLAS workspace: exists before vLLM's memory snapshot


def graph_batch_sizes(max_num_seqs: int) -> List[int]:
    """Batch sizes 0.5.4 captures: up to _get_graph_batch_size(max_num_seqs) (pad to 1, 2, 4 or 8k)."""
    if max_num_seqs <= 2:
        padded = max_num_seqs
    elif max_num_seqs <= 4:
        padded = 4
    else:
        padded = (max_num_seqs + 7) // 8 * 8
    return [b for b in CUDA_GRAPH_BATCH_SIZES if b <= padded]


def graph_memory_bytes(max_num_seqs: int, num_layers_per_rank: int, hidden_size: int) -> int:
    """Memory the decode CUDA graphs take per GPU.

    Calibrated between two observations: #7553 (0.5.4, Yi-34B TP4, default max_num_seqs 256: 2464 MiB
    per GPU measured; this gives 2765 MiB, 12 % more) and the field notes (InternLM2-20B-sized model at
    TP=8, default max_num_seqs 256: 2.18 GiB, more than the 2.11 GiB left after the KV cache at 0.95,
    so capture OOMs as in their first attempt, and less than the 3.06 GiB left at 0.92).
    """
    sizes = graph_batch_sizes(max_num_seqs)
    if not sizes:
        return 0
    objects = len(sizes) * num_layers_per_rank * GRAPH_BYTES_PER_BATCH_PER_LAYER
    pool = max(sizes) * hidden_size * 2 * GRAPH_ACTIVATION_FACTOR
    return int(objects + pool)


def graph_capture_seconds(max_num_seqs: int) -> float:
    return GRAPH_CAPTURE_SECONDS_PER_BATCH * len(graph_batch_sizes(max_num_seqs))


def optional_float(value: Optional[str], default: float) -> float:
    try:
        return float(value) if value not in (None, "") else default
    except ValueError:
        return default
