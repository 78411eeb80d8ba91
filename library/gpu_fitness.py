#!/usr/bin/python
"""Ansible module gpu_fitness: thin wiring over module_utils/revive_fitness.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_fitness
short_description: Decide whether a GPU node is fit to serve its planned vLLM release
description:
  - Evaluates the preflight's fitness rules on the node's GPU facts (from M(nvml_facts)), the planner's
    outcome (from M(vllm_plan)) and the inventory's expectations, and returns V(fit) with one finding per
    problem. Each finding says what is wrong, on which GPU (index and PCI bus id), why it matters for
    serving and what to do.
  - Unfit (the host is to be quarantined) - GPU count or model other than expected; driver branch outside
    the planned release's window (below its C(driver.min_branch) in C(data/vllm-releases.yml), or past the
    architecture's last branch, R580 for Volta); pending retired pages or remapped rows; uncorrected ECC
    errors; a PCIe link trained below its maximum width (or a warning, see O(pcie_width_below_max)); a
    compute process that is not the node's own vLLM service; a planner refusal; a failed probe.
  - Warnings - persistence mode off; a PCIe generation below the maximum (links down-train when idle).
  - Processes of the vLLM service are recognised by their systemd unit (from C(/proc/PID/cgroup)) or their
    user (C(/proc/PID/status)), so a re-run on a serving node does not quarantine it.
  - Never fails because a node is unfit; the play groups unfit hosts (C(quarantined)) and goes on.
version_added: "0.1.0"
author:
  - revive project
options:
  gpu:
    description: The GPU facts (C(ansible_facts['gpu'])); omit when the probe failed and give O(probe_error).
    type: dict
  probe_error:
    description: The probe's error message when M(nvml_facts) failed; makes the node unfit with it.
    type: str
  release:
    description: The planned release (C(revive_release)); its C(vllm_version) and C(pins.cuda) name the driver window.
    type: dict
  release_driver:
    description: The planned release's C(driver) entry of C(data/vllm-releases.yml) (C(min_branch), C(tested_branch)).
    type: dict
  refusal:
    description: The planner's refusal (C(reason), C(source)) when it refused.
    type: dict
  expected_gpu_count:
    description: GPUs the inventory expects on this node; V(0) checks nothing.
    type: int
    default: 0
  expected_gpu_name:
    description: GPU model the inventory expects, as NVML names it (e.g. C(Tesla V100-PCIE-32GB)); empty checks nothing.
    type: str
    default: ""
  pcie_width_below_max:
    description: Verdict for a link trained below its maximum width.
    type: str
    choices: [unfit, warn]
    default: unfit
  pcie_gen_below_max:
    description: Verdict for a link below its maximum generation (idle links down-train to save power).
    type: str
    choices: [unfit, warn]
    default: warn
  own_service_units:
    description: Shell patterns of the systemd units whose GPU processes are the node's own vLLM service.
    type: list
    elements: str
    default: ["vllm*.service"]
  own_service_users:
    description: Users whose GPU processes are the node's own vLLM service.
    type: list
    elements: str
    default: [vllm]
attributes:
  check_mode:
    support: full
    details: Read-only; the same verdict in check mode.
  diff_mode:
    support: none
notes:
  - The rules live in C(module_utils/revive_fitness.py), one function each.
seealso:
  - module: nvml_facts
  - module: vllm_plan
  - module: preflight_summary
"""

EXAMPLES = r"""
- name: Decide fitness
  gpu_fitness:
    gpu: "{{ ansible_facts['gpu'] }}"
    release: "{{ ansible_facts['revive_release'] | default(omit) }}"
    release_driver: "{{ releases.releases[ansible_facts['revive_release']['vllm_version']].driver }}"
    expected_gpu_count: 8
    expected_gpu_name: Tesla V100-PCIE-32GB
  register: fitness

- name: Quarantine an unfit node
  ansible.builtin.group_by:
    key: quarantined
  when: not fitness.fit
"""

RETURN = r"""
fit:
  description: True when no finding makes the node unfit.
  returned: always
  type: bool
reasons:
  description: The message of every unfit finding (what, which GPU, why, fix).
  returned: always
  type: list
  elements: str
  sample: ["GPU 5 (00000000:89:00.0): 2 uncorrected ECC error(s) since the driver loaded (2 in the GPU's lifetime). Why it matters: ... Fix: ..."]
warning_messages:
  description: The message of every warning (not C(warnings), which Ansible reserves for its own).
  returned: always
  type: list
  elements: str
unfit_checks:
  description: The distinct rules that made the node unfit.
  returned: always
  type: list
  elements: str
  sample: [ecc_uncorrected, foreign_process, pcie_width, retired_pages_pending]
findings:
  description: Every finding - check, verdict (unfit or warn), gpu_index, pci_bus_id, what, why, fix, message.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_fitness import PlanOutcome, Policy, evaluate


def plan_outcome(release: dict | None, driver: dict | None, refusal: dict | None) -> PlanOutcome:
    release, driver, refusal = release or {}, driver or {}, refusal or {}
    return PlanOutcome(
        vllm_version=release.get("vllm_version"), cuda=(release.get("pins") or {}).get("cuda"),
        driver_min_branch=driver.get("min_branch") if release else None,
        driver_tested_branch=driver.get("tested_branch") if release else None,
        refusal_reason=refusal.get("reason"), refusal_source=refusal.get("source"))


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "expected_gpu_count": Bound(int, 0, high=1024, unset=0, unset_means="checks nothing", why="GPUs the inventory expects"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gpu": {"type": "dict"},
            "probe_error": {"type": "str"},
            "release": {"type": "dict"},
            "release_driver": {"type": "dict"},
            "refusal": {"type": "dict"},
            "expected_gpu_count": {"type": "int", "default": 0},
            "expected_gpu_name": {"type": "str", "default": ""},
            "pcie_width_below_max": {"type": "str", "choices": ["unfit", "warn"], "default": "unfit"},
            "pcie_gen_below_max": {"type": "str", "choices": ["unfit", "warn"], "default": "warn"},
            "own_service_units": {"type": "list", "elements": "str", "default": ["vllm*.service"]},
            "own_service_users": {"type": "list", "elements": "str", "default": ["vllm"]},
        },
        required_one_of=[("gpu", "probe_error")],
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "gpu_fitness")
    params = module.params
    policy = Policy(expected_gpu_count=params["expected_gpu_count"], expected_gpu_name=params["expected_gpu_name"],
                    pcie_width_below_max=params["pcie_width_below_max"],
                    pcie_gen_below_max=params["pcie_gen_below_max"],
                    own_service_units=tuple(params["own_service_units"]),
                    own_service_users=tuple(params["own_service_users"]))
    verdict = evaluate(params["gpu"], policy, plan_outcome(params["release"], params["release_driver"],
                                                           params["refusal"]),
                       probe_error=params["probe_error"])
    module.exit_json(changed=False, **verdict.as_dict())


if __name__ == "__main__":
    main()
