"""Filters of the hand-over, the roll, the rollback, the front door, the bench, the probe's wheels, the lab's
time-scaled rules, a serving group's Ray cluster, a node's firewall and serving address: thin wiring over
module_utils/revive_handover.py, revive_lockfile.py, revive_record/journal.py, revive_frontdoor.py,
revive_bench/invocation.py, revive_slo_gate.py, revive_rule_scale.py, revive_cluster.py, revive_serving_group.py,
revive_ray_unit.py, revive_firewall.py and revive_serve_address.py, where the decisions live and are unit-tested
(tests/unit/test_handover.py, test_frontdoor_servers.py, test_bench_invocation.py, test_rule_scale.py,
test_ray_unit.py, test_firewall.py, test_serve_address.py).

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
    out_of_traffic,
    restored_release,
    roll_batch_check,
    roll_node_result,
    roll_order,
    roll_policy,
    roll_unreachable_result,
    roll_summary,
    served_model_name,
)
from ansible.module_utils.revive_cluster import cluster_endpoint, member_summary  # noqa: E402
from ansible.module_utils.revive_serving_group import group_members, unfit_members  # noqa: E402
from ansible.module_utils.revive_bench.invocation import bench_argv, bench_limit_fact, bench_outcome  # noqa: E402
from ansible.module_utils.revive_frontdoor import frontdoor_servers, frontdoor_url  # noqa: E402
from ansible.module_utils.revive_lockfile import locked_wheel_files  # noqa: E402
from ansible.module_utils.revive_slo_gate import gate_concurrency  # noqa: E402
from ansible.module_utils.revive_record.journal import units_to_quote  # noqa: E402
from ansible.module_utils.revive_rule_scale import scale_rule_files  # noqa: E402
from ansible.module_utils.revive_serve_address import reach_addresses, replica_host, replica_url  # noqa: E402


def ray_unit(release, venv, temp_dir, ports, environment, dashboard=False):
    """The member's Ray unit: ray start argv, ExecStart= and Environment= words (module_utils/revive_ray_unit.py)."""
    from ansible.errors import AnsibleFilterError
    from ansible.module_utils.revive_ray_unit import RayUnitError, ray_unit as build
    try:
        return build(release, venv, temp_dir, ports, environment, dashboard)
    except RayUnitError as exc:
        raise AnsibleFilterError(str(exc)) from None


def serve_address(facts, ansible_host="", explicit="", node=""):
    """{address, error} the node's replicas bind (module_utils/revive_serve_address.py): the role asserts that error
    is "" before anything changes, so the refusal reads as the module's message, not as a template error."""
    from ansible.module_utils.revive_serve_address import ServeAddressError, serve_address as choose
    try:
        return {"address": choose(facts or {}, ansible_host, explicit, node), "error": ""}
    except ServeAddressError as exc:
        return {"address": "", "error": str(exc)}


def node_firewall_guard(release, frontdoors, monitors, allow, ray_ports, ssh_port=22):
    """A GPU node's nftables guard: ruleset text and report (module_utils/revive_firewall.py)."""
    from ansible.errors import AnsibleFilterError
    from ansible.module_utils.revive_firewall import FirewallError, guard
    try:
        return guard(release or {}, frontdoors or [], monitors or [], allow or [], ray_ports or {}, ssh_port)
    except FirewallError as exc:
        raise AnsibleFilterError(f"node_firewall: {exc}") from None


def time_scaled_rules(texts, scale, scrape_interval, evaluation_interval):
    """The monitoring role's rule files, {name: text}, time-scaled for the lab (module_utils/revive_rule_scale.py);
    at scale 1 the texts themselves."""
    from ansible.errors import AnsibleFilterError
    from ansible.module_utils.revive_rule_scale import RuleScaleError
    try:
        return scale_rule_files(texts, scale, scrape_interval, evaluation_interval)
    except RuleScaleError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    """revive's decisions as filters; each is a pure function of its arguments."""

    def filters(self):
        return {
            "bench_argv": bench_argv,
            "bench_limit_fact": bench_limit_fact,
            "bench_outcome": bench_outcome,
            "cluster_endpoint": cluster_endpoint,
            "frontdoor_servers": frontdoor_servers,
            "frontdoor_url": frontdoor_url,
            "serving_group_member_summary": member_summary,
            "serving_group_members": group_members,
            "serving_group_unfit": unfit_members,
            "failure_message": failure_message,
            "handover_state": handover_state,
            "out_of_traffic": out_of_traffic,
            "locked_wheel_files": locked_wheel_files,
            "node_firewall_guard": node_firewall_guard,
            "handover_result": handover_result,
            "restored_release": restored_release,
            "ray_unit": ray_unit,
            "roll_batch_check": roll_batch_check,
            "roll_node_result": roll_node_result,
            "roll_order": roll_order,
            "roll_policy": roll_policy,
            "roll_unreachable_result": roll_unreachable_result,
            "roll_summary": roll_summary,
            "served_model_name": served_model_name,
            "serve_address": serve_address,
            "serve_reach_addresses": reach_addresses,
            "replica_host": replica_host,
            "replica_url": replica_url,
            "slo_gate_concurrency": gate_concurrency,
            "time_scaled_rules": time_scaled_rules,
            "units_to_quote": units_to_quote,
        }
