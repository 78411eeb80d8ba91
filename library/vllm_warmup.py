#!/usr/bin/python
"""Ansible module vllm_warmup: thin wiring over module_utils/revive_warmup.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_warmup
short_description: Warm up one vLLM replica on the node and write the hand-over report
description:
  - Proves that a vLLM replica (0.5.4's OpenAI-compatible server) is ready for traffic, on the node itself, before
    the front door sends it anything. The first requests after a cold start are slow (10+ s in
    docs/field-report.md ('Failures met') 5), and C(/health) answers long before that.
  - Waits for C(GET /health) = 200 until O(health_timeout) while watching O(unit) with
    C(systemctl show -p ActiveState,SubState,NRestarts,ExecMainStatus,InvocationID). A unit that fails, waits
    to restart, restarts or is started anew fails the module at the next poll, with the last 20 lines of
    C(journalctl -u UNIT), instead of waiting out the deadline.
  - Checks that C(/v1/models) lists O(served_model_name), reads C(/version) (the lab's twin says it is simulated).
  - Sends at least O(requests) streamed requests, O(concurrency) at a time, from bundled realistic prompts or
    O(prompts). Each must answer HTTP 200 with text, C(data - [DONE]), a C(finish_reason) and sane usage.
    TTFT (first content-bearing event; the chat role-only chunk does not count), TPOT and end-to-end latency
    are recorded per request.
  - "Settle rule: with w = O(settle.window), the median of O(settle.metric) over the last w answers (in
    completion order) must be within O(settle.tolerance) of the median over the w answers before them. Until it
    holds, w more requests are sent, up to O(max_requests); then the module fails with the numbers."
  - Optional limits on the settled medians (O(max_ttft), O(max_tpot)); on the lab's twin they are compared in its
    modelled seconds (measured / the time scale its C(/version) reports).
  - Writes the hand-over report (release, plan summary, every latency, whether anything was simulated) into
    O(report_path) under C(replicas.<replica>), also when the warm-up fails, then fails with the reason.
version_added: "0.1.0"
author:
  - revive project
options:
  port:
    description: Port of the replica on O(host).
    type: int
    required: true
  host:
    description: Address the replica listens on, seen from the node.
    type: str
    default: 127.0.0.1
  served_model_name:
    description: The model name C(/v1/models) must list and the requests use.
    type: str
    required: true
  unit:
    description: The replica's systemd unit, watched during the health wait and quoted on failure. Without it no unit is watched.
    type: str
  replica:
    description: The replica's name, the key of its entry in the report. Defaults to O(unit), else C(host:port).
    type: str
  api_key:
    description: The server's API key (C(--api-key) / C(VLLM_API_KEY)); sent as a bearer token, never written anywhere.
    type: str
  health_timeout:
    description: Seconds to wait for C(/health) = 200.
    type: float
    default: 900
  poll_interval:
    description: Seconds between health polls (and unit checks).
    type: float
    default: 1
  request_timeout:
    description: Seconds without data from the server after which a request fails.
    type: float
    default: 120
  requests:
    description: Warm-up requests to send at least (the operator of docs/field-report.md sent about 20).
    type: int
    default: 20
  max_requests:
    description: Requests to send at most while waiting for latency to settle.
    type: int
    default: 60
  concurrency:
    description: Requests in flight at once (a closed loop).
    type: int
    default: 4
  kind:
    description: API used for the requests.
    type: str
    choices: [chat, completions]
    default: chat
  max_tokens:
    description: C(max_tokens) of every request (vLLM 0.5.4 rejects C(max_completion_tokens)).
    type: int
    default: 128
  temperature:
    description: Sampling temperature of every request.
    type: float
    default: 0.7
  prompts:
    description: The operator's prompts (user messages, or prompts for V(completions)), used in turn. Empty means the bundled set.
    type: list
    elements: str
    default: []
  settle:
    description: The settle rule.
    type: dict
    default: {}
    suboptions:
      metric:
        description: Per-request latency the rule compares.
        type: str
        choices: [tpot, ttft, e2e]
        default: tpot
      window:
        description: Answers per window; the rule needs two windows.
        type: int
        default: 5
      tolerance:
        description: Largest relative change (either direction) between the two windows' medians.
        type: float
        default: 0.25
  max_ttft:
    description: Largest settled median TTFT in seconds; 0 means no limit.
    type: float
    default: 0
  max_tpot:
    description: Largest settled median time per output token in seconds; 0 means no limit.
    type: float
    default: 0
  release:
    description: The release being warmed up (recorded in the report; e.g. the current entry of the release record).
    type: dict
    default: {}
  plan:
    description: A summary of the plan (recorded in the report).
    type: dict
    default: {}
  gpu_simulated:
    description: Whether the node's GPUs are simulated (C(simulated) of the GPU facts); recorded in the report.
    type: bool
  report_path:
    description: The node's hand-over report (JSON). Empty means none is written.
    type: path
    default: /var/lib/revive/handover.json
attributes:
  check_mode:
    support: full
    details: Sends nothing and writes nothing; returns what it would do.
  diff_mode:
    support: none
notes:
  - Runs on the node with the system python3 (3.9+, standard library only).
  - The report holds no secret; the API key is never written.
seealso:
  - name: vLLM 0.5.4 OpenAI-compatible server
    description: The API the requests use.
    link: https://docs.vllm.ai/en/v0.5.4/serving/openai_compatible_server.html
"""

