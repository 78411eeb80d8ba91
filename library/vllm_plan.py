#!/usr/bin/python
"""Ansible module: plan the vLLM release (version, argv, environment, replicas, KV cache) for a node."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_plan
short_description: Plan a vLLM release for a node from its GPU facts and a model's facts
description:
  - Derives the vLLM release that runs well on the node - version and pins, the server argv, the
    environment, the replica layout (GPU indices, C(CUDA_VISIBLE_DEVICES), port, CPUs and NUMA node), a
    KV-cache estimate with vLLM's own sizing - with one reason per decision citing its source, and
    warnings; or refuses, with the reason, a combination that will not run (no kernels for the compute
    capability, AWQ/Marlin/FP8 on Volta, a model that does not fit, a Gemma-2 on xFormers, an old driver).
  - The rules are those of the field report and of the vLLM 0.5.4 facts (C(docs/field-report.md),
    C(docs/facts/vllm-volta.md)), listed in C(module_utils/revive_plan/__init__.py); the tensor-parallel
    layout comes from the performance model of C(module_utils/revive_perf.py), calibrated against the field
    report's measurements (C(data/field-calibration.yml)).
  - Pure computation on the controller's data; nothing on the host changes. Check mode computes the same plan.
  - The release data reaches the module as a parameter (AnsiballZ ships no data files); pass
    C(data/vllm-releases.yml) through C(lookup('file', ...) | from_yaml).
version_added: "0.1.0"
author: revive planner
options:
  gpu:
    description: The GPU facts, as C(nvml_facts) returns them under C(gpu).
    type: dict
    required: true
  model:
    description: The model facts, as C(model_inspect) returns them under C(model).
    type: dict
    required: true
  releases:
    description: The parsed C(data/vllm-releases.yml); validated before use.
    type: dict
    required: true
  workload:
    description: What the endpoint must serve. Defaults are the field report's workload.
    type: dict
    default: {}
    suboptions:
      max_model_len:
        description:
          - Longest prompt plus completion; default 4096 (the notes') capped by the model.
          - 1 to 2147483647 and at most the model's maximum (above it the plan is refused); leave it out to let
            the planner choose.
        type: int
      concurrency:
        description: Concurrent requests the node must serve; 1 to 2147483647.
        type: int
        default: 32
      slo_p95_e2e_s:
        description: Target p95 end-to-end latency, seconds; more than 0 and at most 1000000 (NaN and inf refused).
        type: float
        default: 12.0
      slo_output_tokens:
        description: Output tokens per request the SLO is stated for (max_tokens); 1 to 2147483647.
        type: int
        default: 200
      typical_prompt_tokens:
        description: Typical prompt length, tokens; 1 to 2147483647.
        type: int
        default: 256
      metrics:
        description: Whether C(/metrics) must carry the C(vllm:*) series (0.5.4 then needs C(--disable-frontend-multiprocessing)).
        type: bool
        default: true
  overrides:
    description: Operator choices that replace the planner's; each is still checked.
    type: dict
    default: {}
    suboptions:
      vllm_version: {description: Pin this release (must be in the release data)., type: str}
      tensor_parallel_size:
        description: Use this TP size (refused if the heads or memory do not allow it); 1 to 2147483647 and at most
          the GPUs left after O(overrides.exclude_gpus) (more is a refusal); 0 or unset lets the planner choose.
        type: int
      pipeline_parallel_size:
        description:
          - Pipeline stages of a serving group's replica, one per node (O(group)); 1 to 64 and at most the group's
            nodes (more is a refusal); 0 or unset lets the planner choose the fewest that hold the weights and the
            workload's KV; 1 plans every member as a single node.
        type: int
      gpu_memory_utilization:
        description: Fraction of each GPU vLLM may use; more than 0 and at most 1.
        type: float
      max_num_seqs: {description: Sequences scheduled at once per replica; 1 to 2147483647., type: int}
      max_num_batched_tokens:
        description: Tokens per engine step (at least max_model_len); 1 to 2147483647; 0 or unset lets the planner
          choose.
        type: int
      swap_space:
        description: CPU swap GiB per GPU (pinned at start; bounded by host RAM); 0 to 1048576.
        type: float
      exclude_gpus:
        description: GPU indices not to use (e.g. quarantined by the health gate); each 0 to 1023. An index the node
          does not have, or excluding every GPU, is a refusal.
        type: list
        elements: int
        default: []
      allow_bf16_conversion: {description: Accept BF16 weights on a GPU without BF16 (the sync role converts); refuse when false., type: bool, default: true}
      allow_long_max_model_len:
        description: Accept a O(workload.max_model_len) above the model's own maximum; the replicas then get
          C(VLLM_ALLOW_LONG_MAX_MODEL_LEN=1) and the plan a warning. Refused when false (the default).
        type: bool
        default: false
  serve:
    description: How the server is reached.
    type: dict
    default: {}
    suboptions:
      model_path: {description: Model directory as the server sees it (default the inspected path)., type: str}
      served_model_name: {description: Name clients use (default the directory name)., type: str}
      host: {description: Address the server binds., type: str, default: 0.0.0.0}
      base_port:
        description: Port of replica 0; replica N listens on base_port + N; 1 to 65535, and the last replica's port at
          most 65535.
        type: int
        default: 8000
  host_ram_mb:
    description:
      - Host RAM in MiB (C(ansible_facts['memtotal_mb'])); bounds C(--swap-space), which is pinned at start.
      - 0 to 4398046511104; 0 or unset means unknown.
    type: int
  package_source:
    description:
      - Where the nodes get Python packages (the runtime role's source). A release whose dependencies PyPI can no
        longer satisfy (the data's C(installability), e.g. 0.5.4) is refused when this is the public index.
    type: dict
    default: {}
    suboptions:
      type: {description: C(index), C(mirror) or C(wheelhouse)., type: str, default: index, choices: [index, mirror, wheelhouse]}
      index_url: {description: The index or mirror's simple API URL., type: str, default: "https://pypi.org/simple"}
  group:
    description:
      - The nodes that serve the model together (issue 16). One node (the default) is the single-node plan; more
        are planned with TP inside a node and PP across nodes, the fewest nodes that hold the weights and the
        workload's KV (C(module_utils/revive_plan/pipeline.py)); the release must pipeline the architecture.
    type: dict
    default: {}
    suboptions:
      nodes:
        description: Identical GPU nodes in the group; 1 to 64. A what-if without O(group.members); with them it is
          their count.
        type: int
        default: 1
      link_gbit: {description: Gbit/s between the group's nodes (the stage-to-stage sends); above 0 to 10000., type: float, default: 25}
      name: {description: The serving group (the members' C(revive_serving_group)); required with O(group.members)., type: str}
      members:
        description:
          - Every member of the serving group, as the preflight probed it. With them the module plans the group
            from the first member's GPU facts (name order) and returns this node's part (O(group.member)) - the head
            runs Ray's head and the group's one vLLM server, the workers a Ray worker, spares nothing
            (C(module_utils/revive_plan/group.py), C(module_utils/revive_cluster.py)); the release then has a
            C(group) section. When one node holds the model, every member gets its own single-node plan.
          - Members must match in GPU count, model, memory, compute capability, driver and Python patch version;
            otherwise every member is refused with the odd ones named.
        type: list
        elements: dict
        default: []
        suboptions:
          host: {description: Inventory name., type: str, required: true}
          gpu: {description: Its GPU facts (nvml_facts' C(gpu))., type: dict, default: {}}
          python_version: {description: "Its Python as C(X.Y.Z) (Ray refuses a patch mismatch).", type: str}
          address: {description: "The IP the group's nodes reach it at (Ray's C(--node-ip-address), C(VLLM_HOST_IP)).", type: str}
          interface: {description: "The network interface of that address (C(NCCL_SOCKET_IFNAME), C(GLOO_SOCKET_IFNAME)).", type: str}
      member: {description: "This node's inventory name among O(group.members).", type: str}
      ray_port: {description: "The Ray head's GCS port (C(RAY_ADDRESS)); 1 to 65535.", type: int, default: 6379}
  fail_on_refusal:
    description: Fail the task on a refusal; when false, return C(refused=true) and the reason so the play can quarantine the host.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - "Inputs are checked before anything is planned (C(module_utils/revive_plan/inputs.py) C(BOUNDS), the table in
    C(docs/inputs.md)): a value out of its range or of the wrong type fails the task naming the option
    (C(workload.concurrency is 0: it must be ...)), even with O(fail_on_refusal=false), so the preflight writes
    no plan for it. Unknown keys in O(workload), O(overrides), O(serve) and O(package_source) are refused by
    Ansible, naming the key and the allowed ones."
  - "Types: Ansible converts a string of digits to a number (V(\"32\") is 32); a boolean (V(yes)) for an integer
    option is refused. For a float option Ansible converts a boolean to 1.0 or 0.0 before the module sees it,
    which the ranges then judge."
  - "Bounds that depend on the node's GPUs or the model (an O(overrides.exclude_gpus) index the node does not have,
    every GPU excluded, O(overrides.tensor_parallel_size) above the GPUs left, O(workload.max_model_len) above the
    model's maximum) are refusals: another node may run it (O(fail_on_refusal))."
  - Logic lives in C(module_utils/revive_plan/), the performance model in C(module_utils/revive_perf.py), KV sizing
    in C(module_utils/revive_kv.py).
  - C(bin/revive plan) runs the same planner without Ansible.
"""

