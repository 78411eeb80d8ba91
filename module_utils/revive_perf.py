"""How long vLLM 0.5.4 takes on a GPU set: one performance model for the planner and for the lab twin.

The planner (module_utils/revive_plan/layout.py) asks it which tensor-parallel layout serves a workload best;
the twin (lab/vllm_twin/src/vllm/_twin/perf.py) asks it how long each simulated engine step takes. Both read
the same datasheets, engine-loop costs and NCCL transports from here; data/field-calibration.yml holds the
field table both are calibrated against, and tests/unit/test_perf_calibration.py checks both against it.

One engine step of 0.5.4 (V0 engine: one forward pass per step; without chunked prefill a step is all
prefill or all decode) on one replica of TP ranks costs

    cpu     = CPU_STEP_S + CPU_SEQ_S x sequences + CPU_PREFILL_TOKEN_S x prompt tokens + CPU_WORKER_S x (TP - 1)
              (0.5.4's Python engine loop: schedule, prepare, sample, detokenise; the mp executor broadcasts
              to every extra worker)
    weights = weight bytes / TP / (HBM_EFFICIENCY x HBM bandwidth)       decode reads every weight once
    flops   = 2 x parameters x tokens / TP / (PREFILL_MFU x FP16 peak)   prefill GEMMs (a step pays the larger)
    kv      = decoded context tokens x KV bytes/token / TP / (ATTENTION_HBM_EFFICIENCY x HBM bandwidth)
    launch  = EAGER_LAUNCH_PER_LAYER_S x layers in eager mode, GRAPH_REPLAY_S when a CUDA graph replays
    comm    = 2 x layers x all-reduce(tokens x hidden x 2 bytes)         two all-reduces per layer
    all-reduce(m) = latency + blend(m) x 2 (TP - 1) / TP x m / bandwidth
    latency = base + 2 (TP - 1) x per ring step [+ SOCKET_CROSSING_S when the ring crosses sockets]

A ring all-reduce takes 2 (TP - 1) steps and QPI/UPI adds a hop. Small messages (decode) run NCCL's
low-latency protocols, whose bytes hide behind the latency; large ones (prefill, decode of big batches: the
field table's knee at 64 streams) pay the full bandwidth: `blend` switches steeply around
NCCL_PROTOCOL_SWITCH_BYTES moved. Transports follow NCCL's choice: NVLink, PCIe P2P, shared host memory, or
with NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1 (the field setting) the network transport over loopback
sockets, the slowest.

`PerfModel.step` evaluates one step; the twin runs it step by step under its scheduler. `closed_loop` is the
planner's closed form of the same costs for `b` streams in a closed loop, each with a prompt of P tokens and
O output tokens:

    step(b)     = cpu(b sequences) + weights + launch + 2 x layers x latency + kv(b x (P + O / 2))
    prefill(P)  = flops(P) + 2 x layers x 2 (TP - 1) / TP x P x hidden x 2 B / prompt bandwidth
                  + CPU_PREFILL_TOKEN_S x P
    step_eff(b) = step(b) + b x prefill(P) / O    0.5.4 never mixes prefill and decode: every stream's prompt
                                                  stalls the batch once per O output tokens
    per stream  = 1 / step_eff(b); replica throughput = b / step_eff(b)
    TTFT p50    = step_eff(b) + TTFT_QUEUE_FACTOR x b x prefill(P)
    e2e p95     = TTFT p50 + P95_OUTPUT_FRACTION x O x step_eff(b)    (P95 response = 90 % of max_tokens)

Across nodes (issue 16), `pipeline_loop`: one replica of S stages, TP ranks inside each node, the stages linked
by the node network. 0.5.4 runs one scheduler (virtual engine) per stage, so S micro-batches of b = ceil(streams /
S) sequences are in flight, each stage busy with a different one; a token of one stream passes every stage:

    stage(b)    = step(b) of the stage's layers and weights (the same terms as above)
    hop(m)      = NODE_HOP_S + m tokens x 2 x hidden x 2 B / link bandwidth   hidden + residual per token
                  (v0.5.4 llama.py:331-334), sent stage to stage (send-allgather: each TP rank sends 1/TP)
    token(b)    = S x stage(b) + (S - 1) x hop(b)
    prefill(P)  = S x stage prefill(P) + (S - 1) x hop(P) + CPU_PREFILL_TOKEN_S x P
    step_eff(b) = token(b) + b x prefill(P) / O, and per stream, TTFT and e2e as above; throughput =
                  streams / step_eff(b): fewer streams than stages leave stages idle (the pipeline bubble)

The closed form leaves out what only matters step by step: the bandwidth part of decode all-reduces (below
the protocol switch), flops against weights in decode, prefill attention, swapping.

Calibration (docs/field-report.md ('Results')): 8x V100-PCIe, a 20B FP16 model (InternLM2-20B shape), TP 8
across both sockets with P2P and SHM disabled, prompts of at most 256 tokens, max_tokens 200. Fitted to it:
the network transport's bandwidth (by the twin's simulation), NET_PROMPT_BANDWIDTH and TTFT_QUEUE_FACTOR (by
the closed form); every other constant is a datasheet value or an engine-loop cost. The other transports keep
the same shape with textbook ratios; they are not measured, and layouts other than the anchor are predictions.

Where the planner's and the twin's separate fits disagreed, one value was kept (see each constant): the
planner's wherever it reaches a plan, so the plans stay what they were, and the twin's bandwidth of the
network transport, refitted under the planner's step costs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class GpuSpec:
    """Peak dense FP16 tensor throughput and memory bandwidth (vendor datasheets)."""

    fp16_flops: float
    memory_bandwidth: float  # bytes/s
    pcie_bandwidth: float  # bytes/s host<->device, for swapping and weight loading


# Matched against the NVML name, first match wins. The twin's table; the planner's copy held the same values
# for every GPU and architecture both listed, and lacked H200, P40, Kepler and Maxwell.
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
    """The datasheet row of an NVML name, else the architecture's, else Volta's."""
    for pattern, spec in GPU_SPECS:
        if pattern in name:
            return spec
    return ARCH_FALLBACK.get(architecture, ARCH_FALLBACK["volta"])


# Engine loop of 0.5.4. CPU_STEP_S: the planner's 4.5 ms over the twin's 3 ms; with it the planner's plans
# stay as they were, and the twin still meets the field table (its refitted network bandwidth absorbs it).
CPU_STEP_S = 0.0045
CPU_SEQ_S = 0.00006             # per scheduled sequence per step
CPU_PREFILL_TOKEN_S = 0.000002  # input preparation per prompt token
CPU_WORKER_S = 0.0002           # mp executor: broadcast to each extra worker per step
EAGER_LAUNCH_PER_LAYER_S = 0.00006  # kernel launches per layer in eager mode
GRAPH_REPLAY_S = 0.0004         # one CUDA graph launch per decode step
HBM_EFFICIENCY = 0.8            # fraction of peak bandwidth a GEMV-bound decode reaches
ATTENTION_HBM_EFFICIENCY = 0.45  # paged-attention v1 KV reads on xFormers/Volta
PREFILL_MFU = 0.35              # model FLOPs utilisation of prefill GEMMs (FP16 tensor cores)


@dataclass(frozen=True)
class TransportCost:
    """An NCCL transport's ring all-reduce: latency per call and bus bandwidth of large messages."""

    base_latency: float      # seconds
    per_step_latency: float  # seconds per ring step
    bandwidth: float         # bytes/s


