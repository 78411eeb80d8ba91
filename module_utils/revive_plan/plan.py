"""The plan: a typed, immutable description of the release to run (the servers' argv and environment per
replica, the settings, the KV estimate, the layout compared, the reasons), built from what the rules and the
layout decided, and its `as_dict()`: what library/vllm_plan.py returns and `bin/revive plan --json` prints.

Every emitted flag is checked against the release's argument table: an unknown flag or a bad choice raises
PlanError (a planner bug), never a server that dies at start.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ansible.module_utils.revive_kv import GiB, KvEstimate, kv_cache_plan
from ansible.module_utils.revive_plan.gpus import GpuSet
from ansible.module_utils.revive_plan.inputs import Decisions, PlanError, PlanRefusal, PlanRequest, check_ports
from ansible.module_utils.revive_plan.layout import (
    MAX_NUM_SEQS_HEADROOM,
    Candidate,
    Group,
    LayoutChoice,
    layout_reason,
    nccl_env,
)
from ansible.module_utils.revive_plan.pipeline import pipeline_reason
from ansible.module_utils.revive_plan.rules import LONG_MAX_MODEL_LEN_ENV, EngineSettings, swap_space_for
from ansible.module_utils.revive_topology import format_cpu_list

COST_MODEL = "revive_plan.predict_layout (see its module docstring)"
MODEL_KEYS = ("path", "architecture", "model_type", "parameter_count", "weight_bytes", "weights_dtype",
              "quantization", "source")


@dataclass(frozen=True)
class Replica:
    """One server: its GPUs, port, CPUs and NUMA node, argv and environment."""

    index: int
    name: str
    port: int
    gpus: List[int]
    cuda_visible_devices: str
    tensor_parallel_size: int
    socket: Optional[int]
    numa_node: Optional[int]
    cpus: List[int]
    cpu_list: str
    streams: int
    args: List[str]
    env: Dict[str, str]
    nvlink: bool
    slowest_path: str


@dataclass(frozen=True)
class ServerSettings:
    dtype: str
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    swap_space: Optional[float]
    enforce_eager: bool
    block_size: int


@dataclass(frozen=True)
class KvCacheSummary:
    """vLLM's KV sizing per GPU worker of one replica, for the chosen settings."""

    sizing: str
    block_size: int
    bytes_per_block: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    tokens: int
    max_concurrency_at_max_model_len: float
    typical_sequence_tokens: int
    max_concurrency_at_typical_len: float
    budget_bytes: int
    weights_per_gpu_bytes: int
    peak_activation_bytes: int
    non_torch_bytes: int
    kv_bytes: int
    profile_tokens: int
    log_line: str
    per: str

    @classmethod
    def of(cls, kv: KvEstimate, typical_len: int) -> "KvCacheSummary":
        return cls(sizing=kv.sizing, block_size=kv.block_size, bytes_per_block=kv.bytes_per_block,
                   num_gpu_blocks=kv.num_gpu_blocks, num_cpu_blocks=kv.num_cpu_blocks, tokens=kv.tokens,
                   max_concurrency_at_max_model_len=kv.max_concurrency_at_max_model_len,
                   typical_sequence_tokens=typical_len,
                   max_concurrency_at_typical_len=round(kv.tokens / typical_len, 1),
                   budget_bytes=kv.budget_bytes, weights_per_gpu_bytes=kv.weights_per_gpu,
                   peak_activation_bytes=kv.peak_activation, non_torch_bytes=kv.non_torch, kv_bytes=kv.kv_bytes,
                   profile_tokens=kv.profile_tokens, log_line=kv.log_line(),
                   per="GPU worker of one replica (every replica is the same)")


@dataclass(frozen=True)
class GpuSummary:
    name: str
    count: int
    compute_capability: str
    total_bytes: int
    driver_version: Optional[str]
    simulated: bool


