#!/usr/bin/python
"""Ansible module vllm_journal_info: thin wiring over module_utils/revive_record/journal.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_journal_info
short_description: The last journal messages of one run of each systemd unit - the excerpt a failure report quotes
description:
  - Returns the last O(lines) journal messages of each unit in O(units) from one run (invocation), with the
    O(redact) strings masked - the excerpt a rollback's failure message quotes.
  - With O(since_usec) it is the first run that began after that time (the start that failed, not a later
    automatic restart nor the old run being stopped), else the last run. A run holds every message from its first
    one to the next run's start as systemd logged it, whatever invocation id journald gave a line (a short-lived
    process's line may carry the next run's, or none).
  - It changes nothing; a unit whose journal cannot be read gets one line saying why.
version_added: "0.1.0"
author:
  - revive project
options:
  units:
    description: systemd units whose journal to read.
    type: list
    elements: str
    required: true
  lines:
    description: Messages per unit.
    type: int
    default: 40
  since_usec:
    description: When the start began (CLOCK_REALTIME, microseconds, C(date +%s%6N)); 0 means none.
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
    details: Only reads.
seealso:
  - name: journalctl(1), JSON output
    description: The fields C(_SYSTEMD_INVOCATION_ID), C(INVOCATION_ID), C(__REALTIME_TIMESTAMP) and C(MESSAGE).
    link: https://www.freedesktop.org/software/systemd/man/latest/journalctl.html
"""

EXAMPLES = r"""
- name: Read the journal of the failed start
  vllm_journal_info:
    units: [vllm-0.service]
    lines: 30
    since_usec: "{{ switch_clock.stdout | int }}"
    redact: ["{{ api_key }}"]
  register: failed_journal
"""

RETURN = r"""
journal: {description: "Per unit, the messages of the chosen run.", returned: always, type: dict, sample: {vllm-0.service: ["ValueError: No available memory for the cache blocks. ..."]}}
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_record.journal import journal_excerpt


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


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "lines": Bound(int, 1, high=100000),
    "since_usec": Bound(int, 0, high=2 ** 62, unset=0, unset_means="none", why="microseconds since the epoch"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "units": {"type": "list", "elements": "str", "required": True},
            "lines": {"type": "int", "default": 40},
            "since_usec": {"type": "int", "default": 0},
            "redact": {"type": "list", "elements": "str", "default": [], "no_log": True},
        },
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "vllm_journal_info")
    params = module.params
    module.exit_json(changed=False, journal={
        unit: unit_journal(module, unit, params["lines"], params["redact"], params["since_usec"])
        for unit in params["units"]})


if __name__ == "__main__":
    main()