# The planner's latencies: they grow with the ring's steps, where the twin had one figure per transport
# whatever the TP size (NVLink 15 us, P2P 25, SHM 40, SHM across sockets 55, network 75), and the planner's
# calibration fixes the network's at TP 8 across sockets (121 us). The planner's bandwidths, but the
# network's: the twin's simulation fits it (2.1 GB/s under its old 3 ms step and 75 us, 2.5 GB/s under the
# costs above). The planner's 12 GB/s there was a fit of its closed form, not a link speed (it made the
# network transport faster than P2P and SHM, which it never is): NET_PROMPT_BANDWIDTH keeps it.
TRANSPORTS: Dict[str, TransportCost] = {
    "nvlink": TransportCost(8e-6, 1e-6, 60e9),
    "p2p": TransportCost(10e-6, 3e-6, 10e9),
    "shm": TransportCost(12e-6, 4e-6, 8e9),
    "net": TransportCost(15e-6, 7e-6, 2.5e9),
}
SOCKET_CROSSING_S = 8e-6        # a ring across sockets adds a QPI/UPI hop
RING_FACTOR_NUMERATOR = 2.0     # a ring all-reduce moves 2(n-1)/n of the message per rank
NCCL_PROTOCOL_SWITCH_BYTES = 1.4 * MiB
NCCL_PROTOCOL_SWITCH_SHARPNESS = 6.0  # NCCL picks one protocol per size: a steep, not gradual, change

