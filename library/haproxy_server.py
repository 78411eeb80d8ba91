#!/usr/bin/python
"""Ansible module haproxy_server: thin wiring over module_utils/revive_haproxy.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: haproxy_server
short_description: Put HAProxy servers into ready, drain or maintenance through the runtime API, and wait for them to idle
description:
  - Talks to HAProxy's runtime API on its local stats socket (C(level admin)); run it on the LB host
    (C(delegate_to)). Written for HAProxy 2.6 (Debian 12) and later.
  - O(state=ready) lets the servers take traffic, O(state=drain) stops new load-balanced requests while in-flight
    ones finish and health checks go on, O(state=maint) stops traffic and checks. Neither DRAIN nor MAINT cuts
    running streams; queued requests move to other servers with C(option redispatch).
  - O(wait_idle=true) then waits until every listed server has C(scur) = 0 and C(qcur) = 0 (show stat), or fails
    after O(wait_timeout) with the numbers.
  - O(state=query) only reads. The result lists every server's admin mode, health status and load.
  - C(changed) is true only when a server's admin mode changes; a busy server whose C(scur) moves is not a change.
  - Unlike community.general.haproxy it supports check mode, waits on C(qcur) as well as C(scur), and polls until
    the deadline (docs/facts/lb-and-rolling.md §2.4).
version_added: "0.1.0"
author:
  - revive project
options:
  servers:
    description: Server names in O(backend).
    type: list
    elements: str
    required: true
    aliases: [name]
  backend:
    description: The backend holding the servers.
    type: str
    default: vllm
  state:
    description: Admin mode to put the servers in; V(query) changes nothing.
    type: str
    choices: [ready, drain, maint, query]
    default: query
  socket:
    description: HAProxy's stats socket (Debian's default path).
    type: path
    default: /run/haproxy/admin.sock
  wait_idle:
    description: After setting the state, wait until every server has no request in flight (C(scur)) or queued (C(qcur)).
    type: bool
    default: false
  wait_timeout:
    description: Seconds to wait for idle servers; cover the longest generation plus queueing.
    type: float
    default: 300
  wait_interval:
    description: Seconds between polls while waiting.
    type: float
    default: 1
attributes:
  check_mode:
    support: full
    details: Reads the servers and reports what would change; sends no state change and does not wait.
  diff_mode:
    support: full
    details: The servers' admin modes before and after.
notes:
  - Needs root or the C(haproxy) group for Debian's socket (mode 660); use C(become).
seealso:
  - name: HAProxy 2.6 management guide, runtime API
    description: set server, show servers state, show stat.
    link: https://docs.haproxy.org/2.6/management.html#9.3
"""

EXAMPLES = r"""
- name: Drain node1's replicas and wait for their streams to finish
  haproxy_server:
    servers: [node1-vllm-0, node1-vllm-1]
    state: drain
    wait_idle: true
    wait_timeout: 600
  delegate_to: "{{ groups['lb'][0] }}"

- name: Hand node1 back
  haproxy_server:
    servers: [node1-vllm-0, node1-vllm-1]
    state: ready
  delegate_to: "{{ groups['lb'][0] }}"

- name: Read the servers' states
  haproxy_server:
    servers: [node1-vllm-0]
  delegate_to: "{{ groups['lb'][0] }}"
  register: front_door
"""

RETURN = r"""
servers:
  description: Every listed server after the change (and the wait), by name.
  returned: always
  type: dict
  sample:
    node1-vllm-0: {name: node1-vllm-0, mode: drain, admin_state: 12, op_state: running, status: DRAIN, scur: 0, qcur: 0, address: "10.213.0.11:8000"}
before:
  description: The same, before any change.
  returned: always
  type: dict
waited_s:
  description: Seconds spent waiting for idle servers.
  returned: always
  type: float
msg:
  description: What was done.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_haproxy import HAProxyError, ensure, socket_sender


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "wait_timeout": Bound(float, 0, high=86400, low_open=True, why="seconds"),
    "wait_interval": Bound(float, 0, high=3600, low_open=True, why="seconds"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "servers": {"type": "list", "elements": "str", "required": True, "aliases": ["name"]},
            "backend": {"type": "str", "default": "vllm"},
            "state": {"type": "str", "choices": ["ready", "drain", "maint", "query"], "default": "query"},
            "socket": {"type": "path", "default": "/run/haproxy/admin.sock"},
            "wait_idle": {"type": "bool", "default": False},
            "wait_timeout": {"type": "float", "default": 300},
            "wait_interval": {"type": "float", "default": 1},
        },
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "haproxy_server")
    p = module.params
    target = None if p["state"] == "query" else p["state"]
    try:
        outcome = ensure(socket_sender(p["socket"]), p["backend"], p["servers"], target, module.check_mode,
                         wait_idle=p["wait_idle"], timeout_s=p["wait_timeout"], interval_s=p["wait_interval"])
    except HAProxyError as error:
        module.fail_json(msg=str(error))
    modes_before = {name: state["mode"] for name, state in outcome.before.items()}
    modes_after = {name: state["mode"] for name, state in outcome.after.items()}
    changed_names = sorted(name for name in modes_before if modes_before[name] != modes_after[name])
    if target is None:
        msg = f"backend {p['backend']}: " + ", ".join(f"{n} {s['mode']} ({s['status']})" for n, s in outcome.after.items())
    elif changed_names:
        msg = f"backend {p['backend']}: {', '.join(changed_names)} -> {target}"
    else:
        msg = f"backend {p['backend']}: already {target}"
    if p["wait_idle"] and not module.check_mode:
        msg += f"; idle after {outcome.waited_s:g} s"
    result = {"changed": outcome.changed, "servers": outcome.after, "before": outcome.before,
              "waited_s": outcome.waited_s, "msg": msg}
    if module._diff:
        result["diff"] = {"before": "".join(f"{n}: {m}\n" for n, m in sorted(modes_before.items())),
                          "after": "".join(f"{n}: {m}\n" for n, m in sorted(modes_after.items())),
                          "before_header": f"backend {p['backend']}", "after_header": f"backend {p['backend']}"}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
