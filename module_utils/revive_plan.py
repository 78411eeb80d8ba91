"""The planner: GPU facts (interface B) + model facts (interface C) + workload -> a vLLM release to run.

``plan_release`` returns a release description - vLLM version and pins, the server argv, the
environment, the replica layout (GPU indices, CUDA_VISIBLE_DEVICES, port, CPUs/NUMA node), a KV-cache
estimate, one reason per decision with its source, warnings - or raises ``PlanRefusal`` with the reason
when the hardware/model/release combination will not run. Sources: "notes" = shared/docs/field-notes.md,
"ref §x" = shared/reference/vllm-0.5.4-and-volta.md, "data" = data/vllm-releases.yml.

Rules (each has a test in tests/unit/test_plan*.py):

* Release: the operator's pin, else the data's default for the lowest compute capability; refused when
  the release has no kernels for the CC (min_compute_capability, the Volta cut-offs: 0.20+ refused), when
  the driver branch or CUDA driver version is below the release's, or its engine is "none" on this CC;
  refused when a compiled dependency of the release (vLLM's _C, xFormers, torch: the data's ``kernels``,
  scanned from the wheels) has no code for the GPU's sm, and when the package source is PyPI but the
  release's dependencies can no longer be satisfied from it (the data's ``installability``: 0.5.4).
* dtype ``half`` on CC < 8.0 (0.5.4 never falls back: ``auto`` + BF16 weights dies at start, ref §1.4);
  BF16 weights on Volta are a warning that the sync role converts them (or a refusal when conversion
  is not allowed). On CC >= 8.0 the checkpoint dtype (bfloat16/float16) is kept.
* ``--enforce-eager`` and ``VLLM_ATTENTION_BACKEND=XFORMERS`` on Volta; ``--gpu-memory-utilization`` 0.92
  on Volta (notes: 0.95 OOM'd), the release default elsewhere.
* Quantization: the release's minimum CC per method (AWQ 7.5, Marlin/FP8 8.0: refused below), GPTQ on
  Volta allowed with the notes' warning, bitsandbytes only at TP 1.
* Tensor parallel size: divides the attention heads, divides (or is a multiple of) the KV heads, fits
  weights + profile peak + a KV floor; chosen among 1, 2, 4, 8 ... by the cost model below.
* NCCL: ``NCCL_P2P_DISABLE=1`` and ``NCCL_SHM_DISABLE=1`` only for a replica whose GPUs have no NVLink
  and whose paths cross PHB/NODE/SYS; never with NVLink. ``--disable-custom-all-reduce`` when TP > 1 and
  the replica is not fully NVLink-connected (TP 2 on PCIe keeps it on and hangs, ref §7.1; above 2 vLLM
  disables it anyway, the flag silences the warning). ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and
  ``CUDA_VISIBLE_DEVICES`` per replica.
* ``--max-num-batched-tokens`` >= ``--max-model-len`` (0.5.4 refuses otherwise, ref §3.5) and >=
  ``--max-num-seqs``; ``--max-num-seqs`` from the expected concurrency and the KV capacity;
  ``--swap-space`` bounded by host RAM (pinned at start by every worker of every replica, ref §3.4).
* ``--disable-frontend-multiprocessing`` on 0.5.4 when metrics are wanted (ref §4.2);
  ``--disable-log-requests`` where requests are logged by default (0.5.4).
* Every emitted flag is checked against the release's argument table: an unknown flag or a bad choice
  raises ``PlanError`` (a planner bug), never a server that dies at start.
* KV estimate by ``revive_kv`` with the release's own sizing.

Cost model (``predict_layout``), per replica serving ``b`` streams, all times per engine step:

    step(b)   = CPU + HBM + LAUNCH + COMM + KV(b)
      CPU     = 4.5 ms + 0.06 ms x b + 0.2 ms x (TP - 1)   0.5.4's Python engine loop; the mp executor
                                                           broadcasts to every extra worker
      HBM     = weight bytes / TP / (0.8 x HBM bandwidth)  decode reads every weight once per step
      LAUNCH  = 0.06 ms x layers in eager mode, 0.4 ms with CUDA graphs
      COMM    = 2 x layers x latency(TP, transport)        two all-reduces per layer, latency-bound
                latency = base + 2 (TP - 1) x per-step [+ 8 us when the ring crosses sockets]
                (a ring all-reduce takes 2 (TP - 1) steps; QPI/UPI adds a hop)
      KV(b)   = b x context x KV bytes/token / TP / (0.45 x HBM bandwidth)   paged-attention reads
    prefill(P) = 2 x parameters x P / TP / (0.35 x FP16 peak) + 2 x layers x 2 (TP-1)/TP x P x H x 2 B
                 / bus bandwidth(transport) + 2 us x P     (prompts are prefilled in batches, so the
                 per-step latencies amortise and the bytes remain)
    step_eff(b) = step(b) + b x prefill(P) / O             0.5.4 never mixes prefill and decode in one
                                                           step: every stream's prompt stalls the batch
                                                           once per O output tokens
    stream speed = 1 / step_eff(b); replica throughput = b / step_eff(b)
    TTFT p50  = step_eff(b) + 1.57 x b x prefill(P)        empirical queueing of prompt batches
    e2e p95   = TTFT p50 + 0.9 x O x step_eff(b)           P95 response = 90 % of max_tokens (EOS)

Transports (latency base / per ring step / bus bandwidth): NVLink 8 us / 1 us / 60 GB/s; PCIe P2P
10 us / 3 us / 10 GB/s; shared memory 12 us / 4 us / 8 GB/s; NCCL's network transport (P2P and SHM
disabled, the notes' setting) 15 us / 7 us / 12 GB/s.

Calibration: the anchor is the notes' box and model: 8x V100-PCIe, a 20B FP16 model (InternLM2-20B
shape), TP 8 across both sockets with P2P/SHM disabled, prompts <= 256 tokens, max_tokens 200. The model
gives 28.7 / 23.7 / 17.5 tok/s per stream at concurrency 16 / 32 / 64 (notes: ~29 / 24 / 18), TTFT p50
2.0 / 3.9 s at 16 / 32 (notes 2.1 / 3.9) and p95 e2e 11.5 s at 32 (notes: met 12 s) and 17.5 s at 64
(notes: rejected). The net transport's 12 GB/s and the 1.57 queueing factor are the two fitted numbers;
the remaining constants are datasheet values and the lab twin's engine-loop constants. Only the anchor
is measured: other layouts are predictions of the same model, and are reported as such.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible.module_utils.revive_kv import GiB, KvEstimate, kv_bytes_per_token, kv_cache_plan
from ansible.module_utils.revive_releases import Release, ReleaseData, ReleaseDataError, parse_cc

NOTES = "field notes"
PCIE_HOST_PATHS = ("PHB", "NODE", "SYS", "SOC")
PATH_ORDER = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")
ARCHITECTURE_BY_CC = ((9, "hopper"), (8, "ampere"), (7, "volta"), (6, "pascal"), (5, "maxwell"), (3, "kepler"))

# Cost-model constants (see the module docstring).
CPU_STEP_S = 0.0045
CPU_SEQ_S = 0.00006
CPU_WORKER_S = 0.0002
CPU_PREFILL_TOKEN_S = 0.000002
EAGER_LAUNCH_PER_LAYER_S = 0.00006
GRAPH_REPLAY_S = 0.0004
HBM_EFFICIENCY = 0.8
ATTENTION_HBM_EFFICIENCY = 0.45
PREFILL_MFU = 0.35
SOCKET_CROSSING_S = 8e-6
TTFT_QUEUE_FACTOR = 1.57
P95_OUTPUT_FRACTION = 0.9
TRANSPORTS = {  # name: (base latency s, per ring step s, bus bandwidth bytes/s)
    "nvlink": (8e-6, 1e-6, 60e9),
    "p2p": (10e-6, 3e-6, 10e9),
    "shm": (12e-6, 4e-6, 8e9),
    "net": (15e-6, 7e-6, 12e9),
}
# Peak dense FP16 tensor FLOP/s and HBM bandwidth (vendor datasheets); first name match wins.
GPU_PERF = (
    ("V100-SXM2", 125e12, 900e9), ("V100", 112e12, 900e9), ("T4", 65e12, 320e9),
    ("A100-SXM4-80GB", 312e12, 2039e9), ("A100", 312e12, 1555e9), ("H100", 989e12, 3350e9),
    ("L4", 121e12, 300e9), ("A10", 125e12, 600e9), ("P100", 18.7e12, 732e9),
)
ARCH_PERF = {"pascal": (18e12, 500e9), "volta": (112e12, 900e9), "turing": (65e12, 320e9),
             "ampere": (150e12, 900e9), "ada": (180e12, 800e9), "hopper": (989e12, 3350e9)}

# Defaults from the notes' workload ("Acceptance targets", "Load test method").
NOTES_MAX_MODEL_LEN = 4096
NOTES_CONCURRENCY = 32
NOTES_SLO_P95_S = 12.0
NOTES_OUTPUT_TOKENS = 200
NOTES_PROMPT_TOKENS = 256
NOTES_SWAP_SPACE_GIB = 16
NOTES_BATCHED_TOKENS = 8192
VOLTA_GPU_MEMORY_UTILIZATION = 0.92
MAX_NUM_SEQS_HEADROOM = 4          # notes: --max-num-seqs 128 for concurrency 32
HOST_SWAP_FRACTION = 0.4           # vLLM warns above 40 % (ref §3.4); bounded host-wide here
TIE_MARGIN = 0.03                  # throughput within 3 %: prefer fewer replicas


class PlanRefusal(Exception):
    """The combination will not run; `reason` says why and what to change, `source` where the rule is."""

    def __init__(self, reason: str, source: str):
        super().__init__(reason)
        self.reason = reason
        self.source = source


class PlanError(Exception):
    """The planner produced something the release would reject (a bug in the planner or the data)."""


@dataclass
class Workload:
    max_model_len: Optional[int] = None
    concurrency: int = NOTES_CONCURRENCY
    slo_p95_e2e_s: float = NOTES_SLO_P95_S
    slo_output_tokens: int = NOTES_OUTPUT_TOKENS
    typical_prompt_tokens: int = NOTES_PROMPT_TOKENS
    metrics: bool = True


@dataclass
class Overrides:
    vllm_version: Optional[str] = None
    tensor_parallel_size: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    swap_space: Optional[float] = None
    exclude_gpus: Sequence[int] = ()
    allow_bf16_conversion: bool = True


PUBLIC_INDEX = "https://pypi.org/simple"


@dataclass
class PackageSource:
    """Where the nodes' packages come from (the runtime role's source): the public index, a mirror, a wheelhouse."""

    type: str = "index"
    index_url: str = PUBLIC_INDEX

    @property
    def is_public_index(self) -> bool:
        return self.type == "index" and self.index_url.rstrip("/") in (PUBLIC_INDEX, "https://pypi.python.org/simple")

    def describe(self) -> str:
        return "PyPI" if self.is_public_index else f"{self.type} {self.index_url}" if self.type != "wheelhouse" \
            else "a wheelhouse"


@dataclass
class Serve:
    model_path: Optional[str] = None
    served_model_name: Optional[str] = None
    host: str = "0.0.0.0"
    base_port: int = 8000


@dataclass
class Decisions:
    reasons: List[Dict[str, Any]] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    def add(self, decision: str, value: Any, reason: str, source: str) -> None:
        self.reasons.append({"decision": decision, "value": value, "reason": reason, "source": source})


# ----------------------------------------------------------------------------------------- GPU facts

@dataclass
class GpuSet:
    facts: Dict[str, Any]
    devices: List[Dict[str, Any]]
    cc: Tuple[int, int]
    total_bytes: int
    name: str
    architecture: str

    @property
    def indices(self) -> List[int]:
        return [int(d["index"]) for d in self.devices]

    def path(self, i: int, j: int) -> str:
        return str(self.facts["topology"]["matrix"][i][j])

    def socket_of(self, index: int) -> Optional[int]:
        device = next(d for d in self.devices if int(d["index"]) == index)
        return device.get("socket")


def architecture_for_cc(cc: Tuple[int, int]) -> str:
    if cc == (7, 5):
        return "turing"
    if cc >= (8, 9) and cc < (9, 0):
        return "ada"
    for major, name in ARCHITECTURE_BY_CC:
        if cc[0] >= major:
            return name
    return "unknown"


def gpu_set_from_facts(facts: Dict[str, Any], exclude: Sequence[int], decisions: Decisions) -> GpuSet:
    devices = [d for d in facts.get("devices", []) if int(d["index"]) not in set(exclude)]
    if not devices:
        raise PlanRefusal("no GPUs to plan for: the facts list none (after excluding "
                          f"{sorted(exclude) or 'none'}). Check the driver with `bin/revive gpus`.", "GPU facts")
    ccs = {(int(d["cc_major"]), int(d["cc_minor"])) for d in devices}
    totals = {int(d["memory"]["total_bytes"]) - int(d["memory"].get("reserved_bytes") or 0) for d in devices}
    names = sorted({str(d.get("name")) for d in devices})
    if len(ccs) > 1 or len(totals) > 1:
        decisions.warnings.append(
            f"mixed GPUs ({', '.join(names)}): planning for the lowest compute capability and the smallest memory")
    cc = min(ccs)
    for device in devices:
        used = int(device["memory"].get("used_bytes") or 0)
        total = int(device["memory"]["total_bytes"])
        if used > 0.05 * total:
            decisions.warnings.append(
                f"GPU {device['index']}: {used / GiB:.1f} GiB already in use by other processes; vLLM budgets "
                "total x utilisation, not free memory, so it may OOM at start (ref §3.1). Free the GPU or "
                "exclude it.")
    return GpuSet(facts=facts, devices=devices, cc=cc, total_bytes=min(totals), name=names[0],
                  architecture=str(devices[0].get("architecture") or architecture_for_cc(cc)))


def synthetic_gpu_facts(count: int, memory_gib: float, cc: str = "7.0",
                        ram_gib: Optional[int] = None) -> Dict[str, Any]:
    """GPU facts (interface B shape) for a `COUNTxMEMORY_GIB[@CC]` what-if.

    Assumes a PCIe-only server without NVLink: up to 4 GPUs on one socket, more split evenly over two
    sockets (first half on socket 0); PHB between GPUs of a socket, SYS across sockets; P2P supported
    within a socket only; driver 535.104.05 (CUDA 12.2, the notes' driver); memory exactly MEMORY_GIB.
    """
    cc_tuple = parse_cc(cc)
    sockets = 1 if count <= 4 else 2
    per_socket = math.ceil(count / sockets)
    socket_of = [min(i // per_socket, sockets - 1) for i in range(count)]
    matrix = [["X" if i == j else ("PHB" if socket_of[i] == socket_of[j] else "SYS") for j in range(count)]
              for i in range(count)]
    p2p = [["X" if i == j else ("OK" if socket_of[i] == socket_of[j] else "CNS") for j in range(count)]
           for i in range(count)]
    arch = architecture_for_cc(cc_tuple)
    total = int(memory_gib * GiB)
    devices = []
    for i in range(count):
        cpus = list(range(socket_of[i] * 20, socket_of[i] * 20 + 20))
        devices.append({
            "index": i, "name": f"synthetic {arch} GPU ({memory_gib:g} GiB, CC {cc})",
            "pci_bus_id": f"00000000:{0x1A + i:02X}:00.0",
            "memory": {"total_bytes": total, "used_bytes": 0, "free_bytes": total},
            "compute_capability": f"{cc_tuple[0]}.{cc_tuple[1]}", "cc_major": cc_tuple[0], "cc_minor": cc_tuple[1],
            "architecture": arch, "bf16": cc_tuple >= (8, 0), "numa_node": socket_of[i], "socket": socket_of[i],
            "cpus": cpus, "cpu_affinity": f"{cpus[0]}-{cpus[-1]}", "nvlink": None, "processes": [],
        })
    return {
        "simulated": True, "synthetic": True, "driver_version": "535.104.05", "driver_branch": 535,
        "cuda_driver_version": "12.2", "count": count, "devices": devices,
        "topology": {"matrix": matrix, "p2p": {"read": p2p, "write": p2p}},
        "summary": {"nvlink": "none", "sockets": sockets,
                    "gpus_per_socket": {str(s): [i for i in range(count) if socket_of[i] == s]
                                        for s in range(sockets)},
                    "p2p_any": sockets < count, "slowest_path": "SYS" if sockets > 1 else "PHB"},
        "host": {"ram_gib": ram_gib},
        "notes": [f"SYNTHETIC: {count}x {memory_gib:g} GiB CC {cc}; assumed PCIe-only, no NVLink, "
                  f"{sockets} socket(s), PHB within a socket, SYS across"],
    }


# ------------------------------------------------------------------------------------------ layouts

@dataclass
class Group:
    gpus: List[int]
    nvlink_all: bool
    nvlink_connected: bool
    nvlink_any: bool
    slowest_path: str
    crosses_socket: bool
    host_paths: bool            # some pair crosses PHB/NODE/SYS


def _path_rank(path: str) -> int:
    key = "NV" if path.startswith("NV") else path
    return PATH_ORDER.index(key) if key in PATH_ORDER else len(PATH_ORDER)


def describe_group(gpus: GpuSet, members: List[int]) -> Group:
    pairs = [(a, b) for n, a in enumerate(members) for b in members[n + 1:]]
    paths = [gpus.path(a, b) for a, b in pairs]
    nv = {(a, b) for (a, b), p in zip(pairs, paths) if p.startswith("NV")}
    # NCCL can ring over NVLink when every GPU reaches every other through NVLink hops.
    reach = {members[0]} if members else set()
    frontier = list(reach)
    while frontier:
        node = frontier.pop()
        for a, b in nv:
            other = b if a == node else a if b == node else None
            if other is not None and other not in reach:
                reach.add(other)
                frontier.append(other)
    sockets = {gpus.socket_of(i) for i in members}
    slowest = max(paths, key=_path_rank) if paths else "X"
    return Group(
        gpus=members,
        nvlink_all=bool(pairs) and len(nv) == len(pairs),
        nvlink_connected=len(members) > 1 and reach == set(members),
        nvlink_any=bool(nv),
        slowest_path=slowest,
        crosses_socket=len(sockets - {None}) > 1,
        host_paths=any(p in PCIE_HOST_PATHS for p in paths),
    )


def form_groups(gpus: GpuSet, tensor_parallel_size: int) -> List[List[int]]:
    """Split the GPUs into TP groups: within a socket where the size allows, in index order."""
    by_socket: Dict[Any, List[int]] = {}
    for index in gpus.indices:
        by_socket.setdefault(gpus.socket_of(index), []).append(index)
    groups: List[List[int]] = []
    leftovers: List[int] = []
    for socket in sorted(by_socket, key=lambda s: (s is None, s)):
        members = by_socket[socket]
        whole = len(members) // tensor_parallel_size * tensor_parallel_size
        groups += [members[n:n + tensor_parallel_size] for n in range(0, whole, tensor_parallel_size)]
        leftovers += members[whole:]
    groups += [leftovers[n:n + tensor_parallel_size]
               for n in range(0, len(leftovers) // tensor_parallel_size * tensor_parallel_size, tensor_parallel_size)]
    return groups


def tp_divides_heads(model: Dict[str, Any], tensor_parallel_size: int) -> Optional[str]:
    """None when vLLM accepts the TP size for the model, else why not (its own check)."""
    heads, kv_heads = int(model["num_attention_heads"]), int(model["num_key_value_heads"])
    if heads % tensor_parallel_size:
        return (f"Total number of attention heads ({heads}) must be divisible by tensor parallel size "
                f"({tensor_parallel_size}).")
    if kv_heads % tensor_parallel_size and tensor_parallel_size % kv_heads:
        return (f"{kv_heads} KV heads cannot be split over {tensor_parallel_size} GPUs (vLLM needs one to "
                "divide the other).")
    return None


def transport_for(group: Group, p2p_disabled: bool, shm_disabled: bool) -> str:
    if len(group.gpus) <= 1:
        return "none"
    if group.nvlink_connected and not p2p_disabled:
        return "nvlink"
    if not p2p_disabled and not group.host_paths:
        return "p2p"
    return "net" if shm_disabled else "shm"


def gpu_perf(gpus: GpuSet) -> Tuple[float, float]:
    for pattern, flops, bandwidth in GPU_PERF:
        if pattern in gpus.name:
            return flops, bandwidth
    return ARCH_PERF.get(gpus.architecture, ARCH_PERF["volta"])


@dataclass
class Prediction:
    step_ms: float
    prefill_ms: float
    per_stream_tok_s: float
    throughput_tok_s: float
    ttft_p50_s: float
    e2e_p95_s: float
    allreduce_latency_us: float


def predict_layout(model: Dict[str, Any], gpus: GpuSet, tensor_parallel_size: int, transport: str,
                   crosses_socket: bool, streams: int, prompt_tokens: int, output_tokens: int,
                   eager: bool, weight_bytes: int) -> Prediction:
    """The cost model of the module docstring for one replica serving `streams` concurrent requests."""
    flops, bandwidth = gpu_perf(gpus)
    tp, layers, hidden = tensor_parallel_size, int(model["num_hidden_layers"]), int(model["hidden_size"])
    if tp > 1:
        base, per_step, bus = TRANSPORTS[transport]
        latency = base + 2 * (tp - 1) * per_step + (SOCKET_CROSSING_S if crosses_socket else 0.0)
        ring = 2.0 * (tp - 1) / tp
    else:
        latency, bus, ring = 0.0, 1.0, 0.0
    b = max(streams, 1)
    context = prompt_tokens + output_tokens / 2
    cpu = CPU_STEP_S + CPU_SEQ_S * b + CPU_WORKER_S * (tp - 1)
    hbm = weight_bytes / tp / (bandwidth * HBM_EFFICIENCY)
    launch = EAGER_LAUNCH_PER_LAYER_S * layers if eager else GRAPH_REPLAY_S
    comm = 2 * layers * latency
    kv = b * context * kv_bytes_per_token(model) / tp / (bandwidth * ATTENTION_HBM_EFFICIENCY)
    step = cpu + hbm + launch + comm + kv
    prefill = (2.0 * int(model["parameter_count"]) * prompt_tokens / tp / (flops * PREFILL_MFU)
               + 2 * layers * ring * prompt_tokens * hidden * 2 / bus + CPU_PREFILL_TOKEN_S * prompt_tokens)
    step_eff = step + b * prefill / output_tokens
    ttft = step_eff + TTFT_QUEUE_FACTOR * b * prefill
    e2e = ttft + P95_OUTPUT_FRACTION * output_tokens * step_eff
    return Prediction(step_ms=round(step_eff * 1000, 2), prefill_ms=round(prefill * 1000, 1),
                      per_stream_tok_s=round(1.0 / step_eff, 1), throughput_tok_s=round(b / step_eff, 1),
                      ttft_p50_s=round(ttft, 2), e2e_p95_s=round(e2e, 2),
                      allreduce_latency_us=round(latency * 1e6, 1))


# ------------------------------------------------------------------------------------------ planner

def _release_for(gpus: GpuSet, releases: ReleaseData, overrides: Overrides, decisions: Decisions,
                 source: PackageSource) -> Release:
    cc_text = f"{gpus.cc[0]}.{gpus.cc[1]}"
    if overrides.vllm_version:
        version = overrides.vllm_version
        why = "pinned by the operator"
        source_text = "operator override"
    else:
        try:
            version, why = releases.default_release(gpus.cc)
        except ReleaseDataError as exc:
            raise PlanRefusal(f"{gpus.name} (CC {cc_text}): {exc}. No vLLM release in the data runs on it.",
                              "data default_release_by_cc") from None
        source_text = "data default_release_by_cc; docs/runtime-install.md"
    if gpus.cc < (8, 0):
        status = releases.volta_status(version, gpus.cc)
        if status["status"] == "refused":
            raise PlanRefusal(f"vLLM {version} cannot run on {gpus.name} (CC {cc_text}): {status['reason']}. "
                              "Use the Volta default (no pin) or 0.5.4 from a mirror that supplies it.", "data volta_support")
        if status["status"] == "experimental":
            decisions.warnings.append(f"vLLM {version} on CC {cc_text} is experimental: {status['reason']}")
    try:
        release = releases.release(version)
    except ReleaseDataError as exc:
        raise PlanRefusal(str(exc), "data releases") from None
    if gpus.cc < release.min_compute_capability:
        low = release.min_compute_capability
        raise PlanRefusal(f"vLLM {version} ships no kernels for {gpus.name} (CC {cc_text}); it needs CC "
                          f"{low[0]}.{low[1]} or newer.", "data min_compute_capability; ref §1.1")
    engine = release.engine_for(gpus.cc)
    if engine == "none":
        raise PlanRefusal(f"vLLM {version} has no engine for CC {cc_text}.", "data engine_by_cc")
    branch = gpus.facts.get("driver_branch")
    need = int(release.driver["min_branch"])
    if branch is not None and int(branch) < need:
        raise PlanRefusal(f"driver {gpus.facts.get('driver_version')} (R{branch}) is older than R{need}, which "
                          f"vLLM {version} (CUDA {release.pins.get('cuda')}) needs. Upgrade the driver or pin an "
                          "older release.", "data driver.min_branch")
    cuda_min = release.driver.get("cuda_driver_min")
    cuda_have = gpus.facts.get("cuda_driver_version")
    if cuda_min and cuda_have and parse_cc(str(cuda_have)) < parse_cc(str(cuda_min)):
        raise PlanRefusal(f"the driver supports CUDA {cuda_have}; vLLM {version} needs CUDA {cuda_min} or newer.",
                          "data driver.cuda_driver_min")
    gaps = release.kernel_gaps(gpus.cc)
    if gaps:
        raise PlanRefusal(f"vLLM {version} cannot run on {gpus.name} (CC {cc_text}): its compiled dependencies "
                          f"{'; '.join(gaps)} carry no code for sm_{gpus.cc[0]}{gpus.cc[1]}. Pin a release whose "
                          "wheels have it (bin/revive plan lists the default).", "data kernels (wheel fatbin scan)")
    installability = release.installability
    if installability is not None and not installability.pypi and source.is_public_index:
        raise PlanRefusal(f"vLLM {version} cannot be installed from PyPI: {installability.reason}. What you can do: "
                          f"{installability.remedy}.", "data installability; docs/runtime-install.md")
    if version == "0.5.4":
        why += ("; the field notes' measured release (their table was taken on it), installed from "
                f"{source.describe()}, which must supply its whole lock")
    decisions.add("vllm_version", version, f"{why}", source_text)
    return release


def _dtype(model: Dict[str, Any], gpus: GpuSet, release: Release, overrides: Overrides,
           decisions: Decisions) -> Tuple[str, Optional[Dict[str, str]]]:
    weights = str(model.get("weights_dtype") or "F16")
    quantized = bool(model.get("quantization"))
    if gpus.cc < (8, 0):
        conversion = None
        if weights == "BF16" and not quantized:
            if not overrides.allow_bf16_conversion:
                raise PlanRefusal(
                    f"{model.get('path')}: the weights are BF16 and {gpus.name} (CC {gpus.cc[0]}.{gpus.cc[1]}) has "
                    "no BF16; conversion to FP16 is disabled. Convert the checkpoint (the model sync role does) "
                    "or allow conversion.", "ref §1.4; notes 'The hardware' (no BF16)")
            conversion = {"from": "BF16", "to": "F16"}
            decisions.warnings.append(
                f"{model.get('path')}: BF16 weights on a GPU without BF16: the sync role must convert them to FP16 "
                "(values beyond FP16's range overflow; vLLM would cast at load with --dtype half)")
        fallback = "0.9.0+ would fall back to fp16 with a warning" if release.get("bf16_auto_fallback") else \
            "0.5.4 never falls back: `auto` with BF16 weights dies at worker start"
        decisions.add("dtype", "half", f"CC {gpus.cc[0]}.{gpus.cc[1]} has no BF16; {fallback}. Explicit half "
                      "is right for FP16, BF16 (converted) and FP32 checkpoints alike.",
                      f"ref §1.4; {NOTES} 'Launch command' (--dtype float16)")
        return "half", conversion
    dtype = "bfloat16" if weights == "BF16" else "float16"
    decisions.add("dtype", dtype, f"CC {gpus.cc[0]}.{gpus.cc[1]} runs {weights} natively: the checkpoint's dtype "
                  "is kept (FP32 checkpoints are served in FP16, as vLLM's auto does).", "ref §1.4")
    return dtype, None


def _quantization(model: Dict[str, Any], gpus: GpuSet, release: Release, decisions: Decisions) -> Optional[str]:
    quant = model.get("quantization")
    if not quant:
        return None
    method = str(quant.get("method") or "")
    minimum = release.quantization_min_cc.get(method)
    cc10 = gpus.cc[0] * 10 + gpus.cc[1]
    if minimum is None:
        raise PlanRefusal(f"{model.get('path')}: quantization {method!r} is not supported by vLLM "
                          f"{release.version}. Use an FP16 checkpoint or a supported scheme.", "ref §7.3")
    if cc10 < minimum:
        raise PlanRefusal(
            f"{model.get('path')}: {method} checkpoints need CC {minimum // 10}.{minimum % 10}; {gpus.name} is CC "
            f"{gpus.cc[0]}.{gpus.cc[1]} (vLLM: 'The quantization method {method} is not supported for the current "
            f"GPU. Minimum capability: {minimum}. Current capability: {cc10}.'). Use FP16 or GPTQ weights.",
            "ref §7.3; data quantization_min_cc")
    if method == "gptq" and gpus.cc < (8, 0):
        decisions.warnings.append(
            "GPTQ on Volta: the notes measured ~30 % slower than FP16 with jittery P99 (exllama kernels, no "
            "Marlin below CC 8.0); prefer FP16 weights when they fit")
    decisions.add("quantization", method, f"read from the checkpoint's quantization_config; {method} needs CC "
                  f"{minimum // 10}.{minimum % 10}, this GPU is {gpus.cc[0]}.{gpus.cc[1]}",
                  "ref §7.3" + (f"; {NOTES} 'Failures met' 4" if method == "gptq" else ""))
    return method


def _model_checks(model: Dict[str, Any], gpus: GpuSet, release: Release, backend: str) -> None:
    head_sizes = release.get("paged_attention_head_sizes") or []
    if head_sizes and int(model["head_dim"]) not in head_sizes and release.engine_for(gpus.cc) == "V0":
        raise PlanRefusal(
            f"{model.get('path')}: head size {model['head_dim']} is not supported by PagedAttention in vLLM "
            f"{release.version} (supported: {head_sizes}).", "ref §1.3")
    if model.get("attn_logit_softcapping") and backend == "XFORMERS" and not release.get("xformers_logit_softcapping"):
        raise PlanRefusal(
            f"{model.get('path')}: the model uses attention logit soft-capping (Gemma-2) and vLLM "
            f"{release.version} runs xFormers on CC {gpus.cc[0]}.{gpus.cc[1]}: 'XFormers does not support attention "
            "logits soft capping.' Pick another model for this GPU.", "ref §1.3, §7.4 (#9922)")


def _max_model_len(model: Dict[str, Any], workload: Workload, decisions: Decisions) -> int:
    derived = model.get("max_position_embeddings")
    if workload.max_model_len is not None:
        value = int(workload.max_model_len)
        if derived and value > int(derived):
            raise PlanRefusal(
                f"max-model-len {value} is above the model's derived {derived}; vLLM refuses ('User-specified "
                f"max_model_len ({value}) is greater than the derived max_model_len ({derived})'). Use at most "
                f"{derived}.", "ref §2.1 --max-model-len")
        decisions.add("max_model_len", value, "set by the workload/operator", "operator override")
        return value
    value = min(NOTES_MAX_MODEL_LEN, int(derived)) if derived else NOTES_MAX_MODEL_LEN
    decisions.add("max_model_len", value,
                  "the notes' workload: under 0.1 % of requests exceed 4096 tokens, and 8K/16K halve the "
                  "concurrency of full-length sequences and raise 0.5.4's profile peak (it runs max-model-len "
                  "tokens)" + (f"; capped by the model's {derived}" if derived and derived < NOTES_MAX_MODEL_LEN
                              else ""), f"{NOTES} 'Launch command'; ref §3.2")
    return value


@dataclass
class Candidate:
    tensor_parallel_size: int
    groups: List[List[int]]
    described: List[Group]
    feasible: bool = False
    why_not: str = ""
    kv: Optional[KvEstimate] = None
    max_num_seqs: int = 0
    prediction: Optional[Prediction] = None
    streams_per_replica: int = 0
    concurrency: int = 0
    meets_slo: bool = False
    kv_holds_streams: bool = False

    def summary(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {"tensor_parallel_size": self.tensor_parallel_size, "replicas": len(self.groups),
                                "groups": self.groups, "feasible": self.feasible}
        if not self.feasible:
            data["why_not"] = self.why_not
            return data
        data.update({"streams_per_replica": self.streams_per_replica, "meets_slo": self.meets_slo,
                     "kv_tokens_per_replica": self.kv.tokens if self.kv else 0,
                     "predicted": self.prediction.__dict__ if self.prediction else None,
                     "total_throughput_tok_s": round(self._throughput(), 1)})
        return data

    def _throughput(self) -> float:
        """Total tok/s: every stream decodes at the per-stream speed; replicas beyond the streams idle."""
        if not self.prediction:
            return 0.0
        return self.prediction.per_stream_tok_s * min(self.concurrency, self.streams_per_replica * len(self.groups))


def _nccl_env(group: Group) -> Tuple[bool, str]:
    """(disable P2P and SHM?, why) for one replica."""
    if len(group.gpus) <= 1:
        return False, "one GPU per replica: no NCCL traffic"
    if group.nvlink_any:
        return False, (f"NVLink connects the replica's GPUs {group.gpus}: P2P and SHM stay enabled (disabling them "
                       "on NVLink machines halves TP throughput or worse)")
    if group.host_paths:
        return True, (f"no NVLink and GPU paths cross {group.slowest_path} in replica {group.gpus}: NCCL P2P over "
                      "this topology hung at 'connecting to' on the notes' box; routing through host memory is "
                      "slower but stable")
    return False, (f"replica {group.gpus} sits behind one PCIe switch ({group.slowest_path}): P2P does not cross a "
                   "host bridge")


def _max_num_seqs_for(streams: int, kv: Optional[KvEstimate], typical_len: int, batched_tokens: int,
                      override: Optional[int]) -> int:
    if override is not None:
        return int(override)
    target = min(256, max(16, math.ceil(MAX_NUM_SEQS_HEADROOM * streams / 16) * 16))
    if kv is not None and kv.tokens > 0:
        holds = max(8, (kv.tokens // max(typical_len, 1)) // 8 * 8)
        target = min(target, holds)
    return max(1, min(target, batched_tokens))


def plan_release(
    gpu_facts: Dict[str, Any],
    model: Dict[str, Any],
    releases: ReleaseData,
    workload: Optional[Workload] = None,
    overrides: Optional[Overrides] = None,
    serve: Optional[Serve] = None,
    host_ram_bytes: Optional[int] = None,
    source: Optional[PackageSource] = None,
) -> Dict[str, Any]:
    """Plan a release (see the module docstring); raises PlanRefusal or PlanError."""
    source = source or PackageSource()
    workload = workload or Workload()
    overrides = overrides or Overrides()
    serve = serve or Serve()
    decisions = Decisions()
    if gpu_facts.get("simulated"):
        origin = next(iter(gpu_facts.get("notes") or []), "lab or synthetic facts")
        decisions.warnings.append(f"GPU facts are simulated ({origin}): the plan is for the described hardware, "
                                  "not for a probed one")
    gpus = gpu_set_from_facts(gpu_facts, overrides.exclude_gpus, decisions)
    release = _release_for(gpus, releases, overrides, decisions, source)
    engine = release.engine_for(gpus.cc)
    backend = release.attention_backend_for(gpus.cc)
    volta = gpus.cc < (8, 0)
    dtype, conversion = _dtype(model, gpus, release, overrides, decisions)
    quant = _quantization(model, gpus, release, decisions)
    _model_checks(model, gpus, release, backend)
    decisions.add("attention_backend", backend,
                  "FlashAttention-2 needs CC >= 8.0; vLLM selects xFormers on Volta and Turing" if volta
                  else "FlashAttention-2 on CC >= 8.0", "ref §1.3")
    decisions.add("engine", engine, "CC < 8.0 runs the V0 engine (V1 needs 8.0 before 0.10.2)" if volta and
                  engine == "V0" else f"the release's engine for CC {gpus.cc[0]}.{gpus.cc[1]}", "ref §1.1")
    max_model_len = _max_model_len(model, workload, decisions)
    eager = volta
    if eager:
        decisions.add("enforce_eager", True, "CUDA graphs are captured after the KV cache is sized, outside "
                      "--gpu-memory-utilization (1-3 GiB per GPU); capture OOM'd at start on the notes' box",
                      f"{NOTES} 'Failures met' 1; ref §1.5, §7.2")
    else:
        decisions.add("enforce_eager", False, "CUDA graphs are reliable on CC >= 8.0; their 1-3 GiB fit in the "
                      "headroom the release's default utilisation leaves", "ref §1.5")
    if overrides.gpu_memory_utilization is not None:
        utilization = float(overrides.gpu_memory_utilization)
        decisions.add("gpu_memory_utilization", utilization, "set by the operator", "operator override")
    elif volta:
        utilization = VOLTA_GPU_MEMORY_UTILIZATION
        decisions.add("gpu_memory_utilization", utilization, "0.95 OOM'd at start; 0.92 leaves 8 % per card for "
                      "what vLLM does not budget (CUDA context, fragmentation)", f"{NOTES} 'Launch command', "
                      "'Failures met' 1")
    else:
        utilization = float(release.defaults["gpu_memory_utilization"])
        decisions.add("gpu_memory_utilization", utilization, "the release default: leaves room for CUDA graphs, "
                      "which are captured outside the budget", "ref §1.5, §7.2")
    if not 0 < utilization <= 1:
        raise PlanRefusal(f"gpu-memory-utilization {utilization} must be in (0, 1] ('GPU memory utilization must "
                          "be less than 1.0').", "ref §2.2")
    sizing = release.kv_sizing_for(engine)
    batched = int(overrides.max_num_batched_tokens) if overrides.max_num_batched_tokens else \
        max(max_model_len, NOTES_BATCHED_TOKENS)
    if batched < max_model_len:
        raise PlanRefusal(
            f"max_num_batched_tokens ({batched}) is smaller than max_model_len ({max_model_len}): vLLM refuses to "
            "start without chunked prefill. Raise --max-num-batched-tokens or lower --max-model-len.", "ref §3.5")
    typical_len = workload.typical_prompt_tokens + workload.slo_output_tokens

    tp_options = [overrides.tensor_parallel_size] if overrides.tensor_parallel_size else \
        [t for t in (1, 2, 4, 8, 16) if t <= len(gpus.indices)]
    candidates: List[Candidate] = []
    for tp in tp_options:
        groups = form_groups(gpus, tp)
        candidate = Candidate(tp, groups, [describe_group(gpus, g) for g in groups])
        candidates.append(candidate)
        problem = tp_divides_heads(model, tp)
        if problem is None and not groups:
            problem = f"only {len(gpus.indices)} GPUs"
        if problem is None and quant == "bitsandbytes" and tp > 1:
            problem = "BitAndBytes quantization with TP is not supported by 0.5.x (ray-multinode reference)"
        if problem:
            candidate.why_not = problem
            if overrides.tensor_parallel_size:
                raise PlanRefusal(f"--tensor-parallel-size {tp}: {problem}", "ref §3.3; vLLM ModelConfig checks")
            continue
        replicas = len(groups)
        streams = math.ceil(workload.concurrency / replicas)
        max_num_seqs = _max_num_seqs_for(streams, None, typical_len, batched, overrides.max_num_seqs)
        kv = None
        for _ in range(2):  # max_num_seqs sizes the sampler term of the profile; the KV caps max_num_seqs
            kv = kv_cache_plan(model, tp, gpus.total_bytes, utilization, 0, max_num_batched_tokens=batched,
                               max_num_seqs=max_num_seqs, max_model_len=max_model_len, dtype=dtype,
                               release=release.version, sizing=sizing)
            max_num_seqs = _max_num_seqs_for(streams, kv, typical_len, batched, overrides.max_num_seqs)
        candidate.kv, candidate.max_num_seqs, candidate.streams_per_replica = kv, max_num_seqs, streams
        candidate.concurrency = workload.concurrency
        if kv.errors:
            candidate.why_not = (f"weights {kv.weights_per_gpu / GiB:.1f} GiB + profile peak "
                                 f"{(kv.peak_activation + kv.non_torch) / GiB:.1f} GiB per GPU leave "
                                 f"{max(kv.tokens, 0)} KV tokens: {kv.errors[0]}")
            if overrides.tensor_parallel_size:
                raise PlanRefusal(f"--tensor-parallel-size {tp}: {candidate.why_not}", "ref §3.1 (revive_kv)")
            continue
        candidate.feasible = True
        candidate.kv_holds_streams = kv.tokens >= streams * typical_len
        group = candidate.described[0]
        p2p_off, _ = _nccl_env(group)
        transport = transport_for(group, p2p_off, p2p_off)
        candidate.prediction = predict_layout(
            model, gpus, tp, transport, group.crosses_socket, streams, workload.typical_prompt_tokens,
            workload.slo_output_tokens, eager, kv.weights_per_gpu * tp)
        candidate.meets_slo = candidate.prediction.e2e_p95_s <= workload.slo_p95_e2e_s and candidate.kv_holds_streams
    feasible = [c for c in candidates if c.feasible]
    if not feasible:
        details = "; ".join(f"TP {c.tensor_parallel_size}: {c.why_not.rstrip('.')}" for c in candidates)
        raise PlanRefusal(f"{model.get('path')} ({model.get('weight_bytes', 0) / 1e9:.1f} GB) does not fit "
                          f"{len(gpus.indices)}x {gpus.name}: {details}. Use more or larger GPUs, a smaller "
                          "model or quantized weights.", "ref §3 (revive_kv); notes 'Model and parallelism choice'")
    chosen = _choose(feasible, workload, decisions)
    return _build(model, gpus, release, engine, backend, dtype, conversion, chosen, candidates, max_model_len,
                  batched, utilization, eager, workload, overrides, serve, host_ram_bytes, decisions, typical_len)


def _choose(feasible: List[Candidate], workload: Workload, decisions: Decisions) -> Candidate:
    good = [c for c in feasible if c.meets_slo] or feasible
    best = max(good, key=lambda c: c._throughput())
    for candidate in sorted(good, key=lambda c: len(c.groups)):
        if candidate._throughput() >= best._throughput() * (1 - TIE_MARGIN):
            best = candidate
            break
    if not best.meets_slo:
        decisions.warnings.append(
            f"no layout meets the SLO (p95 e2e <= {workload.slo_p95_e2e_s:g} s at concurrency {workload.concurrency}"
            f" with {workload.slo_output_tokens} output tokens); best predicted p95 is "
            f"{best.prediction.e2e_p95_s if best.prediction else '?'} s. Queue at the front door below that "
            "concurrency, or add nodes")
    return best


def _cpu_list(cpus: List[int]) -> str:
    ranges: List[str] = []
    for cpu in sorted(set(cpus)):
        if ranges and int(ranges[-1].split("-")[-1]) == cpu - 1:
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{cpu}"
        else:
            ranges.append(str(cpu))
    return ",".join(ranges)


def _layout_reason(chosen: Candidate, candidates: List[Candidate], workload: Workload) -> str:
    p = chosen.prediction
    rows = []
    for c in candidates:
        if c.feasible and c.prediction:
            rows.append(f"{len(c.groups)}x TP{c.tensor_parallel_size}: {c._throughput():.0f} tok/s, "
                        f"{c.prediction.per_stream_tok_s:g} tok/s/stream, p95 {c.prediction.e2e_p95_s:g} s"
                        + ("" if c.meets_slo else " (misses SLO)"))
        else:
            rows.append(f"TP{c.tensor_parallel_size}: {c.why_not}")
    text = (f"{len(chosen.groups)} replica(s) of TP {chosen.tensor_parallel_size} predicted best at concurrency "
            f"{workload.concurrency}: {chosen._throughput():.0f} tok/s total, {p.per_stream_tok_s:g} tok/s per "
            f"stream, TTFT p50 {p.ttft_p50_s:g} s, p95 e2e {p.e2e_p95_s:g} s (cost model in revive_plan; "
            f"anchored on the notes' TP 8 run). Compared: " + "; ".join(rows))
    tp8 = next((c for c in candidates if c.tensor_parallel_size == 8 and c.feasible and c.prediction), None)
    if tp8 is not None and chosen is not tp8:
        gain = chosen._throughput() / tp8._throughput() - 1 if tp8._throughput() else 0.0
        text += (f". Versus the notes' single TP 8 replica: {gain:+.0%} throughput, p95 "
                 f"{tp8.prediction.e2e_p95_s:g} -> {p.e2e_p95_s:g} s: each rank reads "
                 f"{8 // chosen.tensor_parallel_size}x the weights per step but "
                 + ("needs no all-reduce at all" if chosen.tensor_parallel_size == 1 else
                    f"all-reduces over {chosen.tensor_parallel_size} ranks instead of 8 "
                    f"({p.allreduce_latency_us:g} us instead of {tp8.prediction.allreduce_latency_us:g} us"
                    + ("" if chosen.described[0].crosses_socket else ", never across sockets") + ")")
                 + ", and each replica batches and prefills only its share of the streams")
    return text


def _build(model: Dict[str, Any], gpus: GpuSet, release: Release, engine: str, backend: str, dtype: str,
           conversion: Optional[Dict[str, str]], chosen: Candidate, candidates: List[Candidate], max_model_len: int,
           batched: int, utilization: float, eager: bool, workload: Workload, overrides: Overrides, serve: Serve,
           host_ram_bytes: Optional[int], decisions: Decisions, typical_len: int) -> Dict[str, Any]:
    tp = chosen.tensor_parallel_size
    replicas = len(chosen.groups)
    volta = gpus.cc < (8, 0)
    decisions.add("tensor_parallel_size", tp, _layout_reason(chosen, candidates, workload),
                  f"{NOTES} 'Model and parallelism choice'; prior-art §3 item 3 (2xTP4 per socket); cost model")
    idle = sorted(set(gpus.indices) - {g for group in chosen.groups for g in group})
    if idle:
        decisions.warnings.append(f"GPUs {idle} stay idle: they do not make a whole TP-{tp} group")
    if batched < chosen.max_num_seqs:
        raise PlanRefusal(f"max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs "
                          f"({chosen.max_num_seqs}).", "ref §3.5")
    decisions.add("max_num_batched_tokens", batched,
                  ("set by the operator" if overrides.max_num_batched_tokens else
                   f"at least max-model-len ({max_model_len}): without chunked prefill 0.5.4 refuses less; 8192 "
                   "for 4K context as in the notes"), f"ref §3.5; {NOTES} 'Launch command'")
    kv = chosen.kv
    assert kv is not None
    if overrides.max_num_seqs is not None:
        decisions.add("max_num_seqs", chosen.max_num_seqs, "set by the operator", "operator override")
    else:
        decisions.add("max_num_seqs", chosen.max_num_seqs,
                      f"{MAX_NUM_SEQS_HEADROOM}x the {chosen.streams_per_replica} streams each replica expects (the "
                      f"notes ran 128 for 32), within 256 and within the {kv.tokens // typical_len} sequences of "
                      f"{typical_len} tokens its KV cache holds; queue at the front door rather than raise it",
                      f"{NOTES} 'Launch command', 'Results'")
    if not chosen.kv_holds_streams:
        decisions.warnings.append(
            f"the KV cache holds {kv.tokens} tokens per replica, fewer than {chosen.streams_per_replica} streams x "
            f"{typical_len} tokens: expect preemptions (vllm:num_preemptions_total) at full concurrency")

    swap = _swap_space(release, tp, replicas, host_ram_bytes, overrides, decisions, engine)
    final_kv = kv_cache_plan(model, tp, gpus.total_bytes, utilization, swap or 0, max_num_batched_tokens=batched,
                             max_num_seqs=chosen.max_num_seqs, max_model_len=max_model_len, dtype=dtype,
                             release=release.version, sizing=release.kv_sizing_for(engine))

    model_path = serve.model_path or str(model.get("path"))
    served_name = serve.served_model_name or os.path.basename(model_path.rstrip("/")) or "model"
    common: List[str] = ["--model", model_path, "--served-model-name", served_name, "--host", serve.host]
    flags: List[str] = ["--tensor-parallel-size", str(tp), "--dtype", dtype,
                        "--gpu-memory-utilization", f"{utilization:g}", "--max-model-len", str(max_model_len),
                        "--max-num-seqs", str(chosen.max_num_seqs), "--max-num-batched-tokens", str(batched)]
    if eager:
        flags.append("--enforce-eager")
    if swap is not None:
        flags += ["--swap-space", str(int(swap)) if float(swap).is_integer() else f"{swap:g}"]
    if model.get("requires_trust_remote_code"):
        flags.append("--trust-remote-code")
        decisions.add("trust_remote_code", True, "config.json maps its classes to code in the model repository "
                      "(auto_map); vLLM loads the config through transformers, which needs it. Only serve models "
                      "from a source you trust.", "vLLM model loading (config auto_map)")
    group0 = chosen.described[0]
    custom_ar_off = tp > 1 and not group0.nvlink_all
    if custom_ar_off:
        flags.append("--disable-custom-all-reduce")
        if group0.nvlink_any:
            why = ("the replica is not fully NVLink-connected: vLLM needs full NVLink for custom all-reduce "
                   "above 2 GPUs and disables it with a warning; the flag says so up front")
        elif tp == 2:
            why = ("TP 2 on PCIe keeps vLLM's custom all-reduce on when a P2P copy test passes, and it hangs "
                   "(#8410, 1Cat-vLLM#652)")
        else:
            why = ("above 2 PCIe-only GPUs vLLM disables custom all-reduce itself with a warning; the flag makes "
                   "it explicit and silences the warning")
        decisions.add("disable_custom_all_reduce", True, why, "ref §7.1")
    if release.get("metrics_need_disable_frontend_multiprocessing") and workload.metrics:
        flags.append("--disable-frontend-multiprocessing")
        decisions.add("disable_frontend_multiprocessing", True, "with frontend multiprocessing (0.5.4's default) "
                      "/metrics has no vllm:* series; the notes' dashboards need them", "ref §4.2 (#7188); "
                      f"{NOTES} 'Failures met' 6")
    if release.get("request_logging_default"):
        flags.append("--disable-log-requests")
        decisions.add("disable_log_requests", True, f"vLLM {release.version} logs every request's prompt by default",
                      f"ref §2.1; {NOTES} 'Launch command'")

    replica_list: List[Dict[str, Any]] = []
    pinning_reasons: List[str] = []
    nccl_reasons: List[str] = []
    for number, (members, group) in enumerate(zip(chosen.groups, chosen.described)):
        env: Dict[str, str] = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                               "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in members)}
        disable, why = _nccl_env(group)
        if disable:
            env["NCCL_P2P_DISABLE"] = "1"
            env["NCCL_SHM_DISABLE"] = "1"
        nccl_reasons.append(why)
        if volta:
            env["VLLM_ATTENTION_BACKEND"] = backend
        env.update(release.get("engine_env", {}).get("below_8" if volta else "from_8", {}) or {})
        devices = [d for d in gpus.devices if int(d["index"]) in members]
        sockets = {d.get("socket") for d in devices}
        numa = {d.get("numa_node") for d in devices}
        cpus: List[int] = sorted({c for d in devices for c in (d.get("cpus") or [])})
        pinned = len(sockets) == 1 and None not in sockets and bool(cpus)
        if pinned:
            pinning_reasons.append(f"replica {number} (GPUs {members}) hangs off socket {sockets.pop()}: its engine "
                                   f"and workers run on CPUs {_cpu_list(cpus)}, memory on NUMA node "
                                   f"{next(iter(numa))}")
        else:
            pinning_reasons.append(f"replica {number} (GPUs {members}) spans sockets: no CPU/NUMA pinning")
        port = serve.base_port + number
        args = common + ["--port", str(port)] + flags
        errors = release.validate_argv(args)
        if errors:
            raise PlanError(f"planner emitted an argv vLLM {release.version} rejects: {'; '.join(errors)}")
        replica_list.append({
            "index": number, "name": f"vllm-{number}", "port": port, "gpus": members,
            "cuda_visible_devices": env["CUDA_VISIBLE_DEVICES"], "tensor_parallel_size": tp,
            "socket": next(iter({d.get('socket') for d in devices})) if pinned else None,
            "numa_node": next(iter(numa)) if pinned and len(numa) == 1 else None,
            "cpus": cpus if pinned else [], "cpu_list": _cpu_list(cpus) if pinned else "",
            "streams": chosen.streams_per_replica, "args": args, "env": env,
            "nvlink": group.nvlink_all, "slowest_path": group.slowest_path,
        })
    decisions.add("nccl", {r["name"]: {k: v for k, v in r["env"].items() if k.startswith("NCCL")}
                           for r in replica_list}, "; ".join(sorted(set(nccl_reasons))),
                  f"{NOTES} 'Launch command' (NCCL paragraph); ref §7.1")
    decisions.add("cuda_visible_devices", {r["name"]: r["cuda_visible_devices"] for r in replica_list},
                  "CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA's indices those of NVML and nvidia-smi, so "
                  "CUDA_VISIBLE_DEVICES names exactly the GPUs the probe saw (CUDA's default order is fastest "
                  "first)", "reference/nvml.md; CUDA environment variables")
    decisions.add("cpu_pinning", {r["name"]: r["cpu_list"] for r in replica_list}, "; ".join(pinning_reasons),
                  "prior-art §3 item 3 (CPUAffinity/NUMAPolicy per socket)")
    if volta:
        decisions.add("vllm_attention_backend_env", backend, "recorded in the environment so the unit says what "
                      "vLLM selects anyway on Volta", "prior-art §6 (record VLLM_ATTENTION_BACKEND)")

    kv_out = {
        "sizing": final_kv.sizing, "block_size": final_kv.block_size, "bytes_per_block": final_kv.bytes_per_block,
        "num_gpu_blocks": final_kv.num_gpu_blocks, "num_cpu_blocks": final_kv.num_cpu_blocks,
        "tokens": final_kv.tokens, "max_concurrency_at_max_model_len": final_kv.max_concurrency_at_max_model_len,
        "typical_sequence_tokens": typical_len,
        "max_concurrency_at_typical_len": round(final_kv.tokens / typical_len, 1),
        "budget_bytes": final_kv.budget_bytes, "weights_per_gpu_bytes": final_kv.weights_per_gpu,
        "peak_activation_bytes": final_kv.peak_activation, "non_torch_bytes": final_kv.non_torch,
        "kv_bytes": final_kv.kv_bytes, "profile_tokens": final_kv.profile_tokens,
        "log_line": final_kv.log_line(), "per": "GPU worker of one replica (every replica is the same)",
    }
    decisions.add("kv_cache", f"{final_kv.num_gpu_blocks} GPU / {final_kv.num_cpu_blocks} CPU blocks",
                  f"{final_kv.tokens} tokens per replica = {final_kv.max_concurrency_at_max_model_len:g} sequences of "
                  f"{max_model_len} or {kv_out['max_concurrency_at_typical_len']:g} of {typical_len}; per GPU: budget "
                  f"{final_kv.budget_bytes / GiB:.2f} GiB - weights {final_kv.weights_per_gpu / GiB:.2f} - profile "
                  "peak "
                  f"{final_kv.peak_activation / GiB:.2f} - non-torch {final_kv.non_torch / GiB:.2f} = KV "
                  f"{final_kv.kv_bytes / GiB:.2f} GiB", f"ref §3 ({final_kv.sizing}); revive_kv")
    first = replica_list[0]
    return {
        "vllm_version": release.version,
        "pins": dict(release.pins),
        "engine": engine,
        "attention_backend": backend,
        "entrypoint": list(release.entrypoint),
        "args": first["args"],
        "env": first["env"],
        "replicas": replica_list,
        "tensor_parallel_size": tp,
        "settings": {"dtype": dtype, "gpu_memory_utilization": utilization, "max_model_len": max_model_len,
                     "max_num_seqs": chosen.max_num_seqs, "max_num_batched_tokens": batched,
                     "swap_space": swap, "enforce_eager": eager, "block_size": final_kv.block_size},
        "kv_cache": kv_out,
        "layout": {"chosen": {"tensor_parallel_size": tp, "replicas": replicas, "groups": chosen.groups},
                   "candidates": [c.summary() for c in candidates],
                   "cost_model": "revive_plan.predict_layout (see its module docstring)"},
        "workload": {"concurrency": workload.concurrency, "slo_p95_e2e_s": workload.slo_p95_e2e_s,
                     "slo_output_tokens": workload.slo_output_tokens,
                     "typical_prompt_tokens": workload.typical_prompt_tokens, "metrics": workload.metrics},
        "conversion": conversion,
        "metrics": list(release.metrics),
        "model": {k: model.get(k) for k in ("path", "architecture", "model_type", "parameter_count", "weight_bytes",
                                             "weights_dtype", "quantization", "source")},
        "gpu": {"name": gpus.name, "count": len(gpus.indices), "compute_capability": f"{gpus.cc[0]}.{gpus.cc[1]}",
                "total_bytes": gpus.total_bytes, "driver_version": gpus.facts.get("driver_version"),
                "simulated": bool(gpus.facts.get("simulated"))},
        "reasons": decisions.reasons,
        "warnings": decisions.warnings,
        "refused": False,
    }


def _swap_space(release: Release, tp: int, replicas: int, host_ram_bytes: Optional[int], overrides: Overrides,
                decisions: Decisions, engine: str) -> Optional[float]:
    swap_type = release.get("swap_space_type")
    if swap_type == "none" or release.argument("--swap-space") is None:
        decisions.add("swap_space", None, f"vLLM {release.version} has no --swap-space (removed in 0.18.0)",
                      "ref §2.2")
        return None
    if engine == "V1":
        decisions.add("swap_space", None, "the V1 engine preempts by recompute and allocates no CPU swap; the flag "
                      "would only be ignored", "ref §2.2, §3.6")
        return None
    workers = tp * replicas
    limits = release.get("swap_space_limits") or {}
    if overrides.swap_space is not None:
        swap = float(overrides.swap_space)
        if swap_type == "int" and not swap.is_integer():
            raise PlanRefusal(f"--swap-space {swap:g}: vLLM {release.version} takes whole GiB (int).", "ref §2.1")
        if host_ram_bytes:
            pinned = swap * GiB * workers
            if pinned > float(limits.get("error_fraction", 0.7)) * host_ram_bytes:
                raise PlanRefusal(
                    f"--swap-space {swap:g} pins {pinned / GiB:.0f} GiB ({workers} workers x {swap:g} GiB) of "
                    f"{host_ram_bytes / GiB:.0f} GiB host RAM; vLLM refuses above 70 % ('Too large swap space'). "
                    "Lower it (0 is allowed).", "ref §3.4")
            if pinned > HOST_SWAP_FRACTION * host_ram_bytes:
                decisions.warnings.append(f"swap space pins {pinned / GiB:.0f} GiB of {host_ram_bytes / GiB:.0f} GiB "
                                          "host RAM at start (over 40 %)")
        decisions.add("swap_space", swap, "set by the operator", "operator override")
        return swap
    if not host_ram_bytes:
        swap = float(release.defaults.get("swap_space", 4))
        decisions.warnings.append("host RAM unknown: swap space left at vLLM's default instead of the notes' 16 GiB")
        decisions.add("swap_space", swap, "host RAM unknown; vLLM's default", "ref §2.1")
        return swap
    bound = math.floor(HOST_SWAP_FRACTION * host_ram_bytes / GiB / workers)
    swap = float(min(NOTES_SWAP_SPACE_GIB, bound))
    decisions.add("swap_space", swap, f"the notes' 16 GiB per GPU, bounded so the {workers} workers pin at most 40 % "
                  f"of the {host_ram_bytes / GiB:.0f} GiB host RAM ({swap * workers:g} GiB): swap is pinned host RAM "
                  "allocated by every worker at start; plain n=1 chat traffic preempts by recompute and never uses it",
                  f"{NOTES} 'Launch command'; ref §3.4")
    return swap
