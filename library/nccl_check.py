#!/usr/bin/python
"""Ansible module nccl_check: thin wiring over module_utils/revive_nccl/."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_check
short_description: Prove each planned replica's NCCL environment with a short all-reduce sweep on the node
description:
  - For each replica of the plan (C(revive_release.replicas)), starts one process per GPU of its set in the release
    venv's python (torch.distributed, backend O(backend)), with exactly the environment its unit will have -
    C(CUDA_VISIBLE_DEVICES), C(CUDA_DEVICE_ORDER), the planned C(NCCL_*) variables, the replica's CPUs (as
    C(CPUAffinity=)) and NUMA node (C(numactl --membind), as C(NUMAPolicy=bind), when numactl exists) - plus
    C(NCCL_DEBUG=INFO) and O(extra_env). The ranks meet through a file store in a private directory.
  - Each rank checks one all-reduce's sum, then times O(iterations) all-reduces per size of O(sizes) after
    O(warmup) ones. Per size it reports the algorithm bandwidth (bytes / time) and the bus bandwidth as nccl-tests
    defines it for all-reduce, busbw = algbw * 2(n-1)/n (nccl-tests doc/PERFORMANCE.md), in GB/s of 1e9 bytes.
  - Hard deadline O(timeout) per run. A hang or an NCCL error kills every rank's process group and fails the check
    with the phase each rank was in (init = communicator set-up, where the field notes' 8-way TP hung at
    "connecting to") and the last lines of its output (NCCL_DEBUG=INFO).
  - The ranks report the NCCL/CUDA variables and CPU affinity they saw, and on NCCL the PCI bus id of their GPU;
    anything but the plan fails the run.
  - With O(compare), a second run flips the planner's P2P/SHM decision (without the planned C(NCCL_*) variables
    when it set NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, with them forced when it did not). A result that contradicts
    the planner's rule (the flipped run faster by more than O(compare_margin), or passing where the planned one
    failed) is a warning with both figures; the plan is never changed.
  - On replicas without NVLink it reads, read-only, the facts behind a P2P hang - ACS control of the PCIe bridges
    above the GPUs (C(lspci -vvv -D) ACSCtl; a missing lspci is a note) and IOMMU groups (C(/sys/kernel/iommu_groups),
    the kernel command line's iommu words) - and reports them with the result.
  - V(gloo) runs the same code on CPU processes (world size = the replica's GPU count, devices ignored), for the
    lab and the tests; its results say C(simulated=true).
version_added: "0.1.0"
author:
  - revive project
options:
  replicas:
    description: The plan's replicas (C(revive_release.replicas) from M(vllm_plan)); each needs C(name), C(gpus), C(env)
      and may have C(cpus)/C(cpu_list), C(numa_node), C(nvlink), C(slowest_path).
    type: list
    elements: dict
    required: true
  python:
    description: The release venv's python (C(vllm_runtime_venv.python)), which has torch.
    type: path
    required: true
  backend:
    description: V(nccl) on the node's GPUs; V(gloo) on CPU processes (simulated).
    type: str
    choices: [nccl, gloo]
    default: nccl
  gpu:
    description: The node's GPU facts (C(ansible_facts['gpu']) from M(nvml_facts)); maps GPU indices to PCI bus ids
      for the device check and the ACS/IOMMU facts. Without it neither is done.
    type: dict
  sizes:
    description: All-reduce sizes, in bytes or with a unit (C(64KiB), C(1MiB), C(1GiB)); multiples of 4 (float32).
    type: list
    elements: raw
    default: [1MiB, 4MiB, 16MiB, 64MiB, 256MiB]
  iterations:
    description: Timed all-reduces per size (nccl-tests C(-n)).
    type: int
    default: 20
  warmup:
    description: Untimed all-reduces per size before the timed ones (nccl-tests C(-w)).
    type: int
    default: 5
  timeout:
    description: Seconds one run (all ranks, import to teardown) may take before every rank is killed.
    type: float
    default: 180
  compare:
    description: Also run with the planner's P2P/SHM decision flipped and record both (doubles the time; a flipped
      run that hangs costs a whole O(timeout)).
    type: bool
    default: false
  compare_margin:
    description: Relative bandwidth difference below which the two runs count as equal.
    type: float
    default: 0.1
  extra_env:
    description: Variables set on every rank of every run, also in the compare run (e.g. C(NCCL_NVLS_ENABLE=0)).
    type: dict
    default: {}
  single_gpu:
    description: Replicas of one GPU have no NCCL traffic - V(skip) them or V(run) the sweep with world size 1.
    type: str
    choices: [skip, run]
    default: skip
  nccl_debug:
    description: C(NCCL_DEBUG) for the ranks unless the plan sets it; empty sets none.
    type: str
    default: INFO
  log_lines:
    description: Lines of each rank's output kept in a failed run's result.
    type: int
    default: 30
  work_dir:
    description: Directory for the ranks' files (spec, store, logs), kept afterwards; empty means a temporary one,
      removed.
    type: path
attributes:
  check_mode:
    support: full
    details: Starts nothing; returns per replica and run the processes (argv per rank), their environment and CPU
      placement, and the ACS/IOMMU facts (read-only).
  diff_mode:
    support: none
notes:
  - Runs on the node with the system python3 (3.9+, standard library only); the ranks run in O(python).
  - The ranks run as the module's user (root under become) outside the unit's sandbox; the environment, CPUs and
    NUMA node are the unit's.
  - The GPUs must be free of serving replicas - run it before the units switch (docs/nccl-check.md).
seealso:
  - name: nccl-tests PERFORMANCE.md
    description: Algorithm and bus bandwidth.
    link: https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md
  - name: NCCL troubleshooting - PCI Access Control Services
    description: ACS, IOMMU and P2P hangs.
    link: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#pci-access-control-services-acs
  - name: NCCL environment variables
    description: NCCL_P2P_DISABLE, NCCL_SHM_DISABLE, NCCL_DEBUG.
    link: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
  - module: vllm_plan
  - module: nvml_facts
"""

