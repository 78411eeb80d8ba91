#!/usr/bin/python
"""Ansible module revive_inventory_check: thin wiring over check_inventory() in module_utils/revive_inventory.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: revive_inventory_check
short_description: Refuse every mistake in an inventory's site-wide settings (revive_*) before anything runs
description:
  - Checks what each host of the run sets of the C(revive_*) namespace against the declaration of the site-wide
    settings (O(spec), the C(main) options of C(roles/revive_defaults/meta/argument_specs.yml)) and what the run's
    O(stages) need.
  - Refuses a variable a stage needs that is not set (an option without a default), a value of the wrong type or
    outside its choices, a renamed value (C(revive_model_source_type - mounted), now C(node_path)), a value a later
    step would refuse (an empty model name, a relative model path, a mirror without C(index_url), a percentage
    outside 0-100, ...), a value that does not resolve (an undefined variable in its template), an unknown
    C(revive_*) name (with the closest declared one), and a group a stage needs that has no host.
  - Every mistake is reported at once, each with what is wrong, where (the hosts, or the group whose vars set it)
    and how to fix it. Values of C(no_log) options are never shown.
  - Runs on the controller (C(delegate_to - localhost), C(run_once)) and changes nothing. The role
    validate_inventory gathers its input; playbooks/boilerplate.yml runs it first.
version_added: "0.1.0"
author:
  - revive project
options:
  spec:
    description:
      - The site-wide variables - name to argument-spec option (C(type), C(choices), C(default), C(options),
        C(no_log)).
    type: dict
    required: true
  hosts:
    description:
      - Per host of the run, the C(revive_*) variables it sets (inventory, group and host vars, extra vars; not facts).
      - A value that did not resolve is the string C(__revive_undefined__).
    type: dict
    required: true
  groups:
    description: The inventory's groups (the magic variable C(groups)).
    type: dict
    required: true
  stages:
    description: What the run does; each stage needs its own variables on its own groups' hosts.
    type: list
    elements: str
    choices: [preflight, provision, handover, rolling, benchmark]
    default: [preflight, provision, handover]
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Refuse every inventory mistake before anything runs
  revive_inventory_check:
    spec: "{{ (lookup('ansible.builtin.file', 'roles/revive_defaults/meta/argument_specs.yml') | from_yaml)
              .argument_specs.main.options }}"
    hosts:
      node1: {revive_model_name: chat-20b, revive_model_source_type: mounted}
    groups: "{{ groups }}"
    stages: [preflight]
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
ok:
  description: Whether the settings are complete and valid (always true on success).
  returned: always
  type: bool
checked:
  description: The hosts whose settings were checked.
  returned: always
  type: list
  elements: str
mistakes:
  description: One entry per mistake - variable, what, fix, hosts, message.
  returned: always
  type: list
  elements: dict
  sample:
    - variable: revive_model_source_type
      what: "'mounted' was renamed to 'node_path'"
      fix: "set revive_model_source_type: node_path (Where the model is - ...)"
      hosts: [node1, node2]
      message: "revive_model_source_type 'mounted' was renamed to 'node_path' - on the hosts of group gpu_nodes ..."
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_inventory import STAGES, check_inventory, secrets


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "spec": {"type": "dict", "required": True},
            "hosts": {"type": "dict", "required": True},
            "groups": {"type": "dict", "required": True},
            "stages": {"type": "list", "elements": "str", "choices": list(STAGES),
                       "default": ["preflight", "provision", "handover"]},
        },
        supports_check_mode=True,
    )
    params = module.params
    module.no_log_values.update(secrets(params["spec"], params["hosts"]))
    report = check_inventory(params["spec"], params["hosts"], params["groups"], params["stages"])
    if not report.ok:
        module.fail_json(**report.as_dict())
    module.exit_json(changed=False, **report.as_dict())


if __name__ == "__main__":
    main()
