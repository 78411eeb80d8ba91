#!/usr/bin/python
"""Ansible module vllm_release_info: thin wiring over module_utils/revive_record/."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_release_info
short_description: Read a node's vLLM releases - its record, its hand-over report, the release its units should run
description:
  - A release is a vLLM venv, a model revision and the planned argv and environment of every replica. The node
    keeps a record (O(path), JSON) of the C(current) release - the one the systemd units point at and that
    passed its start - and the C(previous) one, plus the C(last_failure). M(vllm_release) writes it.
  - Returns the record, which release a rollback restores (C(rollback), for the release O(failed_id)), the node's
    hand-over report (O(report_path), written by M(vllm_warmup)) and the names the front door gives the current
    release's replicas (C(servers), C(<node>-<replica>) with O(node)).
  - With O(plan) and O(venv) it also builds the release the units should run from the planner's release and the
    venv the runtime role built - every replica's C(ExecStart) (the venv's python, the plan's entrypoint, the
    replica's argv, quoted for systemd), its C(Environment=) words, CPU/NUMA pinning, start deadline and
    C(TimeoutStartSec) - and compares it with the record (C(desired), C(is_current), C(stale_units)).
  - It changes nothing.
version_added: "0.1.0"
author:
  - revive project
options:
  path:
    description: The release record on the node; a missing file is a node that never had a release.
    type: path
    default: /var/lib/revive/releases.json
  report_path:
    description: The node's hand-over report; a missing or unreadable one is no report. V("") reads none.
    type: path
    default: /var/lib/revive/handover.json
  node:
    description: The node's inventory name (C(inventory_hostname)); the front door's servers are C(<node>-<replica>). V("") names none.
    type: str
    default: ""
  failed_id:
    description: Id of the release that failed, for C(rollback); empty means the release recorded as current (a failed warm-up).
    type: str
    default: ""
  plan:
    description: The planner's release (vllm_plan's C(release), the host fact C(revive_release)); with O(venv), returns C(desired).
    type: dict
  venv:
    description: The release venv (C(/opt/vllm/venvs/<version>-<hash>)) the runtime role built for O(plan).
    type: path
  environment:
    description: Variables every replica gets besides the plan's (the plan wins on a clash).
    type: dict
    default: {}
  timing:
    description: How the start deadline is derived from the model's weight bytes.
    type: dict
    default: {}
    suboptions:
      base_seconds:
        description: Process start, profiling and the port opening, independent of the model's size.
        type: int
        default: 120
      load_bytes_per_second:
        description: Slowest acceptable weight load rate from local disk, all ranks together.
        type: int
        default: 200000000
      per_rank_seconds:
        description: NCCL set-up per tensor-parallel rank.
        type: int
        default: 5
      slack_seconds:
        description: C(TimeoutStartSec) exceeds the health deadline by this, so the waiter's message, not a kill, ends a slow start.
        type: int
        default: 30
      restart_seconds:
        description: C(RestartSec) of the units (for C(StartLimitIntervalSec)).
        type: int
        default: 10
      ray_gate_seconds:
        description: A serving group head's replica waits this long for its Ray cluster (C(ExecStartPre)) before the
          health deadline starts; added to its C(TimeoutStartSec).
        type: int
        default: 0
      start_limit_burst:
        description: C(StartLimitBurst) of the units; C(StartLimitIntervalSec) holds that many failed starts.
        type: int
        default: 3
attributes:
  check_mode:
    support: full
    details: Only reads.
notes:
  - The record holds no secret (the API key lives only in the service's environment file).
  - On simulated GPUs (the lab) the plan's CPU/NUMA pinning describes the simulated server; it is returned as
    C(pinning_note) and not applied.
seealso:
  - module: vllm_release
  - module: vllm_warmup
  - name: systemd.service(5), command lines
    description: How C(ExecStart=) words are quoted and which characters are expanded.
    link: https://www.freedesktop.org/software/systemd/man/latest/systemd.service.html#Command%20lines
"""

EXAMPLES = r"""
- name: The release the units should run, and the node's record
  vllm_release_info:
    plan: "{{ ansible_facts['revive_release'] }}"
    venv: /opt/vllm/venvs/0.5.4-3f9a1c2e
    environment: {VLLM_NO_USAGE_STATS: "1"}
  register: release_state

- name: The release the node runs, its hand-over report and its servers in the front door
  vllm_release_info:
    node: "{{ inventory_hostname }}"
  register: node_release

- name: Which release to restore after a failed warm-up of the current one
  vllm_release_info:
  register: rollback
  # rollback.rollback.target: the release to restore, or null
"""