EXAMPLES = r"""
- name: Prove the planned NCCL environment before the units switch
  nccl_check:
    replicas: "{{ ansible_facts['revive_release'].replicas }}"
    python: "{{ vllm_runtime_venv.python }}"
    gpu: "{{ ansible_facts['gpu'] }}"
    compare: true
  register: nccl

- name: The lab - the same code on CPU processes
  nccl_check:
    replicas: "{{ ansible_facts['revive_release'].replicas }}"
    python: "{{ vllm_runtime_venv.python }}"
    backend: gloo
    sizes: [64KiB, 1MiB]
    iterations: 3
    warmup: 1
"""

RETURN = r"""
ok:
  description: True when every replica that was checked passed (the module fails otherwise).
  returned: always
  type: bool
msg:
  description: What passed (peak bus bandwidth per replica) or, per failed replica, the reason with the last output.
  returned: always
  type: str
simulated:
  description: True on V(gloo) (CPU processes, no GPU was used).
  returned: always
  type: bool
backend:
  description: The backend used.
  returned: always
  type: str
warning_messages:
  description: Every compare result that contradicts the planner's rule, with both figures.
  returned: always
  type: list
  elements: str
replicas:
  description: One result per replica.
  returned: unless check mode
  type: list
  elements: dict
  contains:
    name: {description: The replica (vllm-N)., type: str}
    gpus: {description: Its GPU indices., type: list}
    world_size: {description: Ranks (one per GPU)., type: int}
    backend: {description: nccl or gloo., type: str}
    simulated: {description: True on gloo., type: bool}
    ok: {description: The planned run passed (or the replica was skipped)., type: bool}
    skipped: {description: One GPU and O(single_gpu=skip)., type: bool}
    reason: {description: Why it failed - phase per rank, the error, the topology facts, the last output., type: str}
    duration_s: {description: Seconds of all its runs., type: float}
    placement: {description: "cpu_list, applied, numa_node, numactl, notes.", type: dict}
    run:
      description: "The planned run - label, description, world_size, backend, env (the variables the check set),
        ok, reason, duration_s, sizes (bytes, size, time_us, algbw_gbps, busbw_gbps), peak_busbw_gbps, transports
        (NCCL's 'via' words), versions (torch, nccl, cuda, python), ranks (rank, pid, rc, phase, affinity, device,
        error), log_tail (per rank, when it failed)."
      type: dict
    compare:
      description: The flipped run (as C(run)) plus verdict (confirmed, contradicted, no_difference,
        alternative_failed, both_failed, no_peers) and message; null without O(compare).
      type: dict
    topology:
      description: "On replicas without NVLink - gpus (index, pci_bus_id, upstream bridges, iommu_group), bridges
        (bdf, gpus, description, acs_ctl flags, acs_enabled, redirects_p2p), acs_enabled_bridges,
        acs_redirect_bridges, iommu (groups, enabled, kernel_cmdline, passthrough, gpu_groups), notes, summary."
      type: dict
    warnings: {description: This replica's contradictions., type: list}
    notes: {description: This replica's compare verdicts that are no contradiction., type: list}
would_run:
  description: Check mode - per replica name, gpus, world_size, backend, placement, runs (label, description, env,
    argv per rank with WORKER and SPEC for the files written at run time), topology, or skipped.
  returned: check mode
  type: list
  elements: dict
python_found:
  description: Check mode - whether O(python) exists and is executable.
  returned: check mode
  type: bool
"""

