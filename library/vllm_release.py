#!/usr/bin/python
"""Ansible module vllm_release: thin wiring over module_utils/revive_release.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_release
short_description: The node's vLLM releases - the one to run, the record of current and previous, rollback, venv pruning
description:
  - A release is a vLLM venv, a model revision and the planned argv and environment of every replica. The node
    keeps a record (O(path), JSON) of the C(current) release - the one the systemd units point at and that
    passed its start - and the C(previous) one, plus the C(last_failure).
  - V(query) builds the release the units should run from the planner's release (O(plan)) and the venv the
    runtime role built (O(venv)) - every replica's C(ExecStart) (the venv's python, the plan's entrypoint, the
    replica's argv, quoted for systemd), its C(Environment=) words, CPU/NUMA pinning, start deadline and
    C(TimeoutStartSec) - and compares it with the record. It changes nothing.
  - V(promote) records a release that passed its start as current (the current one becomes previous).
  - V(rollback_target) says which release to restore when O(failed_id) failed; V(rolled_back) records the
    outcome of a rollback. V(prune) removes release venvs under O(venvs_root) beyond the O(keep) newest,
    never the current, previous or O(protect)ed ones.
  - V(venv_spec) says which exact pins the release venv installs (the plan's pins without the non-package
    keys, and without FlashAttention below compute capability 8.0) and names the venv
    C(<version>-<hash of pins and interpreter>), after checking that O(python) runs and satisfies the
    release's Python pin.
  - V(journal) returns the last O(lines) journal messages of each unit in O(units) from one run, with the
    O(redact) strings masked - the excerpt a rollback's failure message quotes. With O(since_usec) it is the
    first run that began after that time (the start that failed, not a later automatic restart), else the last.
version_added: "0.1.0"
author:
  - revive project
options:
  state:
    description: What to do (see the description).
    type: str
    choices: [query, promote, rollback_target, rolled_back, prune, venv_spec, journal]
    default: query
  path:
    description: The release record on the node.
    type: path
    default: /var/lib/revive/releases.json
  plan:
    description: The planner's release (vllm_plan's C(release), the host fact C(revive_release)); for V(query) and V(venv_spec).
    type: dict
  python:
    description: Interpreter the release venv is made from; for V(venv_spec).
    type: str
  lock_sha256:
    description: The sha256 of the release's lock, part of the venv name (a regenerated lock gets a new venv); for V(venv_spec).
    type: str
    default: ""
  venv:
    description: The release venv (C(/opt/vllm/venvs/<version>-<hash>)); for V(query).
    type: path
  environment:
    description: Variables every replica gets besides the plan's (the plan wins on a clash); for V(query).
    type: dict
    default: {}
  timing:
    description: How the start deadline is derived from the model's weight bytes; for V(query).
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
      start_limit_burst:
        description: C(StartLimitBurst) of the units; C(StartLimitIntervalSec) holds that many failed starts.
        type: int
        default: 3
  release:
    description: A release as V(query) returned it under C(desired); for V(promote), and the failed one for V(rolled_back).
    type: dict
  failed_id:
    description: Id of the release that failed; empty means the release recorded as current. For V(rollback_target).
    type: str
    default: ""
  restored:
    description: The release a rollback restored (null when there was none); for V(rolled_back).
    type: dict
  serving:
    description: Whether the restored release is active and healthy again; for V(rolled_back).
    type: bool
    default: false
  message:
    description: What failed (with the journal excerpt); kept in the record's C(last_failure); for V(rolled_back).
    type: str
    default: ""
  venvs_root:
    description: Directory holding one venv per release; for V(prune).
    type: path
    default: /opt/vllm/venvs
  keep:
    description: How many release venvs to keep, newest first (the current, previous and protected ones are kept anyway).
    type: int
    default: 3
  protect:
    description: Venvs never to remove (the one just built for the desired release); for V(prune).
    type: list
    elements: path
    default: []
  units:
    description: systemd units whose journal to read; for V(journal).
    type: list
    elements: str
    default: []
  lines:
    description: Messages per unit; for V(journal).
    type: int
    default: 40
  since_usec:
    description: For V(journal) - when the switch began (CLOCK_REALTIME, microseconds, C(date +%s%6N)); 0 means none.
    type: int
    default: 0
  redact:
    description: Strings to mask in the excerpt (the API key); never logged.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    details: V(query), V(venv_spec), V(journal) and V(rollback_target) only read; V(promote), V(rolled_back) and V(prune) report what they would write or remove.
  diff_mode:
    support: full
    details: The record before and after for V(promote) and V(rolled_back); the venvs before and after for V(prune).
notes:
  - The record holds no secret (the API key lives only in the service's environment file).
  - On simulated GPUs (the lab) the plan's CPU/NUMA pinning describes the simulated server; it is returned as
    C(pinning_note) and not applied.
seealso:
  - name: systemd.service(5), command lines
    description: How C(ExecStart=) words are quoted and which characters are expanded.
    link: https://www.freedesktop.org/software/systemd/man/latest/systemd.service.html#Command%20lines
"""