EXAMPLES = r"""
- name: Warm up replica vllm-0 before it takes traffic
  vllm_warmup:
    port: 8000
    served_model_name: tiny-chat
    unit: vllm-vllm-0.service
    replica: vllm-0
    release: "{{ release_record.current }}"
    gpu_simulated: "{{ gpu_facts.simulated }}"

- name: Stricter warm-up with the operator's prompts and limits
  vllm_warmup:
    port: 8001
    served_model_name: chat-20b
    unit: vllm-vllm-1.service
    api_key: "{{ vault_vllm_api_key }}"
    prompts: "{{ lookup('ansible.builtin.file', 'prompts.json') | from_json }}"
    requests: 30
    concurrency: 8
    settle: {metric: ttft, window: 8, tolerance: 0.2}
    max_ttft: 4.0
"""

RETURN = r"""
passed:
  description: Whether the replica warmed up (the module fails otherwise).
  returned: always
  type: bool
msg:
  description: What happened, with the settle verdict or the reason for failing.
  returned: always
  type: str
report:
  description: This replica's hand-over report, as written under C(replicas.<replica>) in O(report_path).
    A replica that failed before its first request (health wait, C(/v1/models)) gets an entry with C(passed=false),
    its C(message) and no C(warmup).
  returned: unless check mode or the replica failed before its first request
  type: dict
  contains:
    passed: {description: Warm-up passed., type: bool}
    release: {description: O(release) as given., type: dict}
    plan: {description: O(plan) as given., type: dict}
    vllm_version: {description: What C(/version) reported., type: str, sample: 0.5.4+sim}
    simulated: {description: Whether the server or the GPUs are simulated., type: bool}
    simulation: {description: "vllm (bool), gpus (bool or null), time_scale (float).", type: dict}
    health: {description: "waited_s, polls, unit (systemctl show after the wait).", type: dict}
    warmup:
      description: "requests_sent, duration_s, settle_rule, settled, verdict, medians_last_window {ttft, tpot, e2e},
        limits, answers (index, prompt, ok, error, ttft_s, tpot_s, e2e_s, prompt_tokens, completion_tokens, finish_reason)."
      type: dict
report_path:
  description: Where the report was written (empty when none).
  returned: always
  type: str
simulated:
  description: Whether anything was simulated (the twin, or GPUs per O(gpu_simulated)).
  returned: unless check mode or the replica failed before its first request
  type: bool
"""

import os
import platform

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_sse import Endpoint
from ansible.module_utils.revive_warmup import (
    BUNDLED_PROMPTS,
    Deps,
    SettleRule,
    WarmupError,
    WarmupSpec,
    failure_report,
    merge_report,
    warm_up,
    write_report,
)

SETTLE_SPEC = {
    "metric": {"type": "str", "choices": ["tpot", "ttft", "e2e"], "default": "tpot"},
    "window": {"type": "int", "default": 5},
    "tolerance": {"type": "float", "default": 0.25},
}