import platform

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_nccl import CheckSpec, Deps, NcclCheckError, check, describe, parse_size

ARGUMENT_SPEC = {
    "replicas": {"type": "list", "elements": "dict", "required": True},
    "python": {"type": "path", "required": True},
    "backend": {"type": "str", "choices": ["nccl", "gloo"], "default": "nccl"},
    "gpu": {"type": "dict"},
    "sizes": {"type": "list", "elements": "raw", "default": ["1MiB", "4MiB", "16MiB", "64MiB", "256MiB"]},
    "iterations": {"type": "int", "default": 20},
    "warmup": {"type": "int", "default": 5},
    "timeout": {"type": "float", "default": 180},
    "compare": {"type": "bool", "default": False},
    "compare_margin": {"type": "float", "default": 0.1},
    "extra_env": {"type": "dict", "default": {}},
    "single_gpu": {"type": "str", "choices": ["skip", "run"], "default": "skip"},
    "nccl_debug": {"type": "str", "default": "INFO"},
    "log_lines": {"type": "int", "default": 30},
    "work_dir": {"type": "path"},
}


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "iterations": Bound(int, 1, high=10000),
    "warmup": Bound(int, 0, high=10000),
    "timeout": Bound(float, 0, high=86400, low_open=True, why="seconds"),
    "compare_margin": Bound(float, 0, high=100, why="a relative difference, 0.1 = 10 %"),
    "log_lines": Bound(int, 0, high=100000),
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    check_options(module, BOUNDS, "nccl_check")
    p = module.params
    host = platform.node()
    deps = Deps(which=lambda name: module.get_bin_path(name), run=lambda argv: module.run_command(argv))
    try:
        spec = CheckSpec(python=p["python"], backend=p["backend"], sizes=[parse_size(s) for s in p["sizes"]],
                         iterations=p["iterations"], warmup=p["warmup"], timeout_s=p["timeout"],
                         compare=p["compare"], compare_margin=p["compare_margin"],
                         extra_env={k: str(v) for k, v in p["extra_env"].items()}, single_gpu=p["single_gpu"],
                         nccl_debug=p["nccl_debug"], log_lines=p["log_lines"], work_dir=p["work_dir"])
        if module.check_mode:
            plan = describe(p["replicas"], spec, deps, p["gpu"])
            module.exit_json(changed=False, ok=True, simulated=spec.simulated, backend=spec.backend,
                             warning_messages=[], **dict(plan, msg=f"{host}: {plan['msg']}"))
        result = check(p["replicas"], spec, deps, p["gpu"])
    except NcclCheckError as error:
        module.fail_json(msg=f"{host}: nccl_check cannot run: {error}", ok=False, warning_messages=[])
    result["msg"] = f"{host}: {result['msg']}"
    if not result["ok"]:
        module.fail_json(changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