EXAMPLES = r"""
# In the preflight play, after nvml_facts and model_inspect:
- name: Plan the vLLM release for this node
  vllm_plan:
    gpu: "{{ ansible_facts['gpu'] }}"
    model: "{{ revive_model_facts.model }}"
    releases: "{{ lookup('ansible.builtin.file', playbook_dir ~ '/../data/vllm-releases.yml') | from_yaml }}"
    workload:
      concurrency: 32
      slo_p95_e2e_s: 12
      slo_output_tokens: 200
    serve:
      model_path: /data/models/chat-20b-fp16
      served_model_name: chat-20b
    host_ram_mb: "{{ ansible_facts['memtotal_mb'] }}"
    fail_on_refusal: false
  register: revive_plan_result

- name: Quarantine a node the planner refused
  ansible.builtin.group_by:
    key: "quarantined"
  when: revive_plan_result.refused

- name: Show the plan's reasons
  ansible.builtin.debug:
    msg: "{{ item.decision }} = {{ item.value }}: {{ item.reason }} [{{ item.source }}]"
  loop: "{{ ansible_facts['revive_release']['reasons'] }}"
  when: not revive_plan_result.refused

# What-if: the same model pinned to TP 8 and 0.5.4
- name: Plan with the field report's layout
  vllm_plan:
    gpu: "{{ ansible_facts['gpu'] }}"
    model: "{{ revive_model_facts.model }}"
    releases: "{{ lookup('ansible.builtin.file', 'data/vllm-releases.yml') | from_yaml }}"
    overrides:
      vllm_version: "0.5.4"
      tensor_parallel_size: 8
"""

