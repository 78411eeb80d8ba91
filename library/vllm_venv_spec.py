#!/usr/bin/python
"""Ansible module vllm_venv_spec: thin wiring over module_utils/revive_record/venvs.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_venv_spec
short_description: The exact pins and the name of a release venv, for this node's Python
description:
  - Says which exact pins the release venv installs - the plan's pins without the non-package keys (C(cuda),
    C(python)), and without FlashAttention below compute capability 8.0 - and names the venv
    C(<version>-<hash of pins, interpreter and lock>), after checking that O(python) runs and satisfies the
    release's Python pin.
  - The vllm_runtime role builds the venv from this (M(pip_venv)). It changes nothing.
version_added: "0.1.0"
author:
  - revive project
options:
  plan:
    description: The planner's release (vllm_plan's C(release), the host fact C(revive_release)).
    type: dict
    required: true
  python:
    description: Interpreter the release venv is made from.
    type: str
    required: true
  lock_sha256:
    description: The sha256 of the release's lock, part of the venv name (a regenerated lock gets a new venv).
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    details: Only reads (it runs O(python) to ask its version).
seealso:
  - module: pip_venv
"""

EXAMPLES = r"""
- name: The release venv's pins and name for this node's Python
  vllm_venv_spec:
    plan: "{{ ansible_facts['revive_release'] }}"
    python: /usr/bin/python3.11
  register: venv_spec
"""

RETURN = r"""
packages: {description: The exact pins of the release venv., returned: always, type: list, elements: str, sample: ["torch==2.4.0", "vllm==0.5.4", "xformers==0.0.27.post2"]}
notes: {description: What was left out of the pins and why., returned: always, type: list, elements: str}
name: {description: The venv's directory name., returned: always, type: str, sample: 0.5.4-3f9a1c2e}
flash_attention_excluded: {description: Whether FlashAttention is kept out (compute capability below 8.0)., returned: always, type: bool}
python: {description: The interpreter checked (O(python))., returned: always, type: str, sample: /usr/bin/python3.11}
python_version: {description: Version of O(python)., returned: always, type: str, sample: "3.11.2"}
python_minor: {description: Its major.minor (which lock the node installs)., returned: always, type: str, sample: "3.11"}
"""

import platform

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_record import ReleaseError
from ansible.module_utils.revive_record.venvs import cc_below_8, python_satisfies, venv_name, venv_packages


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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "plan": {"type": "dict", "required": True},
            "python": {"type": "str", "required": True},
            "lock_sha256": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        module.exit_json(changed=False, **venv_spec(module, params["plan"], params["python"], params["lock_sha256"]))
    except ReleaseError as error:
        module.fail_json(msg=str(error))


if __name__ == "__main__":
    main()