# The closed form's fitted numbers. It charges every prompt the workload's typical prompt (the field's cap,
# 256 tokens) and queues TTFT_QUEUE_FACTOR prompt batches; the twin simulates the field's shorter prompts and
# the cohorts that arrive together. NET_PROMPT_BANDWIDTH is the rate the closed form charges a prompt's
# all-reduce bytes on the network transport; with the queue factor it reproduces the field TTFT. The two
# agree: at the anchor 1.57 x the closed form's 77 ms prefill of 256 tokens is 121 ms, and the step model
# charges each prompt of a 32-prompt cohort of the twin's 121-token prompts 116 ms.
TTFT_QUEUE_FACTOR = 1.57
NET_PROMPT_BANDWIDTH = 12e9
P95_OUTPUT_FRACTION = 0.9


def allreduce_latency(transport: str, tensor_parallel_size: int, crosses_socket: bool) -> float:
    """Seconds of one ring all-reduce's latency on `transport` over `tensor_parallel_size` ranks."""
    cost = TRANSPORTS[transport]
    return (cost.base_latency + 2 * (tensor_parallel_size - 1) * cost.per_step_latency
            + (SOCKET_CROSSING_S if crosses_socket else 0.0))


def ring_factor(tensor_parallel_size: int) -> float:
    """Share of the message each rank moves in a ring all-reduce."""
    return RING_FACTOR_NUMERATOR * (tensor_parallel_size - 1) / tensor_parallel_size


def prompt_bandwidth(transport: str) -> float:
    """Bytes/s the closed form charges a prompt's all-reduces (the transport's, but NET_PROMPT_BANDWIDTH)."""
    return NET_PROMPT_BANDWIDTH if transport == "net" else TRANSPORTS[transport].bandwidth


def cpu_seconds(sequences: int, prompt_tokens: int, tensor_parallel_size: int) -> float:
    """The engine loop's share of one step."""
    return (CPU_STEP_S + CPU_SEQ_S * sequences + CPU_PREFILL_TOKEN_S * prompt_tokens
            + CPU_WORKER_S * (tensor_parallel_size - 1))


def weight_read_seconds(weight_bytes: int, tensor_parallel_size: int, spec: GpuSpec) -> float:
    return weight_bytes / tensor_parallel_size / (spec.memory_bandwidth * HBM_EFFICIENCY)


def kv_read_seconds(context_tokens: float, kv_bytes_per_token: int, tensor_parallel_size: int,
                    spec: GpuSpec) -> float:
    return context_tokens * kv_bytes_per_token / tensor_parallel_size / (spec.memory_bandwidth
                                                                          * ATTENTION_HBM_EFFICIENCY)


def gemm_seconds(parameter_count: int, tokens: int, tensor_parallel_size: int, spec: GpuSpec) -> float:
    return 2.0 * parameter_count * tokens / tensor_parallel_size / (spec.fp16_flops * PREFILL_MFU)


def launch_seconds(num_layers: int, graphs: bool) -> float:
    return GRAPH_REPLAY_S if graphs else EAGER_LAUNCH_PER_LAYER_S * num_layers


@dataclass(frozen=True)
class ModelShape:
    """What the step time needs of the model (from module_utils/revive_model.py facts)."""

    parameter_count: int
    weight_bytes: int
    num_layers: int
    hidden_size: int
    kv_bytes_per_token: int  # K and V of one token over all layers, all heads, in the KV dtype


@dataclass(frozen=True)
class Transport:
    """The NCCL transport of one tensor-parallel group, at its size."""

    name: str                 # nvlink | p2p | shm | net | none
    latency: float            # seconds per all-reduce (per call, all hops)
    bandwidth: float          # bytes/s of ring bus bandwidth for large messages
    description: str


def group_transport(name: str, tensor_parallel_size: int, crosses_socket: bool, description: str) -> Transport:
    """Transport `name` (a TRANSPORTS key, or "none" for one GPU) for a group of that size."""
    if name == "none" or tensor_parallel_size <= 1:
        return Transport("none", 0.0, float("inf"), description)
    return Transport(name, allreduce_latency(name, tensor_parallel_size, crosses_socket),
                     TRANSPORTS[name].bandwidth, description)


