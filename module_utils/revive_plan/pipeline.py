"""Plans across nodes (issue 16): tensor parallel inside a node, pipeline parallel across nodes.

A group of N identical nodes (NodeGroup) serves one model as one replica of TP ranks per node and PP stages, one
per node - never TP across the node network, which is slower than any path inside a node. The planner compares
PP = 1 .. N and takes the smallest stage count whose largest stage fits weights + profile peak + the KV the
workload needs (docs/facts/multi-node.md §1-2):

* Layer split as 0.5.4 does it: `layers // PP` per stage, the remainder on the last (v0.5.4
  vllm/distributed/utils.py:56-86). The first stage holds the embedding, the last the LM head (the same matrix
  when the embeddings are tied, loaded on both), so the largest stage sizes the weights; the engine keeps the
  fewest KV blocks of any worker, so the stage with the most layers sizes the KV cache.
* One scheduler per stage (a virtual engine) shares the scheduler settings and gets `1 / PP` of the KV blocks
  (v0.5.4 core/scheduler.py:287-293, worker/cache_engine.py:42-47): each holds `ceil(streams / PP)` streams.
* The cost model is module_utils/revive_perf.py's `pipeline_loop`: the stage's step, the stage-to-stage send of
  hidden + residual over the node link (`link_gbit`, default 25 Gbit/s), the bubble when fewer streams than
  stages are in flight.
* vLLM's own limits come first, before anything is installed: the release must pipeline the model's
  architecture (the data's `pipeline_parallel` list; vLLM's refusal text otherwise) and serve across nodes on Ray
  (`--distributed-executor-backend ray`, which only the OpenAI server - the planner's entry point - supports).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from ansible.module_utils.revive_kv import (DTYPE_BYTES, kv_bytes_per_token, pipeline_stage_layers,
                                           pipeline_stage_weight_bytes)
from ansible.module_utils.revive_perf import ModelShape, gpu_spec, pipeline_loop
from ansible.module_utils.revive_plan.gpus import GpuSet
from ansible.module_utils.revive_plan.inputs import Decisions, NodeGroup, Overrides, PlanRefusal, Workload
from ansible.module_utils.revive_plan.layout import (Candidate, LayoutChoice, describe_group, form_groups, nccl_env,
                                                    size_kv, tp_divides_heads, transport_for)
from ansible.module_utils.revive_plan.rules import EngineSettings

SOURCE = "docs/facts/multi-node.md §1 (v0.5.4 vllm/config.py, distributed/utils.py, core/scheduler.py)"


def stage_layers(num_layers: int, stages: int) -> List[int]:
    """0.5.4's split (module_utils/revive_kv.py pipeline_stage_layers); a stage count without a layer for every stage
    is a refusal."""
    try:
        return pipeline_stage_layers(num_layers, stages)
    except ValueError as exc:
        raise PlanRefusal(str(exc), SOURCE) from None


def largest_stage_weight_bytes(model: Dict[str, Any], layers: List[int], dtype: str) -> int:
    """Weight bytes of the heaviest stage (all its TP ranks together; module_utils/revive_kv.py
    pipeline_stage_weight_bytes): the first holds the embedding, the last the LM head."""
    return max(pipeline_stage_weight_bytes(model, layers, DTYPE_BYTES[dtype]))


def pp_refusal(model: Dict[str, Any], settings: EngineSettings) -> Optional[str]:
    """Why this release cannot pipeline this model, in vLLM's words where vLLM has them; None when it can."""
    release = settings.release
    support = release.get("pipeline_parallel")
    if not support:
        return (f"vLLM {release.version} is not planned across nodes: data/vllm-releases.yml records no pipeline-"
                "parallel support for it (only 0.5.4's list is taken from its source so far). Pin "
                "--vllm-version 0.5.4 for a multi-node group")
    architecture = str(model.get("architecture") or "")
    if architecture not in support["architectures"]:
        return (support["refusal"].format(architectures=list(support["architectures"]))
                + f" (config.json names {architecture or 'no architecture'}; {support['source']})")
    return None


