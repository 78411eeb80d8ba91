"""The replica layout: which tensor-parallel sizes fit, how the GPUs group (within a socket where the size
allows), which NCCL transport each group gets, and which layout the performance model predicts best.

A candidate per TP size (1, 2, 4, 8 ... up to the GPU count, or the operator's): refused when the size does
not divide the attention heads (or the KV heads, either way), when no whole group forms, or when weights +
profile peak leave no KV floor (revive_kv with the release's own sizing). Every feasible candidate gets a
prediction from module_utils/revive_perf.py (`closed_loop`); the best total throughput among those that meet
the SLO wins, and within TIE_MARGIN the layout with fewer replicas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ansible.module_utils.revive_kv import GiB, KvEstimate, kv_bytes_per_token, kv_cache_plan
from ansible.module_utils.revive_perf import (PCIE_HOST_PATHS, ModelShape, Prediction, closed_loop, gpu_spec,
                                              nccl_transport, nvlink_reaches_all)
from ansible.module_utils.revive_plan.gpus import GpuSet
from ansible.module_utils.revive_plan.inputs import Decisions, Overrides, PlanRefusal, Workload
from ansible.module_utils.revive_plan.rules import EngineSettings

PATH_ORDER = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")
MAX_NUM_SEQS_HEADROOM = 4          # docs/field-report.md ('Launch command'): --max-num-seqs 128 for concurrency 32
TIE_MARGIN = 0.03                  # throughput within 3 %: prefer fewer replicas


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
    nv = [(a, b) for (a, b), p in zip(pairs, paths) if p.startswith("NV")]
    sockets = {gpus.socket_of(i) for i in members}
    slowest = max(paths, key=_path_rank) if paths else "X"
    return Group(
        gpus=members,
        nvlink_all=bool(pairs) and len(nv) == len(pairs),
        nvlink_connected=nvlink_reaches_all(members, nv),
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
    """The NCCL transport (a revive_perf.TRANSPORTS key, or "none") the group's ranks use."""
    return nccl_transport(len(group.gpus), group.nvlink_connected, not group.host_paths, p2p_disabled, shm_disabled)


def nccl_env(group: Group) -> Tuple[bool, str]:
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