def record(report_path: str, host: str, replica: str, entry: dict) -> None:
    """Merge the replica's entry into the node's report (nothing when no path is set)."""
    if not report_path:
        return
    existing = None
    if os.path.exists(report_path):
        with open(report_path, encoding="utf-8") as handle:
            existing = handle.read()
    write_report(report_path, merge_report(existing, host, replica, entry, entry["at"]))


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "port": Bound(int, 1, high=65535, why="a TCP port"),
    "health_timeout": Bound(float, 0, high=86400, low_open=True, why="seconds"),
    "poll_interval": Bound(float, 0, high=3600, low_open=True, why="seconds"),
    "request_timeout": Bound(float, 0, high=86400, low_open=True, why="seconds"),
    "requests": Bound(int, 1, high=100000),
    "max_requests": Bound(int, 1, high=100000),
    "concurrency": Bound(int, 1, high=4096),
    "max_tokens": Bound(int, 1),
    "temperature": Bound(float, 0, high=2, why="OpenAI's sampling range"),
    "settle.window": Bound(int, 2, high=10000, why="answers per window; the rule compares two"),
    "settle.tolerance": Bound(float, 0, high=100, low_open=True, why="a relative change"),
    "max_ttft": Bound(float, 0, high=86400, unset=0, unset_means="no limit", why="seconds"),
    "max_tpot": Bound(float, 0, high=3600, unset=0, unset_means="no limit", why="seconds"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "port": {"type": "int", "required": True},
            "host": {"type": "str", "default": "127.0.0.1"},
            "served_model_name": {"type": "str", "required": True},
            "unit": {"type": "str"},
            "replica": {"type": "str"},
            "api_key": {"type": "str", "no_log": True},
            "health_timeout": {"type": "float", "default": 900},
            "poll_interval": {"type": "float", "default": 1},
            "request_timeout": {"type": "float", "default": 120},
            "requests": {"type": "int", "default": 20},
            "max_requests": {"type": "int", "default": 60},
            "concurrency": {"type": "int", "default": 4},
            "kind": {"type": "str", "choices": ["chat", "completions"], "default": "chat"},
            "max_tokens": {"type": "int", "default": 128},
            "temperature": {"type": "float", "default": 0.7},
            "prompts": {"type": "list", "elements": "str", "default": []},
            "settle": {"type": "dict", "default": {}, "options": SETTLE_SPEC},
            "max_ttft": {"type": "float", "default": 0},
            "max_tpot": {"type": "float", "default": 0},
            "release": {"type": "dict", "default": {}},
            "plan": {"type": "dict", "default": {}},
            "gpu_simulated": {"type": "bool"},
            "report_path": {"type": "path", "default": "/var/lib/revive/handover.json"},
        },
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "vllm_warmup")
    p = module.params
    endpoint = Endpoint(p["host"], p["port"], p["api_key"] or "", timeout=p["request_timeout"])
    replica = p["replica"] or p["unit"] or f"{p['host']}:{p['port']}"
    spec = WarmupSpec(endpoint=endpoint, served_model_name=p["served_model_name"], unit=p["unit"],
                      health_timeout_s=p["health_timeout"], poll_interval_s=p["poll_interval"],
                      requests=p["requests"], max_requests=p["max_requests"], concurrency=p["concurrency"],
                      kind=p["kind"], max_tokens=p["max_tokens"], temperature=p["temperature"],
                      prompts=p["prompts"] or BUNDLED_PROMPTS, settle=SettleRule(**p["settle"]),
                      max_ttft_s=p["max_ttft"], max_tpot_s=p["max_tpot"], gpus_simulated=p["gpu_simulated"])
    host = platform.node()
    try:
        spec.validate()
    except WarmupError as error:
        module.fail_json(msg=f"{host}: {error}", passed=False, report_path="")
    if module.check_mode:
        module.exit_json(changed=True, passed=False, report_path="",
                         msg=f"check mode: nothing sent to {endpoint.label()} and no report written; would wait up to "
                             f"{spec.health_timeout_s:g} s for /health (watching {spec.unit or 'no unit'}), then send "
                             f"{spec.requests}-{spec.max_requests} {spec.kind} requests, {spec.concurrency} at a time")
    deps = Deps(runner=lambda argv: module.run_command(argv))
    report_path = p["report_path"] or ""
    try:
        outcome = warm_up(spec, deps, release=p["release"], plan=p["plan"], replica=replica)
    except WarmupError as error:
        message = f"{host}: {replica}: {error}"
        record(report_path, host, replica, failure_report(spec, replica, message, deps.now_iso(), p["release"], p["plan"]))
        module.fail_json(msg=message, passed=False, changed=bool(report_path), report_path=report_path)
    record(report_path, host, replica, outcome.report)
    result = {"changed": bool(report_path), "passed": outcome.passed, "report": outcome.report,
              "report_path": report_path, "simulated": outcome.report["simulated"]}
    if not outcome.passed:
        module.fail_json(msg=f"{host}: {outcome.message}", **result)
    module.exit_json(msg=f"{host}: {outcome.message}", **result)


if __name__ == "__main__":
    main()