@dataclass(frozen=True)
class Plan:
    """A planned release. `as_dict()` is its one rendering (module result, host fact, CLI JSON)."""

    vllm_version: str
    pins: Dict[str, str]
    engine: str
    attention_backend: str
    entrypoint: List[str]
    replicas: List[Replica]
    tensor_parallel_size: int
    pipeline_parallel_size: int
    settings: ServerSettings
    kv_cache: KvCacheSummary
    chosen_groups: List[List[int]]
    candidates: List[Dict[str, Any]]
    workload: Dict[str, Any]
    conversion: Optional[Dict[str, str]]
    metrics: List[str]
    model: Dict[str, Any]
    gpu: GpuSummary
    reasons: List[Dict[str, Any]]
    warnings: List[str]

    def as_dict(self) -> Dict[str, Any]:
        replicas = [dataclasses.asdict(replica) for replica in self.replicas]
        return {
            "vllm_version": self.vllm_version,
            "pins": dict(self.pins),
            "engine": self.engine,
            "attention_backend": self.attention_backend,
            "entrypoint": list(self.entrypoint),
            "args": replicas[0]["args"],
            "env": replicas[0]["env"],
            "replicas": replicas,
            "tensor_parallel_size": self.tensor_parallel_size,
            # stages across nodes: 1 on one node; N > 1 = one replica on N nodes of the group (Ray)
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "nodes": self.pipeline_parallel_size,
            "settings": dataclasses.asdict(self.settings),
            "kv_cache": dataclasses.asdict(self.kv_cache),
            "layout": {"chosen": {"tensor_parallel_size": self.tensor_parallel_size,
                                  "pipeline_parallel_size": self.pipeline_parallel_size,
                                  "replicas": len(self.replicas), "groups": self.chosen_groups},
                       "candidates": self.candidates,
                       "cost_model": COST_MODEL},
            "workload": dict(self.workload),
            "conversion": self.conversion,
            "metrics": list(self.metrics),
            "model": dict(self.model),
            "gpu": dataclasses.asdict(self.gpu),
            "reasons": self.reasons,
            "warnings": self.warnings,
            "refused": False,
        }


def _record_limits(chosen: Candidate, settings: EngineSettings, request: PlanRequest, decisions: Decisions) -> None:
    """The batch limits' decisions (max_num_batched_tokens, max_num_seqs) and the KV capacity warning."""
    batched, typical_len = settings.max_num_batched_tokens, settings.typical_sequence_tokens
    overrides = request.overrides
    if batched < chosen.max_num_seqs:
        raise PlanRefusal(f"max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs "
                          f"({chosen.max_num_seqs}).", "docs/facts/vllm-volta.md §3.5")
    decisions.add("max_num_batched_tokens", batched,
                  ("set by the operator" if overrides.max_num_batched_tokens else
                   f"at least max-model-len ({settings.max_model_len}): without chunked prefill 0.5.4 refuses "
                   "less; 8192 for 4K context as in the notes"),
                  "docs/facts/vllm-volta.md §3.5; docs/field-report.md ('Launch command')")
    kv = chosen.kv
    assert kv is not None
    if overrides.max_num_seqs is not None:
        decisions.add("max_num_seqs", chosen.max_num_seqs, "set by the operator", "operator override")
    else:
        decisions.add("max_num_seqs", chosen.max_num_seqs,
                      f"{MAX_NUM_SEQS_HEADROOM}x the {chosen.streams_per_replica} streams each replica expects (the "
                      f"notes ran 128 for 32), within 256 and within the {kv.tokens // typical_len} sequences of "
                      f"{typical_len} tokens its KV cache holds; queue at the front door rather than raise it",
                      "docs/field-report.md ('Launch command'), ('Results')")
    if not chosen.kv_holds_streams:
        decisions.warnings.append(
            f"the KV cache holds {kv.tokens} tokens per replica, fewer than {chosen.streams_per_replica} streams x "
            f"{typical_len} tokens: expect preemptions (vllm:num_preemptions_total) at full concurrency")