def predict_layout(model: Dict[str, Any], gpus: GpuSet, tensor_parallel_size: int, transport: str,
                   crosses_socket: bool, streams: int, prompt_tokens: int, output_tokens: int,
                   eager: bool, weight_bytes: int) -> Prediction:
    """revive_perf's closed form for one replica of the model on these GPUs serving `streams` requests."""
    shape = ModelShape(int(model["parameter_count"]), weight_bytes, int(model["num_hidden_layers"]),
                       int(model["hidden_size"]), kv_bytes_per_token(model))
    return closed_loop(shape, gpu_spec(gpus.name, gpus.architecture), tensor_parallel_size, transport,
                       crosses_socket, streams, prompt_tokens, output_tokens, eager)


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
    pipeline_parallel_size: int = 1     # stages, one per node (module_utils/revive_plan/pipeline.py)
    stage_layers: List[int] = field(default_factory=list)

    def summary(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {"tensor_parallel_size": self.tensor_parallel_size, "replicas": len(self.groups),
                                "groups": self.groups, "feasible": self.feasible}
        if self.pipeline_parallel_size > 1 or self.stage_layers:
            data.update({"pipeline_parallel_size": self.pipeline_parallel_size, "nodes": self.pipeline_parallel_size,
                         "stage_layers": self.stage_layers})
        if not self.feasible:
            data["why_not"] = self.why_not
            return data
        data.update({"streams_per_replica": self.streams_per_replica, "meets_slo": self.meets_slo,
                     "kv_tokens_per_replica": self.kv.tokens if self.kv else 0,
                     "predicted": self.prediction.__dict__ if self.prediction else None,
                     "total_throughput_tok_s": round(self.throughput(), 1)})
        return data

    def throughput(self) -> float:
        """Total tok/s: every stream decodes at the per-stream speed; replicas beyond the streams idle."""
        if not self.prediction:
            return 0.0
        if self.pipeline_parallel_size > 1:
            return self.prediction.throughput_tok_s
        return self.prediction.per_stream_tok_s * min(self.concurrency, self.streams_per_replica * len(self.groups))


@dataclass(frozen=True)
class LayoutChoice:
    """The chosen candidate and every candidate compared."""

    chosen: Candidate
    candidates: List[Candidate]


def max_num_seqs_for(streams: int, kv: Optional[KvEstimate], typical_len: int, batched_tokens: int,
                     override: Optional[int]) -> int:
    if override is not None:
        return int(override)
    target = min(256, max(16, math.ceil(MAX_NUM_SEQS_HEADROOM * streams / 16) * 16))
    if kv is not None and kv.tokens > 0:
        holds = max(8, (kv.tokens // max(typical_len, 1)) // 8 * 8)
        target = min(target, holds)
    return max(1, min(target, batched_tokens))


def size_kv(model: Dict[str, Any], tensor_parallel_size: int, gpus: GpuSet, settings: EngineSettings, streams: int,
            overrides: Overrides, **stage: Any) -> Tuple[KvEstimate, int]:
    """The KV estimate of one worker and --max-num-seqs for `streams` per scheduler; `stage` passes a pipeline
    stage's sizing to revive_kv (pipeline.py). max_num_seqs sizes the sampler term of the profile and the KV caps
    max_num_seqs, so both are settled in two rounds."""
    typical_len, batched = settings.typical_sequence_tokens, settings.max_num_batched_tokens
    max_num_seqs = max_num_seqs_for(streams, None, typical_len, batched, overrides.max_num_seqs)
    kv = None
    for _ in range(2):
        kv = kv_cache_plan(model, tensor_parallel_size, gpus.total_bytes, settings.gpu_memory_utilization, 0,
                           max_num_batched_tokens=batched, max_num_seqs=max_num_seqs,
                           max_model_len=settings.max_model_len, dtype=settings.dtype,
                           release=settings.release.version, sizing=settings.kv_sizing, **stage)
        max_num_seqs = max_num_seqs_for(streams, kv, typical_len, batched, overrides.max_num_seqs)
    assert kv is not None
    return kv, max_num_seqs


def _evaluate(candidate: Candidate, model: Dict[str, Any], gpus: GpuSet, settings: EngineSettings,
              workload: Workload, overrides: Overrides) -> None:
    """Fill in the candidate: why it cannot run, or its KV cache, max_num_seqs and prediction."""
    tp, groups = candidate.tensor_parallel_size, candidate.groups
    typical_len = settings.typical_sequence_tokens
    problem = tp_divides_heads(model, tp)
    if problem is None and not groups:
        problem = f"only {len(gpus.indices)} GPUs"
    if problem is None and settings.quantization == "bitsandbytes" and tp > 1:
        problem = "BitAndBytes quantization with TP is not supported by 0.5.x (ray-multinode reference)"
    if problem:
        candidate.why_not = problem
        if overrides.tensor_parallel_size:
            raise PlanRefusal(f"--tensor-parallel-size {tp}: {problem}",
                              "docs/facts/vllm-volta.md §3.3; vLLM ModelConfig checks")
        return
    replicas = len(groups)
    streams = math.ceil(workload.concurrency / replicas)
    kv, max_num_seqs = size_kv(model, tp, gpus, settings, streams, overrides)
    candidate.kv, candidate.max_num_seqs, candidate.streams_per_replica = kv, max_num_seqs, streams
    candidate.concurrency = workload.concurrency
    if kv.errors:
        candidate.why_not = (f"weights {kv.weights_per_gpu / GiB:.1f} GiB + profile peak "
                             f"{(kv.peak_activation + kv.non_torch) / GiB:.1f} GiB per GPU leave "
                             f"{max(kv.tokens, 0)} KV tokens: {kv.errors[0]}")
        if overrides.tensor_parallel_size:
            raise PlanRefusal(f"--tensor-parallel-size {tp}: {candidate.why_not}",
                              "docs/facts/vllm-volta.md §3.1 (revive_kv)")
        return
    candidate.feasible = True
    candidate.kv_holds_streams = kv.tokens >= streams * typical_len
    group = candidate.described[0]
    p2p_off, _ = nccl_env(group)
    transport = transport_for(group, p2p_off, p2p_off)
    candidate.prediction = predict_layout(
        model, gpus, tp, transport, group.crosses_socket, streams, workload.typical_prompt_tokens,
        workload.slo_output_tokens, settings.enforce_eager, kv.weights_per_gpu * tp)
    candidate.meets_slo = candidate.prediction.e2e_p95_s <= workload.slo_p95_e2e_s and candidate.kv_holds_streams


def choose_layout(model: Dict[str, Any], gpus: GpuSet, settings: EngineSettings, workload: Workload,
                  overrides: Overrides, decisions: Decisions) -> LayoutChoice:
    """Every candidate TP size evaluated, and the one to run; refused when none fits."""
    tp_options = [overrides.tensor_parallel_size] if overrides.tensor_parallel_size else \
        [t for t in (1, 2, 4, 8, 16) if t <= len(gpus.indices)]
    candidates: List[Candidate] = []
    for tp in tp_options:
        groups = form_groups(gpus, tp)
        candidate = Candidate(tp, groups, [describe_group(gpus, g) for g in groups])
        candidates.append(candidate)
        _evaluate(candidate, model, gpus, settings, workload, overrides)
    feasible = [c for c in candidates if c.feasible]
    if not feasible:
        details = "; ".join(f"TP {c.tensor_parallel_size}: {c.why_not.rstrip('.')}" for c in candidates)
        raise PlanRefusal(f"{model.get('path')} ({model.get('weight_bytes', 0) / 1e9:.1f} GB) does not fit "
                          f"{len(gpus.indices)}x {gpus.name}: {details}. Use more or larger GPUs, a smaller "
                          "model or quantized weights.",
                          "docs/facts/vllm-volta.md §3 (revive_kv); docs/field-report.md ('Model and parallelism "
                          "choice')")
    return LayoutChoice(_choose(feasible, workload, decisions), candidates)


def _choose(feasible: List[Candidate], workload: Workload, decisions: Decisions) -> Candidate:
    good = [c for c in feasible if c.meets_slo] or feasible
    best = max(good, key=lambda c: c.throughput())
    for candidate in sorted(good, key=lambda c: len(c.groups)):
        if candidate.throughput() >= best.throughput() * (1 - TIE_MARGIN):
            best = candidate
            break
    if not best.meets_slo:
        decisions.warnings.append(
            f"no layout meets the SLO (p95 e2e <= {workload.slo_p95_e2e_s:g} s at concurrency {workload.concurrency}"
            f" with {workload.slo_output_tokens} output tokens); best predicted p95 is "
            f"{best.prediction.e2e_p95_s if best.prediction else '?'} s. Queue at the front door below that "
            "concurrency, or add nodes")
    return best


def layout_reason(layout: LayoutChoice, workload: Workload) -> str:
    """Why the chosen layout: every candidate's prediction, and the comparison with the field report's TP 8."""
    chosen, candidates = layout.chosen, layout.candidates
    p = chosen.prediction
    assert p is not None
    rows = []
    for c in candidates:
        if c.feasible and c.prediction:
            rows.append(f"{len(c.groups)}x TP{c.tensor_parallel_size}: {c.throughput():.0f} tok/s, "
                        f"{c.prediction.per_stream_tok_s:g} tok/s/stream, p95 {c.prediction.e2e_p95_s:g} s"
                        + ("" if c.meets_slo else " (misses SLO)"))
        else:
            rows.append(f"TP{c.tensor_parallel_size}: {c.why_not}")
    text = (f"{len(chosen.groups)} replica(s) of TP {chosen.tensor_parallel_size} predicted best at concurrency "
            f"{workload.concurrency}: {chosen.throughput():.0f} tok/s total, {p.per_stream_tok_s:g} tok/s per "
            f"stream, TTFT p50 {p.ttft_p50_s:g} s, p95 e2e {p.e2e_p95_s:g} s (performance model revive_perf, "
            f"anchored on the notes' TP 8 run). Compared: " + "; ".join(rows))
    tp8 = next((c for c in candidates if c.tensor_parallel_size == 8 and c.feasible and c.prediction), None)
    if tp8 is not None and tp8.prediction is not None and chosen is not tp8:
        gain = chosen.throughput() / tp8.throughput() - 1 if tp8.throughput() else 0.0
        text += (f". Versus the notes' single TP 8 replica: {gain:+.0%} throughput, p95 "
                 f"{tp8.prediction.e2e_p95_s:g} -> {p.e2e_p95_s:g} s: each rank reads "
                 f"{8 // chosen.tensor_parallel_size}x the weights per step but "
                 + ("needs no all-reduce at all" if chosen.tensor_parallel_size == 1 else
                    f"all-reduces over {chosen.tensor_parallel_size} ranks instead of 8 "
                    f"({p.allreduce_latency_us:g} us instead of {tp8.prediction.allreduce_latency_us:g} us"
                    + ("" if chosen.described[0].crosses_socket else ", never across sockets") + ")")
                 + ", and each replica batches and prefills only its share of the streams")
    return text
