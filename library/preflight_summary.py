#!/usr/bin/python
"""Ansible module preflight_summary: thin wiring over fleet_summary() in module_utils/revive_fitness.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_summary
short_description: Per-host preflight summary of a GPU fleet and its unfit-percentage policy
description:
  - Builds one line per GPU node - V(fit), V(quarantined) with every reason, V(failed) (no preflight result
    - unreachable or a task error), or V(not probed) (check mode before the probe venv exists) - and decides
    whether the fleet may go on.
  - Quarantined and failed nodes count as unfit. When their share of the GPU nodes exceeds
    O(max_unfit_percent), C(exceeded) is V(true); the preflight play then fails the run before anything is
    provisioned. The module itself never fails on the policy, so the summary is always shown first.
  - Runs on the controller and changes nothing.
version_added: "0.1.0"
author:
  - revive project
options:
  hosts:
    description: Every GPU node of the run (e.g. C(groups['gpu_nodes'])).
    type: list
    elements: str
    required: true
  results:
    description:
      - The preflight results of the hosts that finished it (the role's fact C(gpu_preflight_result)
        - M(gpu_fitness)'s return plus C(host), C(probed), C(note) and C(release)); a host of O(hosts) without
        one here failed.
    type: list
    elements: dict
    required: true
  max_unfit_percent:
    description: The largest share of unfit GPU nodes, in percent, with which the fleet goes on.
    type: float
    required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
seealso:
  - module: gpu_fitness
"""

EXAMPLES = r"""
- name: Summarise the fleet
  preflight_summary:
    hosts: "{{ groups['gpu_nodes'] }}"
    results: >-
      {{ groups['gpu_nodes'] | map('extract', hostvars) | selectattr('gpu_preflight_result', 'defined')
         | map(attribute='gpu_preflight_result') | list }}
    max_unfit_percent: 50
  register: summary

- name: Show it
  ansible.builtin.debug:
    msg: "{{ summary.lines }}"

- name: Stop the fleet when too many nodes are unfit
  ansible.builtin.assert:
    that: not summary.exceeded
    fail_msg: "{{ summary.policy_message }}"
"""

RETURN = r"""
lines:
  description: The summary, a headline then one line per host and one per reason or warning.
  returned: always
  type: list
  elements: str
  sample:
    - "2 fit, 1 quarantined, 0 failed of 3 GPU node(s): 33.3 % unfit, policy allows at most 50 % (revive_max_unfit_percent)"
    - "node1: FIT - vLLM 0.5.4, 2 x TP 4 (GPUs 0,1,2,3 | 4,5,6,7)"
    - "node3: QUARANTINED - vLLM 0.5.4, 2 x TP 4 (GPUs 0,1,2,3 | 4,5,6,7)"
    - "  unfit: GPU 1 (00000000:1B:00.0): page retirement pending ..."
headline:
  description: The first line.
  returned: always
  type: str
hosts:
  description: Per host - status (fit, quarantined, failed, not probed), reasons, warnings, unfit_checks, release.
  returned: always
  type: dict
total:
  description: GPU nodes counted.
  returned: always
  type: int
counts:
  description:
    - Nodes per status - fit, quarantined, failed (no result), not_probed (check mode before the probe venv).
    - Under one key, since a top-level C(failed) would be taken for the task's own status.
  returned: always
  type: dict
  sample: {fit: 2, quarantined: 1, failed: 0, not_probed: 0}
unfit_percent:
  description: (quarantined + failed) / total, in percent, one decimal.
  returned: always
  type: float
max_unfit_percent:
  description: The policy's limit.
  returned: always
  type: float
exceeded:
  description: True when unfit_percent is above max_unfit_percent.
  returned: always
  type: bool
policy_message:
  description: The policy's verdict as a sentence (the run's failure message when exceeded).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_fitness import fleet_summary


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "max_unfit_percent": Bound(float, 0, high=100, why="percent"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "hosts": {"type": "list", "elements": "str", "required": True},
            "results": {"type": "list", "elements": "dict", "required": True},
            "max_unfit_percent": {"type": "float", "required": True},
        },
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "preflight_summary")
    params = module.params
    by_host = {result.get("host"): result for result in params["results"]}
    summary = fleet_summary(params["hosts"], by_host, params["max_unfit_percent"])
    module.exit_json(changed=False, **summary.as_dict())


if __name__ == "__main__":
    main()
