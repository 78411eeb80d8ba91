"""Filters of the hand-over, the roll, the rollback, the front door, the bench, the probe's wheels, the lab's
time-scaled rules, a serving group's Ray cluster, a node's firewall, exporter ports and serving address: thin wiring
over module_utils/revive_handover.py, revive_lockfile.py, revive_record/journal.py, revive_frontdoor.py,
revive_bench/invocation.py, revive_slo_gate.py, revive_rule_scale.py, revive_cluster.py, revive_serving_group.py,
revive_ray_unit.py, revive_firewall.py, revive_monitoring.py, revive_serve_address.py and revive_vrrp.py, where the
decisions live and are unit-tested (tests/unit/test_handover.py, test_frontdoor_servers.py, test_bench_invocation.py,
test_rule_scale.py, test_ray_unit.py, test_firewall.py, test_serve_address.py, test_vrrp.py).

Ansible loads this file from ansible.cfg's filter_plugins; a controller-side plugin does not see the project's
module_utils as `ansible.module_utils.*` (only modules do, through AnsiballZ), so the configured module_utils
directories are added to that package's path first, as bin/revive_cli does for the command-line tools.
"""
from __future__ import annotations

import importlib

import ansible.module_utils
from ansible import constants

for _path in constants.DEFAULT_MODULE_UTILS_PATH:
    if _path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_path)


def _lazy(module, name):
    """The filter `name` of ansible.module_utils.`module`, imported when it is first called, not when Ansible loads
    this file. Ansible loads every filter plugin file in each worker process that compiles a template with any
    filter - most tasks of most hosts - so importing every decision module here cost the controller ~60 % of its
    workers' CPU on a no-op site.yml (py-spy, docs/performance.md); a worker now imports only what it calls."""
    def call(*args, **kwargs):
        return getattr(importlib.import_module(f"ansible.module_utils.{module}"), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"ansible.module_utils.{module}.{name}, imported on first call."
    return call


_DECISIONS = {
    "bench_argv": ("revive_bench.invocation", "bench_argv"),
    "bench_limit_fact": ("revive_bench.invocation", "bench_limit_fact"),
    "bench_outcome": ("revive_bench.invocation", "bench_outcome"),
    "cluster_endpoint": ("revive_cluster", "cluster_endpoint"),
    "frontdoor_servers": ("revive_frontdoor", "frontdoor_servers"),
    "frontdoor_url": ("revive_frontdoor", "frontdoor_url"),
    "front_doors_view": ("revive_handover", "front_doors_view"),
    "serving_group_member_summary": ("revive_cluster", "member_summary"),
    "serving_group_members": ("revive_serving_group", "group_members"),
    "serving_group_unfit": ("revive_serving_group", "unfit_members"),
    "failure_message": ("revive_handover", "failure_message"),
    "handover_state": ("revive_handover", "handover_state"),
    "out_of_traffic": ("revive_handover", "out_of_traffic"),
    "locked_wheel_files": ("revive_lockfile", "locked_wheel_files"),
    "handover_result": ("revive_handover", "handover_result"),
    "restored_release": ("revive_handover", "restored_release"),
    "roll_batch_check": ("revive_handover", "roll_batch_check"),
    "roll_node_result": ("revive_handover", "roll_node_result"),
    "roll_order": ("revive_handover", "roll_order"),
    "roll_policy": ("revive_handover", "roll_policy"),
    "roll_unreachable_result": ("revive_handover", "roll_unreachable_result"),
    "roll_summary": ("revive_handover", "roll_summary"),
    "served_model_name": ("revive_handover", "served_model_name"),
    "serve_reach_addresses": ("revive_serve_address", "reach_addresses"),
    "replica_host": ("revive_serve_address", "replica_host"),
    "replica_url": ("revive_serve_address", "replica_url"),
    "slo_gate_concurrency": ("revive_slo_gate", "gate_concurrency"),
    "units_to_quote": ("revive_record.journal", "units_to_quote"),
    "vrrp_instance": ("revive_vrrp", "vrrp_instance"),
    "vrrp_peers_differ": ("revive_vrrp", "vrrp_peers_differ"),
}


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


def node_firewall_guard(release, frontdoors, monitors, allow, ray_ports, ssh_port=22, exporter_ports=()):
    """A GPU node's or front door host's nftables guard: ruleset text and report (module_utils/revive_firewall.py)."""
    from ansible.errors import AnsibleFilterError
    from ansible.module_utils.revive_firewall import FirewallError, guard
    try:
        return guard(release or {}, frontdoors or [], monitors or [], allow or [], ray_ports or {}, ssh_port,
                     exporter_ports or [])
    except FirewallError as exc:
        raise AnsibleFilterError(f"node_firewall: {exc}") from None


def monitoring_exporter_ports(role_defaults, own_ports, gpu_exporter=None, gpu_exporter_port=None,
                              node_exporter_port=None):
    """The GPU node's exporter ports as the monitoring role runs them (module_utils/revive_monitoring.py)."""
    from ansible.errors import AnsibleFilterError
    from ansible.module_utils.revive_monitoring import MonitoringError, exporter_ports
    try:
        return exporter_ports(role_defaults or {}, own_ports or {}, gpu_exporter, gpu_exporter_port,
                              node_exporter_port)
    except MonitoringError as exc:
        raise AnsibleFilterError(f"monitoring: {exc}") from None


def time_scaled_rules(texts, scale, scrape_interval, evaluation_interval):
    """The monitoring role's rule files, {name: text}, time-scaled for the lab (module_utils/revive_rule_scale.py);
    at scale 1 the texts themselves."""
    from ansible.errors import AnsibleFilterError
    from ansible.module_utils.revive_rule_scale import RuleScaleError, scale_rule_files
    try:
        return scale_rule_files(texts, scale, scrape_interval, evaluation_interval)
    except RuleScaleError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    """revive's decisions as filters; each is a pure function of its arguments."""

    def filters(self):
        own = {"node_firewall_guard": node_firewall_guard, "ray_unit": ray_unit, "serve_address": serve_address,
               "time_scaled_rules": time_scaled_rules, "monitoring_exporter_ports": monitoring_exporter_ports}
        return {**{name: _lazy(*where) for name, where in _DECISIONS.items()}, **own}
