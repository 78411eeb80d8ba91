"""How long things take on the simulated hardware: engine steps, model load, CUDA-graph capture.

The step time is module_utils/revive_perf.py's performance model, the one the planner uses (the wheel carries
a copy, vllm/_revive); this file picks NCCL's transport from the twin's topology facts and keeps what only the
twin models: start-up timing and the memory of the CUDA graphs.

The transport is the planner's choice (revive_perf.nccl_transport): NVLink when NVLink hops connect the group;
else PCIe P2P where NVML reports P2P supported between every pair and no path crosses a host bridge (and
NCCL_P2P_DISABLE is unset); else shared host memory (SHM; its ring crosses sockets when the slowest path is SYS);
else, with NCCL_SHM_DISABLE=1 as well, the network transport over loopback sockets, the slowest (the field
setting).

Pipeline parallelism (PP > 1): `PipelineModel`, the step-by-step form of revive_perf.pipeline_loop (the planner's
cost of TP inside a node, PP across nodes). One step of a virtual engine passes every stage: S x the stage's step
(the largest stage's layers and weights), (S - 1) stage-to-stage sends of hidden + residual (revive_perf's `stage_hop_seconds`),
the prompt tokens' input preparation once. The S virtual engines step concurrently, each stage busy with a
different one's micro-batch (runner.py), which is how pipeline_loop's throughput arises.

CALIBRATION: tests/unit/test_perf_calibration.py runs the engine in virtual time (calibrate.py) for 8x
V100-PCIe, a 20B FP16 model, TP=8 with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 and the field flags against
data/field-calibration.yml (docs/field-report.md ('Results')).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

from vllm._revive import module_utils

_perf = module_utils("revive_perf")
GiB: int = _perf.GiB
MiB: int = _perf.MiB
GpuSpec = _perf.GpuSpec
ModelShape = _perf.ModelShape
PerfModel = _perf.PerfModel
StepCost = _perf.StepCost
Transport = _perf.Transport
gpu_spec = _perf.gpu_spec


_DESCRIPTIONS = {
    "none": "single GPU, no collective communication",
    "nvlink": "NVLink connects every GPU of the group (NCCL rings over NVLink hops)",
    "p2p": "PCIe P2P (slowest path {path})",
    "shm": "shared host memory ({reason}; slowest path {path})",
    "net": ("network transport over loopback sockets (NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1): routed through "
            "host memory, the slowest"),
}


def choose_transport(tensor_parallel_size: int, nvlink_connected: bool, all_p2p: bool, slowest_path: str,
                     p2p_disabled: bool, shm_disabled: bool) -> Transport:
    """NCCL's transport for the group: revive_perf.nccl_transport, the planner's choice, from the twin's topology
    facts (P2P needs NVML's P2P status between every pair and no path across a host bridge)."""
    crosses = slowest_path == "SYS"
    p2p_everywhere = all_p2p and slowest_path not in _perf.PCIE_HOST_PATHS
    name = _perf.nccl_transport(tensor_parallel_size, nvlink_connected, p2p_everywhere, p2p_disabled, shm_disabled)
    reason = "NCCL_P2P_DISABLE=1" if p2p_disabled else "no P2P between every pair"
    return _perf.group_transport(name, tensor_parallel_size, crosses and name != "none",
                                 _DESCRIPTIONS[name].format(path=slowest_path, reason=reason))


# --- pipeline parallelism (issue 16) ------------------------------------------------------------------------


@dataclass
class PipelineModel:
    """Step costs of one replica of `stages` pipeline stages: `stage` is the largest stage's PerfModel (its layers,
    weights and KV bytes per token, TP ranks of one node), `link_bytes_per_s` the link between the stages."""

    stage: PerfModel
    stages: int
    link_bytes_per_s: float

    def step(self, prefill_lengths: Sequence[int], decode_contexts: Sequence[int],
             swapped_blocks: int = 0, block_bytes: int = 0) -> StepCost:
        """One virtual engine's step through every stage, as revive_perf.pipeline_loop composes it: S stage steps
        (their engine-loop CPU share included, as its stage(b) is), the input preparation of the prompt tokens
        once, and S - 1 hops. The GPUs of each stage are busy for one stage step of it."""
        one = self.stage.step(prefill_lengths, decode_contexts, swapped_blocks, block_bytes)
        if self.stages == 1 or one.seconds == 0:
            return one
        tokens = sum(prefill_lengths) + len(decode_contexts)
        prompt_once = (self.stages - 1) * _perf.CPU_PREFILL_TOKEN_S * sum(prefill_lengths)
        hops = (self.stages - 1) * _perf.stage_hop_seconds(tokens, self.stage.model.hidden_size, self.link_bytes_per_s)
        seconds = self.stages * one.seconds + (hops - prompt_once) * self.stage.slowdown
        return StepCost(seconds, one.gpu_busy_seconds, one.memory_busy_seconds)


StepModel = Union[PerfModel, PipelineModel]


# --- start-up timing --------------------------------------------------------------------------------
PROCESS_INIT_SECONDS = 9.0       # interpreter, torch import, CUDA context, worker processes
NCCL_INIT_SECONDS_PER_RANK = 0.6  # NCCL communicator set-up per rank (TP > 1)
WEIGHT_LOAD_BYTES_PER_SECOND = 650e6  # safetensors from local SSD into GPU memory, all ranks together
PROFILE_RUN_SECONDS = 3.0        # the profiling forward pass
GRAPH_CAPTURE_SECONDS_PER_BATCH = 0.6  # per captured decode batch size


def load_seconds(weight_bytes: int) -> float:
    """Model load: proportional to the weight bytes (docs/field-report.md ('Software stack that worked'): 41 GB
    from local SSD, cold start 1-2 min)."""
    return weight_bytes / WEIGHT_LOAD_BYTES_PER_SECOND


def init_seconds(tensor_parallel_size: int) -> float:
    return PROCESS_INIT_SECONDS + (NCCL_INIT_SECONDS_PER_RANK * tensor_parallel_size
                                   if tensor_parallel_size > 1 else 0.0)


# --- CUDA graph memory (0.5.4 captures after the KV cache is allocated, outside the budget) ---------
# docs/facts/vllm-volta.md §1.5, §7.2: [1, 2, 4] + [8*i for i in 1..32], capped at the padded max_num_seqs.
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
    per GPU measured; this gives 2765 MiB, 12 % more) and docs/field-report.md ('Failures met') 1
    (InternLM2-20B-sized model at TP=8, default max_num_seqs 256: 2.18 GiB, more than the 2.11 GiB left
    after the KV cache at 0.95, so capture OOMs as in their first attempt, and less than the 3.06 GiB left
    at 0.92).
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