# Paths between two GPUs that cross a PCIe host bridge (nvidia-smi topo -m): NCCL's P2P does not go there on
# the field's boxes (docs/field-report.md: P2P across SYS hung at "connecting to").
PCIE_HOST_PATHS = ("PHB", "NODE", "SYS", "SOC")


def nvlink_reaches_all(members: Sequence[int], nvlink_pairs: Sequence[Tuple[int, int]]) -> bool:
    """Does every GPU of `members` reach every other through NVLink hops? NCCL builds its rings over NVLink then,
    though not every pair has a link (DGX-1's hybrid cube mesh)."""
    members = list(members)
    if len(members) <= 1:
        return False
    reach, frontier = {members[0]}, [members[0]]
    while frontier:
        node = frontier.pop()
        for a, b in nvlink_pairs:
            other = b if a == node else a if b == node else None
            if other is not None and other not in reach:
                reach.add(other)
                frontier.append(other)
    return reach == set(members)


def nccl_transport(tensor_parallel_size: int, nvlink_connected: bool, p2p_everywhere: bool, p2p_disabled: bool,
                   shm_disabled: bool) -> str:
    """NCCL's transport for one tensor-parallel group, the one choice the planner and the twin share: NVLink when
    NVLink connects the group (and NCCL_P2P_DISABLE is unset); PCIe P2P when every pair can use it without a host
    bridge; shared host memory; with NCCL_SHM_DISABLE=1 as well, the network transport over loopback sockets."""
    if tensor_parallel_size <= 1:
        return "none"
    if nvlink_connected and not p2p_disabled:
        return "nvlink"
    if p2p_everywhere and not p2p_disabled:
        return "p2p"
    return "net" if shm_disabled else "shm"


@dataclass(frozen=True)
class StepCost:
    """One engine step: seconds and how they split (the split feeds the GPU utilisation report)."""

    seconds: float
    gpu_busy_seconds: float
    memory_busy_seconds: float


@dataclass
class PerfModel:
    """Step costs of one replica."""

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
        moved = ring_factor(tp) * message_bytes
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
        cpu = cpu_seconds(len(prefill_lengths) + decode_seqs, prefill_tokens, tp)
        weights = weight_read_seconds(m.weight_bytes, tp, s)
        flops = gemm_seconds(m.parameter_count, tokens, tp, s)
        prefill_attention = sum(length * length for length in prefill_lengths) * 4.0 * m.hidden_size \
            * m.num_layers / tp / (s.fp16_flops * PREFILL_MFU)
        kv_read = kv_read_seconds(sum(decode_contexts), m.kv_bytes_per_token, tp, s)
        graphs = (not self.enforce_eager and prefill_tokens == 0 and 0 < decode_seqs <= self.max_graph_batch)
        launches = launch_seconds(m.num_layers, graphs)
        gpu = max(weights, flops) + prefill_attention + kv_read + launches
        comm = self.communication_seconds(tokens)
        swap = swapped_blocks * block_bytes / s.pcie_bandwidth if block_bytes else 0.0
        seconds = (cpu + gpu + comm + swap) * self.slowdown
        # NCCL kernels spin while they wait, so communication counts as busy, as nvidia-smi shows it.
        return StepCost(seconds, (gpu + comm + swap) * self.slowdown, (weights + kv_read) * self.slowdown)


@dataclass
class Prediction:
    """The closed form for one replica: per-step times, speeds, latencies (rounded as plans show them)."""

    step_ms: float
    prefill_ms: float
    per_stream_tok_s: float
    throughput_tok_s: float
    ttft_p50_s: float
    e2e_p95_s: float
    allreduce_latency_us: float
    pipeline_stages: int = 1
    stage_hop_ms: float = 0.0


# One stage-to-stage send over the node network (NCCL over sockets plus the Ray RPC of the next step's request,
# v0.5.4 ray_gpu_executor.py:479-508): a TCP round trip's order, not measured on hardware.
NODE_HOP_S = 200e-6


def tp_communication(transport: str, tensor_parallel_size: int, crosses_socket: bool) -> Tuple[float, float, float]:
    """(all-reduce latency, prompt bandwidth, ring factor) of a TP group; no communication at TP 1."""
    if tensor_parallel_size > 1:
        return (allreduce_latency(transport, tensor_parallel_size, crosses_socket), prompt_bandwidth(transport),
                ring_factor(tensor_parallel_size))
    return 0.0, 1.0, 0.0


