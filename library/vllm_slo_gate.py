#!/usr/bin/python
"""Ansible module vllm_slo_gate: thin wiring over module_utils/revive_slo_gate.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_slo_gate
short_description: Prove the SLO on a GPU node, on the node, before it takes traffic
description:
  - The hand-over's SLO gate (roles/handover, O(concurrency) from the front door's limits). After the warm-up, one
    closed-loop level of C(revive bench) runs on the node against its own replicas on O(host), at the sum of
    O(concurrency) in flight (requests handed to the replicas in turn), for O(warmup) then O(duration) seconds.
  - While it runs the node is watched as C(playbooks/benchmark.yml) watches it (units' C(NRestarts) and C(MainPID),
    C(/health), C(/metrics) counters, per-GPU utilisation through NVML when the interpreter has pynvml, the
    journal's out-of-memory lines), and the level is judged with it. The verdict's rules are C(revive bench)'s
    (docs/bench.md) - P95 end-to-end latency against O(slo_e2e_p95) with a one-sided 95 % bound, errors, server
    restarts, OOM, GPU balance within O(max_gpu_imbalance), the client's own dispatch lag and achieved concurrency.
  - Only PASS passes. FAIL, INVALID (the client on the node could not keep the load up) and INCONCLUSIVE (too few
    completions inside O(duration) for the P95 bound) fail the module with the reasons.
  - On the lab's twin the latencies and the SLO are in its simulated seconds (the time scale its C(/version) reports).
version_added: "0.1.0"
author:
  - revive project
options:
  node:
    description: The node's name (its inventory name), in the samples, the report and the messages.
    type: str
    required: true
  model:
    description: The served model name every replica answers to (C(--served-model-name), else C(--model)).
    type: str
    required: true
  concurrency:
    description: Requests in flight per replica of the node's current release (replica name to a number, every
      replica of the release named); the level runs their sum.
    type: dict
    required: true
  prompts:
    description: The prompt file's text (JSONL, C(revive bench --prompts)'s format, data/bench/prompts.jsonl).
    type: str
    required: true
  prompts_source:
    description: Where O(prompts) came from, for the report's provenance and errors.
    type: str
    default: bundled
  prompt_tokens:
    description: Token budget each prompt is trimmed to (approximate; docs/bench.md).
    type: int
    default: 256
  record_path:
    description: The node's release record; its current release's replicas are benchmarked.
    type: path
    default: /var/lib/revive/releases.json
  host:
    description: Address the replicas listen on, seen from the node; empty - each replica's own, the C(--host) its
      argv in the record binds (loopback for C(0.0.0.0)).
    type: str
    default: ""
  duration:
    description: Seconds of load that count, after O(warmup).
    type: float
    default: 60
  warmup:
    description: Seconds of load before the measured window (not counted).
    type: float
    default: 5
  max_tokens:
    description: C(max_tokens) of every request.
    type: int
    default: 200
  kind:
    description: API of the requests.
    type: str
    choices: [completions, chat]
    default: completions
  slo_e2e_p95:
    description: The SLO, seconds of P95 end-to-end latency.
    type: float
    default: 12
  max_gpu_imbalance:
    description: Largest spread of GPU utilisation share inside a replica's GPUs and across replicas.
    type: float
    default: 0.2
  max_dispatch_lag_p99:
    description: Largest p99 dispatch lag of the client, seconds, before the level is INVALID.
    type: float
    default: 0.05
  api_key:
    description: The replicas' API key; sent as a bearer token, never written anywhere.
    type: str
  timeout:
    description: Seconds without data after which a request fails.
    type: float
    default: 120
  sample_interval:
    description: Seconds between the node's samples.
    type: float
    default: 1
  time_scale:
    description: Wall seconds per simulated second; 0 reads it from the servers' C(/version) (1 for a real vLLM).
    type: float
    default: 0
  report_dir:
    description: Directory on the node for the report (summary.json, levels.csv, report.md, requests.jsonl,
      samples.jsonl); empty keeps none.
    type: path
    default: ""
attributes:
  check_mode:
    support: full
    details: Sends nothing and writes nothing; says what it would run.
  diff_mode:
    support: none
notes:
  - Runs on the node. Standard library only; with pynvml importable (the probe venv's interpreter) it samples the
    GPUs, otherwise the GPU balance rule is reported as not checked.
seealso:
  - name: vLLM 0.5.4 OpenAI-compatible server
    description: The API the requests use (the verdict's rules and the metrics' definitions are in docs/bench.md).
    link: https://docs.vllm.ai/en/v0.5.4/serving/openai_compatible_server.html
"""

EXAMPLES = r"""
- name: Prove the SLO on the node before it goes READY
  vllm_slo_gate:
    node: "{{ inventory_hostname }}"
    model: chat-20b
    concurrency: {vllm-0: 32}
    prompts: "{{ lookup('ansible.builtin.file', 'data/bench/prompts.jsonl', rstrip=false) }}"
    duration: 60
    slo_e2e_p95: 12
    report_dir: /var/lib/revive/slo-gate/{{ release_id }}
  vars:
    ansible_python_interpreter: /opt/revive/probe-venv/bin/python
"""