EXAMPLES = r"""
- name: The release the units should run, and the node's record
  vllm_release:
    plan: "{{ ansible_facts['revive_release'] }}"
    venv: /opt/vllm/venvs/0.5.4-3f9a1c2e
    environment: {VLLM_NO_USAGE_STATS: "1"}
  register: release_state

- name: Record it once every replica is active and healthy
  vllm_release:
    state: promote
    release: "{{ release_state.desired }}"

- name: Which release to restore after a failed warm-up of the current one
  vllm_release:
    state: rollback_target
  register: rollback

- name: The release venv's pins and name for this node's Python
  vllm_release:
    state: venv_spec
    plan: "{{ ansible_facts['revive_release'] }}"
    python: /usr/bin/python3.11
  register: venv_spec

- name: Keep the three newest release venvs (and always the current and previous ones)
  vllm_release:
    state: prune
    keep: 3
    protect: [/opt/vllm/venvs/0.5.4-3f9a1c2e]
"""

RETURN = r"""
desired:
  description: The release the units should run (V(query)); render the units from it.
  returned: when state is query
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
current: {description: The release recorded as current (null on a new node)., returned: always, type: dict}
previous: {description: The release before it (null if none)., returned: always, type: dict}
last_failure: {description: "The last failed release: release, message, at, restored, restored_serving.", returned: always, type: dict}
is_current: {description: Whether the desired release is already the current one (nothing to restart for it)., returned: when state is query, type: bool}
stale_units: {description: Units of the current release that the desired one drops., returned: when state is query, type: list, elements: str}
target:
  description: The release to restore (null when there is none).
  returned: when state is rollback_target
  type: dict
failed_release: {description: "The failed release when it was the recorded current one (null otherwise; not C(failed), which Ansible reserves).", returned: when state is rollback_target, type: dict}
removed: {description: Venvs removed (or, in check mode, to be removed)., returned: when state is prune, type: list, elements: str}
packages: {description: The exact pins of the release venv., returned: when state is venv_spec, type: list, elements: str, sample: ["torch==2.4.0", "vllm==0.5.4", "xformers==0.0.27.post2"]}
notes: {description: What was left out of the pins and why., returned: when state is venv_spec, type: list, elements: str}
name: {description: The venv's directory name., returned: when state is venv_spec, type: str, sample: 0.5.4-3f9a1c2e}
flash_attention_excluded: {description: Whether FlashAttention is kept out (compute capability below 8.0)., returned: when state is venv_spec, type: bool}
journal: {description: "Per unit, the messages of its last run (V(journal)).", returned: when state is journal, type: dict, sample: {vllm-0.service: ["ValueError: No available memory for the cache blocks. ..."]}}
python: {description: The interpreter checked (O(python))., returned: when state is venv_spec, type: str, sample: /usr/bin/python3.11}
python_version: {description: Version of O(python)., returned: when state is venv_spec, type: str, sample: "3.11.2"}
"""

import datetime
import json
import os
import platform
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_files import write_atomic
from ansible.module_utils.revive_release import (
    HostView,
    ReleaseError,
    StartTiming,
    build_release,
    cc_below_8,
    journal_excerpt,
    load_record,
    parse_cpu_list,
    promote,
    record_rollback,
    rollback_target,
    same_release,
    stale_units,
    python_satisfies,
    venv_name,
    venv_packages,
    venvs_to_prune,
)
from ansible.module_utils.revive_sync import MANIFEST_NAME
from ansible.module_utils.revive_venv import MARKER

