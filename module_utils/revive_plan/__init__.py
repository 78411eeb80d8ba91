"""The planner: the GPU facts + the model facts + workload -> a vLLM release to run.

The GPU facts are what nvml_facts returns under `gpu` (module_utils/revive_nvml.py); the model facts what
model_inspect returns under `model` (module_utils/revive_model.py).

``plan`` returns a ``Plan`` (plan.py) - vLLM version and pins, the server argv, the environment, the replica
layout (GPU indices, CUDA_VISIBLE_DEVICES, port, CPUs/NUMA node), a KV-cache estimate, one reason per decision
with its source, warnings - and ``plan_release`` its ``as_dict()``, what library/vllm_plan.py and
`bin/revive plan` return; both raise ``PlanRefusal`` with the reason when the hardware/model/release
combination will not run. Sources: docs/field-report.md (the field report), docs/facts/vllm-volta.md (vLLM on
Volta), "data" = data/vllm-releases.yml.

Package layout: inputs.py (workload, overrides, serving, package source, decisions, refusals), gpus.py (the
GPU set from facts or a synthetic spec), rules.py (release, dtype, quantization, context, engine flags, swap),
layout.py (TP groups, NCCL transport, candidates and the choice, through module_utils/revive_perf.py's
performance model), pipeline.py (a group of nodes: TP inside a node, PP across nodes), plan.py (the Plan and its
rendering); this file runs them in order.

Rules (each has a test in tests/unit/test_plan*.py):

* Release: the operator's pin, else the data's default for the lowest compute capability; refused when
  the release has no kernels for the CC (min_compute_capability, the Volta cut-offs: 0.20+ refused), when
  the driver branch or CUDA driver version is below the release's, or its engine is "none" on this CC;
  refused when a compiled dependency of the release (vLLM's _C, xFormers, torch: the data's ``kernels``,
  scanned from the wheels) has no code for the GPU's sm, and when the package source is PyPI but the
  release's dependencies can no longer be satisfied from it (the data's ``installability``: 0.5.4).
* dtype ``half`` on CC < 8.0 (0.5.4 never falls back: ``auto`` + BF16 weights dies at start,
  docs/facts/vllm-volta.md §1.4); BF16 weights on Volta are a warning that the sync role converts them (or a
  refusal when conversion is not allowed). On CC >= 8.0 the checkpoint dtype (bfloat16/float16) is kept.
* ``--enforce-eager`` and ``VLLM_ATTENTION_BACKEND=XFORMERS`` on Volta; ``--gpu-memory-utilization`` 0.92
  on Volta (docs/field-report.md ('Launch command'): 0.95 OOM'd), the release default elsewhere.
* Quantization: the release's minimum CC per method (AWQ 7.5, Marlin/FP8 8.0: refused below), GPTQ on
  Volta allowed with the field report's warning, bitsandbytes only at TP 1.
* Tensor parallel size: divides the attention heads, divides (or is a multiple of) the KV heads, fits
  weights + profile peak + a KV floor; chosen among 1, 2, 4, 8 ... by the performance model.
* NCCL: ``NCCL_P2P_DISABLE=1`` and ``NCCL_SHM_DISABLE=1`` only for a replica whose GPUs have no NVLink
  and whose paths cross PHB/NODE/SYS; never with NVLink. ``--disable-custom-all-reduce`` when TP > 1 and
  the replica is not fully NVLink-connected (TP 2 on PCIe keeps it on and hangs,
  docs/facts/vllm-volta.md §7.1; above 2 vLLM disables it anyway, the flag silences the warning).
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and ``CUDA_VISIBLE_DEVICES`` per replica.
* ``--max-num-batched-tokens`` >= ``--max-model-len`` (0.5.4 refuses otherwise,
  docs/facts/vllm-volta.md §3.5) and >= ``--max-num-seqs``; ``--max-num-seqs`` from the expected
  concurrency and the KV capacity; ``--swap-space`` bounded by host RAM (pinned at start by every worker
  of every replica, docs/facts/vllm-volta.md §3.4).
* ``--disable-frontend-multiprocessing`` on 0.5.4 when metrics are wanted (docs/facts/vllm-volta.md §4.2);
  ``--disable-log-requests`` where requests are logged by default (0.5.4).
* Every emitted flag is checked against the release's argument table: an unknown flag or a bad choice
  raises ``PlanError`` (a planner bug), never a server that dies at start.
* KV estimate by ``revive_kv`` with the release's own sizing.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from ansible.module_utils.revive_plan.gpus import gpu_set_from_facts, synthetic_gpu_facts  # noqa: F401 - re-exported
from ansible.module_utils.revive_plan.inputs import (  # noqa: F401 - re-exported
    PUBLIC_INDEX,
    BOUNDS,
    Decisions,
    NodeGroup,
    Overrides,
    PackageSource,
    PlanError,
    PlanInputError,
    PlanRefusal,
    PlanRequest,
    Serve,
    Workload,
    check_against_gpus,
)
from ansible.module_utils.revive_plan.layout import choose_layout
from ansible.module_utils.revive_plan.pipeline import check_stage_override, choose_pipeline
from ansible.module_utils.revive_plan.plan import Plan, build_plan
from ansible.module_utils.revive_plan.rules import engine_settings
from ansible.module_utils.revive_releases import ReleaseData


def plan(
    gpu_facts: Dict[str, Any],
    model: Dict[str, Any],
    releases: ReleaseData,
    workload: Optional[Workload] = None,
    overrides: Optional[Overrides] = None,
    serve: Optional[Serve] = None,
    host_ram_bytes: Optional[int] = None,
    source: Optional[PackageSource] = None,
    group: Optional[NodeGroup] = None,
) -> Plan:
    """Plan a release (see the module docstring); raises PlanInputError, PlanRefusal or PlanError. `group`: the
    nodes that serve the model together (more than one: TP inside a node, PP across them, pipeline.py)."""
    request = PlanRequest(workload=workload or Workload(), overrides=overrides or Overrides(), serve=serve or Serve(),
                          host_ram_bytes=host_ram_bytes, source=source or PackageSource(),
                          group=group or NodeGroup())
    decisions = Decisions()
    if gpu_facts.get("simulated"):
        origin = next(iter(gpu_facts.get("notes") or []), "lab or synthetic facts")
        decisions.warnings.append(f"GPU facts are simulated ({origin}): the plan is for the described hardware, "
                                  "not for a probed one")
    check_against_gpus(request.overrides, [int(d["index"]) for d in gpu_facts.get("devices", [])])
    gpus = gpu_set_from_facts(gpu_facts, request.overrides.exclude_gpus, decisions)
    settings = engine_settings(model, gpus, releases, request, decisions)
    check_stage_override(request.overrides, request.group, model)
    layout = None
    if request.group.nodes > 1 and request.overrides.pipeline_parallel_size != 1:
        layout = choose_pipeline(model, gpus, settings, request.workload, request.overrides, request.group, decisions)
        if layout.chosen.pipeline_parallel_size == 1:
            layout = None  # one node holds it: the single-node layouts compete as for any node
    if layout is None:
        layout = choose_layout(model, gpus, settings, request.workload, request.overrides, decisions)
    return build_plan(model, gpus, settings, layout, request, decisions)


def plan_release(*args: Any, **kwargs: Any) -> Dict[str, Any]:
    """The plan as the module returns it and the CLI prints it: `plan(...).as_dict()`, same arguments."""
    return plan(*args, **kwargs).as_dict()