RETURN = r"""
passed:
  description: Whether the level passed (the module fails otherwise).
  returned: always
  type: bool
verdict:
  description: PASS, FAIL, INCONCLUSIVE or INVALID (empty when the gate could not run or in check mode).
  returned: always
  type: str
msg:
  description: The verdict, the load, the P95 against the SLO, the reasons and where the report is.
  returned: always
  type: str
concurrency:
  description: Requests in flight in the level (the sum of O(concurrency)).
  returned: always
  type: int
level:
  description: The judged level (C(revive bench)'s summary entry - stats, verdict, node observation, per replica and
    per node verdicts).
  returned: when the gate ran
  type: dict
simulation:
  description: The summary's C(simulation) (time scale and what it changes); null for a real server.
  returned: when the gate ran
  type: dict
report_dir:
  description: Where the report was written (empty when none).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_slo_gate import GateError, GateSpec, run_gate


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "prompt_tokens": Bound(int, 1),
    "duration": Bound(float, 0, high=86400, low_open=True, why="seconds"),
    "warmup": Bound(float, 0, high=86400, why="seconds"),
    "max_tokens": Bound(int, 1),
    "slo_e2e_p95": Bound(float, 0, high=10 ** 6, low_open=True, why="seconds"),
    "max_gpu_imbalance": Bound(float, 0, high=1, why="a share of utilisation"),
    "max_dispatch_lag_p99": Bound(float, 0, high=60, low_open=True, why="seconds"),
    "timeout": Bound(float, 0, high=86400, low_open=True, why="seconds"),
    "sample_interval": Bound(float, 0, high=3600, low_open=True, why="seconds"),
    "time_scale": Bound(float, 0, high=1000, low_open=True, unset=0, unset_means="read from the servers' /version",
                        why="wall seconds per simulated second"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "node": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "concurrency": {"type": "dict", "required": True},
            "prompts": {"type": "str", "required": True},
            "prompts_source": {"type": "str", "default": "bundled"},
            "prompt_tokens": {"type": "int", "default": 256},
            "record_path": {"type": "path", "default": "/var/lib/revive/releases.json"},
            "host": {"type": "str", "default": ""},
            "duration": {"type": "float", "default": 60},
            "warmup": {"type": "float", "default": 5},
            "max_tokens": {"type": "int", "default": 200},
            "kind": {"type": "str", "choices": ["completions", "chat"], "default": "completions"},
            "slo_e2e_p95": {"type": "float", "default": 12},
            "max_gpu_imbalance": {"type": "float", "default": 0.2},
            "max_dispatch_lag_p99": {"type": "float", "default": 0.05},
            "api_key": {"type": "str", "no_log": True},
            "timeout": {"type": "float", "default": 120},
            "sample_interval": {"type": "float", "default": 1},
            "time_scale": {"type": "float", "default": 0},
            "report_dir": {"type": "path", "default": ""},
        },
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "vllm_slo_gate")
    p = module.params
    empty = {"passed": False, "verdict": "", "report_dir": "", "concurrency": 0}
    try:
        per_replica = {str(name): int(value) for name, value in p["concurrency"].items()}
    except (TypeError, ValueError):
        module.fail_json(msg=f"{p['node']}: concurrency {p['concurrency']!r}: every value must be an integer "
                             "(requests in flight per replica)", **empty)
    spec = GateSpec(node=p["node"], model=p["model"], concurrency=per_replica, prompts=p["prompts"].encode("utf-8"),
                    prompts_source=p["prompts_source"], prompt_tokens=p["prompt_tokens"],
                    record_path=p["record_path"], host=p["host"], duration_s=p["duration"], warmup_s=p["warmup"],
                    max_tokens=p["max_tokens"], kind=p["kind"], slo_e2e_p95_s=p["slo_e2e_p95"],
                    max_gpu_imbalance=p["max_gpu_imbalance"], max_dispatch_lag_p99_s=p["max_dispatch_lag_p99"],
                    api_key=p["api_key"] or "", timeout_s=p["timeout"], sample_interval_s=p["sample_interval"],
                    time_scale=p["time_scale"] or None, report_dir=p["report_dir"] or "")
    try:
        spec.validate()
    except GateError as error:
        module.fail_json(msg=f"{p['node']}: {error}", **empty)
    total = sum(per_replica.values())
    if module.check_mode:
        module.exit_json(changed=False, **{**empty, "concurrency": total},
                         msg=f"check mode: {p['node']}: nothing sent; would run the SLO gate at {total} in flight "
                             f"({per_replica}) for {spec.warmup_s:g} + {spec.duration_s:g} s against P95 E2E "
                             f"{spec.slo_e2e_p95_s:g} s")
    try:
        outcome = run_gate(spec)
    except GateError as error:
        module.fail_json(msg=str(error), **{**empty, "concurrency": total})
    level = outcome.summary["levels"][0]
    result = {"changed": bool(outcome.report_dir), "passed": outcome.passed, "verdict": outcome.verdict,
              "concurrency": outcome.concurrency, "level": level, "report_dir": outcome.report_dir,
              "simulation": outcome.summary.get("simulation")}
    if not outcome.passed:
        module.fail_json(msg=outcome.message, **result)
    module.exit_json(msg=outcome.message, **result)


if __name__ == "__main__":
    main()