TIMING_SPEC = {
    "base_seconds": {"type": "int", "default": 120},
    "load_bytes_per_second": {"type": "int", "default": 200000000},
    "per_rank_seconds": {"type": "int", "default": 5},
    "slack_seconds": {"type": "int", "default": 30},
    "restart_seconds": {"type": "int", "default": 10},
    "start_limit_burst": {"type": "int", "default": 3},
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


def venv_spec(module: AnsibleModule, plan: dict, python: str, lock_sha256: str) -> dict:
    host = platform.node()
    pins = plan.get("pins") or {}
    if not plan.get("vllm_version") or not pins:
        raise ReleaseError(f"the release for {host} has no vllm_version or pins: pass the planner's release (host fact "
                           "revive_release from the preflight)")
    rc, out, err = module.run_command([python, "-I", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
    if rc != 0:
        raise ReleaseError(f"the interpreter {python} does not run on {host} ({(err or out).strip()[-300:]}); install "
                           "it or set vllm_runtime_python")
    version = out.strip()
    wanted = str(pins.get("python") or "")
    if wanted and not python_satisfies(version, wanted):
        raise ReleaseError(f"vLLM {plan['vllm_version']} needs Python {wanted}; {python} on {host} is {version}. Set "
                           "vllm_runtime_python to a matching interpreter")
    cc = (plan.get("gpu") or {}).get("compute_capability")
    packages, notes = venv_packages(pins, cc)
    return {"packages": packages, "notes": notes,
            "name": venv_name(str(plan["vllm_version"]), packages, python, lock_sha256),
            "python": python, "python_version": version, "python_minor": ".".join(version.split(".")[:2]),
            "flash_attention_excluded": cc_below_8(cc)}


def unit_journal(module: AnsibleModule, unit: str, lines: int, redact: list, since_usec: int) -> list:
    # Not `--since`: which run began after the switch is told by where each run's first entry lies, so the
    # runs must be seen from their start. Enough entries for the old run, the failed start and a few restarts.
    argv = ["journalctl", "--no-pager", "-o", "json", "-u", unit, "-n", str(max(lines, 1) * 50)]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        return [f"(journalctl -u {unit} failed: {(err or out).strip()[-200:]})"]
    entries = []
    for line in out.splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return journal_excerpt(entries, lines, redact, since_usec)


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "default": "query",
                      "choices": ["query", "promote", "rollback_target", "rolled_back", "prune", "venv_spec",
                                  "journal"]},
            "path": {"type": "path", "default": "/var/lib/revive/releases.json"},
            "plan": {"type": "dict"},
            "python": {"type": "str"},
            "lock_sha256": {"type": "str", "default": ""},
            "venv": {"type": "path"},
            "environment": {"type": "dict", "default": {}},
            "timing": {"type": "dict", "default": {}, "options": TIMING_SPEC},
            "release": {"type": "dict"},
            "failed_id": {"type": "str", "default": ""},
            "restored": {"type": "dict"},
            "serving": {"type": "bool", "default": False},
            "message": {"type": "str", "default": ""},
            "venvs_root": {"type": "path", "default": "/opt/vllm/venvs"},
            "keep": {"type": "int", "default": 3},
            "protect": {"type": "list", "elements": "path", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "lines": {"type": "int", "default": 40},
            "since_usec": {"type": "int", "default": 0},
            "redact": {"type": "list", "elements": "str", "default": [], "no_log": True},
        },
        required_if=[("state", "query", ("plan", "venv")), ("state", "venv_spec", ("plan", "python")), ("state", "promote", ("release",)),
                     ("state", "rolled_back", ("release",))],
        supports_check_mode=True,
    )
    params = module.params
    state = params["state"]
    path = params["path"]
    try:
        record = load_record(read_text(path), f"{path} on {platform.node()}")
        base = {"current": record.current, "previous": record.previous, "last_failure": record.last_failure}
        if state == "query":
            timing = StartTiming(**params["timing"])
            desired = build_release(params["plan"], params["venv"], host_view(params["venv"], model_path_of(params["plan"])),
                                    timing, params["environment"])
            module.exit_json(changed=False, desired=desired, is_current=same_release(record.current, desired),
                             stale_units=stale_units(record.current, desired), **base)
        if state == "venv_spec":
            module.exit_json(changed=False, **venv_spec(module, params["plan"], params["python"],
                                                        params["lock_sha256"]))
        if state == "journal":
            module.exit_json(changed=False, journal={
                unit: unit_journal(module, unit, params["lines"], params["redact"], params["since_usec"])
                for unit in params["units"]})
        if state == "rollback_target":
            choice = rollback_target(record, params["failed_id"])
            module.exit_json(changed=False, target=choice.target, failed_release=choice.failed, **base)
        if state == "prune":
            root = params["venvs_root"]
            venvs = []
            if os.path.isdir(root):
                for name in sorted(os.listdir(root)):
                    full = os.path.join(root, name)
                    if os.path.isdir(full) and not os.path.islink(full):
                        marker = os.path.join(full, MARKER)
                        venvs.append((full, os.stat(marker if os.path.exists(marker) else full).st_mtime))
            protect = list(params["protect"]) + [(r or {}).get("venv") for r in (record.current, record.previous)]
            removed = venvs_to_prune(venvs, params["keep"], protect)
            if removed and not module.check_mode:
                for victim in removed:
                    shutil.rmtree(victim)
            diff = {"before": "".join(f"{p}\n" for p, _ in venvs),
                    "after": "".join(f"{p}\n" for p, _ in venvs if p.rstrip("/") not in removed)}
            module.exit_json(changed=bool(removed), removed=removed, diff=diff, **base)
        if state == "promote":
            updated, changed = promote(record, params["release"], now_utc())
        else:
            updated = record_rollback(record, params["release"], params["restored"], params["serving"],
                                      params["message"], now_utc())
            changed = True
        if changed and not module.check_mode:
            write_atomic(path, updated.text(), make_parents=True)
        module.exit_json(changed=changed, current=updated.current, previous=updated.previous,
                         last_failure=updated.last_failure,
                         diff={"before": record.text(), "after": updated.text(), "before_header": path,
                               "after_header": path})
    except ReleaseError as error:
        module.fail_json(msg=str(error))


if __name__ == "__main__":
    main()