def _server_flags(model: Dict[str, Any], chosen: Candidate, settings: EngineSettings, swap: Optional[float],
                  request: PlanRequest, decisions: Decisions) -> Tuple[List[str], List[str]]:
    """(flags before --port, flags after it) shared by every replica, with the decisions the flags carry."""
    release, tp, serve = settings.release, chosen.tensor_parallel_size, request.serve
    model_path = serve.model_path or str(model.get("path"))
    served_name = serve.served_model_name or os.path.basename(model_path.rstrip("/")) or "model"
    common: List[str] = ["--model", model_path, "--served-model-name", served_name, "--host", serve.host]
    flags: List[str] = ["--tensor-parallel-size", str(tp), "--dtype", settings.dtype,
                        "--gpu-memory-utilization", f"{settings.gpu_memory_utilization:g}",
                        "--max-model-len", str(settings.max_model_len), "--max-num-seqs", str(chosen.max_num_seqs),
                        "--max-num-batched-tokens", str(settings.max_num_batched_tokens)]
    pp = chosen.pipeline_parallel_size
    if pp > 1:
        flags += ["--pipeline-parallel-size", str(pp), "--distributed-executor-backend", "ray"]
        decisions.add("distributed_executor_backend", "ray",
                      f"{pp} pipeline stages on {pp} nodes: only Ray serves across nodes (mp stays on one node), "
                      "and only through the OpenAI server's AsyncLLMEngine; the flag is explicit so vLLM never "
                      "falls back to a private one-node Ray", "docs/facts/multi-node.md §1.1, §1.3")
    if settings.enforce_eager:
        flags.append("--enforce-eager")
    if swap is not None:
        flags += ["--swap-space", str(int(swap)) if float(swap).is_integer() else f"{swap:g}"]
    if model.get("requires_trust_remote_code"):
        flags.append("--trust-remote-code")
        decisions.add("trust_remote_code", True, "config.json maps its classes to code in the model repository "
                      "(auto_map); vLLM loads the config through transformers, which needs it. Only serve models "
                      "from a source you trust.", "vLLM model loading (config auto_map)")
    group0 = chosen.described[0]
    if tp > 1 and not group0.nvlink_all:
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
        decisions.add("disable_custom_all_reduce", True, why, "docs/facts/vllm-volta.md §7.1")
    if release.get("metrics_need_disable_frontend_multiprocessing") and request.workload.metrics:
        flags.append("--disable-frontend-multiprocessing")
        decisions.add("disable_frontend_multiprocessing", True, "with frontend multiprocessing (0.5.4's default) "
                      "/metrics has no vllm:* series; the notes' dashboards need them",
                      "docs/facts/vllm-volta.md §4.2 (#7188); docs/field-report.md ('Failures met') 6")
    if release.get("request_logging_default"):
        flags.append("--disable-log-requests")
        decisions.add("disable_log_requests", True, f"vLLM {release.version} logs every request's prompt by default",
                      "docs/facts/vllm-volta.md §2.1; docs/field-report.md ('Launch command')")
    return common, flags