RETURN = r"""
current: {description: The release recorded as current (null on a new node)., returned: always, type: dict}
previous: {description: The release before it (null if none)., returned: always, type: dict}
last_failure: {description: "The last failed release: release, message, at, restored, restored_serving.", returned: always, type: dict}
rollback:
  description: What a rollback of O(failed_id) does.
  returned: always
  type: dict
  contains:
    target: {description: The release to restore (null when there is none)., type: dict}
    failed_release: {description: The failed release when it is the recorded current one (null otherwise)., type: dict}
report:
  description: The node's hand-over report (C(replicas.<replica>) = that replica's last warm-up); null when there is none.
  returned: always
  type: dict
servers:
  description: The front door's server names of the current release's replicas (C(<node>-<replica>)); empty without O(node) or a current release.
  returned: always
  type: list
  elements: str
  sample: [node1-vllm-0, node1-vllm-1]
desired:
  description: The release the units should run; render the units from it.
  returned: when O(plan) is given
  type: dict
  contains:
    id: {description: Digest of venv (and its build), model (and its bytes) and every replica's argv/env/pinning., type: str, sample: 3f9a1c2e0b7d}
    vllm_version: {description: vLLM version., type: str, sample: "0.5.4"}
    venv: {description: The release venv., type: str}
    python: {description: The venv's interpreter (C(ExecStart)'s program)., type: str}
    model: {description: "path, content_id (of revive-manifest.json), weight_bytes.", type: dict}
    args: {description: Replica 0's server flags (for the record)., type: list, elements: str}
    replicas:
      description: "Per replica: name, unit, port, argv, env, exec_start, environment (Environment= words), cuda_visible_devices, gpus, tensor_parallel_size, cpu_affinity, numa_node, pinning_note, health_deadline_seconds, start_timeout_seconds, start_limit_interval_seconds."
      type: list
      elements: dict
is_current: {description: Whether the desired release is already the current one (nothing to restart for it)., returned: when O(plan) is given, type: bool}
stale_units: {description: Units of the current release that the desired one drops., returned: when O(plan) is given, type: list, elements: str}
"""

import json
import os
import platform

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_record import ReleaseError
from ansible.module_utils.revive_record.pinning import parse_cpu_list
from ansible.module_utils.revive_record.record import load_record, rollback_target, same_release, stale_units
from ansible.module_utils.revive_record.release import HostView, build_release
from ansible.module_utils.revive_record.systemd import StartTiming
from ansible.module_utils.revive_sync.manifest import MANIFEST_NAME
from ansible.module_utils.revive_venv import MARKER

TIMING_SPEC = {
    "base_seconds": {"type": "int", "default": 120},
    "load_bytes_per_second": {"type": "int", "default": 200000000},
    "per_rank_seconds": {"type": "int", "default": 5},
    "slack_seconds": {"type": "int", "default": 30},
    "restart_seconds": {"type": "int", "default": 10},
    "start_limit_burst": {"type": "int", "default": 3},
    "ray_gate_seconds": {"type": "int", "default": 0},
}


def read_text(path: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def host_view(venv: str, model_path: str) -> HostView:
    online = parse_cpu_list(read_text("/sys/devices/system/cpu/online") or "")
    nodes_text = read_text("/sys/devices/system/node/online")
    nodes = parse_cpu_list(nodes_text) if nodes_text is not None else [0]
    try:
        stamp = str(os.stat(os.path.join(venv, MARKER)).st_mtime_ns)
    except OSError:
        stamp = None
    content_id = None
    manifest = read_text(os.path.join(model_path, MANIFEST_NAME)) if model_path else None
    if manifest:
        try:
            content_id = json.loads(manifest).get("content_id")
        except ValueError:
            content_id = None
    return HostView(platform.node(), tuple(online), tuple(nodes), stamp, content_id)


def model_path_of(plan: dict) -> str:
    args = ((plan.get("replicas") or [{}])[0] or {}).get("args") or []
    return next((args[i + 1] for i, word in enumerate(args[:-1]) if word == "--model"), "")


def read_report(module: AnsibleModule, path: str):
    """The hand-over report; None when there is none or it is not JSON (vllm_warmup writes a new one then)."""
    text = read_text(path) if path else None
    if not text:
        return None
    try:
        report = json.loads(text)
    except ValueError as error:
        module.warn(f"{path} on {platform.node()} is not JSON ({error}); taken as no hand-over report")
        return None
    return report if isinstance(report, dict) else None


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "timing.base_seconds": Bound(int, 1, high=86400, why="seconds"),
    "timing.load_bytes_per_second": Bound(int, 1, high=2 ** 40, why="bytes per second"),
    "timing.per_rank_seconds": Bound(int, 0, high=3600, why="seconds"),
    "timing.slack_seconds": Bound(int, 0, high=3600, why="seconds"),
    "timing.restart_seconds": Bound(int, 0, high=3600, why="seconds"),
    "timing.start_limit_burst": Bound(int, 1, high=100),
    "timing.ray_gate_seconds": Bound(int, 0, high=86400, why="seconds"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/revive/releases.json"},
            "report_path": {"type": "path", "default": "/var/lib/revive/handover.json"},
            "node": {"type": "str", "default": ""},
            "failed_id": {"type": "str", "default": ""},
            "plan": {"type": "dict"},
            "venv": {"type": "path"},
            "environment": {"type": "dict", "default": {}},
            "timing": {"type": "dict", "default": {}, "options": TIMING_SPEC},
        },
        required_together=[("plan", "venv")],
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "vllm_release_info")
    params = module.params
    path = params["path"]
    try:
        record = load_record(read_text(path), f"{path} on {platform.node()}")
        choice = rollback_target(record, params["failed_id"])
        replicas = (record.current or {}).get("replicas") or []
        result = {
            "changed": False, "current": record.current, "previous": record.previous,
            "last_failure": record.last_failure,
            "rollback": {"target": choice.target, "failed_release": choice.failed},
            "report": read_report(module, params["report_path"]),
            "servers": [f"{params['node']}-{replica['name']}" for replica in replicas] if params["node"] else [],
        }
        if params["plan"] is not None:
            desired = build_release(params["plan"], params["venv"],
                                    host_view(params["venv"], model_path_of(params["plan"])),
                                    StartTiming(**params["timing"]), params["environment"])
            result.update(desired=desired, is_current=same_release(record.current, desired),
                          stale_units=stale_units(record.current, desired))
        module.exit_json(**result)
    except ReleaseError as error:
        module.fail_json(msg=str(error))


if __name__ == "__main__":
    main()