RETURN = r"""
refused:
  description: True when the planner refused (only returned without failing when O(fail_on_refusal=false)).
  returned: always
  type: bool
refusal:
  description: Why the combination will not run, and the source of the rule.
  returned: when refused
  type: dict
  sample: {reason: "... awq checkpoints need CC 7.5; Tesla V100-PCIE-32GB is CC 7.0 ...",
            source: "docs/facts/vllm-volta.md §7.3; data quantization_min_cc"}
driver:
  description: >-
    The planned release's C(driver) entry of the release data (C(min_branch), C(tested_branch), C(cuda_driver_min)),
    for M(gpu_fitness)'s O(gpu_fitness.release_driver): the caller parses the release data once, for this module.
  returned: when not refused
  type: dict
  sample: {min_branch: 525, tested_branch: 535}
release:
  description: The planned release; also set as the host fact C(revive_release).
  returned: when not refused
  type: dict
  contains:
    vllm_version: {description: Release to install., type: str, sample: "0.5.4"}
    pins: {description: Package pins of that release (vllm, torch, xformers, cuda, python)., type: dict}
    engine: {description: V0 or V1 on this GPU., type: str, sample: V0}
    attention_backend: {description: Attention backend vLLM selects., type: str, sample: XFORMERS}
    entrypoint: {description: Python arguments before the server flags., type: list, elements: str, sample: ["-m", "vllm.entrypoints.openai.api_server"]}
    args: {description: Server flags of replica 0 (validated against the release's CLI table)., type: list, elements: str}
    env: {description: Environment of replica 0., type: dict, sample: {CUDA_DEVICE_ORDER: PCI_BUS_ID, CUDA_VISIBLE_DEVICES: "0,1,2,3", NCCL_P2P_DISABLE: "1", NCCL_SHM_DISABLE: "1"}}
    replicas:
      description: One server per tensor-parallel group, each with its own GPUs, port, CPUs, argv and environment.
      type: list
      elements: dict
      sample: [{index: 0, name: vllm-0, port: 8000, gpus: [0, 1, 2, 3], cuda_visible_devices: "0,1,2,3", tensor_parallel_size: 4, socket: 0, numa_node: 0, cpu_list: "0-19,40-59", streams: 16, args: [], env: {}}]
    tensor_parallel_size: {description: TP size of every replica., type: int}
    pipeline_parallel_size: {description: "Pipeline stages of the replica, one per node: 1 on one node, N when one replica spans N nodes of the group (Ray).", type: int}
    nodes: {description: Nodes the replica runs on (equal to pipeline_parallel_size)., type: int}
    settings: {description: "Resolved dtype, gpu_memory_utilization, max_model_len, max_num_seqs, max_num_batched_tokens, swap_space, enforce_eager, block_size.", type: dict}
    kv_cache: {description: "vLLM's KV sizing per GPU worker: bytes_per_block, num_gpu_blocks, num_cpu_blocks, tokens, max_concurrency_at_max_model_len, max_concurrency_at_typical_len, budget and its terms, log_line.", type: dict}
    layout: {description: The chosen layout and every candidate with its prediction or why it was not possible., type: dict}
    conversion: {description: "null, or {from: BF16, to: F16} when the weights must be converted for this GPU.", type: dict}
    metrics: {description: Prometheus metric names of the release., type: list, elements: str}
    reasons: {description: "One entry per decision: {decision, value, reason, source}.", type: list, elements: dict}
    warnings: {description: Things that will run but deserve attention., type: list, elements: str}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import check_options
from ansible.module_utils.revive_plan import (
    BOUNDS,
    PUBLIC_INDEX,
    NodeGroup,
    Overrides,
    PackageSource,
    PlanError,
    PlanInputError,
    PlanRefusal,
    Serve,
    Workload,
    plan,
    plan_release,
)
from ansible.module_utils.revive_plan.group import plan_member
from ansible.module_utils.revive_releases import ReleaseDataError, load_release_data

WORKLOAD_SPEC = {
    "max_model_len": {"type": "int"},
    "concurrency": {"type": "int", "default": 32},
    "slo_p95_e2e_s": {"type": "float", "default": 12.0},
    "slo_output_tokens": {"type": "int", "default": 200},
    "typical_prompt_tokens": {"type": "int", "default": 256},
    "metrics": {"type": "bool", "default": True},
}
OVERRIDES_SPEC = {
    "vllm_version": {"type": "str"},
    "tensor_parallel_size": {"type": "int"},
    "pipeline_parallel_size": {"type": "int"},
    "gpu_memory_utilization": {"type": "float"},
    "max_num_seqs": {"type": "int"},
    "max_num_batched_tokens": {"type": "int"},
    "swap_space": {"type": "float"},
    "exclude_gpus": {"type": "list", "elements": "int", "default": []},
    "allow_bf16_conversion": {"type": "bool", "default": True},
    "allow_long_max_model_len": {"type": "bool", "default": False},
}
SERVE_SPEC = {
    "model_path": {"type": "str"},
    "served_model_name": {"type": "str"},
    "host": {"type": "str", "default": "0.0.0.0"},
    "base_port": {"type": "int", "default": 8000},
}

MEMBER_SPEC = {
    "host": {"type": "str", "required": True},
    "gpu": {"type": "dict", "default": {}},
    "python_version": {"type": "str"},
    "address": {"type": "str"},
    "interface": {"type": "str"},
}
GROUP_SPEC = {
    "nodes": {"type": "int", "default": 1},
    "link_gbit": {"type": "float", "default": 25.0},
    "name": {"type": "str"},
    "members": {"type": "list", "elements": "dict", "default": [], "options": MEMBER_SPEC},
    "member": {"type": "str"},
    "ray_port": {"type": "int", "default": 6379},
}

SOURCE_SPEC = {
    "type": {"type": "str", "default": "index", "choices": ["index", "mirror", "wheelhouse"]},
    "index_url": {"type": "str", "default": PUBLIC_INDEX},
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gpu": {"type": "dict", "required": True},
            "model": {"type": "dict", "required": True},
            "releases": {"type": "dict", "required": True},
            "workload": {"type": "dict", "default": {}, "options": WORKLOAD_SPEC},
            "overrides": {"type": "dict", "default": {}, "options": OVERRIDES_SPEC},
            "serve": {"type": "dict", "default": {}, "options": SERVE_SPEC},
            "host_ram_mb": {"type": "int"},
            "package_source": {"type": "dict", "default": {}, "options": SOURCE_SPEC},
            "group": {"type": "dict", "default": {}, "options": GROUP_SPEC},
            "fail_on_refusal": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    # Bounds first (module_utils/revive_plan/inputs.py BOUNDS, checked by module_utils/revive_bounds.py): an input
    # error fails even with fail_on_refusal=false, so no plan (nor the preflight's plan file) follows from it.
    check_options(module, BOUNDS, "vllm_plan", refused=False)
    params = module.params
    try:
        releases = load_release_data(params["releases"], source="releases parameter (data/vllm-releases.yml)")
    except ReleaseDataError as exc:
        module.fail_json(msg=str(exc), refused=False)
    try:
        host_ram = params["host_ram_mb"] * 1024 * 1024 if params["host_ram_mb"] else None
        group = dict(params["group"])
        members, name, member, ray_port = (group.pop(key) for key in ("members", "name", "member", "ray_port"))
        request = (Workload(**params["workload"]), Overrides(**params["overrides"]), Serve(**params["serve"]),
                   host_ram, PackageSource(**params["package_source"]))
        if members:
            if not name or not member:
                raise PlanInputError("group", {"name": name, "member": member}, "a group name and this node's name "
                                     "with group.members", "set group.name and group.member")
            release = plan_member(plan_release, params["gpu"], params["model"], releases, request,
                                  NodeGroup(**group), name, members, member, ray_port)
        else:
            release = plan(params["gpu"], params["model"], releases, *request, NodeGroup(**group)).as_dict()
    except PlanInputError as exc:
        module.fail_json(msg=f"vllm_plan: {exc}", refused=False, input=exc.field)
    except PlanRefusal as exc:
        refusal = {"reason": exc.reason, "source": exc.source}
        if params["fail_on_refusal"]:
            module.fail_json(msg=f"vLLM plan refused: {exc.reason} [{exc.source}]", refused=True, refusal=refusal)
        module.exit_json(changed=False, refused=True, refusal=refusal)
    except PlanError as exc:
        module.fail_json(msg=str(exc), refused=False)
    for warning in release["warnings"]:
        module.warn(warning)
    module.exit_json(changed=False, refused=False, release=release,
                     driver=releases.release(release["vllm_version"]).driver,
                     ansible_facts={"revive_release": release})


if __name__ == "__main__":
    main()