def _replica(number: int, port: int, members: List[int], group: Group, gpus: GpuSet, chosen: Candidate,
             settings: EngineSettings, args: List[str]) -> Tuple[Replica, str, str]:
    """(the replica, why its NCCL variables, why its CPU pinning)."""
    release, volta = settings.release, settings.volta
    env: Dict[str, str] = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                           "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in members)}
    disable, nccl_why = nccl_env(group)
    if disable:
        env["NCCL_P2P_DISABLE"] = "1"
        env["NCCL_SHM_DISABLE"] = "1"
    if volta:
        env["VLLM_ATTENTION_BACKEND"] = settings.attention_backend
    env.update(release.get("engine_env", {}).get("below_8" if volta else "from_8", {}) or {})
    if settings.long_max_model_len:
        env[LONG_MAX_MODEL_LEN_ENV] = "1"
    devices = [d for d in gpus.devices if int(d["index"]) in members]
    sockets = {d.get("socket") for d in devices}
    numa = {d.get("numa_node") for d in devices}
    cpus: List[int] = sorted({c for d in devices for c in (d.get("cpus") or [])})
    pinned = len(sockets) == 1 and None not in sockets and bool(cpus)
    if pinned:
        pinning_why = (f"replica {number} (GPUs {members}) hangs off socket {next(iter(sockets))}: its engine "
                       f"and workers run on CPUs {format_cpu_list(cpus)}, memory on NUMA node {next(iter(numa))}")
    else:
        pinning_why = f"replica {number} (GPUs {members}) spans sockets: no CPU/NUMA pinning"
    errors = release.validate_argv(args)
    if errors:
        raise PlanError(f"planner emitted an argv vLLM {release.version} rejects: {'; '.join(errors)}")
    replica = Replica(
        index=number, name=f"vllm-{number}", port=port, gpus=members,
        cuda_visible_devices=env["CUDA_VISIBLE_DEVICES"], tensor_parallel_size=chosen.tensor_parallel_size,
        socket=next(iter(sockets)) if pinned else None,
        numa_node=next(iter(numa)) if pinned and len(numa) == 1 else None,
        cpus=cpus if pinned else [], cpu_list=format_cpu_list(cpus) if pinned else "",
        streams=chosen.streams_per_replica, args=args, env=env, nvlink=group.nvlink_all,
        slowest_path=group.slowest_path)
    return replica, nccl_why, pinning_why


