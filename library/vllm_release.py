#!/usr/bin/python
"""Ansible module vllm_release: thin wiring over module_utils/revive_record/."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_release
short_description: Set a node's current vLLM release, record a failed one, keep a number of release venvs
description:
  - The node's release record (O(path), JSON) names the C(current) release - the one the systemd units point at
    and that passed its start -, the C(previous) one and the C(last_failure). M(vllm_release_info) reads it.
  - The options say what the record holds afterwards; there is no verb to choose.
  - O(current) alone - a release that passed its start (M(vllm_release_info)'s C(desired)) becomes current, the
    current one becomes previous. Nothing changes when it already is current.
  - O(failure) - a rollback happened; O(current) is the release it restored (null when there was none). The
    failed release is kept only in C(last_failure), never as C(previous) - a rollback never returns to it. When
    the restored release was the previous one, nothing older is known.
  - O(keep) - release venvs under O(venvs_root) beyond the O(keep) newest are removed, never those of the
    current and previous releases (after the change above) nor the O(protect)ed ones.
version_added: "0.1.0"
author:
  - revive project
options:
  path:
    description: The release record on the node.
    type: path
    default: /var/lib/revive/releases.json
  current:
    description: The release the units point at now, as M(vllm_release_info) returned it (C(desired), or C(rollback.target) after a rollback).
    type: dict
  failure:
    description: The release that failed and what a rollback made of it; O(current) is then the restored release.
    type: dict
    suboptions:
      release:
        description: The failed release.
        type: dict
        required: true
      message:
        description: What failed (with the journal excerpt); kept in the record's C(last_failure).
        type: str
        default: ""
      serving:
        description: Whether the restored release is active and healthy again.
        type: bool
        default: false
  keep:
    description: How many release venvs to keep, newest first (the current, previous and protected ones are kept anyway); unset removes none.
    type: int
  venvs_root:
    description: Directory holding one venv per release, for O(keep).
    type: path
    default: /opt/vllm/venvs
  protect:
    description: Venvs never to remove (the one just built for the desired release), for O(keep).
    type: list
    elements: path
    default: []
attributes:
  check_mode:
    support: full
    details: Reports what it would write and remove.
  diff_mode:
    support: full
    details: The record before and after; for O(keep), the venvs before and after.
notes:
  - The record holds no secret (the API key lives only in the service's environment file).
seealso:
  - module: vllm_release_info
"""

EXAMPLES = r"""
- name: Record the release as current once every replica is active and healthy
  vllm_release:
    current: "{{ release_state.desired }}"

- name: Record a failed release and the one the rollback restored
  vllm_release:
    current: "{{ rollback.rollback.target }}"
    failure:
      release: "{{ failed_release }}"
      message: "vllm-0.service did not answer /health within its start deadline"
      serving: true

- name: Keep the three newest release venvs (and always the current and previous ones)
  vllm_release:
    keep: 3
    protect: [/opt/vllm/venvs/0.5.4-3f9a1c2e]
"""

RETURN = r"""
current: {description: The release recorded as current (null when none is)., returned: always, type: dict}
previous: {description: The release before it (null if none)., returned: always, type: dict}
last_failure: {description: "The last failed release: release, message, at, restored, restored_serving.", returned: always, type: dict}
removed: {description: Venvs removed (or, in check mode, to be removed)., returned: when O(keep) is set, type: list, elements: str}
"""

import datetime
import os
import platform
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_files import write_atomic
from ansible.module_utils.revive_record import ReleaseError
from ansible.module_utils.revive_record.record import load_record, promote, record_rollback
from ansible.module_utils.revive_record.venvs import venvs_to_prune
from ansible.module_utils.revive_venv import MARKER

FAILURE_SPEC = {
    "release": {"type": "dict", "required": True},
    "message": {"type": "str", "default": ""},
    "serving": {"type": "bool", "default": False},
}


def read_text(path: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def release_venvs(root: str) -> list:
    """(path, build time) of every venv under `root`: its completion marker's mtime, else the directory's."""
    venvs = []
    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            full = os.path.join(root, name)
            if os.path.isdir(full) and not os.path.islink(full):
                marker = os.path.join(full, MARKER)
                venvs.append((full, os.stat(marker if os.path.exists(marker) else full).st_mtime))
    return venvs


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "keep": Bound(int, 0, high=1000, optional=True, leave_out="remove no venv"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/revive/releases.json"},
            "current": {"type": "dict"},
            "failure": {"type": "dict", "options": FAILURE_SPEC},
            "keep": {"type": "int"},
            "venvs_root": {"type": "path", "default": "/opt/vllm/venvs"},
            "protect": {"type": "list", "elements": "path", "default": []},
        },
        required_one_of=[("current", "failure", "keep")],
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "vllm_release")
    params = module.params
    path = params["path"]
    try:
        record = load_record(read_text(path), f"{path} on {platform.node()}")
        updated, changed = record, False
        if params["failure"] is not None:
            failure = params["failure"]
            updated = record_rollback(record, failure["release"], params["current"], failure["serving"],
                                      failure["message"], now_utc())
            changed = True
        elif params["current"] is not None:
            updated, changed = promote(record, params["current"], now_utc())
        if changed and not module.check_mode:
            write_atomic(path, updated.text(), make_parents=True)
        diffs = []
        if params["failure"] is not None or params["current"] is not None:
            diffs.append({"before": record.text(), "after": updated.text(), "before_header": path,
                          "after_header": path})
        result = {"current": updated.current, "previous": updated.previous, "last_failure": updated.last_failure}
        if params["keep"] is not None:
            venvs = release_venvs(params["venvs_root"])
            protect = list(params["protect"]) + [(r or {}).get("venv") for r in (updated.current, updated.previous)]
            removed = venvs_to_prune(venvs, params["keep"], protect)
            if removed and not module.check_mode:
                for victim in removed:
                    shutil.rmtree(victim)
            diffs.append({"before": "".join(f"{p}\n" for p, _ in venvs),
                          "after": "".join(f"{p}\n" for p, _ in venvs if p.rstrip("/") not in removed)})
            result["removed"] = removed
            changed = changed or bool(removed)
        module.exit_json(changed=changed, diff=diffs if len(diffs) > 1 else diffs[0], **result)
    except ReleaseError as error:
        module.fail_json(msg=str(error))


if __name__ == "__main__":
    main()