def _prediction(step: float, prefill: float, batch: int, streams: int, output_tokens: int,
                latency: float) -> Prediction:
    """The closed form's tail: `batch` streams per scheduler, `streams` in all (see the module docstring)."""
    step_eff = step + batch * prefill / output_tokens
    ttft = step_eff + TTFT_QUEUE_FACTOR * batch * prefill
    e2e = ttft + P95_OUTPUT_FRACTION * output_tokens * step_eff
    return Prediction(step_ms=round(step_eff * 1000, 2), prefill_ms=round(prefill * 1000, 1),
                      per_stream_tok_s=round(1.0 / step_eff, 1), throughput_tok_s=round(streams / step_eff, 1),
                      ttft_p50_s=round(ttft, 2), e2e_p95_s=round(e2e, 2),
                      allreduce_latency_us=round(latency * 1e6, 1))


def closed_loop(model: ModelShape, spec: GpuSpec, tensor_parallel_size: int, transport: str, crosses_socket: bool,
                streams: int, prompt_tokens: int, output_tokens: int, eager: bool) -> Prediction:
    """The closed form of the module docstring for one replica serving `streams` concurrent requests."""
    tp, layers, hidden = tensor_parallel_size, model.num_layers, model.hidden_size
    latency, bus, ring = tp_communication(transport, tp, crosses_socket)
    b = max(streams, 1)
    context = prompt_tokens + output_tokens / 2
    step = (cpu_seconds(b, 0, tp) + weight_read_seconds(model.weight_bytes, tp, spec)
            + launch_seconds(layers, not eager) + 2 * layers * latency
            + kv_read_seconds(b * context, model.kv_bytes_per_token, tp, spec))
    prefill = (gemm_seconds(model.parameter_count, prompt_tokens, tp, spec)
               + 2 * layers * ring * prompt_tokens * hidden * 2 / bus + CPU_PREFILL_TOKEN_S * prompt_tokens)
    return _prediction(step, prefill, b, b, output_tokens, latency)


def stage_hop_seconds(tokens: float, hidden_size: int, link_bytes_per_s: float) -> float:
    """One stage-to-stage send of `tokens` tokens (hop(m) above): NODE_HOP_S plus hidden + residual in FP16 per
    token (v0.5.4 vllm/model_executor/models/llama.py:331-334) over the link."""
    return NODE_HOP_S + tokens * 2 * hidden_size * 2 / link_bytes_per_s


def pipeline_loop(stage: ModelShape, spec: GpuSpec, tensor_parallel_size: int, transport: str,
                  crosses_socket: bool, streams: int, prompt_tokens: int, output_tokens: int, eager: bool,
                  stages: int, link_bytes_per_s: float) -> Prediction:
    """The closed form of the module docstring for one replica of `stages` pipeline stages across nodes, `stage`
    being the largest stage's shape (its layers, weights and KV bytes per token)."""
    if stages < 1 or link_bytes_per_s <= 0:
        raise ValueError(f"stages {stages} and link bandwidth {link_bytes_per_s} must be positive")
    tp, layers, hidden = tensor_parallel_size, stage.num_layers, stage.hidden_size
    latency, bus, ring = tp_communication(transport, tp, crosses_socket)
    b = max(-(-max(streams, 1) // stages), 1)
    context = prompt_tokens + output_tokens / 2
    stage_step = (cpu_seconds(b, 0, tp) + weight_read_seconds(stage.weight_bytes, tp, spec)
                  + launch_seconds(layers, not eager) + 2 * layers * latency
                  + kv_read_seconds(b * context, stage.kv_bytes_per_token, tp, spec))

    def hop(tokens: float) -> float:
        return stage_hop_seconds(tokens, hidden, link_bytes_per_s)

    token = stages * stage_step + (stages - 1) * hop(b)
    stage_prefill = (gemm_seconds(stage.parameter_count, prompt_tokens, tp, spec)
                     + 2 * layers * ring * prompt_tokens * hidden * 2 / bus)
    prefill = stages * stage_prefill + (stages - 1) * hop(prompt_tokens) + CPU_PREFILL_TOKEN_S * prompt_tokens
    prediction = _prediction(token, prefill, b, max(streams, 1), output_tokens, latency)
    prediction.pipeline_stages = stages
    prediction.stage_hop_ms = round(hop(b) * 1000, 3) if stages > 1 else 0.0
    return prediction