def build_plan(model: Dict[str, Any], gpus: GpuSet, settings: EngineSettings, layout: LayoutChoice,
               request: PlanRequest, decisions: Decisions) -> Plan:
    """The plan of the chosen layout: the remaining decisions, every replica's argv and environment."""
    chosen, release = layout.chosen, settings.release
    tp, replica_count, pp = chosen.tensor_parallel_size, len(chosen.groups), chosen.pipeline_parallel_size
    if pp > 1:
        decisions.add("tensor_parallel_size", tp, f"TP inside a node, never across the node network; {pp} stages "
                      "across nodes (pipeline_parallel_size)", "docs/facts/multi-node.md §1.5")
        decisions.add("pipeline_parallel_size", pp, pipeline_reason(layout, gpus),
                      "docs/facts/multi-node.md §1.4; cost model (revive_perf.pipeline_loop)")
        decisions.warnings.append(
            f"the plan serves one replica across {pp} nodes on Ray (vLLM {release.version}): its stages run on "
            "every node of the group and roll together; guided and tool-call output is wrong with pipeline "
            "parallelism in 0.5.4 (#7194)")
    else:
        decisions.add("tensor_parallel_size", tp, layout_reason(layout, request.workload),
                      "docs/field-report.md ('Model and parallelism choice'); docs/facts/prior-art.md §3 item 3 "
                      "(2xTP4 per socket); cost model")
    idle = sorted(set(gpus.indices) - {g for group in chosen.groups for g in group})
    if idle:
        decisions.warnings.append(f"GPUs {idle} stay idle: they do not make a whole TP-{tp} group")
    _record_limits(chosen, settings, request, decisions)
    check_ports(request.serve, replica_count)
    swap = swap_space_for(settings, tp, replica_count, request, decisions)
    stage = ({"pipeline_parallel_size": pp, "weights_bytes_per_gpu": chosen.kv.weights_per_gpu,
              "stage_layers": max(chosen.stage_layers)} if pp > 1 and chosen.kv else {})
    final_kv = kv_cache_plan(model, tp, gpus.total_bytes, settings.gpu_memory_utilization, swap or 0,
                             max_num_batched_tokens=settings.max_num_batched_tokens,
                             max_num_seqs=chosen.max_num_seqs, max_model_len=settings.max_model_len,
                             dtype=settings.dtype, release=release.version, sizing=settings.kv_sizing, **stage)
    common, flags = _server_flags(model, chosen, settings, swap, request, decisions)

    replicas: List[Replica] = []
    pinning_reasons: List[str] = []
    nccl_reasons: List[str] = []
    for number, (members, group) in enumerate(zip(chosen.groups, chosen.described)):
        port = request.serve.base_port + number
        args = common + ["--port", str(port)] + flags
        replica, nccl_why, pinning_why = _replica(number, port, members, group, gpus, chosen, settings, args)
        replicas.append(replica)
        nccl_reasons.append(nccl_why)
        pinning_reasons.append(pinning_why)
    decisions.add("nccl", {r.name: {k: v for k, v in r.env.items() if k.startswith("NCCL")} for r in replicas},
                  "; ".join(sorted(set(nccl_reasons))),
                  "docs/field-report.md ('Launch command') (NCCL paragraph); docs/facts/vllm-volta.md §7.1")
    decisions.add("cuda_visible_devices", {r.name: r.cuda_visible_devices for r in replicas},
                  "CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA's indices those of NVML and nvidia-smi, so "
                  "CUDA_VISIBLE_DEVICES names exactly the GPUs the probe saw (CUDA's default order is fastest "
                  "first)", "docs/facts/nvml.md; CUDA environment variables")
    decisions.add("cpu_pinning", {r.name: r.cpu_list for r in replicas}, "; ".join(pinning_reasons),
                  "docs/facts/prior-art.md §3 item 3 (CPUAffinity/NUMAPolicy per socket)")
    if settings.volta:
        decisions.add("vllm_attention_backend_env", settings.attention_backend, "recorded in the environment so "
                      "the unit says what vLLM selects anyway on Volta",
                      "docs/facts/prior-art.md §6 (record VLLM_ATTENTION_BACKEND)")

    kv = KvCacheSummary.of(final_kv, settings.typical_sequence_tokens)
    decisions.add("kv_cache", f"{kv.num_gpu_blocks} GPU / {kv.num_cpu_blocks} CPU blocks",
                  f"{kv.tokens} tokens per replica = {kv.max_concurrency_at_max_model_len:g} sequences of "
                  f"{settings.max_model_len} or {kv.max_concurrency_at_typical_len:g} of {kv.typical_sequence_tokens}; "
                  f"per GPU: budget {kv.budget_bytes / GiB:.2f} GiB - weights {kv.weights_per_gpu_bytes / GiB:.2f} - "
                  f"profile peak {kv.peak_activation_bytes / GiB:.2f} - non-torch {kv.non_torch_bytes / GiB:.2f} = KV "
                  f"{kv.kv_bytes / GiB:.2f} GiB", f"docs/facts/vllm-volta.md §3 ({kv.sizing}); revive_kv")
    workload = request.workload
    return Plan(
        vllm_version=release.version, pins=dict(release.pins), engine=settings.engine,
        attention_backend=settings.attention_backend, entrypoint=list(release.entrypoint), replicas=replicas,
        tensor_parallel_size=tp, pipeline_parallel_size=pp,
        settings=ServerSettings(dtype=settings.dtype, gpu_memory_utilization=settings.gpu_memory_utilization,
                                max_model_len=settings.max_model_len, max_num_seqs=chosen.max_num_seqs,
                                max_num_batched_tokens=settings.max_num_batched_tokens, swap_space=swap,
                                enforce_eager=settings.enforce_eager, block_size=final_kv.block_size),
        kv_cache=kv, chosen_groups=chosen.groups, candidates=[c.summary() for c in layout.candidates],
        workload={"concurrency": workload.concurrency, "slo_p95_e2e_s": workload.slo_p95_e2e_s,
                  "slo_output_tokens": workload.slo_output_tokens,
                  "typical_prompt_tokens": workload.typical_prompt_tokens, "metrics": workload.metrics},
        conversion=settings.conversion, metrics=list(release.metrics),
        model={k: model.get(k) for k in MODEL_KEYS},
        gpu=GpuSummary(name=gpus.name, count=len(gpus.indices), compute_capability=f"{gpus.cc[0]}.{gpus.cc[1]}",
                       total_bytes=gpus.total_bytes, driver_version=gpus.facts.get("driver_version"),
                       simulated=bool(gpus.facts.get("simulated"))),
        reasons=decisions.reasons, warnings=decisions.warnings)