def _evaluate(candidate: Candidate, model: Dict[str, Any], gpus: GpuSet, settings: EngineSettings,
              workload: Workload, overrides: Overrides, group: NodeGroup) -> None:
    tp, pp = candidate.tensor_parallel_size, candidate.pipeline_parallel_size
    layers = stage_layers(int(model["num_hidden_layers"]), pp)
    candidate.stage_layers = layers
    typical_len = settings.typical_sequence_tokens
    streams = math.ceil(workload.concurrency / pp)          # per virtual engine
    weights = largest_stage_weight_bytes(model, layers, settings.dtype)
    kv, max_num_seqs = size_kv(model, tp, gpus, settings, streams, overrides, pipeline_parallel_size=pp,
                               weights_bytes_per_gpu=math.ceil(weights / tp), stage_layers=max(layers))
    candidate.kv, candidate.max_num_seqs, candidate.streams_per_replica = kv, max_num_seqs, streams
    candidate.concurrency = workload.concurrency
    if kv.errors:
        candidate.why_not = (f"{pp} node(s): the largest stage's weights {kv.weights_per_gpu / 2 ** 30:.1f} GiB + "
                             f"profile peak {(kv.peak_activation + kv.non_torch) / 2 ** 30:.1f} GiB per GPU leave "
                             f"{max(kv.tokens, 0)} KV tokens: {kv.errors[0]}")
        return
    candidate.feasible = True
    candidate.kv_holds_streams = kv.tokens >= streams * typical_len
    described = candidate.described[0]
    p2p_off, _ = nccl_env(described)
    stage = ModelShape(int(int(model["parameter_count"]) * max(layers) / sum(layers)), weights,
                       max(layers), int(model["hidden_size"]),
                       kv_bytes_per_token(model) * max(layers) // int(model["num_hidden_layers"]))
    candidate.prediction = pipeline_loop(
        stage, gpu_spec(gpus.name, gpus.architecture), tp, transport_for(described, p2p_off, p2p_off),
        described.crosses_socket, workload.concurrency, workload.typical_prompt_tokens, workload.slo_output_tokens,
        settings.enforce_eager, pp, group.link_bytes_per_s)
    candidate.meets_slo = candidate.prediction.e2e_p95_s <= workload.slo_p95_e2e_s and candidate.kv_holds_streams


def node_tensor_parallel_size(model: Dict[str, Any], gpus: GpuSet, overrides: Overrides) -> int:
    """TP inside one node: the operator's, else the largest of 16, 8, 4, 2, 1 that fits the node and divides the
    heads (a whole node per stage)."""
    if overrides.tensor_parallel_size:
        problem = tp_divides_heads(model, overrides.tensor_parallel_size)
        if problem:
            raise PlanRefusal(f"--tensor-parallel-size {overrides.tensor_parallel_size}: {problem}",
                              "docs/facts/vllm-volta.md §3.3; vLLM ModelConfig checks")
        return overrides.tensor_parallel_size
    for tp in (16, 8, 4, 2, 1):
        if tp <= len(gpus.indices) and tp_divides_heads(model, tp) is None:
            return tp
    return 1


def check_stage_override(overrides: Overrides, group: NodeGroup, model: Dict[str, Any]) -> None:
    """The operator's pipeline_parallel_size against the group: a stage per node, a layer per stage."""
    stages = overrides.pipeline_parallel_size
    if not stages:
        return
    if stages > group.nodes:
        raise PlanRefusal(f"pipeline_parallel_size (--pipeline-parallel-size) {stages} needs {stages} nodes, one "
                          f"stage each, and the serving group has {group.nodes}. Fix: put {stages} identical nodes "
                          "in the group (revive_serving_group; --nodes for bin/revive plan), or set at most "
                          f"{group.nodes}, or leave it out to let the planner choose.", SOURCE)
    stage_layers(int(model["num_hidden_layers"]), stages)


def choose_pipeline(model: Dict[str, Any], gpus: GpuSet, settings: EngineSettings, workload: Workload,
                    overrides: Overrides, group: NodeGroup, decisions: Decisions) -> LayoutChoice:
    """PP = 1 .. group.nodes with TP inside a node; the smallest PP that holds the workload (see the module
    docstring); refused when none fits, or when more than one node is needed and the release cannot pipeline."""
    tp = node_tensor_parallel_size(model, gpus, overrides)
    members = form_groups(gpus, tp)[:1]
    candidates: List[Candidate] = []
    stage_counts = ([overrides.pipeline_parallel_size] if overrides.pipeline_parallel_size
                    else range(1, min(group.nodes, int(model["num_hidden_layers"])) + 1))
    for pp in stage_counts:
        candidate = Candidate(tp, members, [describe_group(gpus, members[0])], pipeline_parallel_size=pp)
        candidates.append(candidate)
        _evaluate(candidate, model, gpus, settings, workload, overrides, group)
    feasible = [c for c in candidates if c.feasible]
    if not feasible:
        details = "; ".join(c.why_not.rstrip(".") for c in candidates)
        raise PlanRefusal(f"{model.get('path')} ({model.get('weight_bytes', 0) / 1e9:.1f} GB) does not fit "
                          f"{group.nodes} node(s) of {len(gpus.indices)}x {gpus.name} with TP {tp} per node: "
                          f"{details}. Add nodes, use larger GPUs, a smaller model or quantized weights.", SOURCE)
    holding = [c for c in feasible if c.kv_holds_streams]
    chosen = min(holding or feasible, key=lambda c: c.pipeline_parallel_size)
    if overrides.pipeline_parallel_size:
        decisions.warnings.append(
            f"pipeline_parallel_size {chosen.pipeline_parallel_size} is the operator's: the planner compares no "
            "other stage count")
    if chosen.pipeline_parallel_size > 1:
        refusal = pp_refusal(model, settings)
        if refusal:
            raise PlanRefusal(f"{model.get('path')} needs {chosen.pipeline_parallel_size} nodes of "
                              f"{len(gpus.indices)}x {gpus.name}, and {refusal}", SOURCE)
    if not chosen.kv_holds_streams:
        decisions.warnings.append(
            f"even {chosen.pipeline_parallel_size} node(s) hold {chosen.kv.tokens if chosen.kv else 0} KV tokens per "
            f"virtual engine, fewer than {chosen.streams_per_replica} streams of "
            f"{settings.typical_sequence_tokens} tokens: requests will queue; add nodes")
    if chosen.pipeline_parallel_size < group.nodes:
        decisions.warnings.append(
            f"the group has {group.nodes} nodes and {chosen.pipeline_parallel_size} hold the model and the "
            f"workload's KV: the plan uses {chosen.pipeline_parallel_size}")
    return LayoutChoice(chosen, candidates)


def pipeline_reason(layout: LayoutChoice, gpus: GpuSet) -> str:
    """Why this many stages: every stage count compared."""
    chosen = layout.chosen
    parts = []
    for candidate in layout.candidates:
        if not candidate.feasible:
            parts.append(f"PP {candidate.pipeline_parallel_size}: {candidate.why_not}")
            continue
        kv = candidate.kv
        predicted = candidate.prediction
        parts.append(f"PP {candidate.pipeline_parallel_size} (layers {candidate.stage_layers}): "
                     f"{kv.tokens if kv else 0} KV tokens per virtual engine for {candidate.streams_per_replica} "
                     f"streams{'' if candidate.kv_holds_streams else ' (too few)'}, predicted p95 e2e "
                     f"{predicted.e2e_p95_s if predicted else '?'} s, hop {predicted.stage_hop_ms if predicted else 0}"
                     " ms")
    return (f"TP {chosen.tensor_parallel_size} inside each node of {len(gpus.indices)}x {gpus.name}, PP "
            f"{chosen.pipeline_parallel_size} across nodes: the fewest stages that hold the weights and the "
            "workload's KV. " + "; ".join(parts))
