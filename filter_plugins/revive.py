"""Filters of the hand-over, the roll, the rollback, the front door, the bench and the probe's wheels: thin wiring
over module_utils/revive_handover.py, module_utils/revive_lockfile.py, module_utils/revive_record/journal.py, module_utils/revive_frontdoor.py and
module_utils/revive_bench/invocation.py and module_utils/revive_slo_gate.py, where the decisions live and are unit-tested (tests/unit/test_handover.py,
test_frontdoor_servers.py, test_bench_invocation.py).

Ansible loads this file from ansible.cfg's filter_plugins; a controller-side plugin does not see the project's
module_utils as `ansible.module_utils.*` (only modules do, through AnsiballZ), so the configured module_utils
directories are added to that package's path first, as bin/revive_cli does for the command-line tools.
"""
from __future__ import annotations

import ansible.module_utils
from ansible import constants

for _path in constants.DEFAULT_MODULE_UTILS_PATH:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)

from ansible.module_utils.revive_handover import (  # noqa: E402
    failure_message,
    handover_result,
    handover_state,
    restored_release,
    roll_batch_check,
    roll_node_result,
    roll_policy,
    roll_summary,
    served_model_name,
)
from ansible.module_utils.revive_bench.invocation import bench_argv, bench_limit_fact, bench_outcome  # noqa: E402
from ansible.module_utils.revive_frontdoor import frontdoor_servers  # noqa: E402
from ansible.module_utils.revive_lockfile import locked_wheel_files  # noqa: E402
from ansible.module_utils.revive_slo_gate import gate_concurrency  # noqa: E402
from ansible.module_utils.revive_record.journal import units_to_quote  # noqa: E402


class FilterModule:
    """revive's decisions as filters; each is a pure function of its arguments."""

    def filters(self):
        return {
            "bench_argv": bench_argv,
            "bench_limit_fact": bench_limit_fact,
            "bench_outcome": bench_outcome,
            "frontdoor_servers": frontdoor_servers,
            "failure_message": failure_message,
            "handover_state": handover_state,
            "locked_wheel_files": locked_wheel_files,
            "handover_result": handover_result,
            "restored_release": restored_release,
            "roll_batch_check": roll_batch_check,
            "roll_node_result": roll_node_result,
            "roll_policy": roll_policy,
            "roll_summary": roll_summary,
            "served_model_name": served_model_name,
            "slo_gate_concurrency": gate_concurrency,
            "units_to_quote": units_to_quote,
        }
